// DeepSeek-V4 benchmarks (part of bench_attention_cpu): the compressor's prefill path at the
// V4-Flash shapes (d = 512, CSA ratio 4 with overlap, HCA ratio 128), one thread.
//
// Counters:
//   bytes_per_second    kv + score bytes consumed per second (each input byte is read once)
//   stream_now          read bandwidth of the same moment, one thread: a plain summing pass over
//                       a 256 MiB buffer (DRAM) right before and right after the timed loop;
//                       total bytes over total seconds
//   frac_of_stream_now  bytes_per_second / stream_now (issue 27 pt 1 target: >= 0.5)
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "phasekv/core/element.hpp"
#include "phasekv/dsv4/compressor.hpp"

namespace {

namespace dsv4 = phasekv::dsv4;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kNowBytes = std::size_t{256} << 20;

const std::vector<float>& now_buffer() {
  static const std::vector<float> b(kNowBytes / sizeof(float), 1.0f);
  return b;
}

// Seconds of one summing pass over `bytes` of `p` (8 independent sums, vectorized).
double now_pass(const float* p, std::size_t bytes) {
  const std::size_t count = bytes / sizeof(float);
  const auto t0 = Clock::now();
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (std::size_t i = 0; i + 8 <= count; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += p[i + static_cast<std::size_t>(k)];
  float s = 0.0f;
  for (float a : acc) s += a;
  benchmark::DoNotOptimize(s);
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Two passes before and two after a row; report sets stream_now and frac_of_stream_now.
struct StreamNowDsv4 {
  double bytes = 0.0, seconds = 0.0;
  void passes(int k) {
    const float* p = now_buffer().data();
    for (int i = 0; i < k; ++i) {
      seconds += now_pass(p, kNowBytes);
      bytes += static_cast<double>(kNowBytes);
    }
  }
  void report(benchmark::State& state, double bps) const {
    const double now = bytes / seconds;
    state.counters["stream_now"] = now;
    state.counters["frac_of_stream_now"] = bps / now;
  }
};

template <class T>
std::vector<T> fill_values(std::size_t count, std::uint32_t seed, float scale) {
  std::vector<T> v(count);
  std::uint32_t x = seed;
  for (auto& e : v) {
    x = x * 1664525u + 1013904223u;
    const float f = (static_cast<float>(x >> 8) * (1.0f / 16777216.0f) - 0.5f) * scale;
    e = phasekv::from_float<T>(f);
  }
  return v;
}

// Batch compression of a prefill of n tokens (about 64 MiB of bf16 kv + score, well past the
// caches). range(0): 0 = CSA (ratio 4, coff 2), 1 = HCA (ratio 128, coff 1).
void BM_Dsv4Compress(benchmark::State& state) {
  using T = phasekv::bf16_t;
  const bool hca = state.range(0) == 1;
  const std::int64_t S = hca ? 128 : 4, coff = hca ? 1 : 2, d = 512;
  const std::int64_t n = (std::int64_t{64} << 20) / (2 * coff * d * 2 * S) * S;
  const std::size_t elems = static_cast<std::size_t>(n * coff * d);
  const auto kv = fill_values<T>(elems, 1, 2.0f);
  const auto score = fill_values<T>(elems, 2, 6.0f);
  const auto ape = fill_values<float>(static_cast<std::size_t>(S * coff * d), 3, 1.0f);
  std::vector<float> out(static_cast<std::size_t>(n / S * d));
  const dsv4::CompressorParams p{S, coff, d, ape.data()};
  StreamNowDsv4 now;
  now.passes(2);
  const auto t0 = Clock::now();
  for (auto _ : state) {
    dsv4::compress<T>(p, kv.data(), score.data(), n, out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  now.passes(2);
  const double bytes = 2.0 * static_cast<double>(elems * sizeof(T));
  const double bps = bytes * static_cast<double>(state.iterations()) / sec;
  state.counters["bytes_per_second"] = bps;
  state.counters["tokens"] = static_cast<double>(n);
  now.report(state, bps);
  state.SetLabel(hca ? "HCA_S128_d512_bf16" : "CSA_S4_W8_d512_bf16");
}
BENCHMARK(BM_Dsv4Compress)->ArgName("hca")->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
