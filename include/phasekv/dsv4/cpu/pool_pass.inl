// phasekv: the DeepSeek-V4 compressor's pooling kernel of one target pass (see
// core/foreach_target.inc), included by dsv4/compressor.hpp once per pass. No include guard,
// no includes. Written once over `Vec<Arch>` (cpu/vec.hpp) with the widest vector of the pass:
// AVX-512 in the AVX-512 passes, AVX2 in the AVX2 pass, NEON in the base pass on AArch64, the
// scalar Vec in the base pass elsewhere (dispatch in compressor.hpp).

PHASEKV_NAMESPACE_BEGIN
namespace detail {
namespace PHASEKV_TGT_NS {
namespace dsv4pool {

namespace vx = phasekv::cpu::detail::PHASEKV_TGT_NS;

// The vector of this pass and the registers of channels one block keeps in flight (three
// accumulators each: max, denominator, weighted sum, plus the exp's temporaries).
#if PHASEKV_TGT_AVX512
using Wide = vx::Vec<phasekv::cpu::arch::Avx512>;
inline constexpr int kBlockVectors = 4;
#elif PHASEKV_TGT_AVX2
using Wide = vx::Vec<phasekv::cpu::arch::Avx2>;
inline constexpr int kBlockVectors = 2;
#elif PHASEKV_TGT_NEON
using Wide = vx::Vec<phasekv::cpu::arch::Neon>;
inline constexpr int kBlockVectors = 4;
#else
using Wide = vx::Vec<phasekv::cpu::arch::Scalar>;
inline constexpr int kBlockVectors = 4;
#endif
using One = vx::Vec<phasekv::cpu::arch::Scalar>;

// exp(x) for x <= 0 (NaN propagates): x < -87 is treated as -87 (exp(-87) ~ 1.6e-38, a weight
// that cannot change a sum that contains exp(0) = 1). The range reduction and the polynomial of
// Vec's exp_poly (relative error below 2e-7), with two savings, because vector instructions
// bound this kernel (on AVX-512: 22 per 16 lanes and row in the second pass, 4 in the first,
// all on the two vector ports): n = round(x / ln 2) by adding 1.5 * 2^23 inside the FMA (exact
// for |n| < 2^22; a multiply and a round take 3 uops), and p * 2^n by vscalefps on AVX-512 (one
// instruction instead of convert, add, shift and multiply).
template <class O>
PHASEKV_FORCEINLINE typename O::V exp_nonpositive(typename O::V x) {
  using V = typename O::V;
  x = O::max(O::set1(-87.0f), x);
  const V t = O::fma(x, O::set1(1.44269504088896341f), O::set1(12582912.0f));
  const V n = O::add(t, O::set1(-12582912.0f));  // exact: an integer in [-126, 0]
  V r = O::fma(n, O::set1(-0.693359375f), x);
  r = O::fma(n, O::set1(2.12194440e-4f), r);
  V p = O::set1(1.9875691500e-4f);
  p = O::fma(p, r, O::set1(1.3981999507e-3f));
  p = O::fma(p, r, O::set1(8.3334519073e-3f));
  p = O::fma(p, r, O::set1(4.1665795894e-2f));
  p = O::fma(p, r, O::set1(1.6666665459e-1f));
  p = O::fma(p, r, O::set1(5.0000001201e-1f));
  p = O::fma(p, O::mul(r, r), O::add(r, O::set1(1.0f)));
#if PHASEKV_TGT_AVX512
  if constexpr (std::is_same<O, Wide>::value) return _mm512_scalef_ps(p, n);
#endif
  return O::mul(p, O::pow2i(n));
}

// Where the second pass's prefetches go: the block that follows the entry's last block (the
// next entry's new rows; `from` is that last block's row 0 and `offset` counts bytes from it),
// a contiguous range of S rows that the blocks of channels fetch in order, a few lines per row
// step, so that the whole range arrives in L2 while this entry is pooled.
template <class T>
struct PoolPrefetch {
  const T* score;
  const T* kv;
  std::int64_t offset;
};

// Pools channels [c, c + NV * W) of one entry with NV vectors of O in registers: a max pass
// over the window's rows, then an exp / weighted-sum pass over the same rows (in L1 by then).
// With `prefetch`, each row step of the second pass asks for the next NV * W elements of `pf`.
template <class O, int NV, bool prefetch, class T>
PHASEKV_FORCEINLINE void pool_block(const dsv4::CompressorParams& p, const T* const* kv_blocks,
                                    const T* const* score_blocks, std::int64_t stride,
                                    std::int64_t c, float* out, PoolPrefetch<T>& pf) {
  using V = typename O::V;
  constexpr int W = O::W;
  constexpr int kLineBytes = 64;
  constexpr int kStepBytes = NV * W * static_cast<int>(sizeof(T));
  const std::int64_t S = p.ratio, d = p.dim, rw = p.row_width();
  V m[NV];
  PHASEKV_UNROLL
  for (int k = 0; k < NV; ++k) m[k] = O::set1(-HUGE_VALF);
  for (std::int64_t h = 0; h < p.coff; ++h) {
    if (score_blocks[h] == nullptr) continue;
    const T* s = score_blocks[h] + h * d + c;
    const float* a = p.ape + h * d + c;
    for (std::int64_t i = 0; i < S; ++i, s += stride, a += rw) {
      PHASEKV_UNROLL
      for (int k = 0; k < NV; ++k)
        m[k] = O::max(m[k], O::add(O::load(s + k * W), O::load(a + k * W)));
    }
  }
  const char* const pf_score = reinterpret_cast<const char*>(pf.score);
  const char* const pf_kv = reinterpret_cast<const char*>(pf.kv);
  std::int64_t pf_offset = pf.offset;
  V nm[NV], den[NV], acc[NV];
  PHASEKV_UNROLL
  for (int k = 0; k < NV; ++k) {
    nm[k] = O::mul(m[k], O::set1(-1.0f));  // exact: z + nm is z - m
    den[k] = O::zero();
    acc[k] = O::zero();
  }
  for (std::int64_t h = 0; h < p.coff; ++h) {
    if (score_blocks[h] == nullptr) continue;
    const T* s = score_blocks[h] + h * d + c;
    const T* v = kv_blocks[h] + h * d + c;
    const float* a = p.ape + h * d + c;
    for (std::int64_t i = 0; i < S; ++i, s += stride, v += stride, a += rw) {
      if constexpr (prefetch) {
        PHASEKV_UNROLL
        for (int b = 0; b < kStepBytes; b += kLineBytes) {
          dsv4::detail::prefetch_ahead(pf_score, pf_offset + b);
          dsv4::detail::prefetch_ahead(pf_kv, pf_offset + b);
        }
        pf_offset += kStepBytes;
      }
      PHASEKV_UNROLL
      for (int k = 0; k < NV; ++k) {
        const V z = O::add(O::load(s + k * W), O::load(a + k * W));
        const V w = exp_nonpositive<O>(O::add(z, nm[k]));
        den[k] = O::add(den[k], w);
        acc[k] = O::fma(w, O::load(v + k * W), acc[k]);
      }
    }
  }
  PHASEKV_UNROLL
  for (int k = 0; k < NV; ++k) O::store(out + c + k * W, O::div(acc[k], den[k]));
  pf.offset = pf_offset;
}

// Pools one entry. kv_blocks[h] / score_blocks[h] point to row 0 of the block seen through
// half h (S rows `stride` elements apart) or are null when that block is absent (before
// token 0). Channels outer, in blocks of kBlockVectors vectors held in registers across the
// window's rows (then single vectors, then single channels); rows inner. Kept out of line so
// that the batch and the streaming path run one copy of the code and agree bit for bit.
template <class T>
PHASEKV_NOINLINE void pool_entry(const dsv4::CompressorParams& p, const T* const* kv_blocks,
                                 const T* const* score_blocks, std::int64_t stride, float* out) {
  constexpr std::int64_t C = kBlockVectors * Wide::W;
  const std::int64_t d = p.dim;
  // the row steps of the wide blocks cover coff * S * C elements each, S * (coff * d) in all:
  // the block after the last one (S rows of `stride`; equal to coff * d in every caller)
  PoolPrefetch<T> pf{score_blocks[p.coff - 1], kv_blocks[p.coff - 1],
                     p.ratio * stride * static_cast<std::int64_t>(sizeof(T))};
  std::int64_t c = 0;
  for (; c + C <= d; c += C)
    pool_block<Wide, kBlockVectors, true>(p, kv_blocks, score_blocks, stride, c, out, pf);
  for (; c + Wide::W <= d; c += Wide::W)
    pool_block<Wide, 1, false>(p, kv_blocks, score_blocks, stride, c, out, pf);
  for (; c < d; ++c) pool_block<One, 1, false>(p, kv_blocks, score_blocks, stride, c, out, pf);
}

}  // namespace dsv4pool
}  // namespace PHASEKV_TGT_NS
}  // namespace detail
PHASEKV_NAMESPACE_END
