/// @file
/// @brief The rows of one paged sequence on CUDA: PagedSequence, the row source that the
/// attention block loop (attention/cuda/block_attention.cuh, attend_items) reads through the
/// block tables, for the serving kernels (batch decode and ragged batch prefill).
#pragma once

#include <cstdint>

#include "phasekv/attention/cuda/vector_load.cuh"
#include "phasekv/core/config.hpp"
#include "phasekv/core/view.hpp"
#include "phasekv/phase/geometry.hpp"
#include "phasekv/serving/paged.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cuda::detail {

/// The visible set of one paged sequence as a row source of attend_items: items are counted
/// prefix, entries, raw tokens (the order of the CPU's PagedSequenceRows); rows are found
/// through the block tables with PagedKV::raw_slot and PagePool::key / value.
template <class T>
struct PagedSequence {
  const PagedKV<T>* kv = nullptr;  ///< The batch.
  std::int64_t b = 0;              ///< Sequence.
  Visibility vis;                  ///< What its query sees.
  std::int64_t ring_origin = 0;    ///< kv->ring_origin().
};

/// The row source of sequence `b` of `kv` for a query at position `n - 1`.
template <class T>
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE PagedSequence<T> paged_sequence(const PagedKV<T>& kv,
                                                                        std::int64_t b,
                                                                        std::int64_t n) {
  PagedSequence<T> s;
  s.kv = &kv;
  s.b = b;
  s.vis = kv.rule.at(n);
  s.ring_origin = kv.ring_origin();
  return s;
}

/// attend_items' row lookup for a PagedSequence (found by argument-dependent lookup); host and
/// device code, so the tests compare it with the CPU's PagedSequenceRows on any machine.
template <class T>
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE void locate_item(const PagedSequence<T>& s,
                                                         std::int64_t item, std::int64_t kh,
                                                         const T*& k_row, const T*& v_row,
                                                         SegmentKind& kind) {
  const PagedKV<T>& kv = *s.kv;
  const std::int64_t pe = s.vis.prefix_end, ne = s.vis.entries;
  if (item >= pe && item - pe < ne) {
    const std::int64_t j = item - pe, ps = kv.entry_pool.page_size;
    const std::int64_t page = kv.entry_table.page(s.b, j / ps);
    k_row = kv.entry_pool.key(page, j % ps, kh);
    v_row = kv.entry_pool.value(page, j % ps, kh);
    kind = SegmentKind::compressed;
    return;
  }
  const bool prefix = item < pe;
  const std::int64_t p = prefix ? item : s.vis.raw_begin + (item - pe - ne);
  const std::int64_t slot = PagedKV<T>::raw_slot(p, s.ring_origin, kv.ring_slots);
  const std::int64_t ps = kv.raw_pool.page_size;
  const std::int64_t page = kv.raw_table.page(s.b, slot / ps);
  k_row = kv.raw_pool.key(page, slot % ps, kh);
  v_row = kv.raw_pool.value(page, slot % ps, kh);
  kind = prefix ? SegmentKind::prefix : SegmentKind::raw;
}

/// True when every row of `pool` may be read with 16-byte loads.
template <class T>
bool paged_vector_loadable(const PagePool<const T>& pool) {
  const auto bytes = static_cast<std::int64_t>(sizeof(T));
  return reinterpret_cast<std::uintptr_t>(pool.keys) % kVectorBytes == 0 &&
         reinterpret_cast<std::uintptr_t>(pool.values) % kVectorBytes == 0 &&
         (pool.d_k * bytes) % kVectorBytes == 0 && (pool.d_v * bytes) % kVectorBytes == 0 &&
         (pool.key_page_stride * bytes) % kVectorBytes == 0 &&
         (pool.value_page_stride * bytes) % kVectorBytes == 0;
}

}  // namespace cuda::detail
PHASEKV_NAMESPACE_END
