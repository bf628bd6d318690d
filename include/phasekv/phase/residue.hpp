/// @file
/// @brief Residues modulo any M, and common periods (lcm) of several strides.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/phase/geometry.hpp"

PHASEKV_NAMESPACE_BEGIN

/// `(p - origin) mod m` in `[0, m)`, also for `p < origin`. Requires `m >= 1`.
PHASEKV_HOST_DEVICE constexpr std::int64_t residue(std::int64_t p, std::int64_t m,
                                                   std::int64_t origin = 0) {
  const std::int64_t r = (p - origin) % m;
  return r < 0 ? r + m : r;
}

/// Greatest common divisor of two non-negative integers.
PHASEKV_HOST_DEVICE constexpr std::int64_t gcd(std::int64_t a, std::int64_t b) {
  while (b != 0) {
    const std::int64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

/// Least common multiple of two positive integers; throws phasekv::invalid_argument when an
/// argument is < 1 or the result overflows int64.
inline std::int64_t checked_lcm(std::int64_t a, std::int64_t b) {
  detail::check_arg(a >= 1, "phasekv::checked_lcm", "a", a, "must be >= 1");
  detail::check_arg(b >= 1, "phasekv::checked_lcm", "b", b, "must be >= 1");
  const std::int64_t q = a / gcd(a, b);
  if (q > std::numeric_limits<std::int64_t>::max() / b)
    detail::throw_arg("phasekv::checked_lcm", "b", b, "lcm(a, b) overflows int64");
  return q * b;
}

/// Least common multiple of several strides: the period after which the phases of all of them
/// repeat together (models mix strides per layer). Throws phasekv::invalid_argument for an
/// empty list, a stride < 1, or overflow.
inline std::int64_t stride_lcm(const std::int64_t* strides, std::size_t count) {
  detail::check_arg(count >= 1, "phasekv::stride_lcm", "count", count, "must be >= 1");
  detail::check_arg(strides != nullptr, "phasekv::stride_lcm", "strides", "null",
                    "must point to count strides");
  std::int64_t l = 1;
  for (std::size_t i = 0; i < count; ++i) {
    detail::check_arg(strides[i] >= 1, "phasekv::stride_lcm", "strides[i]", strides[i],
                      "must be >= 1");
    l = checked_lcm(l, strides[i]);
  }
  return l;
}

/// stride_lcm over a braced list, e.g. `stride_lcm({4, 128})`.
inline std::int64_t stride_lcm(std::initializer_list<std::int64_t> strides) {
  return stride_lcm(strides.begin(), strides.size());
}

/// The common phase period of several geometries: the lcm of their strides.
inline std::int64_t common_period(std::initializer_list<Geometry> geometries) {
  detail::check_arg(geometries.size() >= 1, "phasekv::common_period", "geometries.size()",
                    geometries.size(), "must be >= 1");
  std::int64_t l = 1;
  for (const Geometry& g : geometries) l = checked_lcm(l, g.stride());
  return l;
}

PHASEKV_NAMESPACE_END
