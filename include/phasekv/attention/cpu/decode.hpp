/// @file
/// @brief CPU decode attention: one query token, all query heads, over a VisibleKV (prefix +
/// compressed entries + raw range, or a plain raw cache in uncompressed mode). Split-KV by
/// (thread index, thread count) into a caller workspace (two-call size query), then an exact
/// log-sum-exp merge.
///
/// The G = q_heads / kv_heads query heads of one KV head are processed together: each block of
/// key and value rows is loaded once from memory for the whole group.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "phasekv/attention/cpu/arch.hpp"
#include "phasekv/attention/cpu/decode_block.hpp"
#include "phasekv/attention/cpu/dispatch.hpp"
#include "phasekv/attention/cpu/split.hpp"
#include "phasekv/attention/cpu/variant_check.hpp"
#include "phasekv/attention/args.hpp"
#include "phasekv/attention/params.hpp"
#include "phasekv/attention/softmax_state.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/view.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cpu {

/// Everything a decode step needs. Built by the caller; checked by every entry point.
///
/// @tparam T storage type of keys and values (float, bf16_t, f16_t).
/// @tparam Variant logit hooks (StandardVariant or a user struct with the same members).
template <class T, class Variant = StandardVariant>
struct DecodeArgs {
  const float* q = nullptr;   ///< Query, `[q_heads, d_k]` row-major.
  std::int64_t q_heads = 0;   ///< Query heads Hq (a multiple of kv_heads).
  std::int64_t kv_heads = 0;  ///< KV heads Hkv; every segment must have this many.
  std::int64_t d_k = 0;       ///< Key head dim; every segment's keys must match.
  std::int64_t d_v = 0;       ///< Value head dim; every segment's values must match.
  VisibleKV<T> kv;            ///< The visible keys/values (may be empty: n = 0).
  /// Per-KV-head visible sets, `[kv_heads]` of one-head views, when the KV heads see different
  /// sets (per-head origins: CompressedCache::visible_per_head); `kv` must then be empty. KV
  /// head h's query group attends to `head_kv[h]` exactly as a one-KV-head decode would. Null:
  /// `kv` serves every head.
  const VisibleKV<T>* head_kv = nullptr;
  Variant variant{};     ///< Logit transform, entry bias, sinks.
  float* out = nullptr;  ///< Output `[q_heads, d_v]` (written by decode / decode_merge).
  float* lse = nullptr;  ///< Log-sum-exp `[q_heads]` (-inf when nothing is visible).
};

/// Checks `args` (the checks every decode entry point makes once, attention/args.hpp);
/// throws phasekv::invalid_argument (or shape_error) naming the bad argument. `need_out` is
/// false for the calls that do not write `out`/`lse` (decode_partition, the size query).
template <class T, class Variant>
void check_decode_args(const DecodeArgs<T, Variant>& a, const char* where, bool need_out = true) {
  phasekv::detail::check_head_shape(where, a.q_heads, a.kv_heads, a.d_k, a.d_v);
  phasekv::detail::check_arg(a.q != nullptr, where, "q", "null",
                             "must point to [q_heads, d_k] floats");
  if (need_out) {
    phasekv::detail::check_arg(a.out != nullptr, where, "out", "null",
                               "must point to [q_heads, d_v] floats");
    phasekv::detail::check_arg(a.lse != nullptr, where, "lse", "null",
                               "must point to [q_heads] floats");
  }
  phasekv::detail::KVShape shape;
  shape.heads = a.head_kv != nullptr ? 1 : a.kv_heads;
  shape.d_k = a.d_k;
  shape.d_v = a.d_v;
  phasekv::detail::check_visible_set(where, a.kv, shape);
  if (a.head_kv != nullptr) {
    phasekv::detail::check_arg(a.kv.count == 0, where, "kv.count", a.kv.count,
                               "must be 0 when head_kv gives each KV head its visible set");
    for (std::int64_t h = 0; h < a.kv_heads; ++h)
      phasekv::detail::check_visible_set(where, a.head_kv[h], shape);
  }
  detail::check_variant(a.variant, where);
}

namespace detail {

/// The one-KV-head DecodeArgs of KV head `kh` of a per-head decode (`a.head_kv`): its query
/// group's slice of q, out, lse and sinks, over `a.head_kv[kh]`.
template <class T, class Variant>
auto head_group_decode_args(const DecodeArgs<T, Variant>& a, std::int64_t kh) {
  const std::int64_t G = a.q_heads / a.kv_heads;
  auto v = slice_variant(a.variant, kh * G);
  DecodeArgs<T, decltype(v)> d;
  d.q = a.q + kh * G * a.d_k;
  d.q_heads = G;
  d.kv_heads = 1;
  d.d_k = a.d_k;
  d.d_v = a.d_v;
  d.kv = a.head_kv[kh];
  d.variant = v;
  d.out = a.out != nullptr ? a.out + kh * G * a.d_v : nullptr;
  d.lse = a.lse != nullptr ? a.lse + kh * G : nullptr;
  return d;
}

}  // namespace detail

namespace detail {

/// Offset (floats) of the query section of a decode workspace slot.
inline std::int64_t decode_q_offset(std::int64_t q_heads, std::int64_t d_v) {
  return (q_heads * d_v + 2 * q_heads + 15) / 16 * 16;
}

/// Floats of one partition's slot in the decode workspace: accumulators `[Hq, d_v]`, running
/// max `[Hq]` (the lse once finished), denominators `[Hq]`, and room for the query `[Hq, d_k]`
/// (permuted for interleaved rows, or split into bf16 high and low parts `[2, Hq, d_k]` by the
/// AVX512-BF16 path). Every section starts on a 64-byte boundary (the workspace base is
/// aligned by decode_workspace_base; vector loads that straddle cache lines cost twice).
inline std::int64_t decode_slot_floats(std::int64_t q_heads, std::int64_t d_k, std::int64_t d_v) {
  return (decode_q_offset(q_heads, d_v) + q_heads * d_k + 15) / 16 * 16;
}

/// The first 64-byte aligned float of a caller's workspace (decode_workspace_size reserves
/// the 64 bytes of slack this may skip).
template <class F>
F* decode_workspace_base(const void* workspace) {
  const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(workspace);
  return reinterpret_cast<F*>((a + 63) / 64 * 64);
}

/// decode_workspace_size without its argument checks (the arguments are >= 1). Throws
/// phasekv::invalid_argument naming `q_heads` (one slot) or `partitions` (all of them) when the
/// size would overflow size_t or the kernels' int64 float offsets.
inline std::size_t decode_workspace_bytes(
    std::int64_t q_heads, std::int64_t d_k, std::int64_t d_v, int partitions,
    const char* where = "phasekv::cpu::decode_workspace_size") {
  constexpr std::uint64_t kMaxFloats =
      (static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) <
               static_cast<std::uint64_t>(std::numeric_limits<std::size_t>::max())
           ? static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())
           : static_cast<std::uint64_t>(std::numeric_limits<std::size_t>::max())) /
      8;
  const std::uint64_t dk = static_cast<std::uint64_t>(d_k), dv = static_cast<std::uint64_t>(d_v);
  phasekv::detail::check_arg(
      dk <= kMaxFloats && dv <= kMaxFloats &&
          static_cast<std::uint64_t>(q_heads) <= (kMaxFloats - 64) / (dk + dv + 2),
      where, "q_heads", q_heads, "q_heads x (d_k + d_v + 2) workspace floats overflow size_t");
  const std::int64_t slot = decode_slot_floats(q_heads, d_k, d_v);
  phasekv::detail::check_arg(
      static_cast<std::uint64_t>(partitions) <= kMaxFloats / static_cast<std::uint64_t>(slot),
      where, "partitions", partitions, "the workspace of this many partitions overflows size_t");
  return static_cast<std::size_t>(slot) * static_cast<std::size_t>(partitions) * sizeof(float) + 64;
}

}  // namespace detail
}  // namespace cpu
PHASEKV_NAMESPACE_END

#if !defined(PHASEKV_DOXYGEN)  // the kernel bodies, once per target pass
#define PHASEKV_TARGET_BODY "phasekv/attention/cpu/kernels/decode.inl"
#include "phasekv/core/foreach_target.inc"
#endif

PHASEKV_NAMESPACE_BEGIN
namespace cpu {

namespace detail {

/// Workspace bytes of `args` for `parts` partitions: one region of decode_workspace_bytes per
/// KV head's query group with per-head visible sets (`head_kv`), else one for every head.
template <class T, class Variant>
std::size_t decode_args_workspace_bytes(const DecodeArgs<T, Variant>& args, int parts) {
  if (args.head_kv == nullptr)
    return decode_workspace_bytes(args.q_heads, args.d_k, args.d_v, parts);
  const std::size_t one =
      decode_workspace_bytes(args.q_heads / args.kv_heads, args.d_k, args.d_v, parts);
  phasekv::detail::check_arg(
      one <= std::numeric_limits<std::size_t>::max() / static_cast<std::size_t>(args.kv_heads),
      "phasekv::cpu::decode_workspace_size", "kv_heads", args.kv_heads,
      "the per-head workspace overflows size_t");
  return one * static_cast<std::size_t>(args.kv_heads);
}

/// Checks a caller's workspace for `parts` partitions: not null, at least
/// decode_workspace_size() bytes.
template <class T, class Variant>
void check_decode_workspace(const char* where, const DecodeArgs<T, Variant>& args,
                            const void* workspace, std::size_t workspace_bytes, int parts) {
  phasekv::detail::check_arg(workspace != nullptr, where, "workspace", "null",
                             "must point to decode_workspace_size() bytes");
  phasekv::detail::check_arg<capacity_error>(
      workspace_bytes >= decode_args_workspace_bytes(args, parts), where, "workspace_bytes",
      workspace_bytes, "must be >= decode_workspace_size()");
}

/// The kernel of one decode_partition over `args.kv`.
template <class Arch, class T, class Variant>
void decode_partition_kernel(const DecodeArgs<T, Variant>& args, void* workspace, int thread_index,
                             int thread_count) {
  with_arch<Arch>([&](auto tag) {
    using A = decltype(tag);
    kernel_decode_partition(target_t<A>{}, tag, args, workspace, thread_index, thread_count);
  });
}

/// decode_partition after its checks: the kernel over every head, or with `head_kv`, over each
/// KV head's query group into its own region of the workspace.
template <class Arch, class T, class Variant>
void decode_partition_unchecked(const DecodeArgs<T, Variant>& args, void* workspace,
                                int thread_index, int thread_count) {
  if (args.head_kv == nullptr) {
    decode_partition_kernel<Arch>(args, workspace, thread_index, thread_count);
    return;
  }
  const std::size_t region =
      decode_args_workspace_bytes(args, thread_count) / static_cast<std::size_t>(args.kv_heads);
  for (std::int64_t kh = 0; kh < args.kv_heads; ++kh)
    decode_partition_kernel<Arch>(head_group_decode_args(args, kh),
                                  static_cast<char*>(workspace) + region * kh, thread_index,
                                  thread_count);
}

/// The merge of the `thread_count` partials of `args.kv` in `workspace`.
template <class T, class Variant>
void decode_merge_heads(const DecodeArgs<T, Variant>& args, const void* workspace, int thread_count,
                        int merge_index, int merge_count) {
  const std::int64_t slot = decode_slot_floats(args.q_heads, args.d_k, args.d_v);
  const float* ws = decode_workspace_base<const float>(workspace);
  const WorkRange heads = partition_range(args.q_heads, merge_index, merge_count);
  for (std::int64_t h = heads.begin; h < heads.end; ++h) {
    float* o = args.out + h * args.d_v;
    float l = neg_inf();
    for (std::int64_t i = 0; i < args.d_v; ++i) o[i] = 0.0f;
    for (int p = 0; p < thread_count; ++p) {
      const float* acc = ws + slot * p;
      merge_partial(o, l, acc + h * args.d_v, acc[args.q_heads * args.d_v + h], args.d_v);
    }
    if (args.variant.has_sink()) apply_sink(o, l, args.variant.sink(h), args.d_v);
    args.lse[h] = l;
  }
}

/// decode_merge after its checks (per KV head's region with `head_kv`).
template <class T, class Variant>
void decode_merge_unchecked(const DecodeArgs<T, Variant>& args, const void* workspace,
                            int thread_count, int merge_index, int merge_count) {
  if (args.head_kv == nullptr) {
    decode_merge_heads(args, workspace, thread_count, merge_index, merge_count);
    return;
  }
  const std::size_t region =
      decode_args_workspace_bytes(args, thread_count) / static_cast<std::size_t>(args.kv_heads);
  for (std::int64_t kh = 0; kh < args.kv_heads; ++kh)
    decode_merge_heads(head_group_decode_args(args, kh),
                       static_cast<const char*>(workspace) + region * kh, thread_count, merge_index,
                       merge_count);
}

/// decode_partition's checks; true when the call is a size query (`workspace` null and
/// `query` non-null: the size was stored in `*query`).
template <class T, class Variant>
bool check_decode_partition(const DecodeArgs<T, Variant>& args, void* workspace,
                            std::size_t workspace_bytes, std::size_t* query, int thread_index,
                            int thread_count) {
  const char* where = "phasekv::cpu::decode_partition";
  check_partition(where, thread_index, thread_count);
  check_decode_args(args, where, false);
  if (workspace == nullptr && query != nullptr) {
    *query = decode_args_workspace_bytes(args, thread_count);
    return true;
  }
  check_decode_workspace(where, args, workspace, workspace_bytes, thread_count);
  return false;
}

}  // namespace detail

/// Bytes of workspace that decode_partition / decode_merge need for `partitions` parts
/// (the same as a decode_partition call with a null workspace). Throws
/// phasekv::invalid_argument when `partitions` < 1 or the arguments are inconsistent.
template <class T, class Variant>
std::size_t decode_workspace_size(const DecodeArgs<T, Variant>& args, int partitions) {
  const char* where = "phasekv::cpu::decode_workspace_size";
  check_decode_args(args, where, false);
  phasekv::detail::check_arg(partitions >= 1, where, "partitions", partitions, "must be >= 1");
  return detail::decode_args_workspace_bytes(args, partitions);
}

/// Computes partial result `thread_index` of `thread_count` (a contiguous share of the visible
/// tokens, all heads) into its slot of `workspace`. Safe to call concurrently for different
/// indices; afterwards call decode_merge once (or split by heads). Does not write
/// `args.out`/`args.lse`.
///
/// Workspace protocol (as phasekv::cuda::decode): with `workspace == nullptr` the call checks
/// the arguments, stores the bytes `thread_count` partitions need in `workspace_bytes` and
/// returns; otherwise `workspace_bytes` must be at least that many. The size depends on the
/// head counts, head dims and `thread_count` only (decode_workspace_size gives the same).
///
/// @tparam Arch the instruction set: arch::Auto (default) runs the build active_arch() names
/// (dispatch.hpp), an explicit tag selects one at compile time (refused with
/// phasekv::invalid_argument when this CPU cannot run it: cpu::check_cpu_runs).
template <class Arch = arch::Auto, class T, class Variant>
void decode_partition(const DecodeArgs<T, Variant>& args, void* workspace,
                      std::size_t& workspace_bytes, int thread_index, int thread_count) {
  if (detail::check_decode_partition(args, workspace, workspace_bytes, &workspace_bytes,
                                     thread_index, thread_count))
    return;
  detail::decode_partition_unchecked<Arch>(args, workspace, thread_index, thread_count);
}

/// decode_partition with a workspace size it cannot write back (a constant or temporary):
/// `workspace` must point to `workspace_bytes` >= decode_workspace_size() bytes.
template <class Arch = arch::Auto, class T, class Variant>
void decode_partition(const DecodeArgs<T, Variant>& args, void* workspace,
                      const std::size_t& workspace_bytes, int thread_index, int thread_count) {
  detail::check_decode_partition(args, workspace, workspace_bytes, nullptr, thread_index,
                                 thread_count);
  detail::decode_partition_unchecked<Arch>(args, workspace, thread_index, thread_count);
}

/// Merges the `thread_count` partials in `workspace` exactly (log-sum-exp) into `args.out` and
/// `args.lse`, applying the variant's sink. The heads may be split over callers with
/// (`merge_index`, `merge_count`); the default merges all heads.
template <class T, class Variant>
void decode_merge(const DecodeArgs<T, Variant>& args, const void* workspace,
                  std::size_t workspace_bytes, int thread_count, int merge_index = 0,
                  int merge_count = 1) {
  const char* where = "phasekv::cpu::decode_merge";
  check_partition(where, merge_index, merge_count);
  phasekv::detail::check_arg(thread_count >= 1, where, "thread_count", thread_count,
                             "must be >= 1");
  check_decode_args(args, where, true);
  detail::check_decode_workspace(where, args, workspace, workspace_bytes, thread_count);
  detail::decode_merge_unchecked(args, workspace, thread_count, merge_index, merge_count);
}

/// Single-threaded decode of one step into `args.out` / `args.lse` (allocates its own
/// workspace). Equivalent to decode_partition(0, 1) followed by decode_merge. `Arch` as for
/// decode_partition (default: chosen at run time).
template <class Arch = arch::Auto, class T, class Variant>
void decode(const DecodeArgs<T, Variant>& args) {
  check_decode_args(args, "phasekv::cpu::decode", true);
  std::vector<float> ws(detail::decode_args_workspace_bytes(args, 1) / sizeof(float) + 1);
  detail::decode_partition_unchecked<Arch>(args, ws.data(), 0, 1);
  detail::decode_merge_unchecked(args, ws.data(), 1, 0, 1);
}

}  // namespace cpu
PHASEKV_NAMESPACE_END
