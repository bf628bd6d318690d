/// @file
/// @brief Architecture tags that select the instruction set of the CPU attention kernels at
/// compile time, and `NativeArch`, the widest one the current translation unit was built for.
///
/// Every kernel is a template on its architecture tag. A tag's code is only compiled when the
/// translation unit enables the matching instruction set (`-mavx2 -mfma -mf16c`,
/// `-mavx512f -mavx512bw -mavx512vl`, NEON on AArch64), so two translation units built with
/// different flags instantiate *different* template specializations and can never pick up each
/// other's code through the one-definition rule. Use `arch::Scalar` explicitly for a portable
/// build, or let the default `NativeArch` follow the compiler flags.
#pragma once

#include "phasekv/core/config.hpp"

/// PHASEKV_UNROLL (config.hpp) under the name the attention kernels use: fully unrolls a loop
/// over a register tile whose trip count is a template constant.
#define PHASEKV_CPU_UNROLL PHASEKV_UNROLL

PHASEKV_NAMESPACE_BEGIN
/// CPU (SIMD) attention kernels.
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

/// AVX-512 F/BW/VL (512-bit vectors); available when `__AVX512F__`, `__AVX512BW__` and `__AVX512VL__`
/// are defined.
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

/// AArch64 NEON (128-bit vectors); available when `__ARM_NEON` is defined on AArch64.
struct Neon {
  static constexpr const char* name = "neon";  ///< Short name.
  static constexpr int lanes = 4;              ///< f32 lanes of one vector register.
};

}  // namespace arch

/// True when the current translation unit's flags allow the code of tag `A`.
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
/// AVX2 needs `-mavx2 -mfma -mf16c` (or `-march` implying them).
template <>
struct arch_available<arch::Avx2> {
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  /// True when AVX2, FMA and F16C are enabled.
  static constexpr bool value = true;
#else
  /// True when AVX2, FMA and F16C are enabled.
  static constexpr bool value = false;
#endif
};
/// AVX-512 needs `-mavx512f -mavx512bw -mavx512vl` (and F16C).
template <>
struct arch_available<arch::Avx512> {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__F16C__)
  /// True when AVX-512 F/BW/VL are enabled.
  static constexpr bool value = true;
#else
  /// True when AVX-512 F/BW/VL are enabled.
  static constexpr bool value = false;
#endif
};
/// Avx512Bf16 needs the Avx512 flags and `-mavx512bf16`.
template <>
struct arch_available<arch::Avx512Bf16> {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__F16C__) && defined(__AVX512BF16__)
  /// True when AVX-512 F/BW/VL and AVX512-BF16 are enabled.
  static constexpr bool value = true;
#else
  /// True when AVX-512 F/BW/VL and AVX512-BF16 are enabled.
  static constexpr bool value = false;
#endif
};
/// NEON needs an AArch64 target.
template <>
struct arch_available<arch::Neon> {
#if defined(__ARM_NEON) && defined(__aarch64__)
  /// True on AArch64 with NEON.
  static constexpr bool value = true;
#else
  /// True on AArch64 with NEON.
  static constexpr bool value = false;
#endif
};

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__F16C__)
/// The widest architecture the translation unit's compiler flags enable.
using NativeArch = arch::Avx512;
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
/// The widest architecture the translation unit's compiler flags enable.
using NativeArch = arch::Avx2;
#elif defined(__ARM_NEON) && defined(__aarch64__)
/// The widest architecture the translation unit's compiler flags enable.
using NativeArch = arch::Neon;
#else
/// The widest architecture the translation unit's compiler flags enable (here: none, the
/// scalar path).
using NativeArch = arch::Scalar;
#endif

}  // namespace cpu
PHASEKV_NAMESPACE_END
