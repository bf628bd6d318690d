/// @file
/// @brief MaxPool: every window becomes the element-wise maximum of its token vectors (as in
/// the Compressive Transformer's max-pooling compression).
#pragma once

#include <cstdint>

#include "phasekv/compress/float_ops.hpp"
#include "phasekv/compress/policy.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/phase/geometry.hpp"

PHASEKV_NAMESPACE_BEGIN

/// Element-wise max pooling: `e[c] = max_i x_i[c]`. A NaN anywhere in a channel makes that
/// channel NaN. d_out = d_in; exact; any number of KV heads.
class MaxPool {
 public:
  /// Default: W = S = 1, O = 0, one channel.
  constexpr MaxPool() = default;

  /// Max pooling over windows of `geometry` for vectors of `dim` channels. Throws
  /// phasekv::shape_error when `dim` < 1.
  MaxPool(const Geometry& geometry, std::int64_t dim) : geometry_(geometry), dim_(dim) {
    detail::check_arg<shape_error>(dim >= 1, "phasekv::MaxPool", "dim", dim, "must be >= 1");
  }

  /// The chunk geometry.
  PHASEKV_HOST_DEVICE constexpr Geometry geometry() const { return geometry_; }
  /// Channels of a raw token vector.
  PHASEKV_HOST_DEVICE constexpr std::int64_t input_dim() const { return dim_; }
  /// Channels of an entry (equal to input_dim()).
  PHASEKV_HOST_DEVICE constexpr std::int64_t output_dim() const { return dim_; }

  /// Writes the channel-wise maximum of the window into `out[0, dim)`. `kv_head` is unused.
  template <class Load>
  PHASEKV_HOST_DEVICE void compress(std::int64_t kv_head, const Load& x, float* out) const {
    (void)kv_head;
    const std::int64_t w = geometry_.window();
    for (std::int64_t c = 0; c < dim_; ++c) out[c] = x(0, c);
    for (std::int64_t i = 1; i < w; ++i)
      for (std::int64_t c = 0; c < dim_; ++c) out[c] = detail::fp_max(out[c], x(i, c));
  }

 private:
  Geometry geometry_{};
  std::int64_t dim_ = 1;
};

PHASEKV_NAMESPACE_END
