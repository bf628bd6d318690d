// bench_attention_cpu: prefill rows (BM_Prefill, T = 256 queries at the end of n = 16384
// tokens); counters as in bench_common.hpp.
#include <chrono>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "phasekv/attention/cpu/prefill.hpp"
#include "phasekv/attention/cpu/thread_driver.hpp"

namespace pkv_bench {
namespace {

void BM_Prefill(benchmark::State& state) {
  const int geo = static_cast<int>(state.range(0));
  const int threads = static_cast<int>(state.range(1));
  const std::int64_t n = 16384, T = 256;
  cpu::PrefillArgs<bf16_t> a;
  a.rule = rule_of(geo);
  const std::int64_t J = a.rule.at(n).entries;
  const std::size_t raw_elems = static_cast<std::size_t>(n * kHkv * kD);
  const std::size_t ent_elems = static_cast<std::size_t>((J > 0 ? J : 1) * kHkv * kD);
  Buffer<bf16_t> rk = alloc<bf16_t>(raw_elems), rv = alloc<bf16_t>(raw_elems);
  Buffer<bf16_t> ek = alloc<bf16_t>(ent_elems), ev = alloc<bf16_t>(ent_elems);
  fill(rk.get(), raw_elems, 21);
  fill(rv.get(), raw_elems, 22);
  fill(ek.get(), ent_elems, 23);
  fill(ev.get(), ent_elems, 24);
  std::vector<float> q(static_cast<std::size_t>(T * kHq * kD)), out(q.size()),
      lse(static_cast<std::size_t>(T * kHq));
  fill(q.data(), q.size(), 25);
  a.q = q.data();
  a.num_queries = T;
  a.q_heads = kHq;
  a.kv_heads = kHkv;
  a.d_k = kD;
  a.d_v = kD;
  a.first = n - T;
  a.raw_k = phasekv::make_view<const bf16_t>(rk.get(), n, kHkv, kD);
  a.raw_v = phasekv::make_view<const bf16_t>(rv.get(), n, kHkv, kD);
  a.entry_k = phasekv::make_view<const bf16_t>(ek.get(), J, kHkv, kD);
  a.entry_v = phasekv::make_view<const bf16_t>(ev.get(), J, kHkv, kD);
  a.variant.scale = phasekv::default_scale(kD);
  a.out = out.data();
  a.lse = lse.data();
  double flop = 0.0;  // useful FLOP: 2 (d_k + d_v) per visible (query head, key)
  for (std::int64_t i = 0; i < T; ++i)
    flop += static_cast<double>(a.rule.at(a.first + i + 1).total()) * kHq * 2.0 * (2 * kD);
  const double ceiling = fma_ceiling(threads);
  cpu::ThreadPool& tp = pool(threads);
  double seconds = 0.0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    cpu::prefill_parallel<Arch>(a, tp);
    seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    benchmark::DoNotOptimize(out.data());
  }
  const double fps = flop * static_cast<double>(state.iterations()) / seconds;
  state.counters["flops"] = fps;
  state.counters["frac_of_fma_peak"] = fps / ceiling;
  state.counters["fma_ceiling"] = ceiling;
  state.counters["huge_frac"] =
      huge_frac({{rk.get(), raw_elems * sizeof(bf16_t)}, {rv.get(), raw_elems * sizeof(bf16_t)}});
  state.SetLabel(std::string(geometry_name(geo)) + "_" + path_name<Arch>());
}
BENCHMARK(BM_Prefill)
    ->ArgNames({"geometry", "threads"})
    ->Args({kCsa, 1})
    ->Args({kCsa, 2})
    ->Args({kRaw, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace pkv_bench
