// bench_attention_cpu: buffers, thread pools, the measured ceilings (BM_StreamRead, BM_FmaPeak)
// and main; see bench_common.hpp.
#include "bench_common.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "phasekv/attention/cpu/decode.hpp"  // the Vec<Arch> passes ceilings.inl uses
#include "phasekv/attention/cpu/split.hpp"

#define PHASEKV_TARGET_BODY "ceilings.inl"
#include "phasekv/core/foreach_target.inc"

namespace pkv_bench {

Pages g_pages = Pages::small;

void BufferDeleter::operator()(void*) const {
  if (mapped != 0)
    munmap(base, mapped);
  else
    std::free(base);
}

void* map_huge(std::size_t bytes, BufferDeleter& d) {
  const std::size_t mapped = bytes + kHugePage;  // room to start on a 2 MiB boundary
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) throw std::bad_alloc();
  const std::uintptr_t b = reinterpret_cast<std::uintptr_t>(base);
  void* p = reinterpret_cast<void*>((b + kHugePage - 1) / kHugePage * kHugePage);
  if (madvise(p, bytes, MADV_HUGEPAGE) != 0) {
    munmap(base, mapped);
    throw std::runtime_error(std::string("madvise(MADV_HUGEPAGE) failed: ") + std::strerror(errno) +
                             " (--phasekv_pages=2m needs transparent huge pages)");
  }
  d = BufferDeleter{base, mapped};
  return p;
}

double huge_bytes(const void* p, std::size_t bytes) {
  std::FILE* f = std::fopen("/proc/self/smaps", "r");
  if (f == nullptr) return -1.0;
  const std::uintptr_t lo = reinterpret_cast<std::uintptr_t>(p), hi = lo + bytes;
  char line[512];
  bool inside = false;
  std::uintptr_t vlo = 0, vhi = 0;
  double total = 0.0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long a = 0, b = 0, kb = 0;
    if (std::sscanf(line, "%lx-%lx ", &a, &b) == 2) {
      vlo = a;
      vhi = b;
      inside = vlo < hi && lo < vhi;
    } else if (inside && std::sscanf(line, "AnonHugePages: %lu kB", &kb) == 1) {
      const double overlap = static_cast<double>(std::min(vhi, hi) - std::max(vlo, lo));
      total += std::min(overlap, 1024.0 * static_cast<double>(kb));
    }
  }
  std::fclose(f);
  return total;
}

double huge_frac(const Regions& buffers) {
  double huge = 0.0, all = 0.0;
  for (const auto& b : buffers) {
    const double h = huge_bytes(b.first, b.second);
    if (h < 0.0) return -1.0;
    huge += h;
    all += static_cast<double>(b.second);
  }
  return all > 0.0 ? huge / all : 0.0;
}

std::size_t llc_bytes() {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return l3 > 0 ? static_cast<std::size_t>(l3) : (std::size_t{32} << 20);
}

cpu::ThreadPool& pool(int threads) {
  static std::map<int, std::unique_ptr<cpu::ThreadPool>> pools;
  auto& p = pools[threads];
  if (!p) p.reset(new cpu::ThreadPool(threads));
  return *p;
}

namespace {

// Calls f(ns_tag, arch_tag) for the active build: f picks pkv_bench::<pass>::stream_sum etc.
template <class F>
auto with_ceiling_pass(F&& f) {
  switch (cpu::active_arch()) {
#if PHASEKV_HAS_AVX512
    case cpu::ArchId::avx512: return f(cpu::arch::Avx512{});
#endif
#if PHASEKV_HAS_AVX2
    case cpu::ArchId::avx2: return f(cpu::arch::Avx2{});
#endif
#if PHASEKV_FLAGS_NEON
    case cpu::ArchId::neon: return f(cpu::arch::Neon{});
#endif
    default: return f(cpu::arch::Scalar{});
  }
}

// Lanes of the active build's vectors.
int active_lanes() {
  return with_ceiling_pass([](auto a) { return decltype(a)::lanes; });
}
// ---------------------------------------------------------------------------------------------
// Ceilings
// ---------------------------------------------------------------------------------------------
constexpr std::size_t kStreamBytes = std::size_t{1} << 30;

const float* stream_buffer() {
  static Buffer<float> buf = [] {
    Buffer<float> b = alloc<float>(kStreamBytes / sizeof(float));
    fill(b.get(), kStreamBytes / sizeof(float), 7);
    return b;
  }();
  return buf.get();
}

// Sum of floats [0, count) with the active build's vectors (ceilings.inl).
float stream_sum(const float* p, std::size_t count) {
  return with_ceiling_pass([&](auto a) {
    using A = decltype(a);
    if constexpr (false) {
#if PHASEKV_HAS_AVX512
    } else if constexpr (std::is_same<A, cpu::arch::Avx512>::value) {
      return pkv_bench::tgt_avx512::stream_sum<A>(p, count);
#endif
#if PHASEKV_HAS_AVX2
    } else if constexpr (std::is_same<A, cpu::arch::Avx2>::value) {
      return pkv_bench::tgt_avx2::stream_sum<A>(p, count);
#endif
    } else {
      return pkv_bench::tgt_base::stream_sum<A>(p, count);
    }
  });
}

// Fastest pass of each ceiling kernel seen so far in the process, by thread count.
std::map<int, double>& best_stream() {
  static std::map<int, double> m;
  return m;
}
std::map<int, double>& best_fma() {
  static std::map<int, double> m;
  return m;
}

// Seconds to sum `bytes` of floats from `p` with `threads` threads (shares of the range).
double read_seconds(const float* p, std::size_t bytes, int threads) {
  const std::size_t n = bytes / sizeof(float);
  std::vector<float> sums(static_cast<std::size_t>(threads));
  const auto t0 = Clock::now();
  pool(threads).run([&](int i, int count) {
    const cpu::WorkRange r = cpu::partition_range(static_cast<std::int64_t>(n), i, count, 1024);
    sums[static_cast<std::size_t>(i)] = stream_sum(p + r.begin, static_cast<std::size_t>(r.size()));
  });
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  benchmark::DoNotOptimize(sums.data());
  return sec;
}

// One pass over the 1 GiB buffer with `threads` threads; returns bytes per second (and
// records it in best_stream).
double stream_pass(int threads) {
  const double bps =
      static_cast<double>(kStreamBytes) / read_seconds(stream_buffer(), kStreamBytes, threads);
  double& best = best_stream()[threads];
  best = std::max(best, bps);
  return bps;
}

}  // namespace

double stream_ceiling(int threads) {
  static std::map<int, bool> sampled;
  if (!sampled[threads]) {
    stream_pass(threads);  // warm (page faults)
    for (int k = 0; k < 5; ++k) stream_pass(threads);
    sampled[threads] = true;
  } else {
    stream_pass(threads);  // one more pass next to every benchmark that asks (see below)
  }
  return best_stream()[threads];
}

namespace {

// Bytes of one interleaved stream pass (stream_now): 4x the LLC, at least 64 MiB, so that a
// pass reads from DRAM, and at most the whole buffer.
std::size_t stream_slice_bytes() {
  const std::size_t b = std::max<std::size_t>(std::size_t{64} << 20, 4 * llc_bytes());
  return std::min(kStreamBytes, b / 4096 * 4096);
}

}  // namespace

void StreamNow::pass() {
  const std::size_t slice = stream_slice_bytes();
  if (offset_ + slice > kStreamBytes) offset_ = 0;
  seconds_ += read_seconds(stream_buffer() + offset_ / sizeof(float), slice, threads_);
  bytes_ += static_cast<double>(slice);
  offset_ += slice;
}
std::size_t StreamNow::offset_ = 0;

namespace {

constexpr int kFmaChains = 12;
constexpr std::int64_t kFmaIters = 1 << 22;

// kFmaChains independent FMA chains of kFmaIters steps with the active build's vectors.
float fma_chains(float seed) {
  return with_ceiling_pass([&](auto a) {
    using A = decltype(a);
    if constexpr (false) {
#if PHASEKV_HAS_AVX512
    } else if constexpr (std::is_same<A, cpu::arch::Avx512>::value) {
      return pkv_bench::tgt_avx512::fma_chains<A, kFmaChains>(seed, kFmaIters);
#endif
#if PHASEKV_HAS_AVX2
    } else if constexpr (std::is_same<A, cpu::arch::Avx2>::value) {
      return pkv_bench::tgt_avx2::fma_chains<A, kFmaChains>(seed, kFmaIters);
#endif
    } else {
      return pkv_bench::tgt_base::fma_chains<A, kFmaChains>(seed, kFmaIters);
    }
  });
}

double fma_flops_per_call() {
  return 2.0 * active_lanes() * kFmaChains * static_cast<double>(kFmaIters);
}

double fma_pass(int threads) {
  std::vector<float> out(static_cast<std::size_t>(threads));
  const auto t0 = Clock::now();
  pool(threads).run([&](int i, int) {
    out[static_cast<std::size_t>(i)] = fma_chains(1.0f + static_cast<float>(i));
  });
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  benchmark::DoNotOptimize(out.data());
  const double flops = fma_flops_per_call() * threads / sec;
  double& best = best_fma()[threads];
  best = std::max(best, flops);
  return flops;
}

}  // namespace

double fma_ceiling(int threads) {
  static std::map<int, bool> sampled;
  if (!sampled[threads]) {
    for (int k = 0; k < 5; ++k) fma_pass(threads);
    sampled[threads] = true;
  }
  return best_fma()[threads];
}

namespace {

void BM_StreamRead(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  stream_pass(threads);  // warm
  double seconds = 0.0;
  for (auto _ : state) seconds += static_cast<double>(kStreamBytes) / stream_pass(threads);
  const double bps =
      static_cast<double>(kStreamBytes) * static_cast<double>(state.iterations()) / seconds;
  state.counters["bytes_per_second"] = bps;
  state.counters["threads"] = threads;
  state.counters["huge_frac"] = huge_frac({{stream_buffer(), kStreamBytes}});
}
BENCHMARK(BM_StreamRead)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_FmaPeak(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  double seconds = 0.0;
  for (auto _ : state) seconds += fma_flops_per_call() * threads / fma_pass(threads);
  state.counters["flops"] =
      fma_flops_per_call() * threads * static_cast<double>(state.iterations()) / seconds;
  state.counters["threads"] = threads;
}
BENCHMARK(BM_FmaPeak)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

// The transparent-huge-page mode of the kernel ("always", "madvise" or "never"), from sysfs.
std::string thp_mode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string word;
  while (f >> word)
    if (word.size() > 2 && word.front() == '[' && word.back() == ']')
      return word.substr(1, word.size() - 2);
  return "unknown";
}

}  // namespace
}  // namespace pkv_bench

using pkv_bench::g_pages;
using pkv_bench::Pages;
using pkv_bench::thp_mode;

// Google Benchmark's flags plus one of ours, --phasekv_pages=4k|2m: the page size of every
// buffer (default 4k, what std::aligned_alloc gives; 2m maps them on 2 MiB boundaries with
// MADV_HUGEPAGE, see alloc). Both are reported in the run's context (JSON "context").
int main(int argc, char** argv) {
  const std::string flag = "--phasekv_pages=";
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.compare(0, flag.size(), flag) != 0) {
      argv[kept++] = argv[i];
      continue;
    }
    const std::string value = arg.substr(flag.size());
    if (value == "4k") {
      g_pages = Pages::small;
    } else if (value == "2m") {
      g_pages = Pages::huge;
    } else {
      std::fprintf(stderr, "bench_attention_cpu: --phasekv_pages must be 4k or 2m, got '%s'\n",
                   value.c_str());
      return 2;
    }
  }
  argc = kept;
  argv[argc] = nullptr;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::AddCustomContext("phasekv_pages", g_pages == Pages::huge ? "2m" : "4k");
  benchmark::AddCustomContext("transparent_hugepage", thp_mode());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
