/// @file
/// @brief Builds the visible set of one query (a VisibleKV: prefix, compressed entries, raw
/// range) from what it sees (a Visibility) and full raw K/V by position plus the compressed
/// entries by window. VisibilityRule::visible_kv (CPU) and reference_visible (the reference)
/// both build it here.
#pragma once

#include <cstdint>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/view.hpp"
#include "phasekv/phase/geometry.hpp"

PHASEKV_NAMESPACE_BEGIN

/// The messages of make_visible_kv's capacity checks (the callers phrase the query position
/// differently).
struct VisibleSetRequirements {
  const char* raw = "must be >= n";                ///< When the raw views are too short.
  const char* entries = "must hold J(n) entries";  ///< When the entry views are too short.
};

/// The VisibleKV of the query at position `n - 1` that sees `vis`: the prefix
/// `[0, vis.prefix_end)` and the raw range `[vis.raw_begin, vis.raw_end)` of `raw_k`/`raw_v`
/// (indexed by absolute position, at least `n` tokens), and entries `[0, vis.entries)` of
/// `entry_k`/`entry_v` (indexed by window). Empty parts are left out. Throws
/// phasekv::capacity_error (from `where`, naming raw_k.tokens or entry_k.tokens) when a view is
/// too short.
template <class T>
VisibleKV<T> make_visible_kv(const char* where, const Visibility& vis, std::int64_t n,
                             StridedView<const T> raw_k, StridedView<const T> raw_v,
                             StridedView<const T> entry_k, StridedView<const T> entry_v,
                             const VisibleSetRequirements& req = {}) {
  phasekv::detail::check_arg<capacity_error>(raw_k.tokens >= n && raw_v.tokens >= n, where,
                                             "raw_k.tokens", raw_k.tokens, req.raw);
  phasekv::detail::check_arg<capacity_error>(
      vis.entries == 0 || (entry_k.tokens >= vis.entries && entry_v.tokens >= vis.entries), where,
      "entry_k.tokens", entry_k.tokens, req.entries);
  VisibleKV<T> kv;
  kv.push({raw_k.slice(0, vis.prefix_end), raw_v.slice(0, vis.prefix_end), 0, SegmentKind::prefix});
  kv.push(
      {entry_k.slice(0, vis.entries), entry_v.slice(0, vis.entries), 0, SegmentKind::compressed});
  kv.push({raw_k.slice(vis.raw_begin, vis.raw_count()), raw_v.slice(vis.raw_begin, vis.raw_count()),
           vis.raw_begin, SegmentKind::raw});
  return kv;
}

PHASEKV_NAMESPACE_END
