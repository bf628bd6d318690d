// bf16 / f16 conversions checked against independent definitions: decoding from the IEEE
// formula in double, and encoding by nearest-value search with ties to even.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "phasekv/core/element.hpp"

namespace {

double decode_f16(std::uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  const double sign = s ? -1.0 : 1.0;
  if (e == 0) return sign * std::ldexp(m, -24);
  if (e == 31)
    return m ? std::numeric_limits<double>::quiet_NaN()
             : sign * std::numeric_limits<double>::infinity();
  return sign * std::ldexp(1024 + m, e - 25);
}

float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(Element, F16DecodeAllPatterns) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float got = phasekv::f16_to_float(phasekv::f16_t{static_cast<std::uint16_t>(h)});
    const double want = decode_f16(static_cast<std::uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << h;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << h;
    }
  }
}

// Nearest f16 by search over all finite non-negative values, ties to the even mantissa;
// beyond 65520 (half-way above the largest finite value) infinity.
std::uint16_t nearest_f16(float x) {
  static std::vector<double> values = [] {
    std::vector<double> v;
    for (std::uint32_t h = 0; h < 0x7c00; ++h)
      v.push_back(decode_f16(static_cast<std::uint16_t>(h)));
    return v;
  }();
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 65520.0) return sign | 0x7c00;
  const auto it = std::lower_bound(values.begin(), values.end(), a);
  std::size_t hi = static_cast<std::size_t>(it - values.begin());
  if (hi == values.size()) hi = values.size() - 1;
  const std::size_t lo = hi > 0 ? hi - 1 : 0;
  const double dl = a - values[lo], dh = values[hi] - a;
  std::size_t pick;
  if (dl < dh)
    pick = lo;
  else if (dh < dl)
    pick = hi;
  else
    pick = (lo % 2 == 0) ? lo : hi;
  if (values[hi] == a) pick = hi;
  return static_cast<std::uint16_t>(sign | pick);
}

TEST(Element, F16EncodeMatchesNearestSearch) {
  std::mt19937 rng(12345);
  std::vector<float> xs = {0.0f,
                           -0.0f,
                           1.0f,
                           -1.0f,
                           65504.0f,
                           65519.99f,
                           65520.0f,
                           1e-8f,
                           2.9802322e-8f /* 2^-25 */,
                           2.98023259e-8f,
                           5.9604645e-8f /* 2^-24 */,
                           6.1035156e-5f /* 2^-14 */,
                           6.1e-5f,
                           1e30f,
                           -1e30f,
                           3.14159f};
  // Every half-way point between consecutive f16 values, and its float neighbours.
  for (std::uint32_t h = 0; h + 1 < 0x7c00; h += 7) {
    const double mid = 0.5 * (decode_f16(static_cast<std::uint16_t>(h)) +
                              decode_f16(static_cast<std::uint16_t>(h + 1)));
    const float f = static_cast<float>(mid);
    xs.push_back(f);
    xs.push_back(std::nextafter(f, 0.0f));
    xs.push_back(std::nextafter(f, 1e9f));
  }
  std::uniform_int_distribution<std::uint32_t> bits(0, 0xffffffffu);
  for (int i = 0; i < 200000; ++i) {
    const float f = bits_to_float(bits(rng));
    if (!std::isnan(f)) xs.push_back(f);
  }
  std::uniform_real_distribution<float> u(-70000.f, 70000.f);
  for (int i = 0; i < 100000; ++i) xs.push_back(u(rng));
  for (float x : xs) {
    const std::uint16_t got = phasekv::float_to_f16(x).bits;
    const std::uint16_t want =
        std::isinf(x) ? static_cast<std::uint16_t>((x < 0 ? 0x8000 : 0) | 0x7c00) : nearest_f16(x);
    ASSERT_EQ(got, want) << "x=" << x;
  }
}

TEST(Element, Bf16RoundTripAndRounding) {
  // Every bf16 pattern decodes to a float that encodes back to itself (except NaN payloads).
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const phasekv::bf16_t b{static_cast<std::uint16_t>(h)};
    const float f = phasekv::bf16_to_float(b);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(phasekv::bf16_to_float(phasekv::float_to_bf16(f))));
      continue;
    }
    ASSERT_EQ(phasekv::float_to_bf16(f).bits, h);
  }
  // Ties go to even: 1 + 2^-8 lies half-way between 1 and 1 + 2^-7.
  EXPECT_EQ(phasekv::float_to_bf16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);
  EXPECT_EQ(phasekv::float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);
  // Random floats: the result is one of the two neighbours, and the nearer one.
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits(0, 0x7f7effffu);  // upper neighbour finite
  for (int i = 0; i < 200000; ++i) {
    const std::uint32_t x = bits(rng);
    const float f = bits_to_float(x);
    const float lo = bits_to_float(x & 0xffff0000u);
    const float hi = bits_to_float((x & 0xffff0000u) + 0x10000u);
    const float got = phasekv::bf16_to_float(phasekv::float_to_bf16(f));
    const double dl = static_cast<double>(f) - lo, dh = static_cast<double>(hi) - f;
    if (dl < dh)
      ASSERT_EQ(got, lo);
    else if (dh < dl)
      ASSERT_EQ(got, hi);
    else
      ASSERT_EQ(phasekv::float_to_bf16(got).bits % 2, 0);
  }
  EXPECT_TRUE(std::isnan(
      phasekv::bf16_to_float(phasekv::float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(phasekv::bf16_to_float(phasekv::float_to_bf16(INFINITY))));
}

TEST(Element, TraitsAndGenericConversion) {
  EXPECT_EQ(phasekv::to_float(phasekv::from_float<phasekv::f16_t>(0.5f)), 0.5f);
  EXPECT_EQ(phasekv::to_float(phasekv::from_float<phasekv::bf16_t>(-2.0f)), -2.0f);
  EXPECT_EQ(phasekv::to_float(phasekv::from_float<float>(0.1f)), 0.1f);
  EXPECT_STREQ(phasekv::element_traits<phasekv::bf16_t>::name, "bf16");
  EXPECT_STREQ(phasekv::element_name(phasekv::ElementKind::f16), "f16");
  EXPECT_TRUE(std::isnan(
      phasekv::f16_to_float(phasekv::float_to_f16(std::numeric_limits<float>::quiet_NaN()))));
}

}  // namespace
