/// @file
/// @brief The DeepSeek-V4 lightning indexer on CUDA, the twin of dsv4/indexer.hpp: scores of
/// every visible compressed entry and the top k per query, deterministic, on a stream.
///
/// Launch structure (three kernels and one CUB sort, nothing allocated):
/// 1. one thread per (query i, entry j < J(first_position + i + 1)) computes the score with
///    dsv4::index_score (dsv4/kernel_math.hpp) and writes the sort key dsv4::topk_key(score,
///    j); a thread also writes the segment bounds of its query;
/// 2. cub::DeviceSegmentedRadixSort::SortKeysDescending sorts each query's keys (64-bit:
///    ordered score bits, then the inverted index, so equal scores come out by ascending
///    index whatever the sort's stability);
/// 3. one thread per (query, slot < k) decodes the first min(J, k) keys into `indices` and
///    `scores` and pads the rest with -1 / -inf.
///
/// Results. The scores are the bits of dsv4::index_score evaluated on the host (the same
/// explicit fmaf sequence). The CPU indexer sums in another fixed order (lane partial sums per
/// instruction set: see dsv4/indexer.hpp), so its scores lie within the f32 error bound of
/// these rather than on the same bits, and a near-tie may select differently. The selection is
/// exactly the CPU rule (descending score, ties to the lower index) applied to these scores.
/// The sort reads all J entries of each query; its cost and the workspace (16 bytes per
/// (query, entry) plus CUB's storage) grow with num_queries * J_max.
#pragma once

#include <cuda_runtime.h>

#include <cub/device/device_segmented_radix_sort.cuh>

#include <cstddef>
#include <cstdint>

#include "phasekv/attention/cuda/status.cuh"
#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/dsv4/indexer.hpp"
#include "phasekv/dsv4/kernel_math.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace dsv4::cuda {

namespace detail {

/// Threads of the scoring and output blocks.
inline constexpr int kIndexerThreads = 128;

/// Byte offsets of the sections of an indexer workspace (each 256-byte aligned); the CUB
/// storage comes last.
struct IndexerLayout {
  std::int64_t j_max = 0;      ///< J of the last query (the longest segment).
  std::size_t off_keys = 0;    ///< `[num_queries, j_max]` u64 sort keys (unsorted).
  std::size_t off_sorted = 0;  ///< `[num_queries, j_max]` u64 sort keys (sorted).
  std::size_t off_begin = 0;   ///< `[num_queries]` int segment begins.
  std::size_t off_end = 0;     ///< `[num_queries]` int segment ends.
  std::size_t off_cub = 0;     ///< CUB temporary storage.
  std::size_t bytes = 0;       ///< Bytes before the CUB storage.

  /// Layout for `num_queries` queries whose last sees `j_max` entries.
  static IndexerLayout make(std::int64_t num_queries, std::int64_t j_max) {
    IndexerLayout l;
    l.j_max = j_max;
    std::size_t at = 0;
    const auto take = [&at](std::size_t n) {
      const std::size_t off = at;
      at = (at + n + 255) / 256 * 256;
      return off;
    };
    const auto items = static_cast<std::size_t>(num_queries) * static_cast<std::size_t>(j_max);
    l.off_keys = take(items * sizeof(std::uint64_t));
    l.off_sorted = take(items * sizeof(std::uint64_t));
    l.off_begin = take(static_cast<std::size_t>(num_queries) * sizeof(int));
    l.off_end = take(static_cast<std::size_t>(num_queries) * sizeof(int));
    l.off_cub = at;
    l.bytes = at;
    return l;
  }
};

/// Kernel arguments (built on the host).
template <class T>
struct IndexerKernelParams {
  IndexerParams params;                ///< Shape and geometry.
  const float* q = nullptr;            ///< `[num_queries, heads, dim]`.
  const float* w = nullptr;            ///< `[num_queries, heads]`.
  const T* keys = nullptr;             ///< Key rows.
  std::int64_t key_stride = 0;         ///< Elements between key rows.
  std::int64_t first_position = 0;     ///< Position of query 0.
  std::int64_t num_queries = 0;        ///< Queries.
  std::int64_t j_max = 0;              ///< Segment stride.
  std::uint64_t* sort_keys = nullptr;  ///< Unsorted keys (workspace).
  std::uint64_t* sorted = nullptr;     ///< Sorted keys (workspace).
  int* seg_begin = nullptr;            ///< Segment begins (workspace).
  int* seg_end = nullptr;              ///< Segment ends (workspace).
  std::int32_t* indices = nullptr;     ///< `[num_queries, top_k]`.
  float* scores = nullptr;             ///< `[num_queries, top_k]` or null.
};

/// Block (x, y): entries `[x * 128, x * 128 + 128)` of queries y, y + gridDim.y, ...
template <class T>
__global__ void __launch_bounds__(kIndexerThreads)
    indexer_score_kernel(const __grid_constant__ IndexerKernelParams<T> p) {
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * kIndexerThreads + threadIdx.x;
  const std::int64_t H = p.params.heads, d = p.params.dim;
  for (std::int64_t i = blockIdx.y; i < p.num_queries; i += gridDim.y) {
    const std::int64_t J = p.params.geometry.complete_windows(p.first_position + i + 1);
    if (j == 0) {
      p.seg_begin[i] = static_cast<int>(i * p.j_max);
      p.seg_end[i] = static_cast<int>(i * p.j_max + J);
    }
    if (j < J) {
      const float s = index_score<T>(p.q + i * H * d, p.w + i * H, p.keys + j * p.key_stride, H, d);
      p.sort_keys[i * p.j_max + j] = topk_key(s, static_cast<std::int32_t>(j));
    }
  }
}

/// Block (x, y): slots `[x * 128, x * 128 + 128)` of queries y, y + gridDim.y, ...
template <class T>
__global__ void __launch_bounds__(kIndexerThreads)
    indexer_output_kernel(const __grid_constant__ IndexerKernelParams<T> p) {
  const std::int64_t s = static_cast<std::int64_t>(blockIdx.x) * kIndexerThreads + threadIdx.x;
  const std::int64_t k = p.params.top_k;
  if (s >= k) return;
  for (std::int64_t i = blockIdx.y; i < p.num_queries; i += gridDim.y) {
    const std::int64_t J = p.params.geometry.complete_windows(p.first_position + i + 1);
    const bool real = s < J;
    const std::uint64_t key = real ? p.sorted[i * p.j_max + s] : 0;
    p.indices[i * k + s] = real ? topk_key_index(key) : -1;
    if (p.scores != nullptr) p.scores[i * k + s] = real ? topk_key_score(key) : -HUGE_VALF;
  }
}

}  // namespace detail

/// Host validation of a CUDA indexer call (no device access): the CPU indexer's checks (same
/// arguments, same messages) plus the device limits: `num_queries * J_max` must fit a CUB
/// segmented sort (<= 2^31 - 1 items; split the queries otherwise) and `top_k` the grid.
/// Throws phasekv::invalid_argument (capacity_error for missing keys).
inline void check_indexer_args(const IndexerParams& params, const float* q, const float* w,
                               const void* keys, std::int64_t num_keys, std::int64_t key_stride,
                               std::int64_t first_position, std::int64_t num_queries,
                               const std::int32_t* indices) {
  const char* where = "phasekv::dsv4::cuda::indexer_top_k";
  using phasekv::detail::check_arg;
  params.check(where);
  check_arg(num_queries >= 0, where, "num_queries", num_queries, "must be >= 0");
  check_arg(first_position >= 0 && first_position <= kMaxLength - num_queries, where,
            "first_position", first_position, "must be in [0, 2^62 - num_queries]");
  if (num_queries == 0) return;
  check_arg(key_stride >= params.dim, where, "key_stride", key_stride, "must be >= params.dim");
  const std::int64_t need = params.geometry.complete_windows(first_position + num_queries);
  check_arg<capacity_error>(num_keys >= need, where, "num_keys", num_keys,
                            "must hold J(n) entries of the last query");
  check_arg(need <= (std::int64_t{1} << 31) - 1, where, "num_keys", need,
            "visible entries must fit int32 indices");
  check_arg(q != nullptr && w != nullptr, where, "q", "null", "q and w must not be null");
  check_arg(need == 0 || keys != nullptr, where, "keys", "null", "must not be null");
  check_arg(indices != nullptr, where, "indices", "null", "must not be null");
  check_arg(num_queries <= ((std::int64_t{1} << 31) - 1) / (need > 0 ? need : 1), where,
            "num_queries", num_queries,
            "num_queries * J(last query) must be <= 2^31 - 1 (one CUB segmented sort); "
            "split the queries");
  check_arg(params.top_k <= (std::int64_t{1} << 31) - 1 - 127, where, "params.top_k", params.top_k,
            "must be < 2^31 - 127 (grid limit)");
}

/// The indexer of dsv4/indexer.hpp on `stream`: the same arguments (all pointers device
/// pointers: `q` `[num_queries, heads, dim]`, `w` `[num_queries, heads]`, `keys` rows of
/// `key_stride` elements (f32, bf16 or f16), `indices` and optionally `scores`
/// `[num_queries, top_k]`), the same visibility J(first_position + i + 1), the same order
/// (descending score, ties to the lower index, -1 / -inf padding). See the file description
/// for the bits.
///
/// Workspace protocol (CUB style, as phasekv::cuda::decode): with `workspace == nullptr` the
/// call validates, stores the bytes needed in `workspace_bytes` (this asks CUB, so it needs a
/// device) and returns `cudaSuccess` without launching; otherwise `workspace_bytes` must be
/// at least that and `workspace` 256-byte aligned device memory. Nothing is allocated, nothing
/// synchronizes.
///
/// @return `cudaSuccess`; `cudaErrorInvalidValue` for rejected arguments (message in
///         phasekv::cuda::last_error_message(), nothing launched); or a CUDA error.
template <class T>
cudaError_t indexer_top_k(const IndexerParams& params, const float* q, const float* w,
                          const T* keys, std::int64_t num_keys, std::int64_t key_stride,
                          std::int64_t first_position, std::int64_t num_queries,
                          std::int32_t* indices, float* scores, void* workspace,
                          std::size_t& workspace_bytes, cudaStream_t stream = nullptr) {
  const char* where = "phasekv::dsv4::cuda::indexer_top_k";
  using phasekv::cuda::detail::validate_into_status;
  cudaError_t e = validate_into_status([&] {
    check_indexer_args(params, q, w, keys, num_keys, key_stride, first_position, num_queries,
                       indices);
  });
  if (e != cudaSuccess) return e;
  const std::int64_t j_max =
      num_queries > 0 ? params.geometry.complete_windows(first_position + num_queries) : 0;
  const detail::IndexerLayout lay = detail::IndexerLayout::make(num_queries, j_max);
  if (workspace != nullptr) {  // checks that need no CUDA call first
    e = validate_into_status([&] {
      phasekv::detail::check_arg(workspace_bytes >= lay.bytes, where, "workspace_bytes",
                                 workspace_bytes,
                                 "smaller than the size the workspace query returned");
      phasekv::detail::check_arg(
          reinterpret_cast<std::uintptr_t>(workspace) % phasekv::cuda::kWorkspaceAlignment == 0,
          where, "workspace", workspace, "must be 256-byte aligned");
    });
    if (e != cudaSuccess) return e;
  }
  const int items = static_cast<int>(num_queries * j_max);
  const int segments = static_cast<int>(num_queries);
  auto* base = static_cast<unsigned char*>(workspace);
  detail::IndexerKernelParams<T> p;
  p.params = params;
  p.q = q;
  p.w = w;
  p.keys = keys;
  p.key_stride = key_stride;
  p.first_position = first_position;
  p.num_queries = num_queries;
  p.j_max = j_max;
  p.indices = indices;
  p.scores = scores;
  if (base != nullptr) {
    p.sort_keys = reinterpret_cast<std::uint64_t*>(base + lay.off_keys);
    p.sorted = reinterpret_cast<std::uint64_t*>(base + lay.off_sorted);
    p.seg_begin = reinterpret_cast<int*>(base + lay.off_begin);
    p.seg_end = reinterpret_cast<int*>(base + lay.off_end);
  }
  std::size_t cub_bytes = 0;
  if (items > 0) {
    e = cub::DeviceSegmentedRadixSort::SortKeysDescending(nullptr, cub_bytes, p.sort_keys, p.sorted,
                                                          items, segments, p.seg_begin, p.seg_end,
                                                          0, 64, stream);
    if (e != cudaSuccess) return e;
  }
  const std::size_t total = lay.bytes + cub_bytes;
  if (workspace == nullptr) {
    workspace_bytes = total;
    return cudaSuccess;
  }
  e = validate_into_status([&] {
    phasekv::detail::check_arg(workspace_bytes >= total, where, "workspace_bytes", workspace_bytes,
                               "smaller than the size the workspace query returned");
  });
  if (e != cudaSuccess) return e;
  if (num_queries == 0) return cudaSuccess;
  const unsigned gy = static_cast<unsigned>(num_queries < 65535 ? num_queries : 65535);
  if (items > 0) {
    const dim3 grid(
        static_cast<unsigned>((j_max + detail::kIndexerThreads - 1) / detail::kIndexerThreads), gy);
    detail::indexer_score_kernel<T><<<grid, detail::kIndexerThreads, 0, stream>>>(p);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    std::size_t have = cub_bytes;
    e = cub::DeviceSegmentedRadixSort::SortKeysDescending(base + lay.off_cub, have, p.sort_keys,
                                                          p.sorted, items, segments, p.seg_begin,
                                                          p.seg_end, 0, 64, stream);
    if (e != cudaSuccess) return e;
  }
  const dim3 grid(
      static_cast<unsigned>((params.top_k + detail::kIndexerThreads - 1) / detail::kIndexerThreads),
      gy);
  detail::indexer_output_kernel<T><<<grid, detail::kIndexerThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

/// Decode: the one query at position `n - 1` (n >= 1); see indexer_top_k.
template <class T>
cudaError_t indexer_decode(const IndexerParams& params, const float* q, const float* w,
                           const T* keys, std::int64_t num_keys, std::int64_t key_stride,
                           std::int64_t n, std::int32_t* indices, float* scores, void* workspace,
                           std::size_t& workspace_bytes, cudaStream_t stream = nullptr) {
  cudaError_t e = phasekv::cuda::detail::validate_into_status([&] {
    phasekv::detail::check_arg(n >= 1, "phasekv::dsv4::cuda::indexer_decode", "n", n,
                               "must be >= 1");
  });
  if (e != cudaSuccess) return e;
  return indexer_top_k<T>(params, q, w, keys, num_keys, key_stride, n - 1, 1, indices, scores,
                          workspace, workspace_bytes, stream);
}

}  // namespace dsv4::cuda
PHASEKV_NAMESPACE_END
