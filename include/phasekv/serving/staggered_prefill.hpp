/// @file
/// @brief Per-KV-head origins (staggered windows) in the paged serving layout: ragged batched
/// prefill (StaggeredBatchPrefillArgs, StaggeredPrefillPlan and its runs). The paged KV, the
/// decode plan and the append are in serving/staggered.hpp.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "phasekv/attention/cpu/prefill.hpp"
#include "phasekv/attention/cpu/variant_check.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/serving/batch_prefill.hpp"
#include "phasekv/serving/paged_check.hpp"
#include "phasekv/serving/plan.hpp"
#include "phasekv/serving/staggered.hpp"

PHASEKV_NAMESPACE_BEGIN

// ---------------------------------------------------------------------------------------------
// Ragged batch prefill

/// Everything one staggered ragged batch prefill call needs (one layer). As BatchPrefillArgs,
/// with a StaggeredPagedKV (lengths include the new tokens).
template <class T, class Variant = StandardVariant>
struct StaggeredBatchPrefillArgs {
  const float* q = nullptr;                 ///< Queries `[qo_indptr[batch], q_heads, d_k]`.
  const std::int32_t* qo_indptr = nullptr;  ///< `[batch + 1]`: rows of sequence b's queries.
  std::int64_t q_heads = 0;                 ///< Query heads Hq (a multiple of kv_heads).
  std::int64_t kv_heads = 0;                ///< KV heads Hkv (= kv.origins.size()).
  std::int64_t d_k = 0;                     ///< Key head dim.
  std::int64_t d_v = 0;                     ///< Value head dim.
  StaggeredPagedKV<T> kv;                   ///< Paged cache; lengths include the new tokens.
  Variant variant{};                        ///< Logit transform, entry bias, sinks.
  float* out = nullptr;                     ///< Output `[qo_indptr[batch], q_heads, d_v]`.
  float* lse = nullptr;                     ///< Log-sum-exp `[qo_indptr[batch], q_heads]`.

  /// The uniform-path arguments (every head with origin O_0; used when the origins are equal).
  BatchPrefillArgs<T, Variant> uniform() const {
    BatchPrefillArgs<T, Variant> a;
    a.q = q;
    a.qo_indptr = qo_indptr;
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

/// The host plan of a staggered ragged batch prefill step. With equal origins it is a
/// PrefillPlan of the uniform path. Otherwise its work items are (sequence, KV head, query
/// tile), each head with its own visibility rule, tiles cut as cpu::prefill cuts
/// them (one head at a time), so each head has the bits of cpu::prefill with `origins`.
class StaggeredPrefillPlan {
 public:
  /// Plans `args` (q, out, lse and pool data are not read) for `workers` workers. Validates
  /// the tables (check_staggered_paged_kv with the overlap check), `qo_indptr` (non-decreasing,
  /// q_b <= n_b) and, with a ring, that every raw token a query of any head sees is still in
  /// it. Throws phasekv::invalid_argument (shape_error, capacity_error) naming the argument, the
  /// sequence and the index; the plan is unchanged then.
  template <class T, class Variant>
  void plan(const StaggeredBatchPrefillArgs<T, Variant>& args, int workers) {
    const char* where = "phasekv::StaggeredPrefillPlan::plan";
    detail::check_arg(args.q_heads >= 1, where, "q_heads", args.q_heads, "must be >= 1");
    detail::check_arg(args.kv_heads >= 1, where, "kv_heads", args.kv_heads, "must be >= 1");
    detail::check_arg<shape_error>(args.q_heads % args.kv_heads == 0, where, "q_heads",
                                   args.q_heads, "must be a multiple of kv_heads");
    detail::check_arg(workers >= 1, where, "workers", workers, "must be >= 1");
    check_origins(where, args.kv.origins, args.kv_heads);
    if (origins_uniform(args.kv.origins)) {
      PrefillPlan u;
      u.plan(args.uniform(), workers);
      commit(args, workers);
      workspace_bytes_ = u.workspace_bytes();
      uniform_plan_ = std::move(u);
      uniform_ = true;
      items_.clear();
      worker_first_.clear();
      return;
    }
    detail::check_arg<shape_error>(args.d_k >= 1, where, "d_k", args.d_k, "must be >= 1");
    detail::check_arg<shape_error>(args.d_v >= 1, where, "d_v", args.d_v, "must be >= 1");
    check_staggered_paged_kv(args.kv, args.kv_heads, args.d_k, args.d_v, where, true);
    const std::int64_t B = args.kv.batch, H = args.kv_heads, G = args.q_heads / H;
    detail::check_arg(B == 0 || args.qo_indptr != nullptr, where, "qo_indptr", "null",
                      "must point to [batch + 1] offsets");
    if (B > 0)
      detail::check_arg(args.qo_indptr[0] == 0, where, "qo_indptr[0]", args.qo_indptr[0],
                        "must be 0");
    const std::int64_t ro = args.kv.ring_origin();
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
      const std::int64_t tq = cpu::detail::prefill_tile_queries(qb, H, G, 1);
      for (std::int64_t kh = 0; kh < H; ++kh) {
        const cpu::VisibilityRule rule = args.kv.rule(kh);
        if (args.kv.ring_slots > 0) {
          const Visibility v0 = rule.at(n - qb + 1);
          const std::int64_t lo = v0.raw_begin > ro ? v0.raw_begin : ro;
          const std::string rq = "the ring must hold the " + std::to_string(n - lo) +
                                 " raw tokens the chunk of sequence " + std::to_string(b) +
                                 " sees in KV head " + std::to_string(kh) +
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
    const std::size_t ws =
        detail::prefill_workspace_bytes(items, G, args.d_k, args.d_v, workers, where);
    commit(args, workers);
    workspace_bytes_ = ws;
    items_ = std::move(items);
    worker_first_ = std::move(wf);
    uniform_plan_ = PrefillPlan();
    uniform_ = false;
  }

  /// True once plan() succeeded.
  bool planned() const { return planned_; }
  /// True when the origins were equal: the runs take the uniform path (uniform_plan()).
  bool uniform() const { return uniform_; }
  /// The uniform path's plan (meaningful when uniform()).
  const PrefillPlan& uniform_plan() const { return uniform_plan_; }
  /// Workers the items are balanced over.
  int workers() const { return workers_; }
  /// Bytes of workspace the runs that take one need (0 when there are no queries).
  std::size_t workspace_bytes() const { return workspace_bytes_; }
  /// The per-head work items (empty when uniform()).
  const std::vector<PrefillWorkItem>& items() const { return items_; }
  /// Items of worker w: `[worker_first()[w], worker_first()[w + 1])`.
  const std::vector<std::int64_t>& worker_first() const { return worker_first_; }

  /// Checks that the plan is planned and `kv`'s fields (geometry, local window, ring, pools)
  /// are the planned ones (the uniform path's runs check the rest).
  template <class T>
  void check_geometry(const StaggeredPagedKV<T>& kv, const char* where) const {
    detail::check_arg(planned_, where, "plan", "empty", "call StaggeredPrefillPlan::plan first");
    record_.check_fields(kv, where);
  }

  /// Checks that `args` is what this plan was made for (detail::check_prefill_run, as the
  /// uniform PrefillPlan); throws phasekv::invalid_argument naming the first field that differs.
  template <class T, class Variant>
  void check_run(const StaggeredBatchPrefillArgs<T, Variant>& args, const char* where) const {
    check_geometry(args.kv, where);
    if (uniform_) {
      uniform_plan_.check_run(args.uniform(), where);
      return;
    }
    detail::check_prefill_run(args, record_, shape_, where);
  }

 private:
  template <class T, class Variant>
  void commit(const StaggeredBatchPrefillArgs<T, Variant>& args, int workers) {
    record_.record(args.kv, args.kv.batch > 0 ? args.qo_indptr : nullptr);
    workers_ = workers;
    shape_[0] = args.q_heads, shape_[1] = args.kv_heads, shape_[2] = args.d_k, shape_[3] = args.d_v;
    planned_ = true;
  }

  PrefillPlan uniform_plan_;
  bool uniform_ = false;
  PlanRecord record_;
  std::vector<std::int64_t> worker_first_;
  std::vector<PrefillWorkItem> items_;
  int workers_ = 0;
  std::size_t workspace_bytes_ = 0;
  std::int64_t shape_[4] = {0, 0, 0, 0};
  bool planned_ = false;
};

namespace detail {

/// The per-head items of worker `worker_index` with `scratch`, after the per-run checks (the
/// plan is not uniform).
template <class Arch, class T, class Variant>
void staggered_prefill_items(const StaggeredPrefillPlan& plan,
                             const StaggeredBatchPrefillArgs<T, Variant>& args, int worker_index,
                             int worker_count, cpu::detail::PrefillScratch<T>& scratch,
                             const char* where) {
  cpu::check_partition(where, worker_index, worker_count);
  plan.check_run(args, where);
  check_arg(worker_count == plan.workers(), where, "worker_count", worker_count,
            "must equal the plan's workers()");
  const PagedKV<T> base = args.kv.paged(0);  // pools and tables; the rule comes per head
  const std::int64_t ro = args.kv.ring_origin();
  const std::int64_t i0 = plan.worker_first()[static_cast<std::size_t>(worker_index)];
  const std::int64_t i1 = plan.worker_first()[static_cast<std::size_t>(worker_index) + 1];
  cpu::detail::with_arch<Arch>([&](auto tag) {
    using A = decltype(tag);
    for (std::int64_t i = i0; i < i1; ++i) {
      const PrefillWorkItem& w = plan.items()[static_cast<std::size_t>(i)];
      const std::int64_t b = w.sequence, row0 = args.qo_indptr[b];
      cpu::PrefillArgs<T, Variant> p;
      p.q = args.q + row0 * args.q_heads * args.d_k;
      p.num_queries = static_cast<std::int64_t>(args.qo_indptr[b + 1]) - row0;
      p.q_heads = args.q_heads;
      p.kv_heads = args.kv_heads;
      p.d_k = args.d_k;
      p.d_v = args.d_v;
      p.first = args.kv.lengths[b] - p.num_queries;
      p.rule = args.kv.rule(w.kv_head);
      p.variant = args.variant;
      p.out = args.out + row0 * args.q_heads * args.d_v;
      p.lse = args.lse + row0 * args.q_heads;
      const PagedPrefillRows<T> src{&base, b, ro};
      kernel_prefill_rows(cpu::detail::target_t<A>{}, tag, p, src, w.kv_head, w.begin, w.end,
                          scratch);
    }
  });
}

}  // namespace detail

/// Runs the work items of worker `worker_index` of `worker_count` (= plan.workers()), writing
/// their rows of `args.out` / `args.lse`, with its share of `workspace` (at least
/// plan.workspace_bytes() bytes, shared by all workers of the step). Safe to call concurrently
/// for different workers. Never allocates.
template <class Arch = cpu::arch::Auto, class T, class Variant>
void staggered_batch_prefill_partition(const StaggeredPrefillPlan& plan,
                                       const StaggeredBatchPrefillArgs<T, Variant>& args,
                                       void* workspace, std::size_t workspace_bytes,
                                       int worker_index, int worker_count) {
  const char* where = "phasekv::staggered_batch_prefill_partition";
  if (plan.uniform()) {
    plan.check_geometry(args.kv, where);
    batch_prefill_partition<Arch>(plan.uniform_plan(), args.uniform(), workspace, workspace_bytes,
                                  worker_index, worker_count);
    return;
  }
  cpu::check_partition(where, worker_index, worker_count);
  detail::check_arg(plan.planned(), where, "plan", "empty",
                    "call StaggeredPrefillPlan::plan first");
  detail::check_arg(worker_count == plan.workers(), where, "worker_count", worker_count,
                    "must equal the plan's workers()");
  cpu::detail::PrefillScratch<T> scratch;
  detail::bind_prefill_workspace(scratch, workspace, workspace_bytes, plan.workspace_bytes(),
                                 plan.workers(), worker_index, where);
  detail::staggered_prefill_items<Arch>(plan, args, worker_index, worker_count, scratch, where);
}

/// staggered_batch_prefill_partition without a workspace: allocates its own f32 scratch, as
/// cpu::prefill does.
template <class Arch = cpu::arch::Auto, class T, class Variant>
void staggered_batch_prefill_partition(const StaggeredPrefillPlan& plan,
                                       const StaggeredBatchPrefillArgs<T, Variant>& args,
                                       int worker_index, int worker_count) {
  const char* where = "phasekv::staggered_batch_prefill_partition";
  if (plan.uniform()) {
    plan.check_geometry(args.kv, where);
    batch_prefill_partition<Arch>(plan.uniform_plan(), args.uniform(), worker_index, worker_count);
    return;
  }
  cpu::detail::PrefillScratch<T> scratch;
  detail::staggered_prefill_items<Arch>(plan, args, worker_index, worker_count, scratch, where);
}

/// The whole step on the calling thread, with a workspace of plan.workspace_bytes() bytes.
/// Never allocates.
template <class Arch = cpu::arch::Auto, class T, class Variant>
void staggered_batch_prefill(const StaggeredPrefillPlan& plan,
                             const StaggeredBatchPrefillArgs<T, Variant>& args, void* workspace,
                             std::size_t workspace_bytes) {
  for (int w = 0; w < plan.workers(); ++w)
    staggered_batch_prefill_partition<Arch>(plan, args, workspace, workspace_bytes, w,
                                            plan.workers());
}

/// The whole step on the calling thread (allocates its scratch).
template <class Arch = cpu::arch::Auto, class T, class Variant>
void staggered_batch_prefill(const StaggeredPrefillPlan& plan,
                             const StaggeredBatchPrefillArgs<T, Variant>& args) {
  for (int w = 0; w < plan.workers(); ++w)
    staggered_batch_prefill_partition<Arch>(plan, args, w, plan.workers());
}

/// The whole step on `pool` (whose size must equal plan.workers()), with a workspace of
/// plan.workspace_bytes() bytes. Never allocates.
template <class Arch = cpu::arch::Auto, class T, class Variant>
void staggered_batch_prefill_parallel(const StaggeredPrefillPlan& plan,
                                      const StaggeredBatchPrefillArgs<T, Variant>& args,
                                      cpu::ThreadPool& pool, void* workspace,
                                      std::size_t workspace_bytes) {
  detail::check_arg(pool.size() == plan.workers(), "phasekv::staggered_batch_prefill_parallel",
                    "pool.size()", pool.size(), "must equal the plan's workers()");
  pool.run([&](int i, int count) {
    staggered_batch_prefill_partition<Arch>(plan, args, workspace, workspace_bytes, i, count);
  });
}

/// The whole step on `pool` (whose size must equal plan.workers()); each worker allocates its
/// scratch.
template <class Arch = cpu::arch::Auto, class T, class Variant>
void staggered_batch_prefill_parallel(const StaggeredPrefillPlan& plan,
                                      const StaggeredBatchPrefillArgs<T, Variant>& args,
                                      cpu::ThreadPool& pool) {
  detail::check_arg(pool.size() == plan.workers(), "phasekv::staggered_batch_prefill_parallel",
                    "pool.size()", pool.size(), "must equal the plan's workers()");
  pool.run(
      [&](int i, int count) { staggered_batch_prefill_partition<Arch>(plan, args, i, count); });
}

PHASEKV_NAMESPACE_END
