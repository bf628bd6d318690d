/// @file
/// @brief `Vec<Arch>`: the small set of vector operations the CPU kernels (attention and
/// compression) are written in (load-and-convert of f32/bf16/f16 storage, fused multiply-add,
/// horizontal reductions, a fast exp). The specializations live in kernels/vec.inl, compiled once
/// per target pass (core/foreach_target.inc); the kernels themselves are written once against this
/// interface.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "phasekv/cpu/arch.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/target.hpp"

#if !defined(PHASEKV_DOXYGEN)  // the kernel bodies, once per target pass
#define PHASEKV_TARGET_BODY "phasekv/cpu/kernels/vec.inl"
#include "phasekv/core/foreach_target.inc"
#endif

PHASEKV_NAMESPACE_BEGIN
namespace cpu {
namespace detail {

/// The pass that holds `Vec<Arch>`; the primary template rejects tags this translation unit
/// does not compile.
template <class Arch>
struct vec_of {
  static_assert(sizeof(Arch) == 0,
                "phasekv::cpu::Vec<Arch>: this architecture is not compiled in this translation "
                "unit (run-time dispatch is off or unsupported by this compiler; compile with "
                "-mavx2 -mfma -mf16c for Avx2, -mavx512f -mavx512bw -mavx512vl -mavx512dq for "
                "Avx512, an AArch64 target for Neon) or use arch::Scalar");
};
template <>
struct vec_of<arch::Scalar> {
  using type = tgt_base::Vec<arch::Scalar>;
};
#if PHASEKV_FLAGS_NEON
template <>
struct vec_of<arch::Neon> {
  using type = tgt_base::Vec<arch::Neon>;
};
#endif
#if PHASEKV_HAS_AVX2
template <>
struct vec_of<arch::Avx2> {
  using type = tgt_avx2::Vec<arch::Avx2>;
};
#endif
#if PHASEKV_HAS_AVX512
template <>
struct vec_of<arch::Avx512> {
  using type = tgt_avx512::Vec<arch::Avx512>;
};
#endif
#if PHASEKV_HAS_AVX512BF16
template <>
struct vec_of<arch::Avx512Bf16> {
  using type = tgt_avx512bf16::Vec<arch::Avx512Bf16>;
};
#endif

}  // namespace detail

/// Vector operations of architecture `Arch`: `using V` (a register of `W` floats), `zero()`,
/// `set1(f)`, `load` of W f32/bf16/f16 elements converted to f32, `store`, `add`, `mul`, `div`,
/// `max`, `fma(a, b, c) = a * b + c`, `round` (to nearest even), `pow2i(n)` (2^n for
/// integer-valued n in [-126, 127]), `hsum`, `hmax`, `pin(V&)` (a register-allocation hint),
/// and `exp(x)` (relative error below 2e-7 on [-87, 88], exactly 0 for x < -87 and -inf).
///
/// Its functions carry the instruction set of `Arch`: code that calls them directly must be
/// compiled for it (flags, or a target region); the kernels' entry points do that themselves.
template <class Arch>
using Vec = typename detail::vec_of<Arch>::type;

}  // namespace cpu
PHASEKV_NAMESPACE_END
