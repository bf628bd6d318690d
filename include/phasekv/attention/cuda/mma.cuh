/// @file
/// @brief Warp-level tensor-core matrix multiply-accumulate (`mma.sync.m16n8k16`, sm_80+) for
/// bf16 and f16 inputs with f32 accumulation, and the packing of two 16-bit elements into the
/// 32-bit fragment registers the instruction takes.
///
/// Fragment layout (PTX ISA, per lane; `gid = lane / 4`, `tig = lane % 4`):
/// - A (16x16, row-major), 4 registers: {A[gid][2tig..2tig+1]}, {A[gid+8][2tig..]},
///   {A[gid][2tig+8..]}, {A[gid+8][2tig+8..]};
/// - B (16x8, k x n), 2 registers: {B[2tig..2tig+1][gid]}, {B[2tig+8..2tig+9][gid]};
/// - C/D (16x8 f32), 4 floats: C[gid][2tig], C[gid][2tig+1], C[gid+8][2tig], C[gid+8][2tig+1].
/// In each register the element with the lower index sits in the low 16 bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cuda::detail {

/// Packs two 16-bit elements into one fragment register (`lo` in the low half).
template <class T>
__device__ PHASEKV_FORCEINLINE std::uint32_t pack2(T lo, T hi) {
  return static_cast<std::uint32_t>(lo.bits) | (static_cast<std::uint32_t>(hi.bits) << 16);
}

/// `d += a * b` for one 16x8x16 tile; `T` is bf16_t or f16_t.
template <class T>
__device__ PHASEKV_FORCEINLINE void mma_16816(float (&d)[4], const std::uint32_t (&a)[4],
                                              const std::uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (sizeof(T) == 2 && element_traits<T>::kind == ElementKind::bf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    static_assert(element_traits<T>::kind == ElementKind::f16, "mma_16816: bf16_t or f16_t");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#else
  (void)d;
  (void)a;
  (void)b;
  __trap();  // the launcher never selects the tensor-core path below sm_80
#endif
}

}  // namespace cuda::detail
PHASEKV_NAMESPACE_END
