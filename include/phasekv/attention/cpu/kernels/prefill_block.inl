// phasekv: the prefill inner kernels of one target pass (see core/foreach_target.inc),
// included by attention/cpu/prefill_block.hpp once per pass. No include guard, no includes.

PHASEKV_NAMESPACE_BEGIN
namespace cpu {
namespace detail {
namespace PHASEKV_TGT_NS {

/// Keys per prefill block.
constexpr int kPrefillKeys = 64;
/// Query rows per Q.K^T and P.V register tile: 2 x rows accumulators, two panel vectors and a
/// broadcast must fit the register file (6 rows with 16 registers, 12 with 32).
template <class Arch>
constexpr int prefill_tile_rows() {
  return Vec<Arch>::regs >= 32 ? 12 : 6;
}

/// Calls `f(std::integral_constant<int, m>{})` for a run-time `m` in [1, M] (0: nothing).
template <int M, class F>
PHASEKV_FORCEINLINE void with_rows(std::int64_t m, const F& f) {
  if constexpr (M > 0) {
    if (m == M)
      f(std::integral_constant<int, M>{});
    else
      with_rows<M - 1>(m, f);
  }
}

/// Rounds `x` up to a multiple of `m`.
inline std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

/// Converts `n` elements to float into `dst` and zero-fills up to `padded`.
template <class Arch, class T>
PHASEKV_FORCEINLINE void pack_row(const T* src, std::int64_t n, std::int64_t padded, float* dst) {
  using O = Vec<Arch>;
  constexpr int W = O::W;
  std::int64_t i = 0;
  for (; i + W <= n; i += W) O::store(dst + i, O::load(src + i));
  for (; i < n; ++i) dst[i] = to_float(src[i]);
  for (; i < padded; ++i) dst[i] = 0.0f;
}

/// Packs `n` key rows (`rows[k]`, `d` elements each) transposed into column panels of P keys:
/// key k, element i goes to `kt[(k / P) * d * P + i * P + k % P]`; keys `[n, padded)` (padded
/// a multiple of P) are zero.
template <int P, class T>
void pack_keys_panels(const T* const* rows, std::int64_t n, std::int64_t padded, std::int64_t d,
                      float* kt) {
  for (std::int64_t k = 0; k < n; ++k) {
    const T* src = rows[k];
    float* dst = kt + (k / P) * d * P + k % P;
    for (std::int64_t i = 0; i < d; ++i) dst[i * P] = to_float(src[i]);
  }
  for (std::int64_t k = n; k < padded; ++k) {
    float* dst = kt + (k / P) * d * P + k % P;
    for (std::int64_t i = 0; i < d; ++i) dst[i * P] = 0.0f;
  }
}

/// Packs value row `src` (`d` elements) as row `k` of column panels of P values:
/// element c goes to `vp[(c / P) * ld * P + k * P + c % P]`, zero up to `padded` columns.
template <class Arch, int P, class T>
PHASEKV_FORCEINLINE void pack_value_panels(const T* src, std::int64_t d, std::int64_t padded,
                                           std::int64_t k, std::int64_t ld, float* vp) {
  using O = Vec<Arch>;
  constexpr int W = O::W;
  static_assert(P % W == 0, "panel width must be a multiple of the vector width");
  std::int64_t c0 = 0;
  for (; c0 + P <= d; c0 += P) {
    float* dst = vp + (c0 / P) * ld * P + k * P;
    PHASEKV_UNROLL
    for (int c = 0; c < P; c += W) O::store(dst + c, O::load(src + c0 + c));
  }
  for (; c0 < padded; c0 += P) {
    float* dst = vp + (c0 / P) * ld * P + k * P;
    for (std::int64_t c = 0; c < P; ++c) dst[c] = (c0 + c) < d ? to_float(src[c0 + c]) : 0.0f;
  }
}

/// Online-softmax update of one head over a block of logits `s[0, n)` (the buffer holds
/// `padded` >= n floats, a multiple of the vector width). Replaces the logits by their weights
/// `exp(s - max)`, updates the running `max`/`denom` and returns the rescale factor of the
/// previous accumulator (0 when it was empty).
template <class Arch>
PHASEKV_FORCEINLINE float softmax_block(float* s, std::int64_t n, std::int64_t padded, float& max,
                                        float& denom) {
  using O = Vec<Arch>;
  using V = typename O::V;
  constexpr int W = O::W;
  for (std::int64_t t = n; t < padded; ++t) s[t] = neg_inf();
  V mv = O::set1(neg_inf());
  for (std::int64_t t = 0; t < padded; t += W) mv = O::max(mv, O::load(s + t));
  const float bmax = O::hmax(mv);
  const float m_new = bmax > max ? bmax : max;
  if (m_new == neg_inf()) {  // nothing visible in the block (a variant masked it all) ...
    for (std::int64_t t = 0; t < n; ++t)
      if (s[t] != s[t]) denom = s[t];  // ... or NaN logits (NaN in q): the row is NaN
    for (std::int64_t t = 0; t < padded; ++t) s[t] = 0.0f;
    return 1.0f;
  }
  const float corr =
      max == neg_inf() ? 0.0f : (max == m_new ? 1.0f : Vec<arch::Scalar>::exp(max - m_new));
  const V neg_m = O::set1(-m_new);
  V sum = O::zero();
  for (std::int64_t t = 0; t < padded; t += W) {
    const V e = O::exp(O::add(O::load(s + t), neg_m));
    O::store(s + t, e);
    sum = O::add(sum, e);
  }
  denom = std::fma(denom, corr, O::hsum(sum));
  max = m_new;
  return corr;
}

/// s[r * ld + j] = <q_r, k_j> for MR packed query rows (stride `dqp`) and the 2 * W keys of one
/// key panel `kt` (`[d, 2 * W]`): broadcast-query form, no horizontal reductions.
template <class Arch, int MR>
PHASEKV_FORCEINLINE void qk_micro(const float* q, std::int64_t dqp, const float* kt, std::int64_t d,
                                  float* s, std::int64_t ld) {
  using O = Vec<Arch>;
  using V = typename O::V;
  constexpr int W = O::W;
  V acc[MR * 2];
  PHASEKV_UNROLL
  for (int a = 0; a < MR * 2; ++a) acc[a] = O::zero();
  for (std::int64_t i = 0; i < d; ++i) {
    const V k0 = O::load(kt + i * 2 * W), k1 = O::load(kt + i * 2 * W + W);
    PHASEKV_UNROLL
    for (int r = 0; r < MR; ++r) {
      const V qv = O::set1(q[r * dqp + i]);
      acc[2 * r] = O::fma(qv, k0, acc[2 * r]);
      acc[2 * r + 1] = O::fma(qv, k1, acc[2 * r + 1]);
    }
  }
  PHASEKV_UNROLL
  for (int r = 0; r < MR; ++r) {
    O::store(s + r * ld, acc[2 * r]);
    O::store(s + r * ld + W, acc[2 * r + 1]);
  }
}

/// S = Qp . K^T for `rows` packed query rows against the key panels `kt` (from
/// pack_keys_panels with P = 2 * W), `keys` columns (a multiple of 2 * W). Panels outer, row
/// tiles inner, so a panel stays in L1 while every row meets it.
template <class Arch>
void qk_block(const float* qp, std::int64_t rows, std::int64_t dqp, const float* kt, std::int64_t d,
              std::int64_t keys, float* s, std::int64_t ld) {
  constexpr std::int64_t P = 2 * Vec<Arch>::W;
  for (std::int64_t j = 0; j < keys; j += P) {
    const float* panel = kt + (j / P) * d * P;
    constexpr int MR = prefill_tile_rows<Arch>();
    std::int64_t r = 0;
    for (; r + MR <= rows; r += MR)
      qk_micro<Arch, MR>(qp + r * dqp, dqp, panel, d, s + r * ld + j, ld);
    const float* q = qp + r * dqp;
    float* sr = s + r * ld + j;
    with_rows<MR - 1>(
        rows - r, [&](auto m) { qk_micro<Arch, decltype(m)::value>(q, dqp, panel, d, sr, ld); });
  }
}

/// o[r][0, 2W) = corr[r] * o[r] + sum_k p[r * ld + k] * v[k] for MR rows over `keys` rows of one
/// value panel `v` (`[ld_keys, 2 * W]`); `o` has row stride `dvp`.
template <class Arch, int MR>
PHASEKV_FORCEINLINE void pv_micro(const float* p, std::int64_t ld, const float* v,
                                  std::int64_t keys, std::int64_t dvp, float* o,
                                  const float* corr) {
  using O = Vec<Arch>;
  using V = typename O::V;
  constexpr int W = O::W;
  V a[MR * 2];
  PHASEKV_UNROLL
  for (int r = 0; r < MR; ++r) {
    const V c = O::set1(corr[r]);
    a[2 * r] = O::mul(O::load(o + r * dvp), c);
    a[2 * r + 1] = O::mul(O::load(o + r * dvp + W), c);
  }
  for (std::int64_t k = 0; k < keys; ++k) {
    const V x0 = O::load(v + k * 2 * W), x1 = O::load(v + k * 2 * W + W);
    PHASEKV_UNROLL
    for (int r = 0; r < MR; ++r) {
      const V w = O::set1(p[r * ld + k]);
      a[2 * r] = O::fma(w, x0, a[2 * r]);
      a[2 * r + 1] = O::fma(w, x1, a[2 * r + 1]);
    }
  }
  PHASEKV_UNROLL
  for (int r = 0; r < MR; ++r) {
    O::store(o + r * dvp, a[2 * r]);
    O::store(o + r * dvp + W, a[2 * r + 1]);
  }
}

/// O += P . V for `rows` rows over `keys` value rows packed in panels (pack_value_panels with
/// P = 2 * W and `ld_keys` rows per panel), all `dvp` columns; panels outer, row tiles inner.
template <class Arch>
void pv_block(const float* p, std::int64_t rows, std::int64_t ld, const float* vp,
              std::int64_t ld_keys, std::int64_t keys, std::int64_t dvp, float* o,
              const float* corr) {
  constexpr std::int64_t P = 2 * Vec<Arch>::W;
  for (std::int64_t c0 = 0; c0 < dvp; c0 += P) {
    const float* panel = vp + (c0 / P) * ld_keys * P;
    constexpr int MR = prefill_tile_rows<Arch>();
    std::int64_t r = 0;
    for (; r + MR <= rows; r += MR)
      pv_micro<Arch, MR>(p + r * ld, ld, panel, keys, dvp, o + r * dvp + c0, corr + r);
    const float* pr = p + r * ld;
    float* orow = o + r * dvp + c0;
    with_rows<MR - 1>(rows - r, [&](auto m) {
      pv_micro<Arch, decltype(m)::value>(pr, ld, panel, keys, dvp, orow, corr + r);
    });
  }
}

}  // namespace PHASEKV_TGT_NS
}  // namespace detail
}  // namespace cpu
PHASEKV_NAMESPACE_END
