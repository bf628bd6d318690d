/// @file
/// @brief Calls a variant's optional host `check(where)` member (StandardVariant has one; a
/// user variant may omit it).
#pragma once

#include <utility>

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
}  // namespace cpu
PHASEKV_NAMESPACE_END
