// phasekv: the GatedPool row kernels (scalar gates, identity payload), one target pass (see
// compress/cpu/rows_pass.inl). No include guard, no includes.

PHASEKV_NAMESPACE_BEGIN
namespace detail {
namespace PHASEKV_TGT_NS {
namespace rows {

// ---------------------------------------------------------------------------------------------
// GatedPool, scalar gates, identity payload
// ---------------------------------------------------------------------------------------------
// Dot products of `count` (w row, x row) pairs at once, each exactly fp_dot's eight chains
// (lane l of the eight lanes of DotLanes, or of its 8 / lanes registers, takes k = l mod 8);
// the pairs are independent, so their fused multiply-add chains overlap in the pipeline.
template <int K, class T>
PHASEKV_FORCEINLINE void dots_k(const float* const* w, const T* const* x, std::int64_t n,
                                float* res) {
  using V = DotLanes;
  constexpr int R = static_cast<int>(8 / V::lanes);  // registers per pair
  typename V::reg acc[K][R];
  PHASEKV_UNROLL
  for (int q = 0; q < K; ++q) PHASEKV_UNROLL
  for (int r = 0; r < R; ++r) acc[q][r] = V::zero();
  std::int64_t k = 0;
  for (; k + 8 <= n; k += 8)  // chain l of pair q: a_l = fma(w[k + l], x[k + l], a_l)
    PHASEKV_UNROLL
  for (int q = 0; q < K; ++q) PHASEKV_UNROLL
  for (int r = 0; r < R; ++r)
    acc[q][r] =
        V::fma(V::load(w[q] + k + r * V::lanes), V::load(x[q] + k + r * V::lanes), acc[q][r]);
#if PHASEKV_DETAIL_ROWS_SIMD >= 256
  if constexpr (K == 8) {
    if (k == n) {  // no tail: fp_dot's final sum tree for all eight at once (the hadd tree's
                   // additions are a_{2i} + a_{2i+1}, the same operands as fp_dot's)
      V::store(res, V::hsum8(&acc[0][0]));
      return;
    }
  }
#endif
  float a[K][8];
  PHASEKV_UNROLL
  for (int q = 0; q < K; ++q) PHASEKV_UNROLL
  for (int r = 0; r < R; ++r) V::store(a[q] + r * V::lanes, acc[q][r]);
  PHASEKV_UNROLL
  for (int q = 0; q < K; ++q) {
    for (std::int64_t l = 0; k + l < n; ++l)
      a[q][l] = fp_fma(w[q][k + l], Lanes1::load(x[q] + k + l), a[q][l]);
    res[q] = fp_add(fp_add(fp_add(a[q][0], a[q][1]), fp_add(a[q][2], a[q][3])),
                    fp_add(fp_add(a[q][4], a[q][5]), fp_add(a[q][6], a[q][7])));
  }
}

/// `res[q] = fp_dot(w[q], x[q], n)` for q < count (rows of floats and of T).
template <class T>
inline void dots(const float* const* w, const T* const* x, std::int64_t count, std::int64_t n,
                 float* res) {
  std::int64_t q = 0;
  for (; q + 8 <= count; q += 8) dots_k<8>(w + q, x + q, n, res + q);
  for (; q + 4 <= count; q += 4) dots_k<4>(w + q, x + q, n, res + q);
  for (; q < count; ++q) dots_k<1>(w + q, x + q, n, res + q);
}

using phasekv::detail::rows_shared::GatedState;

/// Starts a window: the state of no offsets and `out[0, d)` = 0.
inline GatedState gated_begin(std::int64_t d, float* out) {
  for (std::int64_t c = 0; c < d; ++c) out[c] = 0.0f;
  return GatedState{-fp_from_bits(0x7f800000u), 0.0f};
}

// Channel pass over a chunk of offsets: op[k] 0 skips offset k, 1 rescales
// (acc = fma(acc, f, x)), 2 accumulates (acc = fma(f, x, acc)); the accumulator stays in a
// register over the chunk.
template <class T>
struct GatedChunkBody {
  const T* base;
  std::int64_t token_stride;
  std::int64_t count;
  const unsigned char* op;
  const float* f;
  float* out;
  template <class V>
  PHASEKV_FORCEINLINE std::int64_t run(std::int64_t c, std::int64_t d) const {
    for (; d - c >= V::lanes; c += V::lanes) {
      typename V::reg acc = V::load(out + c);
      const T* x = base + c;
      for (std::int64_t k = 0; k < count; ++k, x += token_stride) {
        if (op[k] == 1)
          acc = V::fma(acc, V::set1(f[k]), V::load(x));
        else if (op[k] == 2)
          acc = V::fma(V::set1(f[k]), V::load(x), acc);
      }
      V::store(out + c, acc);
    }
    return c;
  }
};

#if PHASEKV_DETAIL_ROWS_SIMD >= 512
// fp_exp on 16 lanes: the same operations lane by lane (floor is an exact rounding, the
// conversion of the integral k is exact), the special cases blended in in fp_exp's order.
PHASEKV_FORCEINLINE __m512 exp16(__m512 x) {
  namespace ec = exp_consts;
  const __m512 k =
      _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(ec::kLog2e), _mm512_set1_ps(0.5f)),
                           _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(k, _mm512_set1_ps(ec::kLn2Hi), x);
  r = _mm512_fmadd_ps(k, _mm512_set1_ps(ec::kLn2Lo), r);
  __m512 p = _mm512_set1_ps(ec::kC7);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ec::kC6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ec::kC5));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ec::kC4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ec::kC3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ec::kC2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ec::kC1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ec::kC0));
  const __m512i ki = _mm512_cvttps_epi32(k);  // garbage only in lanes blended away below
  const __m512i pb = _mm512_castps_si512(p);
  const __m512i e =
      _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(pb, 23), _mm512_set1_epi32(0xff)), ki);
  const __m512 inf = _mm512_castsi512_ps(_mm512_set1_epi32(0x7f800000));
  __m512 res = _mm512_castsi512_ps(_mm512_add_epi32(pb, _mm512_slli_epi32(ki, 23)));
  res = _mm512_mask_mov_ps(res, _mm512_cmpge_epi32_mask(e, _mm512_set1_epi32(255)), inf);
  res = _mm512_mask_mov_ps(res, _mm512_cmple_epi32_mask(e, _mm512_setzero_si512()),
                           _mm512_setzero_ps());
  res = _mm512_mask_mov_ps(res, _mm512_cmp_ps_mask(x, _mm512_set1_ps(ec::kUnderflow), _CMP_LT_OQ),
                           _mm512_setzero_ps());
  res = _mm512_mask_mov_ps(res, _mm512_cmp_ps_mask(x, _mm512_set1_ps(ec::kOverflow), _CMP_GT_OQ),
                           inf);
  return _mm512_mask_mov_ps(res, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

// The left-biased maximum (b replaces a only when b > a) of a and b lane by lane; it is
// associative on values without NaN (it picks the earliest of the largest), so prefix maxima
// can be taken as a scan.
PHASEKV_FORCEINLINE __m512 later_max(__m512 a, __m512 b) {
  return _mm512_mask_mov_ps(a, _mm512_cmp_ps_mask(b, a, _CMP_GT_OQ), b);
}

// Lane i of the result is lane i - K of x, lanes below K are `fill`.
template <int K>
PHASEKV_FORCEINLINE __m512 lanes_up(__m512 x, __m512 fill) {
  return _mm512_castsi512_ps(
      _mm512_alignr_epi32(_mm512_castps_si512(x), _mm512_castps_si512(fill), 16 - K));
}

// One offset of the online-softmax denominator, given its weight `f` (exp of the logit minus
// the running maximum, or of the old maximum minus the logit at a new maximum) and bit 0 of
// `on` / `newmax`: returns the channel pass's op (0 off, 1 new maximum, 2 otherwise) and
// updates `l` exactly as the scalar code does.
PHASEKV_FORCEINLINE unsigned char gated_step(float& l, float f, unsigned on, unsigned newmax) {
  if (!(on & 1u)) return 0;
  if (newmax & 1u) {
    l = fp_fma(l, f, 1.0f);
    return 1;
  }
  l = fp_add(l, f);
  return 2;
}

// lanes_up<K> inside each half of 8 lanes: lanes [0, K) and [8, 8 + K) are `fill`.
template <int K>
PHASEKV_FORCEINLINE __m512 lanes_up_halves(__m512 x, __m512 fill) {
  return _mm512_mask_mov_ps(lanes_up<K>(x, fill), static_cast<__mmask16>(((1u << K) - 1u) << 8),
                            fill);
}

// Lane k of the result is lane k - K of x, within the whole register or (Halves) within its
// half of 8 lanes; lanes shifted in are `fill`.
template <bool Halves, int K>
PHASEKV_FORCEINLINE __m512 lanes_up_in(__m512 x, __m512 fill) {
  if constexpr (Halves)
    return lanes_up_halves<K>(x, fill);
  else
    return lanes_up<K>(x, fill);
}

// The vector part of the scalar recurrence, shared by gated_weights16 (one window in 16
// lanes) and gated_weights_pair (Halves: two windows in 8 lanes each): `sv` holds the logits
// (-inf in lanes that are not `live`). The running maximum before each offset is a prefix
// scan of later_max over the logits that can become the maximum (NaN and -inf never do),
// started from `carry` (-inf for fresh windows); every exponential is exp16 of the same
// difference the scalar code takes, stored to `f` (16 floats). Returns the inclusive prefix
// maximum; `on` (offsets that take part; NaN does) and `newmax` (offsets that raise the
// maximum) come back as masks.
template <bool Halves>
PHASEKV_FORCEINLINE __m512 gated_scan(__m512 sv, __mmask16 live, __m512 carry, float* f,
                                      __mmask16& on, __mmask16& newmax) {
  const __m512 neg_inf = _mm512_set1_ps(-fp_from_bits(0x7f800000u));
  on = _mm512_cmp_ps_mask(sv, neg_inf, _CMP_NEQ_UQ) & live;
  const __mmask16 ordered = _mm512_cmp_ps_mask(sv, sv, _CMP_ORD_Q);
  __m512 pm = _mm512_mask_mov_ps(neg_inf, on & ordered, sv);  // inclusive prefix maximum
  pm = later_max(lanes_up_in<Halves, 1>(pm, neg_inf), pm);
  pm = later_max(lanes_up_in<Halves, 2>(pm, neg_inf), pm);
  pm = later_max(lanes_up_in<Halves, 4>(pm, neg_inf), pm);
  if constexpr (!Halves) pm = later_max(lanes_up<8>(pm, neg_inf), pm);
  // maximum before offset k: the carried maximum, then the offsets before k
  const __m512 before = later_max(carry, lanes_up_in<Halves, 1>(pm, neg_inf));
  newmax = _mm512_cmp_ps_mask(sv, before, _CMP_GT_OQ) & on;
  const __m512 arg = _mm512_mask_sub_ps(_mm512_sub_ps(sv, before), newmax, before, sv);
  // a full store (unlike a masked one) forwards to the scalar loads of f[k] that follow,
  // which saves a store-forwarding stall per call
  _mm512_storeu_ps(f, _mm512_maskz_mov_ps(on, exp16(arg)));
  return pm;
}

// The scalar recurrence of gated_chunk for 16 offsets (count <= 16) at once (gated_scan),
// only the denominator's chain sequential. `f` must have room for 16 floats whatever `count`
// is.
PHASEKV_FORCEINLINE void gated_weights16(GatedState& st, const float* s, std::int64_t count,
                                         unsigned char* op, float* f) {
  const __m512 neg_inf = _mm512_set1_ps(-fp_from_bits(0x7f800000u));
  const __mmask16 live = static_cast<__mmask16>((1u << count) - 1u);
  __mmask16 on, newmax;
  const __m512 pm = gated_scan<false>(_mm512_mask_loadu_ps(neg_inf, live, s), live,
                                      _mm512_set1_ps(st.m), f, on, newmax);
  float l = st.l;
  for (std::int64_t k = 0; k < count; ++k) op[k] = gated_step(l, f[k], on >> k, newmax >> k);
  st.l = l;
  const float last = _mm512_cvtss_f32(_mm512_permutexvar_ps(_mm512_set1_epi32(15), pm));
  if (last > st.m) st.m = last;
}

// Channel pass over a chunk of offsets for 128 channels with the accumulators in registers
// (one branch per offset instead of one per offset and 16 channels).
template <class T>
PHASEKV_FORCEINLINE void gated_block128(const T* base, std::int64_t token_stride,
                                        std::int64_t count, const unsigned char* op, const float* f,
                                        float* out) {
  __m512 acc[8];
  PHASEKV_UNROLL
  for (int q = 0; q < 8; ++q) acc[q] = _mm512_loadu_ps(out + 16 * q);
  const T* x = base;
  for (std::int64_t k = 0; k < count; ++k, x += token_stride) {
    const __m512 fk = _mm512_set1_ps(f[k]);
    if (op[k] == 1) {
      PHASEKV_UNROLL
      for (int q = 0; q < 8; ++q) acc[q] = _mm512_fmadd_ps(acc[q], fk, Lanes16::load(x + 16 * q));
    } else if (op[k] == 2) {
      PHASEKV_UNROLL
      for (int q = 0; q < 8; ++q) acc[q] = _mm512_fmadd_ps(fk, Lanes16::load(x + 16 * q), acc[q]);
    }
  }
  PHASEKV_UNROLL
  for (int q = 0; q < 8; ++q) _mm512_storeu_ps(out + 16 * q, acc[q]);
}
#endif

/// Feeds offsets with logits `s[0, count)` (token k at `base + k * token_stride`) to the
/// online softmax, exactly as GatedPool::compress does offset by offset: the scalar recurrence
/// first, then one pass over the channels. `count` <= kGatedChunk.
constexpr std::int64_t kGatedChunk = 32;
template <class T>
inline void gated_chunk(GatedState& st, const float* s, const T* base, std::int64_t token_stride,
                        std::int64_t count, std::int64_t d, float* out) {
  unsigned char op[kGatedChunk];
  float f[kGatedChunk];
#if PHASEKV_DETAIL_ROWS_SIMD >= 512
  for (std::int64_t k = 0; k < count; k += 16)
    gated_weights16(st, s + k, count - k < 16 ? count - k : 16, op + k, f + k);
  std::int64_t c = 0;
  for (; c + 128 <= d; c += 128) gated_block128(base + c, token_stride, count, op, f, out + c);
  for_channels(d - c, GatedChunkBody<T>{base + c, token_stride, count, op, f, out + c});
#else
  const float neg_inf = -fp_from_bits(0x7f800000u);
  float m = st.m, l = st.l;
  for (std::int64_t k = 0; k < count; ++k) {
    op[k] = 0;
    f[k] = 0.0f;
    if (s[k] == neg_inf) continue;
    if (s[k] > m) {  // new maximum: rescale by exp(m - s); this offset's weight is 1
      const float r = fp_exp(fp_sub(m, s[k]));
      l = fp_fma(l, r, 1.0f);
      op[k] = 1;
      f[k] = r;
      m = s[k];
    } else {
      const float p = fp_exp(fp_sub(s[k], m));
      l = fp_add(l, p);
      op[k] = 2;
      f[k] = p;
    }
  }
  st.m = m;
  st.l = l;
  for_channels(d, GatedChunkBody<T>{base, token_stride, count, op, f, out});
#endif
}

// out[c] = out[c] / l
struct DivideBody {
  float l;
  float* out;
  template <class V>
  PHASEKV_FORCEINLINE std::int64_t run(std::int64_t c, std::int64_t d) const {
    const typename V::reg lv = V::set1(l);
    for (; d - c >= V::lanes; c += V::lanes) V::store(out + c, V::div(V::load(out + c), lv));
    return c;
  }
};

/// Ends a window: `out[c] / l`, or 0 when every offset was off (l == 0).
inline void gated_end(const GatedState& st, std::int64_t d, float* out) {
  if (st.l > 0.0f || st.l != st.l)
    for_channels(d, DivideBody{st.l, out});
  else
    for (std::int64_t c = 0; c < d; ++c) out[c] = 0.0f;
}

// ---------------------------------------------------------------------------------------------
// GatedPool, two windows at once (scalar gates, identity payload, W <= 8)
// ---------------------------------------------------------------------------------------------
/// Whether gated_pair exists on this translation unit (AVX-512); GatedPool::compress_rows2
/// returns false elsewhere.
constexpr bool gated_pair_available() { return PHASEKV_DETAIL_ROWS_SIMD >= 512; }

/// Largest window gated_pair takes: the offsets of both windows share one 16-lane register.
constexpr std::int64_t kGatedPairMaxWindow = 8;

#if PHASEKV_DETAIL_ROWS_SIMD >= 512
// gated_weights16 for two windows that start fresh (running maximum -inf, denominator 0),
// window a in lanes [0, 8) and window b in lanes [8, 16): the prefix scans stay inside their
// half, so every lane sees exactly what the single-window recurrence gives it. `sa` and `sb`
// must have room for 8 floats (lanes from `count` on are ignored); `f` receives window a's
// weights in [0, 8) and b's in [8, 16); `la`, `lb` the denominators.
PHASEKV_FORCEINLINE void gated_weights_pair(const float* sa, const float* sb, std::int64_t count,
                                            unsigned char* opa, unsigned char* opb, float* f,
                                            float& la, float& lb) {
  const __m512 neg_inf = _mm512_set1_ps(-fp_from_bits(0x7f800000u));
  const __mmask16 half = static_cast<__mmask16>((1u << count) - 1u);
  const __mmask16 live = static_cast<__mmask16>(half | (half << 8));
  const __m512 both = _mm512_castpd_ps(
      _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(sa))),
                         _mm256_castps_pd(_mm256_loadu_ps(sb)), 1));
  __mmask16 on, newmax;
  gated_scan<true>(_mm512_mask_mov_ps(neg_inf, live, both), live, neg_inf, f, on, newmax);
  float l0 = 0.0f, l1 = 0.0f;  // the two denominator chains, interleaved
  for (std::int64_t k = 0; k < count; ++k) {
    opa[k] = gated_step(l0, f[k], on >> k, newmax >> k);
    opb[k] = gated_step(l1, f[k + 8], on >> (k + 8), newmax >> (k + 8));
  }
  la = l0;
  lb = l1;
}

// The channel pass of a whole window (accumulators start at 0) over 128 bf16 channels:
// Lanes16::load2 widens 32 channels into their even and odd halves (as in mean_bf16_pairs),
// which are interleaved again on the way out. Per channel the same operations as
// gated_block128.
PHASEKV_FORCEINLINE void gated_window128_bf16(const bf16_t* base, std::int64_t token_stride,
                                              std::int64_t count, const unsigned char* op,
                                              const float* f, float* out) {
  __m512 ev[4], od[4];
  PHASEKV_UNROLL
  for (int g = 0; g < 4; ++g) ev[g] = od[g] = _mm512_setzero_ps();
  const bf16_t* x = base;
  for (std::int64_t k = 0; k < count; ++k, x += token_stride) {
    const __m512 fk = _mm512_set1_ps(f[k]);
    if (op[k] == 1) {
      PHASEKV_UNROLL
      for (int g = 0; g < 4; ++g) {
        __m512 xe, xo;
        Lanes16::load2(x + 32 * g, xe, xo);
        ev[g] = _mm512_fmadd_ps(ev[g], fk, xe);
        od[g] = _mm512_fmadd_ps(od[g], fk, xo);
      }
    } else if (op[k] == 2) {
      PHASEKV_UNROLL
      for (int g = 0; g < 4; ++g) {
        __m512 xe, xo;
        Lanes16::load2(x + 32 * g, xe, xo);
        ev[g] = _mm512_fmadd_ps(fk, xe, ev[g]);
        od[g] = _mm512_fmadd_ps(fk, xo, od[g]);
      }
    }
  }
  PHASEKV_UNROLL
  for (int g = 0; g < 4; ++g) Lanes16::store_interleaved2(out + 32 * g, ev[g], od[g]);
}

// The channel pass of a whole window (`out` zeroed by gated_begin).
template <class T>
PHASEKV_FORCEINLINE void gated_window(const T* base, std::int64_t token_stride, std::int64_t count,
                                      const unsigned char* op, const float* f, std::int64_t d,
                                      float* out) {
  std::int64_t c = 0;
  for (; c + 128 <= d; c += 128) {
    if constexpr (std::is_same<T, bf16_t>::value)
      gated_window128_bf16(base + c, token_stride, count, op, f, out + c);
    else
      gated_block128(base + c, token_stride, count, op, f, out + c);
  }
  for_channels(d - c, GatedChunkBody<T>{base + c, token_stride, count, op, f, out + c});
}

/// Two whole windows a and b of `count` <= kGatedPairMaxWindow offsets with gate logits
/// `sa`, `sb` (arrays of kGatedPairMaxWindow floats; token k of window a at
/// `xa + k * token_stride`), exactly as gated_begin,
/// gated_chunk and gated_end give each of them alone. The two windows' dependency chains
/// (weights, denominators, channel passes) interleave, which a single window leaves idle.
template <class T>
inline void gated_pair(const float* sa, const T* xa, float* outa, const float* sb, const T* xb,
                       float* outb, std::int64_t token_stride, std::int64_t count, std::int64_t d) {
  unsigned char opa[kGatedPairMaxWindow], opb[kGatedPairMaxWindow];
  alignas(64) float f[16];
  float la, lb;
  gated_weights_pair(sa, sb, count, opa, opb, f, la, lb);
  // zeroed whole although the bf16 128-channel passes do not read them: skipping that was
  // slower (the lines are then in L1 for the stores below)
  gated_begin(d, outa);
  gated_begin(d, outb);
  gated_window(xa, token_stride, count, opa, f, d, outa);
  gated_window(xb, token_stride, count, opb, f + 8, d, outb);
  gated_end(GatedState{0.0f, la}, d, outa);
  gated_end(GatedState{0.0f, lb}, d, outb);
}
#endif

// ---------------------------------------------------------------------------------------------
// GatedPool, a run of consecutive windows of one KV head (scalar gates, identity payload, bf16
// rows, W = 2S <= 8, d a multiple of 32): each token belongs to two windows (offset p of one,
// S + p of the one before), so its row is widened once for both gate dots and once for both
// channel passes, and the entries are divided, rounded and stored straight from registers.
// ---------------------------------------------------------------------------------------------

/// Whether gated_run_bf16 exists on this translation unit (AVX-512).
constexpr bool gated_run_available() { return PHASEKV_DETAIL_ROWS_SIMD >= 512; }

/// Most windows one gated_run_bf16 call takes (its logits, weights and denominators live on the
/// stack); longer runs are split.
constexpr std::int64_t kGatedRunMax = 16;

/// Blocks of S tokens ahead of its gate dots at which gated_run_bf16 prefetches when asked
/// (tuned for compress_batch from DRAM, see docs/kernels.md).
constexpr std::int64_t kGatedRunAhead = 4;

#if PHASEKV_DETAIL_ROWS_SIMD >= 512
// Gate dots of the NB * S tokens at `x + q * token_stride` (q < NB * S; blocks of S tokens):
// lo[q] = fp_dot(w[q mod S], token q), hi[q] = fp_dot(w[S + q mod S], token q), each exactly
// fp_dot's eight chains and final sum tree (d is a multiple of 8, so there is no tail). Both
// dots of a token use one widened copy of each 8-channel chunk. lo and hi have room for 8.
template <int S, int NB>
PHASEKV_FORCEINLINE void gated_run_dots(const float* const* w, const bf16_t* x,
                                        std::int64_t token_stride, std::int64_t d, float* lo,
                                        float* hi) {
  constexpr int Q = S * NB;
  static_assert(Q <= 8, "at most 8 tokens per call");
  __m256 a[8], b[8];
  PHASEKV_UNROLL
  for (int q = 0; q < 8; ++q) a[q] = b[q] = _mm256_setzero_ps();
  for (std::int64_t k = 0; k < d; k += 8) {
    __m256 wv[2 * S];
    PHASEKV_UNROLL
    for (int i = 0; i < 2 * S; ++i) {
      wv[i] = _mm256_loadu_ps(w[i] + k);
#if defined(__GNUC__)
      // kept in a register: GCC otherwise folds each weight load into both FMAs that use
      // it (24 loads per 16 FMAs, load-bound; 8 + 8 with the hint)
      __asm__("" : "+v"(wv[i]));
#endif
    }
    PHASEKV_UNROLL
    for (int q = 0; q < Q; ++q) {
      const __m256 xv = Lanes8::load(x + q * token_stride + k);
      a[q] = _mm256_fmadd_ps(wv[q % S], xv, a[q]);
      b[q] = _mm256_fmadd_ps(wv[S + q % S], xv, b[q]);
    }
  }
  Lanes8::store(lo, Lanes8::hsum8(a));  // fp_dot's final sum tree (see dots_k)
  Lanes8::store(hi, Lanes8::hsum8(b));
}

// One offset of a window's channel pass on 32-channel groups held as even/odd halves (see
// gated_window128_bf16): op 1 rescales, 2 accumulates, 0 skips.
template <int G>
PHASEKV_FORCEINLINE void gated_run_apply(unsigned char op, float f, __m512* ev, __m512* od,
                                         const __m512* xe, const __m512* xo) {
  const __m512 fk = _mm512_set1_ps(f);
  if (op == 1) {
    PHASEKV_UNROLL
    for (int g = 0; g < G; ++g) {
      ev[g] = _mm512_fmadd_ps(ev[g], fk, xe[g]);
      od[g] = _mm512_fmadd_ps(od[g], fk, xo[g]);
    }
  } else if (op == 2) {
    PHASEKV_UNROLL
    for (int g = 0; g < G; ++g) {
      ev[g] = _mm512_fmadd_ps(fk, xe[g], ev[g]);
      od[g] = _mm512_fmadd_ps(fk, xo[g], od[g]);
    }
  }
}

// gated_end and store_row of one window's G * 32 channels from registers: divided by its
// denominator `l` (or 0 when every offset was off), rounded to bf16, even and odd channels
// merged into one 32-channel row per group.
template <int G>
PHASEKV_FORCEINLINE void gated_run_store(float l, __m512* ev, __m512* od, bf16_t* dst,
                                         bool stream) {
  const bool divide = l > 0.0f || l != l;
  const __m512 lv = _mm512_set1_ps(l);
  PHASEKV_UNROLL
  for (int g = 0; g < G; ++g) {
    const __m512 e = divide ? _mm512_div_ps(ev[g], lv) : _mm512_setzero_ps();
    const __m512 o = divide ? _mm512_div_ps(od[g], lv) : _mm512_setzero_ps();
    store_bf16_row32(dst + 32 * g, bf16_round_pairs(e, o), stream);
  }
}

// The channel pass of `count` windows over channels [c0, c0 + 32 G): block b (tokens
// b S .. b S + S - 1) feeds window b at offsets 0 .. S - 1 and window b - 1 at offsets
// S .. 2S - 1, so each window sees its offsets in ascending order, as in gated_window.
template <int S, int G>
inline void gated_run_channels(const bf16_t* x, std::int64_t token_stride, std::int64_t count,
                               const unsigned char (*op)[8], const float (*f)[16], const float* l,
                               std::int64_t c0, bf16_t* entries, std::int64_t entry_stride,
                               bool stream) {
  __m512 pe[G], po[G], ce[G], co[G];
  PHASEKV_UNROLL
  for (int g = 0; g < G; ++g) pe[g] = po[g] = _mm512_setzero_ps();
  for (std::int64_t b = 0; b <= count; ++b) {
    PHASEKV_UNROLL
    for (int g = 0; g < G; ++g) ce[g] = co[g] = _mm512_setzero_ps();
    const bf16_t* xb = x + b * S * token_stride + c0;
    PHASEKV_UNROLL
    for (int p = 0; p < S; ++p) {
      __m512 xe[G], xo[G];
      PHASEKV_UNROLL
      for (int g = 0; g < G; ++g) Lanes16::load2(xb + p * token_stride + 32 * g, xe[g], xo[g]);
      // window r's weights are f[r / 2][8 (r % 2) + offset] (gated_weights_pair's layout)
      if (b < count) gated_run_apply<G>(op[b][p], f[b / 2][8 * (b % 2) + p], ce, co, xe, xo);
      if (b >= 1)
        gated_run_apply<G>(op[b - 1][S + p], f[(b - 1) / 2][8 * ((b - 1) % 2) + S + p], pe, po, xe,
                           xo);
    }
    if (b >= 1) gated_run_store<G>(l[b - 1], pe, po, entries + (b - 1) * entry_stride + c0, stream);
    PHASEKV_UNROLL
    for (int g = 0; g < G; ++g) {
      pe[g] = ce[g];
      po[g] = co[g];
    }
  }
}

/// GatedPool (scalar gates, identity payload) over `count` <= kGatedRunMax consecutive windows
/// of one KV head with W = 2 S: window r's token at offset i is at
/// `x + (r S + i) * token_stride` (bf16, `d` channels, d a multiple of 32), its entry goes to
/// `entries + r * entry_stride` (bf16), with exactly the bits of gated_begin, gated_chunk,
/// gated_end and store_row. `w[i]` is the gate weight row of offset i (all null when the
/// policy has none: the logits are then the biases alone), `bias[i]` its bias (0 when absent).
/// With `stream` the entries are written with non-temporal stores (64-byte aligned rows); with
/// `prefetch` > 0 the rows of tokens below it are prefetched kGatedRunAhead blocks ahead of
/// the gate dots.
template <int S>
inline void gated_run_bf16(const float* const* w, const float* bias, const bf16_t* x,
                           std::int64_t token_stride, std::int64_t count, std::int64_t d,
                           bf16_t* entries, std::int64_t entry_stride, bool stream,
                           std::int64_t prefetch = 0) {
  constexpr int W = 2 * S;
  static_assert(W <= 8, "both windows of a pair share one 16-lane register");
  float s[kGatedRunMax + 1][8] = {};  // logits; row `count` is the partner of an odd count
  unsigned char op[kGatedRunMax + 1][8];
  alignas(64) float f[(kGatedRunMax + 1) / 2][16];
  float l[kGatedRunMax + 1];
  // with `prefetch`, the rows (whole: d elements) of the block kGatedRunAhead blocks past
  // block b go out before b's gate dots
  const std::int64_t row_bytes = d * static_cast<std::int64_t>(sizeof(bf16_t));
  // logits exactly as GatedPool::rows_logits: fp_add(dot, bias), or the bias alone
  if (w[0] != nullptr) {
    float lo[8], hi[8];
    const auto take = [&](std::int64_t b0, int tokens) {
      for (int q = 0; q < tokens; ++q) {
        const std::int64_t blk = b0 + q / S;
        const int p = q % S;
        if (blk < count) s[blk][p] = fp_add(lo[q], bias[p]);
        if (blk >= 1) s[blk - 1][S + p] = fp_add(hi[q], bias[S + p]);
      }
    };
    std::int64_t b = 0;
    for (; b + 2 <= count + 1; b += 2) {
      prefetch_block(x, token_stride, S, b + kGatedRunAhead, prefetch, row_bytes);
      prefetch_block(x, token_stride, S, b + 1 + kGatedRunAhead, prefetch, row_bytes);
      gated_run_dots<S, 2>(w, x + b * S * token_stride, token_stride, d, lo, hi);
      take(b, 2 * S);
    }
    if (b <= count) {
      prefetch_block(x, token_stride, S, b + kGatedRunAhead, prefetch, row_bytes);
      gated_run_dots<S, 1>(w, x + b * S * token_stride, token_stride, d, lo, hi);
      take(b, S);
    }
  } else {
    for (std::int64_t r = 0; r < count; ++r)
      for (int i = 0; i < W; ++i) s[r][i] = bias[i];
    for (std::int64_t b = 0; b <= count; ++b)  // no dots to spread them over
      prefetch_block(x, token_stride, S, b + kGatedRunAhead, prefetch, row_bytes);
  }
  for (int i = 0; i < 8; ++i) s[count][i] = s[0][i];  // the odd count's partner (discarded)
  for (std::int64_t r = 0; r < count; r += 2)
    gated_weights_pair(s[r], s[r + 1], W, op[r], op[r + 1], f[r / 2], l[r], l[r + 1]);
  // (spelled out here and in mean_run_bf16: the same dispatch through a shared helper taking
  // a generic lambda was measurably slower with GCC 12)
  std::int64_t c = 0;
  for (; c + 128 <= d; c += 128)
    gated_run_channels<S, 4>(x, token_stride, count, op, f, l, c, entries, entry_stride, stream);
  switch ((d - c) / 32) {
    case 3:
      gated_run_channels<S, 3>(x, token_stride, count, op, f, l, c, entries, entry_stride, stream);
      break;
    case 2:
      gated_run_channels<S, 2>(x, token_stride, count, op, f, l, c, entries, entry_stride, stream);
      break;
    case 1:
      gated_run_channels<S, 1>(x, token_stride, count, op, f, l, c, entries, entry_stride, stream);
      break;
    default: break;
  }
}
#endif

}  // namespace rows
}  // namespace PHASEKV_TGT_NS
}  // namespace detail
PHASEKV_NAMESPACE_END
