/// @file
/// @brief CPU prefill attention: T queries at consecutive positions `first .. first + T - 1`,
/// each with its own visible set (prefix, the compressed entries whose windows are complete at
/// that query, the raw band), or plain causal / sliding-window attention in uncompressed mode.
///
/// Work items are (KV head, up to 1024 query rows = queries x GQA group); inside an item each
/// block of 64 keys is packed to f32 once and met by every tile of 64 query rows, with
/// register-tiled Q.K^T and P.V micro-kernels and a per-row online softmax, so every K/V byte
/// is read from memory once per item. Items are dealt round-robin over (thread index, thread
/// count).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "phasekv/attention/cpu/arch.hpp"
#include "phasekv/attention/cpu/decode_block.hpp"
#include "phasekv/attention/cpu/dispatch.hpp"
#include "phasekv/attention/cpu/prefill_block.hpp"
#include "phasekv/attention/cpu/split.hpp"
#include "phasekv/attention/cpu/variant_check.hpp"
#include "phasekv/attention/cpu/visibility_rule.hpp"
#include "phasekv/attention/args.hpp"
#include "phasekv/attention/params.hpp"
#include "phasekv/attention/softmax_state.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/view.hpp"
#include "phasekv/phase/origins.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cpu {

/// Everything a prefill chunk needs (the inputs of reference_prefill plus the output).
template <class T, class Variant = StandardVariant>
struct PrefillArgs {
  const float* q = nullptr;      ///< Queries `[num_queries, q_heads, d_k]` row-major.
  std::int64_t num_queries = 0;  ///< T >= 0.
  std::int64_t q_heads = 0;      ///< Hq, a multiple of kv_heads.
  std::int64_t kv_heads = 0;     ///< Hkv.
  std::int64_t d_k = 0;          ///< Key head dim.
  std::int64_t d_v = 0;          ///< Value head dim.
  std::int64_t first = 0;        ///< Position of query 0.
  VisibilityRule rule = VisibilityRule::causal();  ///< Compressed or uncompressed visibility.
  /// Per-KV-head origins, `[kv_heads]` (KV head h sees `rule.with_origin(origins[h])`: its own
  /// raw prefix, entries and raw tail; `rule` must then be compressed with origin 0), or null:
  /// every head sees `rule`. Entry row j of head h is head h's entry j (compress_batch with
  /// the same origins writes them so).
  const std::int64_t* origins = nullptr;
  StridedView<const T> raw_k;    ///< Raw keys by absolute position (>= first + T tokens).
  StridedView<const T> raw_v;    ///< Raw values by absolute position.
  StridedView<const T> entry_k;  ///< Entry keys by window index (>= J(first + T)).
  StridedView<const T> entry_v;  ///< Entry values by window index.
  Variant variant{};             ///< Logit transform, entry bias, sinks.
  float* out = nullptr;          ///< Output `[num_queries, q_heads, d_v]`.
  float* lse = nullptr;          ///< Log-sum-exp `[num_queries, q_heads]`.

  /// What KV head `kh` sees: `rule`, or `rule.with_origin(origins[kh])`.
  PHASEKV_HOST_DEVICE VisibilityRule head_rule(std::int64_t kh) const {
    return origins == nullptr ? rule : rule.with_origin(origins[kh]);
  }
};

/// Checks `args` (the checks every prefill entry point makes once, attention/args.hpp);
/// throws phasekv::invalid_argument (shape_error, capacity_error) naming the bad argument.
template <class T, class Variant>
void check_prefill_args(const PrefillArgs<T, Variant>& a, const char* where) {
  phasekv::detail::check_arg(a.num_queries >= 0, where, "num_queries", a.num_queries,
                             "must be >= 0");
  phasekv::detail::check_head_shape(where, a.q_heads, a.kv_heads, a.d_k, a.d_v);
  Geometry::check_length(where, "first", a.first);
  detail::check_variant(a.variant, where);
  if (a.origins != nullptr) {
    phasekv::detail::check_arg(a.rule.is_compressed(), where, "origins", "non-null",
                               "needs a compressed rule (uncompressed rules have no windows)");
    phasekv::detail::check_arg(a.rule.geometry().origin() == 0, where, "rule.geometry().origin()",
                               a.rule.geometry().origin(),
                               "must be 0 with per-head origins (origins[h] is head h's origin)");
    check_origins(where, std::vector<std::int64_t>(a.origins, a.origins + a.kv_heads), a.kv_heads);
  }
  if (a.num_queries == 0) return;
  phasekv::detail::check_arg(a.q != nullptr, where, "q", "null",
                             "must point to [T, q_heads, d_k] floats");
  phasekv::detail::check_arg(a.out != nullptr, where, "out", "null",
                             "must point to [T, q_heads, d_v] floats");
  phasekv::detail::check_arg(a.lse != nullptr, where, "lse", "null",
                             "must point to [T, q_heads] floats");
  phasekv::detail::KVShape shape;
  shape.heads = a.kv_heads;
  shape.d_k = a.d_k;
  shape.d_v = a.d_v;
  const std::int64_t n_end = a.first + a.num_queries;
  phasekv::detail::check_kv_views(where, "raw_k", a.raw_k, "raw_v", a.raw_v, shape, n_end,
                                  "must be >= first + num_queries");
  std::int64_t J = 0;
  for (std::int64_t kh = 0; kh < (a.origins != nullptr ? a.kv_heads : 1); ++kh) {
    const std::int64_t j = a.head_rule(kh).at(n_end).entries;
    J = j > J ? j : J;
  }
  if (J > 0)
    phasekv::detail::check_kv_views(where, "entry_k", a.entry_k, "entry_v", a.entry_v, shape, J,
                                    "must hold J(first + num_queries)");
}

namespace detail {

/// Query rows (queries x GQA group) per prefill work item: a work item's rows meet every key
/// block once, so each K/V byte is read from memory once per item.
constexpr std::int64_t kPrefillItemRows = 1024;
/// Query rows per register/cache tile inside a work item.
constexpr std::int64_t kPrefillRowTile = 64;

/// Queries per prefill work item: at most kPrefillItemRows rows, and small enough that there
/// are about two items per thread. Depends only on the arguments and `thread_count`, so every
/// thread computes the same split.
inline std::int64_t prefill_tile_queries(std::int64_t num_queries, std::int64_t kv_heads,
                                         std::int64_t group, int thread_count) {
  std::int64_t cap = kPrefillItemRows / group;
  if (cap < 1) cap = 1;
  const std::int64_t want_items = 2 * static_cast<std::int64_t>(thread_count);
  const std::int64_t want_tiles = (want_items + kv_heads - 1) / kv_heads;
  std::int64_t tq = (num_queries + want_tiles - 1) / want_tiles;
  if (tq < 1) tq = 1;
  return tq < cap ? tq : cap;
}

/// Keys per packed block of the prefill kernel (kPrefillKeys of every target pass; the scratch
/// layout is sized with it).
constexpr std::int64_t kPrefillScratchKeys = 64;

/// Byte offsets of the regions of one prefill worker's scratch, for work items of up to
/// `rows` (queries x GQA group) rows and `queries` queries, from a 64-byte aligned base; each
/// region starts on a 64-byte line. Sized for the widest vectors of any pass (16 f32 lanes),
/// so one layout serves every instruction set.
struct PrefillScratchLayout {
  std::size_t qp = 0, kp = 0, vp = 0, s = 0, o = 0, mx = 0, den = 0, corr = 0;
  std::size_t lo = 0, hi = 0, rows = 0, vis = 0;
  std::size_t bytes = 0;  ///< Total bytes (a multiple of 64).
};

/// The scratch layout of work items of at most `rows` rows and `queries` queries with head
/// dims d_k / d_v (all >= 0, and small enough: callers bound them by kPrefillItemRows).
inline PrefillScratchLayout prefill_scratch_layout(std::int64_t rows, std::int64_t queries,
                                                   std::int64_t d_k, std::int64_t d_v) {
  const auto up = [](std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; };
  const std::size_t R = static_cast<std::size_t>(rows), Q = static_cast<std::size_t>(queries);
  const std::size_t dkp = static_cast<std::size_t>(up(d_k, 16));
  const std::size_t dvp = static_cast<std::size_t>(up(d_v, 32));
  const std::size_t KB = static_cast<std::size_t>(kPrefillScratchKeys);
  const std::size_t RT = static_cast<std::size_t>(kPrefillRowTile);
  const std::size_t dk = static_cast<std::size_t>(d_k);
  PrefillScratchLayout L;
  std::size_t at = 0;
  const auto take = [&at](std::size_t bytes) {
    const std::size_t o = at;
    at += (bytes + 63) / 64 * 64;
    return o;
  };
  L.qp = take(R * dkp * sizeof(float));
  L.kp = take(dk * KB * sizeof(float));
  L.vp = take(KB * dvp * sizeof(float));
  L.s = take(RT * KB * sizeof(float));
  L.o = take(R * dvp * sizeof(float));
  L.mx = take(R * sizeof(float));
  L.den = take(R * sizeof(float));
  L.corr = take(RT * sizeof(float));
  L.lo = take(RT * sizeof(std::int64_t));
  L.hi = take(RT * sizeof(std::int64_t));
  L.rows = take(KB * sizeof(void*));
  L.vis = take(Q * sizeof(Visibility));
  L.bytes = at;
  return L;
}

/// Scratch of one prefill worker (f32 packed tiles, the score block and row states): regions
/// of caller memory (bind()) or of memory it allocates itself, laid out by
/// prefill_scratch_layout and handed out by prepare() at the start of each work item.
template <class T>
struct PrefillScratch {
  static_assert(std::is_trivially_copyable<Visibility>::value, "Visibility lives in raw memory");
  float* qp = nullptr;         ///< Packed query rows.
  float* kp = nullptr;         ///< Packed key block.
  float* vp = nullptr;         ///< Packed value block.
  float* s = nullptr;          ///< Score tile.
  float* o = nullptr;          ///< Output accumulators.
  float* mx = nullptr;         ///< Running maxima.
  float* den = nullptr;        ///< Running denominators.
  float* corr = nullptr;       ///< Rescale factors of a row tile.
  std::int64_t* lo = nullptr;  ///< Visible key interval of each row of a tile (begin).
  std::int64_t* hi = nullptr;  ///< Visible key interval of each row of a tile (end).
  const T** rows = nullptr;    ///< Key row pointers of a block.
  Visibility* vis = nullptr;   ///< Visibility of each query of the item.

  /// Uses `bytes` bytes of caller memory at `base` (64-byte aligned) instead of allocating.
  void bind(void* base, std::size_t bytes) {
    ext_ = static_cast<unsigned char*>(base);
    ext_bytes_ = bytes;
  }
  /// Points the regions at scratch for an item of `rows` rows and `queries` queries (caller
  /// memory when bound: it must hold prefill_scratch_layout(...).bytes, which the plans
  /// guarantee; otherwise grown as needed) and empties the row states.
  void prepare(std::int64_t rows_, std::int64_t queries, std::int64_t d_k, std::int64_t d_v) {
    const PrefillScratchLayout L = prefill_scratch_layout(rows_, queries, d_k, d_v);
    unsigned char* base = ext_;
    if (base == nullptr || L.bytes > ext_bytes_) {
      if (own_.size() < L.bytes + 64) own_.resize(L.bytes + 64);
      const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(own_.data());
      base = own_.data() + ((a + 63) / 64 * 64 - a);
    }
    qp = reinterpret_cast<float*>(base + L.qp);
    kp = reinterpret_cast<float*>(base + L.kp);
    vp = reinterpret_cast<float*>(base + L.vp);
    s = reinterpret_cast<float*>(base + L.s);
    o = reinterpret_cast<float*>(base + L.o);
    mx = reinterpret_cast<float*>(base + L.mx);
    den = reinterpret_cast<float*>(base + L.den);
    corr = reinterpret_cast<float*>(base + L.corr);
    lo = reinterpret_cast<std::int64_t*>(base + L.lo);
    hi = reinterpret_cast<std::int64_t*>(base + L.hi);
    rows = reinterpret_cast<const T**>(base + L.rows);
    vis = reinterpret_cast<Visibility*>(base + L.vis);
  }

 private:
  std::vector<unsigned char> own_;
  unsigned char* ext_ = nullptr;
  std::size_t ext_bytes_ = 0;
};

}  // namespace detail
}  // namespace cpu
PHASEKV_NAMESPACE_END

#if !defined(PHASEKV_DOXYGEN)  // the kernel bodies, once per target pass
#define PHASEKV_TARGET_BODY "phasekv/attention/cpu/kernels/prefill.inl"
#include "phasekv/core/foreach_target.inc"
#endif

PHASEKV_NAMESPACE_BEGIN
namespace cpu {

/// Number of (KV head, query tile) work items of a prefill call split for `thread_count`
/// threads; prefill_partition deals them round-robin, so more threads than items leaves some
/// idle.
template <class T, class Variant>
std::int64_t prefill_work_items(const PrefillArgs<T, Variant>& args, int thread_count) {
  const char* where = "phasekv::cpu::prefill_work_items";
  phasekv::detail::check_arg(thread_count >= 1, where, "thread_count", thread_count,
                             "must be >= 1");
  phasekv::detail::check_arg(args.num_queries >= 0, where, "num_queries", args.num_queries,
                             "must be >= 0");
  phasekv::detail::check_head_shape(where, args.q_heads, args.kv_heads, args.d_k, args.d_v);
  const std::int64_t tq = detail::prefill_tile_queries(args.num_queries, args.kv_heads,
                                                       args.q_heads / args.kv_heads, thread_count);
  return args.kv_heads * ((args.num_queries + tq - 1) / tq);
}

namespace detail {

/// prefill_partition after its checks.
template <class Arch, class T, class Variant>
void prefill_partition_unchecked(const PrefillArgs<T, Variant>& args, int thread_index,
                                 int thread_count) {
  if (args.num_queries == 0) return;
  const std::int64_t G = args.q_heads / args.kv_heads;
  const std::int64_t tq = prefill_tile_queries(args.num_queries, args.kv_heads, G, thread_count);
  const std::int64_t tiles = (args.num_queries + tq - 1) / tq;
  PrefillScratch<T> scratch;
  with_arch<Arch>([&](auto tag) {
    using A = decltype(tag);
    for (std::int64_t item = thread_index; item < args.kv_heads * tiles; item += thread_count) {
      const std::int64_t kh = item / tiles, tile = item % tiles;
      const std::int64_t i0 = tile * tq;
      const std::int64_t i1 = (i0 + tq) < args.num_queries ? i0 + tq : args.num_queries;
      kernel_prefill_item(target_t<A>{}, tag, args, kh, i0, i1, scratch);
    }
  });
}

}  // namespace detail

/// Computes the share `thread_index` of `thread_count` of a prefill call (work items
/// `thread_index, thread_index + thread_count, ...`), writing their rows of `args.out` and
/// `args.lse`. Safe to call concurrently for different indices. Allocates its own f32 scratch
/// (up to 1024 x (d_k + d_v) floats for the item's queries and accumulators, plus one packed
/// key/value block and a 64 x 64 score tile).
///
/// @tparam Arch the instruction set: arch::Auto (default) runs the build active_arch() names
/// (dispatch.hpp), an explicit tag selects one at compile time (refused with
/// phasekv::invalid_argument when this CPU cannot run it: cpu::check_cpu_runs).
template <class Arch = arch::Auto, class T, class Variant>
void prefill_partition(const PrefillArgs<T, Variant>& args, int thread_index, int thread_count) {
  const char* where = "phasekv::cpu::prefill_partition";
  check_partition(where, thread_index, thread_count);
  check_prefill_args(args, where);
  detail::prefill_partition_unchecked<Arch>(args, thread_index, thread_count);
}

/// Single-threaded prefill of the whole chunk. `Arch` as for prefill_partition.
template <class Arch = arch::Auto, class T, class Variant>
void prefill(const PrefillArgs<T, Variant>& args) {
  check_prefill_args(args, "phasekv::cpu::prefill");
  detail::prefill_partition_unchecked<Arch>(args, 0, 1);
}

}  // namespace cpu
PHASEKV_NAMESPACE_END
