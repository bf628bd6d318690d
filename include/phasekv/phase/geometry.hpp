/// @file
/// @brief Chunk geometry (W, S, O): windows, phases, offsets, complete windows, raw tail and
/// the visible set of a query. The semantics every other part of phasekv shares.
#pragma once

#include <cstdint>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"

PHASEKV_NAMESPACE_BEGIN

/// Largest window, stride or origin a Geometry accepts (2^40 tokens). Keeping the fields this
/// small guarantees that every position computed from a length up to kMaxLength fits int64.
inline constexpr std::int64_t kMaxGeometryExtent = std::int64_t{1} << 40;

/// Largest sequence length (n) the geometry functions are defined for (2^62).
inline constexpr std::int64_t kMaxLength = std::int64_t{1} << 62;

/// What a query sees after `n` tokens with local window `L`:
/// positions `[0, prefix_end)` raw, compressed entries `[0, entries)`, and raw positions
/// `[raw_begin, raw_end)`. The raw range never overlaps the prefix.
struct Visibility {
  std::int64_t prefix_end = 0;  ///< Raw prefix positions `[0, prefix_end)`; `min(n, O)`.
  std::int64_t entries = 0;     ///< Number of visible compressed entries, J(n).
  std::int64_t raw_begin = 0;   ///< First visible raw position after the prefix.
  std::int64_t raw_end = 0;     ///< One past the last visible raw position (= n).

  /// Number of raw positions visible after the prefix.
  PHASEKV_HOST_DEVICE constexpr std::int64_t raw_count() const { return raw_end - raw_begin; }
  /// Total number of attended items: prefix + entries + raw.
  PHASEKV_HOST_DEVICE constexpr std::int64_t total() const {
    return prefix_end + entries + raw_count();
  }
};

/// Windows of `window` (W) tokens start every `stride` (S) tokens from `origin` (O):
/// window j covers positions `[O + j*S, O + j*S + W)`. Positions below O form the raw prefix.
/// W < S leaves gap tokens no window holds, W == S tiles, W > S overlaps.
///
/// The constructor validates on the host and throws phasekv::invalid_argument naming the
/// field and value; all queries are constexpr and callable from device code.
class Geometry {
 public:
  /// W = S = 1, O = 0: every token is its own entry.
  constexpr Geometry() = default;

  /// Builds a geometry; throws phasekv::invalid_argument when `window` < 1, `stride` < 1,
  /// `origin` < 0 or any of them exceeds kMaxGeometryExtent.
  PHASEKV_HOST_DEVICE constexpr Geometry(std::int64_t window, std::int64_t stride,
                                         std::int64_t origin = 0)
      : window_(window), stride_(stride), origin_(origin) {
#if !PHASEKV_IS_DEVICE_CODE
    validate(window, stride, origin);
#endif
  }

  /// Window length W.
  PHASEKV_HOST_DEVICE constexpr std::int64_t window() const { return window_; }
  /// Stride S between window starts.
  PHASEKV_HOST_DEVICE constexpr std::int64_t stride() const { return stride_; }
  /// Origin O: the first position that belongs to a window.
  PHASEKV_HOST_DEVICE constexpr std::int64_t origin() const { return origin_; }

  /// True when W < S (some tokens belong to no window).
  PHASEKV_HOST_DEVICE constexpr bool has_gaps() const { return window_ < stride_; }
  /// True when W > S (windows overlap).
  PHASEKV_HOST_DEVICE constexpr bool overlaps() const { return window_ > stride_; }

  /// First position of window `j`.
  PHASEKV_HOST_DEVICE constexpr std::int64_t window_begin(std::int64_t j) const {
    return origin_ + j * stride_;
  }
  /// One past the last position of window `j`.
  PHASEKV_HOST_DEVICE constexpr std::int64_t window_end(std::int64_t j) const {
    return origin_ + j * stride_ + window_;
  }
  /// True for positions in the raw prefix (p < O).
  PHASEKV_HOST_DEVICE constexpr bool in_prefix(std::int64_t p) const { return p < origin_; }

  /// Phase of position `p >= O`: `(p - O) mod S`. Returns -1 for prefix positions.
  PHASEKV_HOST_DEVICE constexpr std::int64_t phase(std::int64_t p) const {
    return p < origin_ ? -1 : (p - origin_) % stride_;
  }
  /// Offset of position `p` inside window `j`: `p - O - j*S` (in `[0, W)` when j covers p).
  PHASEKV_HOST_DEVICE constexpr std::int64_t offset(std::int64_t p, std::int64_t j) const {
    return p - origin_ - j * stride_;
  }
  /// True when window `j` contains position `p`.
  PHASEKV_HOST_DEVICE constexpr bool covers(std::int64_t j, std::int64_t p) const {
    return j >= 0 && p >= window_begin(j) && p < window_end(j);
  }

  /// Index of the last window starting at or before `p` (the stride cell of `p`), or -1 for
  /// prefix positions.
  PHASEKV_HOST_DEVICE constexpr std::int64_t cell(std::int64_t p) const {
    return p < origin_ ? -1 : (p - origin_) / stride_;
  }
  /// Smallest j whose window covers `p`; only meaningful when cover_count(p) > 0.
  PHASEKV_HOST_DEVICE constexpr std::int64_t first_covering_window(std::int64_t p) const {
    const std::int64_t d = p - origin_ - window_;  // need j*S > d
    return d < 0 ? 0 : d / stride_ + 1;
  }
  /// Largest j whose window covers `p`; only meaningful when cover_count(p) > 0.
  PHASEKV_HOST_DEVICE constexpr std::int64_t last_covering_window(std::int64_t p) const {
    return cell(p);
  }
  /// Number of windows that contain `p` (0 for prefix and gap positions).
  PHASEKV_HOST_DEVICE constexpr std::int64_t cover_count(std::int64_t p) const {
    if (p < origin_) return 0;
    const std::int64_t c = last_covering_window(p) - first_covering_window(p) + 1;
    return c > 0 ? c : 0;
  }

  /// J(n): number of complete windows after `n` tokens.
  PHASEKV_HOST_DEVICE constexpr std::int64_t complete_windows(std::int64_t n) const {
    return n - origin_ >= window_ ? (n - origin_ - window_) / stride_ + 1 : 0;
  }
  /// Number of tokens after which window `j` is complete: `O + j*S + W` (its last token is
  /// position `O + j*S + W - 1`).
  PHASEKV_HOST_DEVICE constexpr std::int64_t completes_at(std::int64_t j) const {
    return window_end(j);
  }
  /// First position of the raw tail after `n` tokens: `min(n, O + J(n)*S)`. The tail holds
  /// the tokens whose next window has not completed.
  PHASEKV_HOST_DEVICE constexpr std::int64_t raw_tail_begin(std::int64_t n) const {
    const std::int64_t b = origin_ + complete_windows(n) * stride_;
    return b < n ? b : n;
  }

  /// The visible set of a query at position `n - 1` with a local window of `local` (L >= 0)
  /// raw tokens. For `n == 0` everything is empty.
  PHASEKV_HOST_DEVICE constexpr Visibility visible(std::int64_t n, std::int64_t local) const {
    Visibility v;
    v.prefix_end = n < origin_ ? n : origin_;
    v.entries = complete_windows(n);
    const std::int64_t tail = raw_tail_begin(n);
    const std::int64_t band = n - local;
    const std::int64_t lo = tail < band ? tail : band;
    v.raw_begin = lo > v.prefix_end ? lo : v.prefix_end;
    v.raw_end = n;
    return v;
  }

  /// Raw tokens a streaming cache must keep to serve any query: `max(W, L)`.
  PHASEKV_HOST_DEVICE constexpr std::int64_t ring_capacity(std::int64_t local) const {
    return window_ > local ? window_ : local;
  }

  /// Equality of all three fields.
  PHASEKV_HOST_DEVICE constexpr bool operator==(const Geometry& o) const {
    return window_ == o.window_ && stride_ == o.stride_ && origin_ == o.origin_;
  }
  /// Inequality.
  PHASEKV_HOST_DEVICE constexpr bool operator!=(const Geometry& o) const { return !(*this == o); }

  /// Host-side check of a length argument; throws phasekv::invalid_argument naming `name`.
  static void check_length(const char* where, const char* name, std::int64_t n) {
    detail::check_arg(n >= 0 && n <= kMaxLength, where, name, n, "must be in [0, 2^62]");
  }
  /// Host-side check of a local-window argument; throws phasekv::invalid_argument.
  static void check_local(const char* where, const char* name, std::int64_t local) {
    detail::check_arg(local >= 0 && local <= kMaxGeometryExtent, where, name, local,
                      "must be in [0, 2^40]");
  }

 private:
  static constexpr void validate(std::int64_t w, std::int64_t s, std::int64_t o) {
    if (w < 1) detail::throw_arg("phasekv::Geometry", "window", w, "must be >= 1");
    if (s < 1) detail::throw_arg("phasekv::Geometry", "stride", s, "must be >= 1");
    if (o < 0) detail::throw_arg("phasekv::Geometry", "origin", o, "must be >= 0");
    if (w > kMaxGeometryExtent)
      detail::throw_arg("phasekv::Geometry", "window", w, "must be <= 2^40 (int64 overflow)");
    if (s > kMaxGeometryExtent)
      detail::throw_arg("phasekv::Geometry", "stride", s, "must be <= 2^40 (int64 overflow)");
    if (o > kMaxGeometryExtent)
      detail::throw_arg("phasekv::Geometry", "origin", o, "must be <= 2^40 (int64 overflow)");
  }

  std::int64_t window_ = 1;
  std::int64_t stride_ = 1;
  std::int64_t origin_ = 0;
};

PHASEKV_NAMESPACE_END
