/// @file
/// @brief CompressedCache: the compressed KV cache of one sequence (all KV heads) with
/// streaming append, a raw prefix, compressed key/value entries and a ring buffer of recent
/// raw tokens, handing attention kernels exactly the visible parts.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <new>
#include <vector>

#include "phasekv/compress/cache_storage.hpp"
#include "phasekv/compress/compress_batch.hpp"
#include "phasekv/compress/head_policy.hpp"
#include "phasekv/compress/policy.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/view.hpp"
#include "phasekv/phase/geometry.hpp"
#include "phasekv/phase/origins.hpp"

PHASEKV_NAMESPACE_BEGIN

/// The compressed KV cache of one sequence, all KV heads.
///
/// Holds the raw prefix (positions < O, kept for ever), one compressed key entry and one
/// compressed value entry per complete window, and a ring buffer of the last `max(W, L)` raw
/// tokens (position p >= O lives in slot `(p - O) mod max(W, L)`). append() streams tokens in:
/// entry j is computed the moment token `O + j*S + W - 1` arrives, with the key policy over
/// raw keys and the value policy over raw values, in f32, stored in `T` via from_float<T>.
/// Appending a prefill at once, in chunks of any size or token by token gives bit-identical
/// entries, equal to compress_batch() of the whole sequence.
///
/// visible() returns exactly what a decode query at position n-1 attends to
/// (Geometry::visible): the prefix, the J(n) entries and the raw range, which the ring may
/// split into two segments.
///
/// **Per-KV-head origins.** Given `origins` (one per KV head), KV head h has windows
/// `[O_h + j*S, O_h + j*S + W)`: its raw prefix is `[0, O_h)`, its entry j is emitted when token
/// `O_h + j*S + W - 1` arrives, its ring slot of position p is `(p - O_h) mod max(W, L)`, and
/// `visible(h, L)` is `Geometry(W, S, O_h).visible`. The policies must then have origin 0. Each run
/// of heads with one origin goes through the same code as the uniform cache (the policy's heads of
/// that run, HeadPolicy), so every head has the bits of a uniform cache with its origin. Entry
/// rows of head h at and above J_h(n) are not written. Without `origins` the cache is the
/// uniform case, on the same path.
///
/// Capacity (maximum length) is fixed at construction. Every call validates all of its
/// arguments before writing anything: a call that throws leaves the cache unchanged.
///
/// @tparam T           storage element type (float, bf16_t, f16_t).
/// @tparam KeyPolicy   compressor for keys: input_dim() = output_dim() = d_k (queries attend
///                     jointly over raw keys and compressed keys).
/// @tparam ValuePolicy compressor for values: input_dim() = output_dim() = d_v. Tied K/V:
///                     use the same policy type and pass the same object twice.
template <class T, class KeyPolicy, class ValuePolicy = KeyPolicy>
class CompressedCache {
  static_assert(check_policy<KeyPolicy>(), "KeyPolicy is not a phasekv compressor policy");
  static_assert(check_policy<ValuePolicy>(), "ValuePolicy is not a phasekv compressor policy");

 public:
  using element_type = T;                 ///< Storage element type.
  using key_policy_type = KeyPolicy;      ///< Key compressor type.
  using value_policy_type = ValuePolicy;  ///< Value compressor type.

  /// An owning cache: allocates its storage (in `layout`, NHD or HND per buffer).
  ///
  /// @param key_policy   key compressor; its geometry is the cache's geometry.
  /// @param value_policy value compressor; must have the same geometry.
  /// @param kv_heads     KV heads (>= 1).
  /// @param d_k          key head dim; must equal key_policy input_dim() and output_dim().
  /// @param d_v          value head dim; must equal value_policy input_dim() and output_dim().
  /// @param local        local window L (>= 0) the cache must serve; visible() accepts any
  ///                     L' <= L.
  /// @param max_length   capacity in tokens.
  /// @param layout       memory layout of the allocated buffers.
  /// @param origins      O_h per KV head (`kv_heads` of them, each in `[0, 2^40]`, also above
  ///                     S), or empty: every head at the policies' origin.
  ///
  /// Throws phasekv::shape_error / phasekv::invalid_argument naming the argument
  /// (`origins.size()`, `origins[h]`, or `key_policy.geometry().origin()` when it is not 0
  /// with per-head origins).
  CompressedCache(const KeyPolicy& key_policy, const ValuePolicy& value_policy,
                  std::int64_t kv_heads, std::int64_t d_k, std::int64_t d_v, std::int64_t local,
                  std::int64_t max_length, Layout layout = Layout::NHD,
                  const std::vector<std::int64_t>& origins = {})
      : key_policy_(key_policy), value_policy_(value_policy) {
    init(kv_heads, d_k, d_v, local, max_length, origins);
    const std::int64_t per_token = kv_heads * (d_k + d_v);
    const std::int64_t tokens = extents_.prefix_tokens + extents_.entries + extents_.ring_tokens;
    detail::check_arg<capacity_error>(
        tokens <= std::numeric_limits<std::int64_t>::max() / 8 / per_token, kWhere, "max_length",
        max_length, "storage size overflows");
    keys_.resize(static_cast<std::size_t>(tokens * kv_heads * d_k));
    values_.resize(static_cast<std::size_t>(tokens * kv_heads * d_v));
    T* k = keys_.data();
    T* v = values_.data();
    auto carve = [&](T*& base, std::int64_t n, std::int64_t d) {
      StridedView<T> view = make_view(n > 0 ? base : nullptr, n, kv_heads, d, layout);
      base += n * kv_heads * d;
      return view;
    };
    storage_.prefix_keys = carve(k, extents_.prefix_tokens, d_k);
    storage_.entry_keys = carve(k, extents_.entries, d_k);
    storage_.ring_keys = carve(k, extents_.ring_tokens, d_k);
    storage_.prefix_values = carve(v, extents_.prefix_tokens, d_v);
    storage_.entry_values = carve(v, extents_.entries, d_v);
    storage_.ring_values = carve(v, extents_.ring_tokens, d_v);
  }

  /// A non-owning cache over caller buffers (engines keep their own memory). Each view of
  /// `storage` must have `kv_heads` heads, dim d_k (keys) or d_v (values) and at least the
  /// tokens of cache_extents(geometry, local, max_length, origins); only those leading tokens
  /// are used. The buffers must outlive the cache. Other parameters as in the owning
  /// constructor.
  CompressedCache(const KeyPolicy& key_policy, const ValuePolicy& value_policy,
                  std::int64_t kv_heads, std::int64_t d_k, std::int64_t d_v, std::int64_t local,
                  std::int64_t max_length, const CacheStorage<T>& storage,
                  const std::vector<std::int64_t>& origins = {})
      : key_policy_(key_policy), value_policy_(value_policy) {
    init(kv_heads, d_k, d_v, local, max_length, origins);
    check_storage_view(storage.prefix_keys, "storage.prefix_keys", extents_.prefix_tokens, d_k);
    check_storage_view(storage.prefix_values, "storage.prefix_values", extents_.prefix_tokens, d_v);
    check_storage_view(storage.entry_keys, "storage.entry_keys", extents_.entries, d_k);
    check_storage_view(storage.entry_values, "storage.entry_values", extents_.entries, d_v);
    check_storage_view(storage.ring_keys, "storage.ring_keys", extents_.ring_tokens, d_k);
    check_storage_view(storage.ring_values, "storage.ring_values", extents_.ring_tokens, d_v);
    storage_.prefix_keys = storage.prefix_keys.slice(0, extents_.prefix_tokens);
    storage_.prefix_values = storage.prefix_values.slice(0, extents_.prefix_tokens);
    storage_.entry_keys = storage.entry_keys.slice(0, extents_.entries);
    storage_.entry_values = storage.entry_values.slice(0, extents_.entries);
    storage_.ring_keys = storage.ring_keys.slice(0, extents_.ring_tokens);
    storage_.ring_values = storage.ring_values.slice(0, extents_.ring_tokens);
  }

  /// Copying would alias or duplicate buffers ambiguously; move instead.
  CompressedCache(const CompressedCache&) = delete;
  /// Copying is not supported (see the copy constructor).
  CompressedCache& operator=(const CompressedCache&) = delete;
  /// Moves the cache (owned buffers keep their addresses, so views stay valid).
  CompressedCache(CompressedCache&&) noexcept = default;
  /// Move assignment.
  CompressedCache& operator=(CompressedCache&&) noexcept = default;
  /// Destructor.
  ~CompressedCache() = default;

  /// Appends `keys.tokens` tokens (`keys`: `[t, kv_heads, d_k]`, `values`: `[t, kv_heads, d_v]`,
  /// any strides) at positions `[size(), size() + t)`, emitting every entry whose window
  /// completes among them. Throws phasekv::shape_error on shape mismatch or null data and
  /// phasekv::capacity_error when `size() + t > max_length()`; nothing is written then.
  void append(StridedView<const T> keys, StridedView<const T> values) {
    check_view(keys, kAppend, "keys");
    check_view(values, kAppend, "values");
    detail::check_arg<shape_error>(keys.heads == kv_heads_, kAppend, "keys.heads", keys.heads,
                                   "must equal the cache's kv_heads");
    detail::check_arg<shape_error>(keys.dim == d_k_, kAppend, "keys.dim", keys.dim,
                                   "must equal the cache's d_k");
    detail::check_arg<shape_error>(values.heads == kv_heads_, kAppend, "values.heads", values.heads,
                                   "must equal the cache's kv_heads");
    detail::check_arg<shape_error>(values.dim == d_v_, kAppend, "values.dim", values.dim,
                                   "must equal the cache's d_v");
    detail::check_arg<shape_error>(values.tokens == keys.tokens, kAppend, "values.tokens",
                                   values.tokens, "must equal keys.tokens");
    if (keys.tokens > max_length_ - n_) {
      const std::string req =
          "size() + tokens must be <= max_length() = " + std::to_string(max_length_) +
          " (size() = " + std::to_string(n_) + ")";
      detail::throw_arg<capacity_error>(kAppend, "keys.tokens", keys.tokens, req.c_str());
    }
    if (keys.tokens == 0) return;
    if (runs_.empty()) {
      append_run(key_policy_, value_policy_, keys, values, 0);
    } else {
      for (std::size_t r = 0; r < runs_.size(); ++r)
        append_run(key_runs_[r], value_runs_[r], head_view(keys, runs_[r].head, runs_[r].count),
                   head_view(values, runs_[r].head, runs_[r].count), runs_[r].head);
    }
    n_ += keys.tokens;
  }

  /// Forgets every token (size() becomes 0); storage is kept and reused.
  void clear() { n_ = 0; }

  /// What a decode query at position size() - 1 sees with local window `local` (default: the
  /// cache's L): prefix, entries and raw tokens, in position order, at most 4 segments, every
  /// KV head. Throws phasekv::invalid_argument when `local` is negative or larger than the
  /// cache's L, or naming `origins` when the heads' origins differ (each head then sees its
  /// own set: visible(h, local)).
  VisibleKV<T> visible(std::int64_t local) const {
    const char* where = "phasekv::CompressedCache::visible";
    detail::check_arg(local >= 0 && local <= local_, where, "local", local,
                      "must be in [0, L] for the L the cache was built with");
    detail::check_arg(origins_uniform(origins_), where, "origins", "per-head",
                      "must be equal for one visible set of every head (use visible(h, local))");
    return visible_heads(0, kv_heads_, local);
  }
  /// visible(local()).
  VisibleKV<T> visible() const { return visible(local_); }
  /// What a decode query at position size() - 1 of KV head `h` sees (one-head views), with
  /// that head's origin. Throws phasekv::invalid_argument naming `h` or `local`.
  VisibleKV<T> visible(std::int64_t h, std::int64_t local) const {
    const char* where = "phasekv::CompressedCache::visible";
    check_head(where, h);
    detail::check_arg(local >= 0 && local <= local_, where, "local", local,
                      "must be in [0, L] for the L the cache was built with");
    return visible_heads(h, 1, local);
  }
  /// The per-head visible sets `visible(h, local)` of every KV head (the `head_kv` of a
  /// per-head-origin decode).
  std::vector<VisibleKV<T>> visible_per_head(std::int64_t local) const {
    std::vector<VisibleKV<T>> v;
    v.reserve(static_cast<std::size_t>(kv_heads_));
    for (std::int64_t h = 0; h < kv_heads_; ++h) v.push_back(visible(h, local));
    return v;
  }

  /// Tokens appended so far (n).
  std::int64_t size() const { return n_; }
  /// Capacity in tokens.
  std::int64_t max_length() const { return max_length_; }
  /// Compressed entry rows in use so far: J(n), the largest over the heads with per-head
  /// origins.
  std::int64_t num_entries() const { return max_complete_windows(geometry(), origins_, n_); }
  /// Compressed entries of KV head `h` so far, J_h(n). Throws naming `h`.
  std::int64_t num_entries(std::int64_t h) const {
    check_head("phasekv::CompressedCache::num_entries", h);
    return head_geometry(h).complete_windows(n_);
  }
  /// Entry capacity, J(max_length()).
  std::int64_t max_entries() const { return extents_.entries; }
  /// KV heads.
  std::int64_t kv_heads() const { return kv_heads_; }
  /// Key head dim d_k.
  std::int64_t key_dim() const { return d_k_; }
  /// Value head dim d_v.
  std::int64_t value_dim() const { return d_v_; }
  /// Local window L the cache serves.
  std::int64_t local() const { return local_; }
  /// The chunk geometry (of both policies).
  Geometry geometry() const { return key_policy_.geometry(); }
  /// The origin of every KV head (`kv_heads()` of them; all `geometry().origin()` unless the
  /// cache was built with per-head origins).
  const std::vector<std::int64_t>& origins() const { return origins_; }
  /// The geometry of KV head `h`: `(W, S, origins()[h])`. Throws naming `h`.
  Geometry head_geometry(std::int64_t h) const {
    check_head("phasekv::CompressedCache::head_geometry", h);
    const Geometry g = geometry();
    return Geometry(g.window(), g.stride(), origins_[static_cast<std::size_t>(h)]);
  }
  /// The key compressor.
  const KeyPolicy& key_policy() const { return key_policy_; }
  /// The value compressor.
  const ValuePolicy& value_policy() const { return value_policy_; }
  /// Slot counts of the storage in use.
  const CacheExtents& extents() const { return extents_; }
  /// Views of the storage in use (exactly extents() tokens each).
  const CacheStorage<T>& storage() const { return storage_; }
  /// The J(n) compressed keys, `[J(n), kv_heads, d_k]` (with per-head origins, head h's rows
  /// at and above J_h(n) are not entries).
  StridedView<const T> entry_keys() const {
    return cview(storage_.entry_keys).slice(0, num_entries());
  }
  /// The J(n) compressed values, `[J(n), kv_heads, d_v]` (as entry_keys()).
  StridedView<const T> entry_values() const {
    return cview(storage_.entry_values).slice(0, num_entries());
  }
  /// The J_h(n) compressed keys of KV head `h`, `[J_h(n), 1, d_k]`. Throws naming `h`.
  StridedView<const T> entry_keys(std::int64_t h) const {
    return head_view(cview(storage_.entry_keys),
                     checked_head("phasekv::CompressedCache::entry_keys", h))
        .slice(0, num_entries(h));
  }
  /// The J_h(n) compressed values of KV head `h`, `[J_h(n), 1, d_v]`. Throws naming `h`.
  StridedView<const T> entry_values(std::int64_t h) const {
    return head_view(cview(storage_.entry_values),
                     checked_head("phasekv::CompressedCache::entry_values", h))
        .slice(0, num_entries(h));
  }
  /// True when the cache allocated its own storage.
  bool owns_storage() const { return !keys_.empty() || !values_.empty(); }

  /// Bytes of K and V data the cache holds for the current n: prefix + entries + the raw
  /// tokens still in the ring (`min(n - min(n, O), max(W, L))`), summed over the heads with
  /// their origins.
  std::int64_t memory_bytes() const {
    std::int64_t rows = 0;  // head-tokens
    for (std::int64_t h = 0; h < kv_heads_; ++h) {
      const Geometry g = head_geometry(h);
      const std::int64_t pre = n_ < g.origin() ? n_ : g.origin();
      const std::int64_t ring = n_ - pre < extents_.ring_tokens ? n_ - pre : extents_.ring_tokens;
      rows += pre + g.complete_windows(n_) + ring;
    }
    return rows * token_bytes() / kv_heads_;
  }
  /// Bytes of K and V storage reserved for max_length() tokens.
  std::int64_t capacity_bytes() const {
    return (extents_.prefix_tokens + extents_.entries + extents_.ring_tokens) * token_bytes();
  }
  /// Bytes an uncompressed cache of the same length would hold:
  /// `n * kv_heads * (d_k + d_v) * sizeof(T)`.
  std::int64_t uncompressed_bytes() const { return n_ * token_bytes(); }
  /// memory_bytes() / uncompressed_bytes() (below 1 once compression pays off; 1 when n = 0).
  double memory_ratio() const {
    return n_ == 0
               ? 1.0
               : static_cast<double>(memory_bytes()) / static_cast<double>(uncompressed_bytes());
  }

 private:
  static constexpr const char* kWhere = "phasekv::CompressedCache";
  static constexpr const char* kAppend = "phasekv::CompressedCache::append";

  void init(std::int64_t kv_heads, std::int64_t d_k, std::int64_t d_v, std::int64_t local,
            std::int64_t max_length, const std::vector<std::int64_t>& origins) {
    detail::check_arg<shape_error>(kv_heads >= 1, kWhere, "kv_heads", kv_heads, "must be >= 1");
    detail::check_arg<shape_error>(d_k >= 1, kWhere, "d_k", d_k, "must be >= 1");
    detail::check_arg<shape_error>(d_v >= 1, kWhere, "d_v", d_v, "must be >= 1");
    Geometry::check_local(kWhere, "local", local);
    Geometry::check_length(kWhere, "max_length", max_length);
    check_policy_dims(key_policy_, kv_heads, kWhere, "key_policy");
    check_policy_dims(value_policy_, kv_heads, kWhere, "value_policy");
    detail::check_arg<shape_error>(key_policy_.input_dim() == d_k, kWhere, "key_policy.input_dim()",
                                   key_policy_.input_dim(), "must equal d_k");
    detail::check_arg<shape_error>(key_policy_.output_dim() == d_k, kWhere,
                                   "key_policy.output_dim()", key_policy_.output_dim(),
                                   "must equal d_k (queries attend jointly over raw keys and "
                                   "compressed keys)");
    detail::check_arg<shape_error>(value_policy_.input_dim() == d_v, kWhere,
                                   "value_policy.input_dim()", value_policy_.input_dim(),
                                   "must equal d_v");
    detail::check_arg<shape_error>(value_policy_.output_dim() == d_v, kWhere,
                                   "value_policy.output_dim()", value_policy_.output_dim(),
                                   "must equal d_v");
    const Geometry gk = key_policy_.geometry(), gv = value_policy_.geometry();
    if (gk != gv) {
      const std::string req = "must equal key_policy.geometry() = " + detail::geometry_string(gk);
      detail::throw_arg(kWhere, "value_policy.geometry()", detail::geometry_string(gv),
                        req.c_str());
    }
    std::vector<std::int64_t> resolved =
        resolve_origins(kWhere, gk, origins, kv_heads, "key_policy");
    kv_heads_ = kv_heads;
    d_k_ = d_k;
    d_v_ = d_v;
    local_ = local;
    max_length_ = max_length;
    extents_ = cache_extents(gk, local, max_length, origins);
    origins_ = std::move(resolved);
    // The uniform case runs the policies themselves; per-head origins run each run of heads
    // with one origin as the policies' heads of that run (HeadPolicy), through the same code.
    if (!origins.empty()) {
      runs_ = origin_runs(origins_);
      for (const OriginRun& r : runs_) {
        key_runs_.emplace_back(key_policy_, r.head, r.origin, r.count);
        value_runs_.emplace_back(value_policy_, r.head, r.origin, r.count);
      }
    }
    const std::int64_t dmax = d_k > d_v ? d_k : d_v;
    scratch_.resize(static_cast<std::size_t>(dmax));
    const std::int64_t w = gk.window();
    window_.resize(static_cast<std::size_t>(detail::gather_elements(w, dmax)));
  }

  void check_head(const char* where, std::int64_t h) const {
    detail::check_arg(h >= 0 && h < kv_heads_, where, "h", h, "must be in [0, kv_heads())");
  }
  std::int64_t checked_head(const char* where, std::int64_t h) const {
    check_head(where, h);
    return h;
  }

  // The visible set of heads [h0, h0 + count), which share one origin.
  VisibleKV<T> visible_heads(std::int64_t h0, std::int64_t count, std::int64_t local) const {
    const Geometry g = head_geometry(h0);
    const Visibility vis = g.visible(n_, local);
    const auto heads = [&](const StridedView<T>& v) { return head_view(cview(v), h0, count); };
    VisibleKV<T> kv;
    kv.push({heads(storage_.prefix_keys).slice(0, vis.prefix_end),
             heads(storage_.prefix_values).slice(0, vis.prefix_end), 0, SegmentKind::prefix});
    kv.push({heads(storage_.entry_keys).slice(0, vis.entries),
             heads(storage_.entry_values).slice(0, vis.entries), 0, SegmentKind::compressed});
    const std::int64_t c = vis.raw_count();
    if (c > 0) {
      const std::int64_t r = extents_.ring_tokens;
      const std::int64_t s0 = (vis.raw_begin - g.origin()) % r;
      const std::int64_t first = c < r - s0 ? c : r - s0;
      kv.push({heads(storage_.ring_keys).slice(s0, first),
               heads(storage_.ring_values).slice(s0, first), vis.raw_begin, SegmentKind::raw});
      kv.push({heads(storage_.ring_keys).slice(0, c - first),
               heads(storage_.ring_values).slice(0, c - first), vis.raw_begin + first,
               SegmentKind::raw});
    }
    return kv;
  }

  // append() for the heads [h0, h0 + kp.kv_heads()), which share the origin of kp's geometry:
  // `keys` / `values` are those heads' rows of the chunk.
  template <class KP, class VP>
  void append_run(const KP& kp, const VP& vp, const StridedView<const T>& keys,
                  const StridedView<const T>& values, std::int64_t h0) {
    const std::int64_t heads = keys.heads;
    const auto sub = [&](const StridedView<T>& v) { return head_view(v, h0, heads); };
    const StridedView<T> ring_k = sub(storage_.ring_keys), ring_v = sub(storage_.ring_values);
    const StridedView<T> entry_k = sub(storage_.entry_keys), entry_v = sub(storage_.entry_values);
    const Geometry g = kp.geometry();
    const std::int64_t n0 = n_, n1 = n_ + keys.tokens, o = g.origin();
    const std::int64_t r = extents_.ring_tokens;
    // 1. Entries of the windows completing in [n0, n1). Those that began before the chunk
    //    take their early tokens from the ring (it holds >= W tokens) and the rest from the
    //    input; those wholly inside the chunk go through compress_batch's window loop (the
    //    policies' fast paths and entry stores, the same bits).
    const std::int64_t j_end = g.complete_windows(n1);
    std::int64_t j = g.complete_windows(n0);
    for (; j < j_end && g.window_begin(j) < n0; ++j) {
      const std::int64_t b = g.window_begin(j);
      const std::int64_t split = n0 - b;
      for (std::int64_t h = 0; h < heads; ++h) {
        emit(kp, h, split, (b - o) % r, ring_k, keys, b + split - n0, entry_k.ptr(j, h));
        emit(vp, h, split, (b - o) % r, ring_v, values, b + split - n0, entry_v.ptr(j, h));
      }
    }
    // 2. The windows wholly inside the chunk, then the chunk's raw tokens: the prefix, and
    //    its last r tokens into the ring (in at most two runs of consecutive slots, as the ring
    //    wraps at most once); K first, then V, so the rows the ring takes are still cached.
    keep_chunk(kp, keys, n0, j, j_end, entry_k, sub(storage_.prefix_keys), ring_k);
    keep_chunk(vp, values, n0, j, j_end, entry_v, sub(storage_.prefix_values), ring_v);
  }

  void check_storage_view(const StridedView<T>& v, const char* name, std::int64_t tokens,
                          std::int64_t dim) const {
    check_view(v, kWhere, name);
    const std::string n(name);
    detail::check_arg<shape_error>(v.heads == kv_heads_, kWhere, (n + ".heads").c_str(), v.heads,
                                   "must equal kv_heads");
    detail::check_arg<shape_error>(v.dim == dim, kWhere, (n + ".dim").c_str(), v.dim,
                                   "must equal the head dim (d_k for keys, d_v for values)");
    const std::string req =
        "must be >= " + std::to_string(tokens) + " (cache_extents(geometry, local, max_length))";
    detail::check_arg<capacity_error>(v.tokens >= tokens, kWhere, (n + ".tokens").c_str(), v.tokens,
                                      req.c_str());
    detail::check_arg<shape_error>(tokens == 0 || v.data != nullptr, kWhere, (n + ".data").c_str(),
                                   "null", "storage is needed");
  }

  // Entry of a window of head h whose first `split` tokens are in the ring (from slot
  // `slot0`) and the rest in the input chunk (from row `input_row`). Windows of up to
  // detail::kGatherElements elements are gathered into one contiguous window first, so that the
  // policy's row_kernels window path (compress_batch's, the same bits) takes them; larger ones
  // are read in place through SplitWindowLoader.
  template <class Policy>
  void emit(const Policy& policy, std::int64_t h, std::int64_t split, std::int64_t slot0,
            const StridedView<T>& ring, const StridedView<const T>& input, std::int64_t input_row,
            T* dst) {
    const std::int64_t w = policy.geometry().window(), din = input.dim;
    float* out = scratch_.data();
    if (!window_.empty()) {  // W * max(d_k, d_v) <= detail::kGatherElements (see init)
      T* win = window_.data();
      const std::size_t row_bytes = static_cast<std::size_t>(din) * sizeof(T);
      std::int64_t slot = slot0;
      for (std::int64_t i = 0; i < split; ++i) {
        std::memcpy(win + i * din, ring.ptr(slot, h), row_bytes);
        if (++slot == extents_.ring_tokens) slot = 0;
      }
      // input_row is the chunk row of window offset `split`; it is in range whenever any
      // window token comes from the chunk (always: the window's last token is new).
      for (std::int64_t i = split; i < w; ++i)
        std::memcpy(win + i * din, input.ptr(input_row + i - split, h), row_bytes);
      detail::compress_gathered<T>(policy, h, win, din, out);
    } else {
      detail::SplitWindowLoader<T> x;
      x.ring = ring.ptr(0, h);
      x.ring_stride = ring.token_stride;
      x.ring_size = extents_.ring_tokens;
      x.slot0 = slot0;
      x.split = split;
      x.input = input.ptr(input_row, h);
      x.input_stride = input.token_stride;
      policy.compress(h, x, out);
    }
    detail::rows::store_row(dst, out, policy.output_dim());
  }

  // Copies token `row` of `src` (every head) to slot `slot` of `dst`, row by row.
  // Step 2 of append for K or V: the entries [j, j_end) of the windows wholly inside the chunk
  // (rows [0, t) of `input` hold positions [n0, n0 + t)), then its raw tokens.
  template <class Policy>
  void keep_chunk(const Policy& policy, const StridedView<const T>& input, std::int64_t n0,
                  std::int64_t j, std::int64_t j_end, const StridedView<T>& entries,
                  const StridedView<T>& prefix, const StridedView<T>& ring) {
    if (j < j_end)
      detail::compress_entries_at<T>(policy, input, n0, entries, j, j_end, scratch_.data());
    const std::int64_t n1 = n0 + input.tokens, o = policy.geometry().origin();
    const std::int64_t r = extents_.ring_tokens;
    const std::int64_t prefix_end = n1 < o ? n1 : o;
    if (n0 < prefix_end) copy_tokens(input, 0, prefix, n0, prefix_end - n0);
    std::int64_t p = n1 - r > n0 ? n1 - r : n0;
    if (p < o) p = o;
    while (p < n1) {
      const std::int64_t slot = (p - o) % r;
      const std::int64_t count = n1 - p < r - slot ? n1 - p : r - slot;
      copy_tokens(input, p - n0, ring, slot, count);
      p += count;
    }
  }

  // Copies rows [row, row + count) of `src` to slots [slot, slot + count) of `dst`, every
  // head: one block when both keep a token's heads and consecutive tokens adjacent (NHD
  // without padding), one block per head when both keep a head's tokens adjacent (HND), else
  // row by row (a row of d elements is always contiguous).
  void copy_tokens(const StridedView<const T>& src, std::int64_t row, const StridedView<T>& dst,
                   std::int64_t slot, std::int64_t count) const {
    const std::int64_t heads = src.heads;
    if (count <= 0 || heads == 0 || src.dim == 0) return;
    const std::int64_t d = src.dim;
    const auto elems = [](std::int64_t e) { return static_cast<std::size_t>(e) * sizeof(T); };
    const bool src_nhd = src.head_stride == d && src.token_stride == heads * d;
    const bool dst_nhd = dst.head_stride == d && dst.token_stride == heads * d;
    if (src_nhd && dst_nhd) {
      std::memcpy(dst.ptr(slot, 0), src.ptr(row, 0), elems(count * heads * d));
    } else if (src.token_stride == d && dst.token_stride == d) {
      for (std::int64_t h = 0; h < heads; ++h)
        std::memcpy(dst.ptr(slot, h), src.ptr(row, h), elems(count * d));
    } else {
      for (std::int64_t i = 0; i < count; ++i)
        for (std::int64_t h = 0; h < heads; ++h)
          std::memcpy(dst.ptr(slot + i, h), src.ptr(row + i, h), elems(d));
    }
  }

  static StridedView<const T> cview(const StridedView<T>& v) { return v; }

  std::int64_t token_bytes() const {
    return kv_heads_ * (d_k_ + d_v_) * static_cast<std::int64_t>(sizeof(T));
  }

  KeyPolicy key_policy_;
  ValuePolicy value_policy_;
  std::int64_t kv_heads_ = 0;
  std::int64_t d_k_ = 0;
  std::int64_t d_v_ = 0;
  std::int64_t local_ = 0;
  std::int64_t max_length_ = 0;
  std::int64_t n_ = 0;
  CacheExtents extents_{};
  CacheStorage<T> storage_{};
  std::vector<std::int64_t> origins_;                // one per KV head
  std::vector<OriginRun> runs_;                      // empty: the uniform case
  std::vector<HeadPolicy<KeyPolicy>> key_runs_;      // the key policy of each run
  std::vector<HeadPolicy<ValuePolicy>> value_runs_;  // the value policy of each run
  std::vector<T, detail::LineAllocator<T>> keys_;
  std::vector<T, detail::LineAllocator<T>> values_;
  std::vector<float> scratch_;
  std::vector<T> window_;  // one gathered window of emit()
};

PHASEKV_NAMESPACE_END
