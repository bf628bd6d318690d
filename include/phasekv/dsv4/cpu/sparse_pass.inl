// phasekv: the DeepSeek-V4 sparse attention's block kernel of one target pass (see
// core/foreach_target.hpp), included by dsv4/sparse_attention.hpp once per pass. No include
// guard, no includes. Portable loops with constant inner trip counts, vectorized by each pass
// for its own instruction set (dispatch in sparse_attention.hpp).

PHASEKV_NAMESPACE_BEGIN
namespace detail {
namespace PHASEKV_TGT_NS {
namespace dsv4sparse {

// Adds `n` rows (in a.rows as stored, converted to f32; their real values are the rows times
// `row_scale`) to every head's online softmax.
PHASEKV_NOINLINE void sparse_block(const dsv4::SparseAttentionParams& p, const float* q,
                                   dsv4::detail::SparseAcc& a, std::int64_t n, float row_scale) {
  const std::int64_t d = p.dim, dv = p.dim_v;
  const float ls = p.scale * row_scale;
  for (std::int64_t h = 0; h < p.heads; ++h) {
    const float* qh = q + h * d;
    float bmax = -HUGE_VALF;
    constexpr std::int64_t B = 16;
    const std::int64_t rem = d % B, dB = d - rem;
    std::int64_t r = 0;
    for (; r + 4 <= n; r += 4) {  // four rows share each load of the query
      const float* x0 = a.rows.data() + r * d;
      const float* x1 = x0 + d;
      const float* x2 = x1 + d;
      const float* x3 = x2 + d;
      float p0[B] = {}, p1[B] = {}, p2[B] = {}, p3[B] = {};
      for (std::int64_t i = 0; i < dB; i += B) {
        for (std::int64_t k = 0; k < B; ++k) {
          const float qv = qh[i + k];
          p0[k] += qv * x0[i + k];
          p1[k] += qv * x1[i + k];
          p2[k] += qv * x2[i + k];
          p3[k] += qv * x3[i + k];
        }
      }
      for (std::int64_t k = 0; k < rem; ++k) {
        const float qv = qh[dB + k];
        p0[k] += qv * x0[dB + k];
        p1[k] += qv * x1[dB + k];
        p2[k] += qv * x2[dB + k];
        p3[k] += qv * x3[dB + k];
      }
      float* parts[4] = {p0, p1, p2, p3};
      for (std::int64_t j = 0; j < 4; ++j) {
        float* pp = parts[j];
        for (std::int64_t w = B / 2; w >= 1; w /= 2)
          for (std::int64_t k = 0; k < w; ++k) pp[k] += pp[k + w];
        const float sv = ls * pp[0];
        a.logit[static_cast<std::size_t>(r + j)] = sv;
        bmax = sv > bmax ? sv : bmax;
      }
    }
    for (; r < n; ++r) {
      const float* x = a.rows.data() + r * d;
      float part[B] = {};
      for (std::int64_t i = 0; i < dB; i += B)
        for (std::int64_t k = 0; k < B; ++k) part[k] += qh[i + k] * x[i + k];
      for (std::int64_t k = 0; k < rem; ++k) part[k] += qh[dB + k] * x[dB + k];
      for (std::int64_t w = B / 2; w >= 1; w /= 2)
        for (std::int64_t k = 0; k < w; ++k) part[k] += part[k + w];
      const float sv = ls * part[0];
      a.logit[static_cast<std::size_t>(r)] = sv;
      bmax = sv > bmax ? sv : bmax;
    }
    float* o = a.acc.data() + h * dv;
    float& m = a.mx[static_cast<std::size_t>(h)];
    float& den = a.den[static_cast<std::size_t>(h)];
    if (bmax > m) {
      const float c = m == -HUGE_VALF ? 0.0f : std::exp(m - bmax);
      den *= c;
      for (std::int64_t i = 0; i < dv; ++i) o[i] *= c;
      m = bmax;
    }
    float wv[dsv4::detail::kSparseBlock];
    for (std::int64_t j = 0; j < n; ++j) {
      const float w = std::exp(a.logit[static_cast<std::size_t>(j)] - m);
      den += w;
      wv[j] = w * row_scale;  // the value is the stored row times its tensor's scale
    }
    float* __restrict oo = o;
    r = 0;
    for (; r + 4 <= n; r += 4) {  // one load and store of the output per four rows
      const float* __restrict x0 = a.rows.data() + r * d;
      const float* __restrict x1 = x0 + d;
      const float* __restrict x2 = x1 + d;
      const float* __restrict x3 = x2 + d;
      const float w0 = wv[r], w1 = wv[r + 1], w2 = wv[r + 2], w3 = wv[r + 3];
      std::int64_t i = 0;
      for (; i + B <= dv; i += B)  // constant inner trip count: vectorized at -O2 as well
        for (std::int64_t k = 0; k < B; ++k)
          oo[i + k] += ((w0 * x0[i + k] + w1 * x1[i + k]) + (w2 * x2[i + k] + w3 * x3[i + k]));
      for (; i < dv; ++i) oo[i] += ((w0 * x0[i] + w1 * x1[i]) + (w2 * x2[i] + w3 * x3[i]));
    }
    for (; r < n; ++r) {
      const float* __restrict x = a.rows.data() + r * d;
      const float w = wv[r];
      for (std::int64_t i = 0; i < dv; ++i) oo[i] += w * x[i];
    }
  }
}

}  // namespace dsv4sparse
}  // namespace PHASEKV_TGT_NS
}  // namespace detail
PHASEKV_NAMESPACE_END
