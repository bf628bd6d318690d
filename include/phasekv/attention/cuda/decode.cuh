/// @file
/// @brief Split-KV (flash-decoding) decode attention over a compressed cache on CUDA: one query
/// token per call attends to a VisibleKV (prefix, compressed entries, raw range), followed by
/// a log-sum-exp merge of the split partials.
///
/// Launch structure: a grid of `splits x (kv_heads * ceil(G / 8))` blocks of 128 threads; block
/// `(s, y)` attends up to 8 query heads of one KV head (so each K/V tile is read once for the
/// group) to items `[s * items_per_split, (s + 1) * items_per_split)` of the visible set and
/// writes a partial (normalized output + lse) to the workspace; then detail::merge_kernel (one
/// block per query head) combines the partials and applies the sink.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "phasekv/attention/cuda/block_attention.cuh"
#include "phasekv/attention/cuda/merge.cuh"
#include "phasekv/attention/cuda/status.cuh"
#include "phasekv/attention/cuda/vector_load.cuh"
#include "phasekv/attention/args.hpp"
#include "phasekv/attention/params.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/view.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cuda {

/// Largest number of split-KV partitions a decode call accepts.
inline constexpr int kMaxDecodeSplits = 4096;

/// Arguments of phasekv::cuda::decode. All pointers are device pointers (including the
/// views inside `kv` and `variant.sinks`).
///
/// @tparam T    K/V storage type (float, bf16_t, f16_t).
/// @tparam OutT output storage type (float, bf16_t, f16_t).
/// @tparam Variant logit/sink variant (StandardVariant or a type with the same members,
///         including a host `check(where)`).
template <class T, class OutT = float, class Variant = StandardVariant>
struct DecodeArgs {
  const float* q = nullptr;   ///< `[q_heads, d_k]` queries, dense, float.
  std::int64_t q_heads = 0;   ///< Query heads (a multiple of kv_heads).
  std::int64_t kv_heads = 0;  ///< KV heads; query head h reads KV head `h / (q_heads / kv_heads)`.
  std::int64_t d_k = 0;       ///< Key (and query) dimension.
  std::int64_t d_v = 0;       ///< Value dimension.
  VisibleKV<T> kv;            ///< What the query sees (may be empty: n = 0).
  Variant variant;            ///< Scale, soft cap, entry bias, sinks (device pointer or null).
  OutT* out = nullptr;        ///< `[q_heads, d_v]` output.
  float* lse = nullptr;       ///< `[q_heads]` log-sum-exp (natural log), or null.
  int num_splits = 0;         ///< Split-KV partitions; 0 chooses automatically.
};

namespace detail {

/// Arguments of decode_split_kernel (built on the host).
template <class T, class Variant>
struct DecodeParams {
  VisibleKV<T> kv;                   ///< Visible set.
  const float* q = nullptr;          ///< Queries.
  Variant variant;                   ///< Variant.
  int q_heads = 0;                   ///< Query heads.
  int group = 1;                     ///< G = q_heads / kv_heads.
  int chunks = 1;                    ///< Blocks per KV head along the group.
  std::int64_t total = 0;            ///< Items in the visible set.
  std::int64_t items_per_split = 0;  ///< Items per split.
  AttnSmem smem;                     ///< Shared-memory layout.
  float* part_o = nullptr;           ///< `[splits, q_heads, d_v]`.
  float* part_lse = nullptr;         ///< `[splits, q_heads]`.
  bool vec = false;                  ///< 16-byte loads allowed.
};

/// Decode plan derived from the arguments alone (no device query), shared by the workspace
/// query and the launch.
struct DecodePlan {
  int splits = 1;                    ///< Effective number of splits.
  std::int64_t items_per_split = 1;  ///< Items per split (a multiple of the tile).
  int chunks = 1;                    ///< Blocks per KV head along the group.
  int heads_per_block = 1;           ///< Query heads per block.
  AttnSmem smem;                     ///< Shared-memory layout.
  std::size_t workspace = 0;         ///< Workspace bytes.
  std::size_t off_lse = 0;           ///< Byte offset of the partial lse array.
};

template <class T, class OutT, class Variant>
DecodePlan plan_decode(const DecodeArgs<T, OutT, Variant>& a) {
  DecodePlan p;
  const std::int64_t group = a.q_heads / a.kv_heads;
  p.heads_per_block = static_cast<int>(group < kMaxHeadsPerBlock ? group : kMaxHeadsPerBlock);
  p.chunks = static_cast<int>(ceil_div(group, kMaxHeadsPerBlock));
  p.smem = AttnSmem::choose(p.heads_per_block, static_cast<int>(a.d_k), static_cast<int>(a.d_v),
                            static_cast<int>(sizeof(T)));
  const std::int64_t total = a.kv.total();
  const std::int64_t tile = p.smem.tile;
  std::int64_t splits = a.num_splits;
  if (splits == 0) {
    // Aim for ~1024 blocks (several waves on ~132 SMs) without splits shorter than 256 items.
    const std::int64_t base = a.kv_heads * p.chunks;
    const std::int64_t want = ceil_div(1024, base);
    const std::int64_t most = ceil_div(total, 256);
    splits = want < most ? want : most;
    if (splits > kMaxDecodeSplits) splits = kMaxDecodeSplits;
    if (splits < 1) splits = 1;
  }
  std::int64_t per = ceil_div(total > 0 ? total : 1, splits);
  per = ceil_div(per, tile) * tile;
  p.items_per_split = per;
  p.splits = static_cast<int>(total > 0 ? ceil_div(total, per) : 1);
  const auto part = static_cast<std::size_t>(p.splits) * static_cast<std::size_t>(a.q_heads);
  p.off_lse = round_up(part * static_cast<std::size_t>(a.d_v) * sizeof(float), kWorkspaceAlignment);
  p.workspace = p.off_lse + round_up(part * sizeof(float), kWorkspaceAlignment);
  return p;
}

/// One split of one KV-head group: writes the partial output and lse of its query heads.
template <class T, class Variant>
__global__ void __launch_bounds__(kAttnThreads) decode_split_kernel(DecodeParams<T, Variant> p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const AttnSmem& L = p.smem;
  const int split = static_cast<int>(blockIdx.x);
  const int kh = static_cast<int>(blockIdx.y) / p.chunks;
  const int g0 = (static_cast<int>(blockIdx.y) - kh * p.chunks) * kMaxHeadsPerBlock;
  const int heads = p.group - g0 < kMaxHeadsPerBlock ? p.group - g0 : kMaxHeadsPerBlock;
  const std::int64_t h0 = static_cast<std::int64_t>(kh) * p.group + g0;
  const int tid = static_cast<int>(threadIdx.x);

  float* sq = reinterpret_cast<float*>(smem + L.off_q);
  for (int i = tid; i < heads * L.d_k; i += kAttnThreads) sq[i] = p.q[h0 * L.d_k + i];
  __syncthreads();

  const std::int64_t begin = static_cast<std::int64_t>(split) * p.items_per_split;
  std::int64_t end = begin + p.items_per_split;
  if (end > p.total) end = p.total;
  attend_items<T>(p.kv, begin, end, kh, heads, p.variant, L, smem, p.vec);

  const float* sacc = reinterpret_cast<const float*>(smem + L.off_acc);
  const OnlineSoftmax* sst = reinterpret_cast<const OnlineSoftmax*>(smem + L.off_state);
  const std::int64_t row0 = static_cast<std::int64_t>(split) * p.q_heads + h0;
  for (int slot = tid; slot < heads * L.d_v; slot += kAttnThreads) {
    const int g = slot / L.d_v;
    const OnlineSoftmax st = sst[g];
    const float inv = st.empty() ? 0.0f : 1.0f / st.denom;
    p.part_o[(row0 + g) * L.d_v + (slot - g * L.d_v)] = sacc[slot] * inv;
  }
  for (int g = tid; g < heads; g += kAttnThreads) p.part_lse[row0 + g] = sst[g].lse();
}

template <class T, class Variant>
cudaError_t launch_decode_split(const DecodeParams<T, Variant>& p, int splits, int kv_heads,
                                cudaStream_t stream) {
  auto kernel = decode_split_kernel<T, Variant>;
  if (p.smem.bytes > kDefaultSmem) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(p.smem.bytes));
    if (e != cudaSuccess) return e;
  }
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(kv_heads * p.chunks));
  kernel<<<grid, kAttnThreads, p.smem.bytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace detail

/// Validates decode arguments on the host without touching the device; throws
/// phasekv::invalid_argument (or phasekv::shape_error) naming the argument and its value.
/// Device pointers are checked for null only.
template <class T, class OutT, class Variant>
void check_decode_args(const DecodeArgs<T, OutT, Variant>& a) {
  const char* where = "phasekv::cuda::decode";
  phasekv::detail::check_head_shape(where, a.q_heads, a.kv_heads, a.d_k, a.d_v,
                                    detail::kHeadShapeLimits);
  phasekv::detail::check_arg(a.q != nullptr, where, "q", "null", "must point to device memory");
  phasekv::detail::check_arg(a.out != nullptr, where, "out", "null", "must point to device memory");
  phasekv::detail::check_arg(a.num_splits >= 0 && a.num_splits <= kMaxDecodeSplits, where,
                             "num_splits", a.num_splits, "must be in [0, 4096] (0 = automatic)");
  phasekv::detail::KVShape shape;
  shape.heads = a.kv_heads;
  shape.d_k = a.d_k;
  shape.d_v = a.d_v;
  phasekv::detail::check_visible_set(where, a.kv, shape);
  phasekv::detail::check_arg(a.kv.total() <= (std::int64_t{1} << 40), where, "kv.total()",
                             a.kv.total(), "must be <= 2^40");
  a.variant.check(where);
  const detail::DecodePlan p = detail::plan_decode(a);
  phasekv::detail::check_arg(a.kv_heads * p.chunks <= 65535, where, "kv_heads", a.kv_heads,
                             "kv_heads * ceil(G / 8) must be <= 65535 (grid limit)");
  phasekv::detail::check_arg(p.smem.bytes <= detail::kMaxDynamicSmem, where, "d_k + d_v",
                             a.d_k + a.d_v,
                             "head dims need more shared memory than a block has (227 KiB)");
}

/// Split-KV decode attention (see the file description).
///
/// Workspace protocol (CUB style): with `workspace == nullptr` the call validates the
/// arguments, stores the bytes needed in `workspace_bytes` and returns `cudaSuccess` without
/// launching; otherwise `workspace_bytes` must be at least that many bytes of 256-byte aligned
/// device memory. The workspace size depends on the shapes, `num_splits` and the visible item
/// count, never on the data. Everything is enqueued on `stream`; nothing is allocated and
/// nothing synchronizes.
///
/// @return `cudaSuccess`; `cudaErrorInvalidValue` for rejected arguments (message in
///         phasekv::cuda::last_error_message(), nothing launched); or the launch error.
template <class T, class OutT, class Variant>
cudaError_t decode(const DecodeArgs<T, OutT, Variant>& args, void* workspace,
                   std::size_t& workspace_bytes, cudaStream_t stream = nullptr) {
  cudaError_t e = detail::validate_into_status([&] { check_decode_args(args); });
  if (e != cudaSuccess) return e;
  const detail::DecodePlan plan = detail::plan_decode(args);
  if (workspace == nullptr) {
    workspace_bytes = plan.workspace;
    return cudaSuccess;
  }
  e = detail::validate_into_status([&] {
    phasekv::detail::check_arg(workspace_bytes >= plan.workspace, "phasekv::cuda::decode",
                               "workspace_bytes", workspace_bytes,
                               "smaller than the size the workspace query returned");
    phasekv::detail::check_arg(
        reinterpret_cast<std::uintptr_t>(workspace) % kWorkspaceAlignment == 0,
        "phasekv::cuda::decode", "workspace", workspace, "must be 256-byte aligned");
  });
  if (e != cudaSuccess) return e;

  detail::DecodeParams<T, Variant> p;
  p.kv = args.kv;
  p.q = args.q;
  p.variant = args.variant;
  p.q_heads = static_cast<int>(args.q_heads);
  p.group = static_cast<int>(args.q_heads / args.kv_heads);
  p.chunks = plan.chunks;
  p.total = args.kv.total();
  p.items_per_split = plan.items_per_split;
  p.smem = plan.smem;
  p.part_o = static_cast<float*>(workspace);
  p.part_lse = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + plan.off_lse);

  bool vec = (args.d_k * static_cast<std::int64_t>(sizeof(T))) % kVectorBytes == 0 &&
             (args.d_v * static_cast<std::int64_t>(sizeof(T))) % kVectorBytes == 0;
  for (int s = 0; s < args.kv.count; ++s)
    vec = vec && vector_loadable(args.kv.segments[s].keys) &&
          vector_loadable(args.kv.segments[s].values);
  p.vec = vec;
  e = detail::launch_decode_split<T, Variant>(p, plan.splits, static_cast<int>(args.kv_heads),
                                              stream);
  if (e != cudaSuccess) return e;

  detail::MergeParams<OutT, Variant> m;
  m.part_o = p.part_o;
  m.part_lse = p.part_lse;
  m.splits = plan.splits;
  m.q_heads = p.q_heads;
  m.d_v = static_cast<int>(args.d_v);
  m.variant = args.variant;
  m.out = args.out;
  m.lse = args.lse;
  detail::merge_kernel<OutT, Variant>
      <<<static_cast<unsigned>(args.q_heads), detail::kMergeThreads,
         static_cast<std::size_t>(plan.splits) * sizeof(float), stream>>>(m);
  return cudaGetLastError();
}

}  // namespace cuda
PHASEKV_NAMESPACE_END
