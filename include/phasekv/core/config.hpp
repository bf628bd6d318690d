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
/// Marks a device-only function under nvcc (expands to nothing elsewhere).
#define PHASEKV_DEVICE __device__
#else
/// Marks a function callable from host and device code (empty outside nvcc).
#define PHASEKV_HOST_DEVICE
/// Marks a device-only function (empty outside nvcc).
#define PHASEKV_DEVICE
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
/// vector registers): the GatedPool row kernels ran 1.5x slower at -O2 than at -O3 without it.
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

/// The root namespace of the library.
namespace phasekv {}
