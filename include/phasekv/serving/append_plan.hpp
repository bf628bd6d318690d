/// @file
/// @brief Batched append into paged storage as plan/run (the append of a serving step):
/// AppendPlan validates a step's append once, in O(sequences + pages the step touches), and
/// splits the work into items (windows pooled, new raw tokens written) that the runs share over
/// workers, inside a long chunk as well as across sequences.
///
/// 1. `AppendPlan::plan(key_policy, value_policy, local, args, workers)` for a compressed layer,
///    `AppendPlan::plan_raw(rule, args, workers)` for an uncompressed one (causal or sliding
///    window: raw tokens only, over the same pools). Host, allocates, once per step; the same
///    plan serves every layer of the step (same lengths, new-token offsets and tables; pools
///    of the same shape).
/// 2. Workspace: `plan.workspace_bytes()` (0 for a raw-only plan).
/// 3. Run, per layer: `paged_append_run` (one thread), `paged_append_run_parallel` (a
///    ThreadPool of plan.workers() threads), or on an engine's own workers
///    `paged_append_entries_run(..., w)` on every worker, then `paged_append_raw_run(..., w)`
///    on every worker (the raw writes may overwrite ring slots that the entries read, so all
///    entries come first). A raw-only plan runs `paged_append_raw_run` alone. Runs never
///    allocate; their checks cost O(sequences + pages touched), whatever the pool's size.
///
/// What the plan checks: the policies, the new tokens and lengths, every table lists the pages
/// of the sequence's slots after the append (page_needs), and every page the step touches (raw
/// pages read by windows that began before the append, raw and entry pages written) is a page
/// of its pool; a page written by the step is used by no other table slot of the step (by
/// memory range, as check_paged_tables), and, with `PageReaders`, is listed by no other live
/// sequence (the engine's reader counts, e.g. vLLM's block reference counts; see
/// serving/sharing.hpp for counts computed from the tables and for the pages a sequence may
/// still write). Pages a step does not touch are not walked: that is what keeps the plan's
/// cost independent of the pool and of the sequences' lengths.
///
/// What every run checks against the plan (PlanRecord's approach): batch, lengths,
/// `new_indptr`, ring, the origins, both pools' shapes and how their memory relates (or their
/// addresses, when pages of the two pools may share memory other than page by page), the new
/// tokens' views, every touched table entry, and (runs that pool windows) the policies' types,
/// geometry and dims, and `local`.
/// A run that differs throws phasekv::invalid_argument / shape_error / capacity_error naming
/// the field and the planned value, before anything is written.
///
/// Results are the bits of paged_append (and of CompressedCache::append) for any worker count
/// and any split.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "phasekv/attention/cpu/thread_pool.hpp"
#include "phasekv/attention/cpu/visibility_rule.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/serving/append_touch.hpp"
#include "phasekv/serving/paged_append.hpp"
#include "phasekv/serving/paged_check.hpp"
#include "phasekv/serving/plan.hpp"

PHASEKV_NAMESPACE_BEGIN

/// Default most raw tokens / entries of one append work item.
inline constexpr std::int64_t kAppendChunk = 256;

/// One unit of append work of sequence `sequence`: windows `[begin, end)` that began before
/// the append (old_windows, pooled through the raw pages), windows `[begin, end)` inside the
/// new tokens (new_windows, the window loop; `pass` windows in the sequence's pass), or raw
/// positions `[begin, end)` written to the raw pages (raw_tokens).
struct AppendItem {
  /// What an item does.
  enum Kind : std::int32_t {
    old_windows = 0,  ///< Pools windows that began before the append (phase 1).
    new_windows = 1,  ///< Pools windows inside the new tokens, the window loop (phase 1).
    raw_tokens = 2    ///< Writes new raw tokens (phase 2).
  };
  std::int64_t sequence = 0;  ///< Sequence b.
  std::int64_t begin = 0;     ///< First window or position.
  std::int64_t end = 0;       ///< One past the last.
  std::int64_t pass = 0;      ///< new_windows: windows of the sequence's whole pass.
  Kind kind = raw_tokens;     ///< What the item does.
  std::int64_t run = 0;       ///< Windows: the origin run (AppendPlan::runs()) they belong to.
};

namespace detail {

/// One address per type, the same in every translation unit (an inline variable): what a plan
/// records of its policies' types, without RTTI.
template <class P>
struct PolicyTypeTag {
  static constexpr char id = 0;
};
template <class P>
const void* policy_type_id() {
  return &PolicyTypeTag<P>::id;
}

}  // namespace detail

/// The host plan of one step's append (see the file comment).
class AppendPlan {
 public:
  /// Plans the append of a compressed layer: `key_policy` / `value_policy` (same geometry,
  /// dims of the pools), local window `local`, `args` (lengths before the append), `workers`
  /// >= 1, `readers` (optional reader counts; every run reads the arrays again, so they must
  /// outlive the plan's runs), `chunk` (most tokens or entries of an item).
  /// Throws naming the argument, the sequence and the table index; allocates.
  template <class T, class KeyPolicy, class ValuePolicy>
  void plan(const KeyPolicy& key_policy, const ValuePolicy& value_policy, std::int64_t local,
            const PagedAppendArgs<T>& args, int workers, const PageReaders& readers = {},
            std::int64_t chunk = kAppendChunk) {
    const char* where = "phasekv::AppendPlan::plan";
    check_counts(workers, chunk, where);
    detail::check_append_policies(key_policy, value_policy, local, args, where);
    const Geometry g = key_policy.geometry();
    const std::int64_t dmax =
        args.raw_pool.d_k > args.raw_pool.d_v ? args.raw_pool.d_k : args.raw_pool.d_v;
    const std::size_t win =
        static_cast<std::size_t>(detail::gather_elements(g.window(), dmax)) * sizeof(T);
    worker_bytes_ = align(static_cast<std::size_t>(dmax) * sizeof(float)) + align(win);
    gather_ = win > 0;
    build(cpu::VisibilityRule::compressed(g, local), args, workers, readers, chunk, where);
    key_type_ = detail::policy_type_id<KeyPolicy>();
    value_type_ = detail::policy_type_id<ValuePolicy>();
  }

  /// Plans the raw-only append of an uncompressed layer (`rule` causal or sliding window; a
  /// ring of `args.ring_slots` >= the window, or 0): the new tokens go to the raw pages, the
  /// entry pool and table are not used. Throws as plan().
  template <class T>
  void plan_raw(const cpu::VisibilityRule& rule, const PagedAppendArgs<T>& args, int workers,
                const PageReaders& readers = {}, std::int64_t chunk = kAppendChunk) {
    const char* where = "phasekv::AppendPlan::plan_raw";
    check_counts(workers, chunk, where);
    detail::check_arg(!rule.is_compressed(), where, "rule", "compressed",
                      "must be causal or sliding-window (compressed layers: AppendPlan::plan)");
    worker_bytes_ = 0;
    gather_ = false;
    build(rule, args, workers, readers, chunk, where);
  }

  /// Workers the items are balanced over.
  int workers() const { return workers_; }
  /// Whether the plan pools windows (plan) or writes raw tokens only (plan_raw).
  bool compressed() const { return rule_.is_compressed(); }
  /// Workspace bytes a run needs (0 for a raw-only plan).
  std::size_t workspace_bytes() const { return worker_bytes_ * static_cast<std::size_t>(workers_); }
  /// Sequences of the planned batch.
  std::int64_t batch() const { return batch_; }
  /// The runs of consecutive KV heads with one origin (args.origins): one run of every head
  /// at the policies' origin without per-head origins.
  const std::vector<OriginRun>& runs() const { return runs_; }
  /// Whether the plan was made with per-head origins (args.origins non-null).
  bool per_head_origins() const { return !origins_.empty(); }
  /// First position of the raw ring (PagedKV::ring_origin: O, or O_max with per-head origins).
  std::int64_t ring_origin() const { return ring_origin_; }
  /// The lengths after the append (the caller's next lengths).
  const std::vector<std::int64_t>& lengths_after() const { return after_; }
  /// The work items, entries first (phase 1), then raw tokens (phase 2).
  const std::vector<AppendItem>& items() const { return items_; }
  /// Items of worker `w` in phase `phase` (0 entries, 1 raw): `[first, last)` of items().
  std::int64_t worker_first(int phase, int w) const {
    return first_[static_cast<std::size_t>(phase * (workers_ + 1) + w)];
  }
  /// The touched table entries the runs compare (plan order).
  const std::vector<detail::AppendTouch>& touched() const { return touched_; }

  /// Compares a run's arguments with the plan (see the file comment); O(sequences + touched
  /// pages); allocates only to throw.
  template <class T>
  void check_run(const PagedAppendArgs<T>& a, const char* where) const {
    using detail::check_arg;
    // the requirement texts are built only to throw: a run allocates nothing
    if (a.batch != batch_)
      detail::throw_arg(where, "batch", a.batch, detail::planned_text(batch_).c_str());
    check_arg(batch_ == 0 || (a.lengths != nullptr && a.new_indptr != nullptr), where,
              a.lengths == nullptr ? "lengths" : "new_indptr", "null",
              "must point to the planned arrays");
    for (std::int64_t b = 0; b < batch_; ++b)
      if (a.lengths[b] != before_[static_cast<std::size_t>(b)])
        throw_at(where, "lengths", b, a.lengths[b], before_[static_cast<std::size_t>(b)]);
    for (std::int64_t b = 0; batch_ > 0 && b <= batch_; ++b)
      if (a.new_indptr[b] != indptr_[static_cast<std::size_t>(b)])
        throw_at(where, "new_indptr", b, a.new_indptr[b], indptr_[static_cast<std::size_t>(b)]);
    if (a.ring_slots != rule_ring_)
      detail::throw_arg(where, "ring_slots", a.ring_slots,
                        detail::planned_text(rule_ring_).c_str());
    raw_shape_.check(a.raw_pool, where, "raw_pool");
    if (compressed()) entry_shape_.check(a.entry_pool, where, "entry_pool");
    check_arg((a.origins != nullptr) == per_head_origins(), where, "origins",
              a.origins == nullptr ? "null" : "non-null",
              "must be given exactly when the plan was made with per-head origins (plan again)");
    for (std::size_t h = 0; h < origins_.size(); ++h)
      if (a.origins[h] != origins_[h])
        throw_at(where, "origins", static_cast<std::int64_t>(h), a.origins[h], origins_[h]);
    const detail::PoolBytes rb = detail::pool_bytes(a.raw_pool);
    const detail::PoolBytes eb = compressed() ? detail::pool_bytes(a.entry_pool) : rb;
    check_arg(detail::PoolOverlap::of(rb, eb, compressed()) == overlap_ &&
                  (overlap_.by_index || (rb == raw_bytes_ && eb == entry_bytes_)),
              where, "entry_pool.keys", "moved",
              "the pools' memory must relate as planned (pages shared other than page by page: "
              "the planned addresses; plan again)");
    const std::int64_t rows = batch_ > 0 ? indptr_[static_cast<std::size_t>(batch_)] : 0;
    const auto view = [&](const auto& v, std::int64_t d, const char* name, const char* tok,
                          const char* heads, const char* dim) {
      check_view(v, where, name);
      check_arg<shape_error>(v.tokens >= rows, where, tok, v.tokens,
                             "must hold new_indptr[batch] rows");
      check_arg<shape_error>(v.heads == a.raw_pool.heads, where, heads, v.heads,
                             "must equal the pools' heads");
      check_arg<shape_error>(v.dim == d, where, dim, v.dim, "must equal the pools' head dim");
    };
    view(a.keys, a.raw_pool.d_k, "keys", "keys.tokens", "keys.heads", "keys.dim");
    view(a.values, a.raw_pool.d_v, "values", "values.tokens", "values.heads", "values.dim");
    for (std::int64_t b = 0; b < batch_; ++b) {
      const std::size_t bs = static_cast<std::size_t>(b);
      detail::check_append_capacity(a.raw_table, b, need_[2 * bs], where, "raw_table");
      if (compressed())
        detail::check_append_capacity(a.entry_table, b, need_[2 * bs + 1], where, "entry_table");
    }
    for (const detail::AppendTouch& t : touched_) {
      const BlockTable& tb = t.table == 0 ? a.raw_table : a.entry_table;
      const std::int64_t now = tb.page(t.b, t.index);
      if (now != t.page) detail::throw_touch(where, t, now, detail::planned_text(t.page).c_str());
      // the planned reader counts, read again: a sequence that began reading a page since the
      // plan keeps the step from writing it
      const std::int32_t* r = t.table == 0 ? readers_.raw : readers_.entry;
      if (t.write && r != nullptr && r[t.page] > 1)
        detail::throw_touch(where, t, t.page,
                            "is written by this step but now listed by more than one live "
                            "sequence (PageReaders, read again by the run): copy it first");
    }
  }

  /// Compares the policies and `local` of a run with the planned ones; allocates only to throw.
  template <class KeyPolicy, class ValuePolicy>
  void check_policies(const KeyPolicy& kp, const ValuePolicy& vp, std::int64_t local,
                      const char* where) const {
    using detail::check_arg;
    check_arg(compressed(), where, "plan", "raw-only",
              "was made by plan_raw (run it with paged_append_raw_run)");
    check_arg(detail::policy_type_id<KeyPolicy>() == key_type_, where, "key_policy", "another type",
              "must have the planned policy type (plan again)");
    check_arg(detail::policy_type_id<ValuePolicy>() == value_type_, where, "value_policy",
              "another type", "must have the planned policy type (plan again)");
    const Geometry& g = rule_.geometry();
    check_arg(kp.geometry() == g, where, "key_policy.geometry().window()", kp.geometry().window(),
              "the geometry must equal the planned one (plan again)");
    check_arg(vp.geometry() == g, where, "value_policy.geometry().window()", vp.geometry().window(),
              "the geometry must equal the planned one (plan again)");
    if (local != rule_.local())
      detail::throw_arg(where, "local", local, detail::planned_text(rule_.local()).c_str());
    const std::int64_t H = raw_shape_.v[2], dk = raw_shape_.v[3], dv = raw_shape_.v[4];
    check_arg<shape_error>(kp.input_dim() == dk && kp.output_dim() == dk, where,
                           "key_policy.output_dim()", kp.output_dim(), "must equal the pools' d_k");
    check_arg<shape_error>(vp.input_dim() == dv && vp.output_dim() == dv, where,
                           "value_policy.output_dim()", vp.output_dim(),
                           "must equal the pools' d_v");
    const std::int64_t kh = policy_kv_heads(kp), vh = policy_kv_heads(vp);
    check_arg<shape_error>(kh <= 0 || kh == H, where, "key_policy.kv_heads()", kh,
                           "must equal the pools' heads");
    check_arg<shape_error>(vh <= 0 || vh == H, where, "value_policy.kv_heads()", vh,
                           "must equal the pools' heads");
  }

  /// The rule the plan was made for (compressed with geometry and local, or uncompressed).
  const cpu::VisibilityRule& rule() const { return rule_; }
  /// Whether windows are gathered into the workspace before pooling (row_kernels path).
  bool gathers() const { return gather_; }
  /// Workspace bytes of one worker.
  std::size_t worker_bytes() const { return worker_bytes_; }

 private:
  static std::size_t align(std::size_t n) { return (n + 63) / 64 * 64; }
  static void check_counts(int workers, std::int64_t chunk, const char* where) {
    detail::check_arg(workers >= 1, where, "workers", workers, "must be >= 1");
    detail::check_arg(chunk >= 1, where, "chunk", chunk, "must be >= 1");
  }
  template <class V>
  [[noreturn]] static void throw_at(const char* where, const char* name, std::int64_t index,
                                    V value, std::int64_t want) {
    const std::string n = std::string(name) + "[" + std::to_string(index) + "]";
    detail::throw_arg(where, n.c_str(), value, detail::planned_text(want).c_str());
  }

  template <class T>
  void build(const cpu::VisibilityRule& rule, const PagedAppendArgs<T>& a, int workers,
             const PageReaders& readers, std::int64_t chunk, const char* where) {
    std::vector<std::int64_t> after = detail::check_append_tokens(a, where);
    PagedKV<T> kv;  // the storage as it will be after the append (fields only: O(batch))
    kv.raw_pool = a.raw_pool;
    kv.raw_table = a.raw_table;
    kv.entry_pool = a.entry_pool;
    kv.entry_table = a.entry_table;
    kv.lengths = after.data();
    kv.batch = a.batch;
    kv.rule = rule;
    kv.ring_slots = a.ring_slots;
    kv.origins = a.origins;
    detail::check_paged_kv_fields(kv, a.raw_pool.heads, a.raw_pool.d_k, a.raw_pool.d_v, where);
    detail::AppendTouches tc;
    tc.collect(kv, a.lengths, where);
    tc.check(a.raw_pool, a.entry_pool, rule.is_compressed(), readers, where);
    // record (after every check: a plan that threw keeps its previous state)
    readers_ = readers;
    rule_ = rule;
    rule_ring_ = a.ring_slots;
    batch_ = a.batch;
    workers_ = workers;
    before_.assign(a.lengths, a.lengths + a.batch);
    after_ = std::move(after);
    indptr_.assign(a.new_indptr, a.new_indptr + (a.batch > 0 ? a.batch + 1 : 0));
    raw_shape_ = detail::PoolShape::of(a.raw_pool);
    entry_shape_ = rule.is_compressed() ? detail::PoolShape::of(a.entry_pool) : detail::PoolShape{};
    raw_bytes_ = detail::pool_bytes(a.raw_pool);
    entry_bytes_ = rule.is_compressed() ? detail::pool_bytes(a.entry_pool) : raw_bytes_;
    overlap_ = detail::PoolOverlap::of(raw_bytes_, entry_bytes_, rule.is_compressed());
    touched_ = std::move(tc.touched);
    need_ = std::move(tc.need);
    runs_ = detail::paged_origin_runs(kv, a.raw_pool.heads);
    if (a.origins != nullptr)
      origins_.assign(a.origins, a.origins + a.raw_pool.heads);
    else
      origins_.clear();
    ring_origin_ = kv.ring_origin();
    // items: phase 1 the entries, phase 2 the raw tokens, each balanced over the workers
    items_.clear();
    std::vector<std::int64_t> cost;
    const std::int64_t ro = kv.ring_origin(), R = a.ring_slots;
    const std::int64_t W = rule.is_compressed() ? rule.geometry().window() : 1;
    std::size_t phase1 = 0;
    for (int phase = 0; phase < 2; ++phase) {
      for (std::int64_t b = 0; b < batch_; ++b) {
        const std::int64_t n0 = before_[static_cast<std::size_t>(b)];
        const std::int64_t n1 = after_[static_cast<std::size_t>(b)];
        if (n1 <= n0) continue;
        const auto push = [&](AppendItem::Kind k, std::int64_t lo, std::int64_t hi,
                              std::int64_t pass, std::int64_t unit, std::int64_t run) {
          for (std::int64_t x = lo; x < hi; x += chunk) {
            const std::int64_t y = x + chunk < hi ? x + chunk : hi;
            items_.push_back(AppendItem{b, x, y, pass, k, run});
            cost.push_back((y - x) * unit + kWorkItemOverhead);
          }
        };
        if (phase == 0 && rule.is_compressed()) {
          for (std::size_t r = 0; r < runs_.size(); ++r) {
            const Geometry g = kv.head_rule(runs_[r].head).geometry();
            const std::int64_t j0 = g.complete_windows(n0), j1 = g.complete_windows(n1);
            const std::int64_t jn = detail::first_new_window(g, n0, n1);
            const std::int64_t unit = W * runs_[r].count, rs = static_cast<std::int64_t>(r);
            if (jn > j0) push(AppendItem::old_windows, j0, jn, 0, unit, rs);
            push(AppendItem::new_windows, jn, j1, j1 - jn, unit, rs);
          }
        } else if (phase == 1) {
          const detail::LandingRanges land = detail::raw_landing(n0, n1, ro, R);
          for (int k = 0; k < 2; ++k) push(AppendItem::raw_tokens, land.lo[k], land.hi[k], 0, 1, 0);
        }
      }
      if (phase == 0) phase1 = items_.size();
    }
    first_.assign(static_cast<std::size_t>(2 * (workers + 1)), 0);
    plan_balance_costs(cost.data(), static_cast<std::int64_t>(phase1), workers, first_.data());
    plan_balance_costs(cost.data() + phase1, static_cast<std::int64_t>(items_.size() - phase1),
                       workers, first_.data() + workers + 1);
    for (int w = 0; w <= workers; ++w)
      first_[static_cast<std::size_t>(workers + 1 + w)] += static_cast<std::int64_t>(phase1);
  }

  cpu::VisibilityRule rule_{};
  std::int64_t rule_ring_ = 0, batch_ = 0;
  int workers_ = 1;
  bool gather_ = false;
  std::size_t worker_bytes_ = 0;
  std::vector<std::int64_t> before_, after_, indptr_, need_, first_;
  detail::PoolShape raw_shape_, entry_shape_;
  detail::PoolBytes raw_bytes_, entry_bytes_;
  detail::PoolOverlap overlap_;
  std::vector<detail::AppendTouch> touched_;
  std::vector<AppendItem> items_;
  std::vector<OriginRun> runs_;
  std::vector<std::int64_t> origins_;
  std::int64_t ring_origin_ = 0;
  PageReaders readers_;             // the engine's counts, read by the plan and again by every run
  const void* key_type_ = nullptr;  // the planned policy types (detail::policy_type_id)
  const void* value_type_ = nullptr;
};

PHASEKV_NAMESPACE_END
