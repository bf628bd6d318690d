/// @file
/// @brief UniformMean: every window becomes the plain mean of its W token vectors
/// (alpha_i = 1/W), the simplest compressor policy.
#pragma once

#include <cstdint>

#include "phasekv/compress/cpu/row_kernels.hpp"
#include "phasekv/compress/float_ops.hpp"
#include "phasekv/compress/policy.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/phase/geometry.hpp"

PHASEKV_NAMESPACE_BEGIN

/// Mean pooling: entry `e[c] = (x_0[c] + x_1[c] + ... + x_{W-1}[c]) / W`, summed in offset
/// order in float and divided once (correctly rounded). d_out = d_in; no parameters, so it
/// works for any number of KV heads.
class UniformMean {
 public:
  /// Default: W = S = 1, O = 0, one channel (mostly useful as a placeholder before assignment).
  constexpr UniformMean() = default;

  /// Mean pooling over windows of `geometry` for vectors of `dim` channels. Throws
  /// phasekv::shape_error when `dim` < 1.
  UniformMean(const Geometry& geometry, std::int64_t dim) : geometry_(geometry), dim_(dim) {
    detail::check_arg<shape_error>(dim >= 1, "phasekv::UniformMean", "dim", dim, "must be >= 1");
  }

  /// The chunk geometry.
  PHASEKV_HOST_DEVICE constexpr Geometry geometry() const { return geometry_; }
  /// Channels of a raw token vector.
  PHASEKV_HOST_DEVICE constexpr std::int64_t input_dim() const { return dim_; }
  /// Channels of an entry (equal to input_dim()).
  PHASEKV_HOST_DEVICE constexpr std::int64_t output_dim() const { return dim_; }

  /// Writes the mean of the window into `out[0, dim)`. `kv_head` is unused (no parameters).
  template <class Load>
  PHASEKV_HOST_DEVICE void compress(std::int64_t kv_head, const Load& x, float* out) const {
    (void)kv_head;
    const std::int64_t w = geometry_.window();
    for (std::int64_t c = 0; c < dim_; ++c) out[c] = x(0, c);
    for (std::int64_t i = 1; i < w; ++i)
      for (std::int64_t c = 0; c < dim_; ++c) out[c] = fp_add(out[c], x(i, c));
    const float wf = static_cast<float>(w);
    for (std::int64_t c = 0; c < dim_; ++c) out[c] = fp_div(out[c], wf);
  }

  /// The window fast path, row_kernels<UniformMean>::window (compress/cpu/uniform_mean_rows.hpp):
  /// the same bits as compress() for a window whose token at offset i starts at
  /// `rows + i * token_stride`. Always handles the window and returns true.
  template <class T>
  bool compress_rows(std::int64_t kv_head, const T* rows, std::int64_t token_stride,
                     float* out) const {
    return row_kernels<detail::dependent_policy_t<UniformMean, T>>::window(*this, kv_head, rows,
                                                                           token_stride, out);
  }

  /// The run fast path, row_kernels<UniformMean>::run (compress/cpu/uniform_mean_rows.hpp):
  /// `count` consecutive windows of one head, entries written by the kernel; returns false,
  /// writing nothing, for configurations it does not cover.
  template <class T>
  bool compress_rows_run(std::int64_t kv_head, const T* rows, std::int64_t token_stride,
                         std::int64_t count, T* entries, std::int64_t entry_stride, bool stream,
                         std::int64_t prefetch_tokens) const {
    return row_kernels<detail::dependent_policy_t<UniformMean, T>>::run(
        *this, kv_head, rows, token_stride, count, entries, entry_stride, stream, prefetch_tokens);
  }

 private:
  Geometry geometry_{};
  std::int64_t dim_ = 1;
};

PHASEKV_NAMESPACE_END

// The CPU fast paths (row_kernels<UniformMean>), always available with the policy.
#include "phasekv/compress/cpu/uniform_mean_rows.hpp"
