/// @file
/// @brief What the CUDA batch decode and batch prefill kernels share on the host: the check of
/// the paged cache and head shapes against the device limits, and the launch shape (query heads
/// per block, shared memory).
#pragma once

#include <cstdint>

#include "phasekv/attention/cuda/block_attention.cuh"
#include "phasekv/attention/cuda/status.cuh"
#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/serving/cuda/paged_rows.cuh"
#include "phasekv/serving/paged.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cuda::detail {

/// How a paged attention kernel covers the query heads: each block takes up to
/// kMaxHeadsPerBlock heads of one KV head's group.
struct PagedLaunch {
  int group = 0;   ///< Query heads per KV head (G).
  int chunks = 0;  ///< Blocks per KV head: ceil(G / kMaxHeadsPerBlock).
  int heads = 0;   ///< Query heads per block: min(G, kMaxHeadsPerBlock).
  AttnSmem smem;   ///< The block's shared-memory layout.

  /// The launch shape of `q_heads` over `kv_heads` with head dims `d_k`, `d_v` and elements of
  /// `elem_bytes` bytes (the head shape must have passed check_head_shape).
  static PagedLaunch make(std::int64_t q_heads, std::int64_t kv_heads, std::int64_t d_k,
                          std::int64_t d_v, int elem_bytes) {
    PagedLaunch s;
    s.group = static_cast<int>(q_heads / kv_heads);
    s.chunks = static_cast<int>(ceil_div(s.group, kMaxHeadsPerBlock));
    s.heads = s.group < kMaxHeadsPerBlock ? s.group : kMaxHeadsPerBlock;
    s.smem = AttnSmem::choose(s.heads, static_cast<int>(d_k), static_cast<int>(d_v), elem_bytes);
    return s;
  }
};

/// Host checks common to the paged kernels: head shape, pools (their heads and dims), ring,
/// variant, grid and shared-memory limits. Throws phasekv::invalid_argument (or shape_error)
/// naming `where`, the argument and its value.
template <class T, class Variant>
void check_paged_attention(const char* where, const PagedKV<T>& kv, std::int64_t q_heads,
                           std::int64_t kv_heads, std::int64_t d_k, std::int64_t d_v,
                           const Variant& variant) {
  using phasekv::detail::check_arg;
  phasekv::detail::check_head_shape(where, q_heads, kv_heads, d_k, d_v, kHeadShapeLimits);
  check_arg(kv.origins == nullptr, where, "kv.origins", "non-null",
            "per-head origins run on the CPU serving path only (the CUDA kernels read one origin)");
  check_page_pool(kv.raw_pool, where, "kv.raw_pool");
  const auto dims = [&](const PagePool<const T>& p, const char* name) {
    check_arg<shape_error>(p.heads == kv_heads && p.d_k == d_k && p.d_v == d_v, where, name,
                           p.heads, "heads, d_k and d_v must equal kv_heads, d_k and d_v");
  };
  dims(kv.raw_pool, "kv.raw_pool.heads");
  if (kv.rule.is_compressed()) {
    check_page_pool(kv.entry_pool, where, "kv.entry_pool");
    dims(kv.entry_pool, "kv.entry_pool.heads");
  }
  check_arg(kv.ring_slots >= 0, where, "kv.ring_slots", kv.ring_slots, "must be >= 0");
  variant.check(where);
  const PagedLaunch s = PagedLaunch::make(q_heads, kv_heads, d_k, d_v, static_cast<int>(sizeof(T)));
  check_arg(kv_heads * s.chunks <= 65535, where, "kv_heads", kv_heads,
            "kv_heads * ceil(G / 8) must be <= 65535 (grid limit)");
  check_arg(s.smem.bytes <= kMaxDynamicSmem, where, "d_k + d_v", d_k + d_v,
            "head dims need more shared memory than a block has (227 KiB)");
}

/// Whether every pool a paged kernel reads allows 16-byte vector loads.
template <class T>
bool paged_vector_loads(const PagedKV<T>& kv) {
  return paged_vector_loadable(kv.raw_pool) &&
         (!kv.rule.is_compressed() || paged_vector_loadable(kv.entry_pool));
}

}  // namespace cuda::detail
PHASEKV_NAMESPACE_END
