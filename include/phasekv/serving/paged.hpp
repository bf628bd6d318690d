/// @file
/// @brief Paged KV storage in the engines' convention: a pool of pages of P slots in caller
/// memory (NHD or HND inside a page, K and V in separate pools or one pool of [K|V] pages),
/// per-sequence block tables (FlashInfer's `indptr`/`indices`, or vLLM's dense
/// `block_table[b][i]`), one table for raw tokens and one for compressed entries (their
/// checks: paged_check.hpp).
///
/// Slot mapping. Entry j of sequence b lives in page `entry_table.page(b, j / P)`, slot
/// `j % P`. Raw position p of sequence b lives at raw slot `raw_slot(p)`, that is in page
/// `raw_table.page(b, raw_slot(p) / P)`, slot `raw_slot(p) % P`, where `raw_slot(p) = p` for an
/// engine that keeps every raw token (`ring_slots` = 0), and for an engine that keeps only a
/// ring of R = `ring_slots` recent tokens: `p` for prefix positions (p < O) and
/// `O + (p - O) mod R` after them (the layout of CompressedCache: prefix, then the ring).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "phasekv/attention/cpu/visibility_rule.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/view.hpp"
#include "phasekv/phase/geometry.hpp"
#include "phasekv/phase/origins.hpp"

PHASEKV_NAMESPACE_BEGIN

/// A pool of KV pages in caller memory. Page `p` holds `page_size` slots of `heads` key
/// vectors (`d_k` elements) and `heads` value vectors (`d_v` elements); inside a page the slots
/// are laid out NHD (`[slot, head, dim]`) or HND (`[head, slot, dim]`). Keys of page p start at
/// `keys + p * key_page_stride`, values at `values + p * value_page_stride`, so separate K and V
/// pools (make_page_pool) and one pool of [K|V] pages (make_kv_page_pool) are both described.
///
/// @tparam T element type (possibly const-qualified).
template <class T>
struct PagePool {
  T* keys = nullptr;                   ///< Keys of page 0.
  T* values = nullptr;                 ///< Values of page 0.
  std::int64_t pages = 0;              ///< Number of pages.
  std::int64_t page_size = 0;          ///< Slots per page (P >= 1).
  std::int64_t heads = 0;              ///< KV heads per slot.
  std::int64_t d_k = 0;                ///< Key head dim.
  std::int64_t d_v = 0;                ///< Value head dim.
  Layout layout = Layout::NHD;         ///< Layout inside a page.
  std::int64_t key_page_stride = 0;    ///< Elements between the keys of consecutive pages.
  std::int64_t value_page_stride = 0;  ///< Elements between the values of consecutive pages.

  /// Elements between consecutive slots of one head's keys.
  PHASEKV_HOST_DEVICE std::int64_t key_slot_stride() const {
    return layout == Layout::NHD ? heads * d_k : d_k;
  }
  /// Elements between consecutive heads of one slot's keys.
  PHASEKV_HOST_DEVICE std::int64_t key_head_stride() const {
    return layout == Layout::NHD ? d_k : page_size * d_k;
  }
  /// Elements between consecutive slots of one head's values.
  PHASEKV_HOST_DEVICE std::int64_t value_slot_stride() const {
    return layout == Layout::NHD ? heads * d_v : d_v;
  }
  /// Elements between consecutive heads of one slot's values.
  PHASEKV_HOST_DEVICE std::int64_t value_head_stride() const {
    return layout == Layout::NHD ? d_v : page_size * d_v;
  }
  /// Key vector of (page, slot, head).
  PHASEKV_HOST_DEVICE T* key(std::int64_t page, std::int64_t slot, std::int64_t head) const {
    return keys + page * key_page_stride + slot * key_slot_stride() + head * key_head_stride();
  }
  /// Value vector of (page, slot, head).
  PHASEKV_HOST_DEVICE T* value(std::int64_t page, std::int64_t slot, std::int64_t head) const {
    return values + page * value_page_stride + slot * value_slot_stride() +
           head * value_head_stride();
  }

  /// Implicit conversion to a pool of const elements.
  template <class U = T, class = std::enable_if_t<!std::is_const<U>::value>>
  PHASEKV_HOST_DEVICE operator PagePool<const U>() const {
    return PagePool<const U>{keys, values, pages,  page_size,       heads,
                             d_k,  d_v,    layout, key_page_stride, value_page_stride};
  }
};

/// Separate K and V pools, each densely packed: `keys` holds `pages * page_size * heads * d_k`
/// elements, `values` `pages * page_size * heads * d_v`.
template <class T>
PagePool<T> make_page_pool(T* keys, T* values, std::int64_t pages, std::int64_t page_size,
                           std::int64_t heads, std::int64_t d_k, std::int64_t d_v,
                           Layout layout = Layout::NHD) {
  return PagePool<T>{keys,
                     values,
                     pages,
                     page_size,
                     heads,
                     d_k,
                     d_v,
                     layout,
                     page_size * heads * d_k,
                     page_size * heads * d_v};
}

/// One pool of [K|V] pages: page p holds its keys (`page_size * heads * d_k` elements) and
/// then its values (`page_size * heads * d_v`), starting at `data + p * page_size * heads *
/// (d_k + d_v)`.
template <class T>
PagePool<T> make_kv_page_pool(T* data, std::int64_t pages, std::int64_t page_size,
                              std::int64_t heads, std::int64_t d_k, std::int64_t d_v,
                              Layout layout = Layout::NHD) {
  const std::int64_t stride = page_size * heads * (d_k + d_v);
  return PagePool<T>{data,   data == nullptr ? nullptr : data + page_size * heads * d_k,
                     pages,  page_size,
                     heads,  d_k,
                     d_v,    layout,
                     stride, stride};
}

/// Checks a pool's shape; throws phasekv::shape_error naming `name` and the field. Builds the
/// field's name only when it throws, so run steps that call it allocate nothing.
template <class T>
void check_page_pool(const PagePool<T>& p, const char* where, const char* name) {
  const auto check = [&](bool ok, const char* f, const auto& value, const char* msg) {
    if (!ok)
      detail::check_arg<shape_error>(false, where, (std::string(name) + "." + f).c_str(), value,
                                     msg);
  };
  check(p.pages >= 0, "pages", p.pages, "must be >= 0");
  check(p.page_size >= 1, "page_size", p.page_size, "must be >= 1");
  check(p.heads >= 1, "heads", p.heads, "must be >= 1");
  check(p.d_k >= 1, "d_k", p.d_k, "must be >= 1");
  check(p.d_v >= 1, "d_v", p.d_v, "must be >= 1");
  check(p.key_page_stride >= 0 && p.value_page_stride >= 0, "key_page_stride", p.key_page_stride,
        "page strides must be >= 0");
  check(p.pages == 0 || (p.keys != nullptr && p.values != nullptr), "keys", "null",
        "keys and values must point to the pages");
}

/// Per-sequence page lists. CSR form (FlashInfer): the pages of sequence b are
/// `indices[indptr[b] .. indptr[b + 1])`. Dense form (vLLM): row b of a
/// `[batch, row_stride]` row-major `block_table`; every entry of the row counts as available,
/// only the first pages the sequence needs are read. Neither form is copied.
struct BlockTable {
  const std::int32_t* indices = nullptr;  ///< Page indices.
  const std::int32_t* indptr = nullptr;   ///< `[batch + 1]` offsets (CSR), or null (dense).
  std::int64_t batch = 0;                 ///< Number of sequences.
  std::int64_t row_stride = 0;            ///< Dense form: entries per row (max blocks).

  /// Index into `indices` of the first page of sequence `b`.
  PHASEKV_HOST_DEVICE std::int64_t begin(std::int64_t b) const {
    return indptr != nullptr ? indptr[b] : b * row_stride;
  }
  /// Pages listed for sequence `b`.
  PHASEKV_HOST_DEVICE std::int64_t count(std::int64_t b) const {
    return indptr != nullptr ? indptr[b + 1] - indptr[b] : row_stride;
  }
  /// Page `i` of sequence `b`.
  PHASEKV_HOST_DEVICE std::int64_t page(std::int64_t b, std::int64_t i) const {
    return indices[begin(b) + i];
  }
};

/// A CSR block table (FlashInfer's `paged_kv_indptr` / `paged_kv_indices`).
inline BlockTable csr_block_table(const std::int32_t* indptr, const std::int32_t* indices,
                                  std::int64_t batch) {
  BlockTable t;
  t.indptr = indptr;
  t.indices = indices;
  t.batch = batch;
  return t;
}

/// A dense block table (vLLM's `block_table`, `[batch, max_blocks]` row-major).
inline BlockTable dense_block_table(const std::int32_t* block_table, std::int64_t batch,
                                    std::int64_t max_blocks) {
  BlockTable t;
  t.indices = block_table;
  t.batch = batch;
  t.row_stride = max_blocks;
  return t;
}

/// FlashInfer's lengths: `lengths[b] = (pages of b - 1) * page_size + last_page_len[b]`, or 0
/// for a sequence without pages. Throws phasekv::invalid_argument naming the sequence when a
/// `last_page_len` is outside `[1, page_size]` (or not 0 for a sequence without pages).
inline void lengths_from_last_page_len(const std::int32_t* indptr,
                                       const std::int32_t* last_page_len, std::int64_t page_size,
                                       std::int64_t batch, std::int64_t* lengths) {
  const char* where = "phasekv::lengths_from_last_page_len";
  detail::check_arg(page_size >= 1, where, "page_size", page_size, "must be >= 1");
  detail::check_arg(batch >= 0, where, "batch", batch, "must be >= 0");
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t pages = indptr[b + 1] - indptr[b];
    const std::int64_t last = last_page_len[b];
    const std::string name = "last_page_len[" + std::to_string(b) + "]";
    detail::check_arg(pages >= 0, where, ("indptr[" + std::to_string(b + 1) + "]").c_str(),
                      indptr[b + 1], "must be >= indptr[b]");
    if (pages == 0) {
      detail::check_arg(last == 0, where, name.c_str(), last,
                        "must be 0 for a sequence without pages");
    } else {
      detail::check_arg(last >= 1 && last <= page_size, where, name.c_str(), last,
                        "must be in [1, page_size]");
    }
  }
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t pages = indptr[b + 1] - indptr[b];
    lengths[b] = pages == 0 ? 0 : (pages - 1) * page_size + last_page_len[b];
  }
}

/// The slots one sequence of `n` tokens occupies: `raw` raw slots and `entries` entry slots.
struct SlotNeeds {
  std::int64_t raw = 0;      ///< Raw slots: n, or min(n, ring_origin + ring_slots) with a ring.
  std::int64_t entries = 0;  ///< Entry slots: J(n) (0 for uncompressed layers).
};

/// The one formula of a sequence's slot needs, for windows of geometry `g` (entries J(n) with
/// g's origin) and raw slots kept from `ring_origin` on in a ring of `ring_slots` (0: every
/// token is kept, `raw` = n). The uniform path passes `ring_origin` = g.origin(); a per-KV-head
/// origin is a geometry per head with the ring's origin passed explicitly.
PHASEKV_HOST_DEVICE inline SlotNeeds slot_needs(const Geometry& g, std::int64_t n,
                                                std::int64_t ring_slots, std::int64_t ring_origin) {
  SlotNeeds s;
  const std::int64_t cap = ring_origin + ring_slots;
  s.raw = (ring_slots == 0 || n < cap) ? n : cap;
  s.entries = g.complete_windows(n);
  return s;
}

/// slot_needs for a layer's visibility rule: compressed rules as above (ring origin O);
/// uncompressed layers (causal, sliding window) keep raw slots only, from position 0.
PHASEKV_HOST_DEVICE inline SlotNeeds slot_needs(const cpu::VisibilityRule& rule, std::int64_t n,
                                                std::int64_t ring_slots) {
  if (rule.is_compressed())
    return slot_needs(rule.geometry(), n, ring_slots, rule.geometry().origin());
  SlotNeeds s;
  s.raw = (ring_slots == 0 || n < ring_slots) ? n : ring_slots;
  return s;
}

/// Pages that `slots` slots fill.
PHASEKV_HOST_DEVICE inline std::int64_t pages_for(std::int64_t slots, std::int64_t page_size) {
  return (slots + page_size - 1) / page_size;
}

namespace detail {

using phasekv::pages_for;

/// Of the windows of geometry `g` that complete in `[n0, n1)`, those in `[J(n0), j_new)` began
/// before `n0`; returns `j_new`, the first wholly inside the new tokens (<= J(n1)).
PHASEKV_HOST_DEVICE inline std::int64_t first_new_window(const Geometry& g, std::int64_t n0,
                                                         std::int64_t n1) {
  const std::int64_t j_end = g.complete_windows(n1);
  std::int64_t j = g.complete_windows(n0);
  while (j < j_end && g.window_begin(j) < n0) ++j;
  return j;
}

/// The positions of new tokens `[n0, n1)` that land in the raw pages: all of them without a
/// ring (`ring_slots` = 0); with a ring of R slots from `ring_origin`, the prefix part
/// `[n0, min(n1, O))` and the last R, `[max(n0, O, n1 - R), n1)` (the others are overwritten
/// within the same append). Range i is `[lo[i], hi[i])`, empty when lo[i] >= hi[i].
struct LandingRanges {
  std::int64_t lo[2] = {0, 0}, hi[2] = {0, 0};
};
PHASEKV_HOST_DEVICE inline LandingRanges raw_landing(std::int64_t n0, std::int64_t n1,
                                                     std::int64_t ring_origin,
                                                     std::int64_t ring_slots) {
  LandingRanges r;
  if (ring_slots == 0) {
    r.lo[0] = n0, r.hi[0] = n1;
    return r;
  }
  r.lo[0] = n0, r.hi[0] = n1 < ring_origin ? n1 : ring_origin;
  std::int64_t lo = n1 - ring_slots > ring_origin ? n1 - ring_slots : ring_origin;
  r.lo[1] = lo > n0 ? lo : n0, r.hi[1] = n1;
  return r;
}

}  // namespace detail

/// The pages one sequence's tables must list.
struct PageNeeds {
  std::int64_t raw_pages = 0;    ///< Pages of the raw table.
  std::int64_t entry_pages = 0;  ///< Pages of the entry table (0 for uncompressed layers).
};

/// The pages a sequence of `n` tokens needs under `rule` with a raw ring of `ring_slots` (0:
/// every token), pages of `raw_page_size` raw and `entry_page_size` entry slots. For a step
/// that appends t tokens to a sequence of n, call it with n + t before planning: the tables
/// must list that many pages (the pages beyond page_needs(n) are the step's new pages).
/// With per-KV-head `origins` (PagedKV::origins; `rule` compressed with origin 0) the entry
/// table covers the largest J_h(n) and the raw ring starts at the largest origin.
/// Throws phasekv::invalid_argument naming the argument when n, ring_slots, a page size or an
/// origin is out of range.
inline PageNeeds page_needs(const cpu::VisibilityRule& rule, std::int64_t ring_slots,
                            std::int64_t n, std::int64_t raw_page_size,
                            std::int64_t entry_page_size,
                            const std::vector<std::int64_t>& origins = {}) {
  const char* where = "phasekv::page_needs";
  detail::check_arg(n >= 0 && n <= kMaxLength, where, "n", n, "must be in [0, 2^62]");
  detail::check_arg(ring_slots >= 0, where, "ring_slots", ring_slots, "must be >= 0");
  detail::check_arg(raw_page_size >= 1, where, "raw_page_size", raw_page_size, "must be >= 1");
  detail::check_arg(entry_page_size >= 1, where, "entry_page_size", entry_page_size,
                    "must be >= 1");
  SlotNeeds s = slot_needs(rule, n, ring_slots);
  if (!origins.empty()) {
    detail::check_arg(rule.is_compressed(), where, "origins", "non-empty",
                      "needs a compressed rule (uncompressed rules have no windows)");
    const std::vector<std::int64_t> o = resolve_origins(
        where, rule.geometry(), origins, static_cast<std::int64_t>(origins.size()), "rule");
    s = slot_needs(rule.geometry(), n, ring_slots, max_origin(o));
    s.entries = max_complete_windows(rule.geometry(), o, n);
  }
  return PageNeeds{pages_for(s.raw, raw_page_size), pages_for(s.entries, entry_page_size)};
}

/// A batch of sequences over paged storage: raw tokens in `raw_pool` through `raw_table`,
/// compressed entries in `entry_pool` through `entry_table` (both ignored for entries when the
/// rule is uncompressed), `lengths[b]` = n_b tokens seen by sequence b, and what a query sees
/// (`rule`: compressed with a geometry and local window, or uncompressed causal / sliding).
///
/// `ring_slots` = 0: the raw table covers every position `[0, n_b)`. `ring_slots` = R > 0: the
/// raw table holds the prefix (positions < O; O = 0 for uncompressed rules) and then a ring of
/// R slots, position p >= O at slot `O + (p - O) mod R`; R must be at least the raw tokens a
/// query can see (`max(W, L)` compressed, the window for sliding-window rules).
///
/// Per-KV-head origins (`origins`, CPU calls only): KV head h has the windows
/// `[O_h + j*S, O_h + j*S + W)` of `rule.with_origin(O_h)` (`rule` compressed with origin 0),
/// so its entry count J_h(n), raw prefix and raw tail are its own. Slot j of a sequence's
/// entry pages holds entry j of every head with `j < J_h(n)` (the table covers
/// `max_h J_h(n)` entries); the raw pages hold the ring from `O_max = max_h O_h` (every head's
/// prefix lies below it, every head's raw tail fits the ring). Equal origins give the bits of
/// the uniform layout with that origin.
///
/// @tparam T storage element type (const-qualified by the kernels).
template <class T>
struct PagedKV {
  PagePool<const T> raw_pool;             ///< Raw token pages.
  BlockTable raw_table;                   ///< Raw pages per sequence.
  PagePool<const T> entry_pool;           ///< Entry pages (may be the same pool as raw).
  BlockTable entry_table;                 ///< Entry pages per sequence.
  const std::int64_t* lengths = nullptr;  ///< `[batch]` tokens seen, n_b.
  std::int64_t batch = 0;                 ///< Number of sequences B.
  cpu::VisibilityRule rule{};             ///< What a query at n_b - 1 sees.
  std::int64_t ring_slots = 0;            ///< 0: every raw token is kept; R: a ring of R.
  /// `[raw_pool.heads]` origin O_h of every KV head (host memory; `rule` compressed with
  /// origin 0), or null: every head sees `rule`. See the struct comment.
  const std::int64_t* origins = nullptr;

  /// What a query of KV head `h` sees: `rule`, or `rule.with_origin(origins[h])`.
  PHASEKV_HOST_DEVICE cpu::VisibilityRule head_rule(std::int64_t h) const {
    return origins == nullptr ? rule : rule.with_origin(origins[h]);
  }
  /// First position held by the ring: O for compressed rules (O_max with per-head origins),
  /// 0 otherwise.
  PHASEKV_HOST_DEVICE std::int64_t ring_origin() const {
    if (!rule.is_compressed()) return 0;
    if (origins == nullptr) return rule.geometry().origin();
    std::int64_t m = 0;
    for (std::int64_t h = 0; h < raw_pool.heads; ++h) m = origins[h] > m ? origins[h] : m;
    return m;
  }
  /// Raw slot of position `p` (see the file comment).
  PHASEKV_HOST_DEVICE static std::int64_t raw_slot(std::int64_t p, std::int64_t ring_origin,
                                                   std::int64_t ring_slots) {
    return (ring_slots == 0 || p < ring_origin) ? p : ring_origin + (p - ring_origin) % ring_slots;
  }
  /// Raw slots sequence b uses: n_b, or at most O + R with a ring (slot_needs).
  std::int64_t raw_slots_used(std::int64_t b) const {
    if (!rule.is_compressed()) return slot_needs(rule, lengths[b], ring_slots).raw;
    return slot_needs(rule.geometry(), lengths[b], ring_slots, ring_origin()).raw;
  }
  /// Entry slots sequence b uses: J(n_b), the largest J_h(n_b) with per-head origins (0 for
  /// uncompressed rules; slot_needs).
  std::int64_t entry_slots_used(std::int64_t b) const {
    if (origins == nullptr) return slot_needs(rule, lengths[b], ring_slots).entries;
    std::int64_t j = 0;
    for (std::int64_t h = 0; h < raw_pool.heads; ++h) {
      const std::int64_t jh = head_rule(h).geometry().complete_windows(lengths[b]);
      j = jh > j ? jh : j;
    }
    return j;
  }
  /// Whether the entry pool and table are read (compressed rules).
  bool uses_entries() const { return rule.is_compressed(); }
  /// Calls `f(name, index, value)` for every field of the rule and every origin (index -1 for
  /// a scalar), so that a plan can record it and a run compare it (PlanRecord).
  template <class F>
  void visit_rule(F&& f) const {
    f("kv.rule.is_compressed()", -1, rule.is_compressed() ? 1 : 0);
    if (!rule.is_compressed()) {
      f("kv.rule.window()", -1, rule.window());
      return;
    }
    f("kv.rule.geometry().window()", -1, rule.geometry().window());
    f("kv.rule.geometry().stride()", -1, rule.geometry().stride());
    f("kv.rule.geometry().origin()", -1, rule.geometry().origin());
    f("kv.rule.local()", -1, rule.local());
    f("kv.origins (null: 0, given: 1)", -1, origins == nullptr ? 0 : 1);
    if (origins != nullptr)
      for (std::int64_t h = 0; h < raw_pool.heads; ++h) f("kv.origins", h, origins[h]);
  }
};

namespace detail {

/// The KV heads `[run.head, run.head + run.count)` of `kv` as a batch of their own: pools
/// advanced to `run.head` (head 0 of the view is head run.head; strides unchanged), the run's
/// rule, no origins. Its ring_origin() is the run's origin: row sources over it take
/// kv.ring_origin() (O_max) for the raw slots.
template <class T>
PagedKV<T> origin_run_view(const PagedKV<T>& kv, const OriginRun& run) {
  PagedKV<T> v = kv;
  v.rule = kv.head_rule(run.head);
  v.origins = nullptr;
  v.raw_pool.keys += run.head * kv.raw_pool.key_head_stride();
  v.raw_pool.values += run.head * kv.raw_pool.value_head_stride();
  v.entry_pool.keys += run.head * kv.entry_pool.key_head_stride();
  v.entry_pool.values += run.head * kv.entry_pool.value_head_stride();
  return v;
}

/// The origin runs of `kv`'s `heads` KV heads: one run of every head (origin of the rule, or
/// the common origin) when the origins are null or equal.
template <class T>
std::vector<OriginRun> paged_origin_runs(const PagedKV<T>& kv, std::int64_t heads) {
  if (kv.origins == nullptr)
    return {OriginRun{0, heads, kv.rule.is_compressed() ? kv.rule.geometry().origin() : 0}};
  return origin_runs(std::vector<std::int64_t>(kv.origins, kv.origins + heads));
}

}  // namespace detail

PHASEKV_NAMESPACE_END
