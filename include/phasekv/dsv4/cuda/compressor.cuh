/// @file
/// @brief The DeepSeek-V4 compressor on CUDA, the twin of dsv4/compressor.hpp: batch
/// compression of a prefill (cuda::compress) and a batch of sequences appending tokens with the
/// entries written into pages (cuda::compress_append_paged, the same PagedCompressArgs, state
/// layout in caller memory, page mapping and storage conversion as the CPU's).
///
/// Launch structure. Entries: one block of 128 threads per entry, one thread per channel
/// (strided over `dim`), each thread running dsv4::compressor_pool_channel (dsv4/kernel_math.hpp)
/// over its channel of the window's rows; the loads of a row are coalesced over the threads.
/// The batch and the streaming path both call that function with a dsv4::CompressorRows source
/// (batch: every row from the input; streaming: tokens before n from the state), so on the
/// device streaming equals batch bit for bit, in any chunking. A paged append launches two
/// kernels on the stream: the entries (grid: the most entries one sequence completes x
/// sequences), then the state update (one block per sequence: the input rows of
/// `[compressor_state_begin(n + c), n + c)` go to their state rows, then `tokens[b] += c`).
///
/// Results. The pooled values are not the CPU's bits: the device runs CUDA's expf (within 2
/// ulp) where the CPU kernel runs its own vectorized polynomial exp (relative error below
/// 2e-7), and the sums run over the rows in the same order but with the device's explicit
/// fused multiply-adds. Both lie within a few f32 ulp of the float64 formulas per weight; after
/// storage both round to the entry type (so bf16/FP8 entries may differ by one code where the
/// value lies near a rounding boundary).
/// Hooks. Both calls take a hook, as the CPU's do: a device-callable functor
/// `hook(const EntryInfo&, float* entry)` (phasekv::dsv4::EntryPostprocess is one: the model's
/// norm, RoPE and FP8 or Hadamard + FP4, with its `weight` in device memory). With a hook (or a
/// FlashMLA cache format as the entry type) a block pools its entry into shared memory
/// (`dim` floats, so `dim <= 12288`), thread 0 runs the hook on it (and, for MODEL1 / V3.2,
/// quantizes it into its page slot, dsv4::detail::store_row, the CPU's code), then the block
/// stores it. The hook runs once per entry, in no particular order across entries.
///
/// Verified: compiled for sm_80 and sm_90 with nvcc 13; the host checks and the host run of
/// the shared per-channel and state arithmetic are tested on the CPU. The device tests
/// (tests/dsv4/test_dsv4_cuda_compressor.cu; the hook and MODEL1 entries against the CPU calls
/// in tests/dsv4/test_dsv4_cuda_flash_mla.cu) have not yet run on a GPU.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "phasekv/attention/cuda/status.cuh"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/dsv4/cache_format.hpp"
#include "phasekv/dsv4/compressor.hpp"
#include "phasekv/dsv4/fp8.hpp"
#include "phasekv/dsv4/kernel_math.hpp"
#include "phasekv/dsv4/paged_latent.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace dsv4::cuda {

namespace detail {

inline constexpr int kCompressThreads = 128;  ///< Threads per block (channels in flight).

/// Arguments of compress_batch_kernel (built on the host).
template <class T>
struct CompressBatchParams {
  std::int64_t ratio = 1;        ///< S.
  std::int64_t coff = 1;         ///< 1 or 2.
  std::int64_t dim = 1;          ///< d.
  const float* ape = nullptr;    ///< `[ratio, coff * dim]` (device).
  const T* kv = nullptr;         ///< `[n, coff * dim]`.
  const T* score = nullptr;      ///< `[n, coff * dim]`.
  float* out = nullptr;          ///< `[floor(n / ratio), dim]`.
  std::int64_t entry_begin = 0;  ///< First entry computed (block x adds to it).
};

/// Largest `dim` of a staged entry (a hook, or a FlashMLA format): f32 in 48 KiB of shared memory.
inline constexpr std::int64_t kStagedMaxDim = 12288;

/// Whether a block stages its entry in shared memory: a hook to run, or a quantized format.
template <class Hook, class E = float>
inline constexpr bool kStaged =
    !std::is_same<std::decay_t<Hook>, NoHook>::value || CacheFormat<E>::quantized;

/// Pools entry j one thread per channel into the block's shared `x` (`dim` floats), then thread
/// 0 runs the hook on it; every thread sees the result.
template <class T, class Hook>
__device__ void pool_staged(const CompressorRows<T>& rows, const float* ape, std::int64_t j,
                            std::int64_t dim, std::int64_t sequence, float* x, const Hook& hook) {
  for (std::int64_t c = threadIdx.x; c < dim; c += kCompressThreads)
    x[c] = compressor_pool_channel(rows, ape, j, c, dim);
  __syncthreads();
  if (threadIdx.x == 0) {
    EntryInfo info = dsv4::detail::entry_info(rows.ratio, rows.coff, j);
    info.sequence = sequence;
    hook(static_cast<const EntryInfo&>(info), x);
  }
  __syncthreads();
}

/// Block x: entry `entry_begin + x` of a whole prefill, one thread per channel (with a hook:
/// staged, see the file description).
template <class T, class Hook>
__global__ void __launch_bounds__(kCompressThreads)
    compress_batch_kernel(const __grid_constant__ CompressBatchParams<T> p, const Hook hook) {
  const std::int64_t j = p.entry_begin + blockIdx.x;
  CompressorRows<T> rows;
  rows.kv = p.kv;
  rows.score = p.score;
  rows.n = 0;
  rows.ratio = p.ratio;
  rows.coff = p.coff;
  rows.row_width = p.coff * p.dim;
  float* out = p.out + j * p.dim;
  if constexpr (kStaged<Hook>) {
    extern __shared__ __align__(16) unsigned char staged[];
    float* x = reinterpret_cast<float*>(staged);
    pool_staged(rows, p.ape, j, p.dim, 0, x, hook);
    for (std::int64_t c = threadIdx.x; c < p.dim; c += kCompressThreads) out[c] = x[c];
  } else {
    for (std::int64_t c = threadIdx.x; c < p.dim; c += kCompressThreads)
      out[c] = compressor_pool_channel(rows, p.ape, j, c, p.dim);
  }
}

/// Arguments of the paged append kernels (built on the host; device pointers).
template <class T, class E>
struct CompressPagedParams {
  std::int64_t ratio = 1;                      ///< S.
  std::int64_t coff = 1;                       ///< 1 or 2.
  std::int64_t dim = 1;                        ///< d.
  const float* ape = nullptr;                  ///< `[ratio, coff * dim]`.
  std::int64_t batch = 0;                      ///< Sequences.
  const T* kv = nullptr;                       ///< Input kv rows.
  const T* score = nullptr;                    ///< Input score rows.
  const std::int32_t* chunk_indptr = nullptr;  ///< `[batch + 1]` or null (one row each).
  std::int64_t* tokens = nullptr;              ///< `[batch]` n_b.
  T* state = nullptr;                          ///< `[batch, compressor_state_elements]`.
  PagePool<E> pool;                            ///< Entry pages.
  BlockTable table;                            ///< Entry pages per sequence.
  float scale = 1.0f;                          ///< Per-tensor scale of the stored entries.

  /// The rows sequence b reads while it appends its chunk (n = tokens[b]).
  __device__ CompressorRows<T> rows_of(std::int64_t b, std::int64_t n) const {
    const std::int64_t rw = coff * dim, half = coff * ratio * rw;
    const ChunkRows ch = chunk_rows(b, chunk_indptr);
    CompressorRows<T> r;
    r.kv = kv + ch.row * rw;
    r.score = score + ch.row * rw;
    r.state_kv = state + b * 2 * half;
    r.state_score = r.state_kv + half;
    r.n = n;
    r.ratio = ratio;
    r.coff = coff;
    r.row_width = rw;
    return r;
  }
};

/// Block (x, y): the x-th entry that sequence y (then y + gridDim.y, ...) completes, pooled one
/// thread per channel and stored as `E(value / scale)` in its page slot (staged with a hook or a
/// FlashMLA format: see the file description).
template <class T, class E, class Hook>
__global__ void __launch_bounds__(kCompressThreads)
    compress_paged_entries_kernel(const __grid_constant__ CompressPagedParams<T, E> p,
                                  const Hook hook) {
  for (std::int64_t b = blockIdx.y; b < p.batch; b += gridDim.y) {
    const std::int64_t n = p.tokens[b], c = chunk_rows(b, p.chunk_indptr).count;
    const std::int64_t j = n / p.ratio + blockIdx.x;
    if (j >= (n + c) / p.ratio) continue;  // the same for every thread of the block
    const CompressorRows<T> rows = p.rows_of(b, n);
    const std::int64_t P = p.pool.page_size;
    if constexpr (kStaged<Hook, E>) {
      extern __shared__ __align__(16) unsigned char staged[];
      float* x = reinterpret_cast<float*>(staged);
      pool_staged(rows, p.ape, j, p.dim, b, x, hook);
      E* block = p.pool.key(p.table.page(b, j / P), 0, 0);
      if constexpr (CacheFormat<E>::quantized) {
        if (threadIdx.x == 0)
          dsv4::detail::store_row<E>(
              x, p.dim, p.scale, CacheFormat<E>::row(block, P, j % P, p.pool.key_slot_stride()));
      } else {
        E* dst = p.pool.key(p.table.page(b, j / P), j % P, 0);
        for (std::int64_t ch = threadIdx.x; ch < p.dim; ch += kCompressThreads)
          dst[ch] = store_element<E>(x[ch] / p.scale);
      }
      __syncthreads();  // x is read before the next sequence's entry is pooled into it
    } else {
      E* dst = p.pool.key(p.table.page(b, j / P), j % P, 0);
      for (std::int64_t ch = threadIdx.x; ch < p.dim; ch += kCompressThreads)
        dst[ch] = store_element<E>(compressor_pool_channel(rows, p.ape, j, ch, p.dim) / p.scale);
    }
  }
}

/// Block b: sequence b's new state rows (the input rows of `[max(n, compressor_state_begin(n +
/// c)), n + c)`), then `tokens[b] = n + c`. Runs after the entries kernel on the stream.
template <class T, class E>
__global__ void __launch_bounds__(kCompressThreads)
    compress_paged_state_kernel(const __grid_constant__ CompressPagedParams<T, E> p) {
  const std::int64_t b = blockIdx.x;
  const std::int64_t n = p.tokens[b], c = chunk_rows(b, p.chunk_indptr).count;
  if (c == 0) return;
  const std::int64_t rw = p.coff * p.dim;
  const std::int64_t begin = compressor_state_begin(n + c, p.ratio, p.coff);
  const std::int64_t lo = begin > n ? begin : n, hi = n + c;
  const CompressorRows<T> rows = p.rows_of(b, n);
  T* skv = const_cast<T*>(rows.state_kv);
  T* ssc = const_cast<T*>(rows.state_score);
  for (std::int64_t i = threadIdx.x; i < (hi - lo) * rw; i += kCompressThreads) {
    const std::int64_t pos = lo + i / rw, e = i % rw;
    const std::int64_t at = compressor_state_row(pos, p.ratio, p.coff) * rw + e;
    skv[at] = rows.kv_row(pos)[e];
    ssc[at] = rows.score_row(pos)[e];
  }
  __syncthreads();  // every thread has read tokens[b]
  if (threadIdx.x == 0) p.tokens[b] = n + c;
}

}  // namespace detail

/// Host validation of cuda::compress (no device access): the CPU's rules of
/// phasekv::dsv4::compress (params, `n >= 0`, the entry range, pointers) plus the launch limit
/// (at most 2^31 - 1 entries computed). Throws phasekv::invalid_argument naming the argument.
/// `params.ape` must be device memory (its pointer is only checked for null).
inline void check_compress_args(const CompressorParams& params, const void* kv, const void* score,
                                std::int64_t n, const float* out, std::int64_t entry_begin,
                                std::int64_t entry_end) {
  const char* where = "phasekv::dsv4::cuda::compress";
  using phasekv::detail::check_arg;
  params.check(where);
  check_arg(n >= 0, where, "n", n, "must be >= 0");
  const std::int64_t J = params.entries(n);
  if (entry_end < 0) entry_end = J;
  check_arg(entry_begin >= 0 && entry_begin <= J, where, "entry_begin", entry_begin,
            "must be in [0, floor(n / ratio)]");
  check_arg(entry_end >= entry_begin && entry_end <= J, where, "entry_end", entry_end,
            "must be in [entry_begin, floor(n / ratio)]");
  if (entry_end == entry_begin) return;
  check_arg(kv != nullptr, where, "kv", "null", "must not be null");
  check_arg(score != nullptr, where, "score", "null", "must not be null");
  check_arg(out != nullptr, where, "out", "null", "must not be null");
  check_arg(entry_end - entry_begin <= (std::int64_t{1} << 31) - 1, where, "entry_end", entry_end,
            "must be at most 2^31 - 1 past entry_begin on CUDA");
}

namespace detail {
// The hook's own host checks (dsv4::detail::check_hook, the CPU's) and the staged limit.
template <class Hook, class E = float>
void check_staged(const CompressorParams& params, const Hook& hook, const char* where) {
  if constexpr (kStaged<Hook, E>) {
    dsv4::detail::check_hook(hook, params.dim, where);
    phasekv::detail::check_arg(params.dim <= kStagedMaxDim, where, "params.dim", params.dim,
                               "must be <= 12288 on CUDA with a hook or a FlashMLA format");
  } else {
    (void)params, (void)hook, (void)where;
  }
}
// Dynamic shared memory of a staged block.
template <class Hook, class E = float>
std::size_t staged_bytes(const CompressorParams& params) {
  return kStaged<Hook, E> ? static_cast<std::size_t>(params.dim) * sizeof(float) : 0;
}
}  // namespace detail

/// phasekv::dsv4::compress on `stream`: tokens `[0, n)` with device `kv` and `score` (each
/// `[n, coff * dim]`, f32, bf16 or f16) and device `params.ape`; writes entries `[entry_begin,
/// entry_end)` (default all `floor(n / ratio)`) to the device rows `out + j * dim` as f32,
/// after `hook(info, entry)` has run on each (a device-callable functor, e.g.
/// phasekv::dsv4::EntryPostprocess with device pointers; checked on the host by its `check`
/// when it has one; `dim <= 12288` then). The same per-channel device function as
/// compress_append_paged(), so a streaming append over the same tokens stores the same bits
/// (f32 entries, scale 1). Allocates nothing, needs no workspace, does not synchronize.
///
/// @return `cudaSuccess`; `cudaErrorInvalidValue` for rejected arguments (message in
///         phasekv::cuda::last_error_message(), nothing launched); or the launch error.
template <class T, class Hook = NoHook>
cudaError_t compress(const CompressorParams& params, const T* kv, const T* score, std::int64_t n,
                     float* out, cudaStream_t stream = nullptr, std::int64_t entry_begin = 0,
                     std::int64_t entry_end = -1, const Hook& hook = Hook{}) {
  cudaError_t e = phasekv::cuda::detail::validate_into_status([&] {
    check_compress_args(params, kv, score, n, out, entry_begin, entry_end);
    detail::check_staged(params, hook, "phasekv::dsv4::cuda::compress");
  });
  if (e != cudaSuccess) return e;
  if (entry_end < 0) entry_end = params.entries(n);
  if (entry_end == entry_begin) return cudaSuccess;
  detail::CompressBatchParams<T> p;
  p.ratio = params.ratio;
  p.coff = params.coff;
  p.dim = params.dim;
  p.ape = params.ape;
  p.kv = kv;
  p.score = score;
  p.out = out;
  p.entry_begin = entry_begin;
  detail::compress_batch_kernel<T, Hook>
      <<<static_cast<unsigned>(entry_end - entry_begin), detail::kCompressThreads,
         detail::staged_bytes<Hook>(params), stream>>>(p, hook);
  return cudaGetLastError();
}

namespace detail {
/// check_compress_append_paged_args, returning the batch's totals (rows, entries).
template <class T, class E>
dsv4::detail::AppendTotals check_append_paged(const CompressorParams& params,
                                              const PagedCompressArgs<T, E>& host,
                                              const PagedCompressArgs<T, E>& device) {
  const char* where = "phasekv::dsv4::cuda::compress_append_paged";
  using phasekv::detail::check_arg;
  params.check(where);
  const std::int64_t B = host.batch;
  check_arg(B >= 0 && B <= (std::int64_t{1} << 31) - 1, where, "args.batch", B,
            "must be in [0, 2^31 - 1] on CUDA");
  check_arg(device.batch == B, where, "device.batch", device.batch, "must equal host.batch");
  if (B == 0) return {};
  check_arg(std::isfinite(device.entry_scale) && device.entry_scale > 0.0f, where,
            "args.entry_scale", device.entry_scale, "must be finite and > 0");
  check_arg((device.chunk_indptr == nullptr) == (host.chunk_indptr == nullptr), where,
            "device.chunk_indptr", device.chunk_indptr == nullptr ? "null" : "set",
            "must be null exactly when host.chunk_indptr is");
  const auto t = dsv4::detail::check_append_counts(B, host.tokens, host.chunk_indptr, params.ratio,
                                                   where, "args.tokens", "args.chunk_indptr");
  if (t.rows == 0) return t;
  check_arg(device.tokens != nullptr, where, "device.tokens", "null",
            "must point to [batch] (device)");
  check_arg(device.kv != nullptr, where, "args.kv", "null", "must not be null");
  check_arg(device.score != nullptr, where, "args.score", "null", "must not be null");
  check_arg(device.state != nullptr, where, "args.state", "null",
            "must point to [batch, compressor_state_elements(params)]");
  if (t.entries == 0) return t;
  dsv4::detail::check_append_entry_pages(device.entry_pool, host.entry_table, B, host.tokens,
                                         host.chunk_indptr, params.ratio, params.dim, where,
                                         "args.entry_pool", "args.entry_table");
  check_arg(t.max_entries <= (std::int64_t{1} << 31) - 1, where, "args.chunk_indptr", t.max_entries,
            "(the entries one sequence completes) must be <= 2^31 - 1 on CUDA");
  const BlockTable& dt = device.entry_table;
  const BlockTable& ht = host.entry_table;
  check_arg(dt.batch == ht.batch && (dt.indptr == nullptr) == (ht.indptr == nullptr) &&
                (dt.indptr != nullptr || dt.row_stride == ht.row_stride),
            where, "device.entry_table.batch", dt.batch,
            "the device table must have the host table's shape (batch, CSR or dense, stride)");
  check_arg(dt.indices != nullptr, where, "device.entry_table.indices", "null",
            "must point to the pages (device)");
  return t;
}
}  // namespace detail

/// Host validation of cuda::compress_append_paged, without reading device memory.
///
/// `host` holds host copies of `tokens`, `chunk_indptr` and the entry table's `indptr` /
/// `indices` (nothing else of it is read); `device` is the call's arguments with device
/// pointers. Runs the checks of phasekv::dsv4::compress_append_paged (the shared
/// dsv4::detail::check_append_counts and check_append_entry_pages: counts, the pool's shape,
/// table lengths, page indices, with the CPU's messages) on the device arguments with the
/// host's metadata, then that the device table has the host table's shape, the device pointers
/// are set, and the launch limits hold (batch and the entries of one sequence at most
/// 2^31 - 1). Throws phasekv::invalid_argument (capacity_error for a table too short,
/// shape_error for the pool).
template <class T, class E, class Hook = NoHook>
void check_compress_append_paged_args(const CompressorParams& params,
                                      const PagedCompressArgs<T, E>& host,
                                      const PagedCompressArgs<T, E>& device,
                                      const Hook& hook = Hook{}) {
  (void)detail::check_append_paged(params, host, device);
  detail::check_staged<Hook, E>(params, hook, "phasekv::dsv4::cuda::compress_append_paged");
}

/// phasekv::dsv4::compress_append_paged on `stream`: B sequences each append their chunk
/// (`chunk_indptr`, or one token each) to their compressors, whose states live in the caller's
/// device memory (`state`, the CPU's layout: sequence b at `b * compressor_state_elements`,
/// kv rows then score rows, block `k` in slot `k mod coff`), and every entry that completes is
/// stored as `E(x / entry_scale)` (round to nearest even; FP8 E4M3 saturates at 448) in the
/// entry pages (`entry_table.page(b, j / P)`, slot `j % P`, first `dim` elements of the row),
/// or quantized into a FlashMLA cache format (E = model1_fp8_t or v32_fp8_t, as the CPU call
/// stores it), after `hook(info, entry)` has run on it (`info.sequence` = b; see cuda::compress
/// for the hook). Then the device `tokens[b] += c_b`.
///
/// `device` holds device pointers (kv, score, chunk_indptr, tokens, state, pool, table;
/// `params.ape` is device memory); `host` holds host copies of `tokens`, `chunk_indptr` and the
/// entry table (`batch` too; nothing else of it is read) for the checks and the grid
/// (check_compress_append_paged_args); the host copy of `tokens` is not advanced (do it after the
/// call). A state is the same bytes the CPU function would leave for the rows the next call reads,
/// so a sequence may move between the CPU and the device between calls (its rows in device or host
/// memory respectively).
///
/// Two kernels on `stream` (entries, then the state update and the token counts); no
/// allocation, no workspace, no synchronization. Device streaming equals cuda::compress bit for
/// bit; against the CPU it agrees within the rounding described in the file description.
///
/// @return `cudaSuccess`; `cudaErrorInvalidValue` for rejected arguments (message in
///         phasekv::cuda::last_error_message(), nothing launched, nothing written); or a launch
///         error.
template <class T, class E, class Hook = NoHook>
cudaError_t compress_append_paged(const CompressorParams& params,
                                  const PagedCompressArgs<T, E>& host,
                                  const PagedCompressArgs<T, E>& device,
                                  cudaStream_t stream = nullptr, const Hook& hook = Hook{}) {
  dsv4::detail::AppendTotals t;
  cudaError_t e = phasekv::cuda::detail::validate_into_status([&] {
    t = detail::check_append_paged<T, E>(params, host, device);
    detail::check_staged<Hook, E>(params, hook, "phasekv::dsv4::cuda::compress_append_paged");
  });
  if (e != cudaSuccess || t.rows == 0) return e;
  detail::CompressPagedParams<T, E> p;
  p.ratio = params.ratio;
  p.coff = params.coff;
  p.dim = params.dim;
  p.ape = params.ape;
  p.batch = device.batch;
  p.kv = device.kv;
  p.score = device.score;
  p.chunk_indptr = device.chunk_indptr;
  p.tokens = device.tokens;
  p.state = device.state;
  p.pool = device.entry_pool;
  p.table = device.entry_table;
  p.scale = device.entry_scale;
  if (t.max_entries > 0) {
    const dim3 grid(static_cast<unsigned>(t.max_entries),
                    static_cast<unsigned>(host.batch < 65535 ? host.batch : 65535));
    detail::compress_paged_entries_kernel<T, E, Hook>
        <<<grid, detail::kCompressThreads, detail::staged_bytes<Hook, E>(params), stream>>>(p,
                                                                                            hook);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  detail::compress_paged_state_kernel<T, E>
      <<<static_cast<unsigned>(host.batch), detail::kCompressThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsv4::cuda
PHASEKV_NAMESPACE_END
