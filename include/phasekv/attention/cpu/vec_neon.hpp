/// @file
/// @brief `Vec<arch::Neon>`: 128-bit AArch64 NEON implementation of the vector interface.
/// Compiled only on AArch64 targets.
#pragma once

#include <cstdint>

#include "phasekv/attention/cpu/arch.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"

#if defined(__ARM_NEON) && defined(__aarch64__)
#include <arm_neon.h>

PHASEKV_NAMESPACE_BEGIN
namespace cpu {

template <class Arch>
struct Vec;

/// Four f32 lanes in a q register.
template <>
struct Vec<arch::Neon> {
  using V = float32x4_t;        ///< Four lanes.
  static constexpr int W = 4;   ///< Lanes.
  /// Zero.
  static PHASEKV_FORCEINLINE V zero() { return vdupq_n_f32(0.0f); }
  /// Register hint of the x86 paths (see Vec<arch::Avx512>::pin); nothing to do here.
  static PHASEKV_FORCEINLINE void pin(V&) {}
  /// Broadcast.
  static PHASEKV_FORCEINLINE V set1(float x) { return vdupq_n_f32(x); }
  /// Loads 4 floats.
  static PHASEKV_FORCEINLINE V load(const float* p) { return vld1q_f32(p); }
  /// Loads 4 bf16 and widens them to float (exact).
  static PHASEKV_FORCEINLINE V load(const bf16_t* p) {
    const uint16x4_t h = vld1_u16(reinterpret_cast<const std::uint16_t*>(p));
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
  }
  /// Loads 4 f16 and widens them to float (exact).
  static PHASEKV_FORCEINLINE V load(const f16_t* p) {
    const uint16x4_t h = vld1_u16(reinterpret_cast<const std::uint16_t*>(p));
    return vcvt_f32_f16(vreinterpret_f16_u16(h));
  }
  /// Stores 4 floats.
  static PHASEKV_FORCEINLINE void store(float* p, V x) { vst1q_f32(p, x); }
  /// a + b.
  static PHASEKV_FORCEINLINE V add(V a, V b) { return vaddq_f32(a, b); }
  /// a * b.
  static PHASEKV_FORCEINLINE V mul(V a, V b) { return vmulq_f32(a, b); }
  /// Lane-wise max.
  static PHASEKV_FORCEINLINE V max(V a, V b) { return vmaxq_f32(a, b); }
  /// a * b + c, fused.
  static PHASEKV_FORCEINLINE V fma(V a, V b, V c) { return vfmaq_f32(c, a, b); }
  /// Round to nearest integer (as float).
  static PHASEKV_FORCEINLINE V round(V a) { return vrndnq_f32(a); }
  /// 2^n for integer-valued n in [-126, 127].
  static PHASEKV_FORCEINLINE V pow2i(V n) {
    const int32x4_t e = vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127));
    return vreinterpretq_f32_s32(vshlq_n_s32(e, 23));
  }
  /// Vector registers of the target that the kernels size their tiles for.
  static constexpr int regs = 32;
  /// True when load2 of element type T returns even/odd elements (never, here).
  template <class T>
  static constexpr bool interleaves() { return false; }
  /// Loads 2W = 8 elements in order: a = p[0, 4), b = p[4, 8).
  template <class T>
  static PHASEKV_FORCEINLINE void load2(const T* p, V& a, V& b) {
    a = load(p);
    b = load(p + 4);
  }
  /// Transpose-add of 4 vectors: lane i of the result is the sum of the lanes of `a[i]`.
  static PHASEKV_FORCEINLINE V hsumw(const V* a) {
    return vpaddq_f32(vpaddq_f32(a[0], a[1]), vpaddq_f32(a[2], a[3]));
  }
  /// Sum of the 4 lanes.
  static PHASEKV_FORCEINLINE float hsum(V a) { return vaddvq_f32(a); }
  /// Max of the 4 lanes.
  static PHASEKV_FORCEINLINE float hmax(V a) { return vmaxvq_f32(a); }
  /// exp(x) with relative error below 2e-7; exactly 0 for x < -87 and for -inf.
  static PHASEKV_FORCEINLINE V exp(V x) {
    const V lo = vdupq_n_f32(-87.0f);
    const uint32x4_t keep = vcgeq_f32(x, lo);
    const V xc = vminq_f32(vmaxq_f32(x, lo), vdupq_n_f32(88.0f));
    return vreinterpretq_f32_u32(
        vandq_u32(keep, vreinterpretq_u32_f32(detail::exp_poly<Vec>(xc))));
  }
};

}  // namespace cpu
PHASEKV_NAMESPACE_END

#endif
