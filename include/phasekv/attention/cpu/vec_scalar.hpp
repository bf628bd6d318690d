/// @file
/// @brief `Vec<arch::Scalar>`: the portable one-lane implementation of the vector interface.
#pragma once

#include <cmath>

#include "phasekv/attention/cpu/arch.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cpu {

template <class Arch>
struct Vec;

/// Scalar "vector" of one float; works on every target.
template <>
struct Vec<arch::Scalar> {
  using V = float;              ///< One lane.
  static constexpr int W = 1;   ///< Lanes.
  /// Zero.
  static PHASEKV_FORCEINLINE V zero() { return 0.0f; }
  /// Register hint of the x86 paths (see Vec<arch::Avx512>::pin); nothing to do here.
  static PHASEKV_FORCEINLINE void pin(V&) {}
  /// Broadcast.
  static PHASEKV_FORCEINLINE V set1(float x) { return x; }
  /// Loads one float.
  static PHASEKV_FORCEINLINE V load(const float* p) { return *p; }
  /// Loads one bf16 as float.
  static PHASEKV_FORCEINLINE V load(const bf16_t* p) { return bf16_to_float(*p); }
  /// Loads one f16 as float.
  static PHASEKV_FORCEINLINE V load(const f16_t* p) { return f16_to_float(*p); }
  /// Stores one float.
  static PHASEKV_FORCEINLINE void store(float* p, V x) { *p = x; }
  /// a + b.
  static PHASEKV_FORCEINLINE V add(V a, V b) { return a + b; }
  /// a * b.
  static PHASEKV_FORCEINLINE V mul(V a, V b) { return a * b; }
  /// max(a, b).
  static PHASEKV_FORCEINLINE V max(V a, V b) { return a > b ? a : b; }
  /// a * b + c (fused when the target has it).
  static PHASEKV_FORCEINLINE V fma(V a, V b, V c) { return std::fma(a, b, c); }
  /// Sum of lanes.
  static PHASEKV_FORCEINLINE float hsum(V a) { return a; }
  /// Max of lanes.
  static PHASEKV_FORCEINLINE float hmax(V a) { return a; }
  /// Vector registers of the target that the kernels size their tiles for.
  static constexpr int regs = 16;
  /// True when load2 of element type T returns even/odd elements (never, here).
  template <class T>
  static constexpr bool interleaves() { return false; }
  /// Loads 2 elements in order: a = p[0], b = p[1].
  template <class T>
  static PHASEKV_FORCEINLINE void load2(const T* p, V& a, V& b) {
    a = load(p);
    b = load(p + 1);
  }
  /// Transpose-add of W = 1 vector: the value itself.
  static PHASEKV_FORCEINLINE V hsumw(const V* a) { return a[0]; }
  /// exp(x); 0 for x < -87 and for -inf.
  static PHASEKV_FORCEINLINE V exp(V x) { return x < -87.0f ? 0.0f : std::exp(x); }
};

}  // namespace cpu
PHASEKV_NAMESPACE_END
