/// @file
/// @brief OffsetSelect: every window becomes the token at one fixed in-window offset r (a
/// one-hot gate). With W = 1 it is strided sampling; with learned r it is the optimal
/// query-independent compressor of the idealized induction model (keys at r, values at r + 1).
#pragma once

#include <cstdint>

#include "phasekv/compress/policy.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/phase/geometry.hpp"

PHASEKV_NAMESPACE_BEGIN

/// One-hot selection: entry `e[c] = x_r[c]` for a fixed offset `r` in `[0, W)`. d_out = d_in;
/// exact (no rounding beyond the storage conversion); any number of KV heads.
class OffsetSelect {
 public:
  /// Default: W = S = 1, O = 0, one channel, offset 0.
  constexpr OffsetSelect() = default;

  /// Selects in-window offset `offset` of windows of `geometry` for vectors of `dim` channels.
  /// Throws phasekv::shape_error when `dim` < 1 and phasekv::invalid_argument when `offset`
  /// is outside `[0, W)`.
  OffsetSelect(const Geometry& geometry, std::int64_t dim, std::int64_t offset)
      : geometry_(geometry), dim_(dim), offset_(offset) {
    const char* where = "phasekv::OffsetSelect";
    detail::check_arg<shape_error>(dim >= 1, where, "dim", dim, "must be >= 1");
    detail::check_arg(offset >= 0 && offset < geometry.window(), where, "offset", offset,
                      "must be in [0, W) for the policy's window W");
  }

  /// The chunk geometry.
  PHASEKV_HOST_DEVICE constexpr Geometry geometry() const { return geometry_; }
  /// Channels of a raw token vector.
  PHASEKV_HOST_DEVICE constexpr std::int64_t input_dim() const { return dim_; }
  /// Channels of an entry (equal to input_dim()).
  PHASEKV_HOST_DEVICE constexpr std::int64_t output_dim() const { return dim_; }
  /// The selected in-window offset r.
  PHASEKV_HOST_DEVICE constexpr std::int64_t offset() const { return offset_; }

  /// Copies the token at offset r into `out[0, dim)`. `kv_head` is unused.
  template <class Load>
  PHASEKV_HOST_DEVICE void compress(std::int64_t kv_head, const Load& x, float* out) const {
    (void)kv_head;
    for (std::int64_t c = 0; c < dim_; ++c) out[c] = x(offset_, c);
  }

 private:
  Geometry geometry_{};
  std::int64_t dim_ = 1;
  std::int64_t offset_ = 0;
};

PHASEKV_NAMESPACE_END
