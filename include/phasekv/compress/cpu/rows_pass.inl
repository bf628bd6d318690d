// phasekv: the compression row kernels of one target pass (see core/foreach_target.inc),
// included by compress/cpu/rows.hpp once per pass. No include guard, no includes.
//
// Per pass it fixes the lane width and the instruction set the kernels use, then compiles the
// four parts in order: lanes (lanes.inl), row stores and bf16 rounding (row_store.inl),
// UniformMean rows (mean_rows.inl), GatedPool rows (gated_rows.inl). The base pass vectorizes
// as the translation unit's flags allow (PHASEKV_FLAGS_*, core/target.hpp; NEON on AArch64,
// scalar loops in CUDA translation units), the other passes as their target.
//   PHASEKV_DETAIL_ROWS_SIMD     x86 vector bits: 512, 256, or 0 (scalar loops, or NEON)
//   PHASEKV_DETAIL_ROWS_NEON     1 when the lanes are NEON registers
//   PHASEKV_DETAIL_ROWS_BF16CVT  1 when bf16 stores may use VCVTNE2PS2BF16

#if PHASEKV_TGT_AVX512
#define PHASEKV_DETAIL_ROWS_SIMD 512
#define PHASEKV_DETAIL_ROWS_BF16CVT PHASEKV_TGT_AVX512BF16
#define PHASEKV_DETAIL_ROWS_NEON 0
#elif PHASEKV_TGT_AVX2
#define PHASEKV_DETAIL_ROWS_SIMD 256
#define PHASEKV_DETAIL_ROWS_BF16CVT 0
#define PHASEKV_DETAIL_ROWS_NEON 0
#else
#define PHASEKV_DETAIL_ROWS_SIMD PHASEKV_DETAIL_ROWS_SIMD_FLAGS
#define PHASEKV_DETAIL_ROWS_BF16CVT PHASEKV_DETAIL_ROWS_BF16CVT_FLAGS
#define PHASEKV_DETAIL_ROWS_NEON PHASEKV_DETAIL_ROWS_NEON_FLAGS
#endif

#include "phasekv/compress/cpu/lanes.inl"
#include "phasekv/compress/cpu/row_store.inl"
#include "phasekv/compress/cpu/mean_rows.inl"
#include "phasekv/compress/cpu/gated_rows.inl"

#undef PHASEKV_DETAIL_ROWS_SIMD
#undef PHASEKV_DETAIL_ROWS_BF16CVT
#undef PHASEKV_DETAIL_ROWS_NEON
