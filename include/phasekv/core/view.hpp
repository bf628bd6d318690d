/// @file
/// @brief Non-owning strided views over caller memory, and the visible-KV segment list that
/// caches hand to attention kernels.
#pragma once

#include <cstdint>
#include <type_traits>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"

PHASEKV_NAMESPACE_BEGIN

/// Memory layout of a `[tokens, heads, dim]` tensor.
enum class Layout : std::uint8_t {
  NHD,  ///< token-major: element (t, h, i) at `(t * heads + h) * dim + i`.
  HND,  ///< head-major: element (t, h, i) at `(h * tokens + t) * dim + i`.
};

/// A non-owning view of a `[tokens, heads, dim]` tensor with arbitrary token and head strides
/// (in elements) and unit stride along `dim`. Engines describe their own buffers with it;
/// nothing is copied.
///
/// @tparam T element type (possibly const-qualified).
template <class T>
struct StridedView {
  T* data = nullptr;              ///< Element (0, 0, 0); may be null only when the view is empty.
  std::int64_t tokens = 0;        ///< Number of tokens (first extent).
  std::int64_t heads = 0;         ///< Number of heads (second extent).
  std::int64_t dim = 0;           ///< Elements per (token, head) vector (third extent).
  std::int64_t token_stride = 0;  ///< Elements between consecutive tokens.
  std::int64_t head_stride = 0;   ///< Elements between consecutive heads.

  /// Pointer to the vector of token `t`, head `h`.
  PHASEKV_HOST_DEVICE T* ptr(std::int64_t t, std::int64_t h) const {
    return data + t * token_stride + h * head_stride;
  }
  /// Element `i` of token `t`, head `h`.
  PHASEKV_HOST_DEVICE T& operator()(std::int64_t t, std::int64_t h, std::int64_t i) const {
    return ptr(t, h)[i];
  }
  /// True when the view has no tokens.
  PHASEKV_HOST_DEVICE bool empty() const { return tokens == 0; }

  /// The sub-view of tokens `[first, first + count)`; no bounds check.
  PHASEKV_HOST_DEVICE StridedView slice(std::int64_t first, std::int64_t count) const {
    StridedView v = *this;
    v.data = count > 0 ? data + first * token_stride : data;
    v.tokens = count;
    return v;
  }

  /// Implicit conversion to a view of const elements.
  template <class U = T, class = std::enable_if_t<!std::is_const<U>::value>>
  PHASEKV_HOST_DEVICE operator StridedView<const U>() const {
    return StridedView<const U>{data, tokens, heads, dim, token_stride, head_stride};
  }
};

/// Describes a densely packed `[tokens, heads, dim]` tensor in the given layout.
template <class T>
StridedView<T> make_view(T* data, std::int64_t tokens, std::int64_t heads, std::int64_t dim,
                         Layout layout = Layout::NHD) {
  StridedView<T> v{data, tokens, heads, dim, 0, 0};
  if (layout == Layout::NHD) {
    v.token_stride = heads * dim;
    v.head_stride = dim;
  } else {
    v.token_stride = dim;
    v.head_stride = tokens * dim;
  }
  return v;
}

/// Checks a view's shape and throws phasekv::shape_error naming `name` when it is unusable:
/// negative extents or strides, or a null pointer with a non-zero extent.
template <class T>
void check_view(const StridedView<T>& v, const char* where, const char* name) {
  detail::check_arg<shape_error>(v.tokens >= 0, where, name, v.tokens, "tokens must be >= 0");
  detail::check_arg<shape_error>(v.heads >= 0, where, name, v.heads, "heads must be >= 0");
  detail::check_arg<shape_error>(v.dim >= 0, where, name, v.dim, "dim must be >= 0");
  detail::check_arg<shape_error>(v.token_stride >= 0 && v.head_stride >= 0, where, name,
                                 v.token_stride, "strides must be >= 0");
  const bool nonempty = v.tokens > 0 && v.heads > 0 && v.dim > 0;
  detail::check_arg<shape_error>(!(nonempty && v.data == nullptr), where, name, "null",
                                 "data is null but the view is not empty");
}

/// What a segment of the visible key/value set holds.
enum class SegmentKind : std::uint8_t {
  prefix,      ///< raw tokens before the compression origin (kept for ever).
  compressed,  ///< compressed entries (one per complete window).
  raw,         ///< raw recent tokens (the raw tail and the local window).
};

/// One contiguous run of keys and values that a query attends to.
///
/// `keys` and `values` have the same number of tokens and heads; their `dim` may differ
/// (d_k != d_v). For raw and prefix segments `first` is the absolute position of token 0;
/// for compressed segments it is the index j of the first entry.
template <class T>
struct KVSegment {
  StridedView<const T> keys;            ///< `[tokens, kv_heads, d_k]`.
  StridedView<const T> values;          ///< `[tokens, kv_heads, d_v]`.
  std::int64_t first = 0;               ///< Position (raw) or entry index (compressed).
  SegmentKind kind = SegmentKind::raw;  ///< What the segment holds.

  /// Number of tokens or entries in the segment.
  PHASEKV_HOST_DEVICE std::int64_t size() const { return keys.tokens; }
};

/// The complete set of keys and values a decode query sees, as at most
/// `kMaxSegments` segments (prefix, compressed entries, and a raw range that may wrap around a
/// ring buffer). Segments appear in position order; empty segments are omitted.
template <class T>
struct VisibleKV {
  static constexpr int kMaxSegments = 4;  ///< Capacity of `segments`.
  KVSegment<T> segments[kMaxSegments];    ///< The first `count` are used.
  int count = 0;                          ///< Number of segments in use.

  /// Appends a segment; empty segments are ignored. Throws phasekv::capacity_error when full.
  void push(const KVSegment<T>& s) {
    if (s.size() == 0) return;
    detail::check_arg<capacity_error>(count < kMaxSegments, "phasekv::VisibleKV::push", "count",
                                      count, "at most kMaxSegments segments");
    segments[count++] = s;
  }
  /// Total tokens and entries over all segments.
  PHASEKV_HOST_DEVICE std::int64_t total() const {
    std::int64_t n = 0;
    for (int i = 0; i < count; ++i) n += segments[i].size();
    return n;
  }
};

/// Heads `[h, h + count)` of a `[tokens, heads, dim]` view as a view of `count` heads (no
/// copy); by default the one head `h`.
template <class T>
StridedView<T> head_view(const StridedView<T>& v, std::int64_t h, std::int64_t count = 1) {
  StridedView<T> r = v;
  if (r.data != nullptr) r.data += h * v.head_stride;
  r.heads = count;
  return r;
}

PHASEKV_NAMESPACE_END
