// The AVX-512 path (with AVX512-BF16 dot products): this translation unit is compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512bf16 so the path always compiles; the tests run only
// on CPUs that have those features and skip elsewhere.
#include <gtest/gtest.h>

#include <string>

#include "arch_cases.hpp"
#include "phasekv/attention/cpu/cpu_features.hpp"

namespace {

namespace cpu = phasekv::cpu;
static_assert(std::is_same<cpu::NativeArch, cpu::arch::Avx512>::value,
              "this TU must be built with AVX-512 flags");
static_assert(cpu::Vec<cpu::arch::Avx512Bf16>::has_bf16_dot, "AVX512-BF16 dot must be enabled");
static_assert(!cpu::Vec<cpu::arch::Avx512>::has_bf16_dot, "Avx512 decode stays exact (f32 query)");
static_assert(cpu::arch_available<cpu::arch::Avx512Bf16>::value, "Avx512Bf16 must be available");

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}

// phasekv's own detection (CPUID + XGETBV) agrees with the compiler runtime's.
TEST(CpuAvx512Runtime, DetectionAgreesWithCompilerRuntime) {
  EXPECT_EQ(cpu::cpu_supports<cpu::arch::Avx512Bf16>(), cpu_has_avx512());
}

// This translation unit's flags name its phasekv namespace.
TEST(CpuAvx512Runtime, IsaNamespaceNamesTheFlags) {
  const std::string ns = phasekv::isa_namespace();
  EXPECT_TRUE(pkt::isa_namespace_has("_avx512")) << ns;
  EXPECT_TRUE(pkt::isa_namespace_has("_bw")) << ns;
  EXPECT_TRUE(pkt::isa_namespace_has("_vl")) << ns;
  EXPECT_TRUE(pkt::isa_namespace_has("_bf16")) << ns;
}

template <class T>
class CpuAvx512 : public ::testing::Test {};
using Elems = ::testing::Types<float, phasekv::bf16_t, phasekv::f16_t>;
TYPED_TEST_SUITE(CpuAvx512, Elems);

TYPED_TEST(CpuAvx512, DecodeMatchesReference) {
  if (!cpu_has_avx512()) GTEST_SKIP() << "CPU lacks AVX-512 F/BW/VL/BF16";
  pkt::expect_decode_matches_reference<cpu::arch::Avx512, TypeParam>("Avx512");
  // the AVX512-BF16 split-query dot path (bf16 keys, d_k % 32 == 0; otherwise as Avx512)
  pkt::expect_decode_matches_reference<cpu::arch::Avx512Bf16, TypeParam>("Avx512Bf16");
}

TYPED_TEST(CpuAvx512, PrefillMatchesReference) {
  if (!cpu_has_avx512()) GTEST_SKIP() << "CPU lacks AVX-512 F/BW/VL/BF16";
  pkt::expect_prefill_matches_reference<cpu::arch::Avx512, TypeParam>();
}

}  // namespace
