// CUDA benchmarks: device-to-device copy bandwidth (the yardstick), split-KV decode over
// uncompressed and compressed (W8/S4) caches as a fraction of that bandwidth, the compressed
// vs uncompressed speed-up, and prefill TFLOP/s. Inputs rotate over several caches whose total
// size exceeds 4x the L2 cache, so every decode reads from HBM. Every case reports
// SkipWithError when no device is present.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "phasekv/attention/cuda/decode.cuh"
#include "phasekv/attention/cuda/prefill.cuh"
#include "phasekv/attention/params.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/view.hpp"
#include "phasekv/phase/geometry.hpp"

namespace {

using phasekv::bf16_t;
using phasekv::Geometry;

bool device_ready(benchmark::State& state) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  (void)cudaGetLastError();
  if (e != cudaSuccess || n == 0) {
    state.SkipWithError("no CUDA device");
    return false;
  }
  return true;
}

bool cuda_ok(benchmark::State& state, cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  const std::string msg =
      std::string(what) + ": " + cudaGetErrorString(e) + " " + phasekv::cuda::last_error_message();
  state.SkipWithError(msg.c_str());
  return false;
}

// Deterministic pseudo-random fill in [-1, 1).
template <class T>
__global__ void fill_kernel(T* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    p[i] = phasekv::from_float<T>(static_cast<float>(x >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}

// Owning device allocation.
struct DeviceMem {
  void* p = nullptr;
  explicit DeviceMem(std::size_t bytes) {
    if (cudaMalloc(&p, bytes) != cudaSuccess) p = nullptr;
  }
  DeviceMem(DeviceMem&& o) noexcept : p(o.p) { o.p = nullptr; }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  DeviceMem& operator=(DeviceMem&&) = delete;
  ~DeviceMem() {
    if (p != nullptr) cudaFree(p);
  }
};

template <class T>
void fill(void* p, std::size_t n, std::uint32_t seed) {
  fill_kernel<T><<<1024, 256>>>(static_cast<T*>(p), n, seed);
}

// Event-timed region (milliseconds).
struct EventTimer {
  cudaEvent_t a{}, b{};
  EventTimer() {
    cudaEventCreate(&a);
    cudaEventCreate(&b);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  ~EventTimer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  void start() { cudaEventRecord(a); }
  double stop_ms() {
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, a, b);
    return ms;
  }
};

std::size_t l2_bytes() {
  int dev = 0, l2 = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev);
  return static_cast<std::size_t>(l2 > 0 ? l2 : 64 << 20);
}

// Device-to-device copy bandwidth in bytes/s (read + write), measured once per process over a
// buffer of 16x the L2 size.
double copy_bandwidth() {
  static const double bw = [] {
    const std::size_t bytes = 16 * l2_bytes();
    DeviceMem src(bytes), dst(bytes);
    if (src.p == nullptr || dst.p == nullptr) return 0.0;
    cudaMemset(src.p, 1, bytes);
    cudaMemcpy(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice);
    EventTimer t;
    const int reps = 20;
    t.start();
    for (int i = 0; i < reps; ++i) cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice);
    const double ms = t.stop_ms();
    return 2.0 * static_cast<double>(bytes) * reps / (ms * 1e-3);
  }();
  return bw;
}

void BM_CopyD2D(benchmark::State& state) {
  if (!device_ready(state)) return;
  const std::size_t bytes = 16 * l2_bytes();
  DeviceMem src(bytes), dst(bytes);
  if (src.p == nullptr || dst.p == nullptr) {
    state.SkipWithError("cudaMalloc failed");
    return;
  }
  EventTimer t;
  for (auto _ : state) {
    t.start();
    cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice);
    state.SetIterationTime(t.stop_ms() * 1e-3);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * 2 * bytes));
}
BENCHMARK(BM_CopyD2D)->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.3);

// Decode over `tokens` positions: args.range(1) == 0 attends to all raw tokens (uncompressed),
// 1 to the W8/S4 entries plus the raw tail and a 128-token local window.
template <class T>
double run_decode(benchmark::State& state, std::int64_t tokens, bool compressed, int reps,
                  double* bytes_out, bool timed_loop) {
  const std::int64_t kvh = 8, group = 4, d = 128, qh = kvh * group;
  const Geometry geo(8, 4, 0);
  const std::int64_t local = 128;
  const std::int64_t J = geo.complete_windows(tokens);
  const std::size_t raw_bytes = static_cast<std::size_t>(tokens * kvh * d) * sizeof(T);
  const std::size_t ent_bytes = static_cast<std::size_t>((J > 0 ? J : 1) * kvh * d) * sizeof(T);
  const std::size_t per_cache = 2 * (raw_bytes + ent_bytes);
  int copies = static_cast<int>(4 * l2_bytes() / per_cache) + 2;
  if (copies > 64) copies = 64;
  std::vector<DeviceMem> mem;
  mem.reserve(static_cast<std::size_t>(4 * copies));
  for (int c = 0; c < copies; ++c) {
    mem.emplace_back(raw_bytes);
    mem.emplace_back(raw_bytes);
    mem.emplace_back(ent_bytes);
    mem.emplace_back(ent_bytes);
  }
  for (std::size_t i = 0; i < mem.size(); ++i) {
    if (mem[i].p == nullptr) {
      state.SkipWithError("cudaMalloc failed (caches)");
      return 0.0;
    }
    fill<T>(mem[i].p, (i % 4 < 2 ? raw_bytes : ent_bytes) / sizeof(T),
            static_cast<std::uint32_t>(i));
  }
  DeviceMem q(static_cast<std::size_t>(qh * d) * sizeof(float)),
      out(static_cast<std::size_t>(qh * d) * sizeof(float)),
      lse(static_cast<std::size_t>(qh) * sizeof(float));
  fill<float>(q.p, static_cast<std::size_t>(qh * d), 7u);

  auto args_for = [&](int c) {
    phasekv::cuda::DecodeArgs<T> a;
    a.q = static_cast<const float*>(q.p);
    a.q_heads = qh;
    a.kv_heads = kvh;
    a.d_k = a.d_v = d;
    a.variant.scale = phasekv::default_scale(d);
    a.out = static_cast<float*>(out.p);
    a.lse = static_cast<float*>(lse.p);
    const auto rk =
        phasekv::make_view<const T>(static_cast<const T*>(mem[4 * c].p), tokens, kvh, d);
    const auto rv =
        phasekv::make_view<const T>(static_cast<const T*>(mem[4 * c + 1].p), tokens, kvh, d);
    const auto ek = phasekv::make_view<const T>(static_cast<const T*>(mem[4 * c + 2].p), J, kvh, d);
    const auto ev = phasekv::make_view<const T>(static_cast<const T*>(mem[4 * c + 3].p), J, kvh, d);
    if (compressed) {
      const phasekv::Visibility v = geo.visible(tokens, local);
      a.kv.push(
          {ek.slice(0, v.entries), ev.slice(0, v.entries), 0, phasekv::SegmentKind::compressed});
      a.kv.push({rk.slice(v.raw_begin, v.raw_count()), rv.slice(v.raw_begin, v.raw_count()),
                 v.raw_begin, phasekv::SegmentKind::raw});
    } else {
      a.kv.push({rk, rv, 0, phasekv::SegmentKind::raw});
    }
    return a;
  };
  auto a0 = args_for(0);
  std::size_t ws_bytes = 0;
  if (!cuda_ok(state, phasekv::cuda::decode(a0, nullptr, ws_bytes), "decode workspace query"))
    return 0.0;
  DeviceMem ws(ws_bytes);
  const double items = static_cast<double>(a0.kv.total());
  *bytes_out = items * static_cast<double>(kvh * 2 * d * sizeof(T)) +
               static_cast<double>(qh * d * sizeof(float) * 2 + qh * sizeof(float));
  // Warm-up (also surfaces launch errors).
  if (!cuda_ok(state, phasekv::cuda::decode(a0, ws.p, ws_bytes), "decode")) return 0.0;
  if (!cuda_ok(state, cudaDeviceSynchronize(), "decode")) return 0.0;
  EventTimer t;
  int c = 0;
  double total_ms = 0.0;
  if (timed_loop) {
    for (auto _ : state) {
      const auto a = args_for(c);
      c = (c + 1) % copies;
      t.start();
      (void)phasekv::cuda::decode(a, ws.p, ws_bytes);
      const double ms = t.stop_ms();
      state.SetIterationTime(ms * 1e-3);
      total_ms += ms;
    }
    return total_ms;
  }
  t.start();
  for (int r = 0; r < reps; ++r) {
    const auto a = args_for(c);
    c = (c + 1) % copies;
    (void)phasekv::cuda::decode(a, ws.p, ws_bytes);
  }
  return t.stop_ms() / reps;
}

template <class T>
void BM_Decode(benchmark::State& state) {
  if (!device_ready(state)) return;
  const std::int64_t tokens = state.range(0);
  const bool compressed = state.range(1) != 0;
  double bytes = 0.0;
  const double ms = run_decode<T>(state, tokens, compressed, 0, &bytes, true);
  if (ms <= 0.0) return;
  const double bw = bytes * static_cast<double>(state.iterations()) / (ms * 1e-3);
  state.counters["GBps"] = bw * 1e-9;
  const double copy = copy_bandwidth();
  state.counters["frac_copy"] = copy > 0.0 ? bw / copy : 0.0;
  state.counters["copy_GBps"] = copy * 1e-9;
  state.SetLabel(compressed ? "W8/S4+L128" : "uncompressed");
}
BENCHMARK_TEMPLATE(BM_Decode, bf16_t)
    ->ArgNames({"tokens", "compressed"})
    ->Args({32768, 0})
    ->Args({131072, 0})
    ->Args({131072, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.3);
BENCHMARK_TEMPLATE(BM_Decode, float)
    ->ArgNames({"tokens", "compressed"})
    ->Args({131072, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.3);

// Same-run comparison: time per decode over the uncompressed and the W8/S4 cache of the same
// length; reports speedup = t_uncompressed / t_compressed.
void BM_DecodeCompressedSpeedup(benchmark::State& state) {
  if (!device_ready(state)) return;
  const std::int64_t tokens = state.range(0);
  double b0 = 0.0, b1 = 0.0, full = 0.0, comp = 0.0;
  for (auto _ : state) {
    full = run_decode<bf16_t>(state, tokens, false, 50, &b0, false);
    comp = run_decode<bf16_t>(state, tokens, true, 50, &b1, false);
    state.SetIterationTime((full + comp) * 1e-3);
  }
  if (full <= 0.0 || comp <= 0.0) return;
  state.counters["full_us"] = full * 1e3;
  state.counters["compressed_us"] = comp * 1e3;
  state.counters["speedup"] = full / comp;
}
BENCHMARK(BM_DecodeCompressedSpeedup)
    ->ArgNames({"tokens"})
    ->Arg(131072)
    ->UseManualTime()
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond);

// Prefill of `nq` query tokens from position 0 with W8/S4 entries and a 128-token local
// window; FLOPs = 2 (d_k + d_v) * sum over (query, head) of the visible items.
template <class T>
void BM_Prefill(benchmark::State& state) {
  if (!device_ready(state)) return;
  const std::int64_t nq = state.range(0);
  const bool tensor = state.range(1) != 0;
  const std::int64_t kvh = 8, group = 4, d = 128, qh = kvh * group;
  const Geometry geo(8, 4, 0);
  const std::int64_t local = 128;
  const std::int64_t J = geo.complete_windows(nq);
  const std::size_t raw_elems = static_cast<std::size_t>(nq * kvh * d);
  const std::size_t ent_elems = static_cast<std::size_t>((J > 0 ? J : 1) * kvh * d);
  DeviceMem rk(raw_elems * sizeof(T)), rv(raw_elems * sizeof(T)), ek(ent_elems * sizeof(T)),
      ev(ent_elems * sizeof(T)), q(static_cast<std::size_t>(nq * qh * d) * sizeof(float)),
      out(static_cast<std::size_t>(nq * qh * d) * sizeof(float)),
      lse(static_cast<std::size_t>(nq * qh) * sizeof(float));
  for (void* p : {rk.p, rv.p, ek.p, ev.p, q.p, out.p, lse.p})
    if (p == nullptr) {
      state.SkipWithError("cudaMalloc failed");
      return;
    }
  fill<T>(rk.p, raw_elems, 1u);
  fill<T>(rv.p, raw_elems, 2u);
  fill<T>(ek.p, ent_elems, 3u);
  fill<T>(ev.p, ent_elems, 4u);
  fill<float>(q.p, static_cast<std::size_t>(nq * qh * d), 5u);
  phasekv::cuda::PrefillArgs<T> a;
  a.q = static_cast<const float*>(q.p);
  a.num_queries = nq;
  a.q_heads = qh;
  a.first = 0;
  a.geometry = geo;
  a.local = local;
  a.raw_k = phasekv::make_view<const T>(static_cast<const T*>(rk.p), nq, kvh, d);
  a.raw_v = phasekv::make_view<const T>(static_cast<const T*>(rv.p), nq, kvh, d);
  a.entry_k = phasekv::make_view<const T>(static_cast<const T*>(ek.p), J, kvh, d);
  a.entry_v = phasekv::make_view<const T>(static_cast<const T*>(ev.p), J, kvh, d);
  a.variant.scale = phasekv::default_scale(d);
  a.out = static_cast<float*>(out.p);
  a.lse = static_cast<float*>(lse.p);
  a.path = tensor ? phasekv::cuda::PrefillPath::tensor_core : phasekv::cuda::PrefillPath::generic;
  double visible = 0.0;
  for (std::int64_t t = 0; t < nq; ++t)
    visible += static_cast<double>(geo.visible(t + 1, local).total());
  const double flops = 2.0 * static_cast<double>(2 * d) * visible * static_cast<double>(qh);
  if (!cuda_ok(state, phasekv::cuda::prefill(a), "prefill")) return;
  if (!cuda_ok(state, cudaDeviceSynchronize(), "prefill")) return;
  EventTimer t;
  double total = 0.0;
  for (auto _ : state) {
    t.start();
    (void)phasekv::cuda::prefill(a);
    const double ms = t.stop_ms();
    state.SetIterationTime(ms * 1e-3);
    total += ms * 1e-3;
  }
  state.counters["TFLOPs"] = flops * static_cast<double>(state.iterations()) / total * 1e-12;
  state.SetLabel(tensor ? "mma.sync" : "generic");
}
BENCHMARK_TEMPLATE(BM_Prefill, bf16_t)
    ->ArgNames({"queries", "tensor_core"})
    ->Args({8192, 1})
    ->Args({8192, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.3);

}  // namespace

BENCHMARK_MAIN();
