/// @file
/// @brief `Vec<arch::Avx2>`: 256-bit AVX2 + FMA + F16C implementation of the vector interface.
/// Compiled only when the translation unit enables those instruction sets.
#pragma once

#include <type_traits>

#include "phasekv/attention/cpu/arch.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "phasekv/core/x86_intrinsics.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cpu {

template <class Arch>
struct Vec;

/// Eight f32 lanes in a ymm register.
template <>
struct Vec<arch::Avx2> {
  using V = __m256;             ///< Eight lanes.
  static constexpr int W = 8;   ///< Lanes.
  /// Zero.
  static PHASEKV_FORCEINLINE V zero() { return _mm256_setzero_ps(); }
  /// Makes the compiler keep `x` in a register: an empty asm statement that "reads and
  /// changes" it, so the load that produced `x` cannot be folded into each instruction using
  /// it (GCC otherwise re-reads query vectors for every FMA of a logit tile: 40 loads per 32
  /// FMAs, which made the tile load-bound). Emits no instruction.
  static PHASEKV_FORCEINLINE void pin(V& x) {
#if defined(__GNUC__)
    __asm__("" : "+x"(x));
#else
    (void)x;
#endif
  }
  /// Broadcast.
  static PHASEKV_FORCEINLINE V set1(float x) { return _mm256_set1_ps(x); }
  /// Loads 8 floats (unaligned).
  static PHASEKV_FORCEINLINE V load(const float* p) { return _mm256_loadu_ps(p); }
  /// Loads 8 bf16 and widens them to float (exact).
  static PHASEKV_FORCEINLINE V load(const bf16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  /// Loads 8 f16 and widens them to float (exact).
  static PHASEKV_FORCEINLINE V load(const f16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  /// Vector registers of the target that the kernels size their tiles for.
  static constexpr int regs = 16;
  /// True when load2 of element type T returns even/odd elements (bf16: widening by shift
  /// and mask needs no lane crossing).
  template <class T>
  static constexpr bool interleaves() { return std::is_same<T, bf16_t>::value; }
  /// Loads 16 bf16: `a` gets elements 0, 2, ..., 14 and `b` elements 1, 3, ..., 15 (exact).
  static PHASEKV_FORCEINLINE void load2(const bf16_t* p, V& a, V& b) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    a = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    b = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(-65536)));
  }
  /// Loads 16 floats in order: a = p[0, 8), b = p[8, 16).
  static PHASEKV_FORCEINLINE void load2(const float* p, V& a, V& b) {
    a = load(p);
    b = load(p + 8);
  }
  /// Loads 16 f16 in order: a = p[0, 8), b = p[8, 16).
  static PHASEKV_FORCEINLINE void load2(const f16_t* p, V& a, V& b) {
    a = load(p);
    b = load(p + 8);
  }
  /// Deinterleaves 16 floats `x`: `y[0, 8)` gets x[0], x[2], ..., x[14] and `y[8, 16)` gets
  /// x[1], x[3], ..., x[15] (the order load2 gives bf16 rows).
  static PHASEKV_FORCEINLINE void deinterleave2(const float* x, float* y) {
    const V a = load(x), b = load(x + 8);
    const V e = _mm256_shuffle_ps(a, b, 0x88);  // a0 a2 b0 b2 | a4 a6 b4 b6
    const V o = _mm256_shuffle_ps(a, b, 0xDD);  // a1 a3 b1 b3 | a5 a7 b5 b7
    store(y, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), 0xD8)));
    store(y + 8, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), 0xD8)));
  }
  /// Inverse of deinterleave2, in place on 16 floats.
  static PHASEKV_FORCEINLINE void interleave2(float* y) {
    const V e = load(y), o = load(y + 8);
    const V lo = _mm256_unpacklo_ps(e, o);  // e0 o0 e1 o1 | e4 o4 e5 o5
    const V hi = _mm256_unpackhi_ps(e, o);  // e2 o2 e3 o3 | e6 o6 e7 o7
    store(y, _mm256_permute2f128_ps(lo, hi, 0x20));
    store(y + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
  }
  /// Transpose-add of 8 vectors: lane i of the result is the sum of the lanes of `a[i]`.
  static PHASEKV_FORCEINLINE V hsumw(const V* a) { return hsum8(a); }
  /// Stores 8 floats (unaligned).
  static PHASEKV_FORCEINLINE void store(float* p, V x) { _mm256_storeu_ps(p, x); }
  /// a + b.
  static PHASEKV_FORCEINLINE V add(V a, V b) { return _mm256_add_ps(a, b); }
  /// a * b.
  static PHASEKV_FORCEINLINE V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  /// Lane-wise max.
  static PHASEKV_FORCEINLINE V max(V a, V b) { return _mm256_max_ps(a, b); }
  /// a * b + c, fused.
  static PHASEKV_FORCEINLINE V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  /// Round to nearest integer (as float).
  static PHASEKV_FORCEINLINE V round(V a) {
    return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  /// 2^n for integer-valued n in [-126, 127].
  static PHASEKV_FORCEINLINE V pow2i(V n) {
    const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
  }
  /// Sum of the 8 lanes.
  static PHASEKV_FORCEINLINE float hsum(V a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  /// Max of the 8 lanes.
  static PHASEKV_FORCEINLINE float hmax(V a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  /// Sums of 8 vectors, lane i of the result holding the sum of `a[i]` (a transpose-add).
  static PHASEKV_FORCEINLINE V hsum8(const V* a) {
    const V s01 = _mm256_hadd_ps(a[0], a[1]);
    const V s23 = _mm256_hadd_ps(a[2], a[3]);
    const V s45 = _mm256_hadd_ps(a[4], a[5]);
    const V s67 = _mm256_hadd_ps(a[6], a[7]);
    const V s0123 = _mm256_hadd_ps(s01, s23);  // [0 1 2 3 | 0 1 2 3] halves
    const V s4567 = _mm256_hadd_ps(s45, s67);
    const V lo = _mm256_permute2f128_ps(s0123, s4567, 0x20);
    const V hi = _mm256_permute2f128_ps(s0123, s4567, 0x31);
    return _mm256_add_ps(lo, hi);
  }
  /// exp(x) with relative error below 2e-7; exactly 0 for x < -87 and for -inf.
  static PHASEKV_FORCEINLINE V exp(V x) {
    const V lo = _mm256_set1_ps(-87.0f);
    const V keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
    const V xc = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.0f));
    return _mm256_and_ps(keep, detail::exp_poly<Vec>(xc));
  }
};

}  // namespace cpu
PHASEKV_NAMESPACE_END

#endif
