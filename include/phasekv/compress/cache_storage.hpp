/// @file
/// @brief The storage of a CompressedCache: CacheExtents and cache_extents (the slots a
/// geometry, local window, capacity and per-head origins need), CacheStorage (caller-owned
/// buffers), and the line-aligned allocator and window loader the cache uses.
#pragma once

#include <cstdint>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/view.hpp"
#include "phasekv/phase/geometry.hpp"
#include "phasekv/phase/origins.hpp"

PHASEKV_NAMESPACE_BEGIN

namespace detail {
/// Allocator of the cache's buffers: 64-byte (cache line) aligned, so that rows which fill
/// whole lines start on one (the entry stores may then bypass the caches).
template <class T>
struct LineAllocator {
  using value_type = T;  ///< Element type.
  LineAllocator() = default;
  /// Rebinding copy.
  template <class U>
  LineAllocator(const LineAllocator<U>&) noexcept {}
  /// `n` elements, 64-byte aligned.
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{64}));
  }
  /// Frees what allocate returned.
  void deallocate(T* p, std::size_t) noexcept { ::operator delete (p, std::align_val_t{64}); }
  /// All instances are interchangeable.
  template <class U>
  bool operator==(const LineAllocator<U>&) const noexcept {
    return true;
  }
  /// All instances are interchangeable.
  template <class U>
  bool operator!=(const LineAllocator<U>&) const noexcept {
    return false;
  }
};
}  // namespace detail

/// Token counts a CompressedCache needs for a geometry, local window and maximum length.
struct CacheExtents {
  std::int64_t prefix_tokens = 0;  ///< Raw prefix slots: `min(O, max_length)` (O: the
                                   ///< largest origin).
  std::int64_t entries = 0;        ///< Compressed entry slots: `J(max_length)` (of the
                                   ///< smallest origin).
  std::int64_t ring_tokens = 0;    ///< Ring buffer slots: `max(W, L)`.
};

/// Computes the CacheExtents for `geometry`, local window `local`, capacity `max_length`
/// tokens and the per-KV-head `origins` (empty: every head at `geometry.origin()`). Throws
/// phasekv::invalid_argument for negative or oversized arguments.
inline CacheExtents cache_extents(const Geometry& geometry, std::int64_t local,
                                  std::int64_t max_length,
                                  const std::vector<std::int64_t>& origins = {}) {
  const char* where = "phasekv::cache_extents";
  Geometry::check_local(where, "local", local);
  Geometry::check_length(where, "max_length", max_length);
  if (!origins.empty()) check_origins(where, origins, static_cast<std::int64_t>(origins.size()));
  const std::int64_t o = origins.empty() ? geometry.origin() : max_origin(origins);
  CacheExtents e;
  e.prefix_tokens = max_length < o ? max_length : o;
  e.entries = max_complete_windows(geometry, origins, max_length);
  e.ring_tokens = geometry.ring_capacity(local);
  return e;
}

/// The storage of a CompressedCache: six strided views (`[tokens, kv_heads, dim]`, any token
/// and head strides, so NHD and HND buffers both work). A caller that keeps its own memory
/// describes it with these views; the cache never allocates them then. Host memory.
template <class T>
struct CacheStorage {
  StridedView<T> prefix_keys;    ///< `[>= prefix_tokens, kv_heads, d_k]` raw prefix keys.
  StridedView<T> prefix_values;  ///< `[>= prefix_tokens, kv_heads, d_v]` raw prefix values.
  StridedView<T> entry_keys;     ///< `[>= entries, kv_heads, d_k]` compressed keys.
  StridedView<T> entry_values;   ///< `[>= entries, kv_heads, d_v]` compressed values.
  StridedView<T> ring_keys;      ///< `[>= ring_tokens, kv_heads, d_k]` recent raw keys.
  StridedView<T> ring_values;    ///< `[>= ring_tokens, kv_heads, d_v]` recent raw values.
};

namespace detail {

// Loader over a window whose first `split` tokens are in a ring buffer (starting at slot
// `slot0`, wrapping at `ring_size`) and whose remaining tokens come from an input chunk.
template <class T>
struct SplitWindowLoader {
  const T* ring = nullptr;
  std::int64_t ring_stride = 0;
  std::int64_t ring_size = 0;
  std::int64_t slot0 = 0;
  std::int64_t split = 0;
  const T* input = nullptr;
  std::int64_t input_stride = 0;

  float operator()(std::int64_t i, std::int64_t c) const {
    if (i < split) {
      std::int64_t s = slot0 + i;
      if (s >= ring_size) s -= ring_size;
      return to_float(ring[s * ring_stride + c]);
    }
    return to_float(input[(i - split) * input_stride + c]);
  }
};

inline std::string geometry_string(const Geometry& g) {
  std::ostringstream os;
  os << "(W=" << g.window() << ", S=" << g.stride() << ", O=" << g.origin() << ")";
  return os.str();
}

}  // namespace detail

PHASEKV_NAMESPACE_END
