/// @file
/// @brief Batch compression of a prefill on CUDA: any PHASEKV_HOST_DEVICE compressor policy
/// through a generic kernel (one thread per (entry, KV head), running `policy.compress`
/// exactly as phasekv::compress_batch does on the CPU), and a channel-parallel fast path for
/// UniformMean. Results are bit-identical to the CPU compress_batch and to
/// phasekv::cuda::compress_step (streaming).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "phasekv/attention/cuda/status.cuh"
#include "phasekv/compress/compress_batch.hpp"
#include "phasekv/compress/cuda/compress_kernels.cuh"
#include "phasekv/compress/float_ops.hpp"
#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/compress/policy.hpp"
#include "phasekv/compress/uniform_mean.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/view.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cuda {

namespace detail {

/// Largest dynamic shared memory the generic compression kernels use (no opt-in needed).
inline constexpr std::size_t kCompressSmem = 48 * 1024;

/// Threads per block of the generic compression kernels for `dout` output channels: as many
/// as fit one float scratch row each (stride dout + 1) in kCompressSmem, at most 64.
inline int compress_threads(std::int64_t dout) {
  const std::int64_t fit = static_cast<std::int64_t>(
      kCompressSmem / (sizeof(float) * static_cast<std::size_t>(dout + 1)));
  return static_cast<int>(fit < 64 ? fit : 64);
}

/// Generic batch kernel: thread e of the grid computes entry `e / heads` of KV head
/// `e % heads` into its scratch row, then converts and stores it.
template <class T, class Policy>
__global__ void compress_batch_generic_kernel(Policy policy, StridedView<const T> raw,
                                              StridedView<T> entries, std::int64_t count) {
  extern __shared__ float scratch_rows[];
  const std::int64_t dout = policy.output_dim();
  float* scratch = scratch_rows + threadIdx.x * (dout + 1);
  const std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= count * raw.heads) return;
  const std::int64_t j = e / raw.heads, h = e - j * raw.heads;
  const Geometry g = policy.geometry();
  policy.compress(h, window_loader<T>(raw, g, j, h), scratch);
  T* dst = entries.ptr(j, h);
  for (std::int64_t c = 0; c < dout; ++c) dst[c] = from_float<T>(scratch[c]);
}

/// Fast-path batch kernel: block (j, h) of the grid (flattened) computes entry j of head h
/// with compress_kernels<Policy>::entry.
template <class T, class Policy>
__global__ void compress_batch_block_kernel(Policy policy, StridedView<const T> raw,
                                            StridedView<T> entries) {
  extern __shared__ float block_smem[];
  const std::int64_t e = blockIdx.x;
  const std::int64_t j = e / raw.heads, h = e - j * raw.heads;
  compress_kernels<Policy>::template entry<T>(
      policy, h, window_loader<T>(raw, policy.geometry(), j, h), entries.ptr(j, h), block_smem);
}

}  // namespace detail

/// Batch compression of a prefill on the device: entries `[0, J(raw.tokens))` of every KV
/// head, as phasekv::compress_batch (same arguments and checks; `raw`, `entries` and any
/// parameters inside `policy` are device memory). Entry j of head h goes to `entries(j, h, :)`.
///
/// `entries_written` (host, may be null) receives J(raw.tokens). A policy with a CUDA fast
/// path (compress_kernels, compress_kernels.cuh) uses it where it applies: UniformMean a
/// channel-parallel kernel, GatedPool a block per entry (gate logits in parallel, one thread
/// per channel; when W x gate channels <= 8192); every other policy the generic kernel
/// (`output_dim()` <= 12287).
/// Enqueues on `stream`, allocates nothing, does not synchronize.
///
/// @return `cudaSuccess`; `cudaErrorInvalidValue` for rejected arguments (message in
///         phasekv::cuda::last_error_message()); or the launch error.
template <class T, class Policy>
cudaError_t compress_batch(const Policy& policy,
                           phasekv::detail::non_deduced_t<StridedView<const T>> raw,
                           StridedView<T> entries, std::int64_t* entries_written = nullptr,
                           cudaStream_t stream = nullptr) {
  std::int64_t count = 0;
  cudaError_t e = detail::validate_into_status([&] {
    count = check_compress_batch<T>(policy, raw, entries);
    phasekv::detail::check_arg(policy.output_dim() <= 12287, "phasekv::cuda::compress_batch",
                               "policy.output_dim()", policy.output_dim(),
                               "must be <= 12287 (one scratch row in 48 KiB of shared memory)");
  });
  if (e != cudaSuccess) return e;
  if (entries_written != nullptr) *entries_written = count;
  if (count == 0 || raw.heads == 0) return cudaSuccess;
  if constexpr (compress_kernels<Policy>::fast) {  // the policy's fast path, where it applies
    using K = compress_kernels<Policy>;
    if constexpr (detail::has_batch_launcher<K, T>::value) {
      if (K::batch(policy, raw, entries, count, stream)) return cudaGetLastError();
    }
    if (K::applies(policy)) {
      detail::compress_batch_block_kernel<T, Policy>
          <<<static_cast<unsigned>(count * raw.heads), 128, K::smem_bytes(policy), stream>>>(
              policy, raw, entries);
      return cudaGetLastError();
    }
  }
  {  // the generic path: one thread per entry
    const int threads = detail::compress_threads(policy.output_dim());
    const std::int64_t n = count * raw.heads;
    const std::size_t smem = static_cast<std::size_t>(threads) *
                             static_cast<std::size_t>(policy.output_dim() + 1) * sizeof(float);
    detail::compress_batch_generic_kernel<T, Policy>
        <<<static_cast<unsigned>(detail::ceil_div(n, threads)), threads, smem, stream>>>(
            policy, raw, entries, count);
  }
  return cudaGetLastError();
}

}  // namespace cuda
PHASEKV_NAMESPACE_END
