// The AVX2 path, tested explicitly: this translation unit is compiled with -mavx2 -mfma -mf16c
// so that the path is exercised even where NativeArch is wider (an AVX-512 CI machine) or
// narrower (the baseline x86-64 build); the tests skip on CPUs without AVX2/FMA/F16C.
#include <gtest/gtest.h>

#include "decode_case.hpp"
#include "phasekv/attention/cpu/decode.hpp"
#include "phasekv/attention/cpu/prefill.hpp"

namespace {

namespace cpu = phasekv::cpu;
static_assert(cpu::arch_available<cpu::arch::Avx2>::value, "this TU must be built with AVX2 flags");

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
}

template <class T>
class CpuAvx2 : public ::testing::Test {};
using Elems = ::testing::Types<float, phasekv::bf16_t, phasekv::f16_t>;
TYPED_TEST_SUITE(CpuAvx2, Elems);

TYPED_TEST(CpuAvx2, DecodeMatchesReference) {
  if (!cpu_has_avx2()) GTEST_SKIP() << "CPU lacks AVX2/FMA/F16C";
  using T = TypeParam;
  std::uint32_t seed = 3;
  for (const pkt::DecodeShape& s : {pkt::DecodeShape{1000, 2, 3, 128, 128, 8, 4, 0, 128},
                                    pkt::DecodeShape{97, 1, 8, 56, 96, 4, 8, 2, 16},
                                    pkt::DecodeShape{500, 2, 5, 256, 64, 0, 0, 0, 0},
                                    pkt::DecodeShape{33, 1, 1, 64, 64, 16, 16, 0, 7}}) {
    pkt::DecodeCase<T> c(s, seed += 7);
    c.poison();
    cpu::decode<cpu::arch::Avx2>(c.args);
    const pkt::ErrorStats e = c.error();
    EXPECT_TRUE(e.finite) << s.name();
    EXPECT_LE(e.max_rel, pkt::tolerance<T>()) << s.name();
    EXPECT_LE(e.max_lse, pkt::tolerance<T>()) << s.name();
  }
}

TYPED_TEST(CpuAvx2, PrefillMatchesReference) {
  if (!cpu_has_avx2()) GTEST_SKIP() << "CPU lacks AVX2/FMA/F16C";
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
  cpu::prefill<cpu::arch::Avx2>(a);
  std::vector<double> ref(out.size()), ref_lse(lse.size());
  phasekv::reference_prefill<T>(q.data(), T_, hkv * G, a.first, a.rule.geometry(), 16, a.raw_k,
                                a.raw_v, a.entry_k, a.entry_v, a.variant, ref.data(),
                                ref_lse.data());
  const pkt::ErrorStats e =
      pkt::compare(out.data(), lse.data(), ref.data(), ref_lse.data(), T_ * hkv * G, d);
  EXPECT_LE(e.max_rel, pkt::tolerance<T>());
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
