/// @file
/// @brief CPU decode and prefill with per-KV-head origins (staggered windows): every KV head
/// has its own visible set, so the existing kernels (cpu::decode, cpu::prefill) run once per
/// KV head on that head's visible set and the slice of q / out of its query group. K and V
/// are never copied (one-head views); each head's result equals a one-head call.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "phasekv/attention/args.hpp"
#include "phasekv/attention/cpu/decode.hpp"
#include "phasekv/attention/cpu/prefill.hpp"
#include "phasekv/attention/cpu/split.hpp"
#include "phasekv/attention/cpu/variant_check.hpp"
#include "phasekv/attention/cpu/visibility_rule.hpp"
#include "phasekv/attention/params.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/view.hpp"
#include "phasekv/phase/staggered_geometry.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cpu {

/// A variant whose query head 0 is head `offset` of `inner` (the sinks of one query group).
/// StandardVariant is sliced as a StandardVariant (see slice_variant), so it keeps its kernel
/// paths; this wrapper serves user variants.
template <class Variant>
struct HeadOffsetVariant {
  Variant inner{};          ///< The caller's variant.
  std::int64_t offset = 0;  ///< Query head of `inner` that head 0 stands for.

  /// `inner.logit(dot, kind)`.
  PHASEKV_HOST_DEVICE float logit(float dot, SegmentKind kind) const {
    return inner.logit(dot, kind);
  }
  /// `inner.has_sink()`.
  PHASEKV_HOST_DEVICE bool has_sink() const { return inner.has_sink(); }
  /// `inner.sink(offset + h)`.
  PHASEKV_HOST_DEVICE float sink(std::int64_t h) const { return inner.sink(offset + h); }
  /// The inner variant's host check, when it has one.
  void check(const char* where) const { detail::check_variant(inner, where); }
};

/// The variant of query heads `[offset, ...)`: a StandardVariant with its sinks pointer
/// advanced by `offset`.
inline StandardVariant slice_variant(const StandardVariant& v, std::int64_t offset) {
  StandardVariant s = v;
  if (s.sinks != nullptr) s.sinks += offset;
  return s;
}
/// The variant of query heads `[offset, ...)`: a user variant wrapped in HeadOffsetVariant.
template <class Variant>
HeadOffsetVariant<Variant> slice_variant(const Variant& v, std::int64_t offset) {
  return HeadOffsetVariant<Variant>{v, offset};
}

/// Decode with per-KV-head visible sets.
///
/// @tparam T, Variant as for DecodeArgs.
template <class T, class Variant = StandardVariant>
struct StaggeredDecodeArgs {
  const float* q = nullptr;          ///< Query `[q_heads, d_k]` row-major.
  std::int64_t q_heads = 0;          ///< Hq, a multiple of kv_heads.
  std::int64_t kv_heads = 0;         ///< Hkv.
  std::int64_t d_k = 0;              ///< Key head dim.
  std::int64_t d_v = 0;              ///< Value head dim.
  const VisibleKV<T>* kv = nullptr;  ///< `kv[h]`: what KV head h sees, one-head views
                                     ///< (e.g. StaggeredCache::visible(h)); kv_heads of them.
  Variant variant{};                 ///< Logit transform, entry bias, sinks (per query head).
  float* out = nullptr;              ///< Output `[q_heads, d_v]`.
  float* lse = nullptr;              ///< Log-sum-exp `[q_heads]`.
};

namespace detail {

/// The one-KV-head DecodeArgs of KV head `kh`: its query group's slice of q, out, lse and sinks.
template <class T, class Variant>
auto staggered_head_decode_args(const StaggeredDecodeArgs<T, Variant>& a, std::int64_t kh) {
  const std::int64_t G = a.q_heads / a.kv_heads;
  auto v = slice_variant(a.variant, kh * G);
  DecodeArgs<T, decltype(v)> d;
  d.q = a.q + kh * G * a.d_k;
  d.q_heads = G;
  d.kv_heads = 1;
  d.d_k = a.d_k;
  d.d_v = a.d_v;
  d.kv = a.kv[kh];
  d.variant = v;
  d.out = a.out + kh * G * a.d_v;
  d.lse = a.lse + kh * G;
  return d;
}

template <class T, class Variant>
void check_staggered_decode(const StaggeredDecodeArgs<T, Variant>& a, const char* where) {
  phasekv::detail::check_head_shape(where, a.q_heads, a.kv_heads, a.d_k, a.d_v);
  phasekv::detail::check_arg(a.kv != nullptr, where, "kv", "null",
                             "must point to kv_heads visible sets");
  phasekv::detail::check_arg(a.q != nullptr, where, "q", "null",
                             "must point to [q_heads, d_k] floats");
  phasekv::detail::check_arg(a.out != nullptr, where, "out", "null",
                             "must point to [q_heads, d_v] floats");
  phasekv::detail::check_arg(a.lse != nullptr, where, "lse", "null",
                             "must point to [q_heads] floats");
  for (std::int64_t kh = 0; kh < a.kv_heads; ++kh)
    check_decode_args(staggered_head_decode_args(a, kh), where, true);
}

}  // namespace detail

/// Computes the KV heads `[b, e)` of thread `thread_index` of `thread_count` (contiguous
/// blocks of KV heads; threads beyond kv_heads get none): each head with one cpu::decode call
/// over `args.kv[h]` and its query group. Safe to call concurrently for different indices;
/// every call checks all arguments first and writes nothing when one is bad.
template <class Arch = arch::Auto, class T, class Variant>
void staggered_decode_partition(const StaggeredDecodeArgs<T, Variant>& args, int thread_index,
                                int thread_count) {
  const char* where = "phasekv::cpu::staggered_decode_partition";
  check_partition(where, thread_index, thread_count);
  detail::check_staggered_decode(args, where);
  const WorkRange r = partition_range(args.kv_heads, thread_index, thread_count);
  for (std::int64_t kh = r.begin; kh < r.end; ++kh)
    decode<Arch>(detail::staggered_head_decode_args(args, kh));
}

/// Single-threaded staggered decode of every KV head.
template <class Arch = arch::Auto, class T, class Variant>
void staggered_decode(const StaggeredDecodeArgs<T, Variant>& args) {
  detail::check_staggered_decode(args, "phasekv::cpu::staggered_decode");
  for (std::int64_t kh = 0; kh < args.kv_heads; ++kh)
    decode<Arch>(detail::staggered_head_decode_args(args, kh));
}

/// Prefill with per-KV-head origins: T queries at positions `first .. first + T - 1`; KV head
/// h sees what `Geometry(W, S, O_h).visible(n, local)` gives.
template <class T, class Variant = StandardVariant>
struct StaggeredPrefillArgs {
  const float* q = nullptr;      ///< Queries `[num_queries, q_heads, d_k]` row-major.
  std::int64_t num_queries = 0;  ///< T >= 0.
  std::int64_t q_heads = 0;      ///< Hq, a multiple of kv_heads.
  std::int64_t kv_heads = 0;     ///< Hkv; must equal geometry.kv_heads().
  std::int64_t d_k = 0;          ///< Key head dim.
  std::int64_t d_v = 0;          ///< Value head dim.
  std::int64_t first = 0;        ///< Position of query 0.
  StaggeredGeometry geometry;    ///< W, S and the origin of every KV head.
  std::int64_t local = 0;        ///< Local window L >= 0.
  StridedView<const T> raw_k;    ///< Raw keys by absolute position (>= first + T tokens).
  StridedView<const T> raw_v;    ///< Raw values by absolute position.
  StridedView<const T> entry_k;  ///< Entry keys: row j, head h is entry j of head h (rows
                                 ///< `[0, J_h(first + T))` used; compress_batch_staggered's
                                 ///< layout).
  StridedView<const T> entry_v;  ///< Entry values, as entry_k.
  Variant variant{};             ///< Logit transform, entry bias, sinks.
  float* out = nullptr;          ///< Output `[num_queries, q_heads, d_v]`.
  float* lse = nullptr;          ///< Log-sum-exp `[num_queries, q_heads]`.
};

namespace detail {

/// The one-KV-head PrefillArgs of KV head `kh` (q, out and lse left null: the caller gathers
/// the query group into dense buffers).
template <class T, class Variant>
auto staggered_head_prefill_args(const StaggeredPrefillArgs<T, Variant>& a, std::int64_t kh) {
  const std::int64_t G = a.q_heads / a.kv_heads;
  auto v = slice_variant(a.variant, kh * G);
  PrefillArgs<T, decltype(v)> p;
  p.num_queries = a.num_queries;
  p.q_heads = G;
  p.kv_heads = 1;
  p.d_k = a.d_k;
  p.d_v = a.d_v;
  p.first = a.first;
  p.rule = VisibilityRule::compressed(a.geometry.head(kh), a.local);
  p.raw_k = head_view(a.raw_k, kh);
  p.raw_v = head_view(a.raw_v, kh);
  p.entry_k = head_view(a.entry_k, kh);
  p.entry_v = head_view(a.entry_v, kh);
  p.variant = v;
  return p;
}

template <class T, class Variant>
void check_staggered_prefill(const StaggeredPrefillArgs<T, Variant>& a, const char* where) {
  phasekv::detail::check_arg(a.num_queries >= 0, where, "num_queries", a.num_queries,
                             "must be >= 0");
  phasekv::detail::check_head_shape(where, a.q_heads, a.kv_heads, a.d_k, a.d_v);
  const std::string req = "must equal kv_heads = " + std::to_string(a.kv_heads);
  phasekv::detail::check_arg(a.geometry.kv_heads() == a.kv_heads, where,
                             "geometry.origins().size()", a.geometry.kv_heads(), req.c_str());
  Geometry::check_local(where, "local", a.local);
  if (a.num_queries == 0) return;
  phasekv::detail::check_arg(a.q != nullptr, where, "q", "null",
                             "must point to [T, q_heads, d_k] floats");
  phasekv::detail::check_arg(a.out != nullptr, where, "out", "null",
                             "must point to [T, q_heads, d_v] floats");
  phasekv::detail::check_arg(a.lse != nullptr, where, "lse", "null",
                             "must point to [T, q_heads] floats");
  phasekv::detail::check_arg<shape_error>(a.raw_k.heads == a.kv_heads, where, "raw_k.heads",
                                          a.raw_k.heads, "must equal kv_heads");
  phasekv::detail::check_arg<shape_error>(a.raw_v.heads == a.kv_heads, where, "raw_v.heads",
                                          a.raw_v.heads, "must equal kv_heads");
  const std::int64_t J = a.geometry.max_complete_windows(a.first + a.num_queries);
  if (J > 0) {
    phasekv::detail::check_arg<shape_error>(a.entry_k.heads == a.kv_heads, where, "entry_k.heads",
                                            a.entry_k.heads, "must equal kv_heads");
    phasekv::detail::check_arg<shape_error>(a.entry_v.heads == a.kv_heads, where, "entry_v.heads",
                                            a.entry_v.heads, "must equal kv_heads");
  }
  for (std::int64_t kh = 0; kh < a.kv_heads; ++kh) {
    auto p = staggered_head_prefill_args(a, kh);
    p.q = a.q;  // stand-ins for the gathered buffers (only their presence is checked)
    p.out = a.out;
    p.lse = a.lse;
    check_prefill_args(p, where);
  }
}

/// Runs KV head `kh`: gathers its query group into dense `[T, G, d_k]`, runs `run(args)`,
/// scatters out and lse back.
template <class T, class Variant, class Run>
void staggered_prefill_head(const StaggeredPrefillArgs<T, Variant>& a, std::int64_t kh,
                            std::vector<float>& buf, const Run& run) {
  const std::int64_t G = a.q_heads / a.kv_heads, n = a.num_queries;
  const std::int64_t qs = n * G * a.d_k, os = n * G * a.d_v;
  buf.resize(static_cast<std::size_t>(qs + os + n * G));
  float* q = buf.data();
  float* o = q + qs;
  float* l = o + os;
  for (std::int64_t i = 0; i < n; ++i)
    std::copy(a.q + (i * a.q_heads + kh * G) * a.d_k, a.q + (i * a.q_heads + (kh + 1) * G) * a.d_k,
              q + i * G * a.d_k);
  auto p = staggered_head_prefill_args(a, kh);
  p.q = q;
  p.out = o;
  p.lse = l;
  run(p);
  for (std::int64_t i = 0; i < n; ++i) {
    std::copy(o + i * G * a.d_v, o + (i + 1) * G * a.d_v, a.out + (i * a.q_heads + kh * G) * a.d_v);
    std::copy(l + i * G, l + (i + 1) * G, a.lse + i * a.q_heads + kh * G);
  }
}

}  // namespace detail

/// Computes the KV heads of thread `thread_index` of `thread_count` (contiguous blocks of KV
/// heads): for each, the query group is gathered into a dense buffer (queries only; K and V are
/// read in place through one-head views), cpu::prefill runs with the head's geometry
/// `(W, S, O_h)`, and its rows of `out` / `lse` are written. Safe to call concurrently for
/// different indices; every call checks all arguments first and writes nothing when one is
/// bad.
template <class Arch = arch::Auto, class T, class Variant>
void staggered_prefill_partition(const StaggeredPrefillArgs<T, Variant>& args, int thread_index,
                                 int thread_count) {
  const char* where = "phasekv::cpu::staggered_prefill_partition";
  check_partition(where, thread_index, thread_count);
  detail::check_staggered_prefill(args, where);
  if (args.num_queries == 0) return;
  const WorkRange r = partition_range(args.kv_heads, thread_index, thread_count);
  std::vector<float> buf;
  for (std::int64_t kh = r.begin; kh < r.end; ++kh)
    detail::staggered_prefill_head(args, kh, buf, [](const auto& p) { prefill<Arch>(p); });
}

/// Single-threaded staggered prefill of every KV head.
template <class Arch = arch::Auto, class T, class Variant>
void staggered_prefill(const StaggeredPrefillArgs<T, Variant>& args) {
  detail::check_staggered_prefill(args, "phasekv::cpu::staggered_prefill");
  if (args.num_queries == 0) return;
  std::vector<float> buf;
  for (std::int64_t kh = 0; kh < args.kv_heads; ++kh)
    detail::staggered_prefill_head(args, kh, buf, [](const auto& p) { prefill<Arch>(p); });
}

}  // namespace cpu
PHASEKV_NAMESPACE_END
