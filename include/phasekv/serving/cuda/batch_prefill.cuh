/// @file
/// @brief Ragged batch prefill (and chunked prefill, decode rows mixed in) over paged storage
/// on CUDA, the twin of serving/batch_prefill.hpp: the new tokens of B sequences, concatenated
/// (`qo_indptr`), each attending to its own paged cache with the visible set of its own
/// position, so entries that complete inside the chunk become visible where DESIGN.md says.
///
/// Life cycle. `PrefillPlan::plan` on the host, with host copies of `qo_indptr`, the lengths and
/// the tables (it validates them, including the ring check of chunked prefill); then
/// phasekv::cuda::batch_prefill with the same BatchPrefillArgs holding *device* pointers of the
/// same values. The cache must already hold the new tokens (phasekv::cuda::paged_append): the
/// queries of sequence b sit at positions `[n_b - q_b, n_b)`.
///
/// Kernel (the generic path of phasekv::cuda::prefill, over pages): one block of 128 threads
/// per (query row, group of up to 8 query heads of a KV head); the block finds its sequence in
/// the device `qo_indptr` (binary search), attends its heads to every item its position sees
/// (prefix, entries, raw tokens through the pages) with attend_items, and writes the normalized
/// output and the lse, the sink applied. Needs no workspace. Results do not depend on the page
/// size or order; every key is read once per query row (no query tiling yet: a tensor-core
/// tiled path as in phasekv::cuda::prefill is future work).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "phasekv/attention/args.hpp"
#include "phasekv/attention/cuda/block_attention.cuh"
#include "phasekv/attention/cuda/status.cuh"
#include "phasekv/attention/params.hpp"
#include "phasekv/attention/softmax_state.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/serving/batch_prefill.hpp"
#include "phasekv/serving/cuda/paged_launch.cuh"
#include "phasekv/serving/cuda/paged_rows.cuh"
#include "phasekv/serving/paged.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cuda {
namespace detail {

/// Arguments of batch_prefill_kernel (built on the host); Q: the query and output type.
template <class T, class Variant, class Q>
struct BatchPrefillParams {
  PagedKV<T> kv;                            ///< Device pools, tables and lengths.
  const Q* q = nullptr;                     ///< `[rows, q_heads, d_k]`.
  const std::int32_t* qo_indptr = nullptr;  ///< `[batch + 1]` (device).
  Variant variant;                          ///< Variant (device sinks).
  Q* out = nullptr;                         ///< `[rows, q_heads, d_v]`.
  float* lse = nullptr;                     ///< `[rows, q_heads]`.
  int q_heads = 0;                          ///< Query heads.
  int group = 1;                            ///< G = q_heads / kv_heads.
  int chunks = 1;                           ///< Blocks per KV head along the group.
  AttnSmem smem;                            ///< Shared-memory layout.
  bool vec = false;                         ///< 16-byte loads allowed.
};

/// The sequence whose queries hold row `r`: the last b with `qo[b] <= r` (sequences without
/// queries are skipped), or -1 when r is past `qo[batch]`.
PHASEKV_HOST_DEVICE inline std::int64_t sequence_of_row(const std::int32_t* qo, std::int64_t batch,
                                                        std::int64_t r) {
  if (batch <= 0 || r >= qo[batch]) return -1;
  std::int64_t lo = 0, hi = batch;  // qo[lo] <= r < qo[hi]
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (qo[mid] <= r)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

/// Block (row, y): query heads `[g0, g0 + heads)` of KV head kh at the row's position.
template <class T, class Variant, class Q>
__global__ void __launch_bounds__(kAttnThreads)
    batch_prefill_kernel(const __grid_constant__ BatchPrefillParams<T, Variant, Q> p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const AttnSmem& L = p.smem;
  const std::int64_t row = blockIdx.x;
  const std::int64_t b = sequence_of_row(p.qo_indptr, p.kv.batch, row);
  if (b < 0) return;  // the device qo_indptr holds fewer rows than the plan: nothing to write
  const int kh = static_cast<int>(blockIdx.y) / p.chunks;
  const int g0 = (static_cast<int>(blockIdx.y) - kh * p.chunks) * kMaxHeadsPerBlock;
  const int heads = p.group - g0 < kMaxHeadsPerBlock ? p.group - g0 : kMaxHeadsPerBlock;
  const std::int64_t h0 = static_cast<std::int64_t>(kh) * p.group + g0;
  const std::int64_t row0 = row * p.q_heads + h0;
  const int tid = static_cast<int>(threadIdx.x);
  // position of the row: the queries of b are the last q_b of its n_b tokens
  const std::int64_t t = p.kv.lengths[b] - (p.qo_indptr[b + 1] - row);

  float* sq = reinterpret_cast<float*>(smem + L.off_q);
  for (int x = tid; x < heads * L.d_k; x += kAttnThreads) sq[x] = to_float(p.q[row0 * L.d_k + x]);
  __syncthreads();
  const PagedSequence<T> src = paged_sequence(p.kv, b, t >= 0 ? t + 1 : 0);
  attend_items<T>(src, 0, src.vis.total(), kh, heads, p.variant, L, smem, p.vec);

  const float* sacc = reinterpret_cast<const float*>(smem + L.off_acc);
  const OnlineSoftmax* sst = reinterpret_cast<const OnlineSoftmax*>(smem + L.off_state);
  for (int slot = tid; slot < heads * L.d_v; slot += kAttnThreads) {
    const int g = slot / L.d_v;
    float l;
    const float o = finish_element(sacc[slot], sst[g], p.variant, h0 + g, l);
    p.out[(row0 + g) * L.d_v + (slot - g * L.d_v)] = from_float<Q>(t >= 0 ? o : nanf(""));
    if (slot - g * L.d_v == 0) p.lse[row0 + g] = t >= 0 ? l : nanf("");
  }
}

}  // namespace detail

/// Rows (query tokens) of a planned prefill step: the sum of the planned queries.
inline std::int64_t prefill_rows(const PrefillPlan& plan) {
  std::int64_t rows = 0;
  for (const PrefillWorkItem& w : plan.items())
    if (w.kv_head == 0) rows += w.end - w.begin;
  return rows;
}

/// Validates a CUDA batch prefill run on the host without reading device memory; throws
/// phasekv::invalid_argument (or shape_error) naming the argument and its value.
template <class T, class Variant, class Q>
void check_batch_prefill_args(const PrefillPlan& plan, const BatchPrefillArgs<T, Variant, Q>& a) {
  const char* where = "phasekv::cuda::batch_prefill";
  using phasekv::detail::check_arg;
  check_arg(plan.planned(), where, "plan", "empty", "call PrefillPlan::plan first");
  detail::check_paged_attention(where, a.kv, a.q_heads, a.kv_heads, a.d_k, a.d_v, a.variant);
  plan.record().check_fields(a.kv, where);  // batch, rule, ring, pools: no host array needed
  check_arg(a.kv.batch >= 0, where, "kv.batch", a.kv.batch, "must be >= 0");
  for (const PrefillWorkItem& w : plan.items())
    check_arg(w.sequence < a.kv.batch && w.kv_head < a.kv_heads, where, "kv.batch", a.kv.batch,
              "must equal the planned batch (and kv_heads the planned kv_heads)");
  const std::int64_t rows = prefill_rows(plan);
  check_arg(rows <= (std::int64_t{1} << 31) - 1, where, "qo_indptr[batch]", rows,
            "must be <= 2^31 - 1 (grid limit)");
  check_arg(rows == 0 || (a.q != nullptr && a.out != nullptr && a.lse != nullptr &&
                          a.qo_indptr != nullptr && a.kv.lengths != nullptr),
            where, "q", "null",
            "q, out, lse, qo_indptr and kv.lengths must point to device memory");
}

/// Runs one layer of a planned ragged batch prefill on `stream` (see the file description).
/// `args` holds device pointers whose qo_indptr, lengths and tables equal the host ones `plan`
/// was made from. Needs no workspace; allocates nothing; does not synchronize.
///
/// @return `cudaSuccess`; `cudaErrorInvalidValue` for rejected arguments (message in
///         phasekv::cuda::last_error_message(), nothing launched); or the launch error.
template <class T, class Variant, class Q>
cudaError_t batch_prefill(const PrefillPlan& plan, const BatchPrefillArgs<T, Variant, Q>& args,
                          cudaStream_t stream = nullptr) {
  cudaError_t e = detail::validate_into_status([&] { check_batch_prefill_args(plan, args); });
  if (e != cudaSuccess) return e;
  const std::int64_t rows = prefill_rows(plan);
  if (rows == 0) return cudaSuccess;
  detail::BatchPrefillParams<T, Variant, Q> p;
  p.kv = args.kv;
  p.q = args.q;
  p.qo_indptr = args.qo_indptr;
  p.variant = args.variant;
  p.out = args.out;
  p.lse = args.lse;
  p.q_heads = static_cast<int>(args.q_heads);
  const detail::PagedLaunch shape = detail::PagedLaunch::make(
      args.q_heads, args.kv_heads, args.d_k, args.d_v, static_cast<int>(sizeof(T)));
  p.group = shape.group;
  p.chunks = shape.chunks;
  p.smem = shape.smem;
  p.vec = detail::paged_vector_loads(args.kv);
  auto kernel = detail::batch_prefill_kernel<T, Variant, Q>;
  if (p.smem.bytes > detail::kDefaultSmem) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(p.smem.bytes));
    if (e != cudaSuccess) return e;
  }
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(args.kv_heads * p.chunks));
  kernel<<<grid, detail::kAttnThreads, p.smem.bytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace cuda
PHASEKV_NAMESPACE_END
