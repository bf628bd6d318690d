/// @file
/// @brief Run-time choice of the instruction set: `active_arch()` (the widest build the CPU
/// runs, or the one the environment variable `PHASEKV_ARCH` forces), decided once per process
/// and cached, and the switch every public entry point uses for `arch::Auto`.
///
/// The public entry points (decode, decode_partition, prefill, prefill_partition, the thread
/// drivers, compress_batch, CompressedCache::append) take `arch::Auto` by default. With
/// run-time dispatch (PHASEKV_DISPATCH, core/target.hpp: GCC >= 10 and Clang >= 9 on x86-64)
/// they run:
/// - `arch::Avx512` on CPUs with AVX-512 F/BW/VL (exact f32 decode; compression stores bf16
///   with VCVTNE2PS2BF16 where AVX512-BF16 is present, same bits),
/// - `arch::Avx2` on CPUs with AVX2, FMA and F16C,
/// - `arch::Scalar` otherwise,
/// whatever flags the including translation unit was compiled with. On AArch64 they run
/// `arch::Neon`; with other compilers, or PHASEKV_DISPATCH defined to 0, `NativeArch` (the
/// compile-time choice; PHASEKV_ARCH may still name a narrower compiled build, i.e. scalar).
/// An explicit tag (`decode<arch::Avx2>(args)`) selects a build at compile time; every entry
/// point then checks that this CPU runs it (check_cpu_runs, cpu_features.hpp) and throws
/// phasekv::invalid_argument naming the tag and the missing extension before anything is read or
/// written, rather than dying with SIGILL. `arch_available<A>` says whether tag A's code is
/// compiled into a translation unit; `cpu_supports<A>()` whether this CPU can run it.
///
/// `PHASEKV_ARCH=scalar|avx2|avx512|neon` forces a build, for debugging and benchmarking; a
/// build the CPU cannot run, or one this translation unit does not contain, is refused with
/// phasekv::invalid_argument naming the value (thrown by the first entry point called, and by
/// every later one: the choice is never silently widened or narrowed).
#pragma once

#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "phasekv/attention/cpu/arch.hpp"
#include "phasekv/attention/cpu/cpu_features.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/target.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cpu {

/// The builds of the kernels a run-time choice can name.
enum class ArchId {
  scalar,  ///< arch::Scalar
  avx2,    ///< arch::Avx2
  avx512,  ///< arch::Avx512
  neon,    ///< arch::Neon
};

/// Short name of `a` ("scalar", "avx2", "avx512", "neon"), as PHASEKV_ARCH spells it.
inline const char* arch_name(ArchId a) {
  switch (a) {
    case ArchId::avx2: return "avx2";
    case ArchId::avx512: return "avx512";
    case ArchId::neon: return "neon";
    default: return "scalar";
  }
}

/// Whether this translation unit contains the build `a` (arch_available of its tag).
inline bool arch_compiled(ArchId a) {
  switch (a) {
    case ArchId::scalar: return true;
    case ArchId::avx2: return arch_available<arch::Avx2>::value;
    case ArchId::avx512: return arch_available<arch::Avx512>::value;
    case ArchId::neon: return arch_available<arch::Neon>::value;
  }
  return false;
}

/// Whether the running CPU and OS can run build `a` (cpu_supports of its tag).
inline bool arch_supported(ArchId a) {
  switch (a) {
    case ArchId::scalar: return true;
    case ArchId::avx2: return cpu_supports<arch::Avx2>();
    case ArchId::avx512: return cpu_supports<arch::Avx512>();
    case ArchId::neon: return cpu_supports<arch::Neon>();
  }
  return false;
}

/// The build `arch::Auto` runs without PHASEKV_ARCH: the widest one that is compiled here and
/// that the CPU runs (never wider than NativeArch when run-time dispatch is off).
inline ArchId widest_arch() {
#if PHASEKV_DISPATCH
  for (ArchId a : {ArchId::avx512, ArchId::avx2, ArchId::neon})
    if (arch_compiled(a) && arch_supported(a)) return a;
  return ArchId::scalar;
#else
  if (std::is_same<NativeArch, arch::Avx512>::value) return ArchId::avx512;
  if (std::is_same<NativeArch, arch::Avx2>::value) return ArchId::avx2;
  if (std::is_same<NativeArch, arch::Neon>::value) return ArchId::neon;
  return ArchId::scalar;
#endif
}

namespace detail {

/// The build that PHASEKV_ARCH's value `value` (null or empty: not set) selects, refused with
/// phasekv::invalid_argument when it names no build, one that is not compiled here, or one the
/// CPU cannot run (`supported` answers the last question; tests pass their own).
template <class Supported>
ArchId arch_from_env(const char* value, Supported supported) {
  if (value == nullptr || *value == '\0') return widest_arch();
  const char* where = "phasekv::cpu::active_arch";
  for (ArchId a : {ArchId::scalar, ArchId::avx2, ArchId::avx512, ArchId::neon}) {
    if (std::strcmp(value, arch_name(a)) != 0) continue;
    phasekv::detail::check_arg(arch_compiled(a), where, "PHASEKV_ARCH", value,
                               "is not compiled into this build (run-time dispatch is off or "
                               "the target is another architecture)");
    phasekv::detail::check_arg(supported(a), where, "PHASEKV_ARCH", value,
                               "is not supported by this CPU");
    return a;
  }
  phasekv::detail::check_arg(false, where, "PHASEKV_ARCH", value,
                             "must be one of scalar, avx2, avx512, neon (or unset)");
  return ArchId::scalar;
}

}  // namespace detail

/// The build that `arch::Auto` runs in this process: PHASEKV_ARCH's choice if set (checked
/// as documented above; throws phasekv::invalid_argument when refused), else widest_arch().
/// Decided on the first call and cached; the per-call cost is one load and a compare.
inline ArchId active_arch() {
  static const ArchId a = detail::arch_from_env(std::getenv("PHASEKV_ARCH"),
                                                [](ArchId x) { return arch_supported(x); });
  return a;
}

namespace detail {

/// Calls `f(tag)` with the architecture tag `Arch` after check_cpu_runs<Arch>() (an explicit
/// tag this CPU cannot run throws phasekv::invalid_argument before `f` runs), or for
/// arch::Auto with the tag of active_arch() (only tags compiled in this translation unit are
/// instantiated).
template <class Arch, class F>
PHASEKV_FORCEINLINE void with_arch(F&& f) {
  if constexpr (!std::is_same<Arch, arch::Auto>::value) {
    check_cpu_runs<Arch>();
    f(Arch{});
  } else {
    switch (active_arch()) {
#if PHASEKV_HAS_AVX512
      case ArchId::avx512: f(arch::Avx512{}); return;
#endif
#if PHASEKV_HAS_AVX2
      case ArchId::avx2: f(arch::Avx2{}); return;
#endif
#if PHASEKV_FLAGS_NEON
      case ArchId::neon: f(arch::Neon{}); return;
#endif
      default: f(arch::Scalar{}); return;
    }
  }
}

}  // namespace detail
}  // namespace cpu
PHASEKV_NAMESPACE_END
