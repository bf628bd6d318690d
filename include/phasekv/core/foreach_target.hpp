// phasekv: compiles one kernel body once per target pass (see core/target.hpp). No include
// guard on purpose. Usage, at namespace scope outside any phasekv namespace:
//
//   #define PHASEKV_TARGET_BODY "phasekv/attention/cpu/kernels/decode.inl"
//   #include "phasekv/core/foreach_target.hpp"
//
// The body opens its own namespaces and puts everything into `PHASEKV_TGT_NS`. It must not
// include headers (everything it uses is included before, outside the target regions, so that
// no standard-library or other inline code is compiled with the pass's instruction sets).
// Per pass, the body sees:
//   PHASEKV_TGT_NS          tgt_base, tgt_avx2, tgt_avx512, tgt_avx512bf16
//   PHASEKV_TGT_SIMD        vector bits the pass may use on x86: 0, 256, 512
//   PHASEKV_TGT_AVX2        1 in the AVX2 pass              (arch::Avx2)
//   PHASEKV_TGT_AVX512      1 in both AVX-512 passes        (arch::Avx512)
//   PHASEKV_TGT_AVX512BF16  1 in the AVX-512 + BF16 pass    (arch::Avx512Bf16)
//   PHASEKV_TGT_NEON        1 in the base pass on AArch64   (arch::Neon)
#include "phasekv/core/target.hpp"

#if !defined(PHASEKV_TARGET_BODY)
#error "define PHASEKV_TARGET_BODY before including phasekv/core/foreach_target.hpp"
#endif

// --- base pass: the translation unit's own flags (arch::Scalar; arch::Neon on AArch64) ----
#define PHASEKV_TGT_NS tgt_base
#define PHASEKV_TGT_SIMD 0
#define PHASEKV_TGT_AVX2 0
#define PHASEKV_TGT_AVX512 0
#define PHASEKV_TGT_AVX512BF16 0
#define PHASEKV_TGT_NEON PHASEKV_FLAGS_NEON
#include "phasekv/core/foreach_target_pass.hpp"
#undef PHASEKV_TGT_NEON
#define PHASEKV_TGT_NEON 0

// --- AVX2 + FMA + F16C -----------------------------------------------------------------------
#if PHASEKV_HAS_AVX2
PHASEKV_DETAIL_TARGET_BEGIN(PHASEKV_DETAIL_ISA_AVX2)
#define PHASEKV_TGT_NS tgt_avx2
#define PHASEKV_TGT_SIMD 256
#define PHASEKV_TGT_AVX2 1
#define PHASEKV_TGT_AVX512 0
#define PHASEKV_TGT_AVX512BF16 0
#include "phasekv/core/foreach_target_pass.hpp"
PHASEKV_DETAIL_TARGET_END
#endif

// --- AVX-512 F/BW/VL/DQ ----------------------------------------------------------------------
#if PHASEKV_HAS_AVX512
PHASEKV_DETAIL_TARGET_BEGIN_512(PHASEKV_DETAIL_ISA_AVX512)
#define PHASEKV_TGT_NS tgt_avx512
#define PHASEKV_TGT_SIMD 512
#define PHASEKV_TGT_AVX2 0
#define PHASEKV_TGT_AVX512 1
#define PHASEKV_TGT_AVX512BF16 0
#include "phasekv/core/foreach_target_pass.hpp"
PHASEKV_DETAIL_TARGET_END
#endif

// --- AVX-512 + AVX512-BF16 -------------------------------------------------------------------
#if PHASEKV_HAS_AVX512BF16
PHASEKV_DETAIL_TARGET_BEGIN_512(PHASEKV_DETAIL_ISA_AVX512BF16)
#define PHASEKV_TGT_NS tgt_avx512bf16
#define PHASEKV_TGT_SIMD 512
#define PHASEKV_TGT_AVX2 0
#define PHASEKV_TGT_AVX512 1
#define PHASEKV_TGT_AVX512BF16 1
#include "phasekv/core/foreach_target_pass.hpp"
PHASEKV_DETAIL_TARGET_END
#endif

#undef PHASEKV_TGT_NEON
#undef PHASEKV_TARGET_BODY
