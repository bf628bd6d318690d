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

#include <string>
#include <type_traits>

#include "phasekv/attention/cpu/arch.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"

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

namespace detail {

/// Test hook behind ScopedCpuFeatures: when non-null, the explicit-tag check of the kernels
/// (check_cpu_runs) reads these features instead of the CPU's.
inline const CpuFeatures*& forced_cpu_features() {
  static const CpuFeatures* forced = nullptr;
  return forced;
}

/// The features the explicit-tag check reads: the forced ones inside a ScopedCpuFeatures, else
/// cpu_features().
inline const CpuFeatures& checked_cpu_features() {
  const CpuFeatures* forced = forced_cpu_features();
  return forced != nullptr ? *forced : cpu_features();
}

}  // namespace detail

/// For tests: while an object lives, the explicit-tag check of every kernel entry point
/// (check_cpu_runs) sees `features` instead of the CPU's, so that the refusal of a tag the CPU
/// lacks can be tested on any machine. cpu_supports(), cpu_features() and the run-time choice
/// of arch::Auto are not affected. Not thread-safe: create it before starting the calls it
/// should affect.
class ScopedCpuFeatures {
 public:
  /// Forces `features` (copied) until destruction.
  explicit ScopedCpuFeatures(const CpuFeatures& features)
      : features_(features), previous_(detail::forced_cpu_features()) {
    detail::forced_cpu_features() = &features_;
  }
  /// Restores what was in effect before.
  ~ScopedCpuFeatures() { detail::forced_cpu_features() = previous_; }
  ScopedCpuFeatures(const ScopedCpuFeatures&) = delete;
  ScopedCpuFeatures& operator=(const ScopedCpuFeatures&) = delete;

 private:
  CpuFeatures features_;
  const CpuFeatures* previous_;
};

/// The first extension that code compiled for tag `Arch` may use and that `f` lacks, by its
/// /proc/cpuinfo name ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
/// "avx512_bf16", "neon"), or nullptr when `f` has them all (always for Scalar and Auto).
template <class Arch>
const char* missing_cpu_feature(const CpuFeatures& f) {
  if (std::is_same<Arch, arch::Scalar>::value || std::is_same<Arch, arch::Auto>::value)
    return nullptr;
  if (std::is_same<Arch, arch::Neon>::value) return f.neon ? nullptr : "neon";
  const bool wide =
      std::is_same<Arch, arch::Avx512>::value || std::is_same<Arch, arch::Avx512Bf16>::value;
  const bool known = wide || std::is_same<Arch, arch::Avx2>::value;
  if (!known) return "an unknown architecture tag";
  if (!f.avx2) return "avx2";
  if (!f.fma) return "fma";
  if (!f.f16c) return "f16c";
  if (!wide) return nullptr;
  if (!f.avx512f) return "avx512f";
  if (!f.avx512bw) return "avx512bw";
  if (!f.avx512vl) return "avx512vl";
  if (!std::is_same<Arch, arch::Avx512Bf16>::value) return nullptr;
  if (!f.avx512dq) return "avx512dq";
  if (!f.avx512bf16) return "avx512_bf16";
  return nullptr;
}

/// True when the running CPU and OS support every instruction that code compiled for tag
/// `Arch` may use (the same extensions `arch_available<Arch>` requires at compile time):
/// Scalar and Auto always; Avx2: AVX2, FMA, F16C; Avx512: AVX-512 F/BW/VL with F16C and FMA;
/// Avx512Bf16: Avx512 plus AVX512-BF16 and AVX512-DQ; Neon: AArch64.
template <class Arch>
bool cpu_supports() {
  return missing_cpu_feature<Arch>(cpu_features()) == nullptr;
}

/// The check every CPU kernel entry point makes for an explicit architecture tag before it
/// reads or writes anything: throws phasekv::invalid_argument naming the tag and the first
/// extension this CPU lacks (e.g. "Arch = avx512: needs avx512f, which this CPU does not
/// support"), instead of letting the first wide instruction die with SIGILL. Scalar and Auto
/// always pass (Auto runs what the CPU supports). One cached load and a few compares per call.
template <class Arch>
void check_cpu_runs() {
  const char* missing = missing_cpu_feature<Arch>(detail::checked_cpu_features());
  if (missing == nullptr) return;
  const std::string req = std::string("needs ") + missing +
                          ", which this CPU does not support (use arch::Auto, or check "
                          "cpu_supports<Arch>() first)";
  phasekv::detail::throw_arg("phasekv::cpu (explicit architecture tag)", "Arch", Arch::name,
                             req.c_str());
}

}  // namespace cpu
PHASEKV_NAMESPACE_END
