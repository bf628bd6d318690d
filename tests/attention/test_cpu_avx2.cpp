// The AVX2 path, tested explicitly: this translation unit is compiled with -mavx2 -mfma -mf16c
// so that the path is exercised even where NativeArch is wider (an AVX-512 CI machine) or
// narrower (the baseline x86-64 build); the tests skip on CPUs without AVX2/FMA/F16C.
#include <gtest/gtest.h>

#include <string>

#include "arch_cases.hpp"
#include "phasekv/attention/cpu/cpu_features.hpp"

namespace {

namespace cpu = phasekv::cpu;
static_assert(cpu::arch_available<cpu::arch::Avx2>::value, "this TU must be built with AVX2 flags");

// (Clang 14's __builtin_cpu_supports has no "f16c"; every CPU with AVX2 also has F16C, and
// CMake registers this binary only where /proc/cpuinfo lists all three.)
bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// phasekv's own detection (CPUID + XGETBV) agrees with the compiler runtime's.
TEST(CpuAvx2Runtime, DetectionAgreesWithCompilerRuntime) {
  EXPECT_EQ(cpu::cpu_supports<cpu::arch::Avx2>(), cpu_has_avx2());
}

// This translation unit's flags name its phasekv namespace.
TEST(CpuAvx2Runtime, IsaNamespaceNamesTheFlags) {
  const std::string ns = phasekv::isa_namespace();
  EXPECT_TRUE(pkt::isa_namespace_has("_avx2")) << ns;
  EXPECT_TRUE(pkt::isa_namespace_has("_fma")) << ns;
  EXPECT_TRUE(pkt::isa_namespace_has("_f16c")) << ns;
}

template <class T>
class CpuAvx2 : public ::testing::Test {};
using Elems = ::testing::Types<float, phasekv::bf16_t, phasekv::f16_t>;
TYPED_TEST_SUITE(CpuAvx2, Elems);

TYPED_TEST(CpuAvx2, DecodeMatchesReference) {
  if (!cpu_has_avx2()) GTEST_SKIP() << "CPU lacks AVX2/FMA/F16C";
  pkt::expect_decode_matches_reference<cpu::arch::Avx2, TypeParam>("Avx2");
}

TYPED_TEST(CpuAvx2, PrefillMatchesReference) {
  if (!cpu_has_avx2()) GTEST_SKIP() << "CPU lacks AVX2/FMA/F16C";
  pkt::expect_prefill_matches_reference<cpu::arch::Avx2, TypeParam>();
}

TEST(CpuAvx2Vec, Load2AndTransposeAdd) {
  if (!cpu_has_avx2()) GTEST_SKIP() << "CPU lacks AVX2/FMA/F16C";
  using O = cpu::Vec<cpu::arch::Avx2>;
  phasekv::bf16_t x[16];
  for (int i = 0; i < 16; ++i) x[i] = phasekv::float_to_bf16(0.75f * static_cast<float>(i) - 3.0f);
  O::V a, b;
  O::load2(x, a, b);
  float fa[8], fb[8];
  O::store(fa, a);
  O::store(fb, b);
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(fa[j], phasekv::bf16_to_float(x[2 * j]));
    EXPECT_EQ(fb[j], phasekv::bf16_to_float(x[2 * j + 1]));
  }
  O::V v[8];
  float in[8][8], out[8];
  for (int r = 0; r < 8; ++r) {
    for (int i = 0; i < 8; ++i) in[r][i] = static_cast<float>(r * 10 + i);
    v[r] = O::load(in[r]);
  }
  O::store(out, O::hsumw(v));
  for (int r = 0; r < 8; ++r) EXPECT_EQ(out[r], static_cast<float>(80 * r + 28));
}

}  // namespace
