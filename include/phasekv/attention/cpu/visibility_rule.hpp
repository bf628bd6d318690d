/// @file
/// @brief `VisibilityRule`: which keys a query at a given position sees, either under chunked
/// compression (Geometry + local window) or uncompressed (plain causal or sliding-window
/// attention over a raw cache), so that the baseline runs through the same kernels.
#pragma once

#include <cstdint>

#include "phasekv/attention/visible_set.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/view.hpp"
#include "phasekv/phase/geometry.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cpu {

/// Visibility of a query at position `n - 1`: compressed (prefix + entries + raw band, as
/// Geometry::visible) or uncompressed (the last `window` raw tokens, or all of them).
class VisibilityRule {
 public:
  /// Chunked compression with geometry `g` and local window `local` (L >= 0).
  static VisibilityRule compressed(const Geometry& g, std::int64_t local) {
    Geometry::check_local("phasekv::cpu::VisibilityRule::compressed", "local", local);
    VisibilityRule r;
    r.compressed_ = true;
    r.geometry_ = g;
    r.local_ = local;
    return r;
  }
  /// Uncompressed causal attention over every raw token `[0, n)`.
  static VisibilityRule causal() { return VisibilityRule(); }
  /// Uncompressed sliding-window attention over the last `window` raw tokens
  /// (`window` >= 1).
  static VisibilityRule sliding_window(std::int64_t window) {
    phasekv::detail::check_arg(window >= 1, "phasekv::cpu::VisibilityRule::sliding_window",
                               "window", window, "must be >= 1 (use causal() for no window)");
    VisibilityRule r;
    r.window_ = window;
    return r;
  }

  /// True for the compressed rule.
  PHASEKV_HOST_DEVICE bool is_compressed() const { return compressed_; }
  /// The geometry (meaningful only when compressed).
  PHASEKV_HOST_DEVICE const Geometry& geometry() const { return geometry_; }
  /// The local window L (compressed) .
  PHASEKV_HOST_DEVICE std::int64_t local() const { return local_; }
  /// The sliding window (uncompressed; 0 means full causal).
  PHASEKV_HOST_DEVICE std::int64_t window() const { return window_; }

  /// The same rule for a KV head with origin `origin` (per-KV-head origins): the compressed
  /// rule with geometry `(W, S, origin)`; uncompressed rules are returned unchanged. The origin
  /// must be in `[0, 2^40]` (checked by the callers that take origins).
  PHASEKV_HOST_DEVICE VisibilityRule with_origin(std::int64_t origin) const {
    VisibilityRule r = *this;
    if (compressed_) r.geometry_ = Geometry(geometry_.window(), geometry_.stride(), origin);
    return r;
  }

  /// What the query at position `n - 1` sees. Uncompressed rules report no prefix and no
  /// entries, and the raw range `[max(0, n - window), n)`.
  PHASEKV_HOST_DEVICE Visibility at(std::int64_t n) const {
    if (compressed_) return geometry_.visible(n, local_);
    Visibility v;
    v.raw_end = n;
    v.raw_begin = (window_ > 0 && n > window_) ? n - window_ : 0;
    return v;
  }

  /// Builds the VisibleKV of the query at position `n - 1` from full raw K/V indexed by
  /// absolute position (at least `n` tokens) and the compressed entries (at least J(n); ignored
  /// by uncompressed rules). Throws phasekv::capacity_error when the views are too short.
  template <class T>
  VisibleKV<T> visible_kv(std::int64_t n, StridedView<const T> raw_k, StridedView<const T> raw_v,
                          StridedView<const T> entry_k = {},
                          StridedView<const T> entry_v = {}) const {
    const char* where = "phasekv::cpu::VisibilityRule::visible_kv";
    Geometry::check_length(where, "n", n);
    return make_visible_kv<T>(where, at(n), n, raw_k, raw_v, entry_k, entry_v);
  }

 private:
  bool compressed_ = false;
  Geometry geometry_{};
  std::int64_t local_ = 0;
  std::int64_t window_ = 0;
};

}  // namespace cpu
PHASEKV_NAMESPACE_END
