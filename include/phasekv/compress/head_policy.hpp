/// @file
/// @brief HeadPolicy: a run of KV heads of a compressor policy, as a policy of its own with
/// its own origin (how CompressedCache, compress_batch and paged_append serve per-KV-head
/// origins).
#pragma once

#include <cstdint>
#include <utility>

#include "phasekv/compress/cpu/row_kernels.hpp"
#include "phasekv/compress/policy.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/phase/geometry.hpp"

PHASEKV_NAMESPACE_BEGIN

/// KV heads `[head, head + count)` of policy `P` as a policy of `count` heads whose geometry is
/// `(P's W, P's S, origin)`: `compress(k, x, out)` is `inner.compress(head + k, x, out)`, the
/// same bits. The window math of a policy does not depend on the origin (a loader hands it the W
/// tokens of one window), so only which tokens form a window changes.
///
/// The CPU fast paths of `P` (its phasekv::row_kernels specialization) are forwarded, so a
/// HeadPolicy compresses as fast as `P` does for those heads.
template <class P>
class HeadPolicy {
  static_assert(is_compressor_policy<P>::value, "HeadPolicy: P is not a compressor policy");

 public:
  using inner_type = P;  ///< The wrapped policy type.

  /// Default: head 0 of a default-constructed P (when P has one).
  constexpr HeadPolicy() = default;

  /// Heads `[head, head + count)` of `inner` with origin `origin`. Throws
  /// phasekv::invalid_argument naming `head` or `count` when the run is empty or does not lie
  /// in `[0, inner.kv_heads())` (when the policy covers a fixed head count), or `origin` when it
  /// is not in `[0, 2^40]`.
  HeadPolicy(const P& inner, std::int64_t head, std::int64_t origin, std::int64_t count = 1)
      : inner_(inner),
        head_(head),
        count_(count),
        geometry_(inner.geometry().window(), inner.geometry().stride(), checked_origin(origin)) {
    const std::int64_t heads = policy_kv_heads(inner);
    detail::check_arg(head >= 0 && (heads <= 0 || head < heads), "phasekv::HeadPolicy", "head",
                      head, "must be in [0, inner.kv_heads())");
    detail::check_arg(count >= 1 && (heads <= 0 || count <= heads - head), "phasekv::HeadPolicy",
                      "count", count, "must be >= 1 with head + count <= inner.kv_heads()");
  }

  /// `(W, S, origin)`.
  PHASEKV_HOST_DEVICE constexpr Geometry geometry() const { return geometry_; }
  /// The inner policy's input dim.
  PHASEKV_HOST_DEVICE constexpr std::int64_t input_dim() const { return inner_.input_dim(); }
  /// The inner policy's output dim.
  PHASEKV_HOST_DEVICE constexpr std::int64_t output_dim() const { return inner_.output_dim(); }
  /// The KV heads of the run (`count`).
  PHASEKV_HOST_DEVICE constexpr std::int64_t kv_heads() const { return count_; }
  /// The first inner head the policy stands for.
  PHASEKV_HOST_DEVICE constexpr std::int64_t head() const { return head_; }
  /// The wrapped policy.
  PHASEKV_HOST_DEVICE constexpr const P& inner() const { return inner_; }

  /// `inner().compress(head() + kv_head, x, out)` (kv_head counts from the run's first head).
  template <class Load>
  PHASEKV_HOST_DEVICE void compress(std::int64_t kv_head, const Load& x, float* out) const {
    inner_.compress(head_ + kv_head, x, out);
  }

 private:
  static std::int64_t checked_origin(std::int64_t origin) {
    detail::check_arg(origin >= 0 && origin <= kMaxGeometryExtent, "phasekv::HeadPolicy", "origin",
                      origin, "must be in [0, 2^40]");
    return origin;
  }

  P inner_{};
  std::int64_t head_ = 0;
  std::int64_t count_ = 1;
  Geometry geometry_{};
};

/// The CPU fast paths of a HeadPolicy: those of its inner policy, for its head.
template <class P, class Arch>
struct row_kernels<HeadPolicy<P>, Arch> {
  /// Whether the inner policy has fast paths.
  static constexpr bool fast = row_kernels<P, Arch>::fast;

  /// The inner policy's `window` fast path, for head `p.head() + kv_head`.
  template <class T, class Q = P>
  static auto window(const HeadPolicy<P>& p, std::int64_t kv_head, const T* rows,
                     std::int64_t token_stride, float* out)
      -> decltype(row_kernels<Q, Arch>::window(p.inner(), kv_head, rows, token_stride, out)) {
    return row_kernels<Q, Arch>::window(p.inner(), p.head() + kv_head, rows, token_stride, out);
  }

  /// The inner policy's `run` fast path, for head `p.head() + kv_head`.
  template <class T, class Q = P>
  static auto run(const HeadPolicy<P>& p, std::int64_t kv_head, const T* rows,
                  std::int64_t token_stride, std::int64_t count, T* entries,
                  std::int64_t entry_stride, bool stream, std::int64_t prefetch_tokens)
      -> decltype(row_kernels<Q, Arch>::run(p.inner(), kv_head, rows, token_stride, count, entries,
                                            entry_stride, stream, prefetch_tokens)) {
    return row_kernels<Q, Arch>::run(p.inner(), p.head() + kv_head, rows, token_stride, count,
                                     entries, entry_stride, stream, prefetch_tokens);
  }
};

PHASEKV_NAMESPACE_END
