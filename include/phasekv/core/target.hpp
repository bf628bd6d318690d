/// @file
/// @brief Which instruction-set builds of the CPU kernels a translation unit contains, and the
/// compiler pragmas that compile one build inside the headers (run-time dispatch).
///
/// The CPU kernels are written once over `Vec<Arch>` (phasekv/cpu/vec.hpp) and compiled once
/// per *target pass*: the kernel bodies (`*.inl` files under attention/cpu/kernels/,
/// cpu/kernels/ and compress/cpu/) are
/// included several times by core/foreach_target.inc, each time into their own namespace
/// (`detail::tgt_base`, `tgt_avx2`, `tgt_avx512`, `tgt_avx512bf16`) and, on x86-64 with GCC or
/// Clang, inside a target region (`#pragma GCC target` / `#pragma clang attribute`) that lets
/// the compiler emit that instruction set whatever the translation unit's own flags. Only the
/// functions of the pass get the wider instructions; everything outside, the standard library
/// included, keeps the translation unit's flags, and a public entry point picks the pass at
/// run time (attention/cpu/dispatch.hpp).
///
/// `PHASEKV_DISPATCH` is 1 when those passes are compiled regardless of the flags: GCC >= 10 or
/// Clang >= 9 on x86-64, outside nvcc. Define it to 0 before including phasekv to get the
/// compile-time choice of earlier versions (only the instruction sets the flags enable).
/// Other compilers (MSVC, nvcc's host pass) always use the compile-time choice.
#pragma once

#include "phasekv/core/config.hpp"

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__) || defined(_M_IX86)
/// 1 on x86 targets.
#define PHASEKV_TARGET_X86 1
#else
/// 1 on x86 targets.
#define PHASEKV_TARGET_X86 0
#endif

#if !defined(PHASEKV_DISPATCH)
#if defined(__x86_64__) && !defined(__CUDACC__) && !defined(PHASEKV_DOXYGEN) && \
    ((defined(__clang__) && __clang_major__ >= 9) || (defined(__GNUC__) && __GNUC__ >= 10))
/// 1: the headers compile the AVX2 and AVX-512 builds of the CPU kernels in target regions,
/// whatever the translation unit's flags, and the public entry points choose one at run time
/// (the widest the CPU supports, or the one PHASEKV_ARCH names). Define to 0 for the
/// compile-time choice only.
#define PHASEKV_DISPATCH 1
#else
/// 1: the headers compile the AVX2 and AVX-512 builds of the CPU kernels in target regions,
/// whatever the translation unit's flags, and the public entry points choose one at run time
/// (the widest the CPU supports, or the one PHASEKV_ARCH names); 0 (this compiler or target,
/// or defined so by the user): the compile-time choice only.
#define PHASEKV_DISPATCH 0
#endif
#endif

// What the translation unit's flags enable (the compile-time choice). The only place that
// reads the compiler's instruction-set macros; everything else tests PHASEKV_FLAGS_*.
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
/// 1 when the flags enable AVX2, FMA and F16C.
#define PHASEKV_FLAGS_AVX2 1
#else
/// 1 when the flags enable AVX2, FMA and F16C.
#define PHASEKV_FLAGS_AVX2 0
#endif
#if PHASEKV_FLAGS_AVX2 && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
/// 1 when the flags enable AVX-512 F/BW/VL (with AVX2, FMA, F16C).
#define PHASEKV_FLAGS_AVX512 1
#else
/// 1 when the flags enable AVX-512 F/BW/VL (with AVX2, FMA, F16C).
#define PHASEKV_FLAGS_AVX512 0
#endif
#if PHASEKV_FLAGS_AVX512 && defined(__AVX512BF16__) && defined(__AVX512DQ__)
/// 1 when the flags enable AVX-512 with AVX512-BF16 and AVX512-DQ (the BF16 pass's set).
#define PHASEKV_FLAGS_AVX512BF16 1
#else
/// 1 when the flags enable AVX-512 with AVX512-BF16 and AVX512-DQ (the BF16 pass's set).
#define PHASEKV_FLAGS_AVX512BF16 0
#endif
#if defined(__ARM_NEON) && defined(__aarch64__)
/// 1 on AArch64 (NEON is part of the base architecture there).
#define PHASEKV_FLAGS_NEON 1
#else
/// 1 on AArch64 (NEON is part of the base architecture there).
#define PHASEKV_FLAGS_NEON 0
#endif

/// @def PHASEKV_HAS_AVX2
/// 1 when this translation unit contains the AVX2 build of the kernels (flags or dispatch).
/// @def PHASEKV_HAS_AVX512
/// 1 when this translation unit contains the AVX-512 build of the kernels.
/// @def PHASEKV_HAS_AVX512BF16
/// 1 when this translation unit contains the AVX-512 + AVX512-BF16 build of the kernels.
#if PHASEKV_DISPATCH
#define PHASEKV_HAS_AVX2 1
#define PHASEKV_HAS_AVX512 1
#define PHASEKV_HAS_AVX512BF16 1
#else
#define PHASEKV_HAS_AVX2 PHASEKV_FLAGS_AVX2
#define PHASEKV_HAS_AVX512 PHASEKV_FLAGS_AVX512
#define PHASEKV_HAS_AVX512BF16 PHASEKV_FLAGS_AVX512BF16
#endif

#if !defined(PHASEKV_DOXYGEN)
// Target regions: the instruction sets of each pass, exactly those the tag needs (code compiled
// with the same -m flags may then call the pass's inline functions directly).
#define PHASEKV_DETAIL_ISA_AVX2 "avx2,fma,f16c"
#define PHASEKV_DETAIL_ISA_AVX512 "avx2,fma,f16c,avx512f,avx512bw,avx512vl"
#define PHASEKV_DETAIL_ISA_AVX512BF16 "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"
#if PHASEKV_DISPATCH && defined(__clang__)
#define PHASEKV_DETAIL_TARGET_BEGIN(isa) \
  _Pragma(                               \
      PHASEKV_STRINGIFY(clang attribute push(__attribute__((target(isa))), apply_to = function)))
#define PHASEKV_DETAIL_TARGET_END _Pragma("clang attribute pop")
#define PHASEKV_DETAIL_TARGET_BEGIN_512(isa) PHASEKV_DETAIL_TARGET_BEGIN(isa)
#elif PHASEKV_DISPATCH
#define PHASEKV_DETAIL_TARGET_BEGIN(isa) \
  _Pragma("GCC push_options") _Pragma(PHASEKV_STRINGIFY(GCC target(isa)))
// The AVX-512 passes are also tuned for an AVX-512 core (GCC's generic tuning cost the
// GatedPool run kernel about 8 % against -march=native; every CPU these passes run on has
// AVX-512). Tuning does not stop the passes' always_inline functions from inlining into code
// built with the same -m flags.
#define PHASEKV_DETAIL_TARGET_BEGIN_512(isa) \
  PHASEKV_DETAIL_TARGET_BEGIN(isa) _Pragma("GCC target(\"tune=icelake-server\")")
#define PHASEKV_DETAIL_TARGET_END _Pragma("GCC pop_options")
#else
#define PHASEKV_DETAIL_TARGET_BEGIN(isa)
#define PHASEKV_DETAIL_TARGET_BEGIN_512(isa)
#define PHASEKV_DETAIL_TARGET_END
#endif
#endif

#if PHASEKV_HAS_AVX2 || PHASEKV_FLAGS_AVX2
#include "phasekv/core/x86_intrinsics.hpp"
#endif
#if PHASEKV_FLAGS_NEON
#include <arm_neon.h>
#endif
