// Geometry checked exhaustively against brute-force enumeration of windows.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "phasekv/phase/geometry.hpp"

namespace {

using phasekv::Geometry;
using std::int64_t;

// Brute force: enumerate windows one by one from their definition.
struct Brute {
  int64_t W, S, O;
  int64_t begin(int64_t j) const { return O + j * S; }
  int64_t end(int64_t j) const { return O + j * S + W; }

  int64_t complete(int64_t n) const {
    int64_t j = 0;
    while (end(j) <= n) ++j;
    return j;
  }
  std::vector<int64_t> covering(int64_t p) const {
    std::vector<int64_t> out;
    for (int64_t j = 0; begin(j) <= p; ++j)
      if (p >= begin(j) && p < end(j)) out.push_back(j);
    return out;
  }
  // The window whose stride cell holds p: the last one starting at or before p.
  int64_t cell(int64_t p) const {
    int64_t j = -1;
    while (begin(j + 1) <= p) ++j;
    return j;
  }
  // Raw positions (prefix excluded) a query at n - 1 sees: the tokens whose next window has
  // not completed, plus the last L tokens.
  std::set<int64_t> visible_raw(int64_t n, int64_t L) const {
    std::set<int64_t> s;
    for (int64_t p = O; p < n; ++p) {
      const bool tail = end(cell(p)) > n;
      const bool local = p >= n - L;
      if (tail || local) s.insert(p);
    }
    return s;
  }
};

TEST(Geometry, ExhaustiveAgainstBruteForce) {
  const int64_t locals[] = {0, 1, 5, 16};
  int64_t checked = 0;
  for (int64_t W = 1; W <= 12; ++W)
    for (int64_t S = 1; S <= 12; ++S)
      for (int64_t O = 0; O <= 2 * S; ++O) {
        const Geometry g(W, S, O);
        const Brute b{W, S, O};
        ASSERT_EQ(g.has_gaps(), W < S);
        ASSERT_EQ(g.overlaps(), W > S);
        // Per position: phase, offsets, covering windows.
        for (int64_t p = 0; p < 200; ++p) {
          const std::string ctx = "W=" + std::to_string(W) + " S=" + std::to_string(S) +
                                  " O=" + std::to_string(O) + " p=" + std::to_string(p);
          ASSERT_EQ(g.in_prefix(p), p < O) << ctx;
          const std::vector<int64_t> cov = b.covering(p);
          ASSERT_EQ(g.cover_count(p), static_cast<int64_t>(cov.size())) << ctx;
          if (p < O) {
            ASSERT_EQ(g.phase(p), -1) << ctx;
            ASSERT_EQ(g.cell(p), -1) << ctx;
            continue;
          }
          int64_t ph = p - O;
          while (ph >= S) ph -= S;
          ASSERT_EQ(g.phase(p), ph) << ctx;
          ASSERT_EQ(g.cell(p), b.cell(p)) << ctx;
          if (!cov.empty()) {
            ASSERT_EQ(g.first_covering_window(p), cov.front()) << ctx;
            ASSERT_EQ(g.last_covering_window(p), cov.back()) << ctx;
          }
          for (int64_t j = 0; j <= p / S + 2; ++j) {
            const bool inside = p >= b.begin(j) && p < b.end(j);
            ASSERT_EQ(g.covers(j, p), inside) << ctx << " j=" << j;
            if (inside) {
              ASSERT_GE(g.offset(p, j), 0);
              ASSERT_LT(g.offset(p, j), W);
              ASSERT_EQ(g.window_begin(j) + g.offset(p, j), p);
            }
          }
        }
        // Per length: complete windows, raw tail, visible set for each local window.
        for (int64_t n = 0; n <= 200; ++n) {
          const std::string ctx = "W=" + std::to_string(W) + " S=" + std::to_string(S) +
                                  " O=" + std::to_string(O) + " n=" + std::to_string(n);
          const int64_t J = b.complete(n);
          ASSERT_EQ(g.complete_windows(n), J) << ctx;
          if (J > 0) {
            ASSERT_LE(g.completes_at(J - 1), n) << ctx;
          }
          ASSERT_GT(g.completes_at(J), n) << ctx;
          // Raw tail = positions >= O whose stride cell's window is incomplete.
          int64_t tail = n;
          for (int64_t p = n - 1; p >= O && b.end(b.cell(p)) > n; --p) tail = p;
          ASSERT_EQ(g.raw_tail_begin(n), tail) << ctx;
          for (int64_t L : locals) {
            const phasekv::Visibility v = g.visible(n, L);
            ASSERT_EQ(v.prefix_end, std::min(n, O)) << ctx << " L=" << L;
            ASSERT_EQ(v.entries, J) << ctx << " L=" << L;
            ASSERT_EQ(v.raw_end, n) << ctx << " L=" << L;
            std::set<int64_t> got;
            for (int64_t p = v.raw_begin; p < v.raw_end; ++p) got.insert(p);
            ASSERT_EQ(got, b.visible_raw(n, L)) << ctx << " L=" << L;
            ASSERT_GE(v.raw_begin, v.prefix_end) << ctx << " L=" << L;
            ASSERT_EQ(v.total(), v.prefix_end + J + static_cast<int64_t>(got.size()));
            ++checked;
          }
        }
      }
  // 12*12 geometries, sum over S of (2S+1) origins, 201 lengths, 4 local windows.
  EXPECT_EQ(checked, 12 * (12 * 13 + 12) * 201 * 4);
}

TEST(Geometry, EmptySequenceSeesNothing) {
  const Geometry g(8, 4, 3);
  const phasekv::Visibility v = g.visible(0, 128);
  EXPECT_EQ(v.total(), 0);
  EXPECT_EQ(v.prefix_end, 0);
  EXPECT_EQ(v.raw_begin, 0);
  EXPECT_EQ(v.raw_end, 0);
}

TEST(Geometry, DeepSeekV4CsaExample) {
  // W=8, S=4, L=128, query at position 299 (n = 300).
  const Geometry g(8, 4);
  EXPECT_EQ(g.complete_windows(300), 74);
  EXPECT_EQ(g.raw_tail_begin(300), 296);
  const phasekv::Visibility v = g.visible(300, 128);
  EXPECT_EQ(v.raw_begin, 172);
  EXPECT_EQ(v.total(), 74 + 128);
  EXPECT_EQ(g.ring_capacity(128), 128);
  EXPECT_EQ(g.ring_capacity(0), 8);
}

TEST(Geometry, ConstexprAndDefault) {
  constexpr Geometry g(8, 8, 2);
  static_assert(g.complete_windows(10) == 1, "constexpr J(n)");
  static_assert(g.phase(9) == 7, "constexpr phase");
  static_assert(g.visible(10, 0).raw_begin == 10, "constexpr visibility");
  constexpr Geometry d;
  static_assert(d.window() == 1 && d.stride() == 1 && d.origin() == 0, "default geometry");
  EXPECT_TRUE(g == Geometry(8, 8, 2));
  EXPECT_TRUE(g != Geometry(8, 4, 2));
}

TEST(Geometry, LargeLengthsDoNotOverflow) {
  const int64_t big = phasekv::kMaxGeometryExtent;
  const Geometry g(big, big, big);
  const int64_t n = phasekv::kMaxLength;
  const int64_t J = g.complete_windows(n);
  EXPECT_EQ(J, (n - 2 * big) / big + 1);
  EXPECT_LE(g.completes_at(J - 1), n);
  EXPECT_GT(g.completes_at(J), n);
  const phasekv::Visibility v = g.visible(n, big);
  EXPECT_EQ(v.prefix_end, big);
  EXPECT_LE(v.raw_begin, n);
}

template <class F>
void expect_invalid(F f, const std::string& field, const std::string& value) {
  try {
    f();
    FAIL() << "no exception for " << field << " = " << value;
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(field + " = " + value), std::string::npos) << msg;
    EXPECT_NE(msg.find("phasekv::Geometry"), std::string::npos) << msg;
  }
}

TEST(Geometry, BadInputNamesFieldAndValue) {
  expect_invalid(
      [] {
        Geometry g(0, 4);
        (void)g;
      },
      "window", "0");
  expect_invalid(
      [] {
        Geometry g(-3, 4);
        (void)g;
      },
      "window", "-3");
  expect_invalid(
      [] {
        Geometry g(8, 0);
        (void)g;
      },
      "stride", "0");
  expect_invalid(
      [] {
        Geometry g(8, -1);
        (void)g;
      },
      "stride", "-1");
  expect_invalid(
      [] {
        Geometry g(8, 4, -2);
        (void)g;
      },
      "origin", "-2");
  const int64_t huge = phasekv::kMaxGeometryExtent + 1;
  expect_invalid(
      [=] {
        Geometry g(huge, 4);
        (void)g;
      },
      "window", std::to_string(huge));
  expect_invalid(
      [=] {
        Geometry g(8, huge);
        (void)g;
      },
      "stride", std::to_string(huge));
  expect_invalid(
      [=] {
        Geometry g(8, 4, huge);
        (void)g;
      },
      "origin", std::to_string(huge));
  const int64_t max = std::numeric_limits<int64_t>::max();
  expect_invalid(
      [=] {
        Geometry g(max, 4);
        (void)g;
      },
      "window", std::to_string(max));
  // The exception type is phasekv::invalid_argument.
  EXPECT_THROW(Geometry(0, 1), phasekv::invalid_argument);
}

TEST(Geometry, LengthAndLocalChecks) {
  EXPECT_NO_THROW(Geometry::check_length("f", "n", 0));
  EXPECT_NO_THROW(Geometry::check_length("f", "n", phasekv::kMaxLength));
  EXPECT_THROW(Geometry::check_length("f", "n", -1), phasekv::invalid_argument);
  EXPECT_THROW(Geometry::check_length("f", "n", phasekv::kMaxLength + 1),
               phasekv::invalid_argument);
  EXPECT_NO_THROW(Geometry::check_local("f", "local", 128));
  try {
    Geometry::check_local("f", "local", -5);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("local = -5"), std::string::npos) << e.what();
  }
}

}  // namespace
