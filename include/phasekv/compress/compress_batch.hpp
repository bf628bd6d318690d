/// @file
/// @brief Batch compression of a whole prefill: raw K or V of every KV head become the J(n)
/// entries of the complete windows, computed in f32 and stored in the element type.
#pragma once

#include <cstdint>
#include <vector>

#include "phasekv/compress/cpu/row_kernels.hpp"
#include "phasekv/compress/cpu/rows.hpp"
#include "phasekv/compress/head_policy.hpp"
#include "phasekv/compress/policy.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/prefetch.hpp"
#include "phasekv/core/view.hpp"
#include "phasekv/phase/geometry.hpp"
#include "phasekv/phase/origins.hpp"

PHASEKV_NAMESPACE_BEGIN

namespace detail {
template <class T>
struct non_deduced {
  using type = T;
};
template <class T>
using non_deduced_t = typename non_deduced<T>::type;

// In these helpers row r of `raw` holds the token at position `first + r` (0 for
// compress_batch; the chunk's first position for CompressedCache::append).

// row_kernels<Policy>::window over the window whose token at offset i starts at
// `rows + i * token_stride` when the policy has that fast path (it returns false for
// configurations it does not cover); false without one.
template <class T, class Policy>
PHASEKV_FORCEINLINE bool policy_compress_rows(const Policy& policy, std::int64_t h, const T* rows,
                                              std::int64_t token_stride, float* out) {
  if constexpr (has_compress_rows<Policy, T>::value) {
    return row_kernels<Policy>::window(policy, h, rows, token_stride, out);
  } else {
    (void)policy, (void)h, (void)rows, (void)token_stride, (void)out;
    return false;
  }
}
// The same over window j of head h of `raw`.
template <class T, class Policy>
PHASEKV_FORCEINLINE bool compress_window_rows(const Policy& policy, const StridedView<const T>& raw,
                                              std::int64_t first, const Geometry& g, std::int64_t j,
                                              std::int64_t h, float* out) {
  return policy_compress_rows<T>(policy, h, raw.ptr(g.window_begin(j) - first, h), raw.token_stride,
                                 out);
}
// row_kernels<Policy>::window_pair over window j of heads h and h + 1 when the policy has
// that fast path and the output fits `pair` (kPairScratch floats); false otherwise.
constexpr std::int64_t kPairScratch = 512;
template <class T, class Policy>
PHASEKV_FORCEINLINE bool compress_window_rows2(const Policy& policy,
                                               const StridedView<const T>& raw, std::int64_t first,
                                               const Geometry& g, std::int64_t j, std::int64_t h,
                                               float* out, float* pair) {
  if constexpr (has_compress_rows2<Policy, T>::value) {
    if (policy.output_dim() > kPairScratch) return false;
    const std::int64_t t = g.window_begin(j) - first;
    return row_kernels<Policy>::window_pair(policy, h, raw.ptr(t, h), out, h + 1, raw.ptr(t, h + 1),
                                            pair, raw.token_stride);
  } else {
    (void)policy, (void)raw, (void)first, (void)g, (void)j, (void)h, (void)out, (void)pair;
    return false;
  }
}

// Largest window (W * d elements) that the streaming appends (CompressedCache, paged_append)
// gather into one contiguous buffer, so that a policy's row_kernels window path takes it;
// larger windows are read in place through a loader.
constexpr std::int64_t kGatherElements = std::int64_t{1} << 16;
// Elements of that buffer for windows of `w` tokens of up to `dmax` elements: w * dmax, or 0
// when such windows are read in place.
constexpr std::int64_t gather_elements(std::int64_t w, std::int64_t dmax) {
  return dmax > 0 && w <= kGatherElements / dmax ? w * dmax : 0;
}
// The entry of head h over a gathered window (`d` elements a token, tokens adjacent): the
// policy's row_kernels window path where it applies, else its compress().
template <class T, class Policy>
void compress_gathered(const Policy& policy, std::int64_t h, const T* win, std::int64_t d,
                       float* out) {
  if (!policy_compress_rows<T>(policy, h, win, d, out))
    policy.compress(h, StridedWindowLoader<T>{win, d}, out);
}

// Windows per row_kernels<Policy>::run call of compress_window_range: 16 from the caches (a
// run reads the block after its last window again, which the next run reads too); 4 for
// DRAM-sized calls, where the policy also prefetches the rows of its later runs as it goes
// (both faster there, see docs/kernels.md).
constexpr std::int64_t kRunWindows = 16;
constexpr std::int64_t kRunWindowsLarge = 4;

// row_kernels<Policy>::run over windows [j, j + count) of head h when the policy has that
// fast path; false otherwise (or when the policy declines). Row r of `entries` holds entry
// `entry_first + r`.
template <class T, class Policy>
PHASEKV_FORCEINLINE bool compress_run_rows(const Policy& policy, const StridedView<const T>& raw,
                                           std::int64_t first, const StridedView<T>& entries,
                                           std::int64_t entry_first, const Geometry& g,
                                           std::int64_t j, std::int64_t count, std::int64_t h,
                                           bool stream, bool prefetch) {
  if constexpr (has_compress_rows_run<Policy, T>::value) {
    const std::int64_t t0 = g.window_begin(j) - first;
    return row_kernels<Policy>::run(policy, h, raw.ptr(t0, h), raw.token_stride, count,
                                    entries.ptr(j - entry_first, h), entries.token_stride, stream,
                                    prefetch ? raw.tokens - t0 : 0);
  } else {
    (void)policy, (void)raw, (void)first, (void)entries, (void)entry_first, (void)g, (void)j;
    (void)count, (void)h;
    (void)stream;
    (void)prefetch;
    return false;
  }
}

// Tokens a window adds to its predecessor (all W of them when windows do not overlap).
constexpr std::int64_t new_tokens_per_window(const Geometry& g) {
  return g.stride() < g.window() ? g.stride() : g.window();
}

// The loop of compress_entries. Large: the tokens window j + ahead adds to its predecessor
// are prefetched before window j is compressed, and with `stream` the entries are written with
// non-temporal stores. Row r of `raw` holds position `first + r`, row r of `entries` entry
// `entry_first + r`.
template <bool Large, class T, class Policy>
void compress_window_range(const Policy& policy, const StridedView<const T>& raw,
                           std::int64_t first, const StridedView<T>& entries,
                           std::int64_t entry_first, std::int64_t j_begin, std::int64_t j_end,
                           float* scratch, std::int64_t ahead, bool stream) {
  const Geometry g = policy.geometry();
  const std::int64_t dout = policy.output_dim();
  const std::int64_t new_tokens = new_tokens_per_window(g);
  const std::int64_t row_bytes = raw.dim * static_cast<std::int64_t>(sizeof(T));
  alignas(64) float pair[has_compress_rows2<Policy, T>::value ? kPairScratch : 1];
  const auto store = [&](std::int64_t j, std::int64_t h, const float* src) {
    if (Large && stream)
      rows::store_row_stream(entries.ptr(j - entry_first, h), src, dout);
    else
      rows::store_row(entries.ptr(j - entry_first, h), src, dout);
  };
  std::int64_t j = j_begin;
  if constexpr (has_compress_rows_run<Policy, T>::value) {
    // Runs of `run` windows, head by head, while the policy takes them (whether it does
    // depends on its configuration, so in practice on the first call); with Large, the policy
    // is asked to prefetch the rows of its later runs itself, spread over its work (a burst of
    // prefetches before each run stalled the core). The
    // per-window loop below takes over from a declined run (heads already written get the
    // same bits again).
    constexpr std::int64_t run = Large ? kRunWindowsLarge : kRunWindows;
    for (; j < j_end; j += run) {
      const std::int64_t count = j_end - j < run ? j_end - j : run;
      bool taken = true;
      for (std::int64_t h = 0; taken && h < raw.heads; ++h)
        taken = compress_run_rows<T>(policy, raw, first, entries, entry_first, g, j, count, h,
                                     Large && stream, Large);
      if (!taken) break;
    }
  }
  for (; j < j_end; ++j) {
    const bool pf = Large && j + ahead < j_end;
    const std::int64_t t_end = pf ? g.window_end(j + ahead) - first : 0;
    for (std::int64_t h = 0; h < raw.heads; ++h) {
      if (pf)
        for (std::int64_t t = t_end - new_tokens; t < t_end; ++t)
          prefetch_l2(raw.ptr(t, h), row_bytes);
      if (h + 1 < raw.heads &&
          compress_window_rows2<T>(policy, raw, first, g, j, h, scratch, pair)) {
        if (pf)
          for (std::int64_t t = t_end - new_tokens; t < t_end; ++t)
            prefetch_l2(raw.ptr(t, h + 1), row_bytes);
        store(j, h, scratch);
        store(j, ++h, pair);
        continue;
      }
      if (!compress_window_rows<T>(policy, raw, first, g, j, h, scratch))
        policy.compress(
            h, StridedWindowLoader<T>{raw.ptr(g.window_begin(j) - first, h), raw.token_stride},
            scratch);
      store(j, h, scratch);
    }
  }
  if (Large && stream) rows::store_fence();
}

// Raw bytes (read by one compress_entries call) from which compress_entries prefetches the
// raw rows ahead in software. A call this large cannot tell whether its rows are still in a
// cache (a chunk the engine has just projected) or come from DRAM (a streamed prefill, a
// chunk of a long prompt): prefetching costs rows that are cached about a tenth of their
// speed, and gains rows from DRAM half of theirs, so every call past the first-level caches'
// reach prefetches. Streaming appends of >= 512 tokens take it like compress_batch does.
constexpr std::int64_t kPrefetchRawBytes = std::int64_t{256} << 10;
// Entry bytes (written by such a call) from which the entries bypass the caches. A streaming
// append of 512 tokens at W8/S4 hands this loop the 127 windows that lie inside the chunk
// (the 128th straddles the next one): 254 KiB of entries for 8 heads x 128 bf16, so a 256 KiB
// threshold left every chunk on plain stores (a read for ownership per line).
constexpr std::int64_t kStreamEntryBytes = std::int64_t{128} << 10;
}  // namespace detail

/// Validates the arguments of compress_batch without writing anything; returns J(n), the
/// number of entries compress_batch would write. Throws phasekv::shape_error /
/// phasekv::capacity_error naming the bad argument.
template <class T, class Policy>
std::int64_t check_compress_batch(const Policy& policy,
                                  const detail::non_deduced_t<StridedView<const T>>& raw,
                                  const StridedView<T>& entries) {
  check_policy<Policy>();
  const char* where = "phasekv::compress_batch";
  check_view(raw, where, "raw");
  check_view(entries, where, "entries");
  check_policy_dims(policy, raw.heads, where, "policy");
  detail::check_arg<shape_error>(raw.dim == policy.input_dim(), where, "raw.dim", raw.dim,
                                 "must equal policy.input_dim()");
  detail::check_arg<shape_error>(entries.dim == policy.output_dim(), where, "entries.dim",
                                 entries.dim, "must equal policy.output_dim()");
  detail::check_arg<shape_error>(entries.heads == raw.heads, where, "entries.heads", entries.heads,
                                 "must equal raw.heads");
  const std::int64_t j = policy.geometry().complete_windows(raw.tokens);
  if (raw.heads > 0)
    detail::check_arg<capacity_error>(entries.tokens >= j, where, "entries.tokens", entries.tokens,
                                      "must hold J(raw.tokens) entries (one per complete window)");
  return j;
}

namespace detail {
// compress_entries over a raw view whose row r holds position `first + r` (the windows
// [j_begin, j_end) must lie in it) into an entry view whose row r holds entry
// `entry_first + r`: the one window loop of compress_batch, CompressedCache::append and
// paged_append. `pass_windows` > 0 says the call is part of a pass over that many windows of
// `raw` (paged_append makes one call per entry page): the prefetch and store choices follow
// the pass, not the call.
template <class T, class Policy>
void compress_entries_at(const Policy& policy, const StridedView<const T>& raw, std::int64_t first,
                         const StridedView<T>& entries, std::int64_t j_begin, std::int64_t j_end,
                         float* scratch, std::int64_t entry_first = 0,
                         std::int64_t pass_windows = 0) {
  // Calls of at least kPrefetchRawBytes: software prefetch of the raw rows about 48 KiB ahead
  // into L2 (a window reads its W tokens of every head at the token stride, which the hardware
  // prefetchers follow poorly from DRAM), and, when the entries exceed kStreamEntryBytes,
  // non-temporal entry stores (no read for ownership). Small calls, whose rows the caches
  // hold, take the other instance of the loop, compiled as if neither existed.
  const std::int64_t window_bytes = new_tokens_per_window(policy.geometry()) * raw.heads * raw.dim *
                                    static_cast<std::int64_t>(sizeof(T));
  const std::int64_t count =
      pass_windows > 0 ? pass_windows : (j_end > j_begin ? j_end - j_begin : 0);
  if (count * window_bytes >= kPrefetchRawBytes) {
    const std::int64_t want = (std::int64_t{48} << 10) / window_bytes;
    // only when every entry row starts on a cache line and fills whole lines: rows with
    // partial lines at their ends streamed at half the speed of plain stores
    const std::int64_t es = static_cast<std::int64_t>(sizeof(T));
    const bool lines = reinterpret_cast<std::uintptr_t>(entries.data) % 64 == 0 &&
                       (entries.token_stride * es) % 64 == 0 &&
                       (entries.head_stride * es) % 64 == 0 && (policy.output_dim() * es) % 64 == 0;
    const bool stream = rows::streaming_stores() && lines &&
                        count * entries.heads * policy.output_dim() * es >= kStreamEntryBytes;
    compress_window_range<true, T>(policy, raw, first, entries, entry_first, j_begin, j_end,
                                   scratch, want < 1 ? 1 : (want > 64 ? 64 : want), stream);
  } else {
    compress_window_range<false, T>(policy, raw, first, entries, entry_first, j_begin, j_end,
                                    scratch, 0, false);
  }
}

}  // namespace detail

/// Compresses entries `[j_begin, j_end)` of every KV head: entry j of head h is
/// `policy.compress(h, window j of raw, ...)`, converted with `from_float<T>` and stored at
/// `entries(j, h, :)`. No argument checks (see check_compress_batch); `scratch` must hold
/// `policy.output_dim()` floats. This is the building block for engines that split the work
/// over their own threads. Policies with CPU fast paths (a phasekv::row_kernels
/// specialization) take them (same bits) where they apply. Calls over more than 256 KiB of raw
/// rows prefetch them in software, and calls that write at least 128 KiB of entries may write
/// them with non-temporal stores (fenced before returning); the bits are the same.
template <class T, class Policy>
void compress_entries(const Policy& policy, const detail::non_deduced_t<StridedView<const T>>& raw,
                      const StridedView<T>& entries, std::int64_t j_begin, std::int64_t j_end,
                      float* scratch) {
  detail::compress_entries_at<T>(policy, raw, 0, entries, j_begin, j_end, scratch);
}

/// Batch compression of a prefill.
///
/// @param policy  the compressor (its geometry decides the windows).
/// @param origins per-KV-head origins O_h (`raw.heads` of them, each in `[0, 2^40]`; the
///                policy's origin must then be 0), or empty: every head at the policy's origin.
///                Entry j of head h is then window `[O_h + j*S, O_h + j*S + W)` of head h,
///                written for `j < J_h(n)`; rows at and above J_h(n) of head h are left
///                untouched.
/// @param raw     `[n, kv_heads, d_in]` raw keys or values; token t is absolute position t
///                (the prefix included), any token/head strides (NHD, HND, ...).
/// @param entries `[>= J(n), kv_heads, d_out]` output; entry j goes to token index j.
/// @param thread_index, thread_count  process only this thread's share of the entries
///                (contiguous blocks of windows), so an engine's own pool can drive it;
///                the default processes everything.
/// @return J(n), the number of entry rows written by all threads together (max_h J_h(n)).
///
/// Throws (before writing anything) phasekv::shape_error on dimension/head mismatches, null
/// data with a non-zero extent, or a policy whose kv_heads() differs from `raw.heads`,
/// phasekv::capacity_error when `entries` is too short, and phasekv::invalid_argument naming
/// `origins.size()`, `origins[h]` or `policy.geometry().origin()`. The result is bit-identical
/// to streaming the same tokens through a CompressedCache with the same policy and origins.
template <class T, class Policy>
std::int64_t compress_batch(const Policy& policy, const std::vector<std::int64_t>& origins,
                            detail::non_deduced_t<StridedView<const T>> raw, StridedView<T> entries,
                            int thread_index = 0, int thread_count = 1) {
  const char* where = "phasekv::compress_batch";
  detail::check_arg(thread_count >= 1, where, "thread_count", thread_count, "must be >= 1");
  detail::check_arg(thread_index >= 0 && thread_index < thread_count, where, "thread_index",
                    thread_index, "must be in [0, thread_count)");
  // This thread's share [lo, hi) of j entries.
  const auto share = [&](std::int64_t j, std::int64_t& lo, std::int64_t& hi) {
    const std::int64_t per = (j + thread_count - 1) / thread_count;
    lo = per * thread_index < j ? per * thread_index : j;
    hi = lo + per < j ? lo + per : j;
  };
  std::int64_t lo = 0, hi = 0;
  if (origins.empty()) {
    const std::int64_t j = check_compress_batch<T>(policy, raw, entries);
    share(j, lo, hi);
    if (lo >= hi) return j;
    std::vector<float> scratch(static_cast<std::size_t>(policy.output_dim()));
    compress_entries<T>(policy, raw, entries, lo, hi, scratch.data());
    return j;
  }
  // Per-head origins: each run of heads with one origin is the policy's heads of that run
  // (HeadPolicy) over those heads' rows, through the same window loop.
  check_view(raw, where, "raw");
  resolve_origins(where, policy.geometry(), origins, raw.heads);
  check_policy_dims(policy, raw.heads, where, "policy");
  detail::check_arg<shape_error>(entries.heads == raw.heads, where, "entries.heads", entries.heads,
                                 "must equal raw.heads");
  const std::vector<OriginRun> runs = origin_runs(origins);
  std::int64_t jmax = 0;
  for (const OriginRun& r : runs) {
    const HeadPolicy<Policy> hp(policy, r.head, r.origin, r.count);
    const std::int64_t j = check_compress_batch<T>(hp, head_view(raw, r.head, r.count),
                                                   head_view(entries, r.head, r.count));
    jmax = j > jmax ? j : jmax;
  }
  std::vector<float> scratch(static_cast<std::size_t>(policy.output_dim()));
  for (const OriginRun& r : runs) {
    const HeadPolicy<Policy> hp(policy, r.head, r.origin, r.count);
    share(hp.geometry().complete_windows(raw.tokens), lo, hi);
    if (lo < hi)
      compress_entries<T>(hp, head_view(raw, r.head, r.count), head_view(entries, r.head, r.count),
                          lo, hi, scratch.data());
  }
  return jmax;
}

/// compress_batch with every head at the policy's origin (the uniform case, empty origins).
template <class T, class Policy>
std::int64_t compress_batch(const Policy& policy, detail::non_deduced_t<StridedView<const T>> raw,
                            StridedView<T> entries, int thread_index = 0, int thread_count = 1) {
  return compress_batch<T>(policy, std::vector<std::int64_t>{}, raw, entries, thread_index,
                           thread_count);
}

PHASEKV_NAMESPACE_END
