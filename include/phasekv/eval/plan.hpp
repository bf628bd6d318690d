/// @file
/// @brief Position-matched sweep planning: target positions grouped by residue modulo M whose
/// mean is exactly equal across groups and whose variance differs by at most a set tolerance,
/// and the layout of each prompt (fillers, records, target, query) under prefix or
/// in-sequence padding.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/phase/residue.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace eval {

/// Target positions of a position-matched sweep: `positions[r]` holds the targets of residue
/// group r (all `≡ origin + r mod M`).
struct TargetPlan {
  std::int64_t modulus = 0;                          ///< M.
  std::vector<std::vector<std::int64_t>> positions;  ///< Per residue, `count` positions.
  std::vector<double> mean;                          ///< Mean position per group.
  std::vector<double> variance;                      ///< Population variance per group.
  /// `max(variance) / min(variance) - 1` (0 when all groups are equal).
  double variance_spread() const {
    const auto mm = std::minmax_element(variance.begin(), variance.end());
    return *mm.first > 0.0 ? *mm.second / *mm.first - 1.0 : (*mm.second > 0.0 ? 1e300 : 0.0);
  }
};

/// Plans `count` targets per residue group modulo `modulus` within positions `[lo, hi]`.
///
/// Construction: a common grid of block starts `b_k = origin + M a_k` (k < count, a_k spread
/// evenly over the blocks that fit inside `[lo + M, hi - M + 1]`); group r uses
/// `b_k + r`, minus M for `count * r / M` evenly spread k. Every group then has mean exactly
/// `mean_k(b_k)` (this needs `count` to be a multiple of M), and the variances differ by
/// O(M^2 / span^2). Throws phasekv::invalid_argument when an argument is out of range
/// (`count` above 2^31, `lo` or `hi` above kMaxLength = 2^62), when `count` is not a
/// multiple of M, when `[lo, hi]` is too short, or when the variances differ by more than
/// `max_variance_spread` (use more targets or a wider range).
inline TargetPlan plan_targets(std::int64_t modulus, std::int64_t count, std::int64_t lo,
                               std::int64_t hi, std::int64_t origin = 0,
                               double max_variance_spread = 0.01) {
  const char* where = "phasekv::eval::plan_targets";
  phasekv::detail::check_arg(modulus >= 1 && modulus <= (std::int64_t{1} << 20), where, "modulus",
                             modulus, "must be in [1, 2^20]");
  phasekv::detail::check_arg(count >= 1 && count % modulus == 0, where, "count", count,
                             "must be a positive multiple of the modulus (exact mean matching)");
  phasekv::detail::check_arg(count <= (std::int64_t{1} << 31), where, "count", count,
                             "must be <= 2^31");
  phasekv::detail::check_arg(origin >= 0, where, "origin", origin, "must be >= 0");
  phasekv::detail::check_arg(lo >= origin, where, "lo", lo, "must be >= origin");
  phasekv::detail::check_arg(lo <= kMaxLength, where, "lo", lo, "must be <= 2^62");
  phasekv::detail::check_arg(hi <= kMaxLength, where, "hi", hi, "must be <= 2^62");
  // floor(a * b / c) for 0 <= a <= c and b >= 0 without forming a * b, which overflows for
  // long ranges: a * floor(b / c) <= b, and a * (b mod c) < 2^63 in both uses below (there
  // a <= 2 count <= 2^32 and b mod c <= b = count <= 2^31, or a, c < count <= 2^31).
  const auto scaled = [](std::int64_t a, std::int64_t b, std::int64_t c) {
    return a * (b / c) + (a * (b % c)) / c;
  };
  // Block index a: block start origin + M a. Need origin + M a - M >= lo and
  // origin + M a + M - 1 <= hi.
  const std::int64_t a_min = (lo - origin + modulus + modulus - 1) / modulus;
  const std::int64_t a_max_num = hi - origin - modulus + 1;
  const std::int64_t a_max = a_max_num >= 0 ? a_max_num / modulus : -1;
  phasekv::detail::check_arg(a_max >= a_min + 1, where, "hi", hi,
                             "the range [lo, hi] must span at least 3 * modulus positions");
  const std::int64_t blocks = a_max - a_min + 1;
  TargetPlan plan;
  plan.modulus = modulus;
  plan.positions.assign(static_cast<std::size_t>(modulus), {});
  for (std::int64_t r = 0; r < modulus; ++r) {
    const std::int64_t shifted = count * r / modulus;  // how many targets move down by M
    std::vector<std::int64_t>& g = plan.positions[static_cast<std::size_t>(r)];
    g.reserve(static_cast<std::size_t>(count));
    std::vector<char> down(static_cast<std::size_t>(count), 0);
    for (std::int64_t i = 0; i < shifted; ++i) {
      // evenly spread indices, centred in their slots
      const std::int64_t k = scaled(2 * i + 1, count, 2 * shifted);
      down[static_cast<std::size_t>(k)] = 1;
    }
    for (std::int64_t k = 0; k < count; ++k) {
      const std::int64_t a = a_min + (count > 1 ? scaled(k, blocks - 1, count - 1) : 0);
      std::int64_t p = origin + modulus * a + r;
      if (down[static_cast<std::size_t>(k)]) p -= modulus;
      g.push_back(p);
    }
  }
  for (const auto& g : plan.positions) {
    double m = 0.0;
    for (std::int64_t p : g) m += static_cast<double>(p);
    m /= static_cast<double>(g.size());
    double v = 0.0;
    for (std::int64_t p : g) v += (static_cast<double>(p) - m) * (static_cast<double>(p) - m);
    plan.mean.push_back(m);
    plan.variance.push_back(v / static_cast<double>(g.size()));
  }
  phasekv::detail::check_arg(plan.variance_spread() <= max_variance_spread, where, "count", count,
                             "target variances differ too much across groups; use more "
                             "targets per group or a wider [lo, hi]");
  return plan;
}

/// How the position of the target is set in a prompt.
enum class Padding {
  prefix,       ///< a filler at the very start shifts the whole document.
  in_sequence,  ///< a filler right before the target record shifts only the target and after.
};

/// One span of a planned prompt.
struct PromptSegment {
  std::string kind;                ///< "filler", "records", "target" or "query".
  std::int64_t start = 0;          ///< First position.
  std::int64_t length = 0;         ///< Number of tokens.
  std::int64_t first_record = -1;  ///< Index of the first record ("records", "target").
  std::int64_t records = 0;        ///< Number of records in the span ("records": >= 1,
                                   ///< "target": 1, otherwise 0).
};

/// Layout of a prompt with its target record starting at `target` and the query at
/// `query_position`: records of `record_length` tokens packed back to back (as many as fit
/// before the query); `padding` decides where the filler of `target mod record_length` tokens
/// goes (at the start, or right before the target record); a trailing filler reaches the
/// query. Record i (0-based) precedes the target when `i < target / record_length`; runs of
/// records are merged into one "records" span. Throws phasekv::invalid_argument when the
/// target record does not end before the query.
inline std::vector<PromptSegment> layout_prompt(std::int64_t target, std::int64_t query_position,
                                                std::int64_t record_length, Padding padding) {
  const char* where = "phasekv::eval::layout_prompt";
  phasekv::detail::check_arg(record_length >= 1, where, "record_length", record_length,
                             "must be >= 1");
  phasekv::detail::check_arg(
      target >= 0 && target <= query_position && record_length <= query_position - target, where,
      "target", target, "must be >= 0 and its record must end before the query");
  const std::int64_t pad = target % record_length;
  const std::int64_t before = target / record_length;
  const std::int64_t total = (query_position - pad) / record_length;  // records that fit
  std::vector<PromptSegment> segs;
  std::int64_t pos = 0;
  auto push = [&](const char* kind, std::int64_t len, std::int64_t first, std::int64_t recs) {
    if (len <= 0) return;
    segs.push_back({kind, pos, len, first, recs});
    pos += len;
  };
  if (padding == Padding::prefix) push("filler", pad, -1, 0);
  push("records", before * record_length, 0, before);
  if (padding == Padding::in_sequence) push("filler", pad, -1, 0);
  push("target", record_length, before, 1);
  push("records", (total - before - 1) * record_length, before + 1, total - before - 1);
  push("filler", query_position - pos, -1, 0);
  push("query", 1, -1, 0);
  return segs;
}

}  // namespace eval
PHASEKV_NAMESPACE_END
