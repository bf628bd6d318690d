/// @file
/// @brief Batched streaming compression into paged storage on CUDA, the twin of
/// serving/paged_append.hpp: append a chunk of new tokens to each of B sequences (each at its own
/// length, hence its own phase); every window that completes is compressed and written to its
/// sequence's entry pages, and the new raw tokens go to the raw pages (all of them, or the ring).
///
/// Life cycle. The caller keeps host copies of the lengths, `new_indptr` and the block tables
/// (as for the plans of batch decode and prefill); phasekv::cuda::paged_append checks them on
/// the host with phasekv::check_paged_append (the CPU's checks: tables long enough for the
/// lengths after the append, page ranges, overlaps), then enqueues one kernel on the device
/// copies. The caller advances its lengths afterwards, on both sides.
///
/// Kernel: one block of 128 threads per (sequence, KV head). The block computes the entries of
/// the windows completing in `[n_b, n_b + new_b)`, reading each window with the CPU's
/// detail::PagedWindowLoader (raw pages below n_b, the new tokens above), through the policy's
/// phasekv::cuda::compress_kernels fast path where it applies, else `Policy::compress` on one
/// thread (the generic path of cuda::compress_step); then it writes the new raw tokens (with a
/// ring only those that stay in it). The entries are the bits of the CPU paged_append (the
/// compress_kernels contract), so of CompressedCache.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "phasekv/attention/cuda/status.cuh"
#include "phasekv/compress/cuda/compress_kernels.cuh"
#include "phasekv/compress/policy.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/phase/geometry.hpp"
#include "phasekv/serving/paged.hpp"
#include "phasekv/serving/paged_append.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cuda {
namespace detail {

/// Threads of a paged append block (the compress_kernels fast paths expect 128).
inline constexpr int kAppendThreads = 128;

/// Arguments of paged_append_kernel (built on the host).
template <class T, class KeyPolicy, class ValuePolicy>
struct PagedAppendParams {
  KeyPolicy key_policy;      ///< Key compressor (device parameters).
  ValuePolicy value_policy;  ///< Value compressor (device parameters).
  PagedAppendArgs<T> a;      ///< Device pools, tables, lengths, new tokens.
};

/// Dynamic shared memory one entry of `p` needs: the fast path's, or compress()'s floats.
template <class Policy>
std::size_t append_smem_bytes(const Policy& p) {
  std::size_t s = static_cast<std::size_t>(p.output_dim()) * sizeof(float);
  if constexpr (compress_kernels<Policy>::fast) {
    if (compress_kernels<Policy>::applies(p)) {
      const std::size_t f = compress_kernels<Policy>::smem_bytes(p);
      if (f > s) s = f;
    }
  }
  return s;
}

/// One entry of KV head `h` from window loader `x` into `out` (`dout` elements), by the whole
/// block; `scratch` is the dynamic shared memory.
template <class T, class Policy, class Load>
__device__ void append_entry(const Policy& policy, std::int64_t h, const Load& x, T* out,
                             float* scratch, std::int64_t dout) {
  if constexpr (compress_kernels<Policy>::fast) {
    if (compress_kernels<Policy>::applies(policy)) {
      compress_kernels<Policy>::template entry<T>(policy, h, x, out, scratch);
      __syncthreads();
      return;
    }
  }
  if (threadIdx.x == 0) policy.compress(h, x, scratch);
  __syncthreads();
  for (std::int64_t c = threadIdx.x; c < dout; c += blockDim.x) out[c] = from_float<T>(scratch[c]);
  __syncthreads();
}

/// Block (b, h): the entries of sequence b's completing windows, then its new raw tokens.
template <class T, class KeyPolicy, class ValuePolicy>
__global__ void __launch_bounds__(kAppendThreads)
    paged_append_kernel(const __grid_constant__ PagedAppendParams<T, KeyPolicy, ValuePolicy> p) {
  extern __shared__ float scratch[];
  const PagedAppendArgs<T>& a = p.a;
  const std::int64_t b = blockIdx.x, h = blockIdx.y;
  const std::int64_t n0 = a.lengths[b], row0 = a.new_indptr[b];
  const std::int64_t n1 = n0 + (static_cast<std::int64_t>(a.new_indptr[b + 1]) - row0);
  const Geometry g = p.key_policy.geometry();
  const std::int64_t ro = g.origin(), rs = a.ring_slots;
  const std::int64_t dk = a.raw_pool.d_k, dv = a.raw_pool.d_v;
  // 1. entries of the windows completing in [n0, n1), before any raw slot is overwritten
  phasekv::detail::PagedWindowLoader<T> x;
  x.pool = &a.raw_pool;
  x.table = &a.raw_table;
  x.b = b;
  x.h = h;
  x.n0 = n0;
  x.row0 = row0;
  x.ring_origin = ro;
  x.ring_slots = rs;
  const std::int64_t ps = a.entry_pool.page_size;
  for (std::int64_t j = g.complete_windows(n0); j < g.complete_windows(n1); ++j) {
    const std::int64_t page = a.entry_table.page(b, j / ps), slot = j % ps;
    x.first = g.window_begin(j);
    x.keys = true;
    x.input = &a.keys;
    append_entry<T>(p.key_policy, h, x, a.entry_pool.key(page, slot, h), scratch, dk);
    x.keys = false;
    x.input = &a.values;
    append_entry<T>(p.value_policy, h, x, a.entry_pool.value(page, slot, h), scratch, dv);
  }
  __syncthreads();
  // 2. raw tokens: with a ring only the prefix and the last ring_slots new ones land
  const std::int64_t rps = a.raw_pool.page_size;
  for (std::int64_t pos = n0; pos < n1; ++pos) {
    if (rs > 0 && pos >= ro && pos < n1 - rs) continue;
    const std::int64_t s = PagedKV<T>::raw_slot(pos, ro, rs);
    const std::int64_t page = a.raw_table.page(b, s / rps), in = s % rps;
    const T* ks = a.keys.ptr(row0 + pos - n0, h);
    const T* vs = a.values.ptr(row0 + pos - n0, h);
    T* kd = a.raw_pool.key(page, in, h);
    T* vd = a.raw_pool.value(page, in, h);
    for (std::int64_t c = threadIdx.x; c < dk; c += blockDim.x) kd[c] = ks[c];
    for (std::int64_t c = threadIdx.x; c < dv; c += blockDim.x) vd[c] = vs[c];
  }
}

template <class T>
bool same_pool_shape(const PagePool<T>& x, const PagePool<T>& y) {
  return x.pages == y.pages && x.page_size == y.page_size && x.heads == y.heads && x.d_k == y.d_k &&
         x.d_v == y.d_v && x.layout == y.layout && x.key_page_stride == y.key_page_stride &&
         x.value_page_stride == y.value_page_stride;
}

}  // namespace detail

/// Validates a CUDA paged append on the host: phasekv::check_paged_append on `host` (host
/// lengths, new_indptr and tables; pools and views by shape only), and that `device` has the
/// same shapes, device pointers where data is read or written, and fits the launch limits.
/// Throws phasekv::invalid_argument (or shape_error / capacity_error) naming the argument.
template <class T, class KeyPolicy, class ValuePolicy>
void check_cuda_paged_append(const KeyPolicy& key_policy, const ValuePolicy& value_policy,
                             std::int64_t local, const PagedAppendArgs<T>& host,
                             const PagedAppendArgs<T>& device) {
  const char* where = "phasekv::cuda::paged_append";
  using phasekv::detail::check_arg;
  check_arg(host.origins == nullptr && device.origins == nullptr, where, "origins", "non-null",
            "per-head origins run on the CPU serving path only (the CUDA kernels read one origin)");
  check_paged_append(key_policy, value_policy, local, host, where);
  check_arg(device.batch == host.batch, where, "device.batch", device.batch,
            "must equal host.batch");
  check_arg(host.batch <= (std::int64_t{1} << 31) - 1, where, "batch", host.batch,
            "must be <= 2^31 - 1 (grid limit)");
  check_arg(host.raw_pool.heads <= 65535, where, "raw_pool.heads", host.raw_pool.heads,
            "must be <= 65535 (grid limit)");
  check_arg<shape_error>(detail::same_pool_shape(device.raw_pool, host.raw_pool) &&
                             detail::same_pool_shape(device.entry_pool, host.entry_pool),
                         where, "device.raw_pool.pages", device.raw_pool.pages,
                         "the device pools must have the host pools' shapes");
  check_page_pool(device.raw_pool, where, "device.raw_pool");
  check_page_pool(device.entry_pool, where, "device.entry_pool");
  check_view(device.keys, where, "device.keys");
  check_view(device.values, where, "device.values");
  check_arg(device.ring_slots == host.ring_slots, where, "device.ring_slots", device.ring_slots,
            "must equal host.ring_slots");
  check_arg<shape_error>(
      device.keys.tokens == host.keys.tokens && device.keys.heads == host.keys.heads &&
          device.keys.dim == host.keys.dim && device.values.tokens == host.values.tokens &&
          device.values.heads == host.values.heads && device.values.dim == host.values.dim,
      where, "device.keys.tokens", device.keys.tokens,
      "the device keys and values must have the host views' shapes");
  const auto table_form = [&](const BlockTable& d, const BlockTable& h, const char* name) {
    check_arg((d.indptr == nullptr) == (h.indptr == nullptr) && d.row_stride == h.row_stride &&
                  d.batch == h.batch,
              where, name, d.batch, "must have the host table's form, batch and row stride");
  };
  table_form(device.raw_table, host.raw_table, "device.raw_table");
  table_form(device.entry_table, host.entry_table, "device.entry_table");
  if (host.batch > 0)
    check_arg(device.lengths != nullptr && device.new_indptr != nullptr, where, "device.lengths",
              "null", "device lengths and new_indptr must point to device memory");
  const std::size_t smem =
      detail::append_smem_bytes(key_policy) > detail::append_smem_bytes(value_policy)
          ? detail::append_smem_bytes(key_policy)
          : detail::append_smem_bytes(value_policy);
  check_arg(smem <= 48 * 1024, where, "policy.output_dim()", key_policy.output_dim(),
            "an entry needs more than 48 KiB of shared memory");
}

/// Appends the new tokens of every sequence on `stream` (see the file description).
/// `key_policy` / `value_policy` hold device parameters (their shapes are what the host checks
/// read); `host` holds host copies of the lengths before the append, `new_indptr` and the
/// tables, and the pools and new-token views by shape (their pointers may be the device ones:
/// they are checked for null, never dereferenced); `device` holds the same values on the
/// device, with the pools and the new tokens. Allocates nothing; does not synchronize.
///
/// @return `cudaSuccess`; `cudaErrorInvalidValue` for rejected arguments (message in
///         phasekv::cuda::last_error_message(), nothing launched, nothing written); or the
///         launch error.
template <class T, class KeyPolicy, class ValuePolicy>
cudaError_t paged_append(const KeyPolicy& key_policy, const ValuePolicy& value_policy,
                         std::int64_t local, const PagedAppendArgs<T>& host,
                         const PagedAppendArgs<T>& device, cudaStream_t stream = nullptr) {
  const cudaError_t e = detail::validate_into_status(
      [&] { check_cuda_paged_append(key_policy, value_policy, local, host, device); });
  if (e != cudaSuccess) return e;
  if (host.batch == 0 || host.new_indptr[host.batch] == 0) return cudaSuccess;
  detail::PagedAppendParams<T, KeyPolicy, ValuePolicy> p{key_policy, value_policy, device};
  const std::size_t ks = detail::append_smem_bytes(key_policy);
  const std::size_t vs = detail::append_smem_bytes(value_policy);
  const std::size_t smem = ks > vs ? ks : vs;
  const dim3 grid(static_cast<unsigned>(host.batch), static_cast<unsigned>(host.raw_pool.heads));
  detail::paged_append_kernel<T, KeyPolicy, ValuePolicy>
      <<<grid, detail::kAppendThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace cuda
PHASEKV_NAMESPACE_END
