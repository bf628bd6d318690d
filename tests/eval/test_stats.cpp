#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "phasekv/eval/report.hpp"
#include "phasekv/eval/stats.hpp"

namespace {

using namespace phasekv::eval;

TEST(Wilson, KnownValues) {
  // 50/100: center 0.5, half-width z*sqrt(.25/100 + z^2/40000)/(1+z^2/100).
  const Interval a = wilson_interval(50, 100);
  EXPECT_NEAR(a.low, 0.4038315, 1e-6);
  EXPECT_NEAR(a.high, 0.5961685, 1e-6);
  // 0/10: [0, z^2/(n+z^2)].
  const Interval b = wilson_interval(0, 10);
  EXPECT_EQ(b.low, 0.0);
  EXPECT_NEAR(b.high, kZ95 * kZ95 / (10 + kZ95 * kZ95), 1e-12);
  const Interval c = wilson_interval(10, 10);
  EXPECT_EQ(c.high, 1.0);
  EXPECT_NEAR(c.low, 10.0 / (10 + kZ95 * kZ95), 1e-12);
  // 81/263 (a textbook example): [0.2553, 0.3662].
  const Interval d = wilson_interval(81, 263);
  EXPECT_NEAR(d.low, 0.2553, 1e-4);
  EXPECT_NEAR(d.high, 0.3662, 1e-4);
  const Interval e = wilson_interval(0, 0);
  EXPECT_EQ(e.low, 0.0);
  EXPECT_EQ(e.high, 1.0);
  EXPECT_THROW(wilson_interval(3, 2), phasekv::invalid_argument);
  EXPECT_THROW(wilson_interval(-1, 2), phasekv::invalid_argument);
  EXPECT_THROW(wilson_interval(0, -2), phasekv::invalid_argument);
}

TEST(Wilson, CoverageNearNominal) {
  // Simulated coverage of the true rate over many binomial draws: about 95 %.
  std::mt19937_64 rng(7);
  const int reps = 4000;
  for (double p : {0.1, 0.5, 0.9}) {
    std::binomial_distribution<int> bin(200, p);
    int covered = 0;
    for (int i = 0; i < reps; ++i) {
      const Interval iv = wilson_interval(bin(rng), 200);
      covered += (iv.low <= p && p <= iv.high) ? 1 : 0;
    }
    const Interval cov = wilson_interval(covered, reps);
    // Wilson's coverage is not exactly nominal (it oscillates with n and p, within about
    // 2 points of 95 % for n p >= 5; Brown, Cai & DasGupta 2001).
    EXPECT_LE(cov.low, 0.97) << p;
    EXPECT_GE(cov.high, 0.93) << p;
  }
}

TEST(IncompleteGamma, KnownValues) {
  // Q(1, x) = exp(-x).
  for (double x : {0.01, 0.5, 1.0, 2.0, 7.5, 30.0})
    EXPECT_NEAR(regularized_gamma_q(1.0, x), std::exp(-x), 1e-13 * std::max(1.0, std::exp(-x)));
  // P(1/2, x) = erf(sqrt(x)).
  for (double x : {0.01, 0.3, 1.0, 1.4, 4.0, 12.0})
    EXPECT_NEAR(regularized_gamma_p(0.5, x), std::erf(std::sqrt(x)), 1e-13);
  // Q(k, x) = exp(-x) sum_{i<k} x^i / i! for integer k.
  for (int k : {2, 3, 5, 10, 40})
    for (double x : {0.5, 3.0, 9.0, 41.0, 80.0}) {
      double term = 1.0, sum = 0.0;
      for (int i = 0; i < k; ++i) {
        sum += term;
        term *= x / (i + 1);
      }
      const double want = std::exp(-x) * sum;
      EXPECT_NEAR(regularized_gamma_q(k, x), want, 1e-12 * std::max(want, 1e-300) + 1e-300)
          << "k=" << k << " x=" << x;
      EXPECT_NEAR(regularized_gamma_p(k, x) + regularized_gamma_q(k, x), 1.0, 1e-14);
    }
  EXPECT_EQ(regularized_gamma_q(2.0, 0.0), 1.0);
  EXPECT_THROW(regularized_gamma_q(0.0, 1.0), phasekv::invalid_argument);
  EXPECT_THROW(regularized_gamma_q(1.0, -1.0), phasekv::invalid_argument);
  EXPECT_THROW(regularized_gamma_p(1.0, std::nan("")), phasekv::invalid_argument);
}

TEST(ChiSquare, CriticalValues) {
  // Table values: the 0.95 and 0.99 quantiles.
  EXPECT_NEAR(chi_square_sf(3.841458820694124, 1), 0.05, 1e-12);
  EXPECT_NEAR(chi_square_sf(6.634896601021214, 1), 0.01, 1e-12);
  EXPECT_NEAR(chi_square_sf(11.070497693516351, 5), 0.05, 1e-12);
  EXPECT_NEAR(chi_square_sf(14.067140449340169, 7), 0.05, 1e-12);
  EXPECT_NEAR(chi_square_sf(18.475306906582357, 7), 0.01, 1e-12);
  EXPECT_NEAR(chi_square_sf(124.3421134, 100), 0.05, 1e-8);
  EXPECT_EQ(chi_square_sf(0.0, 3), 1.0);
  EXPECT_THROW(chi_square_sf(1.0, 0), phasekv::invalid_argument);
}

TEST(Homogeneity, HandComputedTable) {
  // 2x2 table 30/50 vs 20/50: pooled 0.5, expected 25 each, X^2 = 4 * 25/25 = 4.
  const HomogeneityTest t = homogeneity_test({{30, 50}, {20, 50}});
  EXPECT_NEAR(t.statistic, 4.0, 1e-12);
  EXPECT_EQ(t.dof, 1);
  EXPECT_NEAR(t.p_value, 0.04550026389635842, 1e-12);
  // Empty groups are ignored; all-correct is homogeneous.
  const HomogeneityTest u = homogeneity_test({{30, 50}, {0, 0}, {20, 50}});
  EXPECT_EQ(u.dof, 1);
  EXPECT_NEAR(u.statistic, 4.0, 1e-12);
  EXPECT_EQ(homogeneity_test({{5, 5}, {7, 7}}).p_value, 1.0);
  EXPECT_EQ(homogeneity_test({{5, 9}}).dof, 0);
  EXPECT_THROW(homogeneity_test({{6, 5}}), phasekv::invalid_argument);
}

TEST(Homogeneity, FalsePositiveRateUnderNull) {
  // Under homogeneity, p < 0.05 happens about 5 % of the time.
  std::mt19937_64 rng(11);
  std::binomial_distribution<std::int64_t> bin(300, 0.4);
  const int reps = 2000;
  int rejected = 0;
  for (int i = 0; i < reps; ++i) {
    std::vector<Count> g;
    for (int r = 0; r < 8; ++r) g.push_back({bin(rng), 300});
    rejected += homogeneity_test(g).p_value < 0.05 ? 1 : 0;
  }
  const Interval iv = wilson_interval(rejected, reps);
  EXPECT_LE(iv.low, 0.05);
  EXPECT_GE(iv.high, 0.05);
}

std::vector<Count> draw(const std::vector<double>& rates, std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Count> g;
  for (double p : rates) {
    std::binomial_distribution<std::int64_t> bin(n, p);
    g.push_back({bin(rng), n});
  }
  return g;
}

TEST(Period, DetectsTruePeriods) {
  // Period 4 in M = 8 (like DeepSeek-V4's S = 4 measured mod 8).
  const std::vector<double> p4 = {0.7, 0.55, 0.45, 0.3, 0.7, 0.55, 0.45, 0.3};
  const std::vector<double> p8 = {0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.2};
  const std::vector<double> p1(8, 0.6);
  const std::vector<double> p2 = {0.8, 0.3, 0.8, 0.3, 0.8, 0.3, 0.8, 0.3};
  int ok4 = 0, ok8 = 0, ok1 = 0, ok2 = 0;
  for (std::uint64_t s = 0; s < 20; ++s) {
    ok4 += detect_period(draw(p4, 400, s)) == 4;
    ok8 += detect_period(draw(p8, 400, 100 + s)) == 8;
    ok1 += detect_period(draw(p1, 400, 200 + s)) == 1;
    ok2 += detect_period(draw(p2, 400, 300 + s)) == 2;
  }
  // The true period is rejected with probability about alpha = 1 % per draw (family-wise);
  // allow up to 2 misses in 20 (binomial tail below 2e-2).
  EXPECT_GE(ok4, 18);
  EXPECT_GE(ok8, 20);  // a 70-point step never hides at n = 400.
  EXPECT_GE(ok1, 18);
  EXPECT_GE(ok2, 18);
  // Exact counts give exact periods.
  EXPECT_EQ(detect_period({{100, 200}, {50, 200}, {100, 200}, {50, 200}, {100, 200}, {50, 200}}),
            2);
  EXPECT_EQ(detect_period({{100, 200}, {50, 200}, {10, 200}, {100, 200}, {50, 200}, {10, 200}}), 3);
  // Too few samples to see a 25-point difference at alpha = 1 %: period 1.
  EXPECT_EQ(detect_period({{10, 20}, {5, 20}, {10, 20}, {5, 20}, {10, 20}, {5, 20}}), 1);
  EXPECT_EQ(detect_period({{7, 7}}), 1);
  EXPECT_THROW(detect_period({}), phasekv::invalid_argument);
  EXPECT_THROW(detect_period({{1, 2}}, 1.5), phasekv::invalid_argument);
}

TEST(Spearman, Values) {
  EXPECT_NEAR(spearman({1, 2, 3, 4}, {10, 20, 30, 40}), 1.0, 1e-12);
  EXPECT_NEAR(spearman({1, 2, 3, 4}, {4, 3, 2, 1}), -1.0, 1e-12);
  // rho = 1 - 6 sum d^2 / (n(n^2-1)) without ties: d = (0,1,-1,0,0) -> 1 - 12/120 = 0.9.
  EXPECT_NEAR(spearman({1, 2, 3, 4, 5}, {1, 3, 2, 4, 5}), 0.9, 1e-12);
  // Ties get average ranks.
  EXPECT_NEAR(spearman({1, 1, 2}, {1, 1, 2}), 1.0, 1e-12);
  EXPECT_EQ(spearman({1, 1, 1}, {1, 2, 3}), 0.0);
  EXPECT_THROW(spearman({1, 2}, {1}), phasekv::invalid_argument);
}

TEST(ProportionTest, OneSided) {
  EXPECT_LT(proportion_less_p({10, 100}, {30, 100}), 1e-3);
  EXPECT_GT(proportion_less_p({30, 100}, {10, 100}), 0.99);
  EXPECT_NEAR(proportion_less_p({20, 100}, {20, 100}), 0.5, 1e-12);
  EXPECT_EQ(proportion_less_p({0, 0}, {20, 100}), 1.0);
}

TEST(Summary, AggregatesAndTally) {
  PhaseTally t(4);
  // residue 0: 3/4, 1: 1/4, 2: 4/4, 3: 2/4; positions with origin 2.
  const bool outcome[4][4] = {{1, 1, 1, 0}, {1, 0, 0, 0}, {1, 1, 1, 1}, {1, 1, 0, 0}};
  for (int r = 0; r < 4; ++r)
    for (int i = 0; i < 4; ++i) t.add_position(2 + r + 4 * i, outcome[r][i], 2);
  EXPECT_EQ(t[0].n, 4);
  EXPECT_EQ(t[1].correct, 1);
  const Summary s = summarize(t);
  EXPECT_EQ(s.modulus, 4);
  EXPECT_NEAR(s.mean, (0.75 + 0.25 + 1.0 + 0.5) / 4, 1e-15);
  EXPECT_EQ(s.worst_residue, 1);
  EXPECT_EQ(s.best_residue, 2);
  EXPECT_NEAR(s.gap_pp, 75.0, 1e-12);
  EXPECT_NEAR(s.groups[1].ci_low, wilson_interval(1, 4).low, 0);
  EXPECT_NEAR(s.homogeneity_p, homogeneity_test(t.counts()).p_value, 0);
  EXPECT_THROW(t.add_residue(4, true), phasekv::invalid_argument);
  EXPECT_THROW(PhaseTally(0), phasekv::invalid_argument);
  // Unweighted mean: a big group does not dominate.
  PhaseTally u(2);
  for (int i = 0; i < 1000; ++i) u.add_residue(0, true);
  u.add_residue(1, false);
  EXPECT_NEAR(summarize(u).mean, 0.5, 1e-15);
  // Empty groups are excluded and counted.
  PhaseTally v(3);
  v.add_residue(0, true);
  v.add_residue(2, false);
  const Summary sv = summarize(v);
  EXPECT_EQ(sv.empty_groups, 1);
  EXPECT_TRUE(std::isnan(sv.groups[1].accuracy));
  EXPECT_NEAR(sv.mean, 0.5, 0);
}

TEST(Report, FormatsContainTheFigures) {
  PhaseTally t(2);
  for (int i = 0; i < 10; ++i) t.add_residue(0, i < 9);
  for (int i = 0; i < 10; ++i) t.add_residue(1, i < 2);
  const Summary s = summarize(t);
  const std::string md = to_markdown(s);
  EXPECT_NE(md.find("| 0 | 10 | 9 | 90.0 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 1 | 10 | 2 | 20.0 |"), std::string::npos) << md;
  EXPECT_NE(md.find("gap 70.0 pp"), std::string::npos) << md;
  const std::string csv = to_csv(s);
  EXPECT_EQ(csv.substr(0, csv.find('\n')), "residue,n,correct,accuracy,ci_low,ci_high");
  EXPECT_NE(csv.find("\n0,10,9,0.9,"), std::string::npos) << csv;
  const std::string js = to_json(s);
  EXPECT_NE(js.find("\"modulus\": 2"), std::string::npos);
  EXPECT_NE(js.find("\"worst_residue\": 1"), std::string::npos);
  EXPECT_NE(js.find("\"accuracy\": 0.2,"), std::string::npos) << js;
  const std::string svg = to_svg(s, "a <b>");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("a &lt;b&gt;"), std::string::npos);
  std::size_t points = 0;
  for (std::size_t p = svg.find("class=\"point\""); p != std::string::npos;
       p = svg.find("class=\"point\"", p + 1))
    ++points;
  EXPECT_EQ(points, 2u);
  // A residue without data: null in JSON, empty in CSV, n/a in Markdown.
  PhaseTally e(3);
  e.add_residue(0, true);
  e.add_residue(2, false);
  const Summary se = summarize(e);
  EXPECT_NE(to_json(se).find("\"accuracy\": null"), std::string::npos) << to_json(se);
  EXPECT_NE(to_csv(se).find("\n1,0,0,,0,1\n"), std::string::npos) << to_csv(se);
  EXPECT_NE(to_markdown(se).find("| 1 | 0 | 0 | n/a |"), std::string::npos) << to_markdown(se);
  EXPECT_NE(summary_line(se).find("1 residue(s) without data"), std::string::npos);
  const std::string bars = to_bars(s, 10);
  EXPECT_NE(bars.find("r=  0 |#########"), std::string::npos) << bars;
  EXPECT_NE(bars.find("<- worst"), std::string::npos);
}

}  // namespace
