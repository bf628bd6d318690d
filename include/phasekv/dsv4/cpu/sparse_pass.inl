// phasekv: the DeepSeek-V4 sparse attention's block kernel of one target pass (see
// core/foreach_target.inc), included by dsv4/sparse_attention.hpp once per pass. No include
// guard, no includes. Explicit `Vec<Arch>` code (dispatch in sparse_attention.hpp): a block of
// up to kSparseBlock latent rows is converted to f32 once, then serves every head's logits
// (tiles of heads x rows, lanes over channels, one transpose-add per tile) and every head's
// output (tiles of heads x channel chunks held in registers over the block's rows).

PHASEKV_NAMESPACE_BEGIN
namespace cpu {
namespace detail {
namespace PHASEKV_TGT_NS {

/// Heads of a logit tile and of an output tile on `Arch` (a divisor of 4: the heads are
/// padded to a multiple of 4).
template <class Arch>
constexpr int sparse_tile_heads() {
  return Vec<Arch>::W > 1 && Vec<Arch>::regs >= 32 ? 4 : 2;
}
/// Rows of a logit tile on `Arch` (heads x rows accumulators, a multiple of W).
template <class Arch>
constexpr int sparse_tile_rows() {
  return Vec<Arch>::W == 1 ? 2 : 4;
}
/// Channel chunks (of W) of an output tile on `Arch`.
constexpr int kSparseOutChunks = 4;

/// a * b + c: fused on the vector paths; a multiply and an add on the scalar one (std::fma is
/// a library call on the x86 CPUs without FMA that run it).
template <class Arch>
PHASEKV_FORCEINLINE typename Vec<Arch>::V sparse_madd(typename Vec<Arch>::V a,
                                                      typename Vec<Arch>::V b,
                                                      typename Vec<Arch>::V c) {
  if constexpr (Vec<Arch>::W == 1)
    return a * b + c;
  else
    return Vec<Arch>::fma(a, b, c);
}

#if PHASEKV_TGT_AVX512 || PHASEKV_TGT_AVX2
/// FP8 E4M3 codes to f32 bits, W lanes of 32-bit codes `v` (exact, as fp8_e4m3_to_float):
/// normals by moving the exponent and mantissa into place and rebiasing, subnormals (exponent
/// 0) as m * 2^-9, the NaN codes as the quiet NaN, then the sign.
#if PHASEKV_TGT_AVX512
PHASEKV_FORCEINLINE __m512 fp8_e4m3_lanes(const std::uint8_t* p) {
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i mag = _mm512_and_si512(v, _mm512_set1_epi32(0x7f));
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0x80)), 24);
  const __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32(120 << 23));
  const __m512i sub =
      _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtepi32_ps(mag), _mm512_set1_ps(0.001953125f)));
  __m512i r =
      _mm512_mask_blend_epi32(_mm512_cmplt_epi32_mask(mag, _mm512_set1_epi32(8)), normal, sub);
  r = _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7f)), r,
                              _mm512_set1_epi32(0x7fc00000));
  return _mm512_castsi512_ps(_mm512_or_si512(r, sign));
}
#else
PHASEKV_FORCEINLINE __m256 fp8_e4m3_lanes(const std::uint8_t* p) {
  const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i mag = _mm256_and_si256(v, _mm256_set1_epi32(0x7f));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x80)), 24);
  const __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23));
  const __m256i sub =
      _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(mag), _mm256_set1_ps(0.001953125f)));
  __m256i r = _mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag));
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc00000),
                         _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7f)));
  return _mm256_castsi256_ps(_mm256_or_si256(r, sign));
}
#endif
#endif

/// `y[0, dp)` = row `x[0, d)` in f32, zero padded (d <= dp).
template <class Arch, class T>
PHASEKV_FORCEINLINE void sparse_convert(const T* x, float* y, std::int64_t d, std::int64_t dp,
                                        const float* fp8_table) {
  using O = Vec<Arch>;
  constexpr int W = O::W;
  std::int64_t c = 0;
  if constexpr (std::is_same<T, float>::value || std::is_same<T, bf16_t>::value ||
                std::is_same<T, f16_t>::value) {
    (void)fp8_table;
    for (; c + W <= d; c += W) O::store(y + c, O::load(x + c));
    for (; c < d; ++c) y[c] = phasekv::to_float(x[c]);
  } else {  // FP8 E4M3: bit moves on the x86 vector paths, else one table load per element
#if PHASEKV_TGT_AVX512 || PHASEKV_TGT_AVX2
    if constexpr (W == (PHASEKV_TGT_AVX512 ? 16 : 8)) {  // this pass's own vectors
      static_assert(sizeof(T) == 1, "FP8 codes are bytes");
      for (; c + W <= d; c += W)
        O::store(y + c, fp8_e4m3_lanes(reinterpret_cast<const std::uint8_t*>(x + c)));
    }
#endif
    for (; c < d; ++c) y[c] = fp8_table[x[c].bits];
  }
  for (; c < dp; ++c) y[c] = 0.0f;
}

/// `y[0, dp)` = the row of a quantized cache format T (dsv4/cache_format.hpp) in f32, zero
/// padded: each tile's FP8 codes (bit moves on the x86 vector paths, else the table) times the
/// tile's power-of-two scale (exact), then the RoPE channels from bf16.
template <class Arch, class T>
PHASEKV_FORCEINLINE void sparse_convert(dsv4::QuantRow<const std::uint8_t> x, float* y,
                                        std::int64_t d, std::int64_t dp, const float* fp8_table) {
  using F = dsv4::CacheFormat<T>;
  using O = Vec<Arch>;
  constexpr int W = O::W;
  (void)d;
  for (int t = 0; t < F::tiles; ++t) {
    const float s = F::scale(x.scales, t);
    const std::uint8_t* c = x.data + t * F::tile;
    float* yt = y + t * F::tile;
    std::int64_t i = 0;
#if PHASEKV_TGT_AVX512 || PHASEKV_TGT_AVX2
    if constexpr (W == (PHASEKV_TGT_AVX512 ? 16 : 8)) {
      const typename O::V sv = O::set1(s);
      for (; i + W <= F::tile; i += W) O::store(yt + i, O::mul(fp8_e4m3_lanes(c + i), sv));
    }
#endif
    for (; i < F::tile; ++i) yt[i] = fp8_table[c[i]] * s;
  }
  const std::uint8_t* rope = x.data + F::rope_offset;
  std::int64_t i = 0;
  if constexpr (W > 1)  // the vector loads of bf16 read bytes (no aliasing question)
    for (; i + W <= F::dim - F::nope; i += W)
      O::store(y + F::nope + i, O::load(reinterpret_cast<const bf16_t*>(rope) + i));
  for (; i < F::dim - F::nope; ++i) y[F::nope + i] = dsv4::detail::rope_channel(rope, i);
  for (std::int64_t c = F::dim; c < dp; ++c) y[c] = 0.0f;
}

/// Output tile: heads [h0, h0 + OH) x channel chunks [c0, c0 + OC * W) of `a.acc` plus
/// the block's `n` rows weighted by `a.logit` (the weights, in place), in row order.
template <class Arch, int OH, int OC>
PHASEKV_FORCEINLINE void sparse_out_tile(dsv4::detail::SparseAcc& a, std::int64_t h0,
                                         std::int64_t c0, std::int64_t n) {
  using O = Vec<Arch>;
  using V = typename O::V;
  constexpr int W = O::W;
  constexpr std::int64_t LB = dsv4::detail::kSparseBlock;
  const std::int64_t dvp = a.dvp, dp = a.dp;
  V acc[OH * OC];
  PHASEKV_UNROLL
  for (int hh = 0; hh < OH; ++hh) {
    PHASEKV_UNROLL
    for (int cc = 0; cc < OC; ++cc)
      acc[hh * OC + cc] = O::load(a.acc + (h0 + hh) * dvp + c0 + cc * W);
  }
  const float* wgt = a.logit + h0 * LB;
  const float* x = a.rows + c0;
  for (std::int64_t r = 0; r < n; ++r, x += dp) {
    V xv[OC];
    PHASEKV_UNROLL
    for (int cc = 0; cc < OC; ++cc) {
      xv[cc] = O::load(x + cc * W);
      O::pin(xv[cc]);
    }
    PHASEKV_UNROLL
    for (int hh = 0; hh < OH; ++hh) {
      const V wv = O::set1(wgt[hh * LB + r]);
      PHASEKV_UNROLL
      for (int cc = 0; cc < OC; ++cc)
        acc[hh * OC + cc] = sparse_madd<Arch>(wv, xv[cc], acc[hh * OC + cc]);
    }
  }
  PHASEKV_UNROLL
  for (int hh = 0; hh < OH; ++hh) {
    PHASEKV_UNROLL
    for (int cc = 0; cc < OC; ++cc)
      O::store(a.acc + (h0 + hh) * dvp + c0 + cc * W, acc[hh * OC + cc]);
  }
}

/// Adds the `n` (1 to kSparseBlock) rows `rows[0, n)` (stored as T; their real values are
/// the rows times `row_scale`) to every head's online softmax in `a` (the padded query in
/// a.qp). Order of the arithmetic: each logit is W lane partial sums over the channels (lane l:
/// channels l mod W in order, fused multiply-adds on the vector paths) added by the hsumw
/// tree, times scale * row_scale; the block's weights are exp(logit - running max)
/// (Vec<Arch>::exp), their sum added to the denominator by W lanes and hsum; each output
/// channel adds the block's weighted rows in row order (fused on the vector paths) after the
/// running rescale.
template <class Arch, class T>
PHASEKV_NOINLINE void dsv4_sparse_block(Target, Arch, const T* /* the storage type */,
                                        const dsv4::SparseAttentionParams& p,
                                        dsv4::detail::SparseAcc& a,
                                        const dsv4::detail::row_t<T>* rows, std::int64_t n,
                                        float row_scale, const float* fp8_table) {
  using O = Vec<Arch>;
  using V = typename O::V;
  constexpr int W = O::W;
  constexpr int HB = sparse_tile_heads<Arch>();
  constexpr int KB = sparse_tile_rows<Arch>();
  constexpr int N = HB * KB;
  static_assert(N % W == 0, "a logit tile must fill whole vectors");
  constexpr std::int64_t LB = dsv4::detail::kSparseBlock;
  static_assert(LB % W == 0 && LB % KB == 0, "a block must hold whole vectors and tiles");
  const std::int64_t d = p.dim, dp = a.dp, dvp = a.dvp, hp = a.hp;
  for (std::int64_t r = 0; r < n; ++r)
    sparse_convert<Arch, T>(rows[r], a.rows + r * dp, d, dp, fp8_table);
  const std::int64_t nt = (n + KB - 1) / KB * KB;  // rows of whole tiles (the rest ignored)
  const V ls = O::set1(p.scale * row_scale);
  for (std::int64_t h0 = 0; h0 < hp; h0 += HB) {
    const float* qh = a.qp + h0 * dp;
    for (std::int64_t r0 = 0; r0 < nt; r0 += KB) {
      const float* x = a.rows + r0 * dp;
      V acc[N];
      PHASEKV_UNROLL
      for (int i = 0; i < N; ++i) acc[i] = O::zero();
      for (std::int64_t c = 0; c < dp; c += W) {
        V xv[KB];
        PHASEKV_UNROLL
        for (int k = 0; k < KB; ++k) {
          xv[k] = O::load(x + k * dp + c);
          O::pin(xv[k]);
        }
        PHASEKV_UNROLL
        for (int hh = 0; hh < HB; ++hh) {
          V qv = O::load(qh + hh * dp + c);
          O::pin(qv);
          PHASEKV_UNROLL
          for (int k = 0; k < KB; ++k)
            acc[hh * KB + k] = sparse_madd<Arch>(qv, xv[k], acc[hh * KB + k]);
        }
      }
      float s[N];
      PHASEKV_UNROLL
      for (int v = 0; v < N / W; ++v) O::store(s + v * W, O::mul(ls, O::hsumw(acc + v * W)));
      PHASEKV_UNROLL
      for (int hh = 0; hh < HB; ++hh) {
        PHASEKV_UNROLL
        for (int k = 0; k < KB; ++k) a.logit[(h0 + hh) * LB + r0 + k] = s[hh * KB + k];
      }
    }
  }
  const V vscale = O::set1(row_scale);
  for (std::int64_t h = 0; h < hp; ++h) {
    float* lg = a.logit + h * LB;
    for (std::int64_t r = n; r < LB; ++r) lg[r] = -HUGE_VALF;
    V mv = O::load(lg);
    PHASEKV_UNROLL
    for (int v = 1; v < LB / W; ++v) mv = O::max(mv, O::load(lg + v * W));
    const float bmax = O::hmax(mv);
    float& m = a.mx[static_cast<std::size_t>(h)];
    float& den = a.den[static_cast<std::size_t>(h)];
    if (bmax > m) {
      const float c = m == -HUGE_VALF ? 0.0f : std::exp(m - bmax);
      den *= c;
      const V cv = O::set1(c);
      float* o = a.acc + h * dvp;
      for (std::int64_t i = 0; i < dvp; i += W) O::store(o + i, O::mul(cv, O::load(o + i)));
      m = bmax;
    }
    const V nm = O::set1(-m);
    V sum = O::zero();
    PHASEKV_UNROLL
    for (int v = 0; v < LB / W; ++v) {
      const V e = O::exp(O::add(O::load(lg + v * W), nm));
      sum = O::add(sum, e);
      O::store(lg + v * W, O::mul(e, vscale));  // the value is the row times its scale
    }
    den += O::hsum(sum);
  }
  constexpr int OH = HB;
  constexpr int OC = kSparseOutChunks;
  const std::int64_t chunks = dvp / W;
  for (std::int64_t h0 = 0; h0 < hp; h0 += OH) {
    std::int64_t c = 0;
    for (; c + OC <= chunks; c += OC) sparse_out_tile<Arch, OH, OC>(a, h0, c * W, n);
    for (; c < chunks; ++c) sparse_out_tile<Arch, OH, 1>(a, h0, c * W, n);
  }
}

}  // namespace PHASEKV_TGT_NS
}  // namespace detail
}  // namespace cpu
PHASEKV_NAMESPACE_END
