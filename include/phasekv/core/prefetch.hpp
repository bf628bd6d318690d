/// @file
/// @brief Software prefetch into the second-level cache, a no-op where the compiler has no
/// prefetch builtin.
#pragma once

#include <cstdint>

#include "phasekv/core/config.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace detail {

/// Prefetches the 64-byte cache lines of `[p, p + bytes)` into the second-level cache (x86
/// `prefetcht1`) for reading. Never faults; does nothing without GCC/Clang builtins.
PHASEKV_FORCEINLINE void prefetch_l2(const void* p, std::int64_t bytes) {
#if defined(__GNUC__)
  const char* c = static_cast<const char*>(p);
  for (std::int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, 0, 2);
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace detail
PHASEKV_NAMESPACE_END
