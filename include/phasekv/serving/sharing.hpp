/// @file
/// @brief Read-only page sharing between sequences (prefix caching, beam search, parallel
/// sampling): which pages a sequence may still write, and how many live sequences list each
/// page (the counts AppendPlan checks through PageReaders).
///
/// Sharing rule. Pages may be listed by several sequences for reading at the same index of
/// the same table: raw pages of a common prefix (same tokens at the same positions), and the
/// entry pages of the complete entries of that prefix (entry j depends only on the tokens
/// before its window's end, so it has the same bits in every sequence that shares those
/// tokens). Batch decode and prefill plans accept such batches and give the bits of unshared
/// copies. A page another live sequence lists must not be written: an append plan refuses a
/// step that would (PageReaders), and the engine copies the page first (copy-on-write stays
/// the engine's: writable_from says from which table index a sequence's pages are its own).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/serving/append_touch.hpp"
#include "phasekv/serving/paged.hpp"
#include "phasekv/serving/paged_check.hpp"

PHASEKV_NAMESPACE_BEGIN

/// For one sequence: the first index of its raw table and of its entry table from which every
/// page it uses is listed by no other sequence (it may write those; a page below the index
/// that a step would write must be copied first). `raw` = the raw pages it uses when all of
/// them are shared (likewise `entries`).
struct WritableFrom {
  std::int64_t raw = 0;      ///< First raw table index of pages only this sequence lists.
  std::int64_t entries = 0;  ///< First entry table index of pages only this sequence lists.
};

/// Counts, for every page of `live`'s pools, the sequences of `live` (every live sequence of
/// the engine, validated by a decode or prefill plan or check_paged_kv with shared reads) that
/// list it among the pages they use: `raw_readers[raw_pool.pages]` and, for compressed rules,
/// `entry_readers[entry_pool.pages]` (may be the same array when both are one pool; then a
/// page counts once per sequence and table). Zeroes them first. O(pool pages + used pages).
template <class T>
void count_page_readers(const PagedKV<T>& live, std::int32_t* raw_readers,
                        std::int32_t* entry_readers) {
  const char* where = "phasekv::count_page_readers";
  detail::check_arg(raw_readers != nullptr, where, "raw_readers", "null",
                    "must point to raw_pool.pages counts");
  detail::check_arg(!live.uses_entries() || entry_readers != nullptr, where, "entry_readers",
                    "null", "must point to entry_pool.pages counts");
  detail::check_paged_kv_fields(live, live.raw_pool.heads, live.raw_pool.d_k, live.raw_pool.d_v,
                                where, "live.");
  check_paged_tables(live, where, "live.", false);  // every listed page in range
  std::fill(raw_readers, raw_readers + live.raw_pool.pages, 0);
  if (live.uses_entries()) std::fill(entry_readers, entry_readers + live.entry_pool.pages, 0);
  for (std::int64_t b = 0; b < live.batch; ++b) {
    const std::int64_t rp = pages_for(live.raw_slots_used(b), live.raw_pool.page_size);
    for (std::int64_t i = 0; i < rp; ++i) ++raw_readers[live.raw_table.page(b, i)];
    if (!live.uses_entries()) continue;
    const std::int64_t ep = pages_for(live.entry_slots_used(b), live.entry_pool.page_size);
    for (std::int64_t i = 0; i < ep; ++i) ++entry_readers[live.entry_table.page(b, i)];
  }
}

/// For sequence `b` of `live` (every live sequence): from which raw and entry table index its
/// pages are listed by no other sequence of `live` (see WritableFrom). Throws
/// phasekv::invalid_argument naming `b` when out of range. O(used pages log used pages).
template <class T>
WritableFrom writable_from(const PagedKV<T>& live, std::int64_t b) {
  const char* where = "phasekv::writable_from";
  detail::check_arg(b >= 0 && b < live.batch, where, "b", b, "must be in [0, live.batch)");
  detail::check_paged_kv_fields(live, live.raw_pool.heads, live.raw_pool.d_k, live.raw_pool.d_v,
                                where, "live.");
  check_paged_tables(live, where, "live.", false);
  const bool entries = live.uses_entries();
  const bool one_pool =
      entries && detail::pool_bytes(live.raw_pool) == detail::pool_bytes(live.entry_pool);
  // the pages the other sequences list, per pool (group 1: a separate entry pool)
  std::vector<std::int64_t> other[2];
  for (std::int64_t c = 0; c < live.batch; ++c) {
    if (c == b) continue;
    const std::int64_t rp = pages_for(live.raw_slots_used(c), live.raw_pool.page_size);
    for (std::int64_t i = 0; i < rp; ++i) other[0].push_back(live.raw_table.page(c, i));
    if (!entries) continue;
    const std::int64_t ep = pages_for(live.entry_slots_used(c), live.entry_pool.page_size);
    for (std::int64_t i = 0; i < ep; ++i)
      other[one_pool ? 0 : 1].push_back(live.entry_table.page(c, i));
  }
  for (auto& o : other) std::sort(o.begin(), o.end());
  const auto first_own = [&](const BlockTable& t, std::int64_t pages,
                             const std::vector<std::int64_t>& o) {
    std::int64_t k = pages;  // past the last shared page
    while (k > 0 && !std::binary_search(o.begin(), o.end(), t.page(b, k - 1))) --k;
    return k;
  };
  WritableFrom w;
  w.raw = first_own(live.raw_table, pages_for(live.raw_slots_used(b), live.raw_pool.page_size),
                    other[0]);
  if (entries)
    w.entries =
        first_own(live.entry_table, pages_for(live.entry_slots_used(b), live.entry_pool.page_size),
                  other[one_pool ? 0 : 1]);
  return w;
}

PHASEKV_NAMESPACE_END
