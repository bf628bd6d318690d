// phasekv: the DeepSeek-V4 compressor's pooling kernel of one target pass (see
// core/foreach_target.hpp), included by dsv4/compressor.hpp once per pass. No include guard,
// no includes. Portable loops with constant inner trip counts: each pass vectorizes them for
// its own instruction set (the base pass as the translation unit's flags allow), so a plain
// build runs the AVX2 or AVX-512 code on CPUs that have it (dispatch in compressor.hpp).

PHASEKV_NAMESPACE_BEGIN
namespace detail {
namespace PHASEKV_TGT_NS {
namespace dsv4pool {

// exp(x) for x <= 0 with only +, *, compare and bit moves, so that loops calling it vectorize;
// relative error about 2 ulp. x < -87 is treated as -87 (exp(-87) ~ 1.6e-38, a weight that
// cannot change a sum that contains exp(0) = 1). NaN propagates.
PHASEKV_FORCEINLINE float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = x * 1.44269504088896341f + magic;
  const float n = t - magic;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  std::int32_t tb;
  std::memcpy(&tb, &t, sizeof tb);
  const std::int32_t e = (tb - 0x4B400000) + 127;  // n + 127, in [1, 127]
  const std::uint32_t sb = static_cast<std::uint32_t>(e) << 23;
  float scale;
  std::memcpy(&scale, &sb, sizeof scale);
  return p * scale;
}

// Pools one entry. kv_blocks[h] / score_blocks[h] point to row 0 of the block seen through
// half h (S rows `stride` elements apart) or are null when that block is absent (before
// token 0). `scratch` holds 3 * dim floats. Rows outer, channels inner (contiguous, in blocks
// of kPoolBlock with a constant trip count so that -O2 vectorizes them too): a max pass, then
// an exp / weighted-sum pass over the same rows (in cache by then). Kept out of line so that the
// batch and the streaming path run one copy of the code and agree bit for bit.
template <class T>
PHASEKV_NOINLINE void pool_entry(const dsv4::CompressorParams& p, const T* const* kv_blocks,
                                 const T* const* score_blocks, std::int64_t stride, float* out,
                                 float* scratch) {
  constexpr std::int64_t B = dsv4::detail::kPoolBlock;
  const std::int64_t S = p.ratio, d = p.dim, rw = p.row_width();
  const std::int64_t dB = d / B * B;
  float* __restrict m = scratch;
  float* __restrict den = scratch + d;
  float* __restrict acc = scratch + 2 * d;
  for (std::int64_t c = 0; c < d; ++c) {
    m[c] = -HUGE_VALF;
    den[c] = 0.0f;
    acc[c] = 0.0f;
  }
  for (std::int64_t h = 0; h < p.coff; ++h) {
    if (score_blocks[h] == nullptr) continue;
    for (std::int64_t i = 0; i < S; ++i) {
      const T* __restrict s = score_blocks[h] + i * stride + h * d;
      const float* __restrict a = p.ape + i * rw + h * d;
      std::int64_t c = 0;
      for (; c < dB; c += B) {
        for (std::int64_t k = 0; k < B; ++k) {
          const float z = phasekv::to_float(s[c + k]) + a[c + k];
          m[c + k] = z > m[c + k] ? z : m[c + k];
        }
      }
      for (; c < d; ++c) {
        const float z = phasekv::to_float(s[c]) + a[c];
        m[c] = z > m[c] ? z : m[c];
      }
    }
  }
  for (std::int64_t h = 0; h < p.coff; ++h) {
    if (score_blocks[h] == nullptr) continue;
    for (std::int64_t i = 0; i < S; ++i) {
      const T* __restrict s = score_blocks[h] + i * stride + h * d;
      const T* __restrict v = kv_blocks[h] + i * stride + h * d;
      const float* __restrict a = p.ape + i * rw + h * d;
      const std::int64_t ahead =
          dsv4::detail::kPoolPrefetchRows * stride * static_cast<std::int64_t>(sizeof(T));
      std::int64_t c = 0;
      for (; c < dB; c += B) {
        dsv4::detail::prefetch_ahead(s + c, ahead);
        dsv4::detail::prefetch_ahead(v + c, ahead);
        for (std::int64_t k = 0; k < B; ++k) {
          const float w = exp_nonpositive((phasekv::to_float(s[c + k]) + a[c + k]) - m[c + k]);
          den[c + k] += w;
          acc[c + k] += w * phasekv::to_float(v[c + k]);
        }
      }
      for (; c < d; ++c) {
        const float w = exp_nonpositive((phasekv::to_float(s[c]) + a[c]) - m[c]);
        den[c] += w;
        acc[c] += w * phasekv::to_float(v[c]);
      }
    }
  }
  for (std::int64_t c = 0; c < d; ++c) out[c] = acc[c] / den[c];
}

}  // namespace dsv4pool
}  // namespace PHASEKV_TGT_NS
}  // namespace detail
PHASEKV_NAMESPACE_END
