/// @file
/// @brief Batch decode over paged storage: one query token for each of B sequences, each with
/// its own length n_b (so its own J(n_b), raw tail and phase), in the plan/run life cycle.
///
/// 1. `DecodePlan::plan` (host, allocates, once per step): validates the block tables, splits
///    every sequence's visible set into KV chunks of a fixed size and balances the chunks over
///    the workers. The same plan serves every layer of the step (same lengths and tables, any
///    pools of the same shape).
/// 2. Workspace: `plan.workspace_bytes()` (two-call pattern: ask, allocate, run).
/// 3. Run, per layer: `batch_decode_partition(plan, args, ws, bytes, w, workers)` on every
///    worker w (an engine's own pool), then `batch_decode_merge` (split over the workers as
///    well, or all at once), or `batch_decode` / `batch_decode_parallel` for both. The run never
///    allocates.
///
/// Results are the same bits for any worker count and any page size (blocks of kDecodeBlock
/// visible items whose rows are found through the pages), and, for a sequence whose visible
/// set fits one chunk, the same bits as cpu::decode over the same keys in contiguous buffers.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <string>
#include <vector>

#include "phasekv/attention/cpu/decode.hpp"
#include "phasekv/attention/cpu/thread_pool.hpp"
#include "phasekv/attention/cpu/variant_check.hpp"
#include "phasekv/attention/params.hpp"
#include "phasekv/attention/softmax_state.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/serving/paged.hpp"
#include "phasekv/serving/paged_check.hpp"
#include "phasekv/serving/plan.hpp"

PHASEKV_NAMESPACE_BEGIN

/// Default KV chunk (visible items per work item) of DecodePlan.
inline constexpr std::int64_t kDefaultKvChunk = 1024;

/// Everything one batch decode call needs (one layer).
///
/// @tparam T storage type of keys and values (float, bf16_t, f16_t).
/// @tparam Variant logit hooks (StandardVariant or a user struct with the same members).
/// @tparam Q element type of the queries and outputs (float, bf16_t, f16_t): queries are
///   widened to f32, everything accumulates in f32, outputs are rounded once; lse is f32.
template <class T, class Variant = StandardVariant, class Q = float>
struct BatchDecodeArgs {
  const Q* q = nullptr;       ///< Queries `[batch, q_heads, d_k]`: one token per sequence.
  std::int64_t q_heads = 0;   ///< Query heads Hq (a multiple of kv_heads).
  std::int64_t kv_heads = 0;  ///< KV heads Hkv.
  std::int64_t d_k = 0;       ///< Key head dim.
  std::int64_t d_v = 0;       ///< Value head dim.
  PagedKV<T> kv;              ///< Pools, tables, lengths and visibility rule.
  Variant variant{};          ///< Logit transform, entry bias, sinks (shared by the batch).
  Q* out = nullptr;           ///< Output `[batch, q_heads, d_v]`.
  float* lse = nullptr;       ///< Log-sum-exp `[batch, q_heads]` (-inf where nothing is visible).
};

namespace detail {

/// The visible set of one paged sequence as the decode kernel's row source (see
/// cpu::detail::decode_range_rows): up to three segments (prefix, entries, raw range) in
/// position order, empty ones left out, whose rows are found through the block tables.
template <class T>
struct PagedSequenceRows {
  PagePool<const T> pool[3];          ///< Pool of each segment.
  const BlockTable* table[3];         ///< Table of each segment.
  std::int64_t first[3] = {0, 0, 0};  ///< First position (raw) or entry index.
  std::int64_t count[3] = {0, 0, 0};  ///< Items of each segment.
  SegmentKind what[3] = {SegmentKind::prefix, SegmentKind::prefix, SegmentKind::prefix};
  int n = 0;                     ///< Segments in use.
  std::int64_t b = 0;            ///< Sequence.
  std::int64_t ring_origin = 0;  ///< See PagedKV::raw_slot.
  std::int64_t ring_slots = 0;   ///< See PagedKV::raw_slot.

  /// Builds the row source of sequence `b` of `kv`.
  PagedSequenceRows(const PagedKV<T>& kv, std::int64_t seq) : b(seq) {
    ring_origin = kv.ring_origin();
    ring_slots = kv.ring_slots;
    const Visibility vis = kv.rule.at(kv.lengths[seq]);
    push(kv.raw_pool, &kv.raw_table, 0, vis.prefix_end, SegmentKind::prefix);
    push(kv.entry_pool, &kv.entry_table, 0, vis.entries, SegmentKind::compressed);
    push(kv.raw_pool, &kv.raw_table, vis.raw_begin, vis.raw_count(), SegmentKind::raw);
  }
  void push(const PagePool<const T>& p, const BlockTable* t, std::int64_t f, std::int64_t c,
            SegmentKind k) {
    if (c <= 0) return;
    pool[n] = p;
    table[n] = t;
    first[n] = f;
    count[n] = c;
    what[n] = k;
    ++n;
  }
  /// Visible items in all segments.
  std::int64_t total() const { return count[0] + count[1] + count[2]; }
  /// Segments in use.
  int segments() const { return n; }
  /// Items of segment si.
  std::int64_t size(int si) const { return count[si]; }
  /// Kind of segment si.
  SegmentKind kind(int si) const { return what[si]; }
  /// Elements between heads of a key slot in segment si's pool.
  std::int64_t key_head_stride(int si) const { return pool[si].key_head_stride(); }
  /// Elements between heads of a value slot in segment si's pool.
  std::int64_t value_head_stride(int si) const { return pool[si].value_head_stride(); }
  /// True when a head's slots are adjacent inside segment si's pages (HND).
  bool head_major(int si) const { return pool[si].key_head_stride() > pool[si].key_slot_stride(); }
  /// Head-0 key and value row pointers of items `[t0, t0 + nt)` of segment si.
  void rows(int si, std::int64_t t0, std::int64_t nt, const T** kr, const T** vr) const {
    const PagePool<const T>& p = pool[si];
    const BlockTable& tb = *table[si];
    const bool raw = what[si] != SegmentKind::compressed;
    const std::int64_t ps = p.page_size, kss = p.key_slot_stride(), vss = p.value_slot_stride();
    std::int64_t item = first[si] + t0;
    std::int64_t slot = raw ? PagedKV<T>::raw_slot(item, ring_origin, ring_slots) : item;
    std::int64_t page = tb.page(b, slot / ps), in = slot % ps;
    const T* kb = p.keys + page * p.key_page_stride;
    const T* vb = p.values + page * p.value_page_stride;
    for (std::int64_t t = 0; t < nt; ++t) {
      kr[t] = kb + in * kss;
      vr[t] = vb + in * vss;
      if (t + 1 == nt) break;
      ++item;
      ++slot;
      ++in;
      if (raw && ring_slots > 0 && item > ring_origin &&
          slot == ring_origin + ring_slots) {  // the ring wraps
        slot = ring_origin;
        in = ps;  // forces a page lookup below
      }
      if (in == ps) {
        page = tb.page(b, slot / ps);
        in = slot % ps;
        kb = p.keys + page * p.key_page_stride;
        vb = p.values + page * p.value_page_stride;
      }
    }
  }
};

}  // namespace detail

namespace detail {

/// The per-run checks of a batch decode (uniform, or per-head origins) against its plan: the
/// planned head shape `shape` = {q_heads, kv_heads, d_k, d_v}, the query and output pointers,
/// the variant, and everything `record` holds (PlanRecord::check).
template <class Args>
void check_decode_run(const Args& args, const PlanRecord& record, const std::int64_t* shape,
                      const char* where, bool need_out) {
  check_planned_heads(args, shape, where);
  check_arg(args.q != nullptr || args.kv.batch == 0, where, "q", "null",
            "must point to [batch, q_heads, d_k] floats");
  if (need_out) {
    check_arg(args.out != nullptr || args.kv.batch == 0, where, "out", "null",
              "must point to [batch, q_heads, d_v] floats");
    check_arg(args.lse != nullptr || args.kv.batch == 0, where, "lse", "null",
              "must point to [batch, q_heads] floats");
  }
  record.check(args.kv, nullptr, where);
  cpu::detail::check_variant(args.variant, where);
}

}  // namespace detail

/// The host plan of a batch decode step: the work items (sequence, KV chunk) and their
/// balance over the workers. Build it once per step with plan(); it serves every layer whose
/// args have the same lengths, tables, rule and head shape (the pools may differ per layer).
/// The tables must not change between plan() and the runs that use it.
class DecodePlan {
 public:
  /// Plans a step for `args` (its q, out, lse and pool data are not read) over `workers`
  /// workers with KV chunks of `kv_chunk` visible items (a multiple of 64; results depend on
  /// it, never on `workers`). Validates everything the runs rely on (check_paged_kv with the
  /// overlap check): throws phasekv::invalid_argument (or shape_error / capacity_error) naming
  /// the argument, the sequence and the index; the plan is unchanged then.
  template <class T, class Variant, class Q>
  void plan(const BatchDecodeArgs<T, Variant, Q>& args, int workers,
            std::int64_t kv_chunk = kDefaultKvChunk) {
    const char* where = "phasekv::DecodePlan::plan";
    check_shape(args, where);
    detail::check_arg(workers >= 1, where, "workers", workers, "must be >= 1");
    const std::int64_t block = cpu::detail::kDecodeBlock;
    detail::check_arg(kv_chunk >= block && kv_chunk % block == 0 && kv_chunk <= (1LL << 40), where,
                      "kv_chunk", kv_chunk, "must be a positive multiple of 64, <= 2^40");
    check_paged_kv(args.kv, args.kv_heads, args.d_k, args.d_v, where, true, true);
    std::vector<OriginRun> runs = detail::paged_origin_runs(args.kv, args.kv_heads);
    const std::int64_t R = static_cast<std::int64_t>(runs.size()), units = args.kv.batch * R;
    std::vector<std::int64_t> totals(static_cast<std::size_t>(units));
    for (std::int64_t b = 0; b < args.kv.batch; ++b)
      for (std::int64_t r = 0; r < R; ++r)
        totals[static_cast<std::size_t>(b * R + r)] =
            args.kv.head_rule(runs[static_cast<std::size_t>(r)].head)
                .at(args.kv.lengths[b])
                .total();
    std::vector<std::int64_t> first(static_cast<std::size_t>(units + 1));
    const std::int64_t count = plan_items(totals.data(), units, kv_chunk, nullptr, nullptr);
    std::vector<WorkItem> items(static_cast<std::size_t>(count));
    plan_items(totals.data(), units, kv_chunk, items.data(), first.data());
    std::vector<std::int64_t> head_run(static_cast<std::size_t>(args.kv_heads));
    for (std::int64_t r = 0; r < R; ++r)
      for (std::int64_t c = 0; c < runs[static_cast<std::size_t>(r)].count; ++c)
        head_run[static_cast<std::size_t>(runs[static_cast<std::size_t>(r)].head + c)] = r;
    std::vector<std::int64_t> wf(static_cast<std::size_t>(workers) + 1);
    plan_balance(items.data(), count, workers, wf.data());
    PlanRecord record;
    record.record(args.kv, nullptr);
    // commit
    record_ = std::move(record);
    totals_ = std::move(totals);
    first_item_ = std::move(first);
    items_ = std::move(items);
    worker_first_ = std::move(wf);
    runs_ = std::move(runs);
    head_run_ = std::move(head_run);
    workers_ = workers;
    kv_chunk_ = kv_chunk;
    shape_[0] = args.q_heads, shape_[1] = args.kv_heads, shape_[2] = args.d_k, shape_[3] = args.d_v;
    q_bytes_ = sizeof(Q);
    planned_ = true;
  }

  /// Bytes of workspace a run of this plan needs: one partial result per work item, and with
  /// bf16 / f16 queries one f32 copy of a query per worker (query_floats()).
  /// Throws phasekv::invalid_argument when that many bytes overflow `size_t`.
  std::size_t workspace_bytes() const {
    const char* where = "phasekv::DecodePlan::workspace_bytes";
    phasekv::detail::check_arg(items_.size() <= static_cast<std::size_t>(INT_MAX), where,
                               "work items", items_.size(), "must be <= INT_MAX");
    const std::size_t slots = cpu::detail::decode_workspace_bytes(
        shape_[0], shape_[2], shape_[3], static_cast<int>(items_.size()), where);
    const std::size_t w = static_cast<std::size_t>(workers_ > 0 ? workers_ : 1);
    const std::size_t per = static_cast<std::size_t>(query_floats());
    phasekv::detail::check_arg(per <= (SIZE_MAX - slots) / sizeof(float) / w, where,
                               "q_heads * d_k", shape_[0] * shape_[2],
                               "the workspace of this many workers overflows size_t");
    const std::size_t extra = per * w * sizeof(float);
    return slots + extra;
  }
  /// Floats of each worker's f32 copy of a query (0 for f32 queries), after the item slots.
  std::int64_t query_floats() const {
    return q_bytes_ == sizeof(float) ? 0 : (shape_[0] * shape_[2] + 15) / 16 * 16;
  }
  /// True once plan() succeeded.
  bool planned() const { return planned_; }
  /// Workers the items are balanced over.
  int workers() const { return workers_; }
  /// Visible items per work item.
  std::int64_t kv_chunk() const { return kv_chunk_; }
  /// Sequences in the batch.
  std::int64_t batch() const { return record_.batch(); }
  /// The runs of consecutive KV heads with one origin (kv.origins): one run of every head
  /// without per-head origins. Work is planned per (sequence, run): unit `b * runs().size() + r`.
  const std::vector<OriginRun>& runs() const { return runs_; }
  /// The work items, in (sequence, run, chunk) order; an item's `sequence` field is its unit
  /// `b * runs().size() + r` (the sequence itself without per-head origins).
  const std::vector<WorkItem>& items() const { return items_; }
  /// Items of unit u: `[first_item()[u], first_item()[u + 1])`.
  const std::vector<std::int64_t>& first_item() const { return first_item_; }
  /// Items of worker w: `[worker_first()[w], worker_first()[w + 1])`.
  const std::vector<std::int64_t>& worker_first() const { return worker_first_; }
  /// Visible items of each unit (each run's own visible set).
  const std::vector<std::int64_t>& totals() const { return totals_; }
  /// The run of KV head `kh`.
  std::int64_t run_of_head(std::int64_t kh) const {
    return head_run_[static_cast<std::size_t>(kh)];
  }

  /// What the plan was made for (checked by every run).
  const PlanRecord& record() const { return record_; }

  /// Checks that `args` is what this plan was made for (detail::check_decode_run: head shape,
  /// pointers, PlanRecord::check), in O(sequences + used table entries). Throws
  /// phasekv::invalid_argument naming the first field that differs.
  template <class T, class Variant, class Q>
  void check_run(const BatchDecodeArgs<T, Variant, Q>& args, const char* where,
                 bool need_out) const {
    detail::check_arg(planned_, where, "plan", "empty", "call DecodePlan::plan first");
    check_shape(args, where);
    detail::check_arg(sizeof(Q) == q_bytes_, where, "sizeof(*q)", sizeof(Q),
                      "the query and output type must have the planned size (plan again)");
    detail::check_decode_run(args, record_, shape_, where, need_out);
  }

 private:
  template <class T, class Variant, class Q>
  static void check_shape(const BatchDecodeArgs<T, Variant, Q>& a, const char* where) {
    detail::check_arg(a.q_heads >= 1, where, "q_heads", a.q_heads, "must be >= 1");
    detail::check_arg(a.kv_heads >= 1, where, "kv_heads", a.kv_heads, "must be >= 1");
    detail::check_arg<shape_error>(a.q_heads % a.kv_heads == 0, where, "q_heads", a.q_heads,
                                   "must be a multiple of kv_heads");
    detail::check_arg<shape_error>(a.d_k >= 1, where, "d_k", a.d_k, "must be >= 1");
    detail::check_arg<shape_error>(a.d_v >= 1, where, "d_v", a.d_v, "must be >= 1");
  }

  PlanRecord record_;
  std::vector<std::int64_t> totals_, first_item_, worker_first_, head_run_;
  std::vector<WorkItem> items_;
  std::vector<OriginRun> runs_;
  int workers_ = 0;
  std::int64_t kv_chunk_ = 0;
  std::int64_t shape_[4] = {0, 0, 0, 0};  // q_heads, kv_heads, d_k, d_v
  std::size_t q_bytes_ = sizeof(float);   // element size of the queries and outputs
  bool planned_ = false;
};

namespace detail {

inline void check_workspace(const DecodePlan& plan, const void* ws, std::size_t bytes,
                            const char* where) {
  detail::check_arg(ws != nullptr || plan.items().empty(), where, "workspace", "null",
                    "must point to DecodePlan::workspace_bytes() bytes");
  detail::check_arg<capacity_error>(bytes >= plan.workspace_bytes(), where, "workspace_bytes",
                                    bytes, "must be >= DecodePlan::workspace_bytes()");
}

}  // namespace detail

/// Runs the work items of worker `worker_index` of `worker_count` (which must equal
/// plan.workers()) into `workspace`. Call it for every worker (concurrently if you like), then
/// batch_decode_merge. Does not write `args.out` / `args.lse`; never allocates.
///
/// @tparam Arch the instruction set (arch::Auto: chosen at run time, as cpu::decode).
template <class Arch = cpu::arch::Auto, class T, class Variant, class Q>
void batch_decode_partition(const DecodePlan& plan, const BatchDecodeArgs<T, Variant, Q>& args,
                            void* workspace, std::size_t workspace_bytes, int worker_index,
                            int worker_count) {
  const char* where = "phasekv::batch_decode_partition";
  cpu::check_partition(where, worker_index, worker_count);
  plan.check_run(args, where, false);
  detail::check_arg(worker_count == plan.workers(), where, "worker_count", worker_count,
                    "must equal the plan's workers()");
  detail::check_workspace(plan, workspace, workspace_bytes, where);
  const std::int64_t slot_floats =
      cpu::detail::decode_slot_floats(args.q_heads, args.d_k, args.d_v);
  float* ws = cpu::detail::decode_workspace_base<float>(workspace);
  const std::int64_t i0 = plan.worker_first()[static_cast<std::size_t>(worker_index)];
  const std::int64_t i1 = plan.worker_first()[static_cast<std::size_t>(worker_index) + 1];
  const std::int64_t R = static_cast<std::int64_t>(plan.runs().size());
  const std::int64_t G = args.q_heads / args.kv_heads;
  // bf16 / f16 queries: widened once per sequence into this worker's f32 copy
  float* qf = ws + slot_floats * static_cast<std::int64_t>(plan.items().size()) +
              plan.query_floats() * worker_index;
  std::int64_t widened = -1;
  const auto query = [&](std::int64_t b) -> const float* {
    const Q* q = args.q + b * args.q_heads * args.d_k;
    if constexpr (std::is_same<Q, float>::value) {
      return q;
    } else {
      if (b != widened)
        for (std::int64_t e = 0; e < args.q_heads * args.d_k; ++e) qf[e] = to_float(q[e]);
      widened = b;
      return qf;
    }
  };
  const auto run = [&](auto& d, const detail::PagedSequenceRows<T>& src, const WorkItem& w,
                       std::int64_t i) {
    float* slot = ws + slot_floats * i;
    cpu::detail::with_arch<Arch>([&](auto tag) {
      using A = decltype(tag);
      kernel_decode_rows(cpu::detail::target_t<A>{}, tag, d, src, slot, w.begin, w.end);
    });
  };
  if (R == 1) {  // every KV head in one pass (the uniform layout)
    cpu::DecodeArgs<T, Variant> d;
    d.q_heads = args.q_heads;
    d.kv_heads = args.kv_heads;
    d.d_k = args.d_k;
    d.d_v = args.d_v;
    d.variant = args.variant;
    const PagedKV<T> kv = detail::origin_run_view(args.kv, plan.runs()[0]);  // src points into it
    for (std::int64_t i = i0; i < i1; ++i) {
      const WorkItem& w = plan.items()[static_cast<std::size_t>(i)];
      const detail::PagedSequenceRows<T> src(kv, w.sequence);
      d.q = query(w.sequence);
      run(d, src, w, i);
    }
    return;
  }
  // per-head origins: each run of heads with one origin over its own visible set, its raw
  // slots placed from O_max
  const std::int64_t ro = args.kv.ring_origin();
  using HV = decltype(cpu::slice_variant(args.variant, 0));
  cpu::DecodeArgs<T, HV> d;
  d.d_k = args.d_k;
  d.d_v = args.d_v;
  for (std::int64_t i = i0; i < i1; ++i) {
    const WorkItem& w = plan.items()[static_cast<std::size_t>(i)];
    const std::int64_t b = w.sequence / R;
    const OriginRun& r = plan.runs()[static_cast<std::size_t>(w.sequence % R)];
    const PagedKV<T> kv = detail::origin_run_view(args.kv, r);  // src points into it
    detail::PagedSequenceRows<T> src(kv, b);
    src.ring_origin = ro;
    d.q_heads = G * r.count;
    d.kv_heads = r.count;
    d.q = query(b) + r.head * G * args.d_k;
    d.variant = cpu::slice_variant(args.variant, r.head * G);
    run(d, src, w, i);
  }
}

/// Merges the partial results of every work item, sequence by sequence in item order (a fixed
/// order: the bits do not depend on the workers), into `args.out` / `args.lse`, applying the
/// variant's sinks; the outputs are rounded to Q once, at the end. The (sequence, head) pairs
/// may be split over callers with (`merge_index`, `merge_count`); the default merges all.
template <class T, class Variant, class Q>
void batch_decode_merge(const DecodePlan& plan, const BatchDecodeArgs<T, Variant, Q>& args,
                        const void* workspace, std::size_t workspace_bytes, int merge_index = 0,
                        int merge_count = 1) {
  const char* where = "phasekv::batch_decode_merge";
  cpu::check_partition(where, merge_index, merge_count);
  plan.check_run(args, where, true);
  detail::check_workspace(plan, workspace, workspace_bytes, where);
  const std::int64_t slot_floats =
      cpu::detail::decode_slot_floats(args.q_heads, args.d_k, args.d_v);
  const float* ws = cpu::detail::decode_workspace_base<const float>(workspace);
  const std::int64_t hq = args.q_heads, dv = args.d_v;
  const cpu::WorkRange r = cpu::partition_range(plan.batch() * hq, merge_index, merge_count);
  // merged in column tiles of kTile floats (the merge is element-wise: the same bits as a
  // whole row), each stored as Q
  constexpr std::int64_t kTile = 64;
  float o[kTile];
  const std::int64_t R = static_cast<std::int64_t>(plan.runs().size()), G = hq / args.kv_heads;
  for (std::int64_t bh = r.begin; bh < r.end; ++bh) {
    const std::int64_t b = bh / hq, h = bh % hq;
    // the unit of (b, h)'s run; its partial results hold the run's G * count query heads
    const std::int64_t run = plan.run_of_head(h / G);
    const OriginRun& hr = plan.runs()[static_cast<std::size_t>(run)];
    const std::int64_t rh = h - hr.head * G, rhq = G * hr.count;
    const std::size_t unit = static_cast<std::size_t>(b * R + run);
    const std::int64_t i0 = plan.first_item()[unit];
    const std::int64_t i1 = plan.first_item()[unit + 1];
    float l = neg_inf();
    for (std::int64_t c0 = 0; c0 < dv; c0 += kTile) {
      const std::int64_t n = dv - c0 < kTile ? dv - c0 : kTile;
      l = neg_inf();
      for (std::int64_t c = 0; c < n; ++c) o[c] = 0.0f;
      for (std::int64_t it = i0; it < i1; ++it) {
        const float* acc = ws + slot_floats * it;
        merge_partial(o, l, acc + rh * dv + c0, acc[rhq * dv + rh], n);
      }
      if (args.variant.has_sink()) apply_sink(o, l, args.variant.sink(h), n);
      Q* dst = args.out + bh * dv + c0;
      for (std::int64_t c = 0; c < n; ++c) dst[c] = from_float<Q>(o[c]);
    }
    args.lse[bh] = l;
  }
}

/// The whole step on the calling thread: every worker's items, then the merge. Never
/// allocates.
template <class Arch = cpu::arch::Auto, class T, class Variant, class Q>
void batch_decode(const DecodePlan& plan, const BatchDecodeArgs<T, Variant, Q>& args,
                  void* workspace, std::size_t workspace_bytes) {
  plan.check_run(args, "phasekv::batch_decode", true);
  for (int w = 0; w < plan.workers(); ++w)
    batch_decode_partition<Arch>(plan, args, workspace, workspace_bytes, w, plan.workers());
  batch_decode_merge(plan, args, workspace, workspace_bytes);
}

/// The whole step on `pool` (whose size must equal plan.workers()): every thread runs its
/// items, then merges its share of the (sequence, head) pairs. Never allocates.
template <class Arch = cpu::arch::Auto, class T, class Variant, class Q>
void batch_decode_parallel(const DecodePlan& plan, const BatchDecodeArgs<T, Variant, Q>& args,
                           cpu::ThreadPool& pool, void* workspace, std::size_t workspace_bytes) {
  const char* where = "phasekv::batch_decode_parallel";
  plan.check_run(args, where, true);
  detail::check_arg(pool.size() == plan.workers(), where, "pool.size()", pool.size(),
                    "must equal the plan's workers()");
  detail::check_workspace(plan, workspace, workspace_bytes, where);
  pool.run([&](int i, int count) {
    batch_decode_partition<Arch>(plan, args, workspace, workspace_bytes, i, count);
  });
  pool.run([&](int i, int count) {
    batch_decode_merge(plan, args, workspace, workspace_bytes, i, count);
  });
}

PHASEKV_NAMESPACE_END
