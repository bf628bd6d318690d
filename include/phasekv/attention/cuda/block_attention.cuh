/// @file
/// @brief The block-level attention loop shared by the split-KV decode kernel and the generic
/// prefill kernel: a thread block attends the query heads of one KV-head group to a contiguous
/// range of the items of a VisibleKV, with an online softmax over tiles of keys.
///
/// Per tile of up to 64 items (AttnSmem::tile) the block (1) loads K and V rows into shared memory
/// (16-byte vector loads when the views allow it), (2) computes one logit per (query head, key)
/// with the lanes of a warp on consecutive keys, (3) updates the per-head OnlineSoftmax state
/// (cub::WarpReduce for the tile max and the tile sum), (4) rescales and accumulates
/// `sum_t p_t v_t` with one thread per pair of value channels serving all heads (per (head,
/// channel) when d_v is odd). K/V tiles are therefore read
/// from global memory once for all the query heads of the group.
#pragma once

#include <cuda_runtime.h>

#include <cub/warp/warp_reduce.cuh>

#include <cstddef>
#include <cstdint>

#include "phasekv/attention/cuda/vector_load.cuh"
#include "phasekv/attention/args.hpp"
#include "phasekv/attention/softmax_state.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/view.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cuda::detail {

/// Threads per attention block (4 warps).
inline constexpr int kAttnThreads = 128;
/// Warps per attention block.
inline constexpr int kAttnWarps = kAttnThreads / 32;
/// Query heads of one KV head handled by one block (larger groups use several blocks).
inline constexpr int kMaxHeadsPerBlock = 8;
/// Largest dynamic shared memory a launcher asks for (the sm_90 opt-in limit).
inline constexpr std::size_t kMaxDynamicSmem = 227 * 1024;
/// Dynamic shared memory available without an opt-in.
inline constexpr std::size_t kDefaultSmem = 48 * 1024;
/// The head shapes the CUDA launchers accept (q_heads, d_k, d_v; grid and shared-memory
/// limits), for phasekv::detail::check_head_shape.
inline constexpr phasekv::detail::HeadShapeLimits kHeadShapeLimits{
    std::int64_t{1} << 24, "must be in [1, 2^24]", 4096, "must be in [1, 4096]"};

/// Maximum of two floats (a CUB reduction operator).
struct MaxOp {
  /// Returns the larger of `a` and `b`.
  __device__ PHASEKV_FORCEINLINE float operator()(float a, float b) const { return a > b ? a : b; }
};

/// Carve-up of the dynamic shared memory of an attention block, computed identically on the
/// host (to size the launch) and on the device (to find the arrays).
struct AttnSmem {
  int heads = 1;     ///< Query heads per block (maximum over the blocks of a launch).
  int d_k = 0;       ///< Key dimension.
  int d_v = 0;       ///< Value dimension.
  int tile = 64;     ///< Keys per tile (32 or 64).
  int k_stride = 0;  ///< Padded K row stride in shared memory (elements).
  std::size_t off_q = 0, off_k = 0, off_v = 0, off_s = 0, off_acc = 0, off_state = 0,
              off_rescale = 0, off_rowk = 0, off_rowv = 0, off_kind = 0;  ///< Byte offsets.
  std::size_t bytes = 0;                                                  ///< Total bytes.

  /// Layout for `heads` query heads, dims `d_k`/`d_v`, elements of `elem_bytes` bytes and a
  /// tile of `tile` keys.
  PHASEKV_HOST_DEVICE static AttnSmem make(int heads, int d_k, int d_v, int elem_bytes, int tile) {
    AttnSmem L;
    L.heads = heads;
    L.d_k = d_k;
    L.d_v = d_v;
    L.tile = tile;
    // Odd number of 4-byte words per K row: lanes reading one column of consecutive rows hit
    // distinct banks.
    std::size_t words = (static_cast<std::size_t>(d_k) * elem_bytes + 3) / 4;
    if (words % 2 == 0) ++words;
    L.k_stride = static_cast<int>(words * 4 / elem_bytes);
    auto take = [&L](std::size_t n) {
      const std::size_t off = (L.bytes + 15) / 16 * 16;
      L.bytes = off + n;
      return off;
    };
    const auto h = static_cast<std::size_t>(heads), t = static_cast<std::size_t>(tile);
    L.off_q = take(h * d_k * sizeof(float));
    L.off_k = take(t * L.k_stride * elem_bytes);
    L.off_v = take(t * d_v * elem_bytes);
    L.off_s = take(h * t * sizeof(float));
    L.off_acc = take(h * d_v * sizeof(float));
    L.off_state = take(h * sizeof(OnlineSoftmax));
    L.off_rescale = take(h * sizeof(float));
    L.off_rowk = take(t * sizeof(void*));
    L.off_rowv = take(t * sizeof(void*));
    L.off_kind = take(t);
    L.bytes = (L.bytes + 15) / 16 * 16;
    return L;
  }

  /// Picks a 64-key tile, or a 32-key tile when the 64-key layout exceeds 100 KiB.
  PHASEKV_HOST_DEVICE static AttnSmem choose(int heads, int d_k, int d_v, int elem_bytes) {
    AttnSmem L = make(heads, d_k, d_v, elem_bytes, 64);
    if (L.bytes > 100 * 1024) L = make(heads, d_k, d_v, elem_bytes, 32);
    return L;
  }
};

/// Loads two adjacent elements `p[0]`, `p[1]` as floats with one shared-memory access (`p`
/// must be 4-byte aligned for 16-bit types, 8-byte aligned for float).
template <class T>
__device__ PHASEKV_FORCEINLINE void load_pair(const T* p, float& a, float& b) {
  if constexpr (sizeof(T) == 2) {
    const std::uint32_t w = *reinterpret_cast<const std::uint32_t*>(p);
    a = to_float(T{static_cast<std::uint16_t>(w & 0xffffu)});
    b = to_float(T{static_cast<std::uint16_t>(w >> 16)});
  } else {
    const float2 f = *reinterpret_cast<const float2*>(p);
    a = f.x;
    b = f.y;
  }
}

/// Pointers to the K row and V row of item `item` of `kv` for KV head `kh`, and the kind of
/// its segment. Unrolled over the (at most 4) segments so the views stay in parameter space.
template <class T>
__device__ PHASEKV_FORCEINLINE void locate_item(const VisibleKV<T>& kv, std::int64_t item,
                                                std::int64_t kh, const T*& k_row, const T*& v_row,
                                                SegmentKind& kind) {
  k_row = nullptr;
  v_row = nullptr;
  kind = SegmentKind::raw;
  std::int64_t off = item;
#pragma unroll
  for (int s = 0; s < VisibleKV<T>::kMaxSegments; ++s) {
    if (s < kv.count && k_row == nullptr) {
      const std::int64_t n = kv.segments[s].keys.tokens;
      if (off < n) {
        k_row = kv.segments[s].keys.ptr(off, kh);
        v_row = kv.segments[s].values.ptr(off, kh);
        kind = kv.segments[s].kind;
      } else {
        off -= n;
      }
    }
  }
}

/// Attends `heads` query heads (their float queries already in shared memory at `L.off_q`,
/// `d_k` floats each) to items `[begin, end)` of `kv` for KV head `kh`. On return (after a
/// final __syncthreads) the shared arrays hold, per head g, the OnlineSoftmax state at
/// `L.off_state` and the unnormalized accumulator `sum_t exp(s_t - max) v_t` at `L.off_acc`.
/// `vec` selects 16-byte loads (see RowLoader). Must be called by all kAttnThreads threads.
/// `kv` is a VisibleKV<T> or any row source `Source` for which an overload
/// `locate_item(const Source&, item, kh, k_row, v_row, kind)` is found by argument-dependent
/// lookup (the paged sequences of serving/cuda use one).
template <class T, class Variant, class Source>
__device__ void attend_items(const Source& kv, std::int64_t begin, std::int64_t end,
                             std::int64_t kh, int heads, const Variant& variant, const AttnSmem& L,
                             unsigned char* smem, bool vec) {
  using Loader = RowLoader<T>;
  using WarpReduce = cub::WarpReduce<float>;
  __shared__ typename WarpReduce::TempStorage warp_tmp[kAttnWarps];

  float* sq = reinterpret_cast<float*>(smem + L.off_q);
  T* sk = reinterpret_cast<T*>(smem + L.off_k);
  T* sv = reinterpret_cast<T*>(smem + L.off_v);
  float* ss = reinterpret_cast<float*>(smem + L.off_s);
  float* sacc = reinterpret_cast<float*>(smem + L.off_acc);
  OnlineSoftmax* sst = reinterpret_cast<OnlineSoftmax*>(smem + L.off_state);
  float* sres = reinterpret_cast<float*>(smem + L.off_rescale);
  const T** srowk = reinterpret_cast<const T**>(smem + L.off_rowk);
  const T** srowv = reinterpret_cast<const T**>(smem + L.off_rowv);
  unsigned char* skind = smem + L.off_kind;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int d_k = L.d_k, d_v = L.d_v, tile = L.tile, ks = L.k_stride;
  const int k_pieces = Loader::pieces(d_k, vec);
  const int v_pieces = Loader::pieces(d_v, vec);
  const int subs = tile / 32;

  for (int i = tid; i < heads * d_v; i += kAttnThreads) sacc[i] = 0.0f;
  for (int g = tid; g < heads; g += kAttnThreads) {
    sst[g] = OnlineSoftmax{};
    sres[g] = 1.0f;
  }

  for (std::int64_t base = begin; base < end; base += tile) {
    const std::int64_t left = end - base;
    const int count = left < tile ? static_cast<int>(left) : tile;
    // (0) row pointers of the tile.
    for (int r = tid; r < count; r += kAttnThreads) {
      const T* kr;
      const T* vr;
      SegmentKind kind;
      locate_item(kv, base + r, kh, kr, vr, kind);
      srowk[r] = kr;
      srowv[r] = vr;
      skind[r] = static_cast<unsigned char>(kind);
    }
    __syncthreads();
    // (1) K and V rows into shared memory.
    for (int idx = tid; idx < count * k_pieces; idx += kAttnThreads) {
      const int r = idx / k_pieces;
      Loader::load_piece(srowk[r], sk + static_cast<std::size_t>(r) * ks, idx - r * k_pieces, vec);
    }
    for (int idx = tid; idx < count * v_pieces; idx += kAttnThreads) {
      const int r = idx / v_pieces;
      Loader::load_piece(srowv[r], sv + static_cast<std::size_t>(r) * d_v, idx - r * v_pieces, vec);
    }
    __syncthreads();
    // (2) logits: lanes on consecutive keys, warps over (head, 32-key slice) pairs.
    for (int pair = warp; pair < heads * subs; pair += kAttnWarps) {
      const int g = pair / subs;
      const int t = (pair - g * subs) * 32 + lane;
      float s = neg_inf();
      if (t < count) {
        const float* qg = sq + static_cast<std::size_t>(g) * d_k;
        const T* kr = sk + static_cast<std::size_t>(t) * ks;
        float dot = 0.0f;
        bool done = false;
        if constexpr (sizeof(T) == 2) {
          if ((d_k & 1) == 0) {
            // Two 16-bit keys per 32-bit shared load (rows are 4-byte aligned: the padded
            // stride is a whole number of words), the same summation order as below.
            const std::uint32_t* k2 = reinterpret_cast<const std::uint32_t*>(kr);
            const float2* q2 = reinterpret_cast<const float2*>(qg);
            for (int i = 0; i < d_k / 2; ++i) {
              const std::uint32_t w = k2[i];
              const float2 qq = q2[i];
              dot = fmaf(qq.x, to_float(T{static_cast<std::uint16_t>(w & 0xffffu)}), dot);
              dot = fmaf(qq.y, to_float(T{static_cast<std::uint16_t>(w >> 16)}), dot);
            }
            done = true;
          }
        }
        if (!done)
          for (int i = 0; i < d_k; ++i) dot = fmaf(qg[i], to_float(kr[i]), dot);
        s = variant.logit(dot, static_cast<SegmentKind>(skind[t]));
      }
      ss[g * tile + t] = s;
    }
    __syncthreads();
    // (3) online-softmax update per head: tile max, weights, tile sum.
    for (int g = warp; g < heads; g += kAttnWarps) {
      float m = neg_inf();
      for (int t = lane; t < tile; t += 32) m = MaxOp{}(m, ss[g * tile + t]);
      m = WarpReduce(warp_tmp[warp]).Reduce(m, MaxOp{});
      m = __shfl_sync(0xffffffffu, m, 0);
      __syncwarp();
      OnlineSoftmax st = sst[g];
      const float c = st.raise_max(m);
      const bool none = st.max == neg_inf();
      float sum = 0.0f;
      for (int t = lane; t < tile; t += 32) {
        const float p = none ? 0.0f : expf(ss[g * tile + t] - st.max);
        ss[g * tile + t] = p;
        sum += p;
      }
      sum = WarpReduce(warp_tmp[warp]).Sum(sum);
      sum = __shfl_sync(0xffffffffu, sum, 0);
      __syncwarp();
      st.denom += sum;
      if (lane == 0) {
        sst[g] = st;
        sres[g] = c;
      }
    }
    __syncthreads();
    // (4) rescale and accumulate the values. Even d_v: one thread per pair of channels for
    // all heads (one shared load of two values serves every head); odd d_v: one thread per
    // (head, channel). Both sum in the same order: acc * rescale, then key by key.
    if ((d_v & 1) == 0) {
      for (int pi = tid; pi < d_v / 2; pi += kAttnThreads) {
        const int i = 2 * pi;
        float a0[kMaxHeadsPerBlock], a1[kMaxHeadsPerBlock];
#pragma unroll
        for (int g = 0; g < kMaxHeadsPerBlock; ++g) {
          a0[g] = g < heads ? sacc[g * d_v + i] * sres[g] : 0.0f;
          a1[g] = g < heads ? sacc[g * d_v + i + 1] * sres[g] : 0.0f;
        }
        for (int t = 0; t < count; ++t) {
          float v0, v1;
          load_pair(sv + static_cast<std::size_t>(t) * d_v + i, v0, v1);
#pragma unroll
          for (int g = 0; g < kMaxHeadsPerBlock; ++g) {
            if (g < heads) {
              const float w = ss[g * tile + t];
              a0[g] = fmaf(w, v0, a0[g]);
              a1[g] = fmaf(w, v1, a1[g]);
            }
          }
        }
#pragma unroll
        for (int g = 0; g < kMaxHeadsPerBlock; ++g) {
          if (g < heads) {
            sacc[g * d_v + i] = a0[g];
            sacc[g * d_v + i + 1] = a1[g];
          }
        }
      }
    } else {
      for (int slot = tid; slot < heads * d_v; slot += kAttnThreads) {
        const int g = slot / d_v;
        const int i = slot - g * d_v;
        const float* p = ss + g * tile;
        float a = sacc[slot] * sres[g];
        for (int t = 0; t < count; ++t)
          a = fmaf(p[t], to_float(sv[static_cast<std::size_t>(t) * d_v + i]), a);
        sacc[slot] = a;
      }
    }
    __syncthreads();
  }
  __syncthreads();
}

/// Final value of one output element and the head's log-sum-exp from a finished softmax state
/// (accumulator `acc`, state `st`): normalizes, then applies the sink (if any) exactly as
/// phasekv::apply_sink does. Empty states give 0 (and lse -inf, or the sink).
template <class Variant>
__device__ PHASEKV_FORCEINLINE float finish_element(float acc, const OnlineSoftmax& st,
                                                    const Variant& variant, std::int64_t h,
                                                    float& lse) {
  float o = st.empty() ? 0.0f : acc / st.denom;
  lse = st.lse();
  if (variant.has_sink()) apply_sink(&o, lse, variant.sink(h), 1);
  return o;
}

}  // namespace cuda::detail
PHASEKV_NAMESPACE_END
