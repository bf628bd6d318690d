// phasekv: the decode inner kernels of one target pass (see core/foreach_target.inc),
// included by attention/cpu/decode_block.hpp once per pass. No include guard, no includes.
//
// Every scalar a * b + c below is an explicit std::fma (fused, like the vector code): left to
// the compiler, its contraction depends on the inlining context, and the paged and contiguous
// decode paths (one kernel, two row sources) gave different bits for the same keys.

PHASEKV_NAMESPACE_BEGIN
namespace cpu {
namespace detail {
namespace PHASEKV_TGT_NS {

/// Whether the decode kernels read rows of T in even/odd pairs on `Arch` (see Vec::load2):
/// the query is then permuted to that order before the step, and the value accumulators are
/// kept in it until the partition finishes (permute_pairs / unpermute_pairs).
template <class Arch, class T>
constexpr bool pairs_interleaved() {
  return Vec<Arch>::template interleaves<T>();
}

/// Writes `x[0, d)` into `y` in the order load2 delivers interleaved rows: within each full
/// chunk of 2W elements, the even elements then the odd ones; the tail after the last full
/// chunk is copied in order.
/// Only called for architectures whose Vec interleaves some element type (they provide
/// deinterleave2 / interleave2).
template <class Arch>
inline void permute_pairs(const float* x, float* y, std::int64_t d) {
  constexpr int W = Vec<Arch>::W;
  std::int64_t c = 0;
  for (; c + 2 * W <= d; c += 2 * W) Vec<Arch>::deinterleave2(x + c, y + c);
  for (; c < d; ++c) y[c] = x[c];
}

/// Inverse of permute_pairs, in place.
template <class Arch>
inline void unpermute_pairs(float* y, std::int64_t d) {
  constexpr int W = Vec<Arch>::W;
  for (std::int64_t c = 0; c + 2 * W <= d; c += 2 * W) Vec<Arch>::interleave2(y + c);
}

/// Key rows per logit tile for NG heads: at most W accumulators (so that one transpose-add
/// reduces them all) and few enough registers for accumulators, a pair of vectors per key row,
/// and a pair of query vectors.
template <class Arch, int NG>
constexpr int qk_tile_rows() {
  constexpr int by_lanes = Arch::lanes / NG;
  constexpr int by_regs = (Vec<Arch>::regs - 4) / (2 + NG);
  constexpr int nt = by_lanes < by_regs ? by_lanes : by_regs;
  return nt < 1 ? 1 : nt;
}

/// Logits of NG query heads (rows of `q`, stride `qs`, permuted by permute_pairs when rows of
/// T are interleaved) against NT key rows `k`, written to `s[g * kDecodeBlock + t]`. D > 0
/// fixes the head dim at compile time (fast paths), D == 0 reads `d`.
template <class Arch, int NG, int NT, int D, class R>
PHASEKV_FORCEINLINE void qk_tile(const float* q, std::int64_t qs, R k, std::int64_t d, float* s) {
  using O = Vec<Arch>;
  using V = typename O::V;
  constexpr int W = O::W;
  constexpr int N = NT * NG;
  const std::int64_t dd = D > 0 ? D : d;
  V acc[N];
  PHASEKV_UNROLL
  for (int a = 0; a < N; ++a) acc[a] = O::zero();
  std::int64_t i = 0;
  for (; i + 2 * W <= dd; i += 2 * W) {
    V ka[NT], kb[NT];
    PHASEKV_UNROLL
    for (int t = 0; t < NT; ++t) O::load2(k[t] + i, ka[t], kb[t]);
    PHASEKV_UNROLL
    for (int g = 0; g < NG; ++g) {
      V qa = O::load(q + g * qs + i);
      V qb = O::load(q + g * qs + i + W);
      O::pin(qa);  // else GCC folds these loads into every FMA below (load-bound)
      O::pin(qb);
      PHASEKV_UNROLL
      for (int t = 0; t < NT; ++t) {
        acc[g * NT + t] = O::fma(qa, ka[t], acc[g * NT + t]);
        acc[g * NT + t] = O::fma(qb, kb[t], acc[g * NT + t]);
      }
    }
  }
  for (; i + W <= dd; i += W) {  // in order from here on (see permute_pairs)
    V kv[NT];
    PHASEKV_UNROLL
    for (int t = 0; t < NT; ++t) kv[t] = O::load(k[t] + i);
    PHASEKV_UNROLL
    for (int g = 0; g < NG; ++g) {
      const V qv = O::load(q + g * qs + i);
      PHASEKV_UNROLL
      for (int t = 0; t < NT; ++t) acc[g * NT + t] = O::fma(qv, kv[t], acc[g * NT + t]);
    }
  }
  float r[N > W ? N : W];
  if constexpr (W > 1 && N <= W) {  // one transpose-add for the whole tile
    V pad[W];
    PHASEKV_UNROLL
    for (int a = 0; a < W; ++a) pad[a] = a < N ? acc[a] : O::zero();
    O::store(r, O::hsumw(pad));
  } else {
    PHASEKV_UNROLL
    for (int a = 0; a < N; ++a) r[a] = O::hsum(acc[a]);
  }
  for (; i < dd; ++i) {
    PHASEKV_UNROLL
    for (int t = 0; t < NT; ++t) {
      const float kf = to_float(k[t][i]);
      PHASEKV_UNROLL
      for (int g = 0; g < NG; ++g) r[g * NT + t] = std::fma(q[g * qs + i], kf, r[g * NT + t]);
    }
  }
  PHASEKV_UNROLL
  for (int g = 0; g < NG; ++g) PHASEKV_UNROLL
  for (int t = 0; t < NT; ++t) s[g * kDecodeBlock + t] = r[g * NT + t];
}

/// Logits of NG heads against `nt` key rows (tiles of qk_tile_rows rows, then single rows).
/// Prefetches, spread over the tiles, the `nn` key rows `kn` (d elements) that the caller
/// will process later (pv_rows does the same for value rows).
template <class Arch, int NG, int D, class R>
void qk_rows(const float* q, std::int64_t qs, R k, std::int64_t nt, std::int64_t d, float* s, R kn,
             std::int64_t nn) {
  constexpr int NT = qk_tile_rows<Arch, NG>();
  std::int64_t t = 0;
  for (; t + NT <= nt; t += NT) {
    PHASEKV_UNROLL
    for (int u = 0; u < NT; ++u)
      if (t + u < nn) prefetch_row(kn[t + u], d);
    qk_tile<Arch, NG, NT, D>(q, qs, k + t, d, s + t);
  }
  for (; t < nt; ++t) {
    if (t < nn) prefetch_row(kn[t], d);
    qk_tile<Arch, NG, 1, D>(q, qs, k + t, d, s + t);
  }
  for (; t < nn; ++t) prefetch_row(kn[t], d);
}

/// Dispatches qk_rows on the head dim (fast paths: fast_head_dims, attention/head_dims.hpp).
template <class Arch, int NG, class R>
void qk_rows_d(const float* q, std::int64_t qs, R k, std::int64_t nt, std::int64_t d, float* s,
               R kn, std::int64_t nn) {
  dispatch_head_dim(
      d, [&](auto dim) { qk_rows<Arch, NG, decltype(dim)::value>(q, qs, k, nt, d, s, kn, nn); });
}

#if PHASEKV_TGT_AVX512BF16
/// Logits of NG heads (split queries `qhi`/`qlo`, stride `qs`) against NT bf16 key rows with
/// AVX512-BF16 dot products; `d` is a multiple of 32.
template <int NG, int NT, class R>
PHASEKV_FORCEINLINE void qk_tile_bf16dot(const bf16_t* qhi, const bf16_t* qlo, std::int64_t qs, R k,
                                         std::int64_t d, float* s) {
  using O = Vec<arch::Avx512>;
  using V = typename O::V;
  V acc[NT * NG];
  PHASEKV_UNROLL
  for (int a = 0; a < NT * NG; ++a) acc[a] = O::zero();
  for (std::int64_t i = 0; i < d; i += 32) {
    PHASEKV_UNROLL
    for (int g = 0; g < NG; ++g) {
      PHASEKV_UNROLL
      for (int t = 0; t < NT; ++t)
        acc[t * NG + g] =
            O::dot_bf16(acc[t * NG + g], qhi + g * qs + i, qlo + g * qs + i, k[t] + i);
    }
  }
  float r[16];
  if constexpr (NT * NG <= 16) {
    V pad[16];
    PHASEKV_UNROLL
    for (int a = 0; a < 16; ++a) pad[a] = a < NT * NG ? acc[a] : O::zero();
    O::store(r, O::hsumw(pad));
  }
  PHASEKV_UNROLL
  for (int t = 0; t < NT; ++t) {
    PHASEKV_UNROLL
    for (int g = 0; g < NG; ++g) s[g * kDecodeBlock + t] = r[t * NG + g];
  }
}

/// Logits of NG heads against `nt` bf16 key rows with AVX512-BF16 dot products.
template <int NG, class R>
void qk_rows_bf16dot(const bf16_t* qhi, const bf16_t* qlo, std::int64_t qs, R k, std::int64_t nt,
                     std::int64_t d, float* s) {
  constexpr int NT = qk_tile_rows<arch::Avx512, NG>();
  std::int64_t t = 0;
  for (; t + NT <= nt; t += NT) qk_tile_bf16dot<NG, NT>(qhi, qlo, qs, k + t, d, s + t);
  for (; t < nt; ++t) qk_tile_bf16dot<NG, 1>(qhi, qlo, qs, k + t, d, s + t);
}
#endif
/// Chunk pairs (of 2W elements) per pass of pv_rows for NG heads: as many as the registers
/// hold (NG accumulator pairs and one value pair per chunk pair, plus a weight), at most 4.
template <class Arch, int NG>
constexpr int pv_chunk_pairs() {
  constexpr int cp = (Vec<Arch>::regs - 3) / (2 * NG + 2);
  return cp < 1 ? 1 : cp > 4 ? 4 : cp;
}

/// acc[g] = corr[g] * acc[g] + sum_t w[g * kDecodeBlock + t] * v[t] for NG heads over `nt`
/// value rows; each value vector is loaded once for all NG heads. When rows of T are
/// interleaved on `Arch`, `acc` is in the order of permute_pairs.
template <class Arch, int NG, int CP, int D, class R>
PHASEKV_FORCEINLINE std::int64_t pv_pass(const float* w, R v, std::int64_t nt, std::int64_t i,
                                         std::int64_t dd, float* acc, std::int64_t as,
                                         const typename Vec<Arch>::V* cg, R vn, std::int64_t nn) {
  using O = Vec<Arch>;
  using V = typename O::V;
  constexpr int W = O::W;
  constexpr int C = 2 * CP;
  for (; i + C * W <= dd; i += C * W) {
    V a[NG * C];
    PHASEKV_UNROLL
    for (int g = 0; g < NG; ++g) PHASEKV_UNROLL
    for (int c = 0; c < C; ++c) a[g * C + c] = O::mul(O::load(acc + g * as + i + c * W), cg[g]);
    auto vr = v.cursor(i);
    auto pr = vn.cursor(i);
    PHASEKV_NOUNROLL
    for (std::int64_t t = 0; t < nt; ++t, vr.next(), pr.next()) {
      if (t < nn) prefetch_row(pr.get(), C * W);
      V x[C];
      PHASEKV_UNROLL
      for (int c = 0; c < CP; ++c) O::load2(vr.get() + 2 * c * W, x[2 * c], x[2 * c + 1]);
      PHASEKV_UNROLL
      for (int g = 0; g < NG; ++g) {
        const V wg = O::set1(w[g * kDecodeBlock + t]);
        PHASEKV_UNROLL
        for (int c = 0; c < C; ++c) a[g * C + c] = O::fma(wg, x[c], a[g * C + c]);
      }
    }
    PHASEKV_UNROLL
    for (int g = 0; g < NG; ++g) PHASEKV_UNROLL
    for (int c = 0; c < C; ++c) O::store(acc + g * as + i + c * W, a[g * C + c]);
  }
  return i;
}

/// acc[g] = corr[g] * acc[g] + sum_t w[g * kDecodeBlock + t] * v[t] for NG heads over `nt`
/// value rows (see pv_pass for the order of `acc`). Prefetches, spread over the passes, the
/// `nn` value rows `vn` (d elements) that the caller will process later. The value rows are
/// walked with running pointers and the weight rows are kDecodeBlock apart (a constant): with
/// a pointer array and a run-time weight stride GCC 12 ran out of general registers in the
/// AVX-512 pass (weight-row addresses moved through vector registers, a widened value row
/// spilled to the stack), 7 % of the decode step.
template <class Arch, int NG, int D, class R>
void pv_rows(const float* w, R v, std::int64_t nt, std::int64_t d, float* acc, std::int64_t as,
             const float* corr, R vn, std::int64_t nn) {
  using O = Vec<Arch>;
  using V = typename O::V;
  constexpr int W = O::W;
  constexpr int CP = pv_chunk_pairs<Arch, NG>();
  const std::int64_t dd = D > 0 ? D : d;
  V cg[NG];
  PHASEKV_UNROLL
  for (int g = 0; g < NG; ++g) cg[g] = O::set1(corr[g]);
  std::int64_t i = pv_pass<Arch, NG, CP, D>(w, v, nt, 0, dd, acc, as, cg, vn, nn);
  if (CP > 1) i = pv_pass<Arch, NG, 1, D>(w, v, nt, i, dd, acc, as, cg, vn, nn);
  for (std::int64_t t = 0; t < nn; ++t) {  // the columns no pass covered, rows past nt
    if (t < nt) {
      if (i < dd) prefetch_row(vn[t] + i, dd - i);
    } else {
      prefetch_row(vn[t], dd);
    }
  }
  for (; i + W <= dd; i += W) {  // in order from here on (see permute_pairs)
    V a[NG];
    PHASEKV_UNROLL
    for (int g = 0; g < NG; ++g) a[g] = O::mul(O::load(acc + g * as + i), cg[g]);
    for (std::int64_t t = 0; t < nt; ++t) {
      const V x = O::load(v[t] + i);
      PHASEKV_UNROLL
      for (int g = 0; g < NG; ++g) a[g] = O::fma(O::set1(w[g * kDecodeBlock + t]), x, a[g]);
    }
    PHASEKV_UNROLL
    for (int g = 0; g < NG; ++g) O::store(acc + g * as + i, a[g]);
  }
  for (; i < dd; ++i) {
    PHASEKV_UNROLL
    for (int g = 0; g < NG; ++g) {
      float a = acc[g * as + i] * corr[g];
      for (std::int64_t t = 0; t < nt; ++t)
        a = std::fma(w[g * kDecodeBlock + t], to_float(v[t][i]), a);
      acc[g * as + i] = a;
    }
  }
}

/// Dispatches pv_rows on the value head dim (fast paths: fast_head_dims).
template <class Arch, int NG, class R>
void pv_rows_d(const float* w, R v, std::int64_t nt, std::int64_t d, float* acc, std::int64_t as,
               const float* corr, R vn, std::int64_t nn) {
  dispatch_head_dim(d, [&](auto dim) {
    pv_rows<Arch, NG, decltype(dim)::value>(w, v, nt, d, acc, as, corr, vn, nn);
  });
}

/// Applies a user variant's logit hook to `n` raw dot products.
template <class Arch, class Variant>
PHASEKV_FORCEINLINE void transform_logits(const Variant& var, SegmentKind kind, float* s,
                                          std::int64_t n) {
  for (std::int64_t t = 0; t < n; ++t) s[t] = var.logit(s[t], kind);
}

/// StandardVariant: vectorized `scale * dot + bias` when there is no soft cap.
template <class Arch>
PHASEKV_FORCEINLINE void transform_logits(const StandardVariant& var, SegmentKind kind, float* s,
                                          std::int64_t n) {
  const float bias = kind == SegmentKind::compressed ? var.entry_bias : 0.0f;
  if (var.softcap > 0.0f) {  // StandardVariant::logit with the bias added by an explicit fma
    const float c = var.softcap;
    for (std::int64_t t = 0; t < n; ++t) s[t] = std::fma(c, tanhf(var.scale * s[t] / c), bias);
    return;
  }
  using O = Vec<Arch>;
  constexpr int W = O::W;
  const typename O::V sc = O::set1(var.scale), b = O::set1(bias);
  std::int64_t t = 0;
  for (; t + W <= n; t += W) O::store(s + t, O::fma(O::load(s + t), sc, b));
  for (; t < n; ++t) s[t] = std::fma(s[t], var.scale, bias);
}

/// Online-softmax update of NG heads at once over a block of logits (rows `s + g * ld`, `n`
/// logits each, `ld` a multiple of the vector width): replaces the logits by their weights
/// `exp(s - max)`, updates each head's running `max[g]`/`denom[g]` and writes the rescale
/// factor of its previous accumulator to `corr[g]` (0 when it was empty). The heads'
/// reductions and exponentials are interleaved so that their latencies overlap.
template <class Arch, int NG>
PHASEKV_FORCEINLINE void softmax_heads(float* s, std::int64_t ld, std::int64_t n, float* max,
                                       float* denom, float* corr) {
  using O = Vec<Arch>;
  using V = typename O::V;
  constexpr int W = O::W;
  PHASEKV_UNROLL
  for (int g = 0; g < NG; ++g)
    for (std::int64_t t = n; t < ld; ++t) s[g * ld + t] = neg_inf();
  V mv[NG];
  PHASEKV_UNROLL
  for (int g = 0; g < NG; ++g) mv[g] = O::set1(neg_inf());
  for (std::int64_t t = 0; t < ld; t += W) PHASEKV_UNROLL
  for (int g = 0; g < NG; ++g) mv[g] = O::max(mv[g], O::load(s + g * ld + t));
  V neg_m[NG], sum[NG];
  PHASEKV_UNROLL
  for (int g = 0; g < NG; ++g) {
    const float bmax = O::hmax(mv[g]);
    const float m_new = bmax > max[g] ? bmax : max[g];
    if (m_new == neg_inf()) {  // nothing visible in this head's block (a variant masked it all):
      corr[g] = 1.0f;          // the rows are -inf, exp(-inf - 0) = 0, nothing changes
      neg_m[g] = O::zero();
    } else {
      corr[g] = max[g] == neg_inf() ? 0.0f
                : max[g] == m_new   ? 1.0f
                                    : Vec<arch::Scalar>::exp(max[g] - m_new);
      neg_m[g] = O::set1(-m_new);
      max[g] = m_new;
    }
    sum[g] = O::zero();
  }
  for (std::int64_t t = 0; t < ld; t += W) PHASEKV_UNROLL
  for (int g = 0; g < NG; ++g) {
    const V e = O::exp(O::add(O::load(s + g * ld + t), neg_m[g]));
    O::store(s + g * ld + t, e);
    sum[g] = O::add(sum[g], e);
  }
  PHASEKV_UNROLL
  for (int g = 0; g < NG; ++g) denom[g] = std::fma(denom[g], corr[g], O::hsum(sum[g]));
}

}  // namespace PHASEKV_TGT_NS
}  // namespace detail
}  // namespace cpu
PHASEKV_NAMESPACE_END
