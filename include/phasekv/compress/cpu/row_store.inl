// phasekv: entry row stores (bit for bit from_float, bf16 rounding) and row prefetches of the
// compression row kernels, one target pass (see compress/cpu/rows_pass.inl). No include guard,
// no includes.

PHASEKV_NAMESPACE_BEGIN
namespace detail {
namespace PHASEKV_TGT_NS {
namespace rows {

// ---------------------------------------------------------------------------------------------
// bf16 rounding of float registers: float_to_bf16 lane by lane, bit for bit.
// ---------------------------------------------------------------------------------------------
#if PHASEKV_DETAIL_ROWS_SIMD >= 512
// float_to_bf16 of 16 floats, one result per 32-bit lane:
// (x + 0x7fff + ((x >> 16) & 1)) >> 16, or (x >> 16) | 0x40 for NaN.
PHASEKV_FORCEINLINE __m512i bf16_round16(__m512 v) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1),
                quiet = _mm512_set1_epi32(0x40);
  const __m512i x = _mm512_castps_si512(v);
  const __m512i hi = _mm512_srli_epi32(x, 16);
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, bias), _mm512_and_si512(hi, one)), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, abs_mask), inf);
  return _mm512_mask_or_epi32(rounded, nan, hi, quiet);
}
PHASEKV_FORCEINLINE __m512i bf16_round16(const float* src) {
  return bf16_round16(_mm512_loadu_ps(src));
}

#if PHASEKV_DETAIL_ROWS_BF16CVT
// Whether no lane of `a` or `b` is subnormal (VFPCLASSPS category 0x20), i.e. whether
// VCVTNE2PS2BF16 of them gives float_to_bf16's bits: it rounds like float_to_bf16 (to nearest
// even on the bits, infinities kept, a NaN truncated with bit 6 set) except that it flushes
// subnormal inputs to a signed zero, so groups that hold one take bf16_round16 instead.
PHASEKV_FORCEINLINE bool cvtne_exact(__m512 a, __m512 b) {
  return (_mm512_fpclass_ps_mask(a, 0x20) | _mm512_fpclass_ps_mask(b, 0x20)) == 0;
}
#endif

// float_to_bf16 of 32 floats in order, lo = [0, 16), hi = [16, 32), as one 512-bit row.
PHASEKV_FORCEINLINE __m512i bf16_round32(__m512 lo, __m512 hi) {
#if PHASEKV_DETAIL_ROWS_BF16CVT
  if (cvtne_exact(lo, hi)) return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
#endif
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(bf16_round16(lo))),
                            _mm512_cvtepi32_epi16(bf16_round16(hi)), 1);
}

// float_to_bf16 of a 32-channel group held as its even channels `e` and odd channels `o`
// (lane i: channels 2i and 2i + 1, as Lanes16::load2 gives a bf16 row), as one 512-bit row in
// channel order.
PHASEKV_FORCEINLINE __m512i bf16_round_pairs(__m512 e, __m512 o) {
#if PHASEKV_DETAIL_ROWS_BF16CVT
  if (cvtne_exact(e, o)) {
    // e0 .. e15 o0 .. o15, then word 2i <- e_i, word 2i + 1 <- o_i
    const __m512i packed = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(o, e));
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(idx, packed);
  }
#endif
  // every lane of bf16_round16 is <= 0xffff
  return _mm512_or_si512(bf16_round16(e), _mm512_slli_epi32(bf16_round16(o), 16));
}

// Stores a rounded 32-channel bf16 row, with a non-temporal store when `stream`.
PHASEKV_FORCEINLINE void store_bf16_row32(bf16_t* dst, __m512i row, bool stream) {
  if (stream)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst), row);
  else
    _mm512_storeu_si512(dst, row);
}
#endif

// ---------------------------------------------------------------------------------------------
// Entry store: dst[c] = from_float<T>(src[c]), bit for bit.
// ---------------------------------------------------------------------------------------------
inline void store_row(float* dst, const float* src, std::int64_t n) {
  for (std::int64_t c = 0; c < n; ++c) dst[c] = src[c];
}

inline void store_row(f16_t* dst, const float* src, std::int64_t n) {
  for (std::int64_t c = 0; c < n; ++c) dst[c] = float_to_f16(src[c]);
}

inline void store_row(bf16_t* dst, const float* src, std::int64_t n) {
  std::int64_t c = 0;
#if PHASEKV_DETAIL_ROWS_SIMD >= 512
  for (; c + 32 <= n; c += 32)
    _mm512_storeu_si512(dst + c,
                        bf16_round32(_mm512_loadu_ps(src + c), _mm512_loadu_ps(src + c + 16)));
  for (; c + 16 <= n; c += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + c),
                        _mm512_cvtepi32_epi16(bf16_round16(src + c)));
#elif PHASEKV_DETAIL_ROWS_SIMD >= 256
  {
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1),
                  quiet = _mm256_set1_epi32(0x40);
    for (; c + 8 <= n; c += 8) {
      const __m256i x = _mm256_castps_si256(_mm256_loadu_ps(src + c));
      const __m256i hi = _mm256_srli_epi32(x, 16);
      const __m256i rounded = _mm256_srli_epi32(
          _mm256_add_epi32(_mm256_add_epi32(x, bias), _mm256_and_si256(hi, one)), 16);
      // abs(x) > 0x7f800000 as signed compare is fine: both sides are non-negative int32
      const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
      const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, quiet), nan);
      // every lane is <= 0xffff, so the unsigned saturating pack is exact
      const __m128i packed =
          _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + c), packed);
    }
  }
#elif PHASEKV_DETAIL_ROWS_NEON
  {
    const uint32x4_t abs_mask = vdupq_n_u32(0x7fffffffu), inf = vdupq_n_u32(0x7f800000u);
    const uint32x4_t bias = vdupq_n_u32(0x7fffu), one = vdupq_n_u32(1u), quiet = vdupq_n_u32(0x40u);
    for (; c + 4 <= n; c += 4) {
      const uint32x4_t x = vreinterpretq_u32_f32(vld1q_f32(src + c));
      const uint32x4_t hi = vshrq_n_u32(x, 16);
      const uint32x4_t rounded = vshrq_n_u32(vaddq_u32(vaddq_u32(x, bias), vandq_u32(hi, one)), 16);
      const uint32x4_t nan = vcgtq_u32(vandq_u32(x, abs_mask), inf);
      const uint32x4_t r = vbslq_u32(nan, vorrq_u32(hi, quiet), rounded);
      vst1_u16(reinterpret_cast<std::uint16_t*>(dst + c), vmovn_u32(r));  // lanes <= 0xffff
    }
  }
#endif
  for (std::int64_t i = 0, left = n - c; i < left; ++i) dst[c + i] = float_to_bf16(src[c + i]);
}

// ---------------------------------------------------------------------------------------------
// Streaming entry store: the same bits as store_row, written by non-temporal stores where the
// pass has AVX-512 (plain stores elsewhere). `dst` must start on a 64-byte line
// (compress_entries streams only such rows: rows with partial lines streamed at half the
// speed of plain stores). store_fence() after the last one.
// ---------------------------------------------------------------------------------------------
/// Whether store_row_stream streams in this pass (else it is store_row).
constexpr bool streaming_stores() { return PHASEKV_DETAIL_ROWS_SIMD >= 512; }

template <class T>
inline void store_row_stream(T* dst, const float* src, std::int64_t n) {
  store_row(dst, src, n);
}

#if PHASEKV_DETAIL_ROWS_SIMD >= 512
template <>
inline void store_row_stream<float>(float* dst, const float* src, std::int64_t n) {
  std::int64_t c = 0;
  for (; c + 16 <= n; c += 16) _mm512_stream_ps(dst + c, _mm512_loadu_ps(src + c));
  store_row(dst + c, src + c, n - c);
}

template <>
inline void store_row_stream<bf16_t>(bf16_t* dst, const float* src, std::int64_t n) {
  std::int64_t c = 0;
  for (; c + 32 <= n; c += 32)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + c),
                        bf16_round32(_mm512_loadu_ps(src + c), _mm512_loadu_ps(src + c + 16)));
  store_row(dst + c, src + c, n - c);
}
#endif

/// Orders the non-temporal stores of store_row_stream before later stores (x86 `sfence`).
inline void store_fence() {
#if PHASEKV_DETAIL_ROWS_SIMD >= 512
  _mm_sfence();
#endif
}

#if PHASEKV_DETAIL_ROWS_SIMD >= 512
// Prefetches into L2 the rows (`bytes` each) of block `b` (tokens b s .. b s + s - 1) of a run
// at `x`, those below `limit` tokens (none when limit is 0: the caller asked for no
// prefetching): the run kernels call it for the block a few blocks past the one they start.
PHASEKV_FORCEINLINE void prefetch_block(const bf16_t* x, std::int64_t token_stride, std::int64_t s,
                                        std::int64_t b, std::int64_t limit, std::int64_t bytes) {
  for (std::int64_t t = b * s; t < b * s + s && t < limit; ++t)
    phasekv::detail::prefetch_l2(x + t * token_stride, bytes);
}
#endif

}  // namespace rows
}  // namespace PHASEKV_TGT_NS
}  // namespace detail
PHASEKV_NAMESPACE_END
