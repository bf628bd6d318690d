/// @file
/// @brief The split-KV merge kernel: combines per-split partial results (normalized output +
/// log-sum-exp) of each query head by log-sum-exp, then applies the sink once.
#pragma once

#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>

#include <cstdint>

#include "phasekv/attention/cuda/block_attention.cuh"
#include "phasekv/attention/softmax_state.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cuda::detail {

/// Threads of a merge block.
inline constexpr int kMergeThreads = 128;

/// Arguments of merge_kernel (built on the host).
template <class OutT, class Variant>
struct MergeParams {
  const float* part_o = nullptr;    ///< `[splits, q_heads, d_v]` normalized partial outputs.
  const float* part_lse = nullptr;  ///< `[splits, q_heads]` partial log-sum-exps.
  int splits = 1;                   ///< Number of partials per head.
  int q_heads = 1;                  ///< Query heads (one block each).
  int d_v = 0;                      ///< Value dimension.
  Variant variant;                  ///< Provides the sink.
  OutT* out = nullptr;              ///< `[q_heads, d_v]` output.
  float* lse = nullptr;             ///< `[q_heads]` log-sum-exp, or null.
};

/// One block per query head: `lse = m + log(sum_s exp(lse_s - m))` with `m = max_s lse_s`
/// (cub::BlockReduce for the max and the sum), `o = sum_s exp(lse_s - lse) o_s`, then the sink
/// as phasekv::apply_sink. Dynamic shared memory: `splits` floats.
template <class OutT, class Variant>
__global__ void __launch_bounds__(kMergeThreads) merge_kernel(MergeParams<OutT, Variant> p) {
  using BlockReduce = cub::BlockReduce<float, kMergeThreads>;
  __shared__ typename BlockReduce::TempStorage tmp;
  __shared__ float s_max, s_total;
  extern __shared__ float weights[];
  const int h = static_cast<int>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x);

  float m = neg_inf();
  for (int s = tid; s < p.splits; s += kMergeThreads)
    m = MaxOp{}(m, p.part_lse[static_cast<std::int64_t>(s) * p.q_heads + h]);
  m = BlockReduce(tmp).Reduce(m, MaxOp{});
  if (tid == 0) s_max = m;
  __syncthreads();
  m = s_max;
  float sum = 0.0f;
  for (int s = tid; s < p.splits; s += kMergeThreads) {
    const float l = p.part_lse[static_cast<std::int64_t>(s) * p.q_heads + h];
    const float w = (l == neg_inf() || m == neg_inf()) ? 0.0f : expf(l - m);
    weights[s] = w;
    sum += w;
  }
  sum = BlockReduce(tmp).Sum(sum);
  if (tid == 0) s_total = sum;
  __syncthreads();
  const float total = s_total;
  const bool empty = m == neg_inf();
  const float inv = empty ? 0.0f : 1.0f / total;
  float head_lse = empty ? neg_inf() : m + logf(total);
  for (int i = tid; i < p.d_v; i += kMergeThreads) {
    float o = 0.0f;
    if (!empty) {
      for (int s = 0; s < p.splits; ++s) {
        const float w = weights[s];
        if (w != 0.0f)
          o = fmaf(w, p.part_o[(static_cast<std::int64_t>(s) * p.q_heads + h) * p.d_v + i], o);
      }
      o *= inv;
    }
    float l = head_lse;
    if (p.variant.has_sink()) apply_sink(&o, l, p.variant.sink(h), 1);
    p.out[static_cast<std::int64_t>(h) * p.d_v + i] = from_float<OutT>(o);
  }
  if (tid == 0 && p.lse != nullptr) {
    if (p.variant.has_sink()) {
      float dummy = 0.0f;
      apply_sink(&dummy, head_lse, p.variant.sink(h), 1);
    }
    p.lse[h] = head_lse;
  }
}

}  // namespace cuda::detail
PHASEKV_NAMESPACE_END
