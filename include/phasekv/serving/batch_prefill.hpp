/// @file
/// @brief Ragged batch prefill and chunked prefill over paged storage, decode rows mixed in:
/// the new tokens of B sequences, concatenated (`qo_indptr`), each attending to its own paged
/// cache (prefix, entries, raw tokens) with the visible set of its own position, so that
/// entries completing inside the chunk become visible exactly where DESIGN.md's rule says. A
/// sequence with one new token is a decode row. Plan/run as batch decode: PrefillPlan::plan
/// (host, validates, splits into work items of (sequence, KV head, query tile) with tiles that
/// depend only on the sequence, balances them over the workers), then
/// batch_prefill_partition per worker. Same bits for any worker count and page size, and the
/// bits of cpu::prefill (one thread) over the same keys in contiguous buffers.
///
/// The cache must already hold the new tokens (append them with paged_append first): lengths
/// n_b count them, and the queries of sequence b sit at positions `[n_b - q_b, n_b)`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <string>
#include <vector>

#include "phasekv/attention/cpu/prefill.hpp"
#include "phasekv/attention/cpu/thread_pool.hpp"
#include "phasekv/attention/params.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/serving/paged.hpp"
#include "phasekv/serving/paged_check.hpp"
#include "phasekv/serving/plan.hpp"

PHASEKV_NAMESPACE_BEGIN

/// Everything one ragged batch prefill call needs (one layer).
///
/// @tparam Q element type of the queries and outputs (float, bf16_t, f16_t): queries are
///   widened to f32, everything accumulates in f32, outputs are rounded once; lse is f32.
template <class T, class Variant = StandardVariant, class Q = float>
struct BatchPrefillArgs {
  const Q* q = nullptr;                     ///< Queries `[qo_indptr[batch], q_heads, d_k]`.
  const std::int32_t* qo_indptr = nullptr;  ///< `[batch + 1]`: rows of sequence b's queries.
  std::int64_t q_heads = 0;                 ///< Query heads Hq (a multiple of kv_heads).
  std::int64_t kv_heads = 0;                ///< KV heads Hkv.
  std::int64_t d_k = 0;                     ///< Key head dim.
  std::int64_t d_v = 0;                     ///< Value head dim.
  PagedKV<T> kv;                            ///< Paged cache; lengths include the new tokens.
  Variant variant{};                        ///< Logit transform, entry bias, sinks.
  Q* out = nullptr;                         ///< Output `[qo_indptr[batch], q_heads, d_v]`.
  float* lse = nullptr;                     ///< Log-sum-exp `[qo_indptr[batch], q_heads]`.
};

/// One prefill work item: queries `[begin, end)` of sequence `sequence`, KV head `kv_head`.
struct PrefillWorkItem {
  std::int64_t sequence = 0;  ///< Sequence b.
  std::int64_t kv_head = 0;   ///< KV head.
  std::int64_t begin = 0;     ///< First query (of the sequence's queries).
  std::int64_t end = 0;       ///< One past the last query.
};

namespace detail {

/// Key and value rows of one paged sequence for the prefill kernel
/// (cpu::detail::prefill_item_rows): `key(kind, p, kh)` is the key of raw position p (prefix
/// and raw kinds) or entry p (compressed kind).
template <class T>
struct PagedPrefillRows {
  const PagedKV<T>* kv = nullptr;  ///< The batch.
  std::int64_t b = 0;              ///< Sequence.
  std::int64_t ring_origin = 0;    ///< kv->ring_origin().

  /// Key vector.
  const T* key(SegmentKind kind, std::int64_t p, std::int64_t kh) const {
    if (kind == SegmentKind::compressed) {
      const std::int64_t ps = kv->entry_pool.page_size;
      return kv->entry_pool.key(kv->entry_table.page(b, p / ps), p % ps, kh);
    }
    const std::int64_t s = PagedKV<T>::raw_slot(p, ring_origin, kv->ring_slots);
    const std::int64_t ps = kv->raw_pool.page_size;
    return kv->raw_pool.key(kv->raw_table.page(b, s / ps), s % ps, kh);
  }
  /// Value vector.
  const T* value(SegmentKind kind, std::int64_t p, std::int64_t kh) const {
    if (kind == SegmentKind::compressed) {
      const std::int64_t ps = kv->entry_pool.page_size;
      return kv->entry_pool.value(kv->entry_table.page(b, p / ps), p % ps, kh);
    }
    const std::int64_t s = PagedKV<T>::raw_slot(p, ring_origin, kv->ring_slots);
    const std::int64_t ps = kv->raw_pool.page_size;
    return kv->raw_pool.value(kv->raw_table.page(b, s / ps), s % ps, kh);
  }
};

/// The per-run checks of a batch prefill (uniform, or per-head origins) against its plan: the
/// planned head shape `shape` = {q_heads, kv_heads, d_k, d_v}, the query and output pointers,
/// the variant, and everything `record` holds (PlanRecord::check, with `qo_indptr`).
template <class Args>
void check_prefill_run(const Args& args, const PlanRecord& record, const std::int64_t* shape,
                       const char* where) {
  check_planned_heads(args, shape, where);
  record.check(args.kv, args.qo_indptr, where);
  const bool rows = record.batch() > 0 && record.qo_indptr().back() > 0;
  check_arg(!rows || args.q != nullptr, where, "q", "null", "must point to the queries");
  check_arg(!rows || args.out != nullptr, where, "out", "null", "must point to the outputs");
  check_arg(!rows || args.lse != nullptr, where, "lse", "null", "must point to the outputs");
  cpu::detail::check_variant(args.variant, where);
}

/// The largest number of queries of one of `items`.
inline std::int64_t prefill_max_queries(const std::vector<PrefillWorkItem>& items) {
  std::int64_t queries = 0;
  for (const PrefillWorkItem& w : items)
    queries = (w.end - w.begin) > queries ? w.end - w.begin : queries;
  return queries;
}

/// Bytes of workspace a prefill run over `items` needs: one scratch per worker
/// (cpu::detail::prefill_scratch_layout for the largest item's rows and queries), then
/// `widen_floats` floats per worker (f32 copies of a bf16 / f16 item's queries and outputs; 0
/// for f32), plus 64 bytes of alignment slack. Throws phasekv::invalid_argument naming d_k /
/// d_v when the head dims are too large to size (over 2^24).
inline std::size_t prefill_workspace_bytes(const std::vector<PrefillWorkItem>& items,
                                           std::int64_t group, std::int64_t d_k, std::int64_t d_v,
                                           int workers, const char* where,
                                           std::int64_t widen_floats = 0) {
  check_arg(d_k <= (std::int64_t{1} << 24), where, "d_k", d_k, "must be <= 2^24");
  check_arg(d_v <= (std::int64_t{1} << 24), where, "d_v", d_v, "must be <= 2^24");
  const std::int64_t queries = prefill_max_queries(items);
  if (queries == 0) return 0;
  const std::size_t per =
      cpu::detail::prefill_scratch_layout(queries * group, queries, d_k, d_v).bytes +
      static_cast<std::size_t>(widen_floats) * sizeof(float);
  return per * static_cast<std::size_t>(workers) + 64;
}

/// Binds `scratch` to worker `worker`'s share of a caller workspace of `bytes` bytes (of which
/// the plan needs `need`), after checking it (names `workspace` / `workspace_bytes`); the last
/// `widen_floats` floats of the share are left out and returned (null when there are none).
template <class T>
float* bind_prefill_workspace(cpu::detail::PrefillScratch<T>& scratch, void* workspace,
                              std::size_t bytes, std::size_t need, int workers, int worker,
                              const char* where, std::int64_t widen_floats = 0) {
  check_arg(workspace != nullptr || need == 0, where, "workspace", "null",
            "must point to the plan's workspace_bytes() bytes");
  check_arg<capacity_error>(bytes >= need, where, "workspace_bytes", bytes,
                            "must be >= the plan's workspace_bytes()");
  if (need == 0) return nullptr;
  const std::size_t per = (need - 64) / static_cast<std::size_t>(workers);
  const std::size_t widen = static_cast<std::size_t>(widen_floats) * sizeof(float);
  const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(workspace);
  unsigned char* base = static_cast<unsigned char*>(workspace) + ((a + 63) / 64 * 64 - a);
  unsigned char* mine = base + per * static_cast<std::size_t>(worker);
  scratch.bind(mine, per - widen);
  return widen == 0 ? nullptr : reinterpret_cast<float*>(mine + (per - widen));
}

}  // namespace detail

/// The host plan of a ragged batch prefill step: work items (sequence, KV head, query tile;
/// tiles as cpu::prefill cuts them for one thread, so they depend on the sequence only) and
/// their balance over the workers. Serves every layer with the same qo_indptr, lengths, tables,
/// rule and head shape; the tables must not change between plan() and the runs.
class PrefillPlan {
 public:
  /// Plans `args` (q, out, lse and pool data are not read) for `workers` workers. Validates
  /// the tables (check_paged_kv with the overlap check), `qo_indptr` (non-decreasing, q_b <=
  /// n_b) and, with a ring, that every raw token a query sees is still in it. Throws
  /// phasekv::invalid_argument (shape_error, capacity_error) naming the argument, the sequence
  /// and the index; the plan is unchanged then.
  template <class T, class Variant, class Q>
  void plan(const BatchPrefillArgs<T, Variant, Q>& args, int workers) {
    const char* where = "phasekv::PrefillPlan::plan";
    detail::check_arg(args.q_heads >= 1, where, "q_heads", args.q_heads, "must be >= 1");
    detail::check_arg(args.kv_heads >= 1, where, "kv_heads", args.kv_heads, "must be >= 1");
    detail::check_arg<shape_error>(args.q_heads % args.kv_heads == 0, where, "q_heads",
                                   args.q_heads, "must be a multiple of kv_heads");
    detail::check_arg<shape_error>(args.d_k >= 1, where, "d_k", args.d_k, "must be >= 1");
    detail::check_arg<shape_error>(args.d_v >= 1, where, "d_v", args.d_v, "must be >= 1");
    detail::check_arg(workers >= 1, where, "workers", workers, "must be >= 1");
    check_paged_kv(args.kv, args.kv_heads, args.d_k, args.d_v, where, true, true);
    const std::int64_t B = args.kv.batch;
    detail::check_arg(B == 0 || args.qo_indptr != nullptr, where, "qo_indptr", "null",
                      "must point to [batch + 1] offsets");
    if (B > 0)
      detail::check_arg(args.qo_indptr[0] == 0, where, "qo_indptr[0]", args.qo_indptr[0],
                        "must be 0");
    const std::int64_t G = args.q_heads / args.kv_heads;
    std::vector<PrefillWorkItem> items;
    std::vector<std::int64_t> cost;
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t qb = static_cast<std::int64_t>(args.qo_indptr[b + 1]) - args.qo_indptr[b];
      const std::int64_t n = args.kv.lengths[b];
      const std::string name = "qo_indptr[" + std::to_string(b + 1) + "]";
      detail::check_arg(qb >= 0, where, name.c_str(), args.qo_indptr[b + 1],
                        "must be >= qo_indptr[b] (offsets must not decrease)");
      const std::string req = "sequence " + std::to_string(b) + " has " + std::to_string(qb) +
                              " queries but length " + std::to_string(n) +
                              " (the cache must hold the new tokens)";
      detail::check_arg(qb <= n, where, name.c_str(), args.qo_indptr[b + 1], req.c_str());
      if (qb == 0) continue;
      const std::int64_t tq = cpu::detail::prefill_tile_queries(qb, args.kv_heads, G, 1);
      for (std::int64_t kh = 0; kh < args.kv_heads; ++kh) {
        const cpu::VisibilityRule rule = args.kv.head_rule(kh);
        if (args.kv.ring_slots > 0 && (kh == 0 || args.kv.origins != nullptr)) {
          const Visibility v0 = rule.at(n - qb + 1);
          const std::int64_t ro = args.kv.ring_origin();
          const std::int64_t lo = v0.raw_begin > ro ? v0.raw_begin : ro;
          const std::string rq =
              "the ring must hold the " + std::to_string(n - lo) +
              " raw tokens the chunk of sequence " + std::to_string(b) + " sees" +
              (args.kv.origins != nullptr ? " in KV head " + std::to_string(kh) : std::string()) +
              " (use smaller chunks or a larger ring)";
          detail::check_arg(n - lo <= args.kv.ring_slots, where, "kv.ring_slots",
                            args.kv.ring_slots, rq.c_str());
        }
        const std::int64_t keys = rule.at(n).total();
        for (std::int64_t i0 = 0; i0 < qb; i0 += tq) {
          const std::int64_t i1 = i0 + tq < qb ? i0 + tq : qb;
          items.push_back(PrefillWorkItem{b, kh, i0, i1});
          cost.push_back((i1 - i0) * G * (keys + kWorkItemOverhead));
        }
      }
    }
    std::vector<std::int64_t> wf(static_cast<std::size_t>(workers) + 1);
    plan_balance_costs(cost.data(), static_cast<std::int64_t>(cost.size()), workers, wf.data());
    // bf16 / f16: each worker widens an item's queries and gathers its outputs in f32
    const std::int64_t maxq = detail::prefill_max_queries(items);
    const std::int64_t widen_q = std::is_same<Q, float>::value ? 0 : maxq * args.q_heads * args.d_k;
    const std::int64_t widen_o = std::is_same<Q, float>::value ? 0 : maxq * args.q_heads * args.d_v;
    const std::int64_t widen = (widen_q + 15) / 16 * 16 + (widen_o + 15) / 16 * 16;
    const std::size_t ws =
        detail::prefill_workspace_bytes(items, G, args.d_k, args.d_v, workers, where, widen);
    PlanRecord record;
    record.record(args.kv, B > 0 ? args.qo_indptr : nullptr);
    record_ = std::move(record);
    workspace_bytes_ = ws;
    items_ = std::move(items);
    worker_first_ = std::move(wf);
    workers_ = workers;
    shape_[0] = args.q_heads, shape_[1] = args.kv_heads, shape_[2] = args.d_k, shape_[3] = args.d_v;
    q_bytes_ = sizeof(Q);
    widen_q_ = (widen_q + 15) / 16 * 16;
    widen_ = widen;
    planned_ = true;
  }

  /// True once plan() succeeded.
  bool planned() const { return planned_; }
  /// Workers the items are balanced over.
  int workers() const { return workers_; }
  /// Floats of each worker's f32 copies of an item's queries and outputs (bf16 / f16 only;
  /// the queries come first, widen_query_floats() of them).
  std::int64_t widen_floats() const { return widen_; }
  /// Floats of the query part of widen_floats().
  std::int64_t widen_query_floats() const { return widen_q_; }
  /// Bytes of workspace the runs that take one need (scratch of every worker; 0 when there
  /// are no queries).
  std::size_t workspace_bytes() const { return workspace_bytes_; }
  /// The work items.
  const std::vector<PrefillWorkItem>& items() const { return items_; }
  /// Items of worker w: `[worker_first()[w], worker_first()[w + 1])`.
  const std::vector<std::int64_t>& worker_first() const { return worker_first_; }

  /// What the plan was made for (checked by every run).
  const PlanRecord& record() const { return record_; }

  /// Checks that `args` is what this plan was made for (detail::check_prefill_run: head shape,
  /// pointers, PlanRecord::check with qo_indptr), in O(sequences + used table entries). Throws
  /// phasekv::invalid_argument naming the first field that differs.
  template <class T, class Variant, class Q>
  void check_run(const BatchPrefillArgs<T, Variant, Q>& args, const char* where) const {
    detail::check_arg(planned_, where, "plan", "empty", "call PrefillPlan::plan first");
    detail::check_arg(sizeof(Q) == q_bytes_, where, "sizeof(*q)", sizeof(Q),
                      "the query and output type must have the planned size (plan again)");
    detail::check_prefill_run(args, record_, shape_, where);
  }

 private:
  PlanRecord record_;
  std::vector<std::int64_t> worker_first_;
  std::vector<PrefillWorkItem> items_;
  int workers_ = 0;
  std::size_t workspace_bytes_ = 0;
  std::int64_t shape_[4] = {0, 0, 0, 0};
  std::size_t q_bytes_ = sizeof(float);  // element size of the queries and outputs
  std::int64_t widen_q_ = 0, widen_ = 0;
  bool planned_ = false;
};

namespace detail {

/// The items of worker `worker_index` with `scratch` (bound to a workspace or allocating),
/// after the per-run checks. bf16 / f16 queries and outputs: `widen` (plan.widen_floats()
/// floats) takes each item's queries widened to f32 and its f32 outputs, which are rounded to
/// Q into `args.out`; the kernel sees the item as queries `[0, end - begin)` from position
/// `first + begin` (the same arithmetic: the bits of the f32 path on the widened queries).
template <class Arch, class T, class Variant, class Q>
void batch_prefill_items(const PrefillPlan& plan, const BatchPrefillArgs<T, Variant, Q>& args,
                         int worker_index, int worker_count,
                         cpu::detail::PrefillScratch<T>& scratch, float* widen, const char* where) {
  cpu::check_partition(where, worker_index, worker_count);
  plan.check_run(args, where);
  check_arg(worker_count == plan.workers(), where, "worker_count", worker_count,
            "must equal the plan's workers()");
  const std::int64_t i0 = plan.worker_first()[static_cast<std::size_t>(worker_index)];
  const std::int64_t i1 = plan.worker_first()[static_cast<std::size_t>(worker_index) + 1];
  const std::int64_t hq = args.q_heads, dk = args.d_k, dv = args.d_v;
  const std::int64_t G = hq / args.kv_heads;
  cpu::detail::with_arch<Arch>([&](auto tag) {
    using A = decltype(tag);
    for (std::int64_t i = i0; i < i1; ++i) {
      const PrefillWorkItem& w = plan.items()[static_cast<std::size_t>(i)];
      const std::int64_t b = w.sequence, row0 = args.qo_indptr[b];
      cpu::PrefillArgs<T, Variant> p;
      p.num_queries = static_cast<std::int64_t>(args.qo_indptr[b + 1]) - row0;
      p.q_heads = hq;
      p.kv_heads = args.kv_heads;
      p.d_k = dk;
      p.d_v = dv;
      p.first = args.kv.lengths[b] - p.num_queries;
      p.rule = args.kv.rule;
      p.origins = args.kv.origins;  // KV head kh sees p.head_rule(kh)
      p.variant = args.variant;
      p.lse = args.lse + row0 * hq;
      const PagedPrefillRows<T> src{&args.kv, b, args.kv.ring_origin()};
      if constexpr (std::is_same<Q, float>::value) {
        p.q = args.q + row0 * hq * dk;
        p.out = args.out + row0 * hq * dv;
        kernel_prefill_rows(cpu::detail::target_t<A>{}, tag, p, src, w.kv_head, w.begin, w.end,
                            scratch);
      } else {
        // the item alone: its queries (rows of KV head kv_head's group) widened into `widen`
        const std::int64_t nq = w.end - w.begin, h0 = w.kv_head * G;
        float* qf = widen;
        float* of = widen + plan.widen_query_floats();
        for (std::int64_t r = 0; r < nq; ++r)
          for (std::int64_t h = h0; h < h0 + G; ++h) {
            const Q* qs = args.q + ((row0 + w.begin + r) * hq + h) * dk;
            for (std::int64_t e = 0; e < dk; ++e) qf[(r * hq + h) * dk + e] = to_float(qs[e]);
          }
        p.q = qf;
        p.out = of;
        p.lse += w.begin * hq;
        p.first += w.begin;
        p.num_queries = nq;
        kernel_prefill_rows(cpu::detail::target_t<A>{}, tag, p, src, w.kv_head, 0, nq, scratch);
        for (std::int64_t r = 0; r < nq; ++r)
          for (std::int64_t h = h0; h < h0 + G; ++h) {
            Q* dst = args.out + ((row0 + w.begin + r) * hq + h) * dv;
            for (std::int64_t e = 0; e < dv; ++e) dst[e] = from_float<Q>(of[(r * hq + h) * dv + e]);
          }
      }
    }
  });
}

}  // namespace detail

/// Runs the work items of worker `worker_index` of `worker_count` (= plan.workers()), writing
/// their rows of `args.out` / `args.lse`, with its share of `workspace` (at least
/// plan.workspace_bytes() bytes, shared by all workers of the step; each uses its own part).
/// Safe to call concurrently for different workers. Never allocates.
template <class Arch = cpu::arch::Auto, class T, class Variant, class Q>
void batch_prefill_partition(const PrefillPlan& plan, const BatchPrefillArgs<T, Variant, Q>& args,
                             void* workspace, std::size_t workspace_bytes, int worker_index,
                             int worker_count) {
  const char* where = "phasekv::batch_prefill_partition";
  cpu::check_partition(where, worker_index, worker_count);
  detail::check_arg(plan.planned(), where, "plan", "empty", "call PrefillPlan::plan first");
  detail::check_arg(worker_count == plan.workers(), where, "worker_count", worker_count,
                    "must equal the plan's workers()");
  cpu::detail::PrefillScratch<T> scratch;
  float* widen =
      detail::bind_prefill_workspace(scratch, workspace, workspace_bytes, plan.workspace_bytes(),
                                     plan.workers(), worker_index, where, plan.widen_floats());
  detail::batch_prefill_items<Arch>(plan, args, worker_index, worker_count, scratch, widen, where);
}

/// batch_prefill_partition without a workspace: allocates its own f32 scratch, as
/// cpu::prefill does.
template <class Arch = cpu::arch::Auto, class T, class Variant, class Q>
void batch_prefill_partition(const PrefillPlan& plan, const BatchPrefillArgs<T, Variant, Q>& args,
                             int worker_index, int worker_count) {
  cpu::detail::PrefillScratch<T> scratch;
  std::vector<float> widen(static_cast<std::size_t>(plan.widen_floats()));
  detail::batch_prefill_items<Arch>(plan, args, worker_index, worker_count, scratch, widen.data(),
                                    "phasekv::batch_prefill_partition");
}

/// The whole step on the calling thread, with a workspace of plan.workspace_bytes() bytes.
/// Never allocates.
template <class Arch = cpu::arch::Auto, class T, class Variant, class Q>
void batch_prefill(const PrefillPlan& plan, const BatchPrefillArgs<T, Variant, Q>& args,
                   void* workspace, std::size_t workspace_bytes) {
  for (int w = 0; w < plan.workers(); ++w)
    batch_prefill_partition<Arch>(plan, args, workspace, workspace_bytes, w, plan.workers());
}

/// The whole step on the calling thread (allocates its scratch).
template <class Arch = cpu::arch::Auto, class T, class Variant, class Q>
void batch_prefill(const PrefillPlan& plan, const BatchPrefillArgs<T, Variant, Q>& args) {
  for (int w = 0; w < plan.workers(); ++w)
    batch_prefill_partition<Arch>(plan, args, w, plan.workers());
}

/// The whole step on `pool` (whose size must equal plan.workers()), with a workspace of
/// plan.workspace_bytes() bytes. Never allocates.
template <class Arch = cpu::arch::Auto, class T, class Variant, class Q>
void batch_prefill_parallel(const PrefillPlan& plan, const BatchPrefillArgs<T, Variant, Q>& args,
                            cpu::ThreadPool& pool, void* workspace, std::size_t workspace_bytes) {
  detail::check_arg(pool.size() == plan.workers(), "phasekv::batch_prefill_parallel", "pool.size()",
                    pool.size(), "must equal the plan's workers()");
  pool.run([&](int i, int count) {
    batch_prefill_partition<Arch>(plan, args, workspace, workspace_bytes, i, count);
  });
}

/// The whole step on `pool` (whose size must equal plan.workers()); each worker allocates its
/// scratch.
template <class Arch = cpu::arch::Auto, class T, class Variant, class Q>
void batch_prefill_parallel(const PrefillPlan& plan, const BatchPrefillArgs<T, Variant, Q>& args,
                            cpu::ThreadPool& pool) {
  detail::check_arg(pool.size() == plan.workers(), "phasekv::batch_prefill_parallel", "pool.size()",
                    pool.size(), "must equal the plan's workers()");
  pool.run([&](int i, int count) { batch_prefill_partition<Arch>(plan, args, i, count); });
}

PHASEKV_NAMESPACE_END
