// The CPU builds of a kernel this machine runs, for the DeepSeek-V4 tests that check each
// build against the float64 reference (CPU tests only: it includes the dispatch header).
#pragma once

#include "phasekv/attention/cpu/dispatch.hpp"

namespace dsv4t {

// Calls f(tag) for every build this CPU runs, as explicit tags (no PHASEKV_ARCH needed):
// scalar, then AVX2, AVX-512 and NEON where compiled in and supported.
template <class F>
void for_each_build(F&& f) {
  namespace cpu = phasekv::cpu;
  f(cpu::arch::Scalar{});
#if PHASEKV_HAS_AVX2
  if (cpu::cpu_supports<cpu::arch::Avx2>()) f(cpu::arch::Avx2{});
#endif
#if PHASEKV_HAS_AVX512
  if (cpu::cpu_supports<cpu::arch::Avx512>()) f(cpu::arch::Avx512{});
#endif
#if PHASEKV_FLAGS_NEON
  f(cpu::arch::Neon{});
#endif
}

}  // namespace dsv4t
