/// @file
/// @brief Architecture tags that select the instruction set of the CPU kernels (attention and
/// compression): `arch::Auto`
/// (the default: chosen at run time, dispatch.hpp), an explicit tag (compile-time choice), and
/// `NativeArch`, the widest one the current translation unit's flags enable.
///
/// Every kernel is a template on its architecture tag, compiled in the target pass of that tag
/// (core/foreach_target.inc): with run-time dispatch (PHASEKV_DISPATCH, GCC and Clang on
/// x86-64) every x86 tag is available whatever the flags; otherwise a tag's code is only
/// compiled when the translation unit enables the matching instruction set. Passes live in
/// their own namespaces inside the instruction-set namespace (config.hpp), so two translation
/// units never share differently compiled code through the one-definition rule.
#pragma once

#include "phasekv/core/config.hpp"
#include "phasekv/core/target.hpp"

PHASEKV_NAMESPACE_BEGIN
/// CPU (SIMD) kernels: attention, and the tags and vector operations the compression kernels
/// share with it.
namespace cpu {
/// Architecture tags.
namespace arch {

/// Portable scalar code; always available.
struct Scalar {
  static constexpr const char* name = "scalar";  ///< Short name.
  static constexpr int lanes = 1;                ///< f32 lanes of one vector register.
};

/// AVX2 + FMA + F16C (256-bit vectors); available when `__AVX2__`, `__FMA__` and `__F16C__`
/// are defined.
struct Avx2 {
  static constexpr const char* name = "avx2";  ///< Short name.
  static constexpr int lanes = 8;              ///< f32 lanes of one vector register.
};

/// AVX-512 F/BW/VL (512-bit vectors); available when `__AVX512F__`, `__AVX512BW__` and
/// `__AVX512VL__` are defined.
struct Avx512 {
  static constexpr const char* name = "avx512";  ///< Short name.
  static constexpr int lanes = 16;               ///< f32 lanes of one vector register.
};

/// Avx512 plus AVX512-BF16: identical to Avx512 except that decode computes the logits of
/// bf16 keys with VDPBF16PS dot products of the query split into bf16 high and low parts
/// (about 16 mantissa bits). Available when `__AVX512BF16__` is defined as well. `NativeArch`
/// never selects it: on the CPUs measured (docs/kernels.md) the dot product runs on one port
/// and this path is slower than Avx512's widen-and-FMA decode; it is kept for CPUs where the
/// balance differs, and benchmarked side by side (BM_DecodeBf16Dot).
struct Avx512Bf16 {
  static constexpr const char* name = "avx512bf16";  ///< Short name.
  static constexpr int lanes = 16;                   ///< f32 lanes of one vector register.
};

/// Run-time choice: the default of every public entry point. With run-time dispatch
/// (PHASEKV_DISPATCH) the call runs the tag active_arch() names (dispatch.hpp): the widest
/// of Avx512, Avx2 and Scalar the CPU supports, or the one the environment variable
/// PHASEKV_ARCH forces. Without it, NativeArch.
struct Auto {
  static constexpr const char* name = "auto";  ///< Short name.
  static constexpr int lanes = 0;              ///< Not a vector width (chosen at run time).
};

/// AArch64 NEON (128-bit vectors); available when `__ARM_NEON` is defined on AArch64.
struct Neon {
  static constexpr const char* name = "neon";  ///< Short name.
  static constexpr int lanes = 4;              ///< f32 lanes of one vector register.
};

}  // namespace arch

/// True when the current translation unit contains the kernels of tag `A`: always for
/// Scalar; for Avx2, Avx512 and Avx512Bf16 when run-time dispatch compiles them
/// (PHASEKV_DISPATCH, core/target.hpp) or the translation unit's flags enable them; for Neon on
/// AArch64. Whether the *CPU* can run them is cpu_supports<A>() (cpu_features.hpp).
template <class A>
struct arch_available {
  /// The answer.
  static constexpr bool value = false;
};
/// The scalar path is always available.
template <>
struct arch_available<arch::Scalar> {
  /// Always true.
  static constexpr bool value = true;
};
/// AVX2 + FMA + F16C.
template <>
struct arch_available<arch::Avx2> {
  /// True when the AVX2 pass is compiled.
  static constexpr bool value = PHASEKV_HAS_AVX2 != 0;
};
/// AVX-512 F/BW/VL.
template <>
struct arch_available<arch::Avx512> {
  /// True when the AVX-512 pass is compiled.
  static constexpr bool value = PHASEKV_HAS_AVX512 != 0;
};
/// AVX-512 and AVX512-BF16.
template <>
struct arch_available<arch::Avx512Bf16> {
  /// True when the AVX-512 + BF16 pass is compiled.
  static constexpr bool value = PHASEKV_HAS_AVX512BF16 != 0;
};
/// NEON needs an AArch64 target.
template <>
struct arch_available<arch::Neon> {
  /// True on AArch64 with NEON.
  static constexpr bool value = PHASEKV_FLAGS_NEON != 0;
};

#if PHASEKV_FLAGS_AVX512
/// The widest architecture the translation unit's compiler flags enable.
using NativeArch = arch::Avx512;
#elif PHASEKV_FLAGS_AVX2
/// The widest architecture the translation unit's compiler flags enable.
using NativeArch = arch::Avx2;
#elif PHASEKV_FLAGS_NEON
/// The widest architecture the translation unit's compiler flags enable.
using NativeArch = arch::Neon;
#else
/// The widest architecture the translation unit's compiler flags enable (here: none, the
/// scalar path).
using NativeArch = arch::Scalar;
#endif

namespace detail {
// One tag type per target pass (core/foreach_target.inc); a kernel body's entry points take it
// as their first argument, so that a call finds the pass by argument-dependent lookup.
namespace tgt_base {
/// Tag of the base pass.
struct Target {};
}  // namespace tgt_base
#if PHASEKV_HAS_AVX2
namespace tgt_avx2 {
/// Tag of the AVX2 pass.
struct Target {};
}  // namespace tgt_avx2
#endif
#if PHASEKV_HAS_AVX512
namespace tgt_avx512 {
/// Tag of the AVX-512 pass.
struct Target {};
}  // namespace tgt_avx512
#endif
#if PHASEKV_HAS_AVX512BF16
namespace tgt_avx512bf16 {
/// Tag of the AVX-512 + BF16 pass.
struct Target {};
}  // namespace tgt_avx512bf16
#endif

/// The pass that compiles the kernels of tag `Arch`.
template <class Arch>
struct target_of {
  static_assert(sizeof(Arch) == 0,
                "phasekv::cpu: the kernels of this architecture tag are not compiled in this "
                "translation unit (see arch_available and PHASEKV_DISPATCH)");
};
template <>
struct target_of<arch::Scalar> {
  using type = tgt_base::Target;
};
#if PHASEKV_FLAGS_NEON
template <>
struct target_of<arch::Neon> {
  using type = tgt_base::Target;
};
#endif
#if PHASEKV_HAS_AVX2
template <>
struct target_of<arch::Avx2> {
  using type = tgt_avx2::Target;
};
#endif
#if PHASEKV_HAS_AVX512
template <>
struct target_of<arch::Avx512> {
  using type = tgt_avx512::Target;
};
#endif
#if PHASEKV_HAS_AVX512BF16
template <>
struct target_of<arch::Avx512Bf16> {
  using type = tgt_avx512bf16::Target;
};
#endif
/// Tag value of the pass of `Arch`.
template <class Arch>
using target_t = typename target_of<Arch>::type;
}  // namespace detail

}  // namespace cpu
PHASEKV_NAMESPACE_END
