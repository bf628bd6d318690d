// phasekv: the UniformMean row kernels, one target pass (see compress/cpu/rows_pass.inl).
// No include guard, no includes.
//
// out[c] = (((x_0[c] + x_1[c]) + ...) + x_{W-1}[c]) / W, UniformMean::compress's operations.

PHASEKV_NAMESPACE_BEGIN
namespace detail {
namespace PHASEKV_TGT_NS {
namespace rows {

// 1/w when w is a power of two (then x * (1/w) and x / w are the same real number, so the
// same correctly rounded float, NaN, infinities and subnormals included), else 0.
inline float exact_reciprocal(std::int64_t w) {
  if (w < 1 || w > (std::int64_t{1} << 24) || (w & (w - 1)) != 0) return 0.0f;
  return fp_div(1.0f, static_cast<float>(w));
}

// acc / w, as acc * rcp when rcp = exact_reciprocal(w) is not 0 (the same bits).
template <class V>
PHASEKV_FORCEINLINE typename V::reg mean_scale(typename V::reg acc, float rcp, std::int64_t w) {
  return rcp != 0.0f ? V::mul(acc, V::set1(rcp)) : V::div(acc, V::set1(static_cast<float>(w)));
}

template <class T>
struct MeanBody {
  const T* base;
  std::int64_t token_stride;
  std::int64_t w;
  float rcp;  // exact_reciprocal(w)
  float* out;
  template <class V>
  PHASEKV_FORCEINLINE std::int64_t run(std::int64_t c, std::int64_t d) const {
    for (; d - c >= V::lanes; c += V::lanes) {
      typename V::reg acc = V::load(base + c);
      const T* p = base + c;
      for (std::int64_t i = 1; i < w; ++i) {
        p += token_stride;
        acc = V::add(acc, V::load(p));
      }
      V::store(out + c, mean_scale<V>(acc, rcp, w));
    }
    return c;
  }
};

#if PHASEKV_DETAIL_ROWS_SIMD >= 512
// bf16 rows, 32 channels per step: Lanes16::load2 widens one 512-bit load into its even and
// odd channels, which accumulate in two registers and are interleaved again on the way out.
// Returns the first channel it did not process.
PHASEKV_FORCEINLINE std::int64_t mean_bf16_pairs(const bf16_t* base, std::int64_t token_stride,
                                                 std::int64_t w, float rcp, std::int64_t d,
                                                 float* out) {
  std::int64_t c = 0;
  for (; c + 32 <= d; c += 32) {
    const bf16_t* p = base + c;
    __m512 even, odd;
    Lanes16::load2(p, even, odd);
    for (std::int64_t i = 1; i < w; ++i) {
      p += token_stride;
      __m512 xe, xo;
      Lanes16::load2(p, xe, xo);
      even = Lanes16::add(even, xe);
      odd = Lanes16::add(odd, xo);
    }
    Lanes16::store_interleaved2(out + c, mean_scale<Lanes16>(even, rcp, w),
                                mean_scale<Lanes16>(odd, rcp, w));
  }
  return c;
}
#endif

/// UniformMean of one window: `w` rows of `d` channels at `base + i * token_stride`.
template <class T>
PHASEKV_NOINLINE inline void mean(const T* base, std::int64_t token_stride, std::int64_t w,
                                  std::int64_t d, float* out) {
  std::int64_t c = 0;
  const float rcp = exact_reciprocal(w);
#if PHASEKV_DETAIL_ROWS_SIMD >= 512
  if constexpr (std::is_same<T, bf16_t>::value)
    c = mean_bf16_pairs(base, token_stride, w, rcp, d, out);  // the 32-channel pair kernel
#endif
  for_channels(d - c, MeanBody<T>{base + c, token_stride, w, rcp, out + c});
}

// ---------------------------------------------------------------------------------------------
// A run of consecutive windows of one KV head (bf16 rows, W = 2S, d a multiple of 32): each
// token is in two windows, so its row is widened once for both sums, and the entries are
// scaled, rounded and stored from registers.
// ---------------------------------------------------------------------------------------------
/// Whether mean_run_bf16 exists in this pass (AVX-512).
constexpr bool mean_run_available() { return PHASEKV_DETAIL_ROWS_SIMD >= 512; }

/// Blocks of s tokens ahead of its sums at which mean_run_bf16 prefetches when asked
/// (tuned for compress_batch from DRAM, see docs/kernels.md).
constexpr std::int64_t kMeanRunAhead = 8;

#if PHASEKV_DETAIL_ROWS_SIMD >= 512
// Channels [c0, c0 + 32 G) of `count` windows of W = 2 s: block b (tokens b s .. b s + s - 1)
// starts the sums of window b and ends those of window b - 1, so each window adds its offsets
// in ascending order onto the row of offset 0, as mean() does (even/odd channel halves as in
// mean_bf16_pairs).
template <int G>
inline void mean_run_channels(const bf16_t* x, std::int64_t token_stride, std::int64_t s,
                              std::int64_t count, float rcp, std::int64_t c0, bf16_t* entries,
                              std::int64_t entry_stride, bool stream, std::int64_t prefetch,
                              std::int64_t row_bytes) {
  __m512 pe[G], po[G], ce[G], co[G];
  PHASEKV_UNROLL
  for (int g = 0; g < G; ++g) pe[g] = po[g] = ce[g] = co[g] = _mm512_setzero_ps();
  for (std::int64_t b = 0; b <= count; ++b) {
    prefetch_block(x, token_stride, s, b + kMeanRunAhead, prefetch, row_bytes);
    const bf16_t* row = x + b * s * token_stride + c0;
    PHASEKV_UNROLL
    for (int g = 0; g < G; ++g) {  // offset 0 of window b, offset s of window b - 1
      __m512 xe, xo;
      Lanes16::load2(row + 32 * g, xe, xo);
      ce[g] = xe;
      co[g] = xo;
      pe[g] = _mm512_add_ps(pe[g], xe);
      po[g] = _mm512_add_ps(po[g], xo);
    }
    for (std::int64_t p = 1; p < s; ++p) {  // offset p of window b, s + p of window b - 1
      row += token_stride;
      PHASEKV_UNROLL
      for (int g = 0; g < G; ++g) {
        __m512 xe, xo;
        Lanes16::load2(row + 32 * g, xe, xo);
        ce[g] = _mm512_add_ps(ce[g], xe);
        co[g] = _mm512_add_ps(co[g], xo);
        pe[g] = _mm512_add_ps(pe[g], xe);
        po[g] = _mm512_add_ps(po[g], xo);
      }
    }
    if (b >= 1) {
      bf16_t* dst = entries + (b - 1) * entry_stride + c0;
      PHASEKV_UNROLL
      for (int g = 0; g < G; ++g)
        store_bf16_row32(dst + 32 * g,
                         bf16_round_pairs(mean_scale<Lanes16>(pe[g], rcp, 2 * s),
                                          mean_scale<Lanes16>(po[g], rcp, 2 * s)),
                         stream);
    }
    PHASEKV_UNROLL
    for (int g = 0; g < G; ++g) {
      pe[g] = ce[g];
      po[g] = co[g];
    }
  }
}

/// UniformMean over `count` consecutive windows of one KV head with W = 2 s: window r's token
/// at offset i is at `x + (r s + i) * token_stride` (bf16, `d` channels, d a multiple of 32),
/// its entry goes to `entries + r * entry_stride` (bf16), with exactly the bits of mean() and
/// store_row. With `stream` the entries are written with non-temporal stores (64-byte aligned
/// rows); with `prefetch` > 0 the rows of tokens below it are prefetched kMeanRunAhead blocks
/// ahead.
inline void mean_run_bf16(const bf16_t* x, std::int64_t token_stride, std::int64_t s,
                          std::int64_t count, std::int64_t d, bf16_t* entries,
                          std::int64_t entry_stride, bool stream, std::int64_t prefetch = 0) {
  const float rcp = exact_reciprocal(2 * s);
  // rows of later tokens prefetched during the first channel pass (whole rows: d elements)
  const std::int64_t rb = d * static_cast<std::int64_t>(sizeof(bf16_t));
  std::int64_t c = 0, pf = prefetch;
  for (; c + 128 <= d; c += 128, pf = 0)
    mean_run_channels<4>(x, token_stride, s, count, rcp, c, entries, entry_stride, stream, pf, rb);
  switch ((d - c) / 32) {  // the 32-channel groups left, as in gated_run_bf16
    case 3:
      mean_run_channels<3>(x, token_stride, s, count, rcp, c, entries, entry_stride, stream, pf,
                           rb);
      break;
    case 2:
      mean_run_channels<2>(x, token_stride, s, count, rcp, c, entries, entry_stride, stream, pf,
                           rb);
      break;
    case 1:
      mean_run_channels<1>(x, token_stride, s, count, rcp, c, entries, entry_stride, stream, pf,
                           rb);
      break;
    default: break;
  }
}
#endif

}  // namespace rows
}  // namespace PHASEKV_TGT_NS
}  // namespace detail
PHASEKV_NAMESPACE_END
