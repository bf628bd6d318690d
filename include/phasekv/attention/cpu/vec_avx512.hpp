/// @file
/// @brief `Vec<arch::Avx512>`: 512-bit AVX-512 F/BW/VL implementation of the vector interface,
/// with an AVX512-BF16 dot product of a split f32 query against bf16 keys when
/// `__AVX512BF16__` is defined (used by the arch::Avx512Bf16 decode path). Compiled only when the translation unit enables AVX-512.
#pragma once

#include <cstdint>
#include <type_traits>

#include "phasekv/attention/cpu/arch.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__F16C__)
#include "phasekv/core/x86_intrinsics.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cpu {

template <class Arch>
struct Vec;

/// Sixteen f32 lanes in a zmm register.
template <>
struct Vec<arch::Avx512> {
  using V = __m512;              ///< Sixteen lanes.
  static constexpr int W = 16;   ///< Lanes.
  /// Zero.
  static PHASEKV_FORCEINLINE V zero() { return _mm512_setzero_ps(); }
  /// Makes the compiler keep `x` in a register: an empty asm statement that "reads and
  /// changes" it, so the load that produced `x` cannot be folded into each instruction using
  /// it (GCC otherwise re-reads query vectors for every FMA of a logit tile: 40 loads per 32
  /// FMAs, which made the tile load-bound). Emits no instruction.
  static PHASEKV_FORCEINLINE void pin(V& x) {
#if defined(__GNUC__)
    __asm__("" : "+v"(x));
#else
    (void)x;
#endif
  }
  /// Broadcast.
  static PHASEKV_FORCEINLINE V set1(float x) { return _mm512_set1_ps(x); }
  /// Loads 16 floats (unaligned).
  static PHASEKV_FORCEINLINE V load(const float* p) { return _mm512_loadu_ps(p); }
  /// Loads 16 bf16 and widens them to float (exact).
  static PHASEKV_FORCEINLINE V load(const bf16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  /// Loads 16 f16 and widens them to float (exact).
  static PHASEKV_FORCEINLINE V load(const f16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  /// Vector registers of the target that the kernels size their tiles for.
  static constexpr int regs = 32;
  /// True when load2 of element type T returns even/odd elements (bf16: widening by shift
  /// and mask needs no lane crossing).
  template <class T>
  static constexpr bool interleaves() { return std::is_same<T, bf16_t>::value; }
  /// Loads 32 bf16: `a` gets elements 0, 2, ..., 30 and `b` elements 1, 3, ..., 31 (exact).
  static PHASEKV_FORCEINLINE void load2(const bf16_t* p, V& a, V& b) {
    const __m512i x = _mm512_loadu_si512(p);
    a = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    b = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(-65536)));
  }
  /// Loads 32 floats in order: a = p[0, 16), b = p[16, 32).
  static PHASEKV_FORCEINLINE void load2(const float* p, V& a, V& b) {
    a = load(p);
    b = load(p + 16);
  }
  /// Loads 32 f16 in order: a = p[0, 16), b = p[16, 32).
  static PHASEKV_FORCEINLINE void load2(const f16_t* p, V& a, V& b) {
    a = load(p);
    b = load(p + 16);
  }
  /// Deinterleaves 32 floats `x`: `y[0, 16)` gets x[0], x[2], ..., x[30] and `y[16, 32)` gets
  /// x[1], x[3], ..., x[31] (the order load2 gives bf16 rows).
  static PHASEKV_FORCEINLINE void deinterleave2(const float* x, float* y) {
    const __m512i ie = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i io = _mm512_add_epi32(ie, _mm512_set1_epi32(1));
    const V a = load(x), b = load(x + 16);
    store(y, _mm512_permutex2var_ps(a, ie, b));
    store(y + 16, _mm512_permutex2var_ps(a, io, b));
  }
  /// Inverse of deinterleave2, in place on 32 floats.
  static PHASEKV_FORCEINLINE void interleave2(float* y) {
    const __m512i il = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i ih = _mm512_add_epi32(il, _mm512_set1_epi32(8));
    const V e = load(y), o = load(y + 16);
    store(y, _mm512_permutex2var_ps(e, il, o));
    store(y + 16, _mm512_permutex2var_ps(e, ih, o));
  }
  /// Transpose-add of 16 vectors: lane i of the result is the sum of the lanes of `a[i]`
  /// (45 shuffles and adds instead of 16 separate reductions).
  static PHASEKV_FORCEINLINE V hsumw(const V* a) {
    V t[8];  // lanes 0, 2 of each 128-bit block hold a[2j], lanes 1, 3 hold a[2j + 1]
    PHASEKV_CPU_UNROLL
    for (int j = 0; j < 8; ++j)
      t[j] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * j], a[2 * j + 1]),
                           _mm512_unpackhi_ps(a[2 * j], a[2 * j + 1]));
    V u[4];  // block b of u[j]: partial sums of a[4j .. 4j + 3] over block b
    PHASEKV_CPU_UNROLL
    for (int j = 0; j < 4; ++j)
      u[j] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * j], t[2 * j + 1], 0x44),
                           _mm512_shuffle_ps(t[2 * j], t[2 * j + 1], 0xEE));
    const V w01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88),
                                _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
    const V w23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88),
                                _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, 0x88),
                         _mm512_shuffle_f32x4(w01, w23, 0xDD));
  }
  /// Stores 16 floats (unaligned).
  static PHASEKV_FORCEINLINE void store(float* p, V x) { _mm512_storeu_ps(p, x); }
  /// a + b.
  static PHASEKV_FORCEINLINE V add(V a, V b) { return _mm512_add_ps(a, b); }
  /// a * b.
  static PHASEKV_FORCEINLINE V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  /// Lane-wise max.
  static PHASEKV_FORCEINLINE V max(V a, V b) { return _mm512_max_ps(a, b); }
  /// a * b + c, fused.
  static PHASEKV_FORCEINLINE V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  /// Round to nearest integer (as float).
  static PHASEKV_FORCEINLINE V round(V a) {
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  /// 2^n for integer-valued n in [-126, 127].
  static PHASEKV_FORCEINLINE V pow2i(V n) {
    const __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
  }
  /// Sum of the 16 lanes.
  static PHASEKV_FORCEINLINE float hsum(V a) { return _mm512_reduce_add_ps(a); }
  /// Max of the 16 lanes.
  static PHASEKV_FORCEINLINE float hmax(V a) { return _mm512_reduce_max_ps(a); }
  /// exp(x) with relative error below 2e-7; exactly 0 for x < -87 and for -inf.
  static PHASEKV_FORCEINLINE V exp(V x) {
    const V lo = _mm512_set1_ps(-87.0f);
    const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
    const V xc = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(88.0f));
    return _mm512_maskz_mov_ps(keep, detail::exp_poly<Vec>(xc));
  }

#if defined(__AVX512BF16__)
  /// True: `dot_bf16` is available.
  static constexpr bool has_bf16_dot = true;
  /// Splits 32 floats `q` into bf16 high and low parts (q ~ hi + lo to about 16 mantissa bits),
  /// stored as 32 bf16 each in `hi` and `lo`.
  static PHASEKV_FORCEINLINE void split_bf16(const float* q, bf16_t* hi, bf16_t* lo) {
    const V a = _mm512_loadu_ps(q);
    const V b = _mm512_loadu_ps(q + 16);
    const __m512bh h = _mm512_cvtne2ps_pbh(b, a);
    const __m512i hb = (__m512i)h;
    const V ha = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
        _mm512_castsi512_si256(hb)), 16));
    const V hbv = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
        _mm512_extracti64x4_epi64(hb, 1)), 16));
    const __m512bh l = _mm512_cvtne2ps_pbh(_mm512_sub_ps(b, hbv), _mm512_sub_ps(a, ha));
    _mm512_storeu_si512(hi, (__m512i)h);
    _mm512_storeu_si512(lo, (__m512i)l);
  }
  /// acc += hi . k + lo . k over 32 bf16 elements (pairs summed into 16 lanes).
  static PHASEKV_FORCEINLINE V dot_bf16(V acc, const bf16_t* hi, const bf16_t* lo,
                                        const bf16_t* k) {
    const __m512i kv = _mm512_loadu_si512(k);
    const __m512i hv = _mm512_loadu_si512(hi);
    const __m512i lv = _mm512_loadu_si512(lo);
    acc = _mm512_dpbf16_ps(acc, (__m512bh)hv, (__m512bh)kv);
    return _mm512_dpbf16_ps(acc, (__m512bh)lv, (__m512bh)kv);
  }
#else
  /// False: no AVX512-BF16 in this translation unit.
  static constexpr bool has_bf16_dot = false;
#endif
};

#if defined(__AVX512BF16__)
/// The Avx512 operations (the tag only changes which decode path is used for bf16 keys).
template <>
struct Vec<arch::Avx512Bf16> : Vec<arch::Avx512> {};
#endif

}  // namespace cpu
PHASEKV_NAMESPACE_END

#endif
