/// @file
/// @brief Batch decode over paged storage on CUDA, the twin of serving/batch_decode.hpp: one
/// query token for each of B sequences, each with its own length n_b, run from the host
/// DecodePlan on a stream.
///
/// Life cycle. The plan is the CPU one: `DecodePlan::plan` on the host, with host copies of the
/// lengths and block tables (the engines keep them anyway: FlashInfer's plan takes host
/// `indptr` too); it validates the tables and fixes the work items (sequence, KV chunk). The
/// run, phasekv::cuda::batch_decode, takes the same BatchDecodeArgs with *device* pointers
/// (queries, outputs, pools, tables, lengths, sinks) holding the same values, and enqueues three
/// kernels on a stream:
/// 1. the plan math again on the device (serving/plan.hpp's plan_items over the visible totals
///    of the device lengths, one thread), so a step can be captured in a CUDA graph and no
///    host memory is read at run time;
/// 2. one block of 128 threads per (work item, group of up to 8 query heads of a KV head): the
///    block attends its heads to the item's chunk of visible items (prefix, entries, raw
///    tokens, found through the pages) with the block loop of attention/cuda, in tiles of 64
///    items counted from the chunk's start, and writes a normalized partial and its lse;
/// 3. the merge, one block per (sequence, query head), one thread per value channel: the
///    partials of the sequence's items in item order with phasekv::merge_partial, then the
///    sink with phasekv::apply_sink (the CPU's merge, the same code).
///
/// Results do not depend on the page size, the page order or the plan's worker count (the
/// arithmetic sees item indices only); they depend on the plan's kv_chunk. The CUDA bits are not
/// the CPU's (other reduction order); both lie within the test bounds of the double reference.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "phasekv/attention/args.hpp"
#include "phasekv/attention/cuda/block_attention.cuh"
#include "phasekv/attention/cuda/status.cuh"
#include "phasekv/attention/cuda/vector_load.cuh"
#include "phasekv/attention/params.hpp"
#include "phasekv/attention/softmax_state.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/serving/batch_decode.hpp"
#include "phasekv/serving/cuda/paged_launch.cuh"
#include "phasekv/serving/cuda/paged_rows.cuh"
#include "phasekv/serving/paged.hpp"
#include "phasekv/serving/plan.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cuda {
namespace detail {

/// Threads of a serving merge block (one per value channel, looping when d_v is larger).
inline constexpr int kServingMergeThreads = 128;

/// Byte offsets of the sections of a batch decode workspace (each 256-byte aligned).
struct BatchDecodeLayout {
  std::size_t off_items = 0;   ///< `[items]` WorkItem, the device plan.
  std::size_t off_first = 0;   ///< `[batch + 1]` first item of each sequence.
  std::size_t off_totals = 0;  ///< `[batch]` visible items of each sequence.
  std::size_t off_flag = 0;    ///< One int: 1 when the device lengths disagree with the plan.
  std::size_t off_o = 0;       ///< `[items, q_heads, d_v]` normalized partial outputs.
  std::size_t off_lse = 0;     ///< `[items, q_heads]` partial lse.
  std::size_t bytes = 0;       ///< Total.

  /// Layout for `items` work items, `batch` sequences, `q_heads` heads of `d_v` channels.
  static BatchDecodeLayout make(std::size_t items, std::size_t batch, std::size_t q_heads,
                                std::size_t d_v) {
    BatchDecodeLayout l;
    std::size_t at = 0;
    const auto take = [&at](std::size_t n) {
      const std::size_t off = at;
      at = round_up(at + n, kWorkspaceAlignment);
      return off;
    };
    l.off_items = take(items * sizeof(WorkItem));
    l.off_first = take((batch + 1) * sizeof(std::int64_t));
    l.off_totals = take(batch * sizeof(std::int64_t));
    l.off_flag = take(sizeof(int));
    l.off_o = take(items * q_heads * d_v * sizeof(float));
    l.off_lse = take(items * q_heads * sizeof(float));
    l.bytes = at;
    return l;
  }
};

/// Arguments of the batch decode kernels (built on the host); Q: the query and output type.
template <class T, class Variant, class Q>
struct BatchDecodeParams {
  PagedKV<T> kv;                       ///< Device pools, tables and lengths.
  const Q* q = nullptr;                ///< `[batch, q_heads, d_k]`.
  Variant variant;                     ///< Variant (device sinks).
  Q* out = nullptr;                    ///< `[batch, q_heads, d_v]`.
  float* lse = nullptr;                ///< `[batch, q_heads]`.
  int q_heads = 0;                     ///< Query heads.
  int group = 1;                       ///< G = q_heads / kv_heads.
  int chunks = 1;                      ///< Blocks per KV head along the group.
  std::int64_t items = 0;              ///< Work items of the host plan.
  std::int64_t kv_chunk = 0;           ///< Visible items per work item.
  AttnSmem smem;                       ///< Shared-memory layout.
  WorkItem* plan_items = nullptr;      ///< Device plan (workspace).
  std::int64_t* first_item = nullptr;  ///< `[batch + 1]` (workspace).
  std::int64_t* totals = nullptr;      ///< `[batch]` (workspace).
  int* flag = nullptr;                 ///< Mismatch flag (workspace).
  float* part_o = nullptr;             ///< Partial outputs (workspace).
  float* part_lse = nullptr;           ///< Partial lse (workspace).
  bool vec = false;                    ///< 16-byte loads allowed.
};

/// One thread: the plan math of serving/plan.hpp over the device lengths. A count that differs
/// from the host plan's (lengths or rule changed since DecodePlan::plan) sets the flag, leaves
/// every item empty and every sequence without items; the merge then writes NaN.
template <class T, class Variant, class Q>
__global__ void batch_plan_kernel(const __grid_constant__ BatchDecodeParams<T, Variant, Q> p) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  for (std::int64_t b = 0; b < p.kv.batch; ++b) p.totals[b] = p.kv.rule.at(p.kv.lengths[b]).total();
  const std::int64_t n = plan_items(p.totals, p.kv.batch, p.kv_chunk, nullptr, nullptr);
  if (n == p.items) {
    plan_items(p.totals, p.kv.batch, p.kv_chunk, p.plan_items, p.first_item);
    *p.flag = 0;
    return;
  }
  *p.flag = 1;
  for (std::int64_t i = 0; i < p.items; ++i) p.plan_items[i] = WorkItem{0, 0, 0};
  for (std::int64_t b = 0; b <= p.kv.batch; ++b) p.first_item[b] = 0;
}

/// Block (item, y): the query heads `[g0, g0 + heads)` of KV head kh attend to the item's chunk.
template <class T, class Variant, class Q>
__global__ void __launch_bounds__(kAttnThreads)
    batch_decode_kernel(const __grid_constant__ BatchDecodeParams<T, Variant, Q> p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const AttnSmem& L = p.smem;
  const std::int64_t item = blockIdx.x;
  const int kh = static_cast<int>(blockIdx.y) / p.chunks;
  const int g0 = (static_cast<int>(blockIdx.y) - kh * p.chunks) * kMaxHeadsPerBlock;
  const int heads = p.group - g0 < kMaxHeadsPerBlock ? p.group - g0 : kMaxHeadsPerBlock;
  const std::int64_t h0 = static_cast<std::int64_t>(kh) * p.group + g0;
  const int tid = static_cast<int>(threadIdx.x);
  const WorkItem w = p.plan_items[item];

  float* sq = reinterpret_cast<float*>(smem + L.off_q);
  const Q* qb = p.q + (w.sequence * p.q_heads + h0) * L.d_k;
  for (int i = tid; i < heads * L.d_k; i += kAttnThreads) sq[i] = to_float(qb[i]);
  __syncthreads();

  const PagedSequence<T> src = paged_sequence(p.kv, w.sequence, p.kv.lengths[w.sequence]);
  const std::int64_t total = src.vis.total();
  const std::int64_t end = w.end < total ? w.end : total;
  attend_items<T>(src, w.begin, end > w.begin ? end : w.begin, kh, heads, p.variant, L, smem,
                  p.vec);

  const float* sacc = reinterpret_cast<const float*>(smem + L.off_acc);
  const OnlineSoftmax* sst = reinterpret_cast<const OnlineSoftmax*>(smem + L.off_state);
  const std::int64_t row0 = item * p.q_heads + h0;
  for (int slot = tid; slot < heads * L.d_v; slot += kAttnThreads) {
    const int g = slot / L.d_v;
    const OnlineSoftmax st = sst[g];
    const float inv = st.empty() ? 0.0f : 1.0f / st.denom;
    p.part_o[(row0 + g) * L.d_v + (slot - g * L.d_v)] = sacc[slot] * inv;
  }
  for (int g = tid; g < heads; g += kAttnThreads) p.part_lse[row0 + g] = sst[g].lse();
}

/// Block (sequence b, head h): merges b's partials in item order (the CPU's merge), then the
/// sink; one thread per value channel.
template <class T, class Variant, class Q>
__global__ void __launch_bounds__(kServingMergeThreads)
    batch_merge_kernel(const __grid_constant__ BatchDecodeParams<T, Variant, Q> p, int d_v) {
  const std::int64_t bh = blockIdx.x;
  const std::int64_t b = bh / p.q_heads, h = bh - b * p.q_heads;
  const bool bad = *p.flag != 0;
  const std::int64_t i0 = p.first_item[b], i1 = p.first_item[b + 1];
  float l = neg_inf();
  for (int c = static_cast<int>(threadIdx.x); c < d_v; c += kServingMergeThreads) {
    float o = 0.0f;
    l = neg_inf();
    for (std::int64_t it = i0; it < i1; ++it)
      merge_partial(&o, l, p.part_o + (it * p.q_heads + h) * d_v + c,
                    p.part_lse[it * p.q_heads + h], 1);
    if (p.variant.has_sink()) apply_sink(&o, l, p.variant.sink(h), 1);
    p.out[bh * d_v + c] = from_float<Q>(bad ? nanf("") : o);
  }
  // thread 0 merged channel 0 (d_v >= 1); every channel computes the same lse
  if (threadIdx.x == 0) p.lse[bh] = bad ? nanf("") : l;
}

}  // namespace detail

/// Validates a CUDA batch decode run on the host without reading device memory: the plan is
/// made, the batch and shapes fit it and the device limits, pointers are set. Throws
/// phasekv::invalid_argument (or shape_error) naming the argument and its value.
template <class T, class Variant, class Q>
void check_batch_decode_args(const DecodePlan& plan, const BatchDecodeArgs<T, Variant, Q>& a) {
  const char* where = "phasekv::cuda::batch_decode";
  using phasekv::detail::check_arg;
  check_arg(plan.planned(), where, "plan", "empty", "call DecodePlan::plan first");
  detail::check_paged_attention(where, a.kv, a.q_heads, a.kv_heads, a.d_k, a.d_v, a.variant);
  plan.record().check_fields(a.kv, where);  // batch, rule, ring, pools: no host array needed
  check_arg(a.kv.batch == plan.batch(), where, "kv.batch", a.kv.batch,
            "must equal the planned batch");
  check_arg(a.kv.batch * a.q_heads <= (std::int64_t{1} << 31) - 1, where, "kv.batch", a.kv.batch,
            "kv.batch * q_heads must be <= 2^31 - 1 (grid limit)");
  check_arg(a.kv.batch == 0 ||
                (a.q != nullptr && a.out != nullptr && a.lse != nullptr && a.kv.lengths != nullptr),
            where, "q", "null", "q, out, lse and kv.lengths must point to device memory");
  const auto items = static_cast<std::int64_t>(plan.items().size());
  check_arg(items <= (std::int64_t{1} << 31) - 1, where, "plan.items().size()", items,
            "must be <= 2^31 - 1 (grid limit)");
}

/// Runs one layer of a planned batch decode step on `stream` (see the file description).
/// `args` holds device pointers whose lengths and tables equal the host ones `plan` was made
/// from (the batch, rule, ring and pool shapes are checked against the plan's PlanRecord; the
/// device arrays cannot be: device lengths that give another number of work items make every
/// output NaN, other differences are not detected: plan again when they change). `Q`: the query
/// and output type (float, bf16_t, f16_t; widened on load, rounded on store, lse f32).
///
/// Workspace protocol (CUB style, as phasekv::cuda::decode): with `workspace == nullptr` the
/// call validates, stores the bytes needed in `workspace_bytes` and returns `cudaSuccess`
/// without launching; otherwise `workspace_bytes` must be at least that and `workspace`
/// 256-byte aligned device memory. Nothing is allocated, nothing synchronizes.
///
/// @return `cudaSuccess`; `cudaErrorInvalidValue` for rejected arguments (message in
///         phasekv::cuda::last_error_message(), nothing launched); or the launch error.
template <class T, class Variant, class Q>
cudaError_t batch_decode(const DecodePlan& plan, const BatchDecodeArgs<T, Variant, Q>& args,
                         void* workspace, std::size_t& workspace_bytes,
                         cudaStream_t stream = nullptr) {
  const char* where = "phasekv::cuda::batch_decode";
  cudaError_t e = detail::validate_into_status([&] { check_batch_decode_args(plan, args); });
  if (e != cudaSuccess) return e;
  const std::size_t items = plan.items().size();
  const detail::BatchDecodeLayout lay = detail::BatchDecodeLayout::make(
      items, static_cast<std::size_t>(args.kv.batch), static_cast<std::size_t>(args.q_heads),
      static_cast<std::size_t>(args.d_v));
  if (workspace == nullptr) {
    workspace_bytes = lay.bytes;
    return cudaSuccess;
  }
  e = detail::validate_into_status([&] {
    phasekv::detail::check_arg(workspace_bytes >= lay.bytes, where, "workspace_bytes",
                               workspace_bytes,
                               "smaller than the size the workspace query returned");
    phasekv::detail::check_arg(
        reinterpret_cast<std::uintptr_t>(workspace) % kWorkspaceAlignment == 0, where, "workspace",
        workspace, "must be 256-byte aligned");
  });
  if (e != cudaSuccess) return e;
  if (args.kv.batch == 0) return cudaSuccess;

  auto* base = static_cast<unsigned char*>(workspace);
  detail::BatchDecodeParams<T, Variant, Q> p;
  p.kv = args.kv;
  p.q = args.q;
  p.variant = args.variant;
  p.out = args.out;
  p.lse = args.lse;
  p.q_heads = static_cast<int>(args.q_heads);
  const detail::PagedLaunch shape = detail::PagedLaunch::make(
      args.q_heads, args.kv_heads, args.d_k, args.d_v, static_cast<int>(sizeof(T)));
  p.group = shape.group;
  p.chunks = shape.chunks;
  p.smem = shape.smem;
  p.items = static_cast<std::int64_t>(items);
  p.kv_chunk = plan.kv_chunk();
  p.plan_items = reinterpret_cast<WorkItem*>(base + lay.off_items);
  p.first_item = reinterpret_cast<std::int64_t*>(base + lay.off_first);
  p.totals = reinterpret_cast<std::int64_t*>(base + lay.off_totals);
  p.flag = reinterpret_cast<int*>(base + lay.off_flag);
  p.part_o = reinterpret_cast<float*>(base + lay.off_o);
  p.part_lse = reinterpret_cast<float*>(base + lay.off_lse);
  p.vec = detail::paged_vector_loads(args.kv);

  detail::batch_plan_kernel<T, Variant, Q><<<1, 1, 0, stream>>>(p);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  if (items > 0) {
    auto kernel = detail::batch_decode_kernel<T, Variant, Q>;
    if (p.smem.bytes > detail::kDefaultSmem) {
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(p.smem.bytes));
      if (e != cudaSuccess) return e;
    }
    const dim3 grid(static_cast<unsigned>(items), static_cast<unsigned>(args.kv_heads * p.chunks));
    kernel<<<grid, detail::kAttnThreads, p.smem.bytes, stream>>>(p);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  detail::batch_merge_kernel<T, Variant, Q>
      <<<static_cast<unsigned>(args.kv.batch * args.q_heads), detail::kServingMergeThreads, 0,
         stream>>>(p, static_cast<int>(args.d_v));
  return cudaGetLastError();
}

}  // namespace cuda
PHASEKV_NAMESPACE_END
