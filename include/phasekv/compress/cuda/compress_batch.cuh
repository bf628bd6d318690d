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
#include "phasekv/compress/cuda/gated_pool_block.cuh"
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
  const std::int64_t fit =
      static_cast<std::int64_t>(kCompressSmem / (sizeof(float) * static_cast<std::size_t>(dout + 1)));
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

/// UniformMean fast path: one thread per (entry, head, channel); the same operation order as
/// UniformMean::compress (sum in offset order with fp_add, one fp_div).
template <class T>
__global__ void compress_batch_mean_kernel(Geometry g, StridedView<const T> raw,
                                           StridedView<T> entries, std::int64_t count) {
  const std::int64_t x = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t d = raw.dim;
  if (x >= count * raw.heads * d) return;
  const std::int64_t c = x % d;
  const std::int64_t jh = x / d;
  const std::int64_t j = jh / raw.heads, h = jh - j * raw.heads;
  const T* src = raw.ptr(g.window_begin(j), h) + c;
  float acc = to_float(src[0]);
  for (std::int64_t i = 1; i < g.window(); ++i)
    acc = phasekv::detail::fp_add(acc, to_float(src[i * raw.token_stride]));
  entries.ptr(j, h)[c] = from_float<T>(phasekv::detail::fp_div(acc, static_cast<float>(g.window())));
}

/// GatedPool fast path: block (j, h) of the grid (flattened) computes entry j of head h.
template <class T>
__global__ void compress_batch_gated_kernel(GatedPool policy, StridedView<const T> raw,
                                            StridedView<T> entries) {
  extern __shared__ float gate_logits[];
  const std::int64_t e = blockIdx.x;
  const std::int64_t j = e / raw.heads, h = e - j * raw.heads;
  gated_pool_block<T>(policy, h, window_loader<T>(raw, policy.geometry(), j, h), entries.ptr(j, h),
                      gate_logits);
}

}  // namespace detail

/// Batch compression of a prefill on the device: entries `[0, J(raw.tokens))` of every KV
/// head, as phasekv::compress_batch (same arguments and checks; `raw`, `entries` and any
/// parameters inside `policy` are device memory). Entry j of head h goes to `entries(j, h, :)`.
///
/// `entries_written` (host, may be null) receives J(raw.tokens). UniformMean uses a
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
  if constexpr (std::is_same<Policy, UniformMean>::value) {
    const std::int64_t n = count * raw.heads * raw.dim;
    constexpr int threads = 256;
    detail::compress_batch_mean_kernel<T><<<static_cast<unsigned>(detail::ceil_div(n, threads)),
                                            threads, 0, stream>>>(policy.geometry(), raw, entries,
                                                                  count);
  } else {
    if constexpr (std::is_same<Policy, GatedPool>::value) {
      if (detail::gated_pool_fast(policy)) {
        const std::size_t smem = static_cast<std::size_t>(policy.geometry().window() *
                                                          detail::gate_channels(policy)) *
                                 sizeof(float);
        detail::compress_batch_gated_kernel<T>
            <<<static_cast<unsigned>(count * raw.heads), 128, smem, stream>>>(policy, raw, entries);
        return cudaGetLastError();
      }
    }
    const int threads = detail::compress_threads(policy.output_dim());
    const std::int64_t n = count * raw.heads;
    const std::size_t smem =
        static_cast<std::size_t>(threads) * static_cast<std::size_t>(policy.output_dim() + 1) *
        sizeof(float);
    detail::compress_batch_generic_kernel<T, Policy>
        <<<static_cast<unsigned>(detail::ceil_div(n, threads)), threads, smem, stream>>>(
            policy, raw, entries, count);
  }
  return cudaGetLastError();
}

}  // namespace cuda
PHASEKV_NAMESPACE_END
