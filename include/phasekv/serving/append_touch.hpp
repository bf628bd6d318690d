/// @file
/// @brief The pages one append step touches, and their checks (AppendPlan's validation):
/// raw pages read by the windows that began before the append, raw pages the new tokens land
/// in, entry pages the new entries land in; each in range, no written page used by another
/// table slot of the step (by memory range), none listed by another live sequence (reader
/// counts). O(sequences + touched pages), whatever the pool's size or the sequences' lengths.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/serving/paged.hpp"
#include "phasekv/serving/paged_check.hpp"

PHASEKV_NAMESPACE_BEGIN

/// How many live sequences list each page, as the engine keeps it (vLLM's block reference
/// counts; count_page_readers computes them from the tables): `raw[p]` for page p of the raw
/// pool, `entry[p]` for page p of the entry pool (the same array when both are one pool).
/// Either may be null (not checked). A step may not write a page whose count is above 1.
struct PageReaders {
  const std::int32_t* raw = nullptr;    ///< `[raw_pool.pages]` readers per raw page, or null.
  const std::int32_t* entry = nullptr;  ///< `[entry_pool.pages]` readers per entry page, or null.
};

namespace detail {

/// A table entry an append step touches: page `page` at index `index` of table `table` (0 raw,
/// 1 entries) of sequence `b`; `write`: the step writes it (else it only reads it).
struct AppendTouch {
  std::int64_t b = 0, index = 0, page = 0;
  int table = 0;
  bool write = false;
};

/// Throws about touched entry `t` ("`table` sequence b index i") with `value`.
template <class V>
[[noreturn]] void throw_touch(const char* where, const AppendTouch& t, V value, const char* req) {
  const std::string n = std::string(t.table == 0 ? "raw_table" : "entry_table") + " sequence " +
                        std::to_string(t.b) + " index " + std::to_string(t.index);
  throw_arg(where, n.c_str(), value, req);
}

/// Throws phasekv::capacity_error when sequence `b` of `t` lists fewer than `need` pages (or
/// lists them through null indices). Allocates only to throw.
inline void check_append_capacity(const BlockTable& t, std::int64_t b, std::int64_t need,
                                  const char* where, const char* table) {
  if (need == 0 || (t.count(b) >= need && t.indices != nullptr)) return;
  const std::string name = std::string(table) + " pages of sequence " + std::to_string(b);
  const std::string req = "the sequence needs " + std::to_string(need) + " pages after the append";
  throw_arg<capacity_error>(where, name.c_str(), t.indices == nullptr ? 0 : t.count(b),
                            req.c_str());
}

/// The touched table entries of a step and the pages each sequence needs after it.
struct AppendTouches {
  std::vector<AppendTouch> touched;  ///< In sequence order, then (table, index).
  std::vector<std::int64_t> need;    ///< `[2 * batch]`: raw and entry pages after the step.

  /// Collects them for `kv` (the storage after the append: lengths after it, validated by
  /// check_paged_kv_fields) and `before` (the lengths before it); checks every table's
  /// capacity and every touched page index.
  template <class T>
  void collect(const PagedKV<T>& kv, const std::int64_t* before, const char* where) {
    touched.clear();
    need.assign(static_cast<std::size_t>(2 * kv.batch), 0);
    const bool comp = kv.rule.is_compressed();
    const std::int64_t rp = kv.raw_pool.page_size, ep = kv.entry_pool.page_size;
    const std::int64_t ro = kv.ring_origin(), R = kv.ring_slots;
    std::vector<AppendTouch> one;
    for (std::int64_t b = 0; b < kv.batch; ++b) {
      const std::size_t bs = static_cast<std::size_t>(b);
      need[2 * bs] = pages_for(kv.raw_slots_used(b), rp);
      need[2 * bs + 1] = comp ? pages_for(kv.entry_slots_used(b), ep) : 0;
      check_append_capacity(kv.raw_table, b, need[2 * bs], where, "raw_table");
      if (comp) check_append_capacity(kv.entry_table, b, need[2 * bs + 1], where, "entry_table");
      const std::int64_t n0 = before[b], n1 = kv.lengths[b];
      if (n1 <= n0) continue;
      one.clear();
      const auto add = [&](int table, std::int64_t index, bool write) {
        if (!one.empty() && one.back().table == table && one.back().index == index) {
          one.back().write = one.back().write || write;
          return;
        }
        AppendTouch t;
        t.b = b, t.index = index, t.table = table, t.write = write;
        one.push_back(t);
      };
      const auto raw_range = [&](std::int64_t lo, std::int64_t hi, bool write) {
        if (R == 0 || hi <= ro) {  // slots = positions: whole pages
          for (std::int64_t i = lo / rp; lo < hi && i <= (hi - 1) / rp; ++i) add(0, i, write);
          return;
        }
        for (std::int64_t p = lo; p < hi; ++p)  // at most R positions
          add(0, PagedKV<T>::raw_slot(p, ro, R) / rp, write);
      };
      // the windows of each origin (one, or every run of per-head origins)
      for (std::int64_t h = 0; comp && h < kv.raw_pool.heads; ++h) {
        if (h > 0 && (kv.origins == nullptr || kv.origins[h] == kv.origins[h - 1])) continue;
        const Geometry g = kv.head_rule(h).geometry();
        const std::int64_t j0 = g.complete_windows(n0), j1 = g.complete_windows(n1);
        const std::int64_t jn = first_new_window(g, n0, n1);
        if (jn > j0) raw_range(g.window_begin(j0), n0, false);  // windows begun before
        for (std::int64_t i = j0 / ep; j1 > j0 && i <= (j1 - 1) / ep; ++i) add(1, i, true);
      }
      const LandingRanges land = raw_landing(n0, n1, ro, R);
      for (int k = 0; k < 2; ++k)
        if (land.lo[k] < land.hi[k]) raw_range(land.lo[k], land.hi[k], true);
      std::sort(one.begin(), one.end(), [](const AppendTouch& x, const AppendTouch& y) {
        return x.table != y.table ? x.table < y.table : x.index < y.index;
      });
      for (std::size_t k = 0; k < one.size(); ++k) {
        AppendTouch t = one[k];
        for (; k + 1 < one.size() && one[k + 1].table == t.table && one[k + 1].index == t.index;
             ++k)
          t.write = t.write || one[k + 1].write;
        const BlockTable& tb = t.table == 0 ? kv.raw_table : kv.entry_table;
        const std::int64_t pages = t.table == 0 ? kv.raw_pool.pages : kv.entry_pool.pages;
        t.page = tb.page(b, t.index);
        if (t.page < 0 || t.page >= pages) {
          const std::string req = "page index must be in [0, " + std::to_string(pages) + ")";
          throw_touch(where, t, t.page, req.c_str());
        }
        touched.push_back(t);
      }
    }
  }

  /// No written page is used by another table slot of the step (by page index when the
  /// pools' pages are disjoint, else by memory range) or, with `readers`, listed by another
  /// live sequence.
  template <class T>
  void check(const PagePool<T>& raw_pool, const PagePool<T>& entry_pool, bool entries,
             const PageReaders& readers, const char* where) const {
    const PoolBytes rb = pool_bytes(raw_pool);
    const PoolBytes eb = entries ? pool_bytes(entry_pool) : rb;
    const PoolOverlap ov = PoolOverlap::of(rb, eb, entries);
    std::vector<PageUse> uses;
    uses.reserve(2 * touched.size());
    for (const AppendTouch& t : touched) {
      if (ov.by_index)
        uses.push_back(index_use(t.table == 1 && !ov.one_pool ? 1 : 0, t.page, t.b, t.index,
                                 t.table, t.write));
      else
        push_page_uses(uses, t.table == 0 ? raw_pool : entry_pool, t.page, t.b, t.index, t.table,
                       t.write);
    }
    const std::string names[2] = {"raw_table", "entry_table"};
    check_page_uses(uses, where, names);
    for (const AppendTouch& t : touched) {
      const std::int32_t* r = t.table == 0 ? readers.raw : readers.entry;
      if (!t.write || r == nullptr || r[t.page] <= 1) continue;
      const std::string req = "is written by this step but listed by " + std::to_string(r[t.page]) +
                              " live sequences (PageReaders): copy it first (writable_from)";
      throw_touch(where, t, t.page, req.c_str());
    }
  }
};

}  // namespace detail
PHASEKV_NAMESPACE_END
