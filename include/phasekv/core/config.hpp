/// @file
/// @brief Configuration macros shared by every phasekv header.
///
/// All macros are prefixed `PHASEKV_`. They exist only where a macro is unavoidable: marking
/// functions callable from both host and CUDA device code, and detecting language features.
#pragma once

/// Major version of phasekv.
#define PHASEKV_VERSION_MAJOR 0
/// Minor version of phasekv.
#define PHASEKV_VERSION_MINOR 1
/// Patch version of phasekv.
#define PHASEKV_VERSION_PATCH 0

#if defined(__CUDACC__) || defined(__HIPCC__)
/// Marks a function callable from host and device code (expands to `__host__ __device__`
/// under nvcc, to nothing elsewhere).
#define PHASEKV_HOST_DEVICE __host__ __device__
#else
/// Marks a function callable from host and device code (empty outside nvcc).
#define PHASEKV_HOST_DEVICE
#endif

#if defined(__CUDA_ARCH__)
/// 1 while compiling device code (the CUDA device pass), 0 on the host.
#define PHASEKV_IS_DEVICE_CODE 1
#else
/// 1 while compiling device code (the CUDA device pass), 0 on the host.
#define PHASEKV_IS_DEVICE_CODE 0
#endif

#if defined(_MSC_VER) && !defined(__clang__)
/// Forces inlining of small hot functions.
#define PHASEKV_FORCEINLINE __forceinline
#else
/// Forces inlining of small hot functions.
#define PHASEKV_FORCEINLINE inline __attribute__((always_inline))
#endif

/// @def PHASEKV_UNROLL
/// Asks the compiler to fully unroll the next loop (a loop over a register tile whose trip
/// count is a constant). GCC at -O2 otherwise keeps such tiles in memory (stack arrays of
/// vector registers), which made the GatedPool row kernels much slower at -O2 than at -O3.
/// Empty under nvcc (host code of CUDA translation units takes the scalar loops).
#if defined(__CUDACC__) && !defined(__clang__)
#define PHASEKV_UNROLL  // nvcc rejects the GCC spelling; the CUDA code never needs it
#elif defined(__clang__)
#define PHASEKV_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define PHASEKV_UNROLL _Pragma("GCC unroll 32")
#else
#define PHASEKV_UNROLL
#endif

/// @def PHASEKV_NOUNROLL
/// Asks clang not to unroll the next loop (a loop over keys whose body already fills the
/// register file): clang 14 unrolled the decode value pass's key loop and spilled the
/// broadcast weights to the stack. Empty for other compilers (GCC does not unroll such loops
/// at -O2/-O3).
#if defined(__clang__) && !defined(__CUDA_ARCH__)
#define PHASEKV_NOUNROLL _Pragma("nounroll")
#else
#define PHASEKV_NOUNROLL
#endif

#if defined(_MSC_VER) && !defined(__clang__)
/// Keeps a hot kernel out of line, so that its register allocation does not depend on the
/// loops it is called from (inlined into a large caller, GCC spilled its loop counters).
#define PHASEKV_NOINLINE __declspec(noinline)
#elif defined(__GNUC__) || defined(__clang__)
/// Keeps a hot kernel out of line, so that its register allocation does not depend on the
/// loops it is called from (inlined into a large caller, GCC spilled its loop counters).
#define PHASEKV_NOINLINE __attribute__((noinline))
#else
/// Keeps a hot kernel out of line (no effect with this compiler).
#define PHASEKV_NOINLINE
#endif

#if defined(__cpp_concepts) && __cpp_concepts >= 201907L && __cplusplus >= 202002L
/// 1 when C++20 concepts are available, else 0.
#define PHASEKV_HAS_CONCEPTS 1
#else
/// 1 when C++20 concepts are available, else 0.
#define PHASEKV_HAS_CONCEPTS 0
#endif

// ---------------------------------------------------------------------------------------------
// Instruction-set namespace
// ---------------------------------------------------------------------------------------------

/// @def PHASEKV_ISA_NAMESPACE
/// Name of the inline namespace inside `phasekv` that holds every entity of the library. It
/// is derived from the instruction-set macros of the translation unit (`isa_base` for a
/// baseline build, `isa_sse42_avx_avx2_fma_f16c` for `-mavx2 -mfma -mf16c`, one piece per
/// enabled extension), so that two translation units compiled with
/// different `-m` / `-march` flags never share the definition of an inline function through
/// the one-definition rule: the linker keeps one copy of each inline function, and without
/// distinct names a baseline caller could end up running a copy compiled for AVX-512 (an
/// illegal instruction on older CPUs), or an AVX-512 caller a baseline copy. The namespace is
/// inline, so code names everything as `phasekv::...` as usual. This is the same device as
/// CUB's architecture-dependent namespace.
///
/// Consequence: phasekv types compiled with different flags are different types, so a function
/// declared in one translation unit with a phasekv type in its signature and defined in
/// another with different flags does not link. Pass your own structs or pointers across such
/// boundaries (examples/cpu_dispatch/ shows runtime dispatch done that way). Define
/// `PHASEKV_ISA_NAMESPACE` yourself to choose the name, or define `PHASEKV_NO_ISA_NAMESPACE`
/// to put everything directly into `phasekv` (at the risk described above).
///
/// Covered extensions: SSE4.2, AVX, AVX2, FMA, F16C, AVX-512 F/BW/VL/DQ, AVX512-BF16,
/// AVX512-FP16 on x86; NEON on AArch64. Extensions outside that list do not change the name.
#if defined(PHASEKV_DOXYGEN)
#define PHASEKV_ISA_NAMESPACE isa_base
#elif !defined(PHASEKV_ISA_NAMESPACE) && !defined(PHASEKV_NO_ISA_NAMESPACE)
#if defined(__SSE4_2__)
#define PHASEKV_ISA_P0_ _sse42
#define PHASEKV_ISA_ANY_ 1
#else
#define PHASEKV_ISA_P0_
#endif
#if defined(__AVX__)
#define PHASEKV_ISA_P1_ _avx
#define PHASEKV_ISA_ANY_ 1
#else
#define PHASEKV_ISA_P1_
#endif
#if defined(__AVX2__)
#define PHASEKV_ISA_P2_ _avx2
#define PHASEKV_ISA_ANY_ 1
#else
#define PHASEKV_ISA_P2_
#endif
#if defined(__FMA__)
#define PHASEKV_ISA_P3_ _fma
#define PHASEKV_ISA_ANY_ 1
#else
#define PHASEKV_ISA_P3_
#endif
#if defined(__F16C__)
#define PHASEKV_ISA_P4_ _f16c
#define PHASEKV_ISA_ANY_ 1
#else
#define PHASEKV_ISA_P4_
#endif
#if defined(__AVX512F__)
#define PHASEKV_ISA_P5_ _avx512
#define PHASEKV_ISA_ANY_ 1
#else
#define PHASEKV_ISA_P5_
#endif
#if defined(__AVX512BW__)
#define PHASEKV_ISA_P6_ _bw
#define PHASEKV_ISA_ANY_ 1
#else
#define PHASEKV_ISA_P6_
#endif
#if defined(__AVX512VL__)
#define PHASEKV_ISA_P7_ _vl
#define PHASEKV_ISA_ANY_ 1
#else
#define PHASEKV_ISA_P7_
#endif
#if defined(__AVX512DQ__)
#define PHASEKV_ISA_P8_ _dq
#define PHASEKV_ISA_ANY_ 1
#else
#define PHASEKV_ISA_P8_
#endif
#if defined(__AVX512BF16__)
#define PHASEKV_ISA_P9_ _bf16
#define PHASEKV_ISA_ANY_ 1
#else
#define PHASEKV_ISA_P9_
#endif
#if defined(__AVX512FP16__)
#define PHASEKV_ISA_P10_ _fp16
#define PHASEKV_ISA_ANY_ 1
#else
#define PHASEKV_ISA_P10_
#endif
#if defined(__ARM_NEON) && defined(__aarch64__)
#define PHASEKV_ISA_P11_ _neon
#define PHASEKV_ISA_ANY_ 1
#else
#define PHASEKV_ISA_P11_
#endif
#define PHASEKV_ISA_CAT_(a, b, c, d, e, f, g, h, i, j, k, l, m) \
  a##b##c##d##e##f##g##h##i##j##k##l##m
#define PHASEKV_ISA_CAT(a, b, c, d, e, f, g, h, i, j, k, l, m) \
  PHASEKV_ISA_CAT_(a, b, c, d, e, f, g, h, i, j, k, l, m)
#if defined(PHASEKV_ISA_ANY_)  // some piece above is enabled
#define PHASEKV_ISA_NAMESPACE                                                              \
  PHASEKV_ISA_CAT(isa, PHASEKV_ISA_P0_, PHASEKV_ISA_P1_, PHASEKV_ISA_P2_, PHASEKV_ISA_P3_, \
                  PHASEKV_ISA_P4_, PHASEKV_ISA_P5_, PHASEKV_ISA_P6_, PHASEKV_ISA_P7_,      \
                  PHASEKV_ISA_P8_, PHASEKV_ISA_P9_, PHASEKV_ISA_P10_, PHASEKV_ISA_P11_)
#else
#define PHASEKV_ISA_NAMESPACE isa_base
#endif
#endif

/// @def PHASEKV_NAMESPACE_BEGIN
/// Opens `namespace phasekv` and its inline instruction-set namespace (PHASEKV_ISA_NAMESPACE);
/// every phasekv header declares its entities between this and PHASEKV_NAMESPACE_END.
/// @def PHASEKV_NAMESPACE_END
/// Closes what PHASEKV_NAMESPACE_BEGIN opened.
#if defined(PHASEKV_NO_ISA_NAMESPACE)
#define PHASEKV_NAMESPACE_BEGIN namespace phasekv {
#define PHASEKV_NAMESPACE_END }
#else
#define PHASEKV_NAMESPACE_BEGIN \
  namespace phasekv {           \
  inline namespace PHASEKV_ISA_NAMESPACE {
#define PHASEKV_NAMESPACE_END \
  }                           \
  }
#endif

/// @def PHASEKV_STRINGIFY
/// Turns the expansion of its argument into a string literal.
#if !defined(PHASEKV_DOXYGEN)
#define PHASEKV_STRINGIFY_(x) #x
#endif
#define PHASEKV_STRINGIFY(x) PHASEKV_STRINGIFY_(x)

/// The root namespace of the library.
namespace phasekv {}

PHASEKV_NAMESPACE_BEGIN
/// Name of the instruction-set namespace (PHASEKV_ISA_NAMESPACE) that this translation unit
/// compiles phasekv into, e.g. `"isa_base"`; empty under PHASEKV_NO_ISA_NAMESPACE. For logs
/// and for checking which build of the kernels a dispatcher reached.
constexpr const char* isa_namespace() {
#if defined(PHASEKV_NO_ISA_NAMESPACE)
  return "";
#else
  return PHASEKV_STRINGIFY(PHASEKV_ISA_NAMESPACE);
#endif
}
PHASEKV_NAMESPACE_END
