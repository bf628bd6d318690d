/// @file
/// @brief The checks of paged storage, one path for every paged call: the walk of the block
/// tables (each sequence lists the pages its slots need, each a page of its pool), the check
/// that no two used pages share memory (by address range, whatever the pool descriptors say;
/// pages of a common prefix may be shared by calls that only read), check_paged_kv; and, from
/// serving/plan_record.hpp, PlanRecord: what a plan was made for, recorded by the plan and
/// compared field by field by every run.
///
/// Every function here works on any paged batch type `KV` with the members of PagedKV:
/// `raw_pool`, `raw_table`, `entry_pool`, `entry_table`, `lengths`, `batch`, `ring_slots`,
/// `raw_slots_used(b)`, `entry_slots_used(b)`, `uses_entries()` and `visit_rule(f)` (the
/// rule's fields as `f(name, index, value)`), as PagedKV has them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/phase/origins.hpp"
#include "phasekv/serving/paged.hpp"
#include "phasekv/serving/plan_record.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace detail {

/// Checks that sequence `b` of table `t` lists the pages of its `slots` slots (pages of
/// `page_size` slots) and that each of them is a page of a pool of `pool_pages` pages. Throws
/// phasekv::capacity_error ("`table` pages of sequence b") or phasekv::invalid_argument
/// ("`table` sequence b index i"), with `unit` naming what a slot holds.
inline void check_table_pages(const BlockTable& t, std::int64_t pool_pages, std::int64_t page_size,
                              std::int64_t b, std::int64_t slots, const char* where,
                              const std::string& table, const char* unit = "slots") {
  const std::int64_t need = pages_for(slots, page_size);
  const std::int64_t have = t.count(b);
  if (have < need) {
    const std::string name = table + " pages of sequence " + std::to_string(b);
    const std::string req = "the sequence needs " + std::to_string(need) + " pages (" +
                            std::to_string(slots) + " " + unit + ")";
    throw_arg<capacity_error>(where, name.c_str(), have, req.c_str());
  }
  for (std::int64_t i = 0; i < need; ++i) {
    const std::int64_t page = t.page(b, i);
    if (page < 0 || page >= pool_pages) {
      const std::string name =
          table + " sequence " + std::to_string(b) + " index " + std::to_string(i);
      const std::string req = "page index must be in [0, " + std::to_string(pool_pages) + ")";
      throw_arg(where, name.c_str(), page, req.c_str());
    }
  }
}

/// The memory of one used page: bytes `[lo, hi)` of its keys or of its values, listed at
/// `index` of table `table` (0 raw, 1 entries) of sequence `b`; `write`: the call writes it
/// (false: only reads it).
struct PageUse {
  std::uintptr_t lo = 0, hi = 0;
  std::int64_t b = 0, index = 0, page = 0;
  int table = 0;
  bool write = true;
  bool same_slot(const PageUse& o) const {
    return b == o.b && table == o.table && index == o.index;
  }
};

/// Appends the key and value byte ranges of page `page` of `pool` (one range when the values
/// alias the keys, as latent K = V pools do); `write`: the call writes the page.
template <class T>
void push_page_uses(std::vector<PageUse>& v, const PagePool<T>& pool, std::int64_t page,
                    std::int64_t b, std::int64_t index, int table, bool write = true) {
  const auto span = [&](std::int64_t slot_stride, std::int64_t head_stride, std::int64_t d) {
    return static_cast<std::uintptr_t>(
        ((pool.page_size - 1) * slot_stride + (pool.heads - 1) * head_stride + d) *
        static_cast<std::int64_t>(sizeof(T)));
  };
  PageUse u;
  u.b = b, u.index = index, u.page = page, u.table = table, u.write = write;
  u.lo = reinterpret_cast<std::uintptr_t>(pool.keys + page * pool.key_page_stride);
  u.hi = u.lo + span(pool.key_slot_stride(), pool.key_head_stride(), pool.d_k);
  v.push_back(u);
  const auto vlo = reinterpret_cast<std::uintptr_t>(pool.values + page * pool.value_page_stride);
  const auto vhi = vlo + span(pool.value_slot_stride(), pool.value_head_stride(), pool.d_v);
  if (vlo == u.lo && vhi == u.hi) return;
  u.lo = vlo, u.hi = vhi;
  v.push_back(u);
}

/// The earlier range reaching furthest, and the one reaching furthest of another slot than it,
/// among the ranges a sweep in address order has passed.
struct ReachTracker {
  const PageUse* best = nullptr;
  const PageUse* second = nullptr;
  /// An earlier range of another slot than `u` that overlaps it, or null.
  const PageUse* clash(const PageUse& u) const {
    if (best != nullptr && !best->same_slot(u) && u.lo < best->hi) return best;
    if (best != nullptr && best->same_slot(u) && second != nullptr && u.lo < second->hi)
      return second;
    return nullptr;
  }
  void add(const PageUse& u) {
    if (best == nullptr || u.hi > best->hi) {
      if (best != nullptr && !best->same_slot(u)) second = best;
      best = &u;
    } else if (!best->same_slot(u) && (second == nullptr || u.hi > second->hi)) {
      second = &u;
    }
  }
};

/// Throws phasekv::invalid_argument when two of `uses` from different table slots share a byte
/// and at least one of them is written (sorted by address; O(n log n)), naming both:
/// `names[table]` sequence b index i.
inline void check_page_uses(std::vector<PageUse>& uses, const char* where,
                            const std::string* names) {
  std::sort(uses.begin(), uses.end(), [](const PageUse& x, const PageUse& y) {
    if (x.lo != y.lo) return x.lo < y.lo;
    if (x.hi != y.hi) return x.hi < y.hi;
    if (x.b != y.b) return x.b < y.b;  // ties in table order: the later one is named first
    return x.table != y.table ? x.table < y.table : x.index < y.index;
  });
  ReachTracker any, written;  // a written range clashes with any, a read one with a written
  for (const PageUse& u : uses) {
    const PageUse* clash = u.write ? any.clash(u) : written.clash(u);
    if (clash != nullptr) {
      const auto slot = [&](const PageUse& x) {
        return names[x.table] + " sequence " + std::to_string(x.b) + " index " +
               std::to_string(x.index);
      };
      const std::string req = "its memory overlaps that of page " + std::to_string(clash->page) +
                              " at " + slot(*clash) +
                              " (a page written by a call may be used once, by one sequence)";
      throw_arg(where, slot(u).c_str(), u.page, req.c_str());
    }
    any.add(u);
    if (u.write) written.add(u);
  }
}

/// Where a pool's pages lie, in bytes: keys and values of page 0, page strides, the span of one
/// page's keys and of its values.
struct PoolBytes {
  std::uintptr_t k0 = 0, v0 = 0;
  std::int64_t kps = 0, vps = 0, ks = 0, vs = 0, pages = 0;

  bool operator==(const PoolBytes& o) const {
    return k0 == o.k0 && v0 == o.v0 && kps == o.kps && vps == o.vps && ks == o.ks && vs == o.vs &&
           pages == o.pages;
  }
  /// First byte of the pool.
  std::uintptr_t lo() const { return k0 < v0 ? k0 : v0; }
  /// One past the last byte of the pool.
  std::uintptr_t hi() const {
    const std::uintptr_t k = k0 + static_cast<std::uintptr_t>((pages - 1) * kps + ks);
    const std::uintptr_t v = v0 + static_cast<std::uintptr_t>((pages - 1) * vps + vs);
    return k > v ? k : v;
  }
  /// Whether two different pages never share a byte, so that memory shared inside the pool is
  /// a page index used twice: every page's keys and values fit in their strides, and the keys
  /// and values either lie apart, alias each other (K = V), or share one stride without
  /// crossing (one pool of [K|V] pages).
  bool pages_disjoint() const {
    if (pages <= 1) return true;
    if (ks > kps || vs > vps) return false;
    const std::uintptr_t kend = k0 + static_cast<std::uintptr_t>((pages - 1) * kps + ks);
    const std::uintptr_t vend = v0 + static_cast<std::uintptr_t>((pages - 1) * vps + vs);
    if (kend <= v0 || vend <= k0) return true;
    if (kps != vps) return false;
    if (k0 == v0) return ks == vs;
    const std::int64_t d = static_cast<std::int64_t>(v0 - k0);  // two's complement distance
    return (d >= ks && d + vs <= kps) || (-d >= vs && -d + ks <= kps);
  }
};

/// The byte layout of `pool`.
template <class T>
PoolBytes pool_bytes(const PagePool<T>& pool) {
  const std::int64_t e = static_cast<std::int64_t>(sizeof(T));
  PoolBytes r;
  r.k0 = reinterpret_cast<std::uintptr_t>(pool.keys);
  r.v0 = reinterpret_cast<std::uintptr_t>(pool.values);
  r.kps = pool.key_page_stride * e;
  r.vps = pool.value_page_stride * e;
  r.ks = ((pool.page_size - 1) * pool.key_slot_stride() +
          (pool.heads - 1) * pool.key_head_stride() + pool.d_k) *
         e;
  r.vs = ((pool.page_size - 1) * pool.value_slot_stride() +
          (pool.heads - 1) * pool.value_head_stride() + pool.d_v) *
         e;
  r.pages = pool.pages;
  return r;
}

/// How the pages of a raw pool and an entry pool (`entries`: the entry pool is used) may share
/// memory: `by_index` when two different pages never share a byte (each pool's pages are
/// disjoint, and the pools are one pool or lie apart), so that a page index used twice is the
/// only overlap; `one_pool` when both describe the same memory the same way.
struct PoolOverlap {
  bool one_pool = false, by_index = false;

  static PoolOverlap of(const PoolBytes& rb, const PoolBytes& eb, bool entries) {
    PoolOverlap o;
    o.one_pool = entries && rb == eb;
    const bool apart =
        !entries || rb.pages == 0 || eb.pages == 0 || rb.hi() <= eb.lo() || eb.hi() <= rb.lo();
    o.by_index = rb.pages_disjoint() && (!entries || eb.pages_disjoint()) && (o.one_pool || apart);
    return o;
  }
  bool operator==(const PoolOverlap& x) const {
    return one_pool == x.one_pool && by_index == x.by_index;
  }
};

/// A page use for the by-index overlap check: pages of one pool (`group` 0: the raw pool, or
/// the one pool; 1: the entry pool) as a one-byte range at their index.
inline PageUse index_use(int group, std::int64_t page, std::int64_t b, std::int64_t index,
                         int table, bool write) {
  PageUse u;
  u.b = b, u.index = index, u.page = page, u.table = table, u.write = write;
  u.lo = (static_cast<std::uintptr_t>(group) << 40) + static_cast<std::uintptr_t>(page);
  u.hi = u.lo + 1;
  return u;
}

/// Read-only sharing: keeps one of the uses that read the same memory through the same table
/// at the same index (a page of a common prefix listed by several sequences), so that
/// check_page_uses refuses only other overlaps.
inline void drop_shared_reads(std::vector<PageUse>& uses) {
  std::sort(uses.begin(), uses.end(), [](const PageUse& x, const PageUse& y) {
    if (x.lo != y.lo) return x.lo < y.lo;
    if (x.hi != y.hi) return x.hi < y.hi;
    if (x.table != y.table) return x.table < y.table;
    if (x.index != y.index) return x.index < y.index;
    return x.b < y.b;
  });
  uses.erase(std::unique(uses.begin(), uses.end(),
                         [](const PageUse& x, const PageUse& y) {
                           return !x.write && !y.write && x.lo == y.lo && x.hi == y.hi &&
                                  x.table == y.table && x.index == y.index;
                         }),
             uses.end());
}

/// Checks that a run's head shape (`q_heads`, `kv_heads`, `d_k`, `d_v` of `args`) equals the
/// planned one, `shape`; throws phasekv::shape_error naming the field that differs.
template <class Args>
void check_planned_heads(const Args& args, const std::int64_t* shape, const char* where) {
  static const char* const names[4] = {"q_heads", "kv_heads", "d_k", "d_v"};
  const std::int64_t now[4] = {args.q_heads, args.kv_heads, args.d_k, args.d_v};
  for (int i = 0; i < 4; ++i)
    if (now[i] != shape[i]) {
      const std::string req =
          "must equal the planned " + std::to_string(shape[i]) + " (plan again)";
      throw_arg<shape_error>(where, names[i], now[i], req.c_str());
    }
}

}  // namespace detail

/// Walks the block tables of `kv` (any paged batch type, see the file comment): every sequence
/// lists the pages of the slots it uses (raw_slots_used, entry_slots_used), each a page of its
/// pool; with `check_overlap`, no two used pages share a byte of memory (raw and entry pages
/// together, by address range: pools described twice over the same memory, or with an offset,
/// are caught; pools whose pages are disjoint in memory, the usual case, by their page indices).
/// With `shared_reads` (calls that only read the pages: batch decode and prefill), one page
/// may be listed by several sequences at the same index of the same table (the raw pages of a
/// common prefix, the entry pages of its complete entries); every other double use is still
/// refused. Table names in the messages are `prefix` + "raw_table" / "entry_table".
/// O(sequences + used pages log used pages) time, O(used pages) memory.
template <class KV>
void check_paged_tables(const KV& kv, const char* where, const char* prefix, bool check_overlap,
                        bool shared_reads = false) {
  const std::string names[2] = {std::string(prefix) + "raw_table",
                                std::string(prefix) + "entry_table"};
  const bool entries = kv.uses_entries();
  const detail::PoolBytes rb = detail::pool_bytes(kv.raw_pool);
  const detail::PoolBytes eb = entries ? detail::pool_bytes(kv.entry_pool) : rb;
  const detail::PoolOverlap ov = detail::PoolOverlap::of(rb, eb, entries);
  const bool one_pool = ov.one_pool, by_index = ov.by_index;
  // by index: (page, table, index) of each pool (of the one pool), sorted; a page listed twice
  // is a clash unless both are the same table and index and `shared_reads`
  std::vector<detail::PageUse> uses;
  std::vector<std::uint64_t> idx[2];
  const auto key = [](std::int64_t page, int table, std::int64_t index) {
    return (static_cast<std::uint64_t>(page) << 32) | (static_cast<std::uint64_t>(table) << 31) |
           static_cast<std::uint64_t>(index);
  };
  if (check_overlap && by_index) {
    std::size_t n[2] = {0, 0};
    // at most what the tables list (a length beyond its table is refused below, by name)
    const auto listed = [&](const BlockTable& t, std::int64_t b, std::int64_t pages) {
      const std::int64_t c = t.count(b);
      return static_cast<std::size_t>(pages < c ? pages : (c > 0 ? c : 0));
    };
    for (std::int64_t b = 0; b < kv.batch; ++b) {
      n[0] +=
          listed(kv.raw_table, b, detail::pages_for(kv.raw_slots_used(b), kv.raw_pool.page_size));
      if (entries)
        n[one_pool ? 0 : 1] += listed(
            kv.entry_table, b, detail::pages_for(kv.entry_slots_used(b), kv.entry_pool.page_size));
    }
    idx[0].reserve(n[0]);
    idx[1].reserve(n[1]);
  }
  for (std::int64_t b = 0; b < kv.batch; ++b) {
    const std::int64_t rs = kv.raw_slots_used(b), es = entries ? kv.entry_slots_used(b) : 0;
    detail::check_table_pages(kv.raw_table, kv.raw_pool.pages, kv.raw_pool.page_size, b, rs, where,
                              names[0]);
    if (entries)
      detail::check_table_pages(kv.entry_table, kv.entry_pool.pages, kv.entry_pool.page_size, b, es,
                                where, names[1]);
    if (!check_overlap) continue;
    const std::int64_t rp = detail::pages_for(rs, kv.raw_pool.page_size);
    const std::int64_t ep = detail::pages_for(es, kv.entry_pool.page_size);
    for (std::int64_t i = 0; i < rp; ++i) {
      if (by_index)
        idx[0].push_back(key(kv.raw_table.page(b, i), 0, i));
      else
        detail::push_page_uses(uses, kv.raw_pool, kv.raw_table.page(b, i), b, i, 0, !shared_reads);
    }
    for (std::int64_t i = 0; i < ep; ++i) {
      if (by_index)
        idx[one_pool ? 0 : 1].push_back(key(kv.entry_table.page(b, i), 1, i));
      else
        detail::push_page_uses(uses, kv.entry_pool, kv.entry_table.page(b, i), b, i, 1,
                               !shared_reads);
    }
  }
  if (!check_overlap) return;
  if (!by_index) {
    if (shared_reads) {
      detail::drop_shared_reads(uses);
      for (detail::PageUse& u : uses) u.write = true;  // any other overlap is refused
    }
    detail::check_page_uses(uses, where, names);
    return;
  }
  for (int g = 0; g < 2; ++g) {
    std::sort(idx[g].begin(), idx[g].end());
    const auto rep =
        std::adjacent_find(idx[g].begin(), idx[g].end(), [&](std::uint64_t x, std::uint64_t y) {
          return (x >> 32) == (y >> 32) && !(shared_reads && x == y);
        });
    if (rep == idx[g].end()) continue;
    // a page listed twice: find its first two places (in table order) to name them
    const std::int64_t page = static_cast<std::int64_t>(*rep >> 32);
    for (std::int64_t b = 0; b < kv.batch && uses.size() < 2; ++b)
      for (int t = 0; t < 2 && uses.size() < 2; ++t) {
        if ((t == 0 && g == 1) || (t == 1 && (!entries || (g == 0 && !one_pool)))) continue;
        const BlockTable& tb = t == 0 ? kv.raw_table : kv.entry_table;
        const std::int64_t np =
            t == 0 ? detail::pages_for(kv.raw_slots_used(b), kv.raw_pool.page_size)
                   : detail::pages_for(kv.entry_slots_used(b), kv.entry_pool.page_size);
        for (std::int64_t i = 0; i < np && uses.size() < 2; ++i) {
          if (tb.page(b, i) != page) continue;
          // a shared read of the first place found is not the clash
          if (shared_reads && !uses.empty() && uses[0].table == t && uses[0].index == i) continue;
          uses.push_back(detail::index_use(0, page, b, i, t, true));
        }
      }
    detail::check_page_uses(uses, where, names);  // two uses of one page: throws
  }
}

namespace detail {

/// check_paged_kv without the walk of the tables: the pools' shapes, the lengths, the ring,
/// the tables' form, the origins. Fields are named `prefix` + field. O(sequences).
template <class T>
void check_paged_kv_fields(const PagedKV<T>& kv, std::int64_t heads, std::int64_t d_k,
                           std::int64_t d_v, const char* where, const char* prefix = "kv.") {
  // plan-time checks: the names are built as they are checked
  const auto nm = [&](const char* field) { return std::string(prefix) + field; };
  detail::check_arg(kv.batch >= 0, where, nm("batch").c_str(), kv.batch, "must be >= 0");
  detail::check_arg(kv.batch == 0 || kv.lengths != nullptr, where, nm("lengths").c_str(), "null",
                    "must point to [batch] lengths");
  const bool comp = kv.rule.is_compressed();
  if (kv.origins != nullptr) {
    detail::check_arg(comp, where, nm("origins").c_str(), "non-null",
                      "needs a compressed rule (uncompressed rules have no windows)");
    detail::check_arg(kv.rule.geometry().origin() == 0, where,
                      nm("rule.geometry().origin()").c_str(), kv.rule.geometry().origin(),
                      "must be 0 with per-head origins (origins[h] is head h's origin)");
    check_origins(where, std::vector<std::int64_t>(kv.origins, kv.origins + heads), heads,
                  nm("origins").c_str());
  }
  check_page_pool(kv.raw_pool, where, nm("raw_pool").c_str());
  if (comp) check_page_pool(kv.entry_pool, where, nm("entry_pool").c_str());
  const auto check_dims = [&](const PagePool<const T>& p, const char* name) {
    detail::check_arg<shape_error>(p.heads == heads, where, (std::string(name) + ".heads").c_str(),
                                   p.heads, "must equal kv_heads");
    detail::check_arg<shape_error>(p.d_k == d_k, where, (std::string(name) + ".d_k").c_str(), p.d_k,
                                   "must equal d_k");
    detail::check_arg<shape_error>(p.d_v == d_v, where, (std::string(name) + ".d_v").c_str(), p.d_v,
                                   "must equal d_v");
  };
  check_dims(kv.raw_pool, nm("raw_pool").c_str());
  if (comp) check_dims(kv.entry_pool, nm("entry_pool").c_str());
  detail::check_arg(kv.ring_slots >= 0, where, nm("ring_slots").c_str(), kv.ring_slots,
                    "must be >= 0");
  if (kv.ring_slots > 0) {
    const std::int64_t need =
        comp ? kv.rule.geometry().ring_capacity(kv.rule.local()) : kv.rule.window();
    detail::check_arg(need > 0, where, nm("ring_slots").c_str(), kv.ring_slots,
                      "a ring needs a compressed or sliding-window rule (causal attention reads "
                      "every token: use 0)");
    const std::string req = "must be 0 or >= " + std::to_string(need) +
                            " (the raw tokens a query can see: max(W, L) or the window)";
    detail::check_arg(kv.ring_slots >= need, where, nm("ring_slots").c_str(), kv.ring_slots,
                      req.c_str());
  }
  const auto check_table = [&](const BlockTable& t, const char* name) {
    detail::check_arg(t.batch == kv.batch, where, (std::string(name) + ".batch").c_str(), t.batch,
                      "must equal kv.batch");
    // a table that lists no page (every sequence needs none) may leave indices null
    const bool lists_pages =
        kv.batch > 0 &&
        (t.indptr != nullptr ? t.indptr[kv.batch] != t.indptr[0] : t.row_stride > 0);
    detail::check_arg(!lists_pages || t.indices != nullptr, where,
                      (std::string(name) + ".indices").c_str(), "null", "must point to the pages");
    if (t.indptr == nullptr)
      detail::check_arg(t.row_stride >= 0, where, (std::string(name) + ".row_stride").c_str(),
                        t.row_stride, "must be >= 0");
  };
  check_table(kv.raw_table, nm("raw_table").c_str());
  if (comp) check_table(kv.entry_table, nm("entry_table").c_str());
  for (std::int64_t b = 0; b < kv.batch; ++b) {
    const std::string name = nm("lengths[") + std::to_string(b) + "]";
    detail::check_arg(kv.lengths[b] >= 0 && kv.lengths[b] <= kMaxLength, where, name.c_str(),
                      kv.lengths[b], "must be in [0, 2^62]");
    if (kv.raw_table.indptr != nullptr)
      detail::check_arg(kv.raw_table.count(b) >= 0, where, nm("raw_table.indptr").c_str(), b,
                        "indptr must not decrease (at this sequence)");
    if (comp && kv.entry_table.indptr != nullptr)
      detail::check_arg(kv.entry_table.count(b) >= 0, where, nm("entry_table.indptr").c_str(), b,
                        "indptr must not decrease (at this sequence)");
  }
}

}  // namespace detail

/// Checks a PagedKV before anything reads or writes through it, for `heads` KV heads and head
/// dims `d_k`, `d_v`: the pools' shapes, every length (>= 0), the ring, every table long enough
/// for the slots its sequence uses (raw_slots_used, entry_slots_used), every page index in
/// range, and, when `check_overlap` is true, that no two used pages share memory
/// (check_paged_tables; `shared_reads`: pages of a common prefix may be listed by several
/// sequences, for calls that only read). Throws phasekv::invalid_argument / shape_error /
/// capacity_error naming the table, the sequence and the index.
template <class T>
void check_paged_kv(const PagedKV<T>& kv, std::int64_t heads, std::int64_t d_k, std::int64_t d_v,
                    const char* where, bool check_overlap = true, bool shared_reads = false) {
  detail::check_paged_kv_fields(kv, heads, d_k, d_v, where);
  check_paged_tables(kv, where, "kv.", check_overlap, shared_reads);
}

PHASEKV_NAMESPACE_END
