/// @file
/// @brief Streaming compression on CUDA: one decode step appends one token per sequence to a
/// per-sequence ring buffer of raw tokens and emits the entry of the window that the token
/// completes (at most one per sequence and KV head), bit-identical to batch compression.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "phasekv/attention/cuda/status.cuh"
#include "phasekv/compress/cuda/compress_batch.cuh"
#include "phasekv/compress/cuda/compress_kernels.cuh"
#include "phasekv/compress/float_ops.hpp"
#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/compress/policy.hpp"
#include "phasekv/compress/uniform_mean.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/view.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cuda {

/// Arguments of phasekv::cuda::compress_step. All pointers are device pointers.
///
/// Sequence b has seen `lengths[b]` tokens before the step; its new token (position
/// `n = lengths[b]`) is `tokens(b, h, :)`. The step stores it in ring slot `n % ring_capacity`
/// and, when position n is the last token of window `j = (n + 1 - O - W) / S` (that is,
/// `n + 1 == O + j*S + W`), writes entry j of every KV head to `entries`. The caller advances
/// `lengths` afterwards (the step only reads it).
///
/// Layouts (dense): ring `[batch, ring_capacity, kv_heads, d_in]`, entries
/// `[batch, max_entries, kv_heads, d_out]` (entry j of sequence b at row `b * max_entries + j`).
template <class T, class Policy>
struct CompressStepArgs {
  Policy policy;                          ///< Compressor (its geometry decides the windows).
  std::int64_t batch = 0;                 ///< Sequences.
  std::int64_t kv_heads = 0;              ///< KV heads.
  const std::int64_t* lengths = nullptr;  ///< `[batch]` tokens seen before this step.
  StridedView<const T> tokens;            ///< `[batch, kv_heads, d_in]` new token of each sequence.
  T* ring = nullptr;                      ///< Ring buffers (see layout).
  std::int64_t ring_capacity = 0;   ///< Slots per sequence, >= W (e.g. Geometry::ring_capacity(L)).
  T* entries = nullptr;             ///< Entry storage (see layout).
  std::int64_t max_entries = 0;     ///< Entry rows per sequence; an entry j >= max_entries
                                    ///< is not written and `emitted[b]` reports -2.
  std::int64_t* emitted = nullptr;  ///< `[batch]` (or null): j of the entry written, -1 if
                                    ///< none completed, -2 if it did not fit.
};

namespace detail {

/// Loader over the window ending at the new token: offsets `[0, W - 1)` come from the ring,
/// offset W - 1 from the new token itself (so no thread reads the slot being written).
template <class T>
struct RingWindowLoader {
  const T* ring = nullptr;       ///< Head h of slot 0 of the sequence's ring.
  std::int64_t slot_stride = 0;  ///< Elements between slots.
  std::int64_t capacity = 1;     ///< Slots.
  std::int64_t first = 0;        ///< Position of offset 0.
  std::int64_t last = 0;         ///< Offset of the new token (W - 1).
  const T* token = nullptr;      ///< The new token of head h.

  /// Channel `c` of the token at in-window offset `i`, as float.
  PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE float operator()(std::int64_t i, std::int64_t c) const {
    if (i == last) return to_float(token[c]);
    return to_float(ring[((first + i) % capacity) * slot_stride + c]);
  }
};

/// One block per (sequence, KV head): copies the new token into the ring (all threads) and,
/// when a window completes, computes the entry: with the policy's compress_kernels fast path
/// where it applies (UniformMean channel-parallel, GatedPool gated_pool_block), else on
/// thread 0 into shared scratch (all threads store).
template <class T, class Policy>
__global__ void compress_step_kernel(CompressStepArgs<T, Policy> a) {
  extern __shared__ float scratch[];
  const std::int64_t b = blockIdx.x, h = blockIdx.y;
  const std::int64_t din = a.policy.input_dim(), dout = a.policy.output_dim();
  const std::int64_t n = a.lengths[b];
  const std::int64_t slot_stride = a.kv_heads * din;
  const T* token = a.tokens.ptr(b, h);
  T* ring_b = a.ring + b * a.ring_capacity * slot_stride + h * din;
  T* dst = ring_b + (n % a.ring_capacity) * slot_stride;
  for (std::int64_t c = threadIdx.x; c < din; c += blockDim.x) dst[c] = token[c];

  const Geometry g = a.policy.geometry();
  const std::int64_t done = n + 1 - g.origin() - g.window();
  const bool completes = done >= 0 && done % g.stride() == 0;
  const std::int64_t j = completes ? done / g.stride() : -1;
  if (h == 0 && threadIdx.x == 0 && a.emitted != nullptr)
    a.emitted[b] = !completes ? -1 : (j < a.max_entries ? j : -2);
  if (!completes || j >= a.max_entries) return;
  T* out = a.entries + ((b * a.max_entries + j) * a.kv_heads + h) * dout;
  const RingWindowLoader<T> x{ring_b,         slot_stride, a.ring_capacity, g.window_begin(j),
                              g.window() - 1, token};
  if constexpr (compress_kernels<Policy>::fast) {  // the policy's fast path, where it applies
    if (compress_kernels<Policy>::applies(a.policy)) {
      compress_kernels<Policy>::template entry<T>(a.policy, h, x, out, scratch);
      return;
    }
  }
  if (threadIdx.x == 0) a.policy.compress(h, x, scratch);  // the generic path
  __syncthreads();
  for (std::int64_t c = threadIdx.x; c < dout; c += blockDim.x) out[c] = from_float<T>(scratch[c]);
}

}  // namespace detail

/// Validates compress_step arguments on the host without touching the device; throws
/// phasekv::invalid_argument (or a subclass) naming the argument and its value.
template <class T, class Policy>
void check_compress_step_args(const CompressStepArgs<T, Policy>& a) {
  check_policy<Policy>();
  const char* where = "phasekv::cuda::compress_step";
  using phasekv::detail::check_arg;
  check_arg(a.batch >= 0 && a.batch <= (std::int64_t{1} << 31) - 1, where, "batch", a.batch,
            "must be in [0, 2^31 - 1]");
  check_arg(a.kv_heads >= 1 && a.kv_heads <= 65535, where, "kv_heads", a.kv_heads,
            "must be in [1, 65535]");
  check_policy_dims(a.policy, a.kv_heads, where, "policy");
  check_arg(a.policy.output_dim() <= 12287, where, "policy.output_dim()", a.policy.output_dim(),
            "must be <= 12287 (scratch in 48 KiB of shared memory)");
  check_view(a.tokens, where, "tokens");
  check_arg<shape_error>(a.tokens.tokens == a.batch, where, "tokens.tokens", a.tokens.tokens,
                         "must equal batch (one new token per sequence)");
  check_arg<shape_error>(a.batch == 0 || a.tokens.heads == a.kv_heads, where, "tokens.heads",
                         a.tokens.heads, "must equal kv_heads");
  check_arg<shape_error>(a.batch == 0 || a.tokens.dim == a.policy.input_dim(), where, "tokens.dim",
                         a.tokens.dim, "must equal policy.input_dim()");
  check_arg<capacity_error>(a.ring_capacity >= a.policy.geometry().window(), where, "ring_capacity",
                            a.ring_capacity, "must be >= the window W");
  check_arg(a.max_entries >= 0, where, "max_entries", a.max_entries, "must be >= 0");
  if (a.batch > 0) {
    check_arg(a.lengths != nullptr, where, "lengths", "null", "must point to device memory");
    check_arg(a.ring != nullptr, where, "ring", "null", "must point to device memory");
    check_arg(a.max_entries == 0 || a.entries != nullptr, where, "entries", "null",
              "must point to device memory");
  }
}

/// One streaming compression step for `batch` sequences (see CompressStepArgs). Lengths are
/// read on the device, so a whole decode loop can be captured in a CUDA graph. Enqueues on
/// `stream`, allocates nothing, does not synchronize.
///
/// @return `cudaSuccess`; `cudaErrorInvalidValue` for rejected arguments (message in
///         phasekv::cuda::last_error_message()); or the launch error.
template <class T, class Policy>
cudaError_t compress_step(const CompressStepArgs<T, Policy>& args, cudaStream_t stream = nullptr) {
  const cudaError_t e = detail::validate_into_status([&] { check_compress_step_args(args); });
  if (e != cudaSuccess) return e;
  if (args.batch == 0) return cudaSuccess;
  std::size_t smem = static_cast<std::size_t>(args.policy.output_dim()) * sizeof(float);
  if constexpr (compress_kernels<Policy>::fast) {
    if (compress_kernels<Policy>::applies(args.policy))
      smem = compress_kernels<Policy>::smem_bytes(args.policy);
  }
  detail::compress_step_kernel<T, Policy>
      <<<dim3(static_cast<unsigned>(args.batch), static_cast<unsigned>(args.kv_heads)), 128, smem,
         stream>>>(args);
  return cudaGetLastError();
}

}  // namespace cuda
PHASEKV_NAMESPACE_END
