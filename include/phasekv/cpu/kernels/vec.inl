// phasekv: `Vec<Arch>` of one target pass (see core/foreach_target.inc), included by
// cpu/vec.hpp once per pass. No include guard, no includes: every header this uses
// is included by vec.hpp before the passes.
//
// Every specialization provides: `using V` (a register of `W` floats), `zero()`, `set1(f)`,
// `load(const float*)`, `load(const bf16_t*)`, `load(const f16_t*)` (W elements, converted to
// f32), `store(float*, V)`, `add`, `mul`, `div`, `max`, `fma(a, b, c) = a * b + c`, `round` (to
// nearest even), `pow2i(n)` (2^n for integer-valued n in [-126, 127]), `hsum`, `hmax`,
// `pin(V&)` (a register-allocation hint, no instruction), and `exp(x)` (relative error below
// 2e-7 on [-87, 88], exactly 0 for x < -87 and for -inf, inputs above 88 clamped to 88; the
// kernels only pass x <= 0).

PHASEKV_NAMESPACE_BEGIN
namespace cpu {
namespace detail {
namespace PHASEKV_TGT_NS {

/// Vector operations of architecture `Arch` in this pass (specialized below for the tags the
/// pass compiles).
template <class Arch>
struct Vec;

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

// ---------------------------------------------------------------------------------------------
// arch::Scalar (every pass: the kernels use it for single values)
// ---------------------------------------------------------------------------------------------

/// Scalar "vector" of one float; works on every target.
template <>
struct Vec<arch::Scalar> {
  using V = float;             ///< One lane.
  static constexpr int W = 1;  ///< Lanes.
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
  /// a / b.
  static PHASEKV_FORCEINLINE V div(V a, V b) { return a / b; }
  /// max(a, b).
  static PHASEKV_FORCEINLINE V max(V a, V b) { return a > b ? a : b; }
  /// a * b + c (fused when the target has it).
  static PHASEKV_FORCEINLINE V fma(V a, V b, V c) { return std::fma(a, b, c); }
  /// Round to nearest integer, ties to even (as float).
  static PHASEKV_FORCEINLINE V round(V a) { return std::nearbyint(a); }
  /// 2^n for integer-valued n in [-126, 127] (bit moves only; other n give an unspecified
  /// value, never undefined behaviour).
  static PHASEKV_FORCEINLINE V pow2i(V n) {
    const std::uint32_t t = fp_bits(n + 12582912.0f);  // 1.5 * 2^23 + n: n in the low bits
    return fp_from_bits((t - 0x4B400000u + 127u) << 23);
  }
  /// Sum of lanes.
  static PHASEKV_FORCEINLINE float hsum(V a) { return a; }
  /// Max of lanes.
  static PHASEKV_FORCEINLINE float hmax(V a) { return a; }
  /// Vector registers of the target that the kernels size their tiles for.
  static constexpr int regs = 16;
  /// True when load2 of element type T returns even/odd elements (never, here).
  template <class T>
  static constexpr bool interleaves() {
    return false;
  }
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

#if PHASEKV_TGT_AVX2
// ---------------------------------------------------------------------------------------------
// arch::Avx2: eight f32 lanes in a ymm register (AVX2 + FMA + F16C)
// ---------------------------------------------------------------------------------------------

/// Eight f32 lanes in a ymm register.
template <>
struct Vec<arch::Avx2> {
  using V = __m256;            ///< Eight lanes.
  static constexpr int W = 8;  ///< Lanes.
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
  static constexpr bool interleaves() {
    return std::is_same<T, bf16_t>::value;
  }
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
  /// Stores even elements `e` and odd elements `o` interleaved as 16 floats in order
  /// (`y[2i] = e[i]`, `y[2i + 1] = o[i]`): the inverse of load2 of a bf16 row.
  static PHASEKV_FORCEINLINE void store_interleaved2(float* y, V e, V o) {
    const V lo = _mm256_unpacklo_ps(e, o);  // e0 o0 e1 o1 | e4 o4 e5 o5
    const V hi = _mm256_unpackhi_ps(e, o);  // e2 o2 e3 o3 | e6 o6 e7 o7
    store(y, _mm256_permute2f128_ps(lo, hi, 0x20));
    store(y + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
  }
  /// Inverse of deinterleave2, in place on 16 floats.
  static PHASEKV_FORCEINLINE void interleave2(float* y) {
    store_interleaved2(y, load(y), load(y + 8));
  }
  /// Transpose-add of 8 vectors: lane i of the result is the sum of the lanes of `a[i]`.
  static PHASEKV_FORCEINLINE V hsumw(const V* a) { return hsum8(a); }
  /// Stores 8 floats (unaligned).
  static PHASEKV_FORCEINLINE void store(float* p, V x) { _mm256_storeu_ps(p, x); }
  /// a + b.
  static PHASEKV_FORCEINLINE V add(V a, V b) { return _mm256_add_ps(a, b); }
  /// a * b.
  static PHASEKV_FORCEINLINE V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  /// a / b.
  static PHASEKV_FORCEINLINE V div(V a, V b) { return _mm256_div_ps(a, b); }
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
  /// exp(x) with relative error below 2e-7; exactly 0 for x < -87 and for -inf; NaN for NaN
  /// (as the scalar path); e^88 for x > 88 (the kernels pass x = logit - running max <= 0).
  static PHASEKV_FORCEINLINE V exp(V x) {
    const V lo = _mm256_set1_ps(-87.0f);
    const V keep = _mm256_cmp_ps(x, lo, _CMP_NLT_UQ);  // x >= -87 or NaN
    // max/min return their second operand when one is NaN: a NaN x stays NaN
    const V xc = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(lo, x));
    return _mm256_and_ps(keep, exp_poly<Vec>(xc));
  }
};
#endif  // PHASEKV_TGT_AVX2

#if PHASEKV_TGT_AVX512
// ---------------------------------------------------------------------------------------------
// arch::Avx512 (and arch::Avx512Bf16 in the BF16 pass): sixteen f32 lanes in a zmm register
// ---------------------------------------------------------------------------------------------

/// Sixteen f32 lanes in a zmm register.
template <>
struct Vec<arch::Avx512> {
  using V = __m512;             ///< Sixteen lanes.
  static constexpr int W = 16;  ///< Lanes.
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
  static constexpr bool interleaves() {
    return std::is_same<T, bf16_t>::value;
  }
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
  /// Stores even elements `e` and odd elements `o` interleaved as 32 floats in order
  /// (`y[2i] = e[i]`, `y[2i + 1] = o[i]`): the inverse of load2 of a bf16 row.
  static PHASEKV_FORCEINLINE void store_interleaved2(float* y, V e, V o) {
    const __m512i il = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i ih =
        _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    store(y, _mm512_permutex2var_ps(e, il, o));
    store(y + 16, _mm512_permutex2var_ps(e, ih, o));
  }
  /// Inverse of deinterleave2, in place on 32 floats.
  static PHASEKV_FORCEINLINE void interleave2(float* y) {
    store_interleaved2(y, load(y), load(y + 16));
  }
  /// Transpose-add of 16 vectors: lane i of the result is the sum of the lanes of `a[i]`
  /// (45 shuffles and adds instead of 16 separate reductions).
  static PHASEKV_FORCEINLINE V hsumw(const V* a) {
    V t[8];  // lanes 0, 2 of each 128-bit block hold a[2j], lanes 1, 3 hold a[2j + 1]
    PHASEKV_UNROLL
    for (int j = 0; j < 8; ++j)
      t[j] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * j], a[2 * j + 1]),
                           _mm512_unpackhi_ps(a[2 * j], a[2 * j + 1]));
    V u[4];  // block b of u[j]: partial sums of a[4j .. 4j + 3] over block b
    PHASEKV_UNROLL
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
  /// a / b.
  static PHASEKV_FORCEINLINE V div(V a, V b) { return _mm512_div_ps(a, b); }
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
  /// exp(x) with relative error below 2e-7; exactly 0 for x < -87 and for -inf; NaN for NaN
  /// (as the scalar path); e^88 for x > 88 (the kernels pass x = logit - running max <= 0).
  static PHASEKV_FORCEINLINE V exp(V x) {
    const V lo = _mm512_set1_ps(-87.0f);
    const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ);  // x >= -87 or NaN
    // max/min return their second operand when one is NaN: a NaN x stays NaN
    const V xc = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(lo, x));
    return _mm512_maskz_mov_ps(keep, exp_poly<Vec>(xc));
  }

#if PHASEKV_TGT_AVX512BF16
  /// True: `dot_bf16` is available.
  static constexpr bool has_bf16_dot = true;
  /// Splits 32 floats `q` into bf16 high and low parts (q ~ hi + lo to about 16 mantissa bits),
  /// stored as 32 bf16 each in `hi` and `lo`.
  static PHASEKV_FORCEINLINE void split_bf16(const float* q, bf16_t* hi, bf16_t* lo) {
    const V a = _mm512_loadu_ps(q);
    const V b = _mm512_loadu_ps(q + 16);
    const __m512bh h = _mm512_cvtne2ps_pbh(b, a);
    const __m512i hb = (__m512i)h;
    const V ha = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hb)), 16));
    const V hbv = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(hb, 1)), 16));
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

#if PHASEKV_TGT_AVX512BF16
/// The Avx512 operations (the tag only changes which decode path is used for bf16 keys).
template <>
struct Vec<arch::Avx512Bf16> : Vec<arch::Avx512> {};
#endif
#endif  // PHASEKV_TGT_AVX512

#if PHASEKV_TGT_NEON
// ---------------------------------------------------------------------------------------------
// arch::Neon: four f32 lanes in a q register (AArch64)
// ---------------------------------------------------------------------------------------------

/// Four f32 lanes in a q register.
template <>
struct Vec<arch::Neon> {
  using V = float32x4_t;       ///< Four lanes.
  static constexpr int W = 4;  ///< Lanes.
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
  /// a / b.
  static PHASEKV_FORCEINLINE V div(V a, V b) { return vdivq_f32(a, b); }
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
  static constexpr bool interleaves() {
    return false;
  }
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
  /// exp(x) with relative error below 2e-7; exactly 0 for x < -87 and for -inf; NaN for NaN
  /// (as the scalar path); e^88 for x > 88 (the kernels pass x = logit - running max <= 0).
  static PHASEKV_FORCEINLINE V exp(V x) {
    const V lo = vdupq_n_f32(-87.0f);
    const uint32x4_t keep = vmvnq_u32(vcltq_f32(x, lo));  // x >= -87 or NaN (FMAX/FMIN
                                                          // propagate a NaN x)
    const V xc = vminq_f32(vmaxq_f32(x, lo), vdupq_n_f32(88.0f));
    return vreinterpretq_f32_u32(vandq_u32(keep, vreinterpretq_u32_f32(exp_poly<Vec>(xc))));
  }
};
#endif  // PHASEKV_TGT_NEON

}  // namespace PHASEKV_TGT_NS
}  // namespace detail
}  // namespace cpu
PHASEKV_NAMESPACE_END
