#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "phasekv/phase/residue.hpp"

namespace {

TEST(Residue, MatchesDefinitionForAllSigns) {
  for (std::int64_t m = 1; m <= 17; ++m)
    for (std::int64_t origin = 0; origin <= 9; ++origin)
      for (std::int64_t p = -50; p <= 200; ++p) {
        const std::int64_t r = phasekv::residue(p, m, origin);
        ASSERT_GE(r, 0);
        ASSERT_LT(r, m);
        ASSERT_EQ((p - origin - r) % m, 0) << "p=" << p << " m=" << m;
      }
  static_assert(phasekv::residue(13, 8) == 5, "constexpr residue");
}

TEST(Residue, PhaseEqualsResidueModStride) {
  const phasekv::Geometry g(8, 4, 3);
  for (std::int64_t p = 3; p < 100; ++p) EXPECT_EQ(g.phase(p), phasekv::residue(p, 4, 3));
}

TEST(Residue, LcmOfStrides) {
  EXPECT_EQ(phasekv::stride_lcm({4}), 4);
  EXPECT_EQ(phasekv::stride_lcm({4, 128}), 128);
  EXPECT_EQ(phasekv::stride_lcm({4, 6, 10}), 60);
  EXPECT_EQ(phasekv::stride_lcm({2, 3, 5, 7, 11, 13}), 30030);
  EXPECT_EQ(phasekv::common_period({phasekv::Geometry(8, 4), phasekv::Geometry(128, 128)}), 128);
  EXPECT_EQ(phasekv::common_period({phasekv::Geometry(8, 6), phasekv::Geometry(32, 16)}), 48);
  EXPECT_EQ(phasekv::gcd(12, 18), 6);
  EXPECT_EQ(phasekv::checked_lcm(21, 6), 42);
}

TEST(Residue, BadInput) {
  EXPECT_THROW(phasekv::stride_lcm({}), phasekv::invalid_argument);
  try {
    phasekv::stride_lcm({4, 0});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("strides[i] = 0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(phasekv::stride_lcm(nullptr, 2), phasekv::invalid_argument);
  const std::int64_t big = std::numeric_limits<std::int64_t>::max() / 2 + 1;  // 2^62
  EXPECT_THROW(phasekv::checked_lcm(big, 3), phasekv::invalid_argument);
  EXPECT_THROW(phasekv::checked_lcm(0, 3), phasekv::invalid_argument);
  EXPECT_THROW(phasekv::common_period({}), phasekv::invalid_argument);
}

}  // namespace
