/// @file
/// @brief Calls a variant's optional host `check(where)` member (StandardVariant has one; a
/// user variant may omit it), and the variant of one KV head's query group (slice_variant).
#pragma once

#include <utility>

#include <cstdint>

#include "phasekv/attention/params.hpp"
#include "phasekv/core/config.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cpu {
namespace detail {

template <class V>
auto check_variant_impl(const V& v, const char* where, int) -> decltype(v.check(where), void()) {
  v.check(where);
}
template <class V>
void check_variant_impl(const V&, const char*, long) {}

/// Runs `v.check(where)` when the variant has such a member.
template <class V>
void check_variant(const V& v, const char* where) {
  check_variant_impl(v, where, 0);
}

}  // namespace detail

/// A variant whose query head 0 is head `offset` of `inner` (the sinks of one query group).
/// StandardVariant is sliced as a StandardVariant (see slice_variant), so it keeps its kernel
/// paths; this wrapper serves user variants.
template <class Variant>
struct HeadOffsetVariant {
  Variant inner{};          ///< The caller's variant.
  std::int64_t offset = 0;  ///< Query head of `inner` that head 0 stands for.

  /// `inner.logit(dot, kind)`.
  PHASEKV_HOST_DEVICE float logit(float dot, SegmentKind kind) const {
    return inner.logit(dot, kind);
  }
  /// `inner.has_sink()`.
  PHASEKV_HOST_DEVICE bool has_sink() const { return inner.has_sink(); }
  /// `inner.sink(offset + h)`.
  PHASEKV_HOST_DEVICE float sink(std::int64_t h) const { return inner.sink(offset + h); }
  /// The inner variant's host check, when it has one.
  void check(const char* where) const { detail::check_variant(inner, where); }
};

/// The variant of query heads `[offset, ...)`: a StandardVariant with its sinks pointer
/// advanced by `offset`.
inline StandardVariant slice_variant(const StandardVariant& v, std::int64_t offset) {
  StandardVariant s = v;
  if (s.sinks != nullptr) s.sinks += offset;
  return s;
}
/// The variant of query heads `[offset, ...)`: a user variant wrapped in HeadOffsetVariant.
template <class Variant>
HeadOffsetVariant<Variant> slice_variant(const Variant& v, std::int64_t offset) {
  return HeadOffsetVariant<Variant>{v, offset};
}

}  // namespace cpu
PHASEKV_NAMESPACE_END
