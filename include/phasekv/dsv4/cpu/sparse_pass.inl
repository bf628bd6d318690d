// phasekv: the DeepSeek-V4 sparse attention's block kernel of one target pass (see
// core/foreach_target.hpp), included by dsv4/sparse_attention.hpp once per pass. No include
// guard, no includes. Portable loops with constant inner trip counts, vectorized by each pass
// for its own instruction set (dispatch in sparse_attention.hpp).

PHASEKV_NAMESPACE_BEGIN
namespace detail {
namespace PHASEKV_TGT_NS {
namespace dsv4sparse {

// Logits of G heads starting at h0 for the kSparseBlock rows of the block (lanes are rows, so
// no horizontal sums): logit[h][r] = ls * sum_i q[h][i] * x[r][i], summed over i in order.
template <int G>
PHASEKV_FORCEINLINE void sparse_logits(const float* __restrict q, const float* __restrict cols,
                                       std::int64_t d, float ls, float* __restrict logit) {
  constexpr std::int64_t R = dsv4::detail::kSparseBlock;
  float s[G][R] = {};
  for (std::int64_t i = 0; i < d; ++i) {
    const float* __restrict x = cols + i * R;
    for (int g = 0; g < G; ++g) {
      const float qv = q[g * d + i];
      for (std::int64_t r = 0; r < R; ++r) s[g][r] += qv * x[r];
    }
  }
  for (int g = 0; g < G; ++g)
    for (std::int64_t r = 0; r < R; ++r) logit[g * R + r] = ls * s[g][r];
}

// o[h][c] += sum_r w[h][r] * x[r][c] for G heads starting at h0, rows in order, channels in
// blocks of 16 held in registers over the block's rows.
template <int G>
PHASEKV_FORCEINLINE void sparse_values(const float* __restrict w, const float* __restrict rows,
                                       std::int64_t n, std::int64_t d, std::int64_t dv,
                                       float* __restrict o) {
  constexpr std::int64_t R = dsv4::detail::kSparseBlock, C = 16;
  std::int64_t c = 0;
  for (; c + C <= dv; c += C) {
    float acc[G][C];
    for (int g = 0; g < G; ++g)
      for (std::int64_t k = 0; k < C; ++k) acc[g][k] = o[g * dv + c + k];
    for (std::int64_t r = 0; r < n; ++r) {
      const float* __restrict x = rows + r * d + c;
      for (int g = 0; g < G; ++g) {
        const float wv = w[g * R + r];
        for (std::int64_t k = 0; k < C; ++k) acc[g][k] += wv * x[k];
      }
    }
    for (int g = 0; g < G; ++g)
      for (std::int64_t k = 0; k < C; ++k) o[g * dv + c + k] = acc[g][k];
  }
  for (; c < dv; ++c)
    for (int g = 0; g < G; ++g) {
      float acc = o[g * dv + c];
      for (std::int64_t r = 0; r < n; ++r) acc += w[g * R + r] * rows[r * d + c];
      o[g * dv + c] = acc;
    }
}

// Adds `n` rows (in a.rows as stored, converted to f32; their real values are the rows times
// `row_scale`) to every head's online softmax: the logits of every head (four heads at a time
// over the transposed block), each head's running max and weights, then the weighted rows
// (four heads at a time, each row loaded once for the four).
PHASEKV_NOINLINE void sparse_block(const dsv4::SparseAttentionParams& p, const float* q,
                                   dsv4::detail::SparseAcc& a, std::int64_t n, float row_scale) {
  constexpr std::int64_t R = dsv4::detail::kSparseBlock;
  const std::int64_t d = p.dim, dv = p.dim_v, H = p.heads;
  const float ls = p.scale * row_scale;
  float* __restrict cols = a.cols.data();
  const float* __restrict rows = a.rows.data();
  for (std::int64_t i = 0; i < d; ++i)
    for (std::int64_t r = 0; r < R; ++r) cols[i * R + r] = r < n ? rows[r * d + i] : 0.0f;
  float* logit = a.logit.data();
  std::int64_t h = 0;
  for (; h + 4 <= H; h += 4) sparse_logits<4>(q + h * d, cols, d, ls, logit + h * R);
  for (; h < H; ++h) sparse_logits<1>(q + h * d, cols, d, ls, logit + h * R);
  for (h = 0; h < H; ++h) {
    float* lg = logit + h * R;
    float bmax = -HUGE_VALF;
    for (std::int64_t r = 0; r < n; ++r) bmax = lg[r] > bmax ? lg[r] : bmax;
    float* o = a.acc.data() + h * dv;
    float& m = a.mx[static_cast<std::size_t>(h)];
    float& den = a.den[static_cast<std::size_t>(h)];
    if (bmax > m) {
      const float c = m == -HUGE_VALF ? 0.0f : std::exp(m - bmax);
      den *= c;
      for (std::int64_t i = 0; i < dv; ++i) o[i] *= c;
      m = bmax;
    }
    for (std::int64_t r = 0; r < n; ++r) {
      const float w = std::exp(lg[r] - m);
      den += w;
      lg[r] = w * row_scale;  // the value is the stored row times its tensor's scale
    }
  }
  h = 0;
  for (; h + 4 <= H; h += 4) sparse_values<4>(logit + h * R, rows, n, d, dv, a.acc.data() + h * dv);
  for (; h < H; ++h) sparse_values<1>(logit + h * R, rows, n, d, dv, a.acc.data() + h * dv);
}

}  // namespace dsv4sparse
}  // namespace PHASEKV_TGT_NS
}  // namespace detail
PHASEKV_NAMESPACE_END
