/// @file
/// @brief Batched streaming compression into paged storage: append a chunk of new tokens to
/// each of B sequences (each at its own length, hence its own phase); every window that
/// completes is compressed by the policies and written to its sequence's entry pages, and the
/// new raw tokens are written to the raw pages (all of them, or the ring).
///
/// The entries are the bits CompressedCache::append and compress_batch write for the same
/// tokens: windows wholly inside the new tokens go through compress_batch's window loop (the
/// policies' row_kernels fast paths), one call per entry page; the few that began before the
/// append are pooled through a loader over the raw pages and the new tokens.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "phasekv/attention/cpu/split.hpp"
#include "phasekv/attention/cpu/visibility_rule.hpp"
#include "phasekv/compress/compress_batch.hpp"
#include "phasekv/compress/head_policy.hpp"
#include "phasekv/compress/policy.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/view.hpp"
#include "phasekv/phase/geometry.hpp"
#include "phasekv/phase/origins.hpp"
#include "phasekv/serving/paged.hpp"
#include "phasekv/serving/paged_check.hpp"

PHASEKV_NAMESPACE_BEGIN

/// One batched append: the paged storage (writable pools, tables), the lengths before the
/// append, and the new tokens of every sequence concatenated (`new_indptr`, as FlashInfer's
/// `append_indptr` / `qo_indptr`: the new tokens of sequence b are rows
/// `[new_indptr[b], new_indptr[b + 1])` of `keys` and `values`).
///
/// @tparam T storage element type.
template <class T>
struct PagedAppendArgs {
  PagePool<T> raw_pool;                      ///< Raw token pages (written).
  BlockTable raw_table;                      ///< Raw pages per sequence.
  PagePool<T> entry_pool;                    ///< Entry pages (written; may be the raw pool).
  BlockTable entry_table;                    ///< Entry pages per sequence.
  const std::int64_t* lengths = nullptr;     ///< `[batch]` tokens before the append (n_b).
  std::int64_t batch = 0;                    ///< Sequences B.
  std::int64_t ring_slots = 0;               ///< As PagedKV::ring_slots (0: keep every token).
  const std::int32_t* new_indptr = nullptr;  ///< `[batch + 1]` offsets of the new tokens.
  StridedView<const T> keys;                 ///< `[new_indptr[batch], kv_heads, d_k]`.
  StridedView<const T> values;               ///< `[new_indptr[batch], kv_heads, d_v]`.
  /// `[raw_pool.heads]` per-KV-head origins (PagedKV::origins; the policies then have origin
  /// 0), or null: every head at the policies' origin.
  const std::int64_t* origins = nullptr;
};

namespace detail {

// Window loader over paged raw tokens (positions < n0) and new tokens (positions >= n0).
template <class T>
struct PagedWindowLoader {
  const PagePool<T>* pool = nullptr;
  const BlockTable* table = nullptr;
  const StridedView<const T>* input = nullptr;
  bool keys = true;
  std::int64_t b = 0, h = 0, first = 0, n0 = 0, row0 = 0, ring_origin = 0, ring_slots = 0;

  PHASEKV_HOST_DEVICE float operator()(std::int64_t i, std::int64_t c) const {
    const std::int64_t p = first + i;
    if (p >= n0) return to_float(input->ptr(row0 + p - n0, h)[c]);
    const std::int64_t slot = PagedKV<T>::raw_slot(p, ring_origin, ring_slots);
    const std::int64_t page = table->page(b, slot / pool->page_size);
    const T* row = keys ? pool->key(page, slot % pool->page_size, h)
                        : pool->value(page, slot % pool->page_size, h);
    return to_float(row[c]);
  }
};

}  // namespace detail

namespace detail {

/// The policies of an append against the pools: same geometry, `local`, heads and dims.
template <class T, class KeyPolicy, class ValuePolicy>
void check_append_policies(const KeyPolicy& key_policy, const ValuePolicy& value_policy,
                           std::int64_t local, const PagedAppendArgs<T>& a, const char* where) {
  const Geometry g = key_policy.geometry();
  if (value_policy.geometry() != g) {
    const auto text = [](const Geometry& x) {
      return "(W " + std::to_string(x.window()) + ", S " + std::to_string(x.stride()) + ", O " +
             std::to_string(x.origin()) + ")";
    };
    const std::string req = "must equal key_policy.geometry() = " + text(g);
    detail::throw_arg(where, "value_policy.geometry()", text(value_policy.geometry()), req.c_str());
  }
  Geometry::check_local(where, "local", local);
  const std::int64_t H = a.raw_pool.heads, dk = a.raw_pool.d_k, dv = a.raw_pool.d_v;
  if (a.origins != nullptr)
    detail::check_arg(g.origin() == 0, where, "key_policy.geometry().origin()", g.origin(),
                      "must be 0 with per-head origins (origins[h] is head h's origin)");
  check_policy_dims(key_policy, H, where, "key_policy");
  check_policy_dims(value_policy, H, where, "value_policy");
  detail::check_arg<shape_error>(key_policy.input_dim() == dk && key_policy.output_dim() == dk,
                                 where, "key_policy.output_dim()", key_policy.output_dim(),
                                 "input and output dims must equal the pools' d_k");
  detail::check_arg<shape_error>(value_policy.input_dim() == dv && value_policy.output_dim() == dv,
                                 where, "value_policy.output_dim()", value_policy.output_dim(),
                                 "input and output dims must equal the pools' d_v");
}

/// The new tokens of an append: `new_indptr`, the lengths, the views of the new keys and
/// values (the pools' heads and dims). Returns the lengths after the append.
template <class T>
std::vector<std::int64_t> check_append_tokens(const PagedAppendArgs<T>& a, const char* where) {
  const std::int64_t H = a.raw_pool.heads, dk = a.raw_pool.d_k, dv = a.raw_pool.d_v;
  detail::check_arg(a.batch >= 0, where, "batch", a.batch, "must be >= 0");
  detail::check_arg(a.batch == 0 || a.new_indptr != nullptr, where, "new_indptr", "null",
                    "must point to [batch + 1] offsets");
  detail::check_arg(a.batch == 0 || a.lengths != nullptr, where, "lengths", "null",
                    "must point to [batch] lengths");
  if (a.batch > 0)
    detail::check_arg(a.new_indptr[0] == 0, where, "new_indptr[0]", a.new_indptr[0], "must be 0");
  std::vector<std::int64_t> after(static_cast<std::size_t>(a.batch));
  for (std::int64_t b = 0; b < a.batch; ++b) {
    const std::int64_t t = static_cast<std::int64_t>(a.new_indptr[b + 1]) - a.new_indptr[b];
    const std::string name = "new_indptr[" + std::to_string(b + 1) + "]";
    detail::check_arg(t >= 0, where, name.c_str(), a.new_indptr[b + 1],
                      "must be >= new_indptr[b] (offsets must not decrease)");
    const std::string len = "lengths[" + std::to_string(b) + "]";
    detail::check_arg(a.lengths[b] >= 0 && a.lengths[b] <= kMaxLength - t, where, len.c_str(),
                      a.lengths[b], "must be in [0, 2^62 - new tokens]");
    after[static_cast<std::size_t>(b)] = a.lengths[b] + t;
  }
  const std::int64_t rows = a.batch > 0 ? a.new_indptr[a.batch] : 0;
  check_view(a.keys, where, "keys");
  check_view(a.values, where, "values");
  detail::check_arg<shape_error>(a.keys.tokens >= rows, where, "keys.tokens", a.keys.tokens,
                                 "must hold new_indptr[batch] rows");
  detail::check_arg<shape_error>(a.values.tokens >= rows, where, "values.tokens", a.values.tokens,
                                 "must hold new_indptr[batch] rows");
  detail::check_arg<shape_error>(a.keys.heads == H, where, "keys.heads", a.keys.heads,
                                 "must equal the pools' heads");
  detail::check_arg<shape_error>(a.values.heads == H, where, "values.heads", a.values.heads,
                                 "must equal the pools' heads");
  detail::check_arg<shape_error>(a.keys.dim == dk, where, "keys.dim", a.keys.dim,
                                 "must equal the pools' d_k");
  detail::check_arg<shape_error>(a.values.dim == dv, where, "values.dim", a.values.dim,
                                 "must equal the pools' d_v");
  return after;
}

/// check_paged_append without the table walk (check_paged_kv): the policies, the lengths, the
/// new tokens. Returns the lengths after the append.
template <class T, class KeyPolicy, class ValuePolicy>
std::vector<std::int64_t> check_paged_append_inputs(const KeyPolicy& key_policy,
                                                    const ValuePolicy& value_policy,
                                                    std::int64_t local, const PagedAppendArgs<T>& a,
                                                    const char* where) {
  check_append_policies(key_policy, value_policy, local, a, where);
  return check_append_tokens(a, where);
}

}  // namespace detail

/// The checks of paged_append, on host data: the policies against the pools, `new_indptr`
/// and the lengths, the new tokens' views, and the tables against the lengths after the append
/// (page ranges, overlaps; check_paged_kv). Throws phasekv::invalid_argument (or shape_error /
/// capacity_error) naming the argument, the sequence and the index, as from `where`. Returns
/// the lengths after the append. cuda::paged_append runs it on the host copies of its arguments.
template <class T, class KeyPolicy, class ValuePolicy>
std::vector<std::int64_t> check_paged_append(const KeyPolicy& key_policy,
                                             const ValuePolicy& value_policy, std::int64_t local,
                                             const PagedAppendArgs<T>& a, const char* where) {
  std::vector<std::int64_t> after =
      detail::check_paged_append_inputs(key_policy, value_policy, local, a, where);
  const Geometry g = key_policy.geometry();
  const std::int64_t H = a.raw_pool.heads, dk = a.raw_pool.d_k, dv = a.raw_pool.d_v;
  PagedKV<T> kv;  // the storage as it will be after the append
  kv.raw_pool = a.raw_pool;
  kv.raw_table = a.raw_table;
  kv.entry_pool = a.entry_pool;
  kv.entry_table = a.entry_table;
  kv.lengths = after.data();
  kv.batch = a.batch;
  kv.rule = cpu::VisibilityRule::compressed(g, local);
  kv.ring_slots = a.ring_slots;
  kv.origins = a.origins;
  check_paged_kv(kv, H, dk, dv, where, true);

  return after;
}

namespace detail {

/// Pools the window of KV head `h` of sequence `b` that starts at position `first` with both
/// policies and stores the two entries at (`page`, `slot`) of the entry pool. The window's
/// tokens below `n0` come from the raw pages (ring origin `ring_origin`), the others from the
/// new tokens (row `row0` holds position `n0`). `out` holds max(d_k, d_v) floats. With a
/// non-empty `win` (W * max(d_k, d_v) elements) the window's rows are gathered there first, so
/// that the policy's row_kernels window path takes them (as CompressedCache::append does);
/// otherwise (`win` null) they are read in place through PagedWindowLoader.
template <class T, class KeyPolicy, class ValuePolicy>
void paged_append_window(const KeyPolicy& key_policy, const ValuePolicy& value_policy,
                         const PagedAppendArgs<T>& a, std::int64_t b, std::int64_t h,
                         std::int64_t first, std::int64_t n0, std::int64_t row0,
                         std::int64_t ring_origin, std::int64_t page, std::int64_t slot, float* out,
                         T* win) {
  const auto pool_one = [&](const auto& policy, bool keys, T* dst) {
    const std::int64_t w = policy.geometry().window(), d = policy.input_dim();
    if (win != nullptr) {
      const std::size_t row_bytes = static_cast<std::size_t>(d) * sizeof(T);
      for (std::int64_t i = 0; i < w; ++i) {
        const std::int64_t p = first + i;
        const T* src;
        if (p >= n0) {
          src = (keys ? a.keys : a.values).ptr(row0 + p - n0, h);
        } else {
          const std::int64_t s = PagedKV<T>::raw_slot(p, ring_origin, a.ring_slots);
          const std::int64_t pg = a.raw_table.page(b, s / a.raw_pool.page_size);
          src = keys ? a.raw_pool.key(pg, s % a.raw_pool.page_size, h)
                     : a.raw_pool.value(pg, s % a.raw_pool.page_size, h);
        }
        std::memcpy(win + i * d, src, row_bytes);
      }
      compress_gathered<T>(policy, h, win, d, out);
    } else {
      PagedWindowLoader<T> x;
      x.pool = &a.raw_pool;
      x.table = &a.raw_table;
      x.b = b;
      x.h = h;
      x.first = first;
      x.n0 = n0;
      x.row0 = row0;
      x.ring_origin = ring_origin;
      x.ring_slots = a.ring_slots;
      x.keys = keys;
      x.input = keys ? &a.keys : &a.values;
      policy.compress(h, x, out);
    }
    rows::store_row(dst, out, policy.output_dim());
  };
  pool_one(key_policy, true, a.entry_pool.key(page, slot, h));
  pool_one(value_policy, false, a.entry_pool.value(page, slot, h));
}

/// Writes the new raw tokens `[p0, p1)` (a part of `[n0, n1)`) of sequence `b` (row `row0`
/// holds position `n0`) into its raw pages: every one without a ring; with a ring of
/// a.ring_slots slots from `ring_origin`, only the positions below the origin and the last
/// ring_slots of `[n0, n1)`.
template <class T>
void paged_append_raw_range(const PagedAppendArgs<T>& a, std::int64_t b, std::int64_t n0,
                            std::int64_t n1, std::int64_t p0, std::int64_t p1, std::int64_t row0,
                            std::int64_t ring_origin) {
  const std::int64_t rs = a.ring_slots;
  for (std::int64_t p = p0; p < p1; ++p) {
    if (rs > 0 && p >= ring_origin && p < n1 - rs) continue;
    const std::int64_t s = PagedKV<T>::raw_slot(p, ring_origin, rs);
    const std::int64_t page = a.raw_table.page(b, s / a.raw_pool.page_size);
    const std::int64_t in = s % a.raw_pool.page_size;
    for (std::int64_t h = 0; h < a.raw_pool.heads; ++h) {
      std::memcpy(a.raw_pool.key(page, in, h), a.keys.ptr(row0 + p - n0, h),
                  static_cast<std::size_t>(a.raw_pool.d_k) * sizeof(T));
      std::memcpy(a.raw_pool.value(page, in, h), a.values.ptr(row0 + p - n0, h),
                  static_cast<std::size_t>(a.raw_pool.d_v) * sizeof(T));
    }
  }
}

/// paged_append_raw_range over all of `[n0, n1)`.
template <class T>
void paged_append_raw(const PagedAppendArgs<T>& a, std::int64_t b, std::int64_t n0, std::int64_t n1,
                      std::int64_t row0, std::int64_t ring_origin) {
  paged_append_raw_range(a, b, n0, n1, n0, n1, row0, ring_origin);
}

// Windows [j0, j1) of sequence `b` (KV heads [h0, h0 + nh)) that began before the append
// (n0: the length before it), each pooled by paged_append_window (policies `kp` / `vp`).
template <class T, class KP, class VP>
void paged_append_old_windows(const KP& kp, const VP& vp, const Geometry& g,
                              const PagedAppendArgs<T>& a, std::int64_t b, std::int64_t h0,
                              std::int64_t nh, std::int64_t n0, std::int64_t j0, std::int64_t j1,
                              std::int64_t ring_origin, float* out, T* win) {
  const std::int64_t row0 = a.new_indptr[b], ps = a.entry_pool.page_size;
  for (std::int64_t j = j0; j < j1; ++j)
    for (std::int64_t h = h0; h < h0 + nh; ++h)
      paged_append_window(kp, vp, a, b, h, g.window_begin(j), n0, row0, ring_origin,
                          a.entry_table.page(b, j / ps), j % ps, out, win);
}

// Windows [j0, j1) of sequence `b` (KV heads [h0, h0 + nh)) wholly inside the new tokens
// [n0, n1), through compress_batch's window loop with `loop_kp` / `loop_vp` (nh heads of
// geometry `g`), one call per entry page; `pass`: the windows of the whole pass (prefetch and
// store choices follow it; the bits do not depend on it).
template <class T, class LoopKP, class LoopVP>
void paged_append_new_windows(const LoopKP& loop_kp, const LoopVP& loop_vp,
                              const PagedAppendArgs<T>& a, std::int64_t b, std::int64_t h0,
                              std::int64_t nh, std::int64_t n0, std::int64_t n1, std::int64_t j0,
                              std::int64_t j1, std::int64_t pass, float* out) {
  const std::int64_t row0 = a.new_indptr[b], ps = a.entry_pool.page_size;
  const std::int64_t dk = a.raw_pool.d_k, dv = a.raw_pool.d_v;
  const StridedView<const T> keys{a.keys.ptr(row0, h0), n1 - n0,           nh, dk,
                                  a.keys.token_stride,  a.keys.head_stride};
  const StridedView<const T> values{a.values.ptr(row0, h0), n1 - n0, nh, dv, a.values.token_stride,
                                    a.values.head_stride};
  const PagePool<T>& ep = a.entry_pool;
  std::int64_t j = j0;
  while (j < j1) {
    const std::int64_t e0 = j / ps * ps, hi = e0 + ps < j1 ? e0 + ps : j1;
    const std::int64_t page = a.entry_table.page(b, j / ps);
    const StridedView<T> ek{ep.key(page, 0, h0), ps, nh, dk, ep.key_slot_stride(),
                            ep.key_head_stride()};
    const StridedView<T> ev{ep.value(page, 0, h0), ps, nh, dv, ep.value_slot_stride(),
                            ep.value_head_stride()};
    compress_entries_at<T>(loop_kp, keys, n0, ek, j, hi, out, e0, pass);
    compress_entries_at<T>(loop_vp, values, n0, ev, j, hi, out, e0, pass);
    j = hi;
  }
}

// Step 1 of an append to sequence `b`, KV heads [h0, h0 + nh): the entries of the windows of
// geometry `g` that complete in [n0, n1), written before any raw slot is overwritten. Those
// that began before the append are pooled by paged_append_window (policies `kp` / `vp`, head
// index h); the others go through compress_batch's window loop over the new tokens with
// `loop_kp` / `loop_vp` (nh heads of geometry `g`: the policies themselves, or one head as a
// HeadPolicy), one call per entry page. `out`, `win`: as paged_append_window.
template <class T, class KP, class VP, class LoopKP, class LoopVP>
void paged_append_entries(const KP& kp, const VP& vp, const LoopKP& loop_kp, const LoopVP& loop_vp,
                          const Geometry& g, const PagedAppendArgs<T>& a, std::int64_t b,
                          std::int64_t h0, std::int64_t nh, std::int64_t n0, std::int64_t n1,
                          std::int64_t ring_origin, float* out, std::vector<T>& win) {
  if (n1 <= n0) return;  // no new token, no window completes
  const std::int64_t j_end = g.complete_windows(n1), j = first_new_window(g, n0, n1);
  paged_append_old_windows(kp, vp, g, a, b, h0, nh, n0, g.complete_windows(n0), j, ring_origin, out,
                           win.empty() ? nullptr : win.data());
  paged_append_new_windows(loop_kp, loop_vp, a, b, h0, nh, n0, n1, j, j_end, j_end - j, out);
}

}  // namespace detail

/// Appends the new tokens of every sequence (see PagedAppendArgs) with compressors
/// `key_policy` / `value_policy` (same geometry; input_dim() = output_dim() = d_k resp. d_v)
/// for local window `local` (L: a ring must hold max(W, L) slots). Processes the sequences
/// `[partition_range(batch, thread_index, thread_count))` only, so an engine's pool can
/// drive it; sequences never share pages, so the parts may run concurrently.
///
/// One-off calls: this walks every used table entry (O(used pages log used pages)) and splits
/// by sequence only. An engine's step uses AppendPlan (serving/append_run.hpp): validation in
/// O(sequences + touched pages), runs that never allocate, work split inside long chunks; the
/// same bits.
///
/// Everything is checked first (the tables against the lengths after the append, page
/// ranges, overlaps, shapes): a bad argument throws phasekv::invalid_argument (or shape_error /
/// capacity_error) naming it, the sequence and the index, and nothing is written. The caller
/// updates its lengths afterwards (`lengths[b] += new tokens`).
template <class T, class KeyPolicy, class ValuePolicy>
void paged_append(const KeyPolicy& key_policy, const ValuePolicy& value_policy, std::int64_t local,
                  const PagedAppendArgs<T>& a, int thread_index = 0, int thread_count = 1) {
  const char* where = "phasekv::paged_append";
  cpu::check_partition(where, thread_index, thread_count);
  const std::vector<std::int64_t> after =
      check_paged_append(key_policy, value_policy, local, a, where);
  const Geometry g = key_policy.geometry();
  const std::int64_t H = a.raw_pool.heads, dk = a.raw_pool.d_k, dv = a.raw_pool.d_v;
  const std::int64_t dmax = dk > dv ? dk : dv;
  std::vector<float> out(static_cast<std::size_t>(dmax));
  std::vector<T> win(static_cast<std::size_t>(detail::gather_elements(g.window(), dmax)));
  const cpu::WorkRange part = cpu::partition_range(a.batch, thread_index, thread_count);
  if (a.origins == nullptr) {
    const std::int64_t ro = g.origin();
    for (std::int64_t b = part.begin; b < part.end; ++b) {
      const std::int64_t n0 = a.lengths[b], n1 = after[static_cast<std::size_t>(b)];
      // 1. entries of the windows completing in [n0, n1), before any raw slot is overwritten
      detail::paged_append_entries(key_policy, value_policy, key_policy, value_policy, g, a, b, 0,
                                   H, n0, n1, ro, out.data(), win);
      // 2. raw tokens: with a ring only the prefix and the last ring_slots new ones land
      detail::paged_append_raw(a, b, n0, n1, a.new_indptr[b], ro);
    }
    return;
  }
  // per-head origins: each run of heads with one origin O pools its own windows (the
  // policies' heads of the run at origin O, as CompressedCache does); raw slots from O_max
  const std::vector<OriginRun> runs =
      origin_runs(std::vector<std::int64_t>(a.origins, a.origins + H));
  const std::int64_t ro = max_origin(std::vector<std::int64_t>(a.origins, a.origins + H));
  for (std::int64_t b = part.begin; b < part.end; ++b) {
    const std::int64_t n0 = a.lengths[b], n1 = after[static_cast<std::size_t>(b)];
    for (const OriginRun& r : runs) {
      const HeadPolicy<KeyPolicy> kr(key_policy, r.head, r.origin, r.count);
      const HeadPolicy<ValuePolicy> vr(value_policy, r.head, r.origin, r.count);
      detail::paged_append_entries(key_policy, value_policy, kr, vr, kr.geometry(), a, b, r.head,
                                   r.count, n0, n1, ro, out.data(), win);
    }
    detail::paged_append_raw(a, b, n0, n1, a.new_indptr[b], ro);
  }
}

PHASEKV_NAMESPACE_END
