/// @file
/// @brief Work partitioning by (thread index, thread count), in the style of ggml: a kernel
/// call takes its own index and the count, so an engine's own thread pool can drive it.
#pragma once

#include <cstdint>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cpu {

/// A half-open range `[begin, end)` of work units.
struct WorkRange {
  std::int64_t begin = 0;  ///< First unit.
  std::int64_t end = 0;    ///< One past the last unit.
  /// Number of units.
  std::int64_t size() const { return end - begin; }
};

/// Checks a (thread_index, thread_count) pair; throws phasekv::invalid_argument naming it.
inline void check_partition(const char* where, int thread_index, int thread_count) {
  phasekv::detail::check_arg(thread_count >= 1, where, "thread_count", thread_count,
                             "must be >= 1");
  phasekv::detail::check_arg(thread_index >= 0 && thread_index < thread_count, where,
                             "thread_index", thread_index, "must be in [0, thread_count)");
}

/// Part `index` of `count` contiguous, nearly equal parts of `[0, total)`, with interior
/// boundaries rounded down to multiples of `align` (>= 1). The parts cover `[0, total)`
/// exactly, in order; some may be empty.
inline WorkRange partition_range(std::int64_t total, int index, int count, std::int64_t align = 1) {
  const auto boundary = [&](int p) -> std::int64_t {
    if (p <= 0) return 0;
    if (p >= count) return total;
    // total * p / count without overflow for total < 2^62 and small counts
    const std::int64_t q = total / count, r = total % count;
    const std::int64_t b = q * p + (r * p) / count;
    return (b / align) * align;
  };
  return WorkRange{boundary(index), boundary(index + 1)};
}

}  // namespace cpu
PHASEKV_NAMESPACE_END
