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
#include <vector>

#include "phasekv/attention/cpu/arch.hpp"
#include "phasekv/attention/cpu/decode_block.hpp"
#include "phasekv/attention/cpu/split.hpp"
#include "phasekv/attention/cpu/variant_check.hpp"
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
  Variant variant{};          ///< Logit transform, entry bias, sinks.
  float* out = nullptr;       ///< Output `[q_heads, d_v]` (written by decode / decode_merge).
  float* lse = nullptr;       ///< Log-sum-exp `[q_heads]` (-inf when nothing is visible).
};

/// Checks `args`; throws phasekv::invalid_argument (or shape_error) naming the bad argument.
/// `need_out` is false for decode_partition, which does not write `out`/`lse`.
template <class T, class Variant>
void check_decode_args(const DecodeArgs<T, Variant>& a, const char* where, bool need_out = true) {
  phasekv::detail::check_arg(a.q_heads >= 1, where, "q_heads", a.q_heads, "must be >= 1");
  phasekv::detail::check_arg(a.kv_heads >= 1, where, "kv_heads", a.kv_heads, "must be >= 1");
  phasekv::detail::check_arg<shape_error>(a.q_heads % a.kv_heads == 0, where, "q_heads", a.q_heads,
                                 "must be a multiple of kv_heads");
  phasekv::detail::check_arg<shape_error>(a.d_k >= 1, where, "d_k", a.d_k, "must be >= 1");
  phasekv::detail::check_arg<shape_error>(a.d_v >= 1, where, "d_v", a.d_v, "must be >= 1");
  phasekv::detail::check_arg(a.q != nullptr, where, "q", "null", "must point to [q_heads, d_k] floats");
  if (need_out) {
    phasekv::detail::check_arg(a.out != nullptr, where, "out", "null",
                      "must point to [q_heads, d_v] floats");
    phasekv::detail::check_arg(a.lse != nullptr, where, "lse", "null", "must point to [q_heads] floats");
  }
  phasekv::detail::check_arg(a.kv.count >= 0 && a.kv.count <= VisibleKV<T>::kMaxSegments, where,
                    "kv.count", a.kv.count, "must be in [0, 4]");
  for (int s = 0; s < a.kv.count; ++s) {
    const KVSegment<T>& seg = a.kv.segments[s];
    check_view(seg.keys, where, "kv.segments[].keys");
    check_view(seg.values, where, "kv.segments[].values");
    phasekv::detail::check_arg<shape_error>(seg.values.tokens == seg.keys.tokens, where,
                                   "kv.segments[].values.tokens", seg.values.tokens,
                                   "must equal keys.tokens");
    phasekv::detail::check_arg<shape_error>(seg.keys.heads == a.kv_heads, where,
                                   "kv.segments[].keys.heads", seg.keys.heads,
                                   "must equal kv_heads");
    phasekv::detail::check_arg<shape_error>(seg.values.heads == a.kv_heads, where,
                                   "kv.segments[].values.heads", seg.values.heads,
                                   "must equal kv_heads");
    phasekv::detail::check_arg<shape_error>(seg.keys.dim == a.d_k, where, "kv.segments[].keys.dim",
                                   seg.keys.dim, "must equal d_k");
    phasekv::detail::check_arg<shape_error>(seg.values.dim == a.d_v, where, "kv.segments[].values.dim",
                                   seg.values.dim, "must equal d_v");
  }
  detail::check_variant(a.variant, where);
}

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

/// Logits of `ng` heads starting at head `h0` against `nt` key rows (dispatch on ng), with the
/// query `qf` (`[q_heads, d_k]`, permuted when rows of T are interleaved), or the AVX512-BF16
/// split-query path when `qsplit` is non-null.
template <class Arch, class T, class Variant>
PHASEKV_FORCEINLINE void qk_group(const DecodeArgs<T, Variant>& a, const float* qf,
                                  std::int64_t h0, std::int64_t ng, StridedRows<T> kp,
                                  std::int64_t nt, const bf16_t* qsplit, float* s,
                                  StridedRows<T> kn, std::int64_t nn) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__F16C__) && defined(__AVX512BF16__)
  if constexpr (uses_bf16_dot<Arch, T>::value) {
    if (qsplit != nullptr) {
      for (std::int64_t t = 0; t < nn; ++t) prefetch_row(kn[t], a.d_k);
      const bf16_t* hi = qsplit + h0 * a.d_k;
      const bf16_t* lo = qsplit + (a.q_heads + h0) * a.d_k;
      switch (ng) {
        case 1: qk_rows_bf16dot<1>(hi, lo, a.d_k, kp, nt, a.d_k, s); break;
        case 2: qk_rows_bf16dot<2>(hi, lo, a.d_k, kp, nt, a.d_k, s); break;
        case 3: qk_rows_bf16dot<3>(hi, lo, a.d_k, kp, nt, a.d_k, s); break;
        default: qk_rows_bf16dot<4>(hi, lo, a.d_k, kp, nt, a.d_k, s); break;
      }
      return;
    }
  }
#endif
  (void)qsplit;
  const float* qh = qf + h0 * a.d_k;
  const std::int64_t dk = a.d_k;
  switch (ng) {
    case 1: qk_rows_d<Arch, 1>(qh, dk, kp, nt, dk, s, kn, nn); break;
    case 2: qk_rows_d<Arch, 2>(qh, dk, kp, nt, dk, s, kn, nn); break;
    case 3: qk_rows_d<Arch, 3>(qh, dk, kp, nt, dk, s, kn, nn); break;
    default: qk_rows_d<Arch, 4>(qh, dk, kp, nt, dk, s, kn, nn); break;
  }
}

/// Runs the decode kernel over tokens `[begin, end)` of the concatenated segments, for every
/// KV head, into one workspace slot (accumulators, max, denominators; initialized by caller).
///
/// The work of a segment is a sequence of (token block, KV head) steps, ordered so that memory
/// is walked in address order: blocks outer and heads inner for token-major (NHD-like) views,
/// heads outer for head-major (HND-like) views. While one step is computed, the rows of the
/// next step are prefetched into L2, the keys spread over the logit tiles and the values over
/// the value passes: hardware prefetchers do not follow a per-head stride that crosses a page
/// every few rows, and even on contiguous head-major rows they fall behind when the step
/// alternates between a key block and a value block (measured on Zen 4: 7.9 GB/s per core
/// without, 16-18 GB/s with; into L1 instead, 9 GB/s: the next step's rows are as large as L1).
/// Token-major views without gaps between heads and tokens are prefetched a whole block ahead
/// instead: the step of head h fetches the h-th slice of the next block's K and V, which are
/// contiguous ranges (all heads), so the memory system sees sequential reads rather than one
/// d-element row every Hkv rows (Zen 4, one thread, NHD bf16 Hkv = 8, d = 128 from DRAM:
/// 11.8 -> 15-18 GB/s).
template <class Arch, class T, class Variant>
void decode_range(const DecodeArgs<T, Variant>& a, const float* qf, std::int64_t begin,
                  std::int64_t end, float* acc, float* mx, float* den, const bf16_t* qsplit) {
  const std::int64_t group = a.q_heads / a.kv_heads;
  alignas(64) float s[kHeadTile * kDecodeBlock];
  float corr[kHeadTile];
  std::int64_t base = 0;
  for (int si = 0; si < a.kv.count; ++si) {
    const KVSegment<T>& seg = a.kv.segments[si];
    const std::int64_t lo = begin > base ? begin - base : 0;
    const std::int64_t hi = (end - base) < seg.size() ? end - base : seg.size();
    base += seg.size();
    if (hi <= lo) continue;
    const std::int64_t blocks = (hi - lo + kDecodeBlock - 1) / kDecodeBlock;
    const bool head_outer = seg.keys.head_stride > seg.keys.token_stride;
    // token-major rows without gaps: a block of all heads is one contiguous range of K (and V)
    const bool dense_tokens =
        !head_outer && seg.keys.head_stride == a.d_k && seg.values.head_stride == a.d_v &&
        seg.keys.token_stride == a.kv_heads * a.d_k &&
        seg.values.token_stride == a.kv_heads * a.d_v;
    const std::int64_t steps = blocks * a.kv_heads;
    const auto step_at = [&](std::int64_t st, std::int64_t& t0, std::int64_t& kh) {
      const std::int64_t b = head_outer ? st % blocks : st / a.kv_heads;
      kh = head_outer ? st / blocks : st % a.kv_heads;
      t0 = lo + b * kDecodeBlock;
    };
    for (std::int64_t st = 0; st < steps; ++st) {
      std::int64_t t0, kh;
      step_at(st, t0, kh);
      const std::int64_t nt = (hi - t0) < kDecodeBlock ? hi - t0 : kDecodeBlock;
      const StridedRows<T> kp{seg.keys.ptr(t0, kh), seg.keys.token_stride};
      const StridedRows<T> vp{seg.values.ptr(t0, kh), seg.values.token_stride};
      std::int64_t nn = 0;  // rows prefetched while this step runs
      StridedRows<T> kn = kp, vn = vp;
      if (dense_tokens) {
        // slice kh of the next block's contiguous K and V (all heads), as nn rows of d
        const std::int64_t t1 = t0 + kDecodeBlock;
        if (t1 < hi) {
          nn = (hi - t1) < kDecodeBlock ? hi - t1 : kDecodeBlock;
          kn = StridedRows<T>{seg.keys.ptr(t1, 0) + kh * nn * a.d_k, a.d_k};
          vn = StridedRows<T>{seg.values.ptr(t1, 0) + kh * nn * a.d_v, a.d_v};
        }
      } else if (st + 1 < steps) {  // the rows of the next step
        std::int64_t nb, nh;
        step_at(st + 1, nb, nh);
        nn = (hi - nb) < kDecodeBlock ? hi - nb : kDecodeBlock;
        kn.base = seg.keys.ptr(nb, nh);
        vn.base = seg.values.ptr(nb, nh);
      }
      for (std::int64_t g0 = 0; g0 < group; g0 += kHeadTile) {
        const std::int64_t ng = (group - g0) < kHeadTile ? group - g0 : kHeadTile;
        const std::int64_t h0 = kh * group + g0;
        const std::int64_t pn = g0 == 0 ? nn : 0;  // the first head tile prefetches
        qk_group<Arch>(a, qf, h0, ng, kp, nt, qsplit, s, kn, pn);
        for (std::int64_t g = 0; g < ng; ++g)
          transform_logits<Arch>(a.variant, seg.kind, s + g * kDecodeBlock, nt);
        switch (ng) {
          case 1: softmax_heads<Arch, 1>(s, kDecodeBlock, nt, mx + h0, den + h0, corr); break;
          case 2: softmax_heads<Arch, 2>(s, kDecodeBlock, nt, mx + h0, den + h0, corr); break;
          case 3: softmax_heads<Arch, 3>(s, kDecodeBlock, nt, mx + h0, den + h0, corr); break;
          default: softmax_heads<Arch, 4>(s, kDecodeBlock, nt, mx + h0, den + h0, corr); break;
        }
        float* ah = acc + h0 * a.d_v;
        switch (ng) {
          case 1: pv_rows_d<Arch, 1>(s, vp, nt, a.d_v, ah, a.d_v, corr, vn, pn); break;
          case 2: pv_rows_d<Arch, 2>(s, vp, nt, a.d_v, ah, a.d_v, corr, vn, pn); break;
          case 3: pv_rows_d<Arch, 3>(s, vp, nt, a.d_v, ah, a.d_v, corr, vn, pn); break;
          default: pv_rows_d<Arch, 4>(s, vp, nt, a.d_v, ah, a.d_v, corr, vn, pn); break;
        }
      }
    }
  }
}

}  // namespace detail

/// Bytes of workspace that decode_partition / decode_merge need for `partitions` parts
/// (first call of the two-call pattern). Throws phasekv::invalid_argument when
/// `partitions` < 1 or the arguments are inconsistent.
template <class T, class Variant>
std::size_t decode_workspace_size(const DecodeArgs<T, Variant>& args, int partitions) {
  const char* where = "phasekv::cpu::decode_workspace_size";
  check_decode_args(args, where, false);
  phasekv::detail::check_arg(partitions >= 1, where, "partitions", partitions, "must be >= 1");
  return static_cast<std::size_t>(detail::decode_slot_floats(args.q_heads, args.d_k, args.d_v)) *
             static_cast<std::size_t>(partitions) * sizeof(float) +
         64;
}

/// Computes partial result `thread_index` of `thread_count` (a contiguous share of the visible
/// tokens, all heads) into its slot of `workspace` (`workspace_bytes` >= decode_workspace_size
/// for `thread_count` parts). Safe to call concurrently for different indices; afterwards call
/// decode_merge once (or split by heads). Does not write `args.out`/`args.lse`.
template <class Arch = NativeArch, class T, class Variant>
void decode_partition(const DecodeArgs<T, Variant>& args, void* workspace,
                      std::size_t workspace_bytes, int thread_index, int thread_count) {
  const char* where = "phasekv::cpu::decode_partition";
  check_partition(where, thread_index, thread_count);
  const std::size_t need = decode_workspace_size(args, thread_count);
  phasekv::detail::check_arg(workspace != nullptr, where, "workspace", "null",
                    "must point to decode_workspace_size() bytes");
  phasekv::detail::check_arg<capacity_error>(workspace_bytes >= need, where, "workspace_bytes",
                                    workspace_bytes, "must be >= decode_workspace_size()");
  const std::int64_t slot = detail::decode_slot_floats(args.q_heads, args.d_k, args.d_v);
  float* acc = detail::decode_workspace_base<float>(workspace) + slot * thread_index;
  float* mx = acc + args.q_heads * args.d_v;
  float* den = mx + args.q_heads;
  bf16_t* qsplit = nullptr;
  const float* qf = args.q;
  float* qbuf = acc + detail::decode_q_offset(args.q_heads, args.d_v);
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__F16C__) && defined(__AVX512BF16__)
  if (detail::uses_bf16_dot<Arch, T>::value && args.d_k % 32 == 0) {
    qsplit = reinterpret_cast<bf16_t*>(qbuf);
    for (std::int64_t h = 0; h < args.q_heads; ++h)
      for (std::int64_t i = 0; i < args.d_k; i += 32)
        Vec<arch::Avx512>::split_bf16(args.q + h * args.d_k + i, qsplit + h * args.d_k + i,
                                      qsplit + (args.q_heads + h) * args.d_k + i);
  }
#endif
  constexpr bool interleaved = detail::pairs_interleaved<Arch, T>();
  if (qsplit == nullptr) {  // an aligned copy (permuted when rows are interleaved)
    if constexpr (interleaved) {
      for (std::int64_t h = 0; h < args.q_heads; ++h)
        detail::permute_pairs<Arch>(args.q + h * args.d_k, qbuf + h * args.d_k, args.d_k);
    } else {
      std::memcpy(qbuf, args.q, static_cast<std::size_t>(args.q_heads * args.d_k) * sizeof(float));
    }
    qf = qbuf;
  }
  std::memset(acc, 0, static_cast<std::size_t>(args.q_heads * args.d_v) * sizeof(float));
  for (std::int64_t h = 0; h < args.q_heads; ++h) {
    mx[h] = neg_inf();
    den[h] = 0.0f;
  }
  const WorkRange r =
      partition_range(args.kv.total(), thread_index, thread_count, detail::kDecodeBlock);
  if (r.size() > 0) detail::decode_range<Arch>(args, qf, r.begin, r.end, acc, mx, den, qsplit);
  // finish: normalized output and lse (stored over the running max)
  for (std::int64_t h = 0; h < args.q_heads; ++h) {
    float* o = acc + h * args.d_v;
    if constexpr (interleaved) detail::unpermute_pairs<Arch>(o, args.d_v);
    if (den[h] > 0.0f) {
      const float inv = 1.0f / den[h];
      for (std::int64_t i = 0; i < args.d_v; ++i) o[i] *= inv;
      mx[h] = mx[h] + std::log(den[h]);
    } else {
      for (std::int64_t i = 0; i < args.d_v; ++i) o[i] = 0.0f;
      mx[h] = neg_inf();
    }
  }
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
  phasekv::detail::check_arg(thread_count >= 1, where, "thread_count", thread_count, "must be >= 1");
  check_decode_args(args, where, true);
  phasekv::detail::check_arg(workspace != nullptr, where, "workspace", "null",
                    "must point to decode_workspace_size() bytes");
  phasekv::detail::check_arg<capacity_error>(workspace_bytes >= decode_workspace_size(args, thread_count),
                                    where, "workspace_bytes", workspace_bytes,
                                    "must be >= decode_workspace_size()");
  const std::int64_t slot = detail::decode_slot_floats(args.q_heads, args.d_k, args.d_v);
  const float* ws = detail::decode_workspace_base<const float>(workspace);
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

/// Single-threaded decode of one step into `args.out` / `args.lse` (allocates its own
/// workspace). Equivalent to decode_partition(0, 1) followed by decode_merge.
template <class Arch = NativeArch, class T, class Variant>
void decode(const DecodeArgs<T, Variant>& args) {
  check_decode_args(args, "phasekv::cpu::decode", true);
  std::vector<float> ws(decode_workspace_size(args, 1) / sizeof(float));
  decode_partition<Arch>(args, ws.data(), ws.size() * sizeof(float), 0, 1);
  decode_merge(args, ws.data(), ws.size() * sizeof(float), 1);
}

}  // namespace cpu
PHASEKV_NAMESPACE_END
