// The vector layer: loads/conversions, horizontal ops and the fast exp, per architecture.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "phasekv/attention/cpu/vec.hpp"

namespace {

namespace cpu = phasekv::cpu;

template <class A>
class CpuVec : public ::testing::Test {};
using Arches = ::testing::Types<cpu::arch::Scalar, cpu::NativeArch>;
#if defined(__aarch64__) && defined(__ARM_NEON)
// The AArch64 build (the neon-qemu preset) is how the NEON path gets tested: every NativeArch
// test in this binary then runs it.
static_assert(std::is_same<cpu::NativeArch, cpu::arch::Neon>::value,
              "an AArch64 build with NEON must test the Neon path");
#endif
TYPED_TEST_SUITE(CpuVec, Arches);

TYPED_TEST(CpuVec, ExpAccuracyAndLimits) {
  using O = cpu::Vec<TypeParam>;
  constexpr int W = O::W;
  double worst = 0.0;
  float buf[W];
  // the documented domain is [-87, 88] (inputs above 88 are clamped; kernels only pass x <= 0)
  for (double x0 = -86.9; x0 + 0.0137 * W < 88.0; x0 += 0.0137 * W) {
    float in[W];
    for (int i = 0; i < W; ++i) in[i] = static_cast<float>(x0 + 0.0137 * i);
    O::store(buf, O::exp(O::load(in)));
    for (int i = 0; i < W; ++i) {
      const double ref = std::exp(static_cast<double>(in[i]));
      worst = std::max(worst, std::abs(buf[i] - ref) / ref);
    }
  }
  EXPECT_LE(worst, 3e-7);
  const float special[4] = {-std::numeric_limits<float>::infinity(), -87.5f, -1e30f, -100.0f};
  for (float x : special) {
    float in[W];
    for (int i = 0; i < W; ++i) in[i] = x;
    O::store(buf, O::exp(O::load(in)));
    for (int i = 0; i < W; ++i) EXPECT_EQ(buf[i], 0.0f) << x;
  }
}

TYPED_TEST(CpuVec, LoadsConvertExactly) {
  using O = cpu::Vec<TypeParam>;
  constexpr int W = O::W;
  std::vector<phasekv::bf16_t> b(W);
  std::vector<phasekv::f16_t> h(W);
  std::vector<float> f(W);
  for (int i = 0; i < W; ++i) {
    f[i] = 0.3f * static_cast<float>(i) - 1.7f;
    b[i] = phasekv::float_to_bf16(f[i]);
    h[i] = phasekv::float_to_f16(f[i]);
  }
  float out[W];
  O::store(out, O::load(b.data()));
  for (int i = 0; i < W; ++i) EXPECT_EQ(out[i], phasekv::bf16_to_float(b[i]));
  O::store(out, O::load(h.data()));
  for (int i = 0; i < W; ++i) EXPECT_EQ(out[i], phasekv::f16_to_float(h[i]));
  EXPECT_FLOAT_EQ(O::hsum(O::load(f.data())), [&] {
    float s = 0;
    for (float x : f) s += x;
    return s;
  }());
  EXPECT_EQ(O::hmax(O::load(f.data())), f[W - 1]);
}

// load2 returns the 2W elements in the documented order: even/odd for element types the
// architecture interleaves, in order otherwise; every value converted exactly.
template <class O, class T>
void check_load2() {
  constexpr int W = O::W;
  std::vector<T> x(2 * W);
  for (int i = 0; i < 2 * W; ++i)
    x[i] = phasekv::from_float<T>(0.37f * static_cast<float>(i) - 5.1f +
                                  1e-3f * static_cast<float>(i * i));
  typename O::V a, b;
  O::load2(x.data(), a, b);
  float fa[W], fb[W];
  O::store(fa, a);
  O::store(fb, b);
  for (int j = 0; j < W; ++j) {
    const int ia = O::template interleaves<T>() ? 2 * j : j;
    const int ib = O::template interleaves<T>() ? 2 * j + 1 : W + j;
    EXPECT_EQ(fa[j], phasekv::to_float(x[ia])) << j;
    EXPECT_EQ(fb[j], phasekv::to_float(x[ib])) << j;
  }
}

TYPED_TEST(CpuVec, Load2OrderAndExactness) {
  using O = cpu::Vec<TypeParam>;
  check_load2<O, float>();
  check_load2<O, phasekv::bf16_t>();
  check_load2<O, phasekv::f16_t>();
}

TYPED_TEST(CpuVec, TransposeAddSumsEachVector) {
  using O = cpu::Vec<TypeParam>;
  constexpr int W = O::W;
  typename O::V v[W];
  float in[W][W];
  double ref[W];
  for (int r = 0; r < W; ++r) {
    ref[r] = 0.0;
    for (int i = 0; i < W; ++i) {
      // distinct small integers: every partial sum is exact, so the order does not matter
      in[r][i] = static_cast<float>((r * 37 + i * 11) % 53 - 26);
      ref[r] += in[r][i];
    }
    v[r] = O::load(in[r]);
  }
  float out[W];
  O::store(out, O::hsumw(v));
  for (int r = 0; r < W; ++r) EXPECT_EQ(out[r], ref[r]) << "lane " << r;
}

}  // namespace
