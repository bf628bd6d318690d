// Runtime CPU feature detection (cpu_features.hpp) against the Linux kernel's view in
// /proc/cpuinfo, and the instruction-set namespace of this translation unit against its flags.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <typeinfo>

#include "cpu_test_util.hpp"
#include "phasekv/attention/cpu/cpu_features.hpp"

namespace {

namespace cpu = phasekv::cpu;

#if defined(__x86_64__) || defined(__i386__)
// The "flags" line of the first processor in /proc/cpuinfo; empty when there is none.
std::set<std::string> proc_cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  std::set<std::string> flags;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    for (std::string w; words >> w;) flags.insert(w);
    break;
  }
  return flags;
}
#endif

TEST(CpuFeatures, ScalarIsAlwaysSupported) { EXPECT_TRUE(cpu::cpu_supports<cpu::arch::Scalar>()); }

TEST(CpuFeatures, NativeArchRunsHere) {
  // This binary runs on the machine it was configured for, and NativeArch follows its flags.
  EXPECT_TRUE(cpu::cpu_supports<cpu::NativeArch>()) << cpu::NativeArch::name;
}

TEST(CpuFeatures, MatchesProcCpuinfo) {
#if !(defined(__x86_64__) || defined(__i386__))
  GTEST_SKIP() << "x86 only (on AArch64 NEON is always present)";
#else
  const std::set<std::string> flags = proc_cpuinfo_flags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags line";
  const cpu::CpuFeatures& f = cpu::cpu_features();
  auto has = [&](const char* name) { return flags.count(name) > 0; };
  EXPECT_EQ(f.avx2, has("avx2"));
  EXPECT_EQ(f.fma, has("fma"));
  EXPECT_EQ(f.f16c, has("f16c"));
  EXPECT_EQ(f.avx512f, has("avx512f"));
  EXPECT_EQ(f.avx512bw, has("avx512bw"));
  EXPECT_EQ(f.avx512vl, has("avx512vl"));
  EXPECT_EQ(f.avx512dq, has("avx512dq"));
  EXPECT_EQ(f.avx512bf16, has("avx512_bf16"));
  EXPECT_FALSE(f.neon);
  EXPECT_EQ(cpu::cpu_supports<cpu::arch::Avx2>(), has("avx2") && has("fma") && has("f16c"));
  EXPECT_EQ(cpu::cpu_supports<cpu::arch::Avx512>(),
            has("avx512f") && has("avx512bw") && has("avx512vl") && has("f16c") && has("fma"));
#endif
}

TEST(CpuFeatures, CachedAnswerEqualsFreshDetection) {
  const cpu::CpuFeatures a = cpu::cpu_features(), b = cpu::detail::detect_cpu_features();
  EXPECT_EQ(0, std::memcmp(&a, &b, sizeof a));
}

TEST(IsaNamespace, NameFollowsTheFlags) {
  const std::string ns = phasekv::isa_namespace();
  ASSERT_EQ(ns.rfind("isa_", 0), 0u) << ns;
  const auto piece = pkt::isa_namespace_has;
#if defined(__AVX2__)
  EXPECT_TRUE(piece("_avx2")) << ns;
#else
  EXPECT_FALSE(piece("_avx2")) << ns;
#endif
#if defined(__AVX512F__)
  EXPECT_TRUE(piece("_avx512")) << ns;
#else
  EXPECT_FALSE(piece("_avx512")) << ns;
#endif
#if defined(__AVX512BF16__)
  EXPECT_TRUE(piece("_bf16")) << ns;
#else
  EXPECT_FALSE(piece("_bf16")) << ns;
#endif
#if defined(__aarch64__)
  EXPECT_TRUE(piece("_neon")) << ns;
#endif
#if !defined(__SSE4_2__) && !defined(__AVX__) && !defined(__aarch64__)
  EXPECT_EQ(ns, "isa_base");
#endif
#if defined(__GNUC__)
  // Itanium mangling: phasekv's types carry the namespace (N7phasekv<len>isa_...).
  EXPECT_EQ(std::string(typeid(phasekv::cpu::CpuFeatures).name()),
            "N7phasekv" + std::to_string(ns.size()) + ns + "3cpu11CpuFeaturesE");
#endif
}

}  // namespace
