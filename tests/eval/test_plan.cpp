#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "phasekv/eval/plan.hpp"

namespace {

using namespace phasekv::eval;

TEST(Plan, PositionMatchedGroups) {
  struct Case {
    std::int64_t m, count, lo, hi, origin;
  };
  for (const Case c : {Case{8, 64, 100, 4000, 0}, Case{4, 32, 3, 1000, 3}, Case{7, 21, 50, 900, 0},
                       Case{128, 256, 0, 60000, 0}, Case{1, 5, 0, 50, 0}}) {
    const TargetPlan p = plan_targets(c.m, c.count, c.lo, c.hi, c.origin);
    ASSERT_EQ(p.positions.size(), static_cast<std::size_t>(c.m));
    for (std::int64_t r = 0; r < c.m; ++r) {
      const auto& g = p.positions[static_cast<std::size_t>(r)];
      ASSERT_EQ(static_cast<std::int64_t>(g.size()), c.count);
      for (std::int64_t t : g) {
        EXPECT_EQ(phasekv::residue(t, c.m, c.origin), r);
        EXPECT_GE(t, c.lo);
        EXPECT_LE(t, c.hi);
      }
      // Means are exactly equal (integer sums agree).
      EXPECT_EQ(p.mean[static_cast<std::size_t>(r)], p.mean[0]) << "m=" << c.m << " r=" << r;
    }
    EXPECT_LE(p.variance_spread(), 0.01);
  }
}

TEST(Plan, RejectsBadArguments) {
  EXPECT_THROW(plan_targets(8, 12, 0, 1000), phasekv::invalid_argument);  // not a multiple
  EXPECT_THROW(plan_targets(0, 8, 0, 1000), phasekv::invalid_argument);
  EXPECT_THROW(plan_targets(8, 8, 0, 20), phasekv::invalid_argument);  // range too short
  EXPECT_THROW(plan_targets(8, 8, 0, 40), phasekv::invalid_argument);  // variances differ
  try {
    plan_targets(8, 12, 0, 1000);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("count = 12"), std::string::npos) << e.what();
  }
}

TEST(Plan, LayoutPlacesTheTarget) {
  for (Padding pad : {Padding::prefix, Padding::in_sequence})
    for (std::int64_t rec : {1, 3, 4, 7})
      for (std::int64_t t = 0; t + rec <= 60; ++t) {
        const auto segs = layout_prompt(t, 60, rec, pad);
        std::int64_t pos = 0, targets = 0;
        for (const PromptSegment& s : segs) {
          EXPECT_EQ(s.start, pos);  // contiguous, no overlap
          EXPECT_GE(s.length, 1);
          if (s.kind == "target") {
            ++targets;
            EXPECT_EQ(s.start, t);
            EXPECT_EQ(s.length, rec);
          }
          if (s.kind == "records") {
            EXPECT_EQ(s.length, s.records * rec);
          }
          pos += s.length;
        }
        EXPECT_EQ(targets, 1);
        EXPECT_EQ(segs.back().kind, "query");
        EXPECT_EQ(segs.back().start, 60);
        // Prefix padding shifts everything: the first segment is the filler when t % rec > 0.
        if (pad == Padding::prefix && t % rec) {
          EXPECT_EQ(segs.front().kind, "filler");
        }
        if (pad == Padding::in_sequence && t >= rec) {
          EXPECT_EQ(segs.front().kind, "records");
        }
      }
  EXPECT_THROW(layout_prompt(58, 60, 4, Padding::prefix), phasekv::invalid_argument);
}

}  // namespace
