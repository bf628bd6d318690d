// phasekv: the DeepSeek-V4 lightning indexer's scoring kernel of one target pass (see
// core/foreach_target.inc), included by dsv4/indexer.hpp once per pass. No include guard, no
// includes. Explicit `Vec<Arch>` code (dispatch in indexer.hpp): a tile of HB heads x KB keys
// per pass over the channels, so that each key chunk loaded feeds HB multiply-adds and each
// query chunk KB, all from registers.

PHASEKV_NAMESPACE_BEGIN
namespace cpu {
namespace detail {
namespace PHASEKV_TGT_NS {

/// Heads of one indexer tile on `Arch` (HB * KB accumulators, a multiple of W, in registers).
template <class Arch>
constexpr int index_tile_heads() {
  return Vec<Arch>::W == 1 ? 2 : (Vec<Arch>::regs >= 32 ? 4 : 2);
}
/// Keys of one indexer tile on `Arch`.
template <class Arch>
constexpr int index_tile_keys() {
  return Vec<Arch>::W == 1 ? 2 : 4;
}

/// a * b + c: fused on the vector paths; a multiply and an add on the scalar one (std::fma
/// would be a library call on x86 CPUs without FMA, the only ones that run it).
template <class Arch>
PHASEKV_FORCEINLINE typename Vec<Arch>::V index_madd(typename Vec<Arch>::V a,
                                                     typename Vec<Arch>::V b,
                                                     typename Vec<Arch>::V c) {
  if constexpr (Vec<Arch>::W == 1)
    return a * b + c;
  else
    return Vec<Arch>::fma(a, b, c);
}

/// Scores I(j) of keys [0, count) for one query (see dsv4/indexer.hpp for the order of the
/// arithmetic). `q` is [heads, dim], `w` [heads]; `scratch` holds
/// dsv4::detail::index_scratch_floats(heads, dim) floats.
template <class Arch, class T>
PHASEKV_NOINLINE void dsv4_index_scores(Target, Arch, const dsv4::IndexerParams& p, const float* q,
                                        const float* w, const T* keys, std::int64_t key_stride,
                                        std::int64_t count, float* scores, float* scratch) {
  using O = Vec<Arch>;
  using V = typename O::V;
  constexpr int W = O::W;
  constexpr int HB = index_tile_heads<Arch>();
  constexpr int KB = index_tile_keys<Arch>();
  constexpr int N = HB * KB;  // accumulators of a tile: lane / slot i is head i / KB, key i % KB
  static_assert(N % W == 0, "an indexer tile must fill whole vectors");
  constexpr int NV = N / W;
  const std::int64_t H = p.heads, d = p.dim;
  const std::int64_t dp = dsv4::detail::index_padded_dim(d);  // a multiple of 16 >= W
  const std::int64_t hp = (H + HB - 1) / HB * HB;
  // the arrays 64-byte aligned (vector loads that split cache lines cost about a fifth)
  const std::uintptr_t misalign = reinterpret_cast<std::uintptr_t>(scratch) % 64;
  float* qs = scratch + (64 - misalign) % 64 / sizeof(float);  // [hp, dp] query heads, padded
  float* kb = qs + hp * dp;        // [KB, dp] the key block in f32, zero padded
  float* wx = kb + KB * dp;        // [hp / HB, N] w of each tile slot's head (0: padding)
  float* part = wx + hp / HB * N;  // [N] a block's per-slot head sums
  for (std::int64_t h = 0; h < hp; ++h) {
    float* dst = qs + h * dp;
    std::int64_t c = 0;
    if (h < H)
      for (; c < d; ++c) dst[c] = q[h * d + c];
    for (; c < dp; ++c) dst[c] = 0.0f;
  }
  for (std::int64_t g = 0; g < hp / HB; ++g)
    for (int i = 0; i < N; ++i) {
      const std::int64_t h = g * HB + i / KB;
      wx[g * N + i] = h < H ? w[h] : 0.0f;
    }
  const std::int64_t dv = d / W * W;  // channels converted with vector loads
  for (std::int64_t j0 = 0; j0 < count; j0 += KB) {
    const std::int64_t nk = count - j0 < KB ? count - j0 : KB;
    // the keys two blocks ahead, into L2: a block computes for long enough that the hardware
    // prefetcher, which stops at page ends, leaves a miss per new page otherwise
    for (std::int64_t k = j0 + 2 * KB; k < j0 + 3 * KB && k < count; ++k)
      phasekv::detail::prefetch_l2(keys + k * key_stride, d * static_cast<std::int64_t>(sizeof(T)));
    for (std::int64_t k = 0; k < KB; ++k) {  // the block's keys, converted once
      float* dst = kb + k * dp;
      std::int64_t c = 0;
      if (k < nk) {
        const T* src = keys + (j0 + k) * key_stride;
        for (; c < dv; c += W) O::store(dst + c, O::load(src + c));
        for (; c < d; ++c) dst[c] = phasekv::to_float(src[c]);
      }
      for (; c < dp; ++c) dst[c] = 0.0f;
    }
    V sum[NV];  // per slot: w * ReLU(dot) summed over the slot's heads (h = slot / KB mod HB)
    PHASEKV_UNROLL
    for (int v = 0; v < NV; ++v) sum[v] = O::zero();
    for (std::int64_t h0 = 0; h0 < hp; h0 += HB) {
      V acc[N];
      PHASEKV_UNROLL
      for (int i = 0; i < N; ++i) acc[i] = O::zero();
      const float* qh = qs + h0 * dp;
      for (std::int64_t c = 0; c < dp; c += W) {
        V kv[KB];
        PHASEKV_UNROLL
        for (int k = 0; k < KB; ++k) {
          kv[k] = O::load(kb + k * dp + c);
          O::pin(kv[k]);
        }
        PHASEKV_UNROLL
        for (int hh = 0; hh < HB; ++hh) {
          V qv = O::load(qh + hh * dp + c);
          O::pin(qv);
          PHASEKV_UNROLL
          for (int k = 0; k < KB; ++k)
            acc[hh * KB + k] = index_madd<Arch>(qv, kv[k], acc[hh * KB + k]);
        }
      }
      const float* wg = wx + h0 / HB * N;
      PHASEKV_UNROLL
      for (int v = 0; v < NV; ++v) {
        const V dot = O::hsumw(acc + v * W);  // lane l: the dot of slot v * W + l
        sum[v] = index_madd<Arch>(O::max(dot, O::zero()), O::load(wg + v * W), sum[v]);
      }
    }
    PHASEKV_UNROLL
    for (int v = 0; v < NV; ++v) O::store(part + v * W, sum[v]);
    for (std::int64_t k = 0; k < nk; ++k) {
      float s = part[k];
      for (int hh = 1; hh < HB; ++hh) s += part[hh * KB + k];
      scores[j0 + k] = s;
    }
  }
}

}  // namespace PHASEKV_TGT_NS
}  // namespace detail
}  // namespace cpu
PHASEKV_NAMESPACE_END
