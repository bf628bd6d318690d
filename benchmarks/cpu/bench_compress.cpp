// bench_attention_cpu: compression rows (BM_Compress: compress_batch of raw K and V, bf16,
// W8/S4, into entries; BM_CompressStreaming: the same tokens appended to a CompressedCache);
// counters as in bench_common.hpp.
#include <chrono>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "phasekv/compress/compress_batch.hpp"
#include "phasekv/compress/compressed_cache.hpp"
#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/compress/uniform_mean.hpp"

namespace pkv_bench {
namespace {

// The inputs of the compression rows: n = 65536 bf16 tokens of K and V (Hkv = 8, d = 128),
// W8/S4, UniformMean, and scalar-gate GatedPools for K and V.
struct CompressInputs {
  static constexpr std::int64_t n = 65536;
  const phasekv::Geometry g{8, 4};
  const std::size_t raw_elems = static_cast<std::size_t>(n * kHkv * kD);
  Buffer<bf16_t> rk = alloc<bf16_t>(raw_elems), rv = alloc<bf16_t>(raw_elems);
  std::vector<float> zk = std::vector<float>(static_cast<std::size_t>(kHkv * 8 * kD)), zv = zk,
                     bk = std::vector<float>(static_cast<std::size_t>(kHkv * 8)), bv = bk;
  CompressInputs() {
    fill(rk.get(), raw_elems, 31);
    fill(rv.get(), raw_elems, 32);
    fill(zk.data(), zk.size(), 33);
    fill(zv.data(), zv.size(), 34);
    fill(bk.data(), bk.size(), 35);
    fill(bv.data(), bv.size(), 36);
  }
  phasekv::UniformMean mean() const { return phasekv::UniformMean(g, kD); }
  phasekv::GatedPool gate(const std::vector<float>& z, const std::vector<float>& b) const {
    return phasekv::GatedPool(g, kHkv, kD, kD, phasekv::GateKind::scalar,
                              phasekv::param_view(z.data(), {kHkv, 8, 1, kD}),
                              phasekv::param_view(b.data(), {kHkv, 8, 1}));
  }
  phasekv::StridedView<const bf16_t> raw_k() const {
    return phasekv::make_view<const bf16_t>(rk.get(), n, kHkv, kD);
  }
  phasekv::StridedView<const bf16_t> raw_v() const {
    return phasekv::make_view<const bf16_t>(rv.get(), n, kHkv, kD);
  }
};

void BM_Compress(benchmark::State& state) {
  const int policy_id = static_cast<int>(state.range(0));  // 0 UniformMean, 1 GatedPool
  const int threads = static_cast<int>(state.range(1));
  const CompressInputs in;
  const std::int64_t n = in.n;
  const phasekv::Geometry g = in.g;
  const std::int64_t J = g.complete_windows(n);
  const std::size_t raw_elems = in.raw_elems;
  const std::size_t ent_elems = static_cast<std::size_t>(J * kHkv * kD);
  Buffer<bf16_t> ek = alloc<bf16_t>(ent_elems), ev = alloc<bf16_t>(ent_elems);
  const phasekv::UniformMean mean = in.mean();
  const phasekv::GatedPool gate_k = in.gate(in.zk, in.bk), gate_v = in.gate(in.zv, in.bv);
  const auto raw_k = in.raw_k();
  const auto raw_v = in.raw_v();
  const auto ent_k = phasekv::make_view<bf16_t>(ek.get(), J, kHkv, kD);
  const auto ent_v = phasekv::make_view<bf16_t>(ev.get(), J, kHkv, kD);
  const double ceiling = stream_ceiling(threads);
  const double fma_peak = fma_ceiling(threads);
  cpu::ThreadPool& tp = pool(threads);
  const auto step = [&] {
    tp.run([&](int i, int count) {
      if (policy_id == 0) {
        phasekv::compress_batch<bf16_t>(mean, raw_k, ent_k, i, count);
        phasekv::compress_batch<bf16_t>(mean, raw_v, ent_v, i, count);
      } else {
        phasekv::compress_batch<bf16_t>(gate_k, raw_k, ent_k, i, count);
        phasekv::compress_batch<bf16_t>(gate_v, raw_v, ent_v, i, count);
      }
    });
  };
  StreamNow now(threads);
  now.passes(2);
  step();  // warm
  double seconds = 0.0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    step();
    seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    benchmark::DoNotOptimize(ek.get());
  }
  now.passes(2);
  const double bytes = static_cast<double>(raw_elems * 2 * sizeof(bf16_t));
  const double bps = bytes * static_cast<double>(state.iterations()) / seconds;
  now.report(state, bps);
  // useful FLOP of K and V: per (window, head) W * d adds (UniformMean) or 2 W (d_in + d_out)
  // (GatedPool: gate dots and weighted sum); the exponentials and the division not counted
  const double w = static_cast<double>(g.window());
  const double per_window_head = policy_id == 0 ? w * kD : 2.0 * w * (kD + kD);
  const double fps = 2.0 * static_cast<double>(J * kHkv) * per_window_head *
                     static_cast<double>(state.iterations()) / seconds;
  state.counters["bytes_per_second"] = bps;
  state.counters["frac_of_stream"] = bps / ceiling;
  state.counters["stream_ceiling"] = ceiling;
  state.counters["flops"] = fps;
  state.counters["frac_of_fma_peak"] = fps / fma_peak;
  state.counters["fma_ceiling"] = fma_peak;
  state.counters["huge_frac"] = huge_frac({{in.rk.get(), raw_elems * sizeof(bf16_t)},
                                           {in.rv.get(), raw_elems * sizeof(bf16_t)},
                                           {ek.get(), ent_elems * sizeof(bf16_t)},
                                           {ev.get(), ent_elems * sizeof(bf16_t)}});
  state.SetLabel(std::string(policy_id == 0 ? "UniformMean_" : "GatedPool_scalar_identity_") +
                 path_name<Arch>());
}
BENCHMARK(BM_Compress)
    ->ArgNames({"policy", "threads"})
    ->Args({0, 1})
    ->Args({0, 2})
    ->Args({1, 1})
    ->Args({1, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Streaming compression: the same 65536 tokens (bf16, Hkv = 8, d = 128, W8/S4) appended to a
// CompressedCache with local window `local` in chunks of `chunk` tokens, one thread, K and V,
// side by side with compress_batch over the same tokens (one thread): every iteration times one
// streaming pass and one batch pass, and `of_batch` is the ratio of their bytes/s. Both count
// the raw K and V read. `hot` 0 streams the 256 MiB input from DRAM, as a long prompt or a
// replayed one arrives; `hot` 1 appends the first chunk's rows again and again (the cache
// positions still advance), as the chunk an engine has just projected sits in the caches. The
// cache keeps max(W, local) raw tokens in its ring, which the batch pass does not copy. The
// UniformMean rows with chunks of 2048, 4096 and 65536 tokens (one call) show how the per-call
// cost falls with the chunk size.
void BM_CompressStreaming(benchmark::State& state) {
  const int policy_id = static_cast<int>(state.range(0));  // 0 UniformMean, 1 GatedPool
  const std::int64_t chunk = state.range(1);
  const std::int64_t local = state.range(2);
  const bool hot = state.range(3) != 0;
  const CompressInputs in;
  const std::int64_t n = in.n;
  const std::int64_t J = in.g.complete_windows(n);
  const std::size_t raw_elems = in.raw_elems;
  const std::size_t ent_elems = static_cast<std::size_t>(J * kHkv * kD);
  Buffer<bf16_t> ek = alloc<bf16_t>(ent_elems), ev = alloc<bf16_t>(ent_elems);
  const auto ent_k = phasekv::make_view<bf16_t>(ek.get(), J, kHkv, kD);
  const auto ent_v = phasekv::make_view<bf16_t>(ev.get(), J, kHkv, kD);
  const auto raw_k = in.raw_k();
  const auto raw_v = in.raw_v();
  const double ceiling = stream_ceiling(1);
  StreamNow now(1);
  double seconds = 0.0, batch_seconds = 0.0;
  const auto run = [&](auto& cache, const auto& key_policy, const auto& value_policy) {
    const auto pass = [&] {
      cache.clear();
      for (std::int64_t p = 0; p < n; p += chunk) {
        const std::int64_t t = n - p < chunk ? n - p : chunk;
        const std::int64_t row = hot ? 0 : p;
        cache.append(raw_k.slice(row, t), raw_v.slice(row, t));
      }
    };
    const auto batch = [&] {
      phasekv::compress_batch<bf16_t>(key_policy, raw_k, ent_k);
      phasekv::compress_batch<bf16_t>(value_policy, raw_v, ent_v);
    };
    now.passes(2);
    pass();  // warm
    batch();
    for (auto _ : state) {
      seconds += seconds_of(pass);
      batch_seconds += seconds_of(batch);
      benchmark::DoNotOptimize(ek.get());
    }
    now.passes(2);
  };
  // The cache writes its entries into the batch pass's buffers: both passes write the same
  // memory (separately allocated buffers of this size stream at rates up to 10 % apart here,
  // whichever side they are given to). The ring and the (empty) prefix get their own.
  const phasekv::CacheExtents ext = phasekv::cache_extents(in.g, local, n);
  const std::size_t ring_elems = static_cast<std::size_t>(ext.ring_tokens * kHkv * kD);
  Buffer<bf16_t> ring_k = alloc<bf16_t>(ring_elems), ring_v = alloc<bf16_t>(ring_elems);
  phasekv::CacheStorage<bf16_t> storage;
  storage.prefix_keys = phasekv::make_view<bf16_t>(nullptr, 0, kHkv, kD);
  storage.prefix_values = storage.prefix_keys;
  storage.entry_keys = ent_k;
  storage.entry_values = ent_v;
  storage.ring_keys = phasekv::make_view<bf16_t>(ring_k.get(), ext.ring_tokens, kHkv, kD);
  storage.ring_values = phasekv::make_view<bf16_t>(ring_v.get(), ext.ring_tokens, kHkv, kD);
  if (policy_id == 0) {
    const phasekv::UniformMean mean = in.mean();
    phasekv::CompressedCache<bf16_t, phasekv::UniformMean, phasekv::UniformMean> cache(
        mean, mean, kHkv, kD, kD, local, n, storage);
    run(cache, mean, mean);
  } else {
    const phasekv::GatedPool gate_k = in.gate(in.zk, in.bk), gate_v = in.gate(in.zv, in.bv);
    phasekv::CompressedCache<bf16_t, phasekv::GatedPool, phasekv::GatedPool> cache(
        gate_k, gate_v, kHkv, kD, kD, local, n, storage);
    run(cache, gate_k, gate_v);
  }
  const double bytes = static_cast<double>(raw_elems * 2 * sizeof(bf16_t));
  const double iters = static_cast<double>(state.iterations());
  const double bps = bytes * iters / seconds;
  const double batch_bps = bytes * iters / batch_seconds;
  // the moment's stream rate spans both passes; report it against the streaming rate
  now.report(state, bps);
  state.counters["bytes_per_second"] = bps;
  state.counters["batch_bytes_per_second"] = batch_bps;
  state.counters["of_batch"] = bps / batch_bps;
  state.counters["frac_of_stream"] = bps / ceiling;
  state.counters["stream_ceiling"] = ceiling;
  state.SetLabel(std::string(policy_id == 0 ? "UniformMean_" : "GatedPool_scalar_identity_") +
                 "chunk" + std::to_string(chunk) + "_L" + std::to_string(local) +
                 (hot ? "_hot_" : "_cold_") + path_name<Arch>());
}
BENCHMARK(BM_CompressStreaming)
    ->ArgNames({"policy", "chunk", "local", "hot"})
    ->Args({0, 1, 128, 0})
    ->Args({0, 512, 128, 0})
    ->Args({0, 512, 8, 0})
    ->Args({0, 2048, 8, 0})
    ->Args({0, 4096, 8, 0})
    ->Args({0, 65536, 8, 0})
    ->Args({0, 512, 128, 1})
    ->Args({1, 1, 128, 0})
    ->Args({1, 512, 128, 0})
    ->Args({1, 512, 8, 0})
    ->Args({1, 512, 128, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace pkv_bench
