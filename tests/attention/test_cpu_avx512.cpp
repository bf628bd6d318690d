// The AVX-512 path (with AVX512-BF16 dot products): this translation unit is compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512bf16 so the path always compiles; the tests run only
// on CPUs that have those features and skip elsewhere.
#include <gtest/gtest.h>

#include "decode_case.hpp"
#include "phasekv/attention/cpu/decode.hpp"
#include "phasekv/attention/cpu/prefill.hpp"

namespace {

namespace cpu = phasekv::cpu;
static_assert(std::is_same<cpu::NativeArch, cpu::arch::Avx512>::value,
              "this TU must be built with AVX-512 flags");
static_assert(cpu::Vec<cpu::arch::Avx512>::has_bf16_dot, "AVX512-BF16 dot must be enabled");
static_assert(cpu::arch_available<cpu::arch::Avx512Bf16>::value, "Avx512Bf16 must be available");

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}

template <class T>
class CpuAvx512 : public ::testing::Test {};
using Elems = ::testing::Types<float, phasekv::bf16_t, phasekv::f16_t>;
TYPED_TEST_SUITE(CpuAvx512, Elems);

TYPED_TEST(CpuAvx512, DecodeMatchesReference) {
  if (!cpu_has_avx512()) GTEST_SKIP() << "CPU lacks AVX-512 F/BW/VL/BF16";
  using T = TypeParam;
  std::uint32_t seed = 3;
  for (const pkt::DecodeShape& s : {pkt::DecodeShape{1000, 2, 3, 128, 128, 8, 4, 0, 128},
                                    pkt::DecodeShape{97, 1, 8, 56, 96, 4, 8, 2, 16},
                                    pkt::DecodeShape{500, 2, 5, 256, 64, 0, 0, 0, 0},
                                    pkt::DecodeShape{33, 1, 1, 64, 64, 16, 16, 0, 7}}) {
    pkt::DecodeCase<T> c(s, seed += 7);
    c.poison();
    cpu::decode<cpu::arch::Avx512>(c.args);
    const pkt::ErrorStats e = c.error();
    EXPECT_TRUE(e.finite) << s.name();
    EXPECT_LE(e.max_rel, pkt::tolerance<T>()) << s.name();
    EXPECT_LE(e.max_lse, pkt::tolerance<T>()) << s.name();
    // the AVX512-BF16 split-query dot path (bf16 keys, d_k % 32 == 0; otherwise the Avx512 path)
    c.poison();
    cpu::decode<cpu::arch::Avx512Bf16>(c.args);
    const pkt::ErrorStats e2 = c.error();
    EXPECT_TRUE(e2.finite) << s.name();
    EXPECT_LE(e2.max_rel, pkt::tolerance<T>()) << s.name() << " (Avx512Bf16)";
    EXPECT_LE(e2.max_lse, pkt::tolerance<T>()) << s.name() << " (Avx512Bf16)";
  }
}

TYPED_TEST(CpuAvx512, PrefillMatchesReference) {
  if (!cpu_has_avx512()) GTEST_SKIP() << "CPU lacks AVX-512 F/BW/VL/BF16";
  using T = TypeParam;
  const std::int64_t n = 300, T_ = 40, hkv = 2, G = 3, d = 96;
  const auto rk = pkt::random_values<T>(n * hkv * d, 1), rv = pkt::random_values<T>(n * hkv * d, 2, 0.25f);
  const auto ek = pkt::random_values<T>(n * hkv * d, 3), ev = pkt::random_values<T>(n * hkv * d, 4, 0.25f);
  const auto q = pkt::random_floats(T_ * hkv * G * d, 5);
  std::vector<float> out(T_ * hkv * G * d, 123.0f), lse(T_ * hkv * G, 123.0f);
  cpu::PrefillArgs<T> a;
  a.q = q.data();
  a.num_queries = T_;
  a.q_heads = hkv * G;
  a.kv_heads = hkv;
  a.d_k = d;
  a.d_v = d;
  a.first = n - T_;
  a.rule = cpu::VisibilityRule::compressed(phasekv::Geometry(8, 4, 1), 16);
  a.raw_k = phasekv::make_view<const T>(rk.data(), n, hkv, d);
  a.raw_v = phasekv::make_view<const T>(rv.data(), n, hkv, d);
  a.entry_k = phasekv::make_view<const T>(ek.data(), n, hkv, d);
  a.entry_v = phasekv::make_view<const T>(ev.data(), n, hkv, d);
  a.variant.scale = phasekv::default_scale(d);
  a.out = out.data();
  a.lse = lse.data();
  cpu::prefill<cpu::arch::Avx512>(a);
  std::vector<double> ref(out.size()), ref_lse(lse.size());
  phasekv::reference_prefill<T>(q.data(), T_, hkv * G, a.first, a.rule.geometry(), 16, a.raw_k,
                                a.raw_v, a.entry_k, a.entry_v, a.variant, ref.data(),
                                ref_lse.data());
  const pkt::ErrorStats e =
      pkt::compare(out.data(), lse.data(), ref.data(), ref_lse.data(), T_ * hkv * G, d);
  EXPECT_LE(e.max_rel, pkt::tolerance<T>());
}

}  // namespace
