/// @file
/// @brief PlanRecord: what a paged plan was made for, recorded by the plan and compared field
/// by field by every run (included by serving/paged_check.hpp), and the pieces other plans
/// record the same way (PoolShape, planned_text).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/serving/paged.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace detail {

/// "must equal the planned `v` (plan again)": the requirement of every run check.
inline std::string planned_text(std::int64_t v) {
  return "must equal the planned " + std::to_string(v) + " (plan again)";
}

/// A pool's shape as a plan records it: pages, page_size, heads, d_k, d_v, layout, key and
/// value page strides. check() throws phasekv::shape_error naming the field that differs.
struct PoolShape {
  std::int64_t v[8] = {0, 1, 0, 0, 0, 0, 0, 0};

  std::int64_t page_size() const { return v[1]; }
  template <class T>
  static PoolShape of(const PagePool<T>& p) {
    return PoolShape{{p.pages, p.page_size, p.heads, p.d_k, p.d_v,
                      static_cast<std::int64_t>(p.layout), p.key_page_stride, p.value_page_stride}};
  }
  template <class T>
  void check(const PagePool<T>& p, const char* where, const char* name) const {
    static const char* const fields[] = {
        "pages", "page_size", "heads",           "d_k",
        "d_v",   "layout",    "key_page_stride", "value_page_stride"};
    check_page_pool(p, where, name);
    const PoolShape now = of(p);
    for (int f = 0; f < 8; ++f)
      if (now.v[f] != v[f]) {
        const std::string n = std::string(name) + "." + fields[f];
        throw_arg<shape_error>(where, n.c_str(), now.v[f], planned_text(v[f]).c_str());
      }
  }
};

}  // namespace detail

/// What a paged plan was made for, and the one check every run of it makes. record() (plan
/// time; allocates) keeps the batch, the rule's fields (visit_rule), the ring, both pools'
/// shapes (pages, page size, heads, dims, layout, page strides), the lengths, `qo_indptr` when
/// given, and every page index the runs read (the used part of both tables). check() (every
/// run; allocates only to throw) compares a run's `kv` with all of it and throws
/// phasekv::invalid_argument naming the first field that differs and the planned value; its
/// cost is O(sequences + used table entries). check_fields() compares only what needs no
/// host array (batch, rule, ring, pools): what a run with device-side lengths and tables can
/// check.
class PlanRecord {
 public:
  /// Records `kv` (already validated) and `qo_indptr` (`[batch + 1]`, or null).
  template <class KV>
  void record(const KV& kv, const std::int32_t* qo_indptr) {
    batch_ = kv.batch;
    ring_slots_ = kv.ring_slots;
    entries_ = kv.uses_entries();
    rule_.clear();
    kv.visit_rule([&](const char*, std::int64_t, std::int64_t v) { rule_.push_back(v); });
    raw_ = Pool::of(kv.raw_pool);
    entry_ = entries_ ? Pool::of(kv.entry_pool) : Pool{};
    lengths_.assign(kv.lengths, kv.lengths + kv.batch);
    qo_.clear();
    if (qo_indptr != nullptr) qo_.assign(qo_indptr, qo_indptr + kv.batch + 1);
    raw_pages_.clear();
    entry_pages_.clear();
    for (std::int64_t b = 0; b < kv.batch; ++b) {
      for (std::int64_t i = 0; i < detail::pages_for(kv.raw_slots_used(b), raw_.page_size()); ++i)
        raw_pages_.push_back(static_cast<std::int32_t>(kv.raw_table.page(b, i)));
      if (!entries_) continue;
      for (std::int64_t i = 0; i < detail::pages_for(kv.entry_slots_used(b), entry_.page_size());
           ++i)
        entry_pages_.push_back(static_cast<std::int32_t>(kv.entry_table.page(b, i)));
    }
  }

  /// Checks the fields that need no host array: batch, pools, rule (with the origins), ring.
  template <class KV>
  void check_fields(const KV& kv, const char* where) const {
    detail::check_arg(kv.batch == batch_, where, "kv.batch", kv.batch, planned(batch_).c_str());
    raw_.check(kv.raw_pool, where, "kv.raw_pool");  // first: the rule's origins follow its heads
    if (entries_) entry_.check(kv.entry_pool, where, "kv.entry_pool");
    std::size_t i = 0;
    kv.visit_rule([&](const char* name, std::int64_t index, std::int64_t v) {
      if (i < rule_.size() && rule_[i] == v) {
        ++i;
        return;
      }
      const std::string n =
          index < 0 ? std::string(name) : std::string(name) + "[" + std::to_string(index) + "]";
      detail::throw_arg(where, n.c_str(), v,
                        i < rule_.size()
                            ? planned(rule_[i]).c_str()
                            : "must not exceed the planned rule's fields (plan again)");
    });
    detail::check_arg(i == rule_.size(), where, "kv rule", "shorter",
                      "must have the planned rule's fields (plan again)");
    detail::check_arg(kv.ring_slots == ring_slots_, where, "kv.ring_slots", kv.ring_slots,
                      planned(ring_slots_).c_str());
  }

  /// check_fields, then the lengths, `qo_indptr` (when recorded) and the used table entries,
  /// all read on the host.
  template <class KV>
  void check(const KV& kv, const std::int32_t* qo_indptr, const char* where) const {
    check_fields(kv, where);
    const std::int64_t B = batch_;
    detail::check_arg(B == 0 || kv.lengths != nullptr, where, "kv.lengths", "null",
                      "must point to [batch] lengths");
    for (std::int64_t b = 0; b < B; ++b)
      if (kv.lengths[b] != lengths_[static_cast<std::size_t>(b)])
        throw_field(where, "kv.lengths", b, kv.lengths[b], lengths_[static_cast<std::size_t>(b)]);
    if (!qo_.empty()) {
      detail::check_arg(qo_indptr != nullptr, where, "qo_indptr", "null",
                        "must point to [batch + 1] offsets");
      for (std::int64_t b = 0; b <= B; ++b)
        if (qo_indptr[b] != qo_[static_cast<std::size_t>(b)])
          throw_field(where, "qo_indptr", b, qo_indptr[b], qo_[static_cast<std::size_t>(b)]);
    }
    check_table(kv, kv.raw_table, raw_pages_, raw_.page_size(), false, where, "kv.raw_table");
    if (entries_)
      check_table(kv, kv.entry_table, entry_pages_, entry_.page_size(), true, where,
                  "kv.entry_table");
  }

  /// Sequences of the recorded batch.
  std::int64_t batch() const { return batch_; }
  /// The recorded lengths.
  const std::vector<std::int64_t>& lengths() const { return lengths_; }
  /// The recorded `qo_indptr` (empty when none was given).
  const std::vector<std::int64_t>& qo_indptr() const { return qo_; }

 private:
  static std::string planned(std::int64_t v) { return detail::planned_text(v); }
  template <class V>
  [[noreturn]] static void throw_field(const char* where, const char* name, std::int64_t index,
                                       V value, std::int64_t want) {
    const std::string n = std::string(name) + "[" + std::to_string(index) + "]";
    detail::throw_arg(where, n.c_str(), value, planned(want).c_str());
  }

  using Pool = detail::PoolShape;

  template <class KV>
  void check_table(const KV& kv, const BlockTable& t, const std::vector<std::int32_t>& pages,
                   std::int64_t page_size, bool entries, const char* where,
                   const char* name) const {
    std::size_t k = 0;
    for (std::int64_t b = 0; b < batch_; ++b) {
      const std::int64_t need =
          detail::pages_for(entries ? kv.entry_slots_used(b) : kv.raw_slots_used(b), page_size);
      if (need == 0) continue;
      if (t.count(b) < need || (t.indices == nullptr && need > 0)) {
        const std::string n = std::string(name) + " pages of sequence " + std::to_string(b);
        const std::string req = "must list the " + std::to_string(need) + " planned pages";
        detail::throw_arg<capacity_error>(where, n.c_str(), t.count(b), req.c_str());
      }
      // the sequence's pages are contiguous in both forms: compare them as one run
      const std::int32_t* now = t.indices + t.begin(b);
      if (!std::equal(now, now + need, pages.data() + k)) {
        const std::int64_t i = std::mismatch(now, now + need, pages.data() + k).first - now;
        const std::string n =
            std::string(name) + " sequence " + std::to_string(b) + " index " + std::to_string(i);
        detail::throw_arg(where, n.c_str(), now[i], planned(pages[k + i]).c_str());
      }
      k += static_cast<std::size_t>(need);
    }
  }

  std::int64_t batch_ = 0, ring_slots_ = 0;
  bool entries_ = false;
  std::vector<std::int64_t> rule_, lengths_, qo_;
  Pool raw_, entry_;
  std::vector<std::int32_t> raw_pages_, entry_pages_;
};

PHASEKV_NAMESPACE_END
