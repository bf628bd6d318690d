/// @file
/// @brief Per-KV-head origins (staggered windows): one window W and stride S for every KV
/// head and an origin O_h per head, given as a `std::vector<std::int64_t>` (empty: every head
/// at the geometry's origin). KV head h follows every rule of `Geometry(W, S, O_h)`; the cache,
/// compress_batch, the kernels and the serving plans take the origins as data.
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
/// `<name>.size()` (wrong count) or `<name>[h]` (a bad origin) and the value.
inline void check_origins(const char* where, const std::vector<std::int64_t>& origins,
                          std::int64_t kv_heads, const char* name = "origins") {
  const std::string req =
      "must equal kv_heads = " + std::to_string(kv_heads) + " (one per KV head)";
  detail::check_arg(static_cast<std::int64_t>(origins.size()) == kv_heads, where,
                    (std::string(name) + ".size()").c_str(),
                    static_cast<std::int64_t>(origins.size()), req.c_str());
  for (std::size_t h = 0; h < origins.size(); ++h) {
    const std::string n = std::string(name) + "[" + std::to_string(h) + "]";
    detail::check_arg(origins[h] >= 0 && origins[h] <= kMaxGeometryExtent, where, n.c_str(),
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

/// A run of consecutive KV heads with one origin: heads `[head, head + count)`.
struct OriginRun {
  std::int64_t head = 0;    ///< First KV head of the run.
  std::int64_t count = 0;   ///< KV heads in the run (>= 1).
  std::int64_t origin = 0;  ///< Their origin.
};

/// The origins of `kv_heads` KV heads under geometry `g`: `origins` itself, or `kv_heads`
/// copies of `g.origin()` when `origins` is empty (the uniform case). Throws
/// phasekv::invalid_argument from `where` as check_origins does, and naming
/// `<name>.geometry().origin()` when both `origins` and a non-zero `g.origin()` are given
/// (`origins[h]` is head h's origin; a second origin on top of it would be ambiguous).
inline std::vector<std::int64_t> resolve_origins(const char* where, const Geometry& g,
                                                 const std::vector<std::int64_t>& origins,
                                                 std::int64_t kv_heads,
                                                 const char* name = "policy") {
  if (origins.empty())
    return std::vector<std::int64_t>(static_cast<std::size_t>(kv_heads < 0 ? 0 : kv_heads),
                                     g.origin());
  const std::string n = std::string(name) + ".geometry().origin()";
  detail::check_arg(g.origin() == 0, where, n.c_str(), g.origin(),
                    "must be 0 with per-head origins (origins[h] is head h's origin)");
  check_origins(where, origins, kv_heads);
  return origins;
}

/// The maximal runs of consecutive KV heads with equal origins: one run when every head has
/// the same origin.
inline std::vector<OriginRun> origin_runs(const std::vector<std::int64_t>& origins) {
  std::vector<OriginRun> runs;
  for (std::size_t h = 0; h < origins.size(); ++h) {
    if (!runs.empty() && runs.back().origin == origins[h]) {
      ++runs.back().count;
    } else {
      runs.push_back({static_cast<std::int64_t>(h), 1, origins[h]});
    }
  }
  return runs;
}

/// True when every origin equals the first (or there are none).
inline bool origins_uniform(const std::vector<std::int64_t>& origins) {
  for (std::int64_t o : origins)
    if (o != origins.front()) return false;
  return true;
}

/// The largest origin (0 for none).
inline std::int64_t max_origin(const std::vector<std::int64_t>& origins) {
  std::int64_t m = 0;
  for (std::int64_t o : origins) m = o > m ? o : m;
  return m;
}

/// Largest J(n) over heads with geometry `g` and the given origins: J(n) of the smallest
/// origin, the entry rows a `[rows, kv_heads, d]` buffer holding every head's entries needs.
inline std::int64_t max_complete_windows(const Geometry& g,
                                         const std::vector<std::int64_t>& origins, std::int64_t n) {
  if (origins.empty()) return g.complete_windows(n);
  std::int64_t lo = origins.front();
  for (std::int64_t o : origins) lo = o < lo ? o : lo;
  return Geometry(g.window(), g.stride(), lo).complete_windows(n);
}

PHASEKV_NAMESPACE_END
