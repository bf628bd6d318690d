/// @file
/// @brief Per-KV-head origins (staggered windows): StaggeredCache, the compressed cache of one
/// sequence whose KV head h has windows `[O_h + j*S, O_h + j*S + W)`, and
/// compress_batch_staggered, its batch counterpart. Built from one-head CompressedCaches and
/// compress_batch calls over HeadPolicy (one head of a policy with its own origin), so every
/// head keeps their semantics and bits.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "phasekv/compress/compress_batch.hpp"
#include "phasekv/compress/compressed_cache.hpp"
#include "phasekv/compress/head_policy.hpp"
#include "phasekv/compress/policy.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/view.hpp"
#include "phasekv/phase/geometry.hpp"
#include "phasekv/phase/staggered_geometry.hpp"

PHASEKV_NAMESPACE_BEGIN

namespace detail {

/// Checks that a policy used with per-head origins has origin 0 (the origin list gives each
/// head's origin; a policy origin on top of it would be ambiguous).
template <class P>
void check_staggered_policy(const P& p, const char* where, const char* name) {
  const std::string n = std::string(name) + ".geometry().origin()";
  check_arg(p.geometry().origin() == 0, where, n.c_str(), p.geometry().origin(),
            "must be 0 with per-head origins (origins[h] is head h's origin)");
}

}  // namespace detail

/// The compressed KV cache of one sequence with a separate origin per KV head.
///
/// KV head h behaves exactly like a one-head phasekv::CompressedCache with geometry
/// `(W, S, O_h)` and the policy's parameters of head h (HeadPolicy): its raw prefix is
/// `[0, O_h)`, its entry j is emitted when token `O_h + j*S + W - 1` arrives, and visible(h)
/// is what a decode query at position size() - 1 of head h sees (Geometry::visible with O_h).
/// Streaming in chunks of any size equals compress_batch_staggered bit for bit.
///
/// Every call validates all of its arguments before writing anything.
///
/// @tparam T, KeyPolicy, ValuePolicy as for phasekv::CompressedCache; the policies' geometry
/// gives W and S and must have origin 0.
template <class T, class KeyPolicy, class ValuePolicy = KeyPolicy>
class StaggeredCache {
 public:
  /// The cache type of one head.
  using head_cache_type = CompressedCache<T, HeadPolicy<KeyPolicy>, HeadPolicy<ValuePolicy>>;

  /// An owning cache of `origins.size()` KV heads (`origins[h]` = O_h, any value in
  /// `[0, 2^40]`, also above S). Other parameters as for CompressedCache's owning constructor.
  /// Throws phasekv::invalid_argument naming `origins.size()` (it must equal `kv_heads`),
  /// `origins[h]` (negative or too large), a policy whose origin is not 0, or any argument
  /// CompressedCache refuses.
  StaggeredCache(const KeyPolicy& key_policy, const ValuePolicy& value_policy,
                 const std::vector<std::int64_t>& origins, std::int64_t kv_heads, std::int64_t d_k,
                 std::int64_t d_v, std::int64_t local, std::int64_t max_length,
                 Layout layout = Layout::NHD) {
    detail::check_arg<shape_error>(kv_heads >= 1, kWhere, "kv_heads", kv_heads, "must be >= 1");
    check_origins(kWhere, origins, kv_heads);
    check_policy_dims(key_policy, kv_heads, kWhere, "key_policy");
    check_policy_dims(value_policy, kv_heads, kWhere, "value_policy");
    detail::check_staggered_policy(key_policy, kWhere, "key_policy");
    detail::check_staggered_policy(value_policy, kWhere, "value_policy");
    heads_.reserve(origins.size());
    for (std::int64_t h = 0; h < kv_heads; ++h) {
      const std::int64_t o = origins[static_cast<std::size_t>(h)];
      heads_.emplace_back(HeadPolicy<KeyPolicy>(key_policy, h, o),
                          HeadPolicy<ValuePolicy>(value_policy, h, o), 1, d_k, d_v, local,
                          max_length, layout);
    }
    geometry_ =
        StaggeredGeometry(key_policy.geometry().window(), key_policy.geometry().stride(), origins);
  }

  /// Appends `keys.tokens` tokens (`keys`: `[t, kv_heads, d_k]`, `values`: `[t, kv_heads, d_v]`,
  /// any strides) to every head. Throws phasekv::shape_error / capacity_error as
  /// CompressedCache::append does; nothing is written then.
  void append(StridedView<const T> keys, StridedView<const T> values) {
    const std::int64_t H = kv_heads();
    check_view(keys, kAppend, "keys");
    check_view(values, kAppend, "values");
    detail::check_arg<shape_error>(keys.heads == H, kAppend, "keys.heads", keys.heads,
                                   "must equal the cache's kv_heads");
    detail::check_arg<shape_error>(values.heads == H, kAppend, "values.heads", values.heads,
                                   "must equal the cache's kv_heads");
    detail::check_arg<shape_error>(keys.dim == key_dim(), kAppend, "keys.dim", keys.dim,
                                   "must equal the cache's d_k");
    detail::check_arg<shape_error>(values.dim == value_dim(), kAppend, "values.dim", values.dim,
                                   "must equal the cache's d_v");
    detail::check_arg<shape_error>(values.tokens == keys.tokens, kAppend, "values.tokens",
                                   values.tokens, "must equal keys.tokens");
    if (keys.tokens > max_length() - size()) {
      const std::string req =
          "size() + tokens must be <= max_length() = " + std::to_string(max_length()) +
          " (size() = " + std::to_string(size()) + ")";
      detail::throw_arg<capacity_error>(kAppend, "keys.tokens", keys.tokens, req.c_str());
    }
    // Every head accepts what the checks above accept, so no head is left half-appended.
    for (std::int64_t h = 0; h < H; ++h)
      heads_[static_cast<std::size_t>(h)].append(head_view(keys, h), head_view(values, h));
  }

  /// Forgets every token of every head.
  void clear() {
    for (head_cache_type& c : heads_) c.clear();
  }

  /// What a decode query at position size() - 1 of KV head `h` sees with local window `local`
  /// (one-head views). Throws phasekv::invalid_argument naming `h` or `local`.
  VisibleKV<T> visible(std::int64_t h, std::int64_t local) const { return head(h).visible(local); }
  /// visible(h, local()).
  VisibleKV<T> visible(std::int64_t h) const { return head(h).visible(); }

  /// The one-head cache of KV head `h`. Throws phasekv::invalid_argument naming `h`.
  const head_cache_type& head(std::int64_t h) const {
    detail::check_arg(h >= 0 && h < kv_heads(), "phasekv::StaggeredCache::head", "h", h,
                      "must be in [0, kv_heads())");
    return heads_[static_cast<std::size_t>(h)];
  }

  /// W, S and the origins.
  const StaggeredGeometry& geometry() const { return geometry_; }
  /// Tokens appended so far (n).
  std::int64_t size() const { return heads_.front().size(); }
  /// Capacity in tokens.
  std::int64_t max_length() const { return heads_.front().max_length(); }
  /// KV heads.
  std::int64_t kv_heads() const { return static_cast<std::int64_t>(heads_.size()); }
  /// Key head dim.
  std::int64_t key_dim() const { return heads_.front().key_dim(); }
  /// Value head dim.
  std::int64_t value_dim() const { return heads_.front().value_dim(); }
  /// Local window L.
  std::int64_t local() const { return heads_.front().local(); }
  /// Compressed entries of head `h` so far, J_h(n).
  std::int64_t num_entries(std::int64_t h) const { return head(h).num_entries(); }
  /// Entry keys of head `h`, `[J_h(n), 1, d_k]`.
  StridedView<const T> entry_keys(std::int64_t h) const { return head(h).entry_keys(); }
  /// Entry values of head `h`, `[J_h(n), 1, d_v]`.
  StridedView<const T> entry_values(std::int64_t h) const { return head(h).entry_values(); }
  /// Bytes of K and V data held for the current n, summed over the heads.
  std::int64_t memory_bytes() const {
    std::int64_t b = 0;
    for (const head_cache_type& c : heads_) b += c.memory_bytes();
    return b;
  }
  /// Bytes an uncompressed cache of the same length would hold.
  std::int64_t uncompressed_bytes() const {
    std::int64_t b = 0;
    for (const head_cache_type& c : heads_) b += c.uncompressed_bytes();
    return b;
  }

 private:
  static constexpr const char* kWhere = "phasekv::StaggeredCache";
  static constexpr const char* kAppend = "phasekv::StaggeredCache::append";

  std::vector<head_cache_type> heads_;
  StaggeredGeometry geometry_;
};

/// Batch compression with per-head origins: entry j of KV head h is window
/// `[O_h + j*S, O_h + j*S + W)` of head h of `raw`, compressed with the policy's head h
/// (HeadPolicy), written to `entries(j, h, :)` for `j < J_h(n)`; rows at and above J_h(n)
/// of head h are left untouched.
///
/// @param policy   the compressor (its W and S; its origin must be 0).
/// @param origins  O_h, one per KV head (`raw.heads` of them), each in `[0, 2^40]`.
/// @param raw      `[n, kv_heads, d_in]`, token t at absolute position t.
/// @param entries  `[>= max_h J_h(n), kv_heads, d_out]`.
/// @param thread_index, thread_count  this thread's share of each head's windows (as
///                 compress_batch).
/// @return max_h J_h(n).
///
/// Throws (before writing anything) phasekv::invalid_argument naming `origins.size()`,
/// `origins[h]`, `policy.geometry().origin()` or what compress_batch refuses. Bit-identical to
/// streaming the same tokens through a StaggeredCache.
template <class T, class Policy>
std::int64_t compress_batch_staggered(const Policy& policy,
                                      const std::vector<std::int64_t>& origins,
                                      detail::non_deduced_t<StridedView<const T>> raw,
                                      StridedView<T> entries, int thread_index = 0,
                                      int thread_count = 1) {
  const char* where = "phasekv::compress_batch_staggered";
  detail::check_arg(thread_count >= 1, where, "thread_count", thread_count, "must be >= 1");
  detail::check_arg(thread_index >= 0 && thread_index < thread_count, where, "thread_index",
                    thread_index, "must be in [0, thread_count)");
  check_view(raw, where, "raw");
  check_origins(where, origins, raw.heads);
  detail::check_staggered_policy(policy, where, "policy");
  check_policy_dims(policy, raw.heads, where, "policy");
  detail::check_arg<shape_error>(entries.heads == raw.heads, where, "entries.heads", entries.heads,
                                 "must equal raw.heads");
  std::int64_t jmax = 0;
  for (std::int64_t h = 0; h < raw.heads; ++h) {
    const HeadPolicy<Policy> hp(policy, h, origins[static_cast<std::size_t>(h)]);
    const std::int64_t j = check_compress_batch<T>(hp, head_view(raw, h), head_view(entries, h));
    jmax = j > jmax ? j : jmax;
  }
  for (std::int64_t h = 0; h < raw.heads; ++h)
    compress_batch<T>(HeadPolicy<Policy>(policy, h, origins[static_cast<std::size_t>(h)]),
                      head_view(raw, h), head_view(entries, h), thread_index, thread_count);
  return jmax;
}

PHASEKV_NAMESPACE_END
