// bench_attention_cpu: the ceiling loops (stream read, FMA chains) of one target pass (see
// phasekv/core/foreach_target.inc), so that a baseline-flags build measures its ceilings with
// the same instruction set its kernels run (cpu::active_arch()). No include guard.

namespace pkv_bench {
namespace PHASEKV_TGT_NS {

// Sum of floats [0, count): 8 independent vector accumulators.
template <class A>
float stream_sum(const float* p, std::size_t count) {
  using O = phasekv::cpu::detail::PHASEKV_TGT_NS::Vec<A>;
  constexpr int W = O::W;
  typename O::V acc[8];
  for (auto& a : acc) a = O::zero();
  std::size_t i = 0;
  for (; i + 8 * W <= count; i += 8 * W) PHASEKV_UNROLL
  for (int j = 0; j < 8; ++j) acc[j] = O::add(acc[j], O::load(p + i + j * W));
  float s = 0.0f;
  for (int j = 0; j < 8; ++j) s += O::hsum(acc[j]);
  for (; i < count; ++i) s += p[i];
  return s;
}

// `chains` independent FMA chains of `iters` steps; returns a sum so nothing is elided.
template <class A, int Chains>
float fma_chains(float seed, std::int64_t iters) {
  using O = phasekv::cpu::detail::PHASEKV_TGT_NS::Vec<A>;
  typename O::V a[Chains];
  for (int k = 0; k < Chains; ++k) a[k] = O::set1(seed + static_cast<float>(k));
  const typename O::V b = O::set1(0.9999999f), c = O::set1(1e-7f);
  for (std::int64_t it = 0; it < iters; ++it) {
    PHASEKV_UNROLL
    for (int k = 0; k < Chains; ++k) a[k] = O::fma(a[k], b, c);
  }
  typename O::V s = a[0];
  for (int k = 1; k < Chains; ++k) s = O::add(s, a[k]);
  return O::hsum(s);
}

}  // namespace PHASEKV_TGT_NS
}  // namespace pkv_bench
