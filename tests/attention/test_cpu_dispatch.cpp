// Run-time instruction-set dispatch (attention/cpu/dispatch.hpp). This file is compiled with
// the build's own flags (baseline x86-64 in the test preset): the AVX2 and AVX-512 kernels
// must still be compiled and, on a CPU that has them, be what the default entry points run.
// CTest runs it again with PHASEKV_ARCH set (tests/attention/CMakeLists.txt).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "decode_case.hpp"
#include "phasekv/attention/cpu/cpu_features.hpp"
#include "phasekv/attention/cpu/decode.hpp"
#include "phasekv/attention/cpu/dispatch.hpp"
#include "phasekv/compress/cpu_rows.hpp"

namespace {

namespace cpu = phasekv::cpu;
using cpu::ArchId;

const char* env_arch() {
  const char* v = std::getenv("PHASEKV_ARCH");
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

bool valid_forced(const char* v) {
  for (ArchId a : {ArchId::scalar, ArchId::avx2, ArchId::avx512, ArchId::neon})
    if (std::strcmp(v, cpu::arch_name(a)) == 0)
      return cpu::arch_compiled(a) && cpu::arch_supported(a);
  return false;
}

#if PHASEKV_DISPATCH
static_assert(cpu::arch_available<cpu::arch::Avx2>::value &&
                  cpu::arch_available<cpu::arch::Avx512>::value &&
                  cpu::arch_available<cpu::arch::Avx512Bf16>::value,
              "with run-time dispatch every x86 build is compiled, whatever the flags");
#endif

// Without PHASEKV_ARCH the widest build the CPU runs is active: on an AVX-512 machine the
// AVX-512 path, in this baseline-flags binary.
TEST(Dispatch, ActiveArchIsTheWidestTheCpuRuns) {
  if (env_arch() != nullptr) GTEST_SKIP() << "PHASEKV_ARCH=" << env_arch();
#if PHASEKV_DISPATCH
  ArchId want = ArchId::scalar;
  if (cpu::cpu_supports<cpu::arch::Avx2>()) want = ArchId::avx2;
  if (cpu::cpu_supports<cpu::arch::Avx512>()) want = ArchId::avx512;
  EXPECT_STREQ(cpu::arch_name(cpu::active_arch()), cpu::arch_name(want));
#else
  EXPECT_TRUE(cpu::arch_compiled(cpu::active_arch()));
#endif
  EXPECT_EQ(cpu::active_arch(), cpu::widest_arch());
}

// PHASEKV_ARCH: a valid value is what runs; anything else is refused by every entry point,
// naming the variable and the value.
TEST(Dispatch, HonoursOrRefusesPhasekvArch) {
  const char* v = env_arch();
  if (v == nullptr) GTEST_SKIP() << "PHASEKV_ARCH not set";
  pkt::DecodeCase<float> c({97, 2, 3, 64, 64, 8, 4, 0, 16}, 5);
  if (valid_forced(v)) {
    EXPECT_STREQ(cpu::arch_name(cpu::active_arch()), v);
    EXPECT_NO_THROW(cpu::decode(c.args));
    return;
  }
  for (int i = 0; i < 2; ++i) {  // refused again on the second call (never silently chosen)
    try {
      cpu::decode(c.args);
      ADD_FAILURE() << "decode ran with PHASEKV_ARCH=" << v;
    } catch (const phasekv::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("PHASEKV_ARCH"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(v), std::string::npos) << e.what();
    }
  }
}

TEST(Dispatch, ArchFromEnvParsesAndRefuses) {
  const auto all = [](ArchId) { return true; };
  const auto none = [](ArchId a) { return a == ArchId::scalar; };
  EXPECT_EQ(cpu::detail::arch_from_env(nullptr, all), cpu::widest_arch());
  EXPECT_EQ(cpu::detail::arch_from_env("", all), cpu::widest_arch());
  EXPECT_EQ(cpu::detail::arch_from_env("scalar", none), ArchId::scalar);
  const auto refused = [](const char* value, bool cpu_has, const char* why) {
    try {
      cpu::detail::arch_from_env(value, [cpu_has](ArchId) { return cpu_has; });
      ADD_FAILURE() << value << " accepted";
    } catch (const phasekv::invalid_argument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("PHASEKV_ARCH"), std::string::npos) << m;
      EXPECT_NE(m.find(value), std::string::npos) << m;
      EXPECT_NE(m.find(why), std::string::npos) << m;
    }
  };
  refused("avx9", true, "must be one of scalar, avx2, avx512, neon");
  refused("AVX2", true, "must be one of");
#if PHASEKV_DISPATCH
  EXPECT_EQ(cpu::detail::arch_from_env("avx2", all), ArchId::avx2);
  EXPECT_EQ(cpu::detail::arch_from_env("avx512", all), ArchId::avx512);
  refused("avx512", false, "not supported by this CPU");
  refused("avx2", false, "not supported by this CPU");
  refused("neon", true, "not compiled");
#endif
}

// The default entry point runs exactly the build active_arch() names: the same bits as the
// explicit tag, and within the reference's bounds.
template <class A, class T>
void expect_auto_equals(const pkt::DecodeShape& s) {
  pkt::DecodeCase<T> a(s, 91), b(s, 91);
  a.poison();
  b.poison();
  cpu::decode(a.args);
  cpu::decode<A>(b.args);
  EXPECT_EQ(0, std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float))) << A::name;
  EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float))) << A::name;
  const pkt::ErrorStats e = a.error();
  EXPECT_LE(e.max_rel, pkt::tolerance<T>()) << s.name();
}

TEST(Dispatch, DefaultRunsTheActiveBuild) {
  if (env_arch() != nullptr && !valid_forced(env_arch())) GTEST_SKIP() << "refused value";
  const pkt::DecodeShape s{1000, 2, 3, 128, 128, 8, 4, 0, 16};
  switch (cpu::active_arch()) {
#if PHASEKV_HAS_AVX512
    case ArchId::avx512: expect_auto_equals<cpu::arch::Avx512, phasekv::bf16_t>(s); break;
#endif
#if PHASEKV_HAS_AVX2
    case ArchId::avx2: expect_auto_equals<cpu::arch::Avx2, phasekv::bf16_t>(s); break;
#endif
#if PHASEKV_FLAGS_NEON
    case ArchId::neon: expect_auto_equals<cpu::arch::Neon, phasekv::bf16_t>(s); break;
#endif
    default: expect_auto_equals<cpu::arch::Scalar, phasekv::bf16_t>(s); break;
  }
}

// The compression row kernels follow the same choice (the BF16 pass where the CPU has it).
TEST(Dispatch, RowKernelsFollowTheActiveBuild) {
  if (env_arch() != nullptr && !valid_forced(env_arch())) GTEST_SKIP() << "refused value";
#if PHASEKV_DISPATCH
  const int want = cpu::active_arch() == ArchId::avx512 ? 512
                   : cpu::active_arch() == ArchId::avx2
                       ? 256
                       : phasekv::detail::tgt_base::rows::simd_width_bits();
  EXPECT_EQ(phasekv::detail::rows::simd_width_bits(), want);
#else
  EXPECT_EQ(phasekv::detail::rows::simd_width_bits(),
            phasekv::detail::tgt_base::rows::simd_width_bits());
#endif
}

}  // namespace
