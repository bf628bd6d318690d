// bench_attention_cpu: benchmarks of the CPU attention kernels and of compression against
// ceilings measured in the same process: BM_StreamRead (memory read bandwidth) and BM_FmaPeak (FMA
// throughput).
//
// Counters (all in --benchmark_format=json):
//   bytes_per_second  bytes of visible K+V read once per decode step (decode), raw K+V bytes
//                     consumed (compress), bytes summed (stream)
//   frac_of_stream    bytes_per_second / the stream ceiling at the same thread count
//   flops             FLOP/s (decode and prefill: 2 * (d_k + d_v) per visible (query head,
//                     key) pair; compress: W * d adds per (window, head) for UniformMean,
//                     2 * W * (d_in + d_out) for GatedPool's gate dots and weighted sum;
//                     fma peak: 2 per lane per FMA)
//   frac_of_fma_peak  flops / the FMA ceiling at the same thread count
//   huge_frac         share of the benchmark's buffers backed by 2 MiB pages (see --phasekv_pages
//                     in main; -1 where /proc/self/smaps cannot be read)
//   stream_now        (rows that read from DRAM: BM_Decode, BM_DecodeNHD, BM_DecodeBf16Dot,
//                     BM_Compress) the read bandwidth of the same moment: two stream passes
//                     right before the row's timed iterations and two right after, each over
//                     the next slice of the ceiling's buffer (4x the LLC, at least 64 MiB) with
//                     the same threads; total bytes over total seconds of those passes
//   frac_of_stream_now  bytes_per_second / stream_now
//   speedup           (BM_DecodeSpeedup) uncompressed over W8/S4 decode time, the two steps
//                     interleaved in one timed loop; with speedup_ideal (the ratio of their
//                     bytes) and frac_of_ideal
// The ceiling used by frac_* is the fastest single pass of the stream (or FMA) kernel seen in
// the process at that thread count: the passes of BM_StreamRead / BM_FmaPeak, 5 more taken
// lazily before the first benchmark that needs the ceiling, and (stream) one more pass right
// before every later benchmark that needs it. Bandwidth on a shared machine drifts over a run
// (docs/kernels.md), and the best pass keeps a fraction from looking good because the ceiling
// happened to be measured in a slow moment. Reported as stream_ceiling / fma_ceiling. The targets
// are judged on frac_of_stream; frac_of_stream_now says how much of a fraction below target is the
// moment's bandwidth (the machine's neighbours) rather than the kernel: taken within a second
// of the row's iterations, the passes see about the memory system the kernel saw.
// They bracket the timed loop rather than interleave with it, so the judged counters are
// measured exactly as without them.
#pragma once

#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "phasekv/attention/cpu/dispatch.hpp"
#include "phasekv/attention/cpu/thread_pool.hpp"
#include "phasekv/attention/cpu/visibility_rule.hpp"
#include "phasekv/core/element.hpp"

// The shared part of bench_attention_cpu (one binary; the rows are in bench_decode.cpp,
// bench_prefill.cpp and bench_compress.cpp, the ceilings and main in bench_common.cpp):
// buffers, thread pools, the measured ceilings and the shapes the rows share.
namespace pkv_bench {

namespace cpu = phasekv::cpu;
// The kernels' default: the instruction set is chosen at run time (cpu::active_arch()); the
// ceilings run the same one.
using Arch = cpu::arch::Auto;
using phasekv::bf16_t;
using Clock = std::chrono::steady_clock;

// Wall seconds of one call of f().
template <class F>
double seconds_of(const F& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Name of the path tag A runs: the active build for arch::Auto.
template <class A>
inline std::string path_name() {
  return std::is_same<A, cpu::arch::Auto>::value ? cpu::arch_name(cpu::active_arch()) : A::name;
}

// ---------------------------------------------------------------------------------------------
// Buffers
// ---------------------------------------------------------------------------------------------
// Page size of every buffer of the run (K/V, entries and the stream ceiling's buffer alike),
// set by --phasekv_pages before the first allocation. With 2 MiB pages the buffers are mapped
// on 2 MiB boundaries and advised MADV_HUGEPAGE (transparent huge pages, granted by the kernel
// at the first touch when it has them; the `huge_frac` counter says how much it granted).
enum class Pages { small, huge };
extern Pages g_pages;  // bench_common.cpp
inline constexpr std::size_t kHugePage = std::size_t{2} << 20;

struct BufferDeleter {
  void* base = nullptr;    // what to release: aligned_alloc's pointer or the mapping
  std::size_t mapped = 0;  // bytes mapped (huge pages), 0 for aligned_alloc
  void operator()(void*) const;
};
template <class T>
using Buffer = std::unique_ptr<T[], BufferDeleter>;

// Maps `bytes` (a multiple of 2 MiB) on a 2 MiB boundary advised MADV_HUGEPAGE; returns the
// start and sets `d` to what to release.
void* map_huge(std::size_t bytes, BufferDeleter& d);

template <class T>
Buffer<T> alloc(std::size_t count) {
  if (g_pages == Pages::small) {
    const std::size_t bytes = (count * sizeof(T) + 4095) / 4096 * 4096;
    void* p = std::aligned_alloc(4096, bytes == 0 ? 4096 : bytes);
    if (p == nullptr) throw std::bad_alloc();
    return Buffer<T>(static_cast<T*>(p), BufferDeleter{p, 0});
  }
  const std::size_t bytes =
      std::max<std::size_t>(kHugePage, (count * sizeof(T) + kHugePage - 1) / kHugePage * kHugePage);
  BufferDeleter d;
  void* p = map_huge(bytes, d);
  return Buffer<T>(static_cast<T*>(p), d);
}

// Bytes of [p, p + bytes) that the kernel backs with transparent huge pages; -1 where
// /proc/self/smaps cannot be read.
double huge_bytes(const void* p, std::size_t bytes);

// Buffers as (base, bytes).
using Regions = std::vector<std::pair<const void*, std::size_t>>;

// Share of the given buffers backed by huge pages (counter `huge_frac`; -1 when unknown).
double huge_frac(const Regions& buffers);

// Fills with pseudo-random values in [-1, 1) (xorshift; fast enough for GiB buffers).
template <class T>
void fill(T* p, std::size_t count, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t i = 0; i < count; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const float f = static_cast<float>(static_cast<std::int64_t>(x >> 40) - (1 << 23)) /
                    static_cast<float>(1 << 23);
    p[i] = phasekv::from_float<T>(f);
  }
}

// Bytes of the last-level cache (32 MiB when unknown).
std::size_t llc_bytes();

// The process's pool of `threads` threads (created on first use).
cpu::ThreadPool& pool(int threads);

// ---------------------------------------------------------------------------------------------
// Ceilings (bench_common.cpp)
// ---------------------------------------------------------------------------------------------
// The best stream read rate (bytes/s) seen at `threads` threads, sampled 6 times on first use
// and once more on every later call.
double stream_ceiling(int threads);
// The best FMA rate (FLOP/s) seen at `threads` threads (5 passes on first use).
double fma_ceiling(int threads);

// The stream_now counter of a row: stream passes over consecutive slices of the ceiling's
// buffer (wrapping around; a slice was last read a whole buffer ago, so it is not cached),
// taken right before and right after the row's timed iterations.
class StreamNow {
 public:
  explicit StreamNow(int threads) : threads_(threads) {}
  // Passes over the next `count` slices.
  void passes(int count) {
    for (int k = 0; k < count; ++k) pass();
  }
  // One pass over the next slice.
  void pass();
  // Sets stream_now and frac_of_stream_now for a row that ran at `bps` bytes per second.
  void report(benchmark::State& state, double bps) const {
    if (seconds_ <= 0.0) return;
    const double now = bytes_ / seconds_;
    state.counters["stream_now"] = now;
    state.counters["frac_of_stream_now"] = bps / now;
  }

 private:
  int threads_;
  double bytes_ = 0.0, seconds_ = 0.0;
  static std::size_t offset_;  // where the next pass starts, shared by all rows (bench_common.cpp)
};
// ---------------------------------------------------------------------------------------------
// Shapes of the decode and prefill rows: Hq = 32, Hkv = 8, d = 128, bf16 K/V
// ---------------------------------------------------------------------------------------------
inline constexpr std::int64_t kHq = 32, kHkv = 8, kD = 128;

enum GeometryId : int { kCsa = 0, kHca = 1, kRaw = 2 };  // W8/S4 L128, W128/S128 L128, none

inline cpu::VisibilityRule rule_of(int id) {
  switch (id) {
    case kCsa: return cpu::VisibilityRule::compressed(phasekv::Geometry(8, 4), 128);
    case kHca: return cpu::VisibilityRule::compressed(phasekv::Geometry(128, 128), 128);
    default: return cpu::VisibilityRule::causal();
  }
}
inline const char* geometry_name(int id) {
  return id == kCsa ? "W8S4_L128" : id == kHca ? "W128S128_L128" : "uncompressed";
}

}  // namespace pkv_bench
