/// @file
/// @brief Prefill attention over a compressed cache on CUDA: `num_queries` consecutive query
/// tokens, each with its own visible set (the prefix, entries `j < J(t + 1)`, raw positions
/// `[visible(t + 1, L).raw_begin, t]`), exactly as phasekv::reference_prefill.
///
/// Two paths:
/// - **tensor cores** (detail::prefill_mma_kernel): `mma.sync.m16n8k16` with f32 accumulation,
///   used when T is bf16_t or f16_t, `d_k == d_v` is 64, 128 or 256, and the device is sm_80 or
///   newer. A block handles 64 (query token, query head) rows of one KV head (4 warps x 16 rows)
///   and walks 64-key tiles over the union of the rows' visible sets, masking per row. The
///   float queries and the softmax weights are rounded to T before the multiplications (see
///   docs/cuda.md for the error bound this implies).
/// - **generic** (detail::prefill_generic_kernel): any element type and head dims, one block per
///   (query token, KV head, group of up to 8 query heads), running the same block loop as the
///   decode kernel over that query's visible set in f32 (no split).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "phasekv/attention/cuda/block_attention.cuh"
#include "phasekv/attention/cuda/mma.cuh"
#include "phasekv/attention/cuda/status.cuh"
#include "phasekv/attention/cuda/vector_load.cuh"
#include "phasekv/attention/args.hpp"
#include "phasekv/attention/head_dims.hpp"
#include "phasekv/attention/params.hpp"
#include "phasekv/attention/softmax_state.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/view.hpp"
#include "phasekv/phase/geometry.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cuda {

/// Which prefill implementation a call uses.
enum class PrefillPath : std::uint8_t {
  automatic,   ///< Tensor cores when supported (bf16/f16, d_k == d_v in fast_head_dims, sm_80+).
  generic,     ///< Always the generic f32 path.
  tensor_core  ///< Tensor cores; the call fails with cudaErrorInvalidValue when unsupported.
};

/// Arguments of phasekv::cuda::prefill (the same meaning as phasekv::reference_prefill). All
/// pointers are device pointers, including the views and `variant.sinks`.
///
/// @tparam T    K/V storage type (float, bf16_t, f16_t).
/// @tparam OutT output storage type (float, bf16_t, f16_t).
/// @tparam Variant logit/sink variant.
template <class T, class OutT = float, class Variant = StandardVariant>
struct PrefillArgs {
  const float* q = nullptr;      ///< `[num_queries, q_heads, d_k]` queries, dense, float.
  std::int64_t num_queries = 0;  ///< Query tokens (0 is a no-op).
  std::int64_t q_heads = 0;      ///< Query heads (a multiple of the KV heads).
  std::int64_t first = 0;        ///< Position of query 0; query i sits at `first + i`.
  Geometry geometry;             ///< Compression geometry (W, S, O).
  std::int64_t local = 0;        ///< Local window L.
  StridedView<const T> raw_k;  ///< `[>= first + num_queries, kv_heads, d_k]` raw keys by position.
  StridedView<const T> raw_v;  ///< `[>= first + num_queries, kv_heads, d_v]` raw values.
  StridedView<const T> entry_k;  ///< `[>= J(first + num_queries), kv_heads, d_k]` entry keys.
  StridedView<const T> entry_v;  ///< `[>= J(first + num_queries), kv_heads, d_v]` entry values.
  Variant variant;               ///< Scale, soft cap, entry bias, sinks.
  OutT* out = nullptr;           ///< `[num_queries, q_heads, d_v]` output.
  float* lse = nullptr;          ///< `[num_queries, q_heads]` log-sum-exp, or null.
  PrefillPath path = PrefillPath::automatic;  ///< Implementation choice.
};

namespace detail {

/// Keys per tile and rows per block of the tensor-core path.
inline constexpr int kMmaTile = 64;

/// Arguments of the prefill kernels (built on the host).
template <class T, class OutT, class Variant>
struct PrefillParams {
  const float* q = nullptr;      ///< Queries.
  std::int64_t num_queries = 0;  ///< Query tokens.
  int q_heads = 0;               ///< Query heads.
  int group = 1;                 ///< G.
  int chunks = 1;                ///< Generic path: blocks per KV head along the group.
  std::int64_t first = 0;        ///< Position of query 0.
  Geometry geometry;             ///< Geometry.
  std::int64_t local = 0;        ///< Local window.
  StridedView<const T> raw_k, raw_v, entry_k, entry_v;  ///< Inputs.
  Variant variant;                                      ///< Variant.
  OutT* out = nullptr;                                  ///< Output.
  float* lse = nullptr;                                 ///< Log-sum-exp or null.
  AttnSmem smem;                                        ///< Generic path layout.
  std::size_t mma_smem = 0;  ///< Tensor-core path dynamic shared memory bytes.
  bool vec = false;          ///< 16-byte loads allowed.
};

/// The visible set of the query at position `t`, built on the device like
/// phasekv::reference_visible.
template <class T>
__device__ PHASEKV_FORCEINLINE VisibleKV<T> visible_at(const Geometry& g, std::int64_t local,
                                                       std::int64_t t,
                                                       const StridedView<const T>& raw_k,
                                                       const StridedView<const T>& raw_v,
                                                       const StridedView<const T>& entry_k,
                                                       const StridedView<const T>& entry_v) {
  const Visibility vis = g.visible(t + 1, local);
  VisibleKV<T> kv;
  kv.count = 0;
  if (vis.prefix_end > 0) {
    kv.segments[kv.count++] = KVSegment<T>{raw_k.slice(0, vis.prefix_end),
                                           raw_v.slice(0, vis.prefix_end), 0, SegmentKind::prefix};
  }
  if (vis.entries > 0) {
    kv.segments[kv.count++] = KVSegment<T>{
        entry_k.slice(0, vis.entries), entry_v.slice(0, vis.entries), 0, SegmentKind::compressed};
  }
  if (vis.raw_count() > 0) {
    kv.segments[kv.count++] =
        KVSegment<T>{raw_k.slice(vis.raw_begin, vis.raw_count()),
                     raw_v.slice(vis.raw_begin, vis.raw_count()), vis.raw_begin, SegmentKind::raw};
  }
  return kv;
}

/// Generic path: block (i, y) attends query token i, KV head y / chunks, up to 8 query heads.
template <class T, class OutT, class Variant>
__global__ void __launch_bounds__(kAttnThreads)
    prefill_generic_kernel(PrefillParams<T, OutT, Variant> p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const AttnSmem& L = p.smem;
  const std::int64_t i = blockIdx.x;
  const int kh = static_cast<int>(blockIdx.y) / p.chunks;
  const int g0 = (static_cast<int>(blockIdx.y) - kh * p.chunks) * kMaxHeadsPerBlock;
  const int heads = p.group - g0 < kMaxHeadsPerBlock ? p.group - g0 : kMaxHeadsPerBlock;
  const std::int64_t h0 = static_cast<std::int64_t>(kh) * p.group + g0;
  const std::int64_t row0 = i * p.q_heads + h0;
  const int tid = static_cast<int>(threadIdx.x);

  float* sq = reinterpret_cast<float*>(smem + L.off_q);
  for (int x = tid; x < heads * L.d_k; x += kAttnThreads) sq[x] = p.q[row0 * L.d_k + x];
  __syncthreads();
  const VisibleKV<T> kv =
      visible_at(p.geometry, p.local, p.first + i, p.raw_k, p.raw_v, p.entry_k, p.entry_v);
  attend_items<T>(kv, 0, kv.total(), kh, heads, p.variant, L, smem, p.vec);

  const float* sacc = reinterpret_cast<const float*>(smem + L.off_acc);
  const OnlineSoftmax* sst = reinterpret_cast<const OnlineSoftmax*>(smem + L.off_state);
  for (int slot = tid; slot < heads * L.d_v; slot += kAttnThreads) {
    const int g = slot / L.d_v;
    float l;
    const float o = finish_element(sacc[slot], sst[g], p.variant, h0 + g, l);
    p.out[(row0 + g) * L.d_v + (slot - g * L.d_v)] = from_float<OutT>(o);
  }
  if (p.lse != nullptr) {
    for (int g = tid; g < heads; g += kAttnThreads) {
      float l;
      (void)finish_element(0.0f, sst[g], p.variant, h0 + g, l);
      p.lse[row0 + g] = l;
    }
  }
}

/// Shared-memory bytes of the tensor-core path for head dim `D` and element size 2.
PHASEKV_HOST_DEVICE constexpr std::size_t mma_smem_bytes(int d) {
  // Q, K, V tiles of 64 rows with a padded stride of D + 8 elements, then per-key position,
  // kind and row pointers.
  return 3 * static_cast<std::size_t>(kMmaTile) * (d + 8) * 2 +
         static_cast<std::size_t>(kMmaTile) * (8 + 8 + 8 + 1);
}

/// Tensor-core path. Block (x, kh): rows `r in [64 x, 64 x + 64)` of KV head kh, where row r
/// is query token `r / G`, query head `kh * G + r % G`. Warp w owns rows `64 x + 16 w + [0, 16)`.
template <class T, class OutT, class Variant, int D>
__global__ void __launch_bounds__(kAttnThreads)
    prefill_mma_kernel(PrefillParams<T, OutT, Variant> p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kStride = D + 8;  // 4 (mod 32) words per row: conflict-free fragment loads
  constexpr int kTile = kMmaTile;
  constexpr int kNb = kTile / 8;  // 8-key column blocks of S
  constexpr int kDb = D / 8;      // 8-channel column blocks of O
  T* sq = reinterpret_cast<T*>(smem);
  T* sk = sq + kTile * kStride;
  T* sv = sk + kTile * kStride;
  std::int64_t* spos = reinterpret_cast<std::int64_t*>(sv + kTile * kStride);
  const T** srowk = reinterpret_cast<const T**>(spos + kTile);
  const T** srowv = srowk + kTile;
  unsigned char* skind = reinterpret_cast<unsigned char*>(srowv + kTile);

  using Loader = RowLoader<T>;
  const bool vec = p.vec;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  const std::int64_t kh = blockIdx.y;
  const std::int64_t G = p.group;
  const std::int64_t rows = p.num_queries * G;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.x) * kTile;
  const std::int64_t r_last = (r0 + kTile < rows ? r0 + kTile : rows) - 1;
  const Geometry& geo = p.geometry;

  // Queries of the block's rows, rounded to T (zeros for rows past the end).
  for (int x = tid; x < kTile * D; x += kAttnThreads) {
    const int rr = x / D, c = x - rr * D;
    const std::int64_t r = r0 + rr;
    float v = 0.0f;
    if (r < rows) {
      const std::int64_t tok = r / G, h = kh * G + r % G;
      v = p.q[(tok * p.q_heads + h) * D + c];
    }
    sq[rr * kStride + c] = from_float<T>(v);
  }

  // Visibility of this thread's two rows: gid and gid + 8 of the warp.
  std::int64_t n_row[2], j_row[2], rb_row[2];
  bool valid[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const std::int64_t r = r0 + warp * 16 + gid + 8 * k;
    valid[k] = r < rows;
    const std::int64_t n = p.first + (valid[k] ? r / G : 0) + 1;
    const Visibility vis = geo.visible(n, p.local);
    n_row[k] = n;
    j_row[k] = vis.entries;
    rb_row[k] = vis.raw_begin;
  }

  // Union of the visible sets of the block's tokens.
  const std::int64_t n_lo = p.first + r0 / G + 1;
  const std::int64_t n_hi = p.first + r_last / G + 1;
  const Visibility lo = geo.visible(n_lo, p.local);
  const Visibility hi = geo.visible(n_hi, p.local);
  const std::int64_t pe = hi.prefix_end;
  const std::int64_t ne = hi.entries;
  const std::int64_t raw_begin = lo.raw_begin > pe ? lo.raw_begin : pe;
  const std::int64_t nraw = n_hi > raw_begin ? n_hi - raw_begin : 0;
  const std::int64_t total = pe + ne + nraw;

  OnlineSoftmax st[2];
  float o[kDb][4];
#pragma unroll
  for (int b = 0; b < kDb; ++b) o[b][0] = o[b][1] = o[b][2] = o[b][3] = 0.0f;

  const int pieces = Loader::pieces(D, vec);
  const int psize = Loader::piece_size(vec);
  for (std::int64_t base = 0; base < total; base += kTile) {
    const int count = total - base < kTile ? static_cast<int>(total - base) : kTile;
    __syncthreads();  // previous tile fully consumed (and Q stored, on the first pass)
    for (int r = tid; r < kTile; r += kAttnThreads) {
      const std::int64_t item = base + r;
      SegmentKind kind = SegmentKind::raw;
      std::int64_t pos = 0;
      const T* kr = nullptr;
      const T* vr = nullptr;
      if (r < count) {
        if (item < pe) {
          kind = SegmentKind::prefix;
          pos = item;
          kr = p.raw_k.ptr(pos, kh);
          vr = p.raw_v.ptr(pos, kh);
        } else if (item < pe + ne) {
          kind = SegmentKind::compressed;
          pos = item - pe;
          kr = p.entry_k.ptr(pos, kh);
          vr = p.entry_v.ptr(pos, kh);
        } else {
          pos = raw_begin + (item - pe - ne);
          kr = p.raw_k.ptr(pos, kh);
          vr = p.raw_v.ptr(pos, kh);
        }
      }
      spos[r] = pos;
      skind[r] = static_cast<unsigned char>(kind);
      srowk[r] = kr;
      srowv[r] = vr;
    }
    __syncthreads();
    for (int x = tid; x < kTile * pieces; x += kAttnThreads) {
      const int r = x / pieces, piece = x - r * pieces;
      if (r < count) {
        Loader::load_piece(srowk[r], sk + r * kStride, piece, vec);
        Loader::load_piece(srowv[r], sv + r * kStride, piece, vec);
      } else {
        // Zero rows past the end so the multiplications read finite values.
        for (int e = 0; e < psize; ++e) {
          sk[r * kStride + piece * psize + e] = from_float<T>(0.0f);
          sv[r * kStride + piece * psize + e] = from_float<T>(0.0f);
        }
      }
    }
    __syncthreads();

    // S = Q K^T for the warp's 16 rows and the tile's 64 keys.
    float s[kNb][4];
#pragma unroll
    for (int nb = 0; nb < kNb; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
    const T* qw = sq + (warp * 16) * kStride;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t a[4];
      const int c = kk * 16 + 2 * tig;
      a[0] = *reinterpret_cast<const std::uint32_t*>(qw + gid * kStride + c);
      a[1] = *reinterpret_cast<const std::uint32_t*>(qw + (gid + 8) * kStride + c);
      a[2] = *reinterpret_cast<const std::uint32_t*>(qw + gid * kStride + c + 8);
      a[3] = *reinterpret_cast<const std::uint32_t*>(qw + (gid + 8) * kStride + c + 8);
#pragma unroll
      for (int nb = 0; nb < kNb; ++nb) {
        std::uint32_t b[2];
        const T* kr = sk + (nb * 8 + gid) * kStride + c;
        b[0] = *reinterpret_cast<const std::uint32_t*>(kr);
        b[1] = *reinterpret_cast<const std::uint32_t*>(kr + 8);
        mma_16816<T>(s[nb], a, b);
      }
    }

    // Logits, masks and the online softmax of the two rows.
    float rmax[2] = {neg_inf(), neg_inf()};
#pragma unroll
    for (int nb = 0; nb < kNb; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int k = e >> 1;
        const int t = nb * 8 + 2 * tig + (e & 1);
        const SegmentKind kind = static_cast<SegmentKind>(skind[t]);
        const std::int64_t pos = spos[t];
        bool vis = valid[k] && t < count;
        if (kind == SegmentKind::compressed)
          vis = vis && pos < j_row[k];
        else if (kind == SegmentKind::prefix)
          vis = vis && pos < n_row[k];
        else
          vis = vis && pos >= rb_row[k] && pos < n_row[k];
        const float x = vis ? p.variant.logit(s[nb][e], kind) : neg_inf();
        s[nb][e] = x;
        rmax[k] = MaxOp{}(rmax[k], x);
      }
    }
    float scale_o[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      rmax[k] = MaxOp{}(rmax[k], __shfl_xor_sync(0xffffffffu, rmax[k], 1));
      rmax[k] = MaxOp{}(rmax[k], __shfl_xor_sync(0xffffffffu, rmax[k], 2));
      scale_o[k] = st[k].raise_max(rmax[k]);
    }
    float rsum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nb = 0; nb < kNb; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int k = e >> 1;
        const float w = st[k].max == neg_inf() ? 0.0f : expf(s[nb][e] - st[k].max);
        s[nb][e] = w;
        rsum[k] += w;
      }
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      rsum[k] += __shfl_xor_sync(0xffffffffu, rsum[k], 1);
      rsum[k] += __shfl_xor_sync(0xffffffffu, rsum[k], 2);
      st[k].denom += rsum[k];
    }
#pragma unroll
    for (int b = 0; b < kDb; ++b) {
      o[b][0] *= scale_o[0];
      o[b][1] *= scale_o[0];
      o[b][2] *= scale_o[1];
      o[b][3] *= scale_o[1];
    }

    // O += P V: the S accumulators become the A fragments of P (rounded to T).
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      std::uint32_t a[4];
      a[0] = pack2(from_float<T>(s[2 * kk][0]), from_float<T>(s[2 * kk][1]));
      a[1] = pack2(from_float<T>(s[2 * kk][2]), from_float<T>(s[2 * kk][3]));
      a[2] = pack2(from_float<T>(s[2 * kk + 1][0]), from_float<T>(s[2 * kk + 1][1]));
      a[3] = pack2(from_float<T>(s[2 * kk + 1][2]), from_float<T>(s[2 * kk + 1][3]));
      const int t0 = kk * 16 + 2 * tig;
#pragma unroll
      for (int b = 0; b < kDb; ++b) {
        const int c = b * 8 + gid;
        std::uint32_t bv[2];
        bv[0] = pack2(sv[t0 * kStride + c], sv[(t0 + 1) * kStride + c]);
        bv[1] = pack2(sv[(t0 + 8) * kStride + c], sv[(t0 + 9) * kStride + c]);
        mma_16816<T>(o[b], a, bv);
      }
    }
  }

  // Epilogue: normalize, sink, store.
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    if (!valid[k]) continue;
    const std::int64_t r = r0 + warp * 16 + gid + 8 * k;
    const std::int64_t tok = r / G, h = kh * G + r % G;
    const std::int64_t row = tok * p.q_heads + h;
#pragma unroll
    for (int b = 0; b < kDb; ++b) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float l;
        const float v = finish_element(o[b][2 * k + e], st[k], p.variant, h, l);
        p.out[row * D + b * 8 + 2 * tig + e] = from_float<OutT>(v);
      }
    }
    if (p.lse != nullptr && tig == 0) {
      float l;
      (void)finish_element(0.0f, st[k], p.variant, h, l);
      p.lse[row] = l;
    }
  }
}

template <class Kernel>
cudaError_t set_smem(Kernel kernel, std::size_t bytes) {
  if (bytes <= kDefaultSmem) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

template <class T, class OutT, class Variant, int D>
cudaError_t launch_prefill_mma(const PrefillParams<T, OutT, Variant>& p, int kv_heads,
                               cudaStream_t stream) {
  auto kernel = prefill_mma_kernel<T, OutT, Variant, D>;
  const std::size_t bytes = mma_smem_bytes(D);
  const cudaError_t e = set_smem(kernel, bytes);
  if (e != cudaSuccess) return e;
  const std::int64_t blocks = ceil_div(p.num_queries * p.group, kMmaTile);
  kernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(kv_heads)), kAttnThreads,
           bytes, stream>>>(p);
  return cudaGetLastError();
}

template <class T, class OutT, class Variant>
cudaError_t launch_prefill_generic(const PrefillParams<T, OutT, Variant>& p, int kv_heads,
                                   cudaStream_t stream) {
  auto kernel = prefill_generic_kernel<T, OutT, Variant>;
  const cudaError_t e = set_smem(kernel, p.smem.bytes);
  if (e != cudaSuccess) return e;
  kernel<<<dim3(static_cast<unsigned>(p.num_queries), static_cast<unsigned>(kv_heads * p.chunks)),
           kAttnThreads, p.smem.bytes, stream>>>(p);
  return cudaGetLastError();
}

/// True when T has a tensor-core path (bf16_t, f16_t).
template <class T>
inline constexpr bool has_mma_v = element_traits<T>::kind != ElementKind::f32;

}  // namespace detail

/// True when the tensor-core path supports these arguments' types and head dims (it also
/// needs an sm_80+ device, which only the launcher checks).
template <class T, class OutT, class Variant>
bool prefill_tensor_core_supported(const PrefillArgs<T, OutT, Variant>& a) {
  return detail::has_mma_v<T> && a.raw_k.dim == a.raw_v.dim && is_fast_head_dim(a.raw_k.dim);
}

/// Validates prefill arguments on the host without touching the device; throws
/// phasekv::invalid_argument (or a subclass) naming the argument and its value.
template <class T, class OutT, class Variant>
void check_prefill_args(const PrefillArgs<T, OutT, Variant>& a) {
  const char* where = "phasekv::cuda::prefill";
  phasekv::detail::check_arg(a.num_queries >= 0 && a.num_queries <= (std::int64_t{1} << 31) - 1,
                             where, "num_queries", a.num_queries, "must be in [0, 2^31 - 1]");
  phasekv::detail::check_arg(a.first >= 0 && a.first <= (std::int64_t{1} << 40), where, "first",
                             a.first, "must be in [0, 2^40]");
  Geometry::check_local(where, "local", a.local);
  check_view(a.raw_k, where, "raw_k");
  const std::int64_t kvh = a.raw_k.heads;
  phasekv::detail::check_arg(a.q_heads >= 1 && a.q_heads <= detail::kHeadShapeLimits.max_heads,
                             where, "q_heads", a.q_heads,
                             detail::kHeadShapeLimits.heads_requirement);
  phasekv::detail::check_arg<shape_error>(kvh >= 1 && a.q_heads % kvh == 0, where, "raw_k.heads",
                                          kvh, "must be >= 1 and divide q_heads");
  phasekv::detail::check_arg(a.raw_k.dim >= 1 && a.raw_k.dim <= detail::kHeadShapeLimits.max_dim,
                             where, "raw_k.dim", a.raw_k.dim,
                             detail::kHeadShapeLimits.dim_requirement);
  phasekv::detail::check_arg(a.raw_v.dim >= 1 && a.raw_v.dim <= detail::kHeadShapeLimits.max_dim,
                             where, "raw_v.dim", a.raw_v.dim,
                             detail::kHeadShapeLimits.dim_requirement);
  phasekv::detail::KVShape shape;
  shape.heads = kvh;
  shape.d_k = a.raw_k.dim;
  shape.d_v = a.raw_v.dim;
  shape.heads_name = "raw_k.heads";
  shape.d_k_name = "raw_k.dim";
  shape.d_v_name = "raw_v.dim";
  const std::int64_t n_end = a.first + a.num_queries;
  phasekv::detail::check_kv_views(where, "raw_k", a.raw_k, "raw_v", a.raw_v, shape, n_end,
                                  "must be >= first + num_queries");
  const std::int64_t need = a.geometry.complete_windows(n_end);
  if (need > 0) {
    phasekv::detail::check_kv_views(where, "entry_k", a.entry_k, "entry_v", a.entry_v, shape, need,
                                    "must hold J(first + num_queries)");
  } else {
    check_view(a.entry_k, where, "entry_k");
    check_view(a.entry_v, where, "entry_v");
  }
  phasekv::detail::check_arg(a.num_queries == 0 || a.q != nullptr, where, "q", "null",
                             "must point to device memory");
  phasekv::detail::check_arg(a.num_queries == 0 || a.out != nullptr, where, "out", "null",
                             "must point to device memory");
  a.variant.check(where);
  phasekv::detail::check_arg(a.path != PrefillPath::tensor_core || prefill_tensor_core_supported(a),
                             where, "path", "tensor_core",
                             "needs bf16/f16 K/V and d_k == d_v in {64, 128, 256}");
  const std::int64_t group = a.q_heads / kvh;
  const std::int64_t chunks = detail::ceil_div(group, detail::kMaxHeadsPerBlock);
  phasekv::detail::check_arg(kvh * chunks <= 65535, where, "raw_k.heads", kvh,
                             "kv_heads * ceil(G / 8) must be <= 65535 (grid limit)");
  phasekv::detail::check_arg(
      detail::ceil_div(a.num_queries * group, detail::kMmaTile) <= (std::int64_t{1} << 31) - 1,
      where, "num_queries", a.num_queries, "num_queries * G / 64 exceeds the grid limit");
  const detail::AttnSmem L = detail::AttnSmem::choose(
      static_cast<int>(group < detail::kMaxHeadsPerBlock ? group : detail::kMaxHeadsPerBlock),
      static_cast<int>(a.raw_k.dim), static_cast<int>(a.raw_v.dim), static_cast<int>(sizeof(T)));
  phasekv::detail::check_arg(L.bytes <= detail::kMaxDynamicSmem, where, "raw_k.dim + raw_v.dim",
                             a.raw_k.dim + a.raw_v.dim,
                             "head dims need more shared memory than a block has (227 KiB)");
}

/// Prefill attention (see the file description). Needs no workspace. Enqueues on `stream`;
/// allocates nothing; does not synchronize. For the automatic path choice it reads the
/// current device's compute capability (cudaDeviceGetAttribute).
///
/// @return `cudaSuccess`; `cudaErrorInvalidValue` for rejected arguments (message in
///         phasekv::cuda::last_error_message(), nothing launched); or a CUDA error.
template <class T, class OutT, class Variant>
cudaError_t prefill(const PrefillArgs<T, OutT, Variant>& args, cudaStream_t stream = nullptr) {
  cudaError_t e = detail::validate_into_status([&] { check_prefill_args(args); });
  if (e != cudaSuccess) return e;
  if (args.num_queries == 0) return cudaSuccess;

  detail::PrefillParams<T, OutT, Variant> p;
  p.q = args.q;
  p.num_queries = args.num_queries;
  p.q_heads = static_cast<int>(args.q_heads);
  const std::int64_t kvh = args.raw_k.heads;
  p.group = static_cast<int>(args.q_heads / kvh);
  p.chunks = static_cast<int>(detail::ceil_div(p.group, detail::kMaxHeadsPerBlock));
  p.first = args.first;
  p.geometry = args.geometry;
  p.local = args.local;
  p.raw_k = args.raw_k;
  p.raw_v = args.raw_v;
  p.entry_k = args.entry_k;
  p.entry_v = args.entry_v;
  p.variant = args.variant;
  p.out = args.out;
  p.lse = args.lse;
  p.smem = detail::AttnSmem::choose(
      p.group < detail::kMaxHeadsPerBlock ? p.group : detail::kMaxHeadsPerBlock,
      static_cast<int>(args.raw_k.dim), static_cast<int>(args.raw_v.dim),
      static_cast<int>(sizeof(T)));
  const std::int64_t d_k = args.raw_k.dim, d_v = args.raw_v.dim;
  const bool vec = (d_k * static_cast<std::int64_t>(sizeof(T))) % kVectorBytes == 0 &&
                   (d_v * static_cast<std::int64_t>(sizeof(T))) % kVectorBytes == 0 &&
                   vector_loadable(args.raw_k) && vector_loadable(args.raw_v) &&
                   vector_loadable(args.entry_k) && vector_loadable(args.entry_v);

  bool use_mma = false;
  if (args.path != PrefillPath::generic && prefill_tensor_core_supported(args)) {
    int dev = 0, major = 0;
    e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e != cudaSuccess) return e;
    use_mma = major >= 8;
    if (!use_mma && args.path == PrefillPath::tensor_core) {
      detail::last_message_storage() =
          "phasekv::cuda::prefill: path = tensor_core is invalid (needs an sm_80+ device)";
      return cudaErrorInvalidValue;
    }
  }
  const int kv_heads = static_cast<int>(kvh);
  p.vec = vec;
  if constexpr (detail::has_mma_v<T>) {
    if (use_mma) {
      p.mma_smem = detail::mma_smem_bytes(static_cast<int>(d_k));
      // one instantiation per fast head dim; d_k is one (prefill_tensor_core_supported)
      return dispatch_head_dim(d_k, [&](auto dim) -> cudaError_t {
        constexpr int D = decltype(dim)::value;
        if constexpr (D == 0) {
          return cudaErrorInvalidValue;
        } else {
          return detail::launch_prefill_mma<T, OutT, Variant, D>(p, kv_heads, stream);
        }
      });
    }
  }
  return detail::launch_prefill_generic<T, OutT, Variant>(p, kv_heads, stream);
}

}  // namespace cuda
PHASEKV_NAMESPACE_END
