/// @file
/// @brief DeepSeek-V4 sparse attention on CUDA, the twin of dsv4/sparse_attention.hpp over
/// contiguous LatentRows (sparse_attention) and over page pools for a batch of sequences
/// (paged_sparse_attention, PagedSparseArgs): per query, the sliding window's raw rows plus the
/// entries of an index list (or the visible entries, HCA), K = V rows read once, per-head sinks.
///
/// One kernel body serves both, as on the CPU: it takes a *row source* (ContiguousSource or
/// PagedSource below) that says, per query row, its position, its list and where entry j and
/// raw position p live; the paged source's arithmetic is dsv4::paged_sparse_query
/// (dsv4/kernel_math.hpp) and detail::PagedLatentRows (dsv4/paged_latent.hpp), host/device code
/// the CPU kernel and the CPU tests run too.
///
/// Launch structure: one block of 256 threads per (query, group of up to 8 heads); the grid is
/// `num_queries x ceil(heads / 8)`. A block walks the query's items (the index list in order,
/// then the window's positions, see dsv4::sparse_item in dsv4/kernel_math.hpp) in tiles of 8
/// rows. Per tile it (1) converts the 8 rows to f32 into shared memory (one read of each row
/// from global memory, coalesced), (2) computes every (head, row) logit, one warp per pair
/// with a fixed shuffle reduction, (3) runs the online-softmax step of each head
/// (dsv4::softmax_tile_update) and (4) accumulates `p * row` into registers, one thread per
/// value channel for all heads of the block, from the same shared rows. So each row is loaded
/// once per block and serves the logits and the outputs of all its heads; with more than 8
/// heads the other head groups read it again (from L2). There is no split over rows: a decode
/// step with one query and few heads runs few blocks.
///
/// Results. Accumulation is f32 (FP8 rows times their tensor's scale, as on the CPU); the
/// finish (sink, normalization, lse) is dsv4::sparse_finish, the CPU's rule. The reduction
/// order differs from the CPU kernel's, so the bits do not equal the CPU's; both lie within
/// the test bounds of the float64 reference. The same inputs give the same bits every run.
///
/// Index values are in device memory and are not checked on the host: a value other than -1
/// outside `[entries.first, entries.first + entries.count)` is never read and makes every
/// output and lse of that query (for every head) NaN.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "phasekv/attention/cuda/status.cuh"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/dsv4/fp8.hpp"
#include "phasekv/dsv4/kernel_math.hpp"
#include "phasekv/dsv4/sparse_attention.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace dsv4::cuda {

/// Largest row width (`params.dim`) the CUDA kernel accepts.
inline constexpr std::int64_t kSparseMaxDim = 1024;
/// Largest value width (`params.dim_v`) the CUDA kernel accepts.
inline constexpr std::int64_t kSparseMaxDimV = 768;

namespace detail {

inline constexpr int kSparseThreads = 256;                ///< Threads per block.
inline constexpr int kSparseWarps = kSparseThreads / 32;  ///< Warps per block.
inline constexpr int kSparseHeads = 8;                    ///< Heads per block.
inline constexpr int kSparseTile = 8;                     ///< Rows per tile.
inline constexpr int kSparseChannels =                    ///< Value channels per thread.
    static_cast<int>(kSparseMaxDimV / kSparseThreads);
/// Dynamic shared memory available without an opt-in.
inline constexpr std::size_t kSparseDefaultSmem = 48 * 1024;

/// Carve-up of the dynamic shared memory of a sparse attention block (host and device).
struct SparseSmem {
  std::size_t off_q = 0;      ///< `[8, dim]` f32 queries.
  std::size_t off_rows = 0;   ///< `[8, dim]` f32 rows of the tile.
  std::size_t off_logit = 0;  ///< `[8 heads, 8 rows]` logits.
  std::size_t off_p = 0;      ///< `[8 heads, 8 rows]` weights times row scale.
  std::size_t off_rs = 0;     ///< `[8]` row scales.
  std::size_t off_m = 0;      ///< `[8]` running max per head.
  std::size_t off_den = 0;    ///< `[8]` running denominator per head.
  std::size_t off_c = 0;      ///< `[8]` accumulator rescale of the tile per head.
  std::size_t off_ptr = 0;    ///< `[8]` row handles of the tile (null: skipped).
  std::size_t off_flag = 0;   ///< One int: an invalid index was seen.
  std::size_t bytes = 0;      ///< Total.

  /// Layout for rows `dim` wide.
  PHASEKV_HOST_DEVICE static SparseSmem make(int dim) {
    SparseSmem L;
    std::size_t at = 0;
    const auto take = [&at](std::size_t n) {
      const std::size_t off = at;
      at = (at + n + 15) / 16 * 16;
      return off;
    };
    const auto d = static_cast<std::size_t>(dim);
    L.off_q = take(kSparseHeads * d * sizeof(float));
    L.off_rows = take(kSparseTile * d * sizeof(float));
    L.off_logit = take(kSparseHeads * kSparseTile * sizeof(float));
    L.off_p = take(kSparseHeads * kSparseTile * sizeof(float));
    L.off_rs = take(kSparseTile * sizeof(float));
    L.off_m = take(kSparseHeads * sizeof(float));
    L.off_den = take(kSparseHeads * sizeof(float));
    L.off_c = take(kSparseHeads * sizeof(float));
    L.off_ptr = take(kSparseTile * 2 * sizeof(void*));  // a pointer, or a QuantRow
    L.off_flag = take(sizeof(int));
    L.bytes = at;
    return L;
  }
};

/// Contiguous rows by position / index: the LatentRows themselves (row() is host/device).
template <class T>
using ContiguousRows = LatentRows<T>;

/// What one query row attends to, as the kernel sees it (see sparse_item()).
template <class RawRows, class EntryRows>
struct SparseQueryRows {
  std::int64_t t = 0;                  ///< Position.
  const std::int32_t* list = nullptr;  ///< Index list, or null.
  std::int64_t index_count = 0;        ///< Items of the list (or entries without one).
  std::int64_t entries_first = 0;      ///< First entry present (and first without a list).
  std::int64_t entries_count = 0;      ///< Entries present.
  RawRows raw;                         ///< Raw rows by position (`row(p)`, `scale`).
  EntryRows entries;                   ///< Entries by index (`row(j)`, `scale`).
};

/// Row source of sparse_attention(): query i at `first_position + i`, contiguous tensors.
template <class T>
struct ContiguousSource {
  ContiguousRows<T> raw;                  ///< Raw rows.
  ContiguousRows<T> entries;              ///< Entries.
  std::int64_t entries_count = 0;         ///< Entries present.
  const std::int32_t* indices = nullptr;  ///< `[num_queries, index_count]` or null.
  std::int64_t index_count = 0;           ///< Items of each list.
  std::int64_t first_position = 0;        ///< Position of query 0.
  std::int64_t ratio = 0;                 ///< Without lists: entries below (t + 1) / ratio.

  /// Query row `i`.
  PHASEKV_HOST_DEVICE SparseQueryRows<ContiguousRows<T>, ContiguousRows<T>> query(
      std::int64_t i) const {
    SparseQueryRows<ContiguousRows<T>, ContiguousRows<T>> r;
    r.t = first_position + i;
    r.list = indices != nullptr ? indices + i * index_count : nullptr;
    r.index_count = index_count;
    if (indices == nullptr && ratio > 0)  // HCA: the entries visible at t only
      r.index_count = dsv4::detail::hca_visible_count(r.t, ratio, entries.first, index_count);
    r.entries_first = entries.first;
    r.entries_count = entries_count;
    r.raw = raw;
    r.entries = entries;
    return r;
  }
};

/// Row source of paged_sparse_attention(): the device view of a PagedSparseArgs.
template <class T>
struct PagedSource {
  const std::int32_t* qo_indptr = nullptr;  ///< `[batch + 1]` or null (decode).
  std::int64_t batch = 0;                   ///< Sequences.
  const std::int64_t* lengths = nullptr;    ///< `[batch]` n_b.
  PagePool<const T> raw_pool;               ///< Raw rows.
  BlockTable raw_table;                     ///< Raw pages.
  float raw_scale = 1.0f;                   ///< Raw scale.
  std::int64_t raw_ring = 0;                ///< Raw ring slots (0: none).
  PagePool<const T> entry_pool;             ///< Entries.
  BlockTable entry_table;                   ///< Entry pages.
  float entry_scale = 1.0f;                 ///< Entry scale.
  std::int64_t ratio = 0;                   ///< S (0: no entries).
  const std::int32_t* indices = nullptr;    ///< `[rows, index_count]` or null.
  std::int64_t index_count = 0;             ///< Items of each list.

  /// Query row `row` (dsv4::paged_sparse_query; the rows of its sequence's pages).
  PHASEKV_HOST_DEVICE
  SparseQueryRows<dsv4::detail::PagedLatentRows<T>, dsv4::detail::PagedLatentRows<T>> query(
      std::int64_t row) const {
    const PagedSparseQuery pq =
        paged_sparse_query(row, qo_indptr, batch, lengths, ratio, indices != nullptr, index_count);
    SparseQueryRows<dsv4::detail::PagedLatentRows<T>, dsv4::detail::PagedLatentRows<T>> r;
    r.t = pq.t;
    r.list = indices != nullptr ? indices + row * index_count : nullptr;
    r.index_count = pq.index_count;
    r.entries_first = 0;
    r.entries_count = pq.entries;
    r.raw = dsv4::detail::paged_rows<T>(raw_pool, raw_table, pq.seq, raw_ring, raw_scale);
    r.entries = dsv4::detail::paged_rows<T>(entry_pool, entry_table, pq.seq, 0, entry_scale);
    return r;
  }
};

/// Kernel arguments (built on the host).
template <class T, class Source>
struct SparseKernelParams {
  int heads = 0;                 ///< Query heads H.
  int dim = 0;                   ///< Row width.
  int dim_v = 0;                 ///< Value width.
  std::int64_t window = 0;       ///< Sliding window.
  float scale = 1.0f;            ///< Softmax scale.
  const float* sinks = nullptr;  ///< `[heads]` or null.
  const float* q = nullptr;      ///< `[num_queries, heads, dim]`.
  Source source;                 ///< Where each query's rows are.
  float* out = nullptr;          ///< `[num_queries, heads, dim_v]`.
  float* lse = nullptr;          ///< `[num_queries, heads]`.
  SparseSmem smem;               ///< Shared-memory layout.
};

#if !defined(PHASEKV_DOXYGEN)  // Doxygen cannot parse the kernel body (and detail is hidden)
/// Block (query row x, head group y) over any row source; see the file description.
template <class T, class Source>
__global__ void __launch_bounds__(kSparseThreads)
    sparse_attention_kernel(const __grid_constant__ SparseKernelParams<T, Source> p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const SparseSmem& L = p.smem;
  float* sq = reinterpret_cast<float*>(smem + L.off_q);
  float* srow = reinterpret_cast<float*>(smem + L.off_rows);
  float* slogit = reinterpret_cast<float*>(smem + L.off_logit);
  float* sp = reinterpret_cast<float*>(smem + L.off_p);
  float* srs = reinterpret_cast<float*>(smem + L.off_rs);
  float* sm = reinterpret_cast<float*>(smem + L.off_m);
  float* sden = reinterpret_cast<float*>(smem + L.off_den);
  float* sc = reinterpret_cast<float*>(smem + L.off_c);
  using Row = dsv4::detail::row_t<T>;
  Row* sptr = reinterpret_cast<Row*>(smem + L.off_ptr);
  int* sflag = reinterpret_cast<int*>(smem + L.off_flag);

  const std::int64_t qi = blockIdx.x;
  const int g0 = static_cast<int>(blockIdx.y) * kSparseHeads;
  const int heads = p.heads - g0 < kSparseHeads ? p.heads - g0 : kSparseHeads;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int d = p.dim, dv = p.dim_v;

  const float* qb = p.q + (qi * p.heads + g0) * d;
  for (int i = tid; i < kSparseHeads * d; i += kSparseThreads) sq[i] = i < heads * d ? qb[i] : 0.0f;
  if (tid < kSparseHeads) {
    sm[tid] = -HUGE_VALF;
    sden[tid] = 0.0f;
  }
  if (tid == 0) *sflag = 0;

  const auto rows = p.source.query(qi);
  const SparseWindow win = sparse_window(rows.t, p.window);
  const std::int64_t total = rows.index_count + win.count;

  float acc[kSparseHeads][kSparseChannels];
#pragma unroll
  for (int g = 0; g < kSparseHeads; ++g)
#pragma unroll
    for (int m = 0; m < kSparseChannels; ++m) acc[g][m] = 0.0f;
  __syncthreads();

  for (std::int64_t base = 0; base < total; base += kSparseTile) {
    const int n = total - base < kSparseTile ? static_cast<int>(total - base) : kSparseTile;
    // (0) which rows: pointers and scales.
    if (tid < kSparseTile) {
      Row ptr{};
      float rs = 1.0f;
      if (tid < n) {
        const SparseItem it = sparse_item(base + tid, rows.list, rows.index_count,
                                          rows.entries_first, rows.entries_count, win);
        if (it.kind == SparseItem::entry) {
          ptr = rows.entries.row(it.row);
          rs = rows.entries.scale;
        } else if (it.kind == SparseItem::raw) {
          ptr = rows.raw.row(it.row);
          rs = rows.raw.scale;
        } else if (it.kind == SparseItem::invalid) {
          *sflag = 1;
        }
      }
      sptr[tid] = ptr;
      srs[tid] = rs;
    }
    __syncthreads();
    // (1) rows to f32, once for every head of the block.
    for (int idx = tid; idx < n * d; idx += kSparseThreads) {
      const int r = idx / d;
      const Row ptr = sptr[r];
      srow[idx] = dsv4::detail::row_address(ptr) != nullptr
                      ? dsv4::detail::load_channel<T>(ptr, idx - r * d)
                      : 0.0f;
    }
    __syncthreads();
    // (2) logits: one warp per (head, row), lanes over the channels, a fixed butterfly sum.
    for (int pair = warp; pair < kSparseHeads * kSparseTile; pair += kSparseWarps) {
      const int g = pair / kSparseTile, r = pair - g * kSparseTile;
      const bool live = g < heads && r < n && dsv4::detail::row_address(sptr[r]) != nullptr;
      if (!live) {
        if (lane == 0) slogit[pair] = -HUGE_VALF;
        continue;
      }
      const float* qg = sq + g * d;
      const float* x = srow + r * d;
      float dot = 0.0f;
      for (int c = lane; c < d; c += 32) dot = fmaf(qg[c], x[c], dot);
#pragma unroll
      for (int off = 16; off >= 1; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      if (lane == 0) slogit[pair] = (p.scale * srs[r]) * dot;
    }
    __syncthreads();
    // (3) online softmax step per head.
    if (tid < heads)
      sc[tid] = softmax_tile_update(sm[tid], sden[tid], slogit + tid * kSparseTile, srs, n,
                                    sp + tid * kSparseTile);
    __syncthreads();
    // (4) accumulate the values, one thread per channel for all heads.
#pragma unroll
    for (int m = 0; m < kSparseChannels; ++m) {
      const int c = tid + m * kSparseThreads;
      if (c < dv) {
#pragma unroll
        for (int g = 0; g < kSparseHeads; ++g) {
          if (g < heads) {
            float a = acc[g][m] * sc[g];
            for (int r = 0; r < n; ++r) a = fmaf(sp[g * kSparseTile + r], srow[r * d + c], a);
            acc[g][m] = a;
          }
        }
      }
    }
    __syncthreads();
  }

  const bool bad = *sflag != 0;
  const std::int64_t row0 = qi * p.heads + g0;
#pragma unroll
  for (int g = 0; g < kSparseHeads; ++g) {
    if (g < heads) {
      const SparseFinish f = sparse_finish(sm[g], sden[g], p.sinks != nullptr,
                                           p.sinks != nullptr ? p.sinks[g0 + g] : 0.0f);
#pragma unroll
      for (int m = 0; m < kSparseChannels; ++m) {
        const int c = tid + m * kSparseThreads;
        if (c < dv) p.out[(row0 + g) * dv + c] = bad ? nanf("") : (acc[g][m] * f.f1) * f.f2;
      }
      if (tid == 0) p.lse[row0 + g] = bad ? nanf("") : f.lse;
    }
  }
}
#endif

/// Launches sparse_attention_kernel over `rows` query rows of `src` (arguments checked).
template <class T, class Source>
cudaError_t launch_sparse(const SparseAttentionParams& params, const float* q, const Source& src,
                          std::int64_t rows, float* out, float* lse, cudaStream_t stream) {
  SparseKernelParams<T, Source> p;
  p.heads = static_cast<int>(params.heads);
  p.dim = static_cast<int>(params.dim);
  p.dim_v = static_cast<int>(params.dim_v);
  p.window = params.window;
  p.scale = params.scale;
  p.sinks = params.sinks;
  p.q = q;
  p.source = src;
  p.out = out;
  p.lse = lse;
  p.smem = SparseSmem::make(p.dim);
  auto kernel = sparse_attention_kernel<T, Source>;
  if (p.smem.bytes > kSparseDefaultSmem) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(p.smem.bytes));
    if (e != cudaSuccess) return e;
  }
  const dim3 grid(static_cast<unsigned>(rows),
                  static_cast<unsigned>((params.heads + kSparseHeads - 1) / kSparseHeads));
  kernel<<<grid, kSparseThreads, p.smem.bytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace detail

/// Host validation of a CUDA sparse attention call (no device access): the CPU's checks of
/// phasekv::dsv4::sparse_attention (same arguments, same messages) except the index values,
/// which live on the device, plus the kernel's limits (`dim <= 1024`, `dim_v <= 768`,
/// `num_queries <= 2^31 - 1`). Throws phasekv::invalid_argument (capacity_error for rows that
/// are not present).
template <class T>
void check_sparse_attention_args(const SparseAttentionParams& params, const float* q,
                                 const LatentRows<T>& raw, const LatentRows<T>& entries,
                                 const std::int32_t* indices, std::int64_t index_count,
                                 std::int64_t first_position, std::int64_t num_queries,
                                 const float* out, const float* lse, std::int64_t ratio = 0) {
  const char* where = "phasekv::dsv4::cuda::sparse_attention";
  using phasekv::detail::check_arg;
  params.check(where);
  check_arg(params.dim <= kSparseMaxDim, where, "params.dim", params.dim,
            "must be <= 1024 on CUDA");
  check_arg(params.dim_v <= kSparseMaxDimV, where, "params.dim_v", params.dim_v,
            "must be <= 768 on CUDA");
  check_arg(num_queries >= 0 && num_queries <= (std::int64_t{1} << 31) - 1, where, "num_queries",
            num_queries, "must be in [0, 2^31 - 1]");
  check_arg(first_position >= 0 && first_position <= (std::int64_t{1} << 62) - num_queries, where,
            "first_position", first_position, "must be in [0, 2^62 - num_queries]");
  check_arg(index_count >= 0, where, "index_count", index_count, "must be >= 0");
  dsv4::detail::check_hca_ratio(indices != nullptr, index_count, ratio, num_queries, where);
  if (num_queries == 0) return;
  check_arg(q != nullptr, where, "q", "null", "must not be null");
  check_arg(out != nullptr && lse != nullptr, where, "out", "null", "out and lse must not be null");
  check_arg(std::isfinite(raw.scale) && raw.scale > 0.0f, where, "raw.scale", raw.scale,
            "must be finite and > 0");
  check_arg(std::isfinite(entries.scale) && entries.scale > 0.0f, where, "entries.scale",
            entries.scale, "must be finite and > 0");
  if (params.window > 0) {
    const std::int64_t lo = sparse_window(first_position, params.window).lo;
    const std::int64_t hi = first_position + num_queries;  // one past the last raw position
    check_arg(raw.data != nullptr, where, "raw.data", "null", "must not be null (window > 0)");
    dsv4::detail::check_rows(raw, params.dim, where, "raw");
    check_arg<capacity_error>(raw.first <= lo, where, "raw.first", raw.first,
                              "must be <= the first windowed position of the first query");
    check_arg<capacity_error>(raw.first + raw.count >= hi, where, "raw.count", raw.count,
                              "must reach the last query's position");
  }
  if (index_count > 0 && entries.count > 0) {
    check_arg(entries.data != nullptr, where, "entries.data", "null",
              "must not be null when entries.count > 0");
    dsv4::detail::check_rows(entries, params.dim, where, "entries");
  }
  if (index_count > 0 && indices == nullptr)
    check_arg<capacity_error>(index_count <= entries.count, where, "index_count", index_count,
                              "must be <= entries.count when indices is null");
}

/// phasekv::dsv4::sparse_attention on `stream`, the same arguments with device pointers: `q`
/// `[num_queries, heads, dim]`, `raw.data`, `entries.data`, `indices` `[num_queries,
/// index_count]` (or null: HCA, query t attends to the entries of `[entries.first,
/// entries.first + index_count)` below `(t + 1) / ratio`, all of them when `ratio` is 0, for
/// one query only), `params.sinks` `[heads]` (or null), `out` `[num_queries, heads, dim_v]` and
/// `lse` `[num_queries, heads]`. Storage T: float, bf16_t, f16_t, fp8_e4m3_t (with the rows'
/// `scale`), or a FlashMLA cache format (model1_fp8_t, v32_fp8_t; dsv4/cache_format.hpp). See
/// the file description for the launch, the bits and invalid indices.
/// Needs no workspace, allocates nothing, does not synchronize.
///
/// @return `cudaSuccess`; `cudaErrorInvalidValue` for rejected arguments (message in
///         phasekv::cuda::last_error_message(), nothing launched); or the launch error.
template <class T>
cudaError_t sparse_attention(const SparseAttentionParams& params, const float* q,
                             const LatentRows<T>& raw, const LatentRows<T>& entries,
                             const std::int32_t* indices, std::int64_t index_count,
                             std::int64_t first_position, std::int64_t num_queries, float* out,
                             float* lse, cudaStream_t stream = nullptr, std::int64_t ratio = 0) {
  cudaError_t e = phasekv::cuda::detail::validate_into_status([&] {
    check_sparse_attention_args<T>(params, q, raw, entries, indices, index_count, first_position,
                                   num_queries, out, lse, ratio);
  });
  if (e != cudaSuccess || num_queries == 0) return e;
  detail::ContiguousSource<T> src;
  src.raw = raw;
  src.entries = entries;
  src.entries_count = entries.count;
  src.indices = index_count > 0 ? indices : nullptr;
  src.index_count = index_count;
  src.first_position = first_position;
  src.ratio = ratio;
  return detail::launch_sparse<T>(params, q, src, num_queries, out, lse, stream);
}

namespace detail {
// Same table shape: batch, CSR or dense, dense row stride.
inline bool same_table_shape(const BlockTable& a, const BlockTable& b) {
  return a.batch == b.batch && (a.indptr == nullptr) == (b.indptr == nullptr) &&
         (a.indptr != nullptr || a.row_stride == b.row_stride);
}
// A CPU check's message with the CPU function's name `from` (its prefix) replaced by `to`.
inline std::string renamed(const std::string& msg, const std::string& from, const char* to) {
  return msg.compare(0, from.size(), from) == 0 ? to + msg.substr(from.size()) : msg;
}
}  // namespace detail

/// Host validation of a CUDA paged sparse attention call, without reading device memory.
///
/// `host` holds host copies of the batch metadata (`batch`, `qo_indptr`, `lengths`, the block
/// tables' `indptr` / `indices`; nothing else of it is read); `device` is the call's arguments
/// with device pointers. Runs the CPU's checks of phasekv::dsv4::paged_sparse_attention on
/// `device` with `host`'s metadata (same messages: pool shapes, page indices, table lengths,
/// rings, scales; the index lists live on the device and are not checked), then that the
/// device tables have the host tables' shapes and the kernel's limits (`dim <= 1024`, `dim_v <=
/// 768`, at most 2^31 - 1 query rows). Throws phasekv::invalid_argument (capacity_error,
/// shape_error as the CPU does). Allocates host memory (the CPU check's messages and accumulators).
template <class T>
void check_paged_sparse_attention_args(const SparseAttentionParams& params,
                                       const PagedSparseArgs<T>& host,
                                       const PagedSparseArgs<T>& device) {
  const char* where = "phasekv::dsv4::cuda::paged_sparse_attention";
  using phasekv::detail::check_arg;
  check_arg(params.dim <= kSparseMaxDim, where, "params.dim", params.dim,
            "must be <= 1024 on CUDA");
  check_arg(params.dim_v <= kSparseMaxDimV, where, "params.dim_v", params.dim_v,
            "must be <= 768 on CUDA");
  check_arg(device.batch == host.batch, where, "device.batch", device.batch,
            "must equal host.batch");
  check_arg(device.ratio > 0 || device.indices == nullptr || device.index_count == 0, where,
            "args.index_count", device.index_count,
            "must be 0 (or indices null) when ratio = 0 (no entries)");
  check_arg((device.qo_indptr == nullptr) == (host.qo_indptr == nullptr), where, "device.qo_indptr",
            device.qo_indptr == nullptr ? "null" : "set",
            "must be null exactly when host.qo_indptr is");
  // The CPU's checks, on the device arguments with the host's metadata; no sequence is run.
  PagedSparseArgs<T> chk = device;
  chk.qo_indptr = host.qo_indptr;
  chk.lengths = host.lengths;
  chk.raw_table = host.raw_table;
  chk.entry_table = host.entry_table;
  chk.indices = nullptr;  // device memory: not checked here
  const char* cpu = "phasekv::dsv4::paged_sparse_attention";
  try {
    phasekv::dsv4::paged_sparse_attention<T>(params, chk, 0, 0);
  } catch (const shape_error& e) {
    throw shape_error(detail::renamed(e.what(), cpu, where));
  } catch (const capacity_error& e) {
    throw capacity_error(detail::renamed(e.what(), cpu, where));
  } catch (const phasekv::invalid_argument& e) {
    throw phasekv::invalid_argument(detail::renamed(e.what(), cpu, where));
  }
  if (host.batch == 0) return;
  const std::int64_t rows =
      host.qo_indptr != nullptr ? std::int64_t{host.qo_indptr[host.batch]} : host.batch;
  check_arg(rows <= (std::int64_t{1} << 31) - 1, where, "rows", rows,
            "(query rows) must be <= 2^31 - 1 on CUDA");
  if (rows == 0) return;
  check_arg(device.lengths != nullptr, where, "device.lengths", "null",
            "must point to [batch] (device)");
  check_arg(detail::same_table_shape(device.raw_table, host.raw_table) &&
                detail::same_table_shape(device.entry_table, host.entry_table),
            where, "device.raw_table.batch", device.raw_table.batch,
            "the device tables must have the host tables' shapes (batch, CSR or dense, stride)");
}

/// phasekv::dsv4::paged_sparse_attention on `stream`: the same PagedSparseArgs view of the
/// pages, with device pointers in `device` (queries, lengths, qo_indptr, pools, tables, index
/// lists, sinks in `params.sinks`, out, lse) and host copies of the metadata in `host` (see
/// check_paged_sparse_attention_args). The same kernel body as sparse_attention() runs, with a
/// row source that finds each query row's sequence (binary search over the device `qo_indptr`),
/// position `t = n_b - q_b + i` and pages (paged_latent.hpp's mapping, rings included). Each
/// query attends to its list's entries (-1 skipped; a value outside `[0, floor(n_b / ratio))`
/// makes that query's outputs and lse NaN, as in sparse_attention()) or, without lists, to the
/// entries `[0, floor((t + 1) / ratio))`, plus the window's raw rows. One block per (query row,
/// group of 8 heads). Same bits as sparse_attention() over the same rows gathered into
/// contiguous tensors, for any page size and order; within the CPU's bounds of the float64
/// reference (not the CPU's bits). Needs no workspace, allocates no device memory, does not
/// synchronize.
///
/// @return `cudaSuccess`; `cudaErrorInvalidValue` for rejected arguments (message in
///         phasekv::cuda::last_error_message(), nothing launched); or the launch error.
template <class T>
cudaError_t paged_sparse_attention(const SparseAttentionParams& params,
                                   const PagedSparseArgs<T>& host, const PagedSparseArgs<T>& device,
                                   cudaStream_t stream = nullptr) {
  cudaError_t e = phasekv::cuda::detail::validate_into_status(
      [&] { check_paged_sparse_attention_args<T>(params, host, device); });
  if (e != cudaSuccess || host.batch == 0) return e;
  const std::int64_t rows =
      host.qo_indptr != nullptr ? std::int64_t{host.qo_indptr[host.batch]} : host.batch;
  if (rows == 0) return e;
  detail::PagedSource<T> src;
  src.qo_indptr = device.qo_indptr;
  src.batch = device.batch;
  src.lengths = device.lengths;
  src.raw_pool = device.raw_pool;
  src.raw_table = device.raw_table;
  src.raw_scale = device.raw_scale;
  src.raw_ring = device.raw_ring;
  src.entry_pool = device.entry_pool;
  src.entry_table = device.entry_table;
  src.entry_scale = device.entry_scale;
  src.ratio = device.ratio;
  src.indices = device.index_count > 0 ? device.indices : nullptr;
  src.index_count = device.index_count;
  if (device.indices != nullptr && device.index_count == 0) {
    // an empty list per query: no entries (the CPU attends to none either)
    src.indices = nullptr;
    src.ratio = 0;
  }
  return detail::launch_sparse<T>(params, device.q, src, rows, device.out, device.lse, stream);
}

}  // namespace dsv4::cuda
PHASEKV_NAMESPACE_END
