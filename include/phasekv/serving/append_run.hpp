/// @file
/// @brief The runs of an AppendPlan (serving/append_plan.hpp): phase 1 pools the windows that
/// complete in the new tokens into the entry pages, phase 2 writes the new raw tokens into the
/// raw pages (all of them, or the ring); each phase's items are balanced over the plan's
/// workers, so a long chunk of one sequence is split across them. Every run first compares its
/// arguments with the plan (AppendPlan::check_run, check_policies) and never allocates.
#pragma once

#include <cstddef>
#include <cstdint>

#include "phasekv/attention/cpu/thread_pool.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/serving/append_plan.hpp"
#include "phasekv/serving/paged_append.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace detail {

inline void check_append_worker(const AppendPlan& plan, int worker_index, const char* where) {
  check_arg(worker_index >= -1 && worker_index < plan.workers(), where, "worker_index",
            worker_index, "must be in [0, plan.workers()) or -1 (every worker's items)");
}

inline void check_append_workspace(const AppendPlan& plan, const void* ws, std::size_t bytes,
                                   const char* where) {
  check_arg(plan.workspace_bytes() == 0 || ws != nullptr, where, "workspace", "null",
            "must point to AppendPlan::workspace_bytes() bytes");
  check_arg<capacity_error>(bytes >= plan.workspace_bytes(), where, "workspace_bytes", bytes,
                            "must be >= AppendPlan::workspace_bytes()");
}

// Phase 1 items of worker w (-1: all), unchecked.
template <class T, class KeyPolicy, class ValuePolicy>
void append_entries_items(const AppendPlan& plan, const KeyPolicy& kp, const ValuePolicy& vp,
                          const PagedAppendArgs<T>& a, void* workspace, int w) {
  const int w0 = w < 0 ? 0 : w, w1 = w < 0 ? plan.workers() : w + 1;
  const std::int64_t ro = plan.ring_origin();
  for (int k = w0; k < w1; ++k) {
    char* mine = static_cast<char*>(workspace) + static_cast<std::size_t>(k) * plan.worker_bytes();
    float* out = reinterpret_cast<float*>(mine);
    const std::int64_t dmax = a.raw_pool.d_k > a.raw_pool.d_v ? a.raw_pool.d_k : a.raw_pool.d_v;
    T* win = plan.gathers()
                 ? reinterpret_cast<T*>(
                       mine + (static_cast<std::size_t>(dmax) * sizeof(float) + 63) / 64 * 64)
                 : nullptr;
    for (std::int64_t i = plan.worker_first(0, k); i < plan.worker_first(0, k + 1); ++i) {
      const AppendItem& it = plan.items()[static_cast<std::size_t>(i)];
      const std::int64_t b = it.sequence;
      const std::int64_t n0 = plan.lengths_after()[static_cast<std::size_t>(b)] -
                              (a.new_indptr[b + 1] - a.new_indptr[b]);
      const std::int64_t n1 = plan.lengths_after()[static_cast<std::size_t>(b)];
      const OriginRun& r = plan.runs()[static_cast<std::size_t>(it.run)];
      if (!plan.per_head_origins()) {  // every head at the policies' origin
        if (it.kind == AppendItem::old_windows)
          paged_append_old_windows(kp, vp, kp.geometry(), a, b, 0, r.count, n0, it.begin, it.end,
                                   ro, out, win);
        else
          paged_append_new_windows(kp, vp, a, b, 0, r.count, n0, n1, it.begin, it.end, it.pass,
                                   out);
        continue;
      }
      // the run's heads at the run's origin (as paged_append and CompressedCache)
      const HeadPolicy<KeyPolicy> kr(kp, r.head, r.origin, r.count);
      const HeadPolicy<ValuePolicy> vr(vp, r.head, r.origin, r.count);
      if (it.kind == AppendItem::old_windows)
        paged_append_old_windows(kp, vp, kr.geometry(), a, b, r.head, r.count, n0, it.begin, it.end,
                                 ro, out, win);
      else
        paged_append_new_windows(kr, vr, a, b, r.head, r.count, n0, n1, it.begin, it.end, it.pass,
                                 out);
    }
  }
}

// Phase 2 items of worker w (-1: all), unchecked.
template <class T>
void append_raw_items(const AppendPlan& plan, const PagedAppendArgs<T>& a, int w) {
  const int w0 = w < 0 ? 0 : w, w1 = w < 0 ? plan.workers() : w + 1;
  const std::int64_t ro = plan.ring_origin();
  for (std::int64_t i = plan.worker_first(1, w0); i < plan.worker_first(1, w1); ++i) {
    const AppendItem& it = plan.items()[static_cast<std::size_t>(i)];
    const std::int64_t b = it.sequence, n1 = plan.lengths_after()[static_cast<std::size_t>(b)];
    const std::int64_t n0 = n1 - (a.new_indptr[b + 1] - a.new_indptr[b]);
    paged_append_raw_range(a, b, n0, n1, it.begin, it.end, a.new_indptr[b], ro);
  }
}

}  // namespace detail

/// Phase 1 of a compressed append on worker `worker_index` (-1: every worker's items, one
/// thread): the entries of the windows completing in the new tokens. Run it on every worker
/// before paged_append_raw_run on any. `workspace`: plan.workspace_bytes() bytes, shared by the
/// workers (each uses its own part).
template <class T, class KeyPolicy, class ValuePolicy>
void paged_append_entries_run(const AppendPlan& plan, const KeyPolicy& key_policy,
                              const ValuePolicy& value_policy, std::int64_t local,
                              const PagedAppendArgs<T>& a, void* workspace,
                              std::size_t workspace_bytes, int worker_index = -1) {
  const char* where = "phasekv::paged_append_entries_run";
  detail::check_append_worker(plan, worker_index, where);
  plan.check_policies(key_policy, value_policy, local, where);
  plan.check_run(a, where);
  detail::check_append_workspace(plan, workspace, workspace_bytes, where);
  detail::append_entries_items(plan, key_policy, value_policy, a, workspace, worker_index);
}

/// Phase 2 of an append on worker `worker_index` (-1: every worker's items): the new raw
/// tokens; the whole run of a raw-only plan (AppendPlan::plan_raw).
template <class T>
void paged_append_raw_run(const AppendPlan& plan, const PagedAppendArgs<T>& a,
                          int worker_index = -1) {
  const char* where = "phasekv::paged_append_raw_run";
  detail::check_append_worker(plan, worker_index, where);
  plan.check_run(a, where);
  detail::append_raw_items(plan, a, worker_index);
}

/// The whole compressed append on the calling thread: phase 1, then phase 2.
template <class T, class KeyPolicy, class ValuePolicy>
void paged_append_run(const AppendPlan& plan, const KeyPolicy& key_policy,
                      const ValuePolicy& value_policy, std::int64_t local,
                      const PagedAppendArgs<T>& a, void* workspace, std::size_t workspace_bytes) {
  const char* where = "phasekv::paged_append_run";
  plan.check_policies(key_policy, value_policy, local, where);
  plan.check_run(a, where);
  detail::check_append_workspace(plan, workspace, workspace_bytes, where);
  detail::append_entries_items(plan, key_policy, value_policy, a, workspace, -1);
  detail::append_raw_items(plan, a, -1);
}

/// The whole compressed append on `pool` (whose size must equal plan.workers()): every thread
/// runs its phase 1 items, then, after all of them, its phase 2 items.
template <class T, class KeyPolicy, class ValuePolicy>
void paged_append_run_parallel(const AppendPlan& plan, const KeyPolicy& key_policy,
                               const ValuePolicy& value_policy, std::int64_t local,
                               const PagedAppendArgs<T>& a, cpu::ThreadPool& pool, void* workspace,
                               std::size_t workspace_bytes) {
  const char* where = "phasekv::paged_append_run_parallel";
  detail::check_arg(pool.size() == plan.workers(), where, "pool.size()", pool.size(),
                    "must equal the plan's workers()");
  plan.check_policies(key_policy, value_policy, local, where);
  plan.check_run(a, where);
  detail::check_append_workspace(plan, workspace, workspace_bytes, where);
  // one reference captured: std::function keeps the lambda in place (no allocation)
  const auto entries = [&](int i) {
    detail::append_entries_items(plan, key_policy, value_policy, a, workspace, i);
  };
  const auto raw = [&](int i) { detail::append_raw_items(plan, a, i); };
  pool.run([&entries](int i, int) { entries(i); });
  pool.run([&raw](int i, int) { raw(i); });
}

/// The raw-only append (AppendPlan::plan_raw) on `pool` (size plan.workers()).
template <class T>
void paged_append_raw_run_parallel(const AppendPlan& plan, const PagedAppendArgs<T>& a,
                                   cpu::ThreadPool& pool) {
  const char* where = "phasekv::paged_append_raw_run_parallel";
  detail::check_arg(pool.size() == plan.workers(), where, "pool.size()", pool.size(),
                    "must equal the plan's workers()");
  plan.check_run(a, where);
  const auto raw = [&](int i) { detail::append_raw_items(plan, a, i); };
  pool.run([&raw](int i, int) { raw(i); });
}

PHASEKV_NAMESPACE_END
