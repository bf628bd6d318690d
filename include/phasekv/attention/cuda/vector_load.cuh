/// @file
/// @brief 16-byte vector loads of K/V rows and the host-side test of whether a view allows them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/view.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cuda {

/// Bytes moved by one vector load.
inline constexpr int kVectorBytes = 16;

/// True when every row of `v` can be read with 16-byte loads: the base pointer is 16-byte
/// aligned and the row length, token stride and head stride are whole multiples of 16 bytes.
/// An empty view qualifies. Host only; looks at the pointer value, never dereferences it.
template <class T>
bool vector_loadable(const StridedView<const T>& v) {
  if (v.tokens == 0 || v.heads == 0 || v.dim == 0) return true;
  const auto bytes = static_cast<std::int64_t>(sizeof(T));
  const auto addr = reinterpret_cast<std::uintptr_t>(v.data);
  return addr % kVectorBytes == 0 && (v.dim * bytes) % kVectorBytes == 0 &&
         (v.token_stride * bytes) % kVectorBytes == 0 &&
         (v.head_stride * bytes) % kVectorBytes == 0;
}

namespace detail {

/// Copies pieces of a K/V row from global memory into shared memory. With `vec` every piece
/// is one 16-byte load of kPerVector elements (the caller guarantees vector_loadable and a row
/// length that is a multiple of kPerVector); otherwise a piece is one element. `vec` is
/// uniform across the block, so the branch costs nothing measurable next to the load.
template <class T>
struct RowLoader {
  /// Elements per 16-byte vector.
  static constexpr int kPerVector = kVectorBytes / static_cast<int>(sizeof(T));

  /// Pieces of a row of `n` elements.
  __device__ static PHASEKV_FORCEINLINE int pieces(int n, bool vec) {
    return vec ? n / kPerVector : n;
  }
  /// Elements per piece.
  __device__ static PHASEKV_FORCEINLINE int piece_size(bool vec) { return vec ? kPerVector : 1; }

  /// Loads piece `p` of `src` into the same elements of `dst`.
  __device__ static PHASEKV_FORCEINLINE void load_piece(const T* __restrict__ src,
                                                        T* __restrict__ dst, int p, bool vec) {
    if (vec) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(src) + p);
      T tmp[kPerVector];
      static_assert(sizeof(tmp) == sizeof(raw), "vector size");
      memcpy(tmp, &raw, sizeof raw);
#pragma unroll
      for (int e = 0; e < kPerVector; ++e) dst[p * kPerVector + e] = tmp[e];
    } else {
      dst[p] = src[p];
    }
  }
};

}  // namespace detail
}  // namespace cuda
PHASEKV_NAMESPACE_END
