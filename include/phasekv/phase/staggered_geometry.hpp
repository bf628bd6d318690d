/// @file
/// @brief StaggeredGeometry: one window W and stride S for every KV head, and an origin O_h
/// per KV head (staggered windows). Head h follows every rule of Geometry with origin O_h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/phase/geometry.hpp"

PHASEKV_NAMESPACE_BEGIN

/// Checks a per-KV-head origin list: exactly `kv_heads` entries, each in
/// `[0, kMaxGeometryExtent]`. Throws phasekv::invalid_argument from `where` naming
/// `origins.size()` (wrong count) or `origins[h]` (a bad origin) and the value.
inline void check_origins(const char* where, const std::vector<std::int64_t>& origins,
                          std::int64_t kv_heads) {
  const std::string req =
      "must equal kv_heads = " + std::to_string(kv_heads) + " (one per KV head)";
  detail::check_arg(static_cast<std::int64_t>(origins.size()) == kv_heads, where, "origins.size()",
                    static_cast<std::int64_t>(origins.size()), req.c_str());
  for (std::size_t h = 0; h < origins.size(); ++h) {
    const std::string name = "origins[" + std::to_string(h) + "]";
    detail::check_arg(origins[h] >= 0 && origins[h] <= kMaxGeometryExtent, where, name.c_str(),
                      origins[h], "must be in [0, 2^40]");
  }
}

/// The origins `O_h = h * S / H` (integer division) that spread H KV heads evenly over one
/// stride: with H = S every phase is a window boundary of exactly one head.
inline std::vector<std::int64_t> even_origins(std::int64_t stride, std::int64_t kv_heads) {
  const char* where = "phasekv::even_origins";
  detail::check_arg(stride >= 1 && stride <= kMaxGeometryExtent, where, "stride", stride,
                    "must be in [1, 2^40]");
  detail::check_arg(kv_heads >= 1 && kv_heads <= (std::int64_t{1} << 20), where, "kv_heads",
                    kv_heads, "must be in [1, 2^20]");
  std::vector<std::int64_t> o(static_cast<std::size_t>(kv_heads));
  for (std::int64_t h = 0; h < kv_heads; ++h)
    o[static_cast<std::size_t>(h)] = h * stride / kv_heads;
  return o;
}

/// Windows of W tokens every S tokens, with a separate origin per KV head: window j of head h
/// covers `[O_h + j*S, O_h + j*S + W)`, positions below O_h are head h's raw prefix, and the
/// phase, J(n), raw tail and visible set of head h are those of `Geometry(W, S, O_h)`
/// (head(h)). Origins may be any values in `[0, 2^40]`, also larger than S.
class StaggeredGeometry {
 public:
  /// One head, W = S = 1, O = 0.
  StaggeredGeometry() : origins_{0} {}

  /// Builds the geometry of `origins.size()` KV heads. Throws phasekv::invalid_argument naming
  /// `window`, `stride`, `origins.size()` (empty) or `origins[h]` and the value.
  StaggeredGeometry(std::int64_t window, std::int64_t stride, std::vector<std::int64_t> origins)
      : window_(window), stride_(stride), origins_(std::move(origins)) {
    const char* where = "phasekv::StaggeredGeometry";
    (void)Geometry(window, stride, 0);  // validates W and S
    detail::check_arg(!origins_.empty(), where, "origins.size()", std::int64_t{0},
                      "must be >= 1 (one origin per KV head)");
    check_origins(where, origins_, static_cast<std::int64_t>(origins_.size()));
  }

  /// Every head with origin `g.origin()` (the uniform case).
  static StaggeredGeometry uniform(const Geometry& g, std::int64_t kv_heads) {
    detail::check_arg(kv_heads >= 1, "phasekv::StaggeredGeometry::uniform", "kv_heads", kv_heads,
                      "must be >= 1");
    return StaggeredGeometry(
        g.window(), g.stride(),
        std::vector<std::int64_t>(static_cast<std::size_t>(kv_heads), g.origin()));
  }

  /// Window length W (every head).
  std::int64_t window() const { return window_; }
  /// Stride S (every head).
  std::int64_t stride() const { return stride_; }
  /// Number of KV heads (origins().size()).
  std::int64_t kv_heads() const { return static_cast<std::int64_t>(origins_.size()); }
  /// The origins, one per KV head.
  const std::vector<std::int64_t>& origins() const { return origins_; }
  /// Origin O_h of KV head `h` (no bounds check beyond std::vector's).
  std::int64_t origin(std::int64_t h) const { return origins_[static_cast<std::size_t>(h)]; }
  /// The geometry of KV head `h`: `Geometry(W, S, O_h)`. Throws phasekv::invalid_argument
  /// naming `h` when it is not in `[0, kv_heads())`.
  Geometry head(std::int64_t h) const {
    detail::check_arg(h >= 0 && h < kv_heads(), "phasekv::StaggeredGeometry::head", "h", h,
                      "must be in [0, kv_heads())");
    return Geometry(window_, stride_, origin(h));
  }
  /// Largest J(n) over the heads: the entry rows a `[rows, kv_heads, d]` buffer holding every
  /// head's entries needs.
  std::int64_t max_complete_windows(std::int64_t n) const {
    std::int64_t m = 0;
    for (std::int64_t h = 0; h < kv_heads(); ++h) {
      const std::int64_t j = head(h).complete_windows(n);
      m = j > m ? j : m;
    }
    return m;
  }
  /// True when every head has the same origin (a plain Geometry describes it).
  bool is_uniform() const {
    for (std::int64_t o : origins_)
      if (o != origins_.front()) return false;
    return true;
  }

  /// Equality of W, S and every origin.
  bool operator==(const StaggeredGeometry& o) const {
    return window_ == o.window_ && stride_ == o.stride_ && origins_ == o.origins_;
  }
  /// Inequality.
  bool operator!=(const StaggeredGeometry& o) const { return !(*this == o); }

 private:
  std::int64_t window_ = 1;
  std::int64_t stride_ = 1;
  std::vector<std::int64_t> origins_;
};

PHASEKV_NAMESPACE_END
