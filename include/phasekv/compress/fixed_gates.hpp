/// @file
/// @brief FixedGates: a compressor with fixed, query-independent weights per head and in-window
/// offset, the idealized compressor of the phase sensitivity paper's theory (a one-hot row
/// selects one offset). The retrieval harness (phasekv/eval.hpp) uses it to place heads on
/// chosen offsets.
#pragma once

#include <cstdint>

#include "phasekv/compress/float_ops.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/phase/geometry.hpp"

PHASEKV_NAMESPACE_BEGIN

/// A compressor policy with fixed, query-independent weights per head and in-window offset:
/// entry `e = sum_i w[h][i] x_i`. The weights live in caller memory (`[heads, W]`,
/// row-major; null means uniform 1/W). This is the idealized compressor of the paper's
/// theory (a one-hot row selects one offset); the library's GatedPool with zero content
/// weights and biases `log w` computes the same entries up to float rounding.
class FixedGates {
 public:
  /// Default: W = S = 1, one channel, uniform.
  constexpr FixedGates() = default;
  /// Weights `weights[h * W + i]` for `heads` heads over windows of `geometry` on vectors of
  /// `dim` channels. Throws phasekv::shape_error for `dim < 1` or `heads < 1`.
  FixedGates(const Geometry& geometry, std::int64_t dim, std::int64_t heads, const float* weights)
      : geometry_(geometry), dim_(dim), heads_(heads), weights_(weights) {
    phasekv::detail::check_arg<shape_error>(dim >= 1, "phasekv::FixedGates", "dim", dim,
                                            "must be >= 1");
    phasekv::detail::check_arg<shape_error>(heads >= 1, "phasekv::FixedGates", "heads", heads,
                                            "must be >= 1");
  }
  /// The chunk geometry.
  PHASEKV_HOST_DEVICE constexpr Geometry geometry() const { return geometry_; }
  /// Channels in.
  PHASEKV_HOST_DEVICE constexpr std::int64_t input_dim() const { return dim_; }
  /// Channels out (= input_dim()).
  PHASEKV_HOST_DEVICE constexpr std::int64_t output_dim() const { return dim_; }
  /// Heads the weights cover.
  PHASEKV_HOST_DEVICE constexpr std::int64_t kv_heads() const { return heads_; }
  /// Writes `sum_i w[h][i] x(i, :)` (offset order, fused multiply-adds).
  template <class Load>
  PHASEKV_HOST_DEVICE void compress(std::int64_t kv_head, const Load& x, float* out) const {
    const std::int64_t w = geometry_.window();
    const float uniform = 1.0f / static_cast<float>(w);
    for (std::int64_t c = 0; c < dim_; ++c) out[c] = 0.0f;
    for (std::int64_t i = 0; i < w; ++i) {
      const float a = weights_ ? weights_[kv_head * w + i] : uniform;
      for (std::int64_t c = 0; c < dim_; ++c) out[c] = phasekv::detail::fp_fma(a, x(i, c), out[c]);
    }
  }

 private:
  Geometry geometry_{};
  std::int64_t dim_ = 1;
  std::int64_t heads_ = 1;
  const float* weights_ = nullptr;
};

PHASEKV_NAMESPACE_END
