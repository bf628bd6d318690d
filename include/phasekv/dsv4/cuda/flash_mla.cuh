/// @file
/// @brief FlashMLA's sparse decode call, `flash_mla_with_kvcache` with `indices`, on CUDA: the
/// twin of dsv4/flash_mla.hpp (the same phasekv::dsv4::FlashMlaArgs, with device pointers, and
/// the same meaning), run by the CUDA sparse attention kernel of dsv4/cuda/sparse_attention.cuh
/// over the caches' bytes (bf16, f32, f16, FP8 E4M3, MODEL1, V3.2).
///
/// Three kernels on the stream: (1) the two index lists of each query row become one list in
/// the workspace, `indices[b][i][k]` for `k < topk_length[b]`, then `n0 +
/// extra_indices_in_kvcache[b][i][k]` for `k < extra_topk_length[b]` (n0 = the first cache's
/// `num_blocks * page_block_size`; the other slots -1); (2) the sparse attention kernel with
/// that list, no window and no sink, over a row source whose rows `[0, n0)` are the first
/// cache's and `[n0, ...)` the extra cache's (dsv4::detail::FlashMlaRows, the CPU's); (3) the
/// finish: `out *= 1 / (1 + exp(attn_sink[h] - lse))`, `lse` moved to `[batch, h_q, s_q]`, and
/// a query with no row gets `out = 0`, `lse = +inf` (FlashMLA's convention).
///
/// Lengths and indices are device memory and are not checked on the host: a length outside
/// `[0, topk]` or an index other than -1 outside its cache makes that query row's outputs and
/// lse NaN (for every head), as in cuda::sparse_attention. Everything else is checked on the
/// host with the CPU call's messages. Results agree with the CPU call within f32 rounding (a
/// different summation order, not the same bits); the same inputs give the same bits every run.
///
/// Verified: compiled for sm_80 and sm_90 with nvcc 13; the device tests
/// (tests/dsv4/test_dsv4_cuda_flash_mla.cu, against the CPU call) have not yet run on a GPU.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "phasekv/attention/cuda/status.cuh"
#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/dsv4/cuda/sparse_attention.cuh"
#include "phasekv/dsv4/flash_mla.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace dsv4::cuda {

namespace detail {

inline constexpr int kFlashMlaThreads = 256;  ///< Threads per block of the list and finish kernels.

/// Workspace carve-up: the merged lists (int32), then the kernel's lse `[rows, h_q]` (f32).
struct FlashMlaWorkspace {
  std::size_t lists = 0;  ///< Bytes of the lists.
  std::size_t lse = 0;    ///< Offset of the lse (16-byte aligned).
  std::size_t bytes = 0;  ///< Total.
};

template <class T>
FlashMlaWorkspace flash_mla_workspace(const FlashMlaArgs<T>& a) {
  FlashMlaWorkspace w;
  const auto rows = static_cast<std::size_t>(a.batch * a.s_q);
  w.lists = rows * static_cast<std::size_t>(a.topk + a.extra_topk) * sizeof(std::int32_t);
  w.lse = (w.lists + 15) / 16 * 16;
  w.bytes = w.lse + rows * static_cast<std::size_t>(a.h_q) * sizeof(float);
  return w;
}

/// Arguments of the list and finish kernels (device pointers).
struct FlashMlaLists {
  std::int64_t rows = 0, s_q = 0, h_q = 0, dv = 0;
  const std::int32_t* indices = nullptr;  ///< `[rows, topk]`.
  std::int64_t topk = 0;
  const std::int32_t* topk_length = nullptr;  ///< `[batch]` or null.
  std::int64_t n0 = 0;                        ///< Rows of the first cache.
  const std::int32_t* extra = nullptr;        ///< `[rows, extra_topk]` or null.
  std::int64_t extra_topk = 0;
  const std::int32_t* extra_length = nullptr;  ///< `[batch]` or null.
  std::int64_t n1 = 0;                         ///< Rows of the extra cache.
  std::int32_t* merged = nullptr;              ///< `[rows, topk + extra_topk]`.
  const float* sinks = nullptr;                ///< `[h_q]` or null.
  float* out = nullptr;                        ///< `[rows, h_q, dv]`.
  float* lse_in = nullptr;                     ///< `[rows, h_q]` (the kernel's, workspace).
  float* lse = nullptr;                        ///< `[batch, h_q, s_q]`.
};

/// Slot k of row r of the merged list: -1, an index of the combined space, or n0 + n1 (out of
/// range, so the attention kernel makes the row NaN) for a bad length or index.
PHASEKV_HOST_DEVICE inline std::int32_t flash_mla_merged_slot(const FlashMlaLists& l,
                                                              std::int64_t r, std::int64_t k) {
  const std::int64_t b = r / l.s_q, bad = l.n0 + l.n1;
  const bool first = k < l.topk;
  const std::int64_t kk = first ? k : k - l.topk, width = first ? l.topk : l.extra_topk;
  const std::int32_t* len = first ? l.topk_length : l.extra_length;
  const std::int64_t n = len != nullptr ? std::int64_t{len[b]} : width;
  if (n < 0 || n > width) return static_cast<std::int32_t>(bad);
  if (kk >= n) return -1;
  const std::int64_t v = first ? l.indices[r * l.topk + kk] : l.extra[r * l.extra_topk + kk];
  if (v == -1) return -1;
  const std::int64_t size = first ? l.n0 : l.n1;
  if (v < 0 || v >= size) return static_cast<std::int32_t>(bad);
  return static_cast<std::int32_t>(first ? v : l.n0 + v);
}

#if !defined(PHASEKV_DOXYGEN)
/// Grid-stride over the merged lists' slots.
__global__ void __launch_bounds__(kFlashMlaThreads)
    flash_mla_lists_kernel(const __grid_constant__ FlashMlaLists l) {
  const std::int64_t width = l.topk + l.extra_topk, total = l.rows * width;
  for (std::int64_t i = blockIdx.x * std::int64_t{kFlashMlaThreads} + threadIdx.x; i < total;
       i += std::int64_t{gridDim.x} * kFlashMlaThreads)
    l.merged[i] = flash_mla_merged_slot(l, i / width, i % width);
}

/// Block r: query row r's sink scaling, lse layout and empty rows.
__global__ void __launch_bounds__(kFlashMlaThreads)
    flash_mla_finish_kernel(const __grid_constant__ FlashMlaLists l) {
  const std::int64_t r = blockIdx.x, b = r / l.s_q, i = r % l.s_q;
  for (std::int64_t x = threadIdx.x; x < l.h_q * l.dv; x += kFlashMlaThreads) {
    const std::int64_t h = x / l.dv;
    const float lse = l.lse_in[r * l.h_q + h];
    if (l.sinks != nullptr && lse != -HUGE_VALF)
      l.out[r * l.h_q * l.dv + x] *= 1.0f / (1.0f + ::expf(l.sinks[h] - lse));
  }
  for (std::int64_t h = threadIdx.x; h < l.h_q; h += kFlashMlaThreads) {
    const float lse = l.lse_in[r * l.h_q + h];
    l.lse[(b * l.h_q + h) * l.s_q + i] = lse == -HUGE_VALF ? HUGE_VALF : lse;
  }
}
#endif

/// Row source of the FlashMLA call: query row i reads its merged list; no window.
template <class T>
struct FlashMlaSource {
  dsv4::detail::FlashMlaRows<T> rows;   ///< Both caches by one index space.
  const std::int32_t* lists = nullptr;  ///< `[rows, width]` merged lists.
  std::int64_t width = 0;               ///< topk + extra_topk.
  std::int64_t total = 0;               ///< n0 + n1.

  /// Query row `i`.
  PHASEKV_HOST_DEVICE
  SparseQueryRows<dsv4::detail::FlashMlaRows<T>, dsv4::detail::FlashMlaRows<T>> query(
      std::int64_t i) const {
    SparseQueryRows<dsv4::detail::FlashMlaRows<T>, dsv4::detail::FlashMlaRows<T>> r;
    r.t = 0;
    r.list = lists + i * width;
    r.index_count = width;
    r.entries_first = 0;
    r.entries_count = total;
    r.raw = rows;
    r.entries = rows;
    return r;
  }
};

}  // namespace detail

/// Bytes of device workspace flash_mla_with_kvcache() needs for `args` (host call, nothing read
/// from the device): the merged index lists and the kernel's lse.
template <class T>
std::size_t flash_mla_workspace_bytes(const FlashMlaArgs<T>& args) {
  return detail::flash_mla_workspace(args).bytes;
}

/// Host validation of the CUDA call: the CPU call's checks (the same messages, with
/// `phasekv::dsv4::cuda::flash_mla_with_kvcache`) except the values of the lengths and index
/// lists (device memory), plus the kernel's limits (`head_dim <= 1024`, `head_dim_v <= 768`,
/// `batch * s_q <= 2^31 - 1`, the merged list width `topk + extra_topk <= 2^31 - 1`) and the
/// workspace (`workspace_bytes >= flash_mla_workspace_bytes(args)`, a non-null `workspace`).
/// Throws phasekv::invalid_argument naming the argument.
template <class T>
void check_flash_mla_args(const FlashMlaArgs<T>& a, const void* workspace,
                          std::size_t workspace_bytes) {
  const char* where = "phasekv::dsv4::cuda::flash_mla_with_kvcache";
  using phasekv::detail::check_arg;
  dsv4::detail::check_flash_mla_args(a, where, false);
  check_arg(a.head_dim <= kSparseMaxDim, where, "head_dim", a.head_dim, "must be <= 1024 on CUDA");
  check_arg(a.head_dim_v <= kSparseMaxDimV, where, "head_dim_v", a.head_dim_v,
            "must be <= 768 on CUDA");
  if (a.batch == 0 || a.s_q == 0) return;
  check_arg(a.batch * a.s_q <= (std::int64_t{1} << 31) - 1, where, "batch", a.batch,
            "times s_q must be <= 2^31 - 1 on CUDA");
  const std::size_t need = flash_mla_workspace_bytes(a);
  check_arg(workspace_bytes >= need, where, "workspace_bytes", workspace_bytes,
            "must be >= flash_mla_workspace_bytes(args)");
  check_arg(workspace != nullptr, where, "workspace", "null",
            "must point to flash_mla_workspace_bytes(args) bytes of device memory");
}

/// phasekv::dsv4::flash_mla_with_kvcache on `stream`: the same FlashMlaArgs with device
/// pointers (q, the caches' data, indices, lengths, attn_sink, out, lse), `workspace` device
/// memory of at least flash_mla_workspace_bytes(args) bytes (16-byte aligned, as cudaMalloc
/// gives). Writes `out` `[batch, s_q, h_q, head_dim_v]` and `lse` `[batch, h_q, s_q]`; see the
/// file description for the kernels and for bad lengths or indices. Allocates nothing, does
/// not synchronize.
///
/// @return `cudaSuccess`; `cudaErrorInvalidValue` for rejected arguments (message in
///         phasekv::cuda::last_error_message(), nothing launched); or a launch error.
template <class T>
cudaError_t flash_mla_with_kvcache(const FlashMlaArgs<T>& a, void* workspace,
                                   std::size_t workspace_bytes, cudaStream_t stream = nullptr) {
  cudaError_t e = phasekv::cuda::detail::validate_into_status(
      [&] { check_flash_mla_args<T>(a, workspace, workspace_bytes); });
  if (e != cudaSuccess || a.batch == 0 || a.s_q == 0) return e;
  const bool extra = a.extra_k_cache.data != nullptr;
  const detail::FlashMlaWorkspace w = detail::flash_mla_workspace(a);
  auto* base = static_cast<unsigned char*>(workspace);
  detail::FlashMlaLists l;
  l.rows = a.batch * a.s_q;
  l.s_q = a.s_q;
  l.h_q = a.h_q;
  l.dv = a.head_dim_v;
  l.indices = a.indices;
  l.topk = a.topk;
  l.topk_length = a.topk_length;
  l.n0 = a.k_cache.num_blocks * a.k_cache.page_block_size;
  l.extra = extra ? a.extra_indices_in_kvcache : nullptr;
  l.extra_topk = extra ? a.extra_topk : 0;
  l.extra_length = extra ? a.extra_topk_length : nullptr;
  l.n1 = extra ? a.extra_k_cache.num_blocks * a.extra_k_cache.page_block_size : 0;
  l.merged = reinterpret_cast<std::int32_t*>(base);
  l.sinks = a.attn_sink;
  l.out = a.out;
  l.lse_in = reinterpret_cast<float*>(base + w.lse);
  l.lse = a.lse;
  const std::int64_t width = l.topk + l.extra_topk;
  if (width > 0) {
    const std::int64_t blocks =
        (l.rows * width + detail::kFlashMlaThreads - 1) / detail::kFlashMlaThreads;
    detail::flash_mla_lists_kernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535),
                                     detail::kFlashMlaThreads, 0, stream>>>(l);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  const SparseAttentionParams p = dsv4::detail::flash_mla_sparse_params(a);  // no sink: finish
  detail::FlashMlaSource<T> src;
  src.rows = dsv4::detail::flash_mla_rows(a);
  src.lists = l.merged;
  src.width = width;
  src.total = l.n0 + l.n1;
  e = detail::launch_sparse<T>(p, a.q, src, l.rows, a.out, l.lse_in, stream);
  if (e != cudaSuccess) return e;
  detail::flash_mla_finish_kernel<<<static_cast<unsigned>(l.rows), detail::kFlashMlaThreads, 0,
                                    stream>>>(l);
  return cudaGetLastError();
}

}  // namespace dsv4::cuda
PHASEKV_NAMESPACE_END
