/// @file
/// @brief `Vec<Arch>`: the small set of vector operations the CPU attention kernels are
/// written in (load-and-convert of f32/bf16/f16 storage, fused multiply-add, horizontal
/// reductions, a fast exp). One specialization per architecture tag lives in its own file
/// (vec_scalar.hpp, vec_avx2.hpp, vec_avx512.hpp, vec_neon.hpp); the kernels themselves are
/// written once against this interface.
#pragma once

#include "phasekv/attention/cpu/arch.hpp"
#include "phasekv/core/config.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cpu {

/// Vector operations of architecture `Arch`. The primary template rejects tags whose
/// instruction set the translation unit was not compiled for.
///
/// Every specialization provides: `using V` (a register of `W` floats), `zero()`, `set1(f)`,
/// `load(const float*)`, `load(const bf16_t*)`, `load(const f16_t*)` (W elements, converted
/// to f32), `store(float*, V)`, `add`, `mul`, `max`, `fma(a, b, c) = a * b + c`, `hsum`,
/// `hmax`, `pin(V&)` (a register-allocation hint, no instruction), and `exp(x)` (relative
/// error below 2e-7 on [-87, 88], exactly 0 for x < -87 and for -inf, inputs above 88 clamped
/// to 88; the kernels only pass x <= 0).
template <class Arch>
struct Vec {
  static_assert(sizeof(Arch) == 0,
                "phasekv::cpu::Vec<Arch>: this architecture is not enabled in this translation "
                "unit; compile with the matching flags (-mavx2 -mfma -mf16c for Avx2, "
                "-mavx512f -mavx512bw -mavx512vl for Avx512, an AArch64 target for Neon) or use "
                "phasekv::cpu::NativeArch / arch::Scalar");
};

namespace detail {

/// Polynomial exp for x already clamped to [-87, 88]; written once over any `Vec` ops.
/// Splits x = n ln2 + r with |r| <= ln2/2 and evaluates a degree-6 minimax polynomial.
template <class Ops>
PHASEKV_FORCEINLINE typename Ops::V exp_poly(typename Ops::V x) {
  using V = typename Ops::V;
  const V n = Ops::round(Ops::mul(x, Ops::set1(1.44269504088896341f)));
  V r = Ops::fma(n, Ops::set1(-0.693359375f), x);
  r = Ops::fma(n, Ops::set1(2.12194440e-4f), r);
  V p = Ops::set1(1.9875691500e-4f);
  p = Ops::fma(p, r, Ops::set1(1.3981999507e-3f));
  p = Ops::fma(p, r, Ops::set1(8.3334519073e-3f));
  p = Ops::fma(p, r, Ops::set1(4.1665795894e-2f));
  p = Ops::fma(p, r, Ops::set1(1.6666665459e-1f));
  p = Ops::fma(p, r, Ops::set1(5.0000001201e-1f));
  const V r2 = Ops::mul(r, r);
  p = Ops::fma(p, r2, Ops::add(r, Ops::set1(1.0f)));
  return Ops::mul(p, Ops::pow2i(n));
}

}  // namespace detail
}  // namespace cpu
PHASEKV_NAMESPACE_END

#include "phasekv/attention/cpu/vec_scalar.hpp"
#include "phasekv/attention/cpu/vec_avx2.hpp"
#include "phasekv/attention/cpu/vec_avx512.hpp"
#include "phasekv/attention/cpu/vec_neon.hpp"
