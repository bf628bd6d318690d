/// @file
/// @brief CPU prefill attention: T queries at consecutive positions `first .. first + T - 1`,
/// each with its own visible set (prefix, the compressed entries whose windows are complete at
/// that query, the raw band), or plain causal / sliding-window attention in uncompressed mode.
///
/// Work items are (KV head, tile of queries); a tile's G * T_tile query rows meet each block of
/// keys once (packed to f32), with register-tiled Q.K^T and P.V micro-kernels and a per-row
/// online softmax. Items are dealt round-robin over (thread index, thread count).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "phasekv/attention/cpu/arch.hpp"
#include "phasekv/attention/cpu/decode_block.hpp"
#include "phasekv/attention/cpu/prefill_block.hpp"
#include "phasekv/attention/cpu/split.hpp"
#include "phasekv/attention/cpu/variant_check.hpp"
#include "phasekv/attention/cpu/visibility_rule.hpp"
#include "phasekv/attention/params.hpp"
#include "phasekv/attention/softmax_state.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/view.hpp"

namespace phasekv {
namespace cpu {

/// Everything a prefill chunk needs (the inputs of reference_prefill plus the output).
template <class T, class Variant = StandardVariant>
struct PrefillArgs {
  const float* q = nullptr;        ///< Queries `[num_queries, q_heads, d_k]` row-major.
  std::int64_t num_queries = 0;    ///< T >= 0.
  std::int64_t q_heads = 0;        ///< Hq, a multiple of kv_heads.
  std::int64_t kv_heads = 0;       ///< Hkv.
  std::int64_t d_k = 0;            ///< Key head dim.
  std::int64_t d_v = 0;            ///< Value head dim.
  std::int64_t first = 0;          ///< Position of query 0.
  VisibilityRule rule = VisibilityRule::causal();  ///< Compressed or uncompressed visibility.
  StridedView<const T> raw_k;      ///< Raw keys by absolute position (>= first + T tokens).
  StridedView<const T> raw_v;      ///< Raw values by absolute position.
  StridedView<const T> entry_k;    ///< Entry keys by window index (>= J(first + T)).
  StridedView<const T> entry_v;    ///< Entry values by window index.
  Variant variant{};               ///< Logit transform, entry bias, sinks.
  float* out = nullptr;            ///< Output `[num_queries, q_heads, d_v]`.
  float* lse = nullptr;            ///< Log-sum-exp `[num_queries, q_heads]`.
};

/// Checks `args`; throws phasekv::invalid_argument (shape_error, capacity_error) naming the bad
/// argument.
template <class T, class Variant>
void check_prefill_args(const PrefillArgs<T, Variant>& a, const char* where) {
  phasekv::detail::check_arg(a.num_queries >= 0, where, "num_queries", a.num_queries, "must be >= 0");
  phasekv::detail::check_arg(a.q_heads >= 1, where, "q_heads", a.q_heads, "must be >= 1");
  phasekv::detail::check_arg(a.kv_heads >= 1, where, "kv_heads", a.kv_heads, "must be >= 1");
  phasekv::detail::check_arg<shape_error>(a.q_heads % a.kv_heads == 0, where, "q_heads", a.q_heads,
                                 "must be a multiple of kv_heads");
  phasekv::detail::check_arg<shape_error>(a.d_k >= 1, where, "d_k", a.d_k, "must be >= 1");
  phasekv::detail::check_arg<shape_error>(a.d_v >= 1, where, "d_v", a.d_v, "must be >= 1");
  Geometry::check_length(where, "first", a.first);
  detail::check_variant(a.variant, where);
  if (a.num_queries == 0) return;
  phasekv::detail::check_arg(a.q != nullptr, where, "q", "null", "must point to [T, q_heads, d_k] floats");
  phasekv::detail::check_arg(a.out != nullptr, where, "out", "null",
                    "must point to [T, q_heads, d_v] floats");
  phasekv::detail::check_arg(a.lse != nullptr, where, "lse", "null", "must point to [T, q_heads] floats");
  const std::int64_t n_end = a.first + a.num_queries;
  check_view(a.raw_k, where, "raw_k");
  check_view(a.raw_v, where, "raw_v");
  phasekv::detail::check_arg<capacity_error>(a.raw_k.tokens >= n_end, where, "raw_k.tokens",
                                    a.raw_k.tokens, "must be >= first + num_queries");
  phasekv::detail::check_arg<capacity_error>(a.raw_v.tokens >= n_end, where, "raw_v.tokens",
                                    a.raw_v.tokens, "must be >= first + num_queries");
  phasekv::detail::check_arg<shape_error>(a.raw_k.heads == a.kv_heads, where, "raw_k.heads",
                                 a.raw_k.heads, "must equal kv_heads");
  phasekv::detail::check_arg<shape_error>(a.raw_v.heads == a.kv_heads, where, "raw_v.heads",
                                 a.raw_v.heads, "must equal kv_heads");
  phasekv::detail::check_arg<shape_error>(a.raw_k.dim == a.d_k, where, "raw_k.dim", a.raw_k.dim,
                                 "must equal d_k");
  phasekv::detail::check_arg<shape_error>(a.raw_v.dim == a.d_v, where, "raw_v.dim", a.raw_v.dim,
                                 "must equal d_v");
  const std::int64_t J = a.rule.at(n_end).entries;
  if (J > 0) {
    check_view(a.entry_k, where, "entry_k");
    check_view(a.entry_v, where, "entry_v");
    phasekv::detail::check_arg<capacity_error>(a.entry_k.tokens >= J, where, "entry_k.tokens",
                                      a.entry_k.tokens, "must hold J(first + num_queries)");
    phasekv::detail::check_arg<capacity_error>(a.entry_v.tokens >= J, where, "entry_v.tokens",
                                      a.entry_v.tokens, "must hold J(first + num_queries)");
    phasekv::detail::check_arg<shape_error>(a.entry_k.heads == a.kv_heads, where, "entry_k.heads",
                                   a.entry_k.heads, "must equal kv_heads");
    phasekv::detail::check_arg<shape_error>(a.entry_v.heads == a.kv_heads, where, "entry_v.heads",
                                   a.entry_v.heads, "must equal kv_heads");
    phasekv::detail::check_arg<shape_error>(a.entry_k.dim == a.d_k, where, "entry_k.dim", a.entry_k.dim,
                                   "must equal d_k");
    phasekv::detail::check_arg<shape_error>(a.entry_v.dim == a.d_v, where, "entry_v.dim", a.entry_v.dim,
                                   "must equal d_v");
  }
}

namespace detail {

/// Queries per prefill tile for a GQA group of `group` heads (about 64 rows per tile).
inline std::int64_t prefill_tile_queries(std::int64_t group) {
  const std::int64_t t = 64 / group;
  return t > 0 ? t : 1;
}

/// Scratch of one prefill worker (f32 packed tiles, the score block and row states).
struct PrefillScratch {
  std::vector<float> qp, kp, vp, s, o, mx, den, corr;
  std::vector<Visibility> vis;
};

/// One work item: KV head `kh`, queries `[i0, i1)`.
template <class Arch, class T, class Variant>
void prefill_item(const PrefillArgs<T, Variant>& a, std::int64_t kh, std::int64_t i0,
                  std::int64_t i1, PrefillScratch& w) {
  using O = Vec<Arch>;
  constexpr std::int64_t KB = kPrefillKeys;
  const std::int64_t G = a.q_heads / a.kv_heads;
  const std::int64_t nq = i1 - i0, M = nq * G;
  const std::int64_t dkp = round_up(a.d_k, O::W), dvp = round_up(a.d_v, 2 * O::W);
  w.qp.resize(static_cast<std::size_t>(M * dkp));
  w.kp.resize(static_cast<std::size_t>(KB * dkp));
  w.vp.resize(static_cast<std::size_t>(KB * dvp));
  w.s.resize(static_cast<std::size_t>(M * KB));
  w.o.assign(static_cast<std::size_t>(M * dvp), 0.0f);
  w.mx.assign(static_cast<std::size_t>(M), neg_inf());
  w.den.assign(static_cast<std::size_t>(M), 0.0f);
  w.corr.resize(static_cast<std::size_t>(M));
  w.vis.resize(static_cast<std::size_t>(nq));
  // rows r = (i - i0) * G + g
  std::int64_t pre_hi = 0, raw_lo = -1, raw_hi = 0, ent_hi = 0;
  for (std::int64_t i = i0; i < i1; ++i) {
    const Visibility v = a.rule.at(a.first + i + 1);
    w.vis[static_cast<std::size_t>(i - i0)] = v;
    pre_hi = v.prefix_end > pre_hi ? v.prefix_end : pre_hi;
    ent_hi = v.entries > ent_hi ? v.entries : ent_hi;
    if (v.raw_count() > 0) {
      raw_lo = (raw_lo < 0 || v.raw_begin < raw_lo) ? v.raw_begin : raw_lo;
      raw_hi = v.raw_end > raw_hi ? v.raw_end : raw_hi;
    }
    for (std::int64_t g = 0; g < G; ++g) {
      const float* src = a.q + (i * a.q_heads + kh * G + g) * a.d_k;
      pack_row<Arch>(src, a.d_k, dkp, w.qp.data() + ((i - i0) * G + g) * dkp);
    }
  }
  float* s = w.s.data();
  // one run of keys [lo, hi) of one kind from (keys, values) views
  const auto run = [&](const StridedView<const T>& kv_k, const StridedView<const T>& kv_v,
                       std::int64_t lo, std::int64_t hi, SegmentKind kind) {
    for (std::int64_t b0 = lo; b0 < hi; b0 += KB) {
      const std::int64_t nk = (hi - b0) < KB ? hi - b0 : KB;
      const std::int64_t nk2 = round_up(nk, 2);
      for (std::int64_t k = 0; k < nk; ++k) {
        pack_row<Arch>(kv_k.ptr(b0 + k, kh), a.d_k, dkp, w.kp.data() + k * dkp);
        pack_row<Arch>(kv_v.ptr(b0 + k, kh), a.d_v, dvp, w.vp.data() + k * dvp);
      }
      for (std::int64_t k = nk; k < nk2; ++k)
        for (std::int64_t i = 0; i < dkp; ++i) w.kp[static_cast<std::size_t>(k * dkp + i)] = 0.0f;
      qk_block_d<Arch>(w.qp.data(), M, w.kp.data(), nk2, dkp, s, KB);
      for (std::int64_t r = 0; r < M; ++r) {
        const Visibility& v = w.vis[static_cast<std::size_t>(r / G)];
        std::int64_t vlo, vhi;  // visible interval of this row, in run coordinates
        if (kind == SegmentKind::prefix) {
          vlo = 0;
          vhi = v.prefix_end;
        } else if (kind == SegmentKind::compressed) {
          vlo = 0;
          vhi = v.entries;
        } else {
          vlo = v.raw_begin;
          vhi = v.raw_end;
        }
        std::int64_t a0 = vlo - b0, a1 = vhi - b0;  // visible keys [a0, a1) in the block
        a0 = a0 < 0 ? 0 : (a0 > nk ? nk : a0);
        a1 = a1 < a0 ? a0 : (a1 > nk ? nk : a1);
        float* row = s + r * KB;
        if (a1 > a0) transform_logits<Arch>(a.variant, kind, row + a0, a1 - a0);
        for (std::int64_t k = 0; k < a0; ++k) row[k] = neg_inf();
        for (std::int64_t k = a1; k < KB; ++k) row[k] = neg_inf();
        w.corr[static_cast<std::size_t>(r)] =
            softmax_block<Arch>(row, KB, KB, w.mx[static_cast<std::size_t>(r)],
                                w.den[static_cast<std::size_t>(r)]);
      }
      pv_block<Arch>(s, M, KB, w.vp.data(), nk, dvp, w.o.data(), w.corr.data());
    }
  };
  if (pre_hi > 0) run(a.raw_k, a.raw_v, 0, pre_hi, SegmentKind::prefix);
  if (ent_hi > 0) run(a.entry_k, a.entry_v, 0, ent_hi, SegmentKind::compressed);
  if (raw_lo >= 0 && raw_hi > raw_lo) run(a.raw_k, a.raw_v, raw_lo, raw_hi, SegmentKind::raw);
  // finish rows
  for (std::int64_t r = 0; r < M; ++r) {
    const std::int64_t i = i0 + r / G, h = kh * G + r % G;
    float* dst = a.out + (i * a.q_heads + h) * a.d_v;
    const float* src = w.o.data() + r * dvp;
    const float den = w.den[static_cast<std::size_t>(r)];
    float l = neg_inf();
    if (den > 0.0f) {
      const float inv = 1.0f / den;
      for (std::int64_t c = 0; c < a.d_v; ++c) dst[c] = src[c] * inv;
      l = w.mx[static_cast<std::size_t>(r)] + std::log(den);
    } else {
      for (std::int64_t c = 0; c < a.d_v; ++c) dst[c] = 0.0f;
    }
    if (a.variant.has_sink()) apply_sink(dst, l, a.variant.sink(h), a.d_v);
    a.lse[i * a.q_heads + h] = l;
  }
}

}  // namespace detail

/// Number of (KV head, query tile) work items of a prefill call; prefill_partition deals them
/// round-robin, so more threads than items leaves some idle.
template <class T, class Variant>
std::int64_t prefill_work_items(const PrefillArgs<T, Variant>& args) {
  const std::int64_t tq = detail::prefill_tile_queries(args.q_heads / args.kv_heads);
  return args.kv_heads * ((args.num_queries + tq - 1) / tq);
}

/// Computes the share `thread_index` of `thread_count` of a prefill call (work items
/// `thread_index, thread_index + thread_count, ...`), writing their rows of `args.out` and
/// `args.lse`. Safe to call concurrently for different indices. Allocates its own f32 scratch
/// (about 64 x (d_k + 2 d_v + 64) floats plus one key block).
template <class Arch = NativeArch, class T, class Variant>
void prefill_partition(const PrefillArgs<T, Variant>& args, int thread_index, int thread_count) {
  const char* where = "phasekv::cpu::prefill_partition";
  check_partition(where, thread_index, thread_count);
  check_prefill_args(args, where);
  if (args.num_queries == 0) return;
  const std::int64_t G = args.q_heads / args.kv_heads;
  const std::int64_t tq = detail::prefill_tile_queries(G);
  const std::int64_t tiles = (args.num_queries + tq - 1) / tq;
  detail::PrefillScratch scratch;
  for (std::int64_t item = thread_index; item < args.kv_heads * tiles; item += thread_count) {
    const std::int64_t kh = item % args.kv_heads, tile = item / args.kv_heads;
    const std::int64_t i0 = tile * tq;
    const std::int64_t i1 = (i0 + tq) < args.num_queries ? i0 + tq : args.num_queries;
    detail::prefill_item<Arch>(args, kh, i0, i1, scratch);
  }
}

/// Single-threaded prefill of the whole chunk.
template <class Arch = NativeArch, class T, class Variant>
void prefill(const PrefillArgs<T, Variant>& args) {
  prefill_partition<Arch>(args, 0, 1);
}

}  // namespace cpu
}  // namespace phasekv
