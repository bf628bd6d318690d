/// @file
/// @brief Runtime detection of the instruction sets behind the architecture tags, for engines
/// that compile the kernels once per tag (one translation unit per instruction set) and pick
/// the widest build the CPU supports when the process starts.
///
/// `arch_available<A>` (arch.hpp) answers at compile time whether a translation unit *may*
/// contain tag A's code; `cpu_supports<A>()` answers at run time whether the CPU and the
/// operating system *can run* it (CPUID feature bits, and XGETBV for the AVX and AVX-512
/// register state the OS saves). Call it from code compiled for the baseline, before calling
/// into a translation unit built with wider flags. The answer is computed once per process
/// and cached.
#pragma once

#include <type_traits>

#include "phasekv/attention/cpu/arch.hpp"
#include "phasekv/core/config.hpp"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define PHASEKV_DETAIL_CPUID_GNU 1
#elif defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
#include <intrin.h>
#define PHASEKV_DETAIL_CPUID_MSVC 1
#endif

PHASEKV_NAMESPACE_BEGIN
namespace cpu {

/// The instruction-set extensions the architecture tags depend on, as this CPU and its
/// operating system support them (all false on a CPU family the detection does not know).
struct CpuFeatures {
  bool avx2 = false;        ///< AVX2 (with the OS saving the 256-bit register state).
  bool fma = false;         ///< FMA3.
  bool f16c = false;        ///< F16C (half-precision conversions).
  bool avx512f = false;     ///< AVX-512 Foundation (with the OS saving the 512-bit state).
  bool avx512bw = false;    ///< AVX-512 Byte and Word.
  bool avx512vl = false;    ///< AVX-512 Vector Length.
  bool avx512dq = false;    ///< AVX-512 Doubleword and Quadword.
  bool avx512bf16 = false;  ///< AVX512-BF16 (VDPBF16PS, VCVTNE2PS2BF16).
  bool neon = false;        ///< AArch64 Advanced SIMD (always present on AArch64).
};

namespace detail {

#if defined(PHASEKV_DETAIL_CPUID_GNU) || defined(PHASEKV_DETAIL_CPUID_MSVC)
/// CPUID leaf `leaf`, subleaf `sub`, into r = {eax, ebx, ecx, edx}; zeros when the leaf is
/// beyond the CPU's maximum.
inline void cpuid(unsigned leaf, unsigned sub, unsigned r[4]) {
  r[0] = r[1] = r[2] = r[3] = 0;
#if defined(PHASEKV_DETAIL_CPUID_GNU)
  // (GCC declares the result unsigned, clang int)
  if (static_cast<unsigned>(__get_cpuid_max(leaf & 0x80000000u, nullptr)) < leaf) return;
  __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
#else
  int m[4];
  __cpuid(m, static_cast<int>(leaf & 0x80000000u));
  if (static_cast<unsigned>(m[0]) < leaf) return;
  __cpuidex(m, static_cast<int>(leaf), static_cast<int>(sub));
  for (int i = 0; i < 4; ++i) r[i] = static_cast<unsigned>(m[i]);
#endif
}

/// XCR0, the register state the OS saves on context switches (call only when OSXSAVE is set).
inline unsigned long long xgetbv0() {
#if defined(PHASEKV_DETAIL_CPUID_GNU)
  unsigned lo = 0, hi = 0;
  __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));  // xgetbv
  return (static_cast<unsigned long long>(hi) << 32) | lo;
#else
  return _xgetbv(0);
#endif
}
#endif

/// Queries the CPU (no caching).
inline CpuFeatures detect_cpu_features() {
  CpuFeatures f;
#if defined(PHASEKV_DETAIL_CPUID_GNU) || defined(PHASEKV_DETAIL_CPUID_MSVC)
  unsigned r1[4], r7[4], r71[4];
  cpuid(1, 0, r1);
  const bool osxsave = (r1[2] >> 27) & 1u;
  const unsigned long long xcr0 = osxsave ? xgetbv0() : 0;
  const bool os_avx = (xcr0 & 0x6u) == 0x6u;                 // XMM and YMM state
  const bool os_avx512 = os_avx && (xcr0 & 0xe0u) == 0xe0u;  // opmask, ZMM_Hi256, Hi16_ZMM
  cpuid(7, 0, r7);
  cpuid(7, 1, r71);
  const bool avx = os_avx && ((r1[2] >> 28) & 1u);
  f.fma = avx && ((r1[2] >> 12) & 1u);
  f.f16c = avx && ((r1[2] >> 29) & 1u);
  f.avx2 = avx && ((r7[1] >> 5) & 1u);
  f.avx512f = os_avx512 && ((r7[1] >> 16) & 1u);
  f.avx512dq = f.avx512f && ((r7[1] >> 17) & 1u);
  f.avx512bw = f.avx512f && ((r7[1] >> 30) & 1u);
  f.avx512vl = f.avx512f && ((r7[1] >> 31) & 1u);
  f.avx512bf16 = f.avx512f && ((r71[0] >> 5) & 1u);
#elif defined(__aarch64__) || defined(_M_ARM64)
  f.neon = true;
#endif
  return f;
}

}  // namespace detail

/// The features of the CPU this process runs on (detected on the first call, then cached).
inline const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detail::detect_cpu_features();
  return f;
}

/// True when the running CPU and OS support every instruction that code compiled for tag
/// `Arch` may use (the same extensions `arch_available<Arch>` requires at compile time):
/// Scalar and Auto always; Avx2: AVX2, FMA, F16C; Avx512: AVX-512 F/BW/VL with F16C and FMA;
/// Avx512Bf16: Avx512 plus AVX512-BF16 and AVX512-DQ; Neon: AArch64.
template <class Arch>
bool cpu_supports() {
  const CpuFeatures& f = cpu_features();
  if (std::is_same<Arch, arch::Scalar>::value || std::is_same<Arch, arch::Auto>::value)
    return true;  // Auto runs what the CPU supports
  if (std::is_same<Arch, arch::Avx2>::value) return f.avx2 && f.fma && f.f16c;
  const bool avx512 = f.avx512f && f.avx512bw && f.avx512vl && f.f16c && f.fma;
  if (std::is_same<Arch, arch::Avx512>::value) return avx512;
  if (std::is_same<Arch, arch::Avx512Bf16>::value) return avx512 && f.avx512dq && f.avx512bf16;
  if (std::is_same<Arch, arch::Neon>::value) return f.neon;
  return false;
}

}  // namespace cpu
PHASEKV_NAMESPACE_END
