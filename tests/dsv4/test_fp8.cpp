// FP8 E4M3: decode of all 256 codes against the format's formula, round trips, and encode
// against a brute-force nearest-code search (ties to even, saturation, NaN, signed zero).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "phasekv/dsv4/fp8.hpp"

namespace {

using phasekv::fp8_e4m3_t;

double formula(int code) {
  const int sign = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag =
      e == 0 ? m / 8.0 * std::ldexp(1.0, -6) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  return sign ? -mag : mag;
}

TEST(Fp8E4M3, DecodesEveryCodeExactly) {
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    const float f = phasekv::fp8_e4m3_to_float(fp8_e4m3_t{static_cast<std::uint8_t>(c)});
    const double ref = formula(c);
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(f)) << c;
      ++nans;
      continue;
    }
    EXPECT_EQ(static_cast<double>(f), ref) << "code " << c;
    EXPECT_EQ(std::signbit(f), c >= 128) << c;
  }
  EXPECT_EQ(nans, 2);
  EXPECT_EQ(phasekv::fp8_e4m3_to_float(fp8_e4m3_t{0x7e}), phasekv::kFp8E4M3Max);
  EXPECT_EQ(phasekv::fp8_e4m3_to_float(fp8_e4m3_t{0x01}), std::ldexp(1.0f, -9));
}

TEST(Fp8E4M3, EveryFiniteCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    const float f = phasekv::fp8_e4m3_to_float(fp8_e4m3_t{static_cast<std::uint8_t>(c)});
    EXPECT_EQ(phasekv::float_to_fp8_e4m3(f).bits, c) << "code " << c << " value " << f;
  }
}

// The nearest finite code by brute force; ties go to the even code (mantissa bit 0 clear);
// magnitudes beyond 448 saturate.
int nearest(double x) {
  const int sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::abs(x);
  int best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 0x7f; ++c) {
    const double err = std::abs(formula(c) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return sign | best;
}

TEST(Fp8E4M3, EncodeRoundsToNearestEvenAndSaturates) {
  std::vector<float> xs;
  for (int c = 0; c < 0x7e; ++c) {  // every midpoint between neighbours, and 1 ulp either side
    const float mid = static_cast<float>((formula(c) + formula(c + 1)) / 2.0);
    xs.push_back(mid);
    xs.push_back(std::nextafter(mid, 0.0f));
    xs.push_back(std::nextafter(mid, 1000.0f));
  }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> expo(-14.0f, 10.0f);
  for (int i = 0; i < 20000; ++i) xs.push_back(std::exp2(expo(rng)));
  for (float v : {0.0f, 447.9f, 448.0f, 463.9f, 464.0f, 500.0f, 1e30f, 1e-30f,
                  std::ldexp(1.0f, -10), std::nextafter(std::ldexp(1.0f, -10), 1.0f)})
    xs.push_back(v);
  for (float x : xs) {
    for (float s : {x, -x}) {
      EXPECT_EQ(phasekv::float_to_fp8_e4m3(s).bits, nearest(s)) << "x = " << s;
    }
  }
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(phasekv::float_to_fp8_e4m3(inf).bits, 0x7e);
  EXPECT_EQ(phasekv::float_to_fp8_e4m3(-inf).bits, 0xfe);
  EXPECT_TRUE(std::isnan(phasekv::fp8_e4m3_to_float(
      phasekv::float_to_fp8_e4m3(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(phasekv::float_to_fp8_e4m3(-0.0f).bits, 0x80);
}

}  // namespace
