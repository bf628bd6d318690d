/// @file
/// @brief Per-KV-head origins (staggered windows) in the paged serving layout: batched
/// streaming compression into pages (paged_append_staggered), batch decode
/// (StaggeredDecodePlan) and ragged batch prefill (StaggeredPrefillPlan), in the plan/run life
/// cycle of the uniform serving path.
///
/// KV head h has windows `[O_h + j*S, O_h + j*S + W)` (`origins`), so its entry count
/// J_h(n), raw prefix `[0, O_h)` and raw tail are its own. The pages hold, per sequence:
/// - entries: one entry table as in the uniform layout; slot j of the sequence's entry pages
///   holds entry j of every head h with `j < J_h(n)` (head h's slots at and above J_h(n) are
///   not written and never read). The table must cover `max_h J_h(n)` entries.
/// - raw tokens: one raw table as in the uniform layout, with ring origin `O_max = max_h O_h`:
///   positions below O_max sit at slot p, later ones at `O_max + (p - O_max) mod R` with a
///   ring of R = `ring_slots` >= max(W, L) slots (R = 0: every token at slot p). Every head's
///   prefix lies below O_max, and every head's raw tail fits the ring.
///
/// With equal origins the plans and the append take the uniform path (DecodePlan,
/// PrefillPlan, paged_append) unchanged: the same bits and the same speed. With different
/// origins every KV head is its own work item, with its own visible set, over the same pages;
/// each head's result has the bits of cpu::decode with `head_kv` / cpu::prefill with `origins`.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "phasekv/attention/cpu/variant_check.hpp"
#include "phasekv/compress/compress_batch.hpp"
#include "phasekv/compress/head_policy.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/phase/origins.hpp"
#include "phasekv/serving/batch_decode.hpp"
#include "phasekv/serving/batch_prefill.hpp"
#include "phasekv/serving/paged.hpp"
#include "phasekv/serving/paged_append.hpp"
#include "phasekv/serving/paged_check.hpp"
#include "phasekv/serving/plan.hpp"

PHASEKV_NAMESPACE_BEGIN

/// A batch of sequences over paged storage whose KV heads have their own origins (see the file
/// comment for what the pages hold). Fields as in PagedKV, with `geometry` (W, S and one
/// origin per KV head) and `local` in place of the visibility rule.
///
/// @tparam T storage element type.
template <class T>
struct StaggeredPagedKV {
  PagePool<const T> raw_pool;             ///< Raw token pages.
  BlockTable raw_table;                   ///< Raw pages per sequence.
  PagePool<const T> entry_pool;           ///< Entry pages (may be the same pool as raw).
  BlockTable entry_table;                 ///< Entry pages per sequence (max_h J_h(n_b) slots).
  const std::int64_t* lengths = nullptr;  ///< `[batch]` tokens seen, n_b.
  std::int64_t batch = 0;                 ///< Number of sequences B.
  Geometry geometry;                      ///< W and S (its origin must be 0).
  std::vector<std::int64_t> origins;      ///< O_h of every KV head.
  std::int64_t local = 0;                 ///< Local window L.
  std::int64_t ring_slots = 0;            ///< 0: every raw token is kept; R: a ring of R.

  /// First position the ring holds: the largest origin, O_max.
  std::int64_t ring_origin() const {
    std::int64_t m = 0;
    for (std::int64_t o : origins) m = o > m ? o : m;
    return m;
  }
  /// What a query of KV head `h` sees: DESIGN.md's rule with `Geometry(W, S, O_h)` and L.
  cpu::VisibilityRule rule(std::int64_t h) const {
    return cpu::VisibilityRule::compressed(
        Geometry(geometry.window(), geometry.stride(), origins[static_cast<std::size_t>(h)]),
        local);
  }
  /// The uniform-layout view with KV head `h`'s rule (its raw slots use that head's origin as
  /// the ring origin, so only the table checks and the uniform path read it directly).
  PagedKV<T> paged(std::int64_t h) const {
    PagedKV<T> kv;
    kv.raw_pool = raw_pool;
    kv.raw_table = raw_table;
    kv.entry_pool = entry_pool;
    kv.entry_table = entry_table;
    kv.lengths = lengths;
    kv.batch = batch;
    kv.rule = rule(h);
    kv.ring_slots = ring_slots;
    return kv;
  }
  /// Raw slots sequence b uses: n_b, or at most O_max + R with a ring.
  std::int64_t raw_slots_used(std::int64_t b) const {
    const std::int64_t n = lengths[b];
    if (ring_slots == 0) return n;
    const std::int64_t cap = ring_origin() + ring_slots;
    return n < cap ? n : cap;
  }
  /// Entry slots sequence b uses: `max_h J_h(n_b)`.
  std::int64_t entry_slots_used(std::int64_t b) const {
    return max_complete_windows(geometry, origins, lengths[b]);
  }
  /// The entry pages are always read.
  bool uses_entries() const { return true; }
  /// Calls `f(name, index, value)` for W, S, the head count, every O_h and L (PlanRecord).
  template <class F>
  void visit_rule(F&& f) const {
    f("kv.geometry.window()", -1, geometry.window());
    f("kv.geometry.stride()", -1, geometry.stride());
    f("kv.geometry.origin()", -1, geometry.origin());
    f("kv.origins.size()", -1, static_cast<std::int64_t>(origins.size()));
    for (std::size_t h = 0; h < origins.size(); ++h)
      f("kv.origins", static_cast<std::int64_t>(h), origins[h]);
    f("kv.local", -1, local);
  }
};

/// Checks a StaggeredPagedKV before anything reads or writes through it, for `heads` KV heads
/// and head dims `d_k`, `d_v`: the origins (check_origins), the local window, the pools, the
/// lengths, every table long enough (raw_slots_used, entry_slots_used), every page index in
/// range, a ring of at least max(W, L) slots, and with `check_overlap` no page used twice among
/// the live sequences. Throws phasekv::invalid_argument / shape_error / capacity_error naming
/// the argument, the sequence and the index.
template <class T>
void check_staggered_paged_kv(const StaggeredPagedKV<T>& kv, std::int64_t heads, std::int64_t d_k,
                              std::int64_t d_v, const char* where, bool check_overlap = true) {
  resolve_origins(where, kv.geometry, kv.origins, heads, "kv");
  check_origins(where, kv.origins, heads);
  Geometry::check_local(where, "kv.local", kv.local);
  // Pools, tables, lengths, the ring and the raw pages: the uniform check with the ring origin
  // O_max (its entry check, for J with origin O_max, is implied by the one below).
  PagedKV<T> raw = kv.paged(0);
  raw.rule = cpu::VisibilityRule::compressed(
      Geometry(kv.geometry.window(), kv.geometry.stride(), kv.ring_origin()), kv.local);
  check_paged_kv(raw, heads, d_k, d_v, where, false);
  check_paged_tables(kv, where, "kv.", check_overlap);
}

namespace detail {

/// The PagedKV of KV head `h` for the decode row source: pools advanced to head h (so head 0
/// of the view is head h), head h's rule.
template <class T>
PagedKV<T> staggered_head_kv(const StaggeredPagedKV<T>& kv, std::int64_t h) {
  PagedKV<T> p = kv.paged(h);
  p.raw_pool.keys += h * p.raw_pool.key_head_stride();
  p.raw_pool.values += h * p.raw_pool.value_head_stride();
  p.entry_pool.keys += h * p.entry_pool.key_head_stride();
  p.entry_pool.values += h * p.entry_pool.value_head_stride();
  return p;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Batch decode

/// Everything one staggered batch decode call needs (one layer). As BatchDecodeArgs, with a
/// StaggeredPagedKV.
template <class T, class Variant = StandardVariant>
struct StaggeredBatchDecodeArgs {
  const float* q = nullptr;   ///< Queries `[batch, q_heads, d_k]`: one token per sequence.
  std::int64_t q_heads = 0;   ///< Query heads Hq (a multiple of kv_heads).
  std::int64_t kv_heads = 0;  ///< KV heads Hkv (= kv.origins.size()).
  std::int64_t d_k = 0;       ///< Key head dim.
  std::int64_t d_v = 0;       ///< Value head dim.
  StaggeredPagedKV<T> kv;     ///< Pools, tables, lengths, origins and local window.
  Variant variant{};          ///< Logit transform, entry bias, sinks (per query head).
  float* out = nullptr;       ///< Output `[batch, q_heads, d_v]`.
  float* lse = nullptr;       ///< Log-sum-exp `[batch, q_heads]` (-inf where nothing is visible).

  /// The uniform-path arguments (every head with origin O_0; used when the origins are equal).
  BatchDecodeArgs<T, Variant> uniform() const {
    BatchDecodeArgs<T, Variant> a;
    a.q = q;
    a.q_heads = q_heads;
    a.kv_heads = kv_heads;
    a.d_k = d_k;
    a.d_v = d_v;
    a.kv = kv.paged(0);
    a.variant = variant;
    a.out = out;
    a.lse = lse;
    return a;
  }
};

/// The host plan of a staggered batch decode step. With equal origins it is a DecodePlan of
/// the uniform path. Otherwise its work items are (sequence, KV head, KV chunk): item
/// `sequence` field = `b * kv_heads + h`, visible items counted in head h's visible set.
/// Serves every layer with the same lengths, tables, geometry, local window and head shape.
class StaggeredDecodePlan {
 public:
  /// Plans a step (q, out, lse and pool data are not read) over `workers` workers with KV
  /// chunks of `kv_chunk` visible items (a multiple of 64). Validates everything the runs rely
  /// on (check_staggered_paged_kv with the overlap check); throws phasekv::invalid_argument (or
  /// shape_error / capacity_error) naming the argument, the sequence and the index; the plan is
  /// unchanged then.
  template <class T, class Variant>
  void plan(const StaggeredBatchDecodeArgs<T, Variant>& args, int workers,
            std::int64_t kv_chunk = kDefaultKvChunk) {
    const char* where = "phasekv::StaggeredDecodePlan::plan";
    check_shape(args.q_heads, args.kv_heads, args.d_k, args.d_v, where);
    detail::check_arg(workers >= 1, where, "workers", workers, "must be >= 1");
    check_origins(where, args.kv.origins, args.kv_heads);
    if (origins_uniform(args.kv.origins)) {
      DecodePlan u;
      u.plan(args.uniform(), workers, kv_chunk);
      commit_common(args, workers, kv_chunk);
      uniform_plan_ = std::move(u);
      uniform_ = true;
      return;
    }
    const std::int64_t block = cpu::detail::kDecodeBlock;
    detail::check_arg(kv_chunk >= block && kv_chunk % block == 0 && kv_chunk <= (1LL << 40), where,
                      "kv_chunk", kv_chunk, "must be a positive multiple of 64, <= 2^40");
    check_staggered_paged_kv(args.kv, args.kv_heads, args.d_k, args.d_v, where, true);
    const std::int64_t B = args.kv.batch, H = args.kv_heads;
    std::vector<std::int64_t> totals(static_cast<std::size_t>(B * H));
    for (std::int64_t h = 0; h < H; ++h) {
      const cpu::VisibilityRule r = args.kv.rule(h);
      for (std::int64_t b = 0; b < B; ++b)
        totals[static_cast<std::size_t>(b * H + h)] = r.at(args.kv.lengths[b]).total();
    }
    std::vector<std::int64_t> first(static_cast<std::size_t>(B * H + 1));
    const std::int64_t count = plan_items(totals.data(), B * H, kv_chunk, nullptr, nullptr);
    std::vector<WorkItem> items(static_cast<std::size_t>(count));
    plan_items(totals.data(), B * H, kv_chunk, items.data(), first.data());
    std::vector<std::int64_t> wf(static_cast<std::size_t>(workers) + 1);
    plan_balance(items.data(), count, workers, wf.data());
    detail::check_arg(items.size() <= static_cast<std::size_t>(INT_MAX), where, "work items",
                      items.size(), "must be <= INT_MAX");
    commit_common(args, workers, kv_chunk);
    totals_ = std::move(totals);
    first_item_ = std::move(first);
    items_ = std::move(items);
    worker_first_ = std::move(wf);
    uniform_plan_ = DecodePlan();
    uniform_ = false;
  }

  /// Bytes of workspace a run needs (one partial result per work item).
  std::size_t workspace_bytes() const {
    if (uniform_) return uniform_plan_.workspace_bytes();
    const std::int64_t G = shape_[1] > 0 ? shape_[0] / shape_[1] : 1;
    return cpu::detail::decode_workspace_bytes(G, shape_[2], shape_[3],
                                               static_cast<int>(items_.size()),
                                               "phasekv::StaggeredDecodePlan::workspace_bytes");
  }
  /// True once plan() succeeded.
  bool planned() const { return planned_; }
  /// True when the origins were equal: the runs take the uniform path (uniform_plan()).
  bool uniform() const { return uniform_; }
  /// The uniform path's plan (meaningful when uniform()).
  const DecodePlan& uniform_plan() const { return uniform_plan_; }
  /// Workers the items are balanced over.
  int workers() const { return workers_; }
  /// Visible items per work item.
  std::int64_t kv_chunk() const { return kv_chunk_; }
  /// Sequences in the batch.
  std::int64_t batch() const { return record_.batch(); }
  /// The per-head work items (empty when uniform()); `sequence` is `b * kv_heads + h`.
  const std::vector<WorkItem>& items() const { return items_; }
  /// Items of (b, h): `[first_item()[b * kv_heads + h], first_item()[b * kv_heads + h + 1])`.
  const std::vector<std::int64_t>& first_item() const { return first_item_; }
  /// Items of worker w: `[worker_first()[w], worker_first()[w + 1])`.
  const std::vector<std::int64_t>& worker_first() const { return worker_first_; }
  /// Visible items of each (sequence, KV head), index `b * kv_heads + h`.
  const std::vector<std::int64_t>& totals() const { return totals_; }

  /// Checks that the plan is planned and `kv`'s fields (geometry, local window, ring, pools)
  /// are the planned ones (the uniform path's runs check the rest).
  template <class T>
  void check_geometry(const StaggeredPagedKV<T>& kv, const char* where) const {
    detail::check_arg(planned_, where, "plan", "empty", "call StaggeredDecodePlan::plan first");
    record_.check_fields(kv, where);
  }

  /// Checks that `args` is what this plan was made for (detail::check_decode_run, as the
  /// uniform DecodePlan); throws phasekv::invalid_argument naming the first field that differs.
  template <class T, class Variant>
  void check_run(const StaggeredBatchDecodeArgs<T, Variant>& args, const char* where,
                 bool need_out) const {
    check_geometry(args.kv, where);
    if (uniform_) {
      uniform_plan_.check_run(args.uniform(), where, need_out);
      return;
    }
    check_shape(args.q_heads, args.kv_heads, args.d_k, args.d_v, where);
    detail::check_decode_run(args, record_, shape_, where, need_out);
  }

 private:
  static void check_shape(std::int64_t hq, std::int64_t hkv, std::int64_t dk, std::int64_t dv,
                          const char* where) {
    detail::check_arg(hq >= 1, where, "q_heads", hq, "must be >= 1");
    detail::check_arg(hkv >= 1, where, "kv_heads", hkv, "must be >= 1");
    detail::check_arg<shape_error>(hq % hkv == 0, where, "q_heads", hq,
                                   "must be a multiple of kv_heads");
    detail::check_arg<shape_error>(dk >= 1, where, "d_k", dk, "must be >= 1");
    detail::check_arg<shape_error>(dv >= 1, where, "d_v", dv, "must be >= 1");
  }
  template <class T, class Variant>
  void commit_common(const StaggeredBatchDecodeArgs<T, Variant>& args, int workers,
                     std::int64_t kv_chunk) {
    record_.record(args.kv, nullptr);
    workers_ = workers;
    kv_chunk_ = kv_chunk;
    shape_[0] = args.q_heads, shape_[1] = args.kv_heads, shape_[2] = args.d_k, shape_[3] = args.d_v;
    planned_ = true;
  }

  DecodePlan uniform_plan_;
  bool uniform_ = false;
  PlanRecord record_;
  std::vector<std::int64_t> totals_, first_item_, worker_first_;
  std::vector<WorkItem> items_;
  int workers_ = 0;
  std::int64_t kv_chunk_ = 0;
  std::int64_t shape_[4] = {0, 0, 0, 0};  // q_heads, kv_heads, d_k, d_v
  bool planned_ = false;
};

namespace detail {

inline void check_staggered_workspace(const StaggeredDecodePlan& plan, const void* ws,
                                      std::size_t bytes, const char* where) {
  check_arg(ws != nullptr || plan.items().empty(), where, "workspace", "null",
            "must point to StaggeredDecodePlan::workspace_bytes() bytes");
  check_arg<capacity_error>(bytes >= plan.workspace_bytes(), where, "workspace_bytes", bytes,
                            "must be >= StaggeredDecodePlan::workspace_bytes()");
}

}  // namespace detail

/// Runs the work items of worker `worker_index` of `worker_count` (= plan.workers()) into
/// `workspace`; then call staggered_batch_decode_merge. Each (sequence, KV head) item runs the
/// decode kernel over that head's visible set alone (its prefix, its J_h entries, its raw
/// tail, read through the pages) for the head's query group. Never allocates.
template <class Arch = cpu::arch::Auto, class T, class Variant>
void staggered_batch_decode_partition(const StaggeredDecodePlan& plan,
                                      const StaggeredBatchDecodeArgs<T, Variant>& args,
                                      void* workspace, std::size_t workspace_bytes,
                                      int worker_index, int worker_count) {
  const char* where = "phasekv::staggered_batch_decode_partition";
  if (plan.uniform()) {
    plan.check_geometry(args.kv, where);
    batch_decode_partition<Arch>(plan.uniform_plan(), args.uniform(), workspace, workspace_bytes,
                                 worker_index, worker_count);
    return;
  }
  cpu::check_partition(where, worker_index, worker_count);
  plan.check_run(args, where, false);
  detail::check_arg(worker_count == plan.workers(), where, "worker_count", worker_count,
                    "must equal the plan's workers()");
  detail::check_staggered_workspace(plan, workspace, workspace_bytes, where);
  const std::int64_t H = args.kv_heads, G = args.q_heads / H;
  const std::int64_t slot_floats = cpu::detail::decode_slot_floats(G, args.d_k, args.d_v);
  float* ws = cpu::detail::decode_workspace_base<float>(workspace);
  const std::int64_t ro = args.kv.ring_origin();
  const std::int64_t i0 = plan.worker_first()[static_cast<std::size_t>(worker_index)];
  const std::int64_t i1 = plan.worker_first()[static_cast<std::size_t>(worker_index) + 1];
  using HV = decltype(cpu::slice_variant(args.variant, 0));
  cpu::DecodeArgs<T, HV> d;
  d.q_heads = G;
  d.kv_heads = 1;
  d.d_k = args.d_k;
  d.d_v = args.d_v;
  for (std::int64_t i = i0; i < i1; ++i) {
    const WorkItem& w = plan.items()[static_cast<std::size_t>(i)];
    const std::int64_t b = w.sequence / H, kh = w.sequence % H;
    const PagedKV<T> head = detail::staggered_head_kv(args.kv, kh);  // src points into it
    detail::PagedSequenceRows<T> src(head, b);
    src.ring_origin = ro;  // the slots follow O_max, the visible set head kh's origin
    d.q = args.q + (b * args.q_heads + kh * G) * args.d_k;
    d.variant = cpu::slice_variant(args.variant, kh * G);
    float* slot = ws + slot_floats * i;
    cpu::detail::with_arch<Arch>([&](auto tag) {
      using A = decltype(tag);
      kernel_decode_rows(cpu::detail::target_t<A>{}, tag, d, src, slot, w.begin, w.end);
    });
  }
}

/// Merges the partial results into `args.out` / `args.lse` in a fixed item order (the bits do
/// not depend on the workers), applying the sinks; the (sequence, query head) pairs may be
/// split over callers with (`merge_index`, `merge_count`).
template <class T, class Variant>
void staggered_batch_decode_merge(const StaggeredDecodePlan& plan,
                                  const StaggeredBatchDecodeArgs<T, Variant>& args,
                                  const void* workspace, std::size_t workspace_bytes,
                                  int merge_index = 0, int merge_count = 1) {
  const char* where = "phasekv::staggered_batch_decode_merge";
  if (plan.uniform()) {
    plan.check_geometry(args.kv, where);
    batch_decode_merge(plan.uniform_plan(), args.uniform(), workspace, workspace_bytes, merge_index,
                       merge_count);
    return;
  }
  cpu::check_partition(where, merge_index, merge_count);
  plan.check_run(args, where, true);
  detail::check_staggered_workspace(plan, workspace, workspace_bytes, where);
  const std::int64_t hq = args.q_heads, H = args.kv_heads, G = hq / H, dv = args.d_v;
  const std::int64_t slot_floats = cpu::detail::decode_slot_floats(G, args.d_k, dv);
  const float* ws = cpu::detail::decode_workspace_base<const float>(workspace);
  const cpu::WorkRange r = cpu::partition_range(plan.batch() * hq, merge_index, merge_count);
  for (std::int64_t bh = r.begin; bh < r.end; ++bh) {
    const std::int64_t b = bh / hq, h = bh % hq, kh = h / G, g = h % G;
    float* o = args.out + bh * dv;
    float l = neg_inf();
    for (std::int64_t i = 0; i < dv; ++i) o[i] = 0.0f;
    const std::size_t pair = static_cast<std::size_t>(b * H + kh);
    for (std::int64_t it = plan.first_item()[pair]; it < plan.first_item()[pair + 1]; ++it) {
      const float* acc = ws + slot_floats * it;
      merge_partial(o, l, acc + g * dv, acc[G * dv + g], dv);
    }
    if (args.variant.has_sink()) apply_sink(o, l, args.variant.sink(h), dv);
    args.lse[bh] = l;
  }
}

/// The whole step on the calling thread. Never allocates.
template <class Arch = cpu::arch::Auto, class T, class Variant>
void staggered_batch_decode(const StaggeredDecodePlan& plan,
                            const StaggeredBatchDecodeArgs<T, Variant>& args, void* workspace,
                            std::size_t workspace_bytes) {
  plan.check_run(args, "phasekv::staggered_batch_decode", true);
  for (int w = 0; w < plan.workers(); ++w)
    staggered_batch_decode_partition<Arch>(plan, args, workspace, workspace_bytes, w,
                                           plan.workers());
  staggered_batch_decode_merge(plan, args, workspace, workspace_bytes);
}

/// The whole step on `pool` (whose size must equal plan.workers()). Never allocates.
template <class Arch = cpu::arch::Auto, class T, class Variant>
void staggered_batch_decode_parallel(const StaggeredDecodePlan& plan,
                                     const StaggeredBatchDecodeArgs<T, Variant>& args,
                                     cpu::ThreadPool& pool, void* workspace,
                                     std::size_t workspace_bytes) {
  const char* where = "phasekv::staggered_batch_decode_parallel";
  plan.check_run(args, where, true);
  detail::check_arg(pool.size() == plan.workers(), where, "pool.size()", pool.size(),
                    "must equal the plan's workers()");
  pool.run([&](int i, int count) {
    staggered_batch_decode_partition<Arch>(plan, args, workspace, workspace_bytes, i, count);
  });
  pool.run([&](int i, int count) {
    staggered_batch_decode_merge(plan, args, workspace, workspace_bytes, i, count);
  });
}

// ---------------------------------------------------------------------------------------------
// Batched streaming compression

/// The checks of paged_append_staggered: `origins` (check_origins), the policies (origin 0,
/// same W and S), the new tokens and the lengths (as check_paged_append), and the tables
/// against the lengths after the append in the staggered layout (check_staggered_paged_kv).
/// Returns the lengths after the append.
template <class T, class KeyPolicy, class ValuePolicy>
std::vector<std::int64_t> check_paged_append_staggered(const KeyPolicy& key_policy,
                                                       const ValuePolicy& value_policy,
                                                       const std::vector<std::int64_t>& origins,
                                                       std::int64_t local,
                                                       const PagedAppendArgs<T>& a,
                                                       const char* where) {
  std::vector<std::int64_t> after =
      detail::check_paged_append_inputs(key_policy, value_policy, local, a, where);
  const std::int64_t H = a.raw_pool.heads;
  check_origins(where, origins, H);
  resolve_origins(where, key_policy.geometry(), origins, H, "key_policy");
  resolve_origins(where, value_policy.geometry(), origins, H, "value_policy");
  StaggeredPagedKV<T> kv;  // the storage as it will be after the append
  kv.raw_pool = a.raw_pool;
  kv.raw_table = a.raw_table;
  kv.entry_pool = a.entry_pool;
  kv.entry_table = a.entry_table;
  kv.lengths = after.data();
  kv.batch = a.batch;
  kv.geometry = Geometry(key_policy.geometry().window(), key_policy.geometry().stride());
  kv.origins = origins;
  kv.local = local;
  kv.ring_slots = a.ring_slots;
  check_staggered_paged_kv(kv, H, a.raw_pool.d_k, a.raw_pool.d_v, where, true);
  return after;
}

/// paged_append with per-KV-head origins: KV head h of every sequence emits the entries of its
/// own windows `[O_h + j*S, O_h + j*S + W)` that complete in the new tokens (policy head h,
/// origin O_h: CompressedCache's bits with these origins), into slot j of the sequence's entry
/// pages; the raw tokens go to the raw pages (all of them, or the ring with origin O_max; see the
/// file comment). The policies must have origin 0 (`origins[h]` is head h's origin) and the same W
/// and S. With all origins 0 this is paged_append.
///
/// Processes the sequences `[partition_range(batch, thread_index, thread_count))`. Everything
/// is checked first (check_paged_append_staggered): a bad argument throws
/// phasekv::invalid_argument (or shape_error / capacity_error) naming it, and nothing is
/// written. The caller updates its lengths afterwards.
template <class T, class KeyPolicy, class ValuePolicy>
void paged_append_staggered(const KeyPolicy& key_policy, const ValuePolicy& value_policy,
                            const std::vector<std::int64_t>& origins, std::int64_t local,
                            const PagedAppendArgs<T>& a, int thread_index = 0,
                            int thread_count = 1) {
  const char* where = "phasekv::paged_append_staggered";
  cpu::check_partition(where, thread_index, thread_count);
  const std::vector<std::int64_t> after =
      check_paged_append_staggered(key_policy, value_policy, origins, local, a, where);
  bool zero = true;
  for (std::int64_t o : origins) zero = zero && o == 0;
  if (zero) {
    paged_append(key_policy, value_policy, local, a, thread_index, thread_count);
    return;
  }
  const std::int64_t H = a.raw_pool.heads, dk = a.raw_pool.d_k, dv = a.raw_pool.d_v;
  const std::int64_t W = key_policy.geometry().window(), S = key_policy.geometry().stride();
  std::int64_t ro = 0;
  for (std::int64_t o : origins) ro = o > ro ? o : ro;
  const std::int64_t dmax = dk > dv ? dk : dv;
  std::vector<float> out(static_cast<std::size_t>(dmax));
  std::vector<T> win(static_cast<std::size_t>(detail::gather_elements(W, dmax)));
  // head h as a policy of its own with origin O_h (CompressedCache's view of it), for the window
  // loop
  std::vector<HeadPolicy<KeyPolicy>> kh;
  std::vector<HeadPolicy<ValuePolicy>> vh;
  for (std::int64_t h = 0; h < H; ++h) {
    kh.emplace_back(key_policy, h, origins[static_cast<std::size_t>(h)]);
    vh.emplace_back(value_policy, h, origins[static_cast<std::size_t>(h)]);
  }
  const cpu::WorkRange part = cpu::partition_range(a.batch, thread_index, thread_count);
  for (std::int64_t b = part.begin; b < part.end; ++b) {
    const std::int64_t n0 = a.lengths[b], n1 = after[static_cast<std::size_t>(b)];
    const std::int64_t row0 = a.new_indptr[b];
    // 1. each head's entries of the windows completing in [n0, n1), before any raw slot is
    //    overwritten (window j of head h: HeadPolicy(key_policy, h, O_h)'s window j)
    for (std::int64_t h = 0; h < H; ++h) {
      const std::size_t hs = static_cast<std::size_t>(h);
      detail::paged_append_entries(key_policy, value_policy, kh[hs], vh[hs],
                                   Geometry(W, S, origins[hs]), a, b, h, 1, n0, n1, ro, out.data(),
                                   win);
    }
    // 2. raw tokens: with a ring only the positions below O_max and the last ring_slots land
    detail::paged_append_raw(a, b, n0, n1, row0, ro);
  }
}

PHASEKV_NAMESPACE_END
