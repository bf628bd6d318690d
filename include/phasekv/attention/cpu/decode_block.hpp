/// @file
/// @brief The decode inner kernels, written once over `Vec<Arch>` in kernels/decode_block.inl
/// (compiled once per target pass): logits of a group of query heads against a block of keys
/// (each key row read once for the whole group), the logit transform of a variant, the
/// online-softmax update of a block, and the weighted sum of a block of value rows into the
/// group's accumulators. This header holds the constants and row types they share.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "phasekv/attention/cpu/arch.hpp"
#include "phasekv/attention/cpu/vec.hpp"
#include "phasekv/attention/head_dims.hpp"
#include "phasekv/attention/params.hpp"
#include "phasekv/attention/softmax_state.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/prefetch.hpp"
#include "phasekv/core/view.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cpu {
namespace detail {

/// Keys per decode block (also the row stride of the logit buffer).
constexpr int kDecodeBlock = 64;
/// Query heads per register tile in the decode kernels.
constexpr int kHeadTile = 4;
/// Blocks per tile of the paged decode walk over head-major pages (decode_range_rows): a tile's
/// blocks are walked KV heads outer (8 blocks = 512 items per head, a quarter of a MiB of bf16
/// K and V rows of d 128).
constexpr int kRowsTileBlocks = 8;

/// Prefetches the cache lines of a row of `n` elements into the second-level cache (x86
/// `prefetcht1`). Not into L1: the rows of the next step are as large as L1 itself (two 16 KiB
/// blocks of d = 128 bf16 keys and values) and would evict the current step's rows.
template <class T>
PHASEKV_FORCEINLINE void prefetch_row(const T* p, std::int64_t n) {
  phasekv::detail::prefetch_l2(p, n * static_cast<std::int64_t>(sizeof(T)));
}

/// The rows of one decode block: row t of a (segment, KV head) is `base + t * stride` (every
/// row of a step belongs to one segment and one head, so the kernels need no pointer array).
template <class T>
struct StridedRows {
  const T* base = nullptr;  ///< Row 0.
  std::int64_t stride = 0;  ///< Elements between consecutive rows.
  /// Row `t`.
  PHASEKV_FORCEINLINE const T* operator[](std::int64_t t) const { return base + t * stride; }
  /// The rows from `t` on.
  PHASEKV_FORCEINLINE StridedRows operator+(std::int64_t t) const {
    return {base + t * stride, stride};
  }
  /// Walks the rows in order from element `i` of row 0 (running pointer).
  struct Cursor {
    const T* p;           ///< Element i of the current row.
    std::int64_t stride;  ///< Elements between rows.
    /// Element i of the current row.
    PHASEKV_FORCEINLINE const T* get() const { return p; }
    /// Moves to the next row.
    PHASEKV_FORCEINLINE void next() { p += stride; }
  };
  /// A cursor at element `i` of row 0.
  PHASEKV_FORCEINLINE Cursor cursor(std::int64_t i) const { return {base + i, stride}; }
};

/// Rows given by a pointer array (rows of a block that crosses pages): row t is
/// `rows[t] + offset` (`offset` selects the head inside the row's slot).
template <class T>
struct PtrRows {
  const T* const* rows = nullptr;  ///< Row pointers (head 0).
  std::int64_t offset = 0;         ///< Elements added to every row pointer.
  /// Row `t`.
  PHASEKV_FORCEINLINE const T* operator[](std::int64_t t) const { return rows[t] + offset; }
  /// The rows from `t` on.
  PHASEKV_FORCEINLINE PtrRows operator+(std::int64_t t) const { return {rows + t, offset}; }
  /// Walks the rows in order from element `i` of row 0.
  struct Cursor {
    const T* const* r;    ///< The current row's pointer.
    std::int64_t offset;  ///< offset + i.
    /// Element i of the current row.
    PHASEKV_FORCEINLINE const T* get() const { return *r + offset; }
    /// Moves to the next row.
    PHASEKV_FORCEINLINE void next() { ++r; }
  };
  /// A cursor at element `i` of row 0.
  PHASEKV_FORCEINLINE Cursor cursor(std::int64_t i) const { return {rows, offset + i}; }
};

/// True when keys of type T use the AVX512-BF16 dot product on architecture `Arch` (a split
/// f32 query against bf16 keys, head dims that are multiples of 32).
template <class Arch, class T>
struct uses_bf16_dot {
  /// The answer.
  static constexpr bool value = false;
};
#if PHASEKV_HAS_AVX512BF16
/// arch::Avx512Bf16 with bf16 keys.
template <>
struct uses_bf16_dot<arch::Avx512Bf16, bf16_t> {
  /// The answer.
  static constexpr bool value = true;
};

#endif

}  // namespace detail
}  // namespace cpu
PHASEKV_NAMESPACE_END

#if !defined(PHASEKV_DOXYGEN)  // the kernel bodies, once per target pass
#define PHASEKV_TARGET_BODY "phasekv/attention/cpu/kernels/decode_block.inl"
#include "phasekv/core/foreach_target.inc"
#endif
