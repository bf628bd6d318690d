#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "phasekv/core/view.hpp"

namespace {

TEST(View, LayoutsAddressTheSameLogicalElement) {
  const std::int64_t T = 5, H = 3, D = 7;
  std::vector<float> nhd(T * H * D), hnd(T * H * D);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < D; ++i) {
        const float v = static_cast<float>(100 * t + 10 * h + i);
        nhd[(t * H + h) * D + i] = v;
        hnd[(h * T + t) * D + i] = v;
      }
  const auto a = phasekv::make_view(nhd.data(), T, H, D, phasekv::Layout::NHD);
  const auto b = phasekv::make_view(hnd.data(), T, H, D, phasekv::Layout::HND);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < D; ++i) ASSERT_EQ(a(t, h, i), b(t, h, i));
  const auto s = b.slice(2, 2);
  EXPECT_EQ(s.tokens, 2);
  EXPECT_EQ(s(0, 1, 3), b(2, 1, 3));
  phasekv::StridedView<const float> c = a;  // const conversion
  EXPECT_EQ(c(4, 2, 6), a(4, 2, 6));
}

TEST(View, CheckRejectsBadViews) {
  float x = 0;
  phasekv::StridedView<float> v{nullptr, 3, 2, 4, 8, 4};
  try {
    phasekv::check_view(v, "test", "keys");
    FAIL();
  } catch (const phasekv::shape_error& e) {
    EXPECT_NE(std::string(e.what()).find("keys"), std::string::npos);
  }
  v.data = &x;
  v.tokens = -1;
  EXPECT_THROW(phasekv::check_view(v, "test", "keys"), std::invalid_argument);
  v.tokens = 0;
  v.data = nullptr;
  EXPECT_NO_THROW(phasekv::check_view(v, "test", "keys"));  // empty and null is fine
}

TEST(View, VisibleKVSkipsEmptyAndRejectsOverflow) {
  std::vector<float> buf(64, 1.0f);
  auto v = phasekv::make_view<const float>(buf.data(), 4, 2, 8);
  phasekv::VisibleKV<float> kv;
  kv.push({v.slice(0, 0), v.slice(0, 0), 0, phasekv::SegmentKind::prefix});
  EXPECT_EQ(kv.count, 0);
  for (int i = 0; i < phasekv::VisibleKV<float>::kMaxSegments; ++i)
    kv.push({v, v, 0, phasekv::SegmentKind::raw});
  EXPECT_EQ(kv.total(), 16);
  EXPECT_THROW(kv.push({v, v, 0, phasekv::SegmentKind::raw}), phasekv::capacity_error);
}

}  // namespace
