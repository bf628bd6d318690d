/// @file
/// @brief phasekv::cuda::compress_kernels: the CUDA fast paths of a compressor policy, a
/// specialization point. cuda::compress_batch and cuda::compress_step look a policy up here;
/// the built-in policies (UniformMean, GatedPool) specialize it like anyone else.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "phasekv/compress/cuda/gated_pool_block.cuh"
#include "phasekv/compress/float_ops.hpp"
#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/compress/uniform_mean.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/view.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cuda {

/// CUDA fast paths of compressor policy `Policy`.
///
/// **The primary template is the generic path**: `fast` is false, so cuda::compress_batch runs
/// `Policy::compress` with one thread per entry (scratch in shared memory) and
/// cuda::compress_step runs it on thread 0 of the entry's block. That is always correct.
///
/// A specialization with `fast = true` provides `using policy_type = Policy;` and:
/// - `static bool applies(const Policy& p)` (host and device): whether the kernels below cover
///   this configuration (false: the generic path);
/// - `static std::size_t smem_bytes(const Policy& p)`: dynamic shared memory of `entry`;
/// - `template <class T, class Load> static __device__ void entry(const Policy& p,
///   std::int64_t kv_head, const Load& x, T* out, float* smem)`: every thread of a block
///   (128 threads) calls it for one window (`x(i, c)` as in compress()) and together they write
///   `out[0, output_dim())`, compress()'s floats converted by `from_float<T>`, bit for bit.
///
/// and optionally a batch launcher that replaces the block-per-entry batch kernel:
/// `template <class T> static bool batch(const Policy& p, StridedView<const T> raw,
/// StridedView<T> entries, std::int64_t count, cudaStream_t stream)` (host): enqueue entries
/// [0, count) of every head and return true, or return false, enqueueing nothing.
/// Bit-identical output (write compress() with phasekv::fp_fma and friends, float_ops.hpp)
/// keeps CUDA equal to the CPU and streaming equal to batch.
template <class Policy>
struct compress_kernels {
  /// False: no fast path; the generic kernels run `Policy::compress`.
  static constexpr bool fast = false;
};

/// UniformMean: channel-parallel means in compress()'s operation order.
template <>
struct compress_kernels<UniformMean> {
  using policy_type = UniformMean;  ///< The policy.
  /// True.
  static constexpr bool fast = true;
  /// Every configuration.
  PHASEKV_HOST_DEVICE static bool applies(const UniformMean&) { return true; }
  /// No shared memory.
  static std::size_t smem_bytes(const UniformMean&) { return 0; }
  /// One window, a channel per thread: the sum in offset order with fp_add, one fp_div.
  template <class T, class Load>
  static __device__ void entry(const UniformMean& p, std::int64_t kv_head, const Load& x, T* out,
                               float* smem) {
    (void)kv_head, (void)smem;
    const std::int64_t w = p.geometry().window();
    for (std::int64_t c = threadIdx.x; c < p.input_dim(); c += blockDim.x) {
      float acc = x(0, c);
      for (std::int64_t i = 1; i < w; ++i) acc = fp_add(acc, x(i, c));
      out[c] = from_float<T>(fp_div(acc, static_cast<float>(w)));
    }
  }
  /// The batch: one thread per (entry, head, channel).
  template <class T>
  static bool batch(const UniformMean& p, StridedView<const T> raw, StridedView<T> entries,
                    std::int64_t count, cudaStream_t stream);
};

/// GatedPool: a block per entry, gate logits in parallel, one thread per channel, when the
/// logits (W x gate channels) fit detail::kGatedPoolMaxLogits floats of shared memory.
template <>
struct compress_kernels<GatedPool> {
  using policy_type = GatedPool;  ///< The policy.
  /// True.
  static constexpr bool fast = true;
  /// When the logits fit in shared memory.
  PHASEKV_HOST_DEVICE static bool applies(const GatedPool& p) { return detail::gated_pool_fast(p); }
  /// W x gate channels floats of logits.
  static std::size_t smem_bytes(const GatedPool& p) {
    return static_cast<std::size_t>(p.geometry().window() * detail::gate_channels(p)) *
           sizeof(float);
  }
  /// One window by the whole block (gated_pool_block).
  template <class T, class Load>
  static __device__ void entry(const GatedPool& p, std::int64_t kv_head, const Load& x, T* out,
                               float* smem) {
    detail::gated_pool_block<T>(p, kv_head, x, out, smem);
  }
};

namespace detail {
template <class K, class T, class = void>
struct has_batch_launcher : std::false_type {};
/// Whether compress_kernels specialization `K` has a `batch` launcher for T.
template <class K, class T>
struct has_batch_launcher<
    K, T,
    std::void_t<decltype(K::batch(
        std::declval<const typename K::policy_type&>(), std::declval<StridedView<const T>>(),
        std::declval<StridedView<T>>(), std::int64_t{0}, std::declval<cudaStream_t>()))>>
    : std::true_type {};

/// UniformMean's batch kernel: one thread per (entry, head, channel); the same operation
/// order as UniformMean::compress (sum in offset order with fp_add, one fp_div).
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
    acc = fp_add(acc, to_float(src[i * raw.token_stride]));
  entries.ptr(j, h)[c] = from_float<T>(fp_div(acc, static_cast<float>(g.window())));
}
}  // namespace detail

template <class T>
bool compress_kernels<UniformMean>::batch(const UniformMean& p, StridedView<const T> raw,
                                          StridedView<T> entries, std::int64_t count,
                                          cudaStream_t stream) {
  const std::int64_t n = count * raw.heads * raw.dim;
  constexpr int threads = 256;
  detail::compress_batch_mean_kernel<T>
      <<<static_cast<unsigned>((n + threads - 1) / threads), threads, 0, stream>>>(
          p.geometry(), raw, entries, count);
  return true;
}

}  // namespace cuda
PHASEKV_NAMESPACE_END
