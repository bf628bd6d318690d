/// @file
/// @brief Statistics for per-phase retrieval: Wilson intervals, the chi-square homogeneity
/// test (with a self-contained regularized incomplete gamma function), period detection,
/// rank correlation, and the per-residue summary that every report prints.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/phase/residue.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace eval {

/// z for a two-sided 95 % interval: the 0.975 quantile of the standard normal.
inline constexpr double kZ95 = 1.959963984540054;

/// Default significance level of period detection (see detect_period).
inline constexpr double kDefaultPeriodAlpha = 0.01;

/// A closed interval `[low, high]` of proportions.
struct Interval {
  double low = 0.0;   ///< Lower bound.
  double high = 1.0;  ///< Upper bound.
};

/// Wilson score interval of a binomial proportion with `correct` successes out of `n`:
/// `(p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)` with `p = correct/n`.
/// For `n == 0` the interval is `[0, 1]`. Throws phasekv::invalid_argument when
/// `correct < 0`, `correct > n` or `z <= 0`.
inline Interval wilson_interval(std::int64_t correct, std::int64_t n, double z = kZ95) {
  const char* where = "phasekv::eval::wilson_interval";
  phasekv::detail::check_arg(n >= 0, where, "n", n, "must be >= 0");
  phasekv::detail::check_arg(correct >= 0 && correct <= n, where, "correct", correct,
                             "must be in [0, n]");
  phasekv::detail::check_arg(z > 0.0 && std::isfinite(z), where, "z", z, "must be finite and > 0");
  if (n == 0) return {0.0, 1.0};
  const double nn = static_cast<double>(n);
  const double p = static_cast<double>(correct) / nn;
  const double z2 = z * z;
  const double denom = 1.0 + z2 / nn;
  const double center = (p + z2 / (2.0 * nn)) / denom;
  const double half = z / denom * std::sqrt(p * (1.0 - p) / nn + z2 / (4.0 * nn * nn));
  Interval iv{center - half, center + half};
  // Exact endpoints at the extremes (rounding could leave 1e-17 outside [0, 1]).
  if (correct == 0) iv.low = 0.0;
  if (correct == n) iv.high = 1.0;
  iv.low = std::max(0.0, iv.low);
  iv.high = std::min(1.0, iv.high);
  return iv;
}

namespace detail {

// Series for the lower regularized gamma P(a, x), good for x < a + 1.
inline double gamma_p_series(double a, double x) {
  double term = 1.0 / a;
  double sum = term;
  for (int n = 1; n < 10000; ++n) {
    term *= x / (a + n);
    sum += term;
    if (std::fabs(term) < std::fabs(sum) * 1e-16) break;
  }
  return sum * std::exp(-x + a * std::log(x) - std::lgamma(a));
}

// Continued fraction (modified Lentz) for the upper regularized gamma Q(a, x), x >= a + 1.
// Q(a,x) = e^{-x} x^a / Gamma(a) * 1/(x+1-a- 1*(1-a)/(x+3-a- 2*(2-a)/(x+5-a- ...))).
inline double gamma_q_fraction(double a, double x) {
  const double tiny = 1e-300;
  double b = x + 1.0 - a;
  double c = 1.0 / tiny;
  double d = 1.0 / b;
  double h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1.0 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1.0) < 1e-16) break;
  }
  return std::exp(-x + a * std::log(x) - std::lgamma(a)) * h;
}

}  // namespace detail

/// Upper regularized incomplete gamma function `Q(a, x) = Gamma(a, x) / Gamma(a)` for
/// `a > 0`, `x >= 0` (series below `x = a + 1`, continued fraction above; relative error
/// about 1e-14). Throws phasekv::invalid_argument for `a <= 0`, `x < 0` or non-finite input.
inline double regularized_gamma_q(double a, double x) {
  const char* where = "phasekv::eval::regularized_gamma_q";
  phasekv::detail::check_arg(a > 0.0 && std::isfinite(a), where, "a", a, "must be finite and > 0");
  phasekv::detail::check_arg(x >= 0.0 && !std::isnan(x), where, "x", x, "must be >= 0");
  if (x == 0.0) return 1.0;
  if (std::isinf(x)) return 0.0;
  if (x < a + 1.0) return 1.0 - detail::gamma_p_series(a, x);
  return detail::gamma_q_fraction(a, x);
}

/// Lower regularized incomplete gamma function `P(a, x) = 1 - Q(a, x)`, computed directly
/// (no cancellation) where the series applies.
inline double regularized_gamma_p(double a, double x) {
  const char* where = "phasekv::eval::regularized_gamma_p";
  phasekv::detail::check_arg(a > 0.0 && std::isfinite(a), where, "a", a, "must be finite and > 0");
  phasekv::detail::check_arg(x >= 0.0 && !std::isnan(x), where, "x", x, "must be >= 0");
  if (x == 0.0) return 0.0;
  if (std::isinf(x)) return 1.0;
  if (x < a + 1.0) return detail::gamma_p_series(a, x);
  return 1.0 - detail::gamma_q_fraction(a, x);
}

/// Survival function of the chi-square distribution with `dof` degrees of freedom:
/// `P(X >= x) = Q(dof/2, x/2)`. Throws phasekv::invalid_argument for `dof < 1`.
inline double chi_square_sf(double x, std::int64_t dof) {
  phasekv::detail::check_arg(dof >= 1, "phasekv::eval::chi_square_sf", "dof", dof, "must be >= 1");
  if (x <= 0.0) return 1.0;
  return regularized_gamma_q(0.5 * static_cast<double>(dof), 0.5 * x);
}

/// Survival function of the standard normal, `P(Z >= z)`.
inline double normal_sf(double z) { return 0.5 * std::erfc(z / std::sqrt(2.0)); }

/// Successes out of trials of one group.
struct Count {
  std::int64_t correct = 0;  ///< Successes.
  std::int64_t n = 0;        ///< Trials.
};

/// Result of a chi-square homogeneity test.
struct HomogeneityTest {
  double statistic = 0.0;  ///< Pearson's chi-square statistic.
  std::int64_t dof = 0;    ///< Degrees of freedom: (groups with n > 0) - 1.
  double p_value = 1.0;    ///< `P(X >= statistic)` under homogeneity.
};

/// Pearson chi-square test of homogeneity of the 2 x k table (correct, wrong) x groups:
/// `X^2 = sum_g sum_{o in {c, w}} (O - E)^2 / E` with `E` from the pooled rate, and
/// `dof = k - 1` over the k groups with `n > 0`. With fewer than two non-empty groups, or a
/// pooled rate of exactly 0 or 1, there is no evidence of heterogeneity: statistic 0, p 1.
///
/// The chi-square approximation needs expected counts of about 5 or more per cell; with
/// fewer it is anti-conservative (p-values too small). Throws phasekv::invalid_argument for a
/// group with `n < 0` or `correct` outside `[0, n]`.
inline HomogeneityTest homogeneity_test(const std::vector<Count>& groups) {
  const char* where = "phasekv::eval::homogeneity_test";
  std::int64_t total = 0, total_correct = 0, k = 0;
  for (const Count& g : groups) {
    phasekv::detail::check_arg(g.n >= 0, where, "groups[i].n", g.n, "must be >= 0");
    phasekv::detail::check_arg(g.correct >= 0 && g.correct <= g.n, where, "groups[i].correct",
                               g.correct, "must be in [0, n]");
    if (g.n == 0) continue;
    total += g.n;
    total_correct += g.correct;
    ++k;
  }
  HomogeneityTest t;
  if (k < 2) return t;
  t.dof = k - 1;
  if (total_correct == 0 || total_correct == total) return t;
  const double rate = static_cast<double>(total_correct) / static_cast<double>(total);
  double x2 = 0.0;
  for (const Count& g : groups) {
    if (g.n == 0) continue;
    const double nn = static_cast<double>(g.n);
    const double ec = nn * rate, ew = nn * (1.0 - rate);
    const double oc = static_cast<double>(g.correct), ow = nn - oc;
    x2 += (oc - ec) * (oc - ec) / ec + (ow - ew) * (ow - ew) / ew;
  }
  t.statistic = x2;
  t.p_value = chi_square_sf(x2, t.dof);
  return t;
}

/// One-sided two-proportion z test (pooled variance) of `H1: rate(a) < rate(b)`. Returns the
/// p-value `P(Z <= z)`; 1 when a group is empty or the pooled rate is 0 or 1.
inline double proportion_less_p(const Count& a, const Count& b) {
  if (a.n == 0 || b.n == 0) return 1.0;
  const double na = static_cast<double>(a.n), nb = static_cast<double>(b.n);
  const double pa = static_cast<double>(a.correct) / na;
  const double pb = static_cast<double>(b.correct) / nb;
  const double pool = static_cast<double>(a.correct + b.correct) / (na + nb);
  const double var = pool * (1.0 - pool) * (1.0 / na + 1.0 / nb);
  if (var <= 0.0) return 1.0;
  return normal_sf((pb - pa) / std::sqrt(var));
}

/// Spearman rank correlation of two equally long sequences (ties get average ranks; Pearson
/// correlation of the ranks). Returns 0 when either sequence is constant. Throws
/// phasekv::invalid_argument when the lengths differ or are below 2.
inline double spearman(const std::vector<double>& x, const std::vector<double>& y) {
  const char* where = "phasekv::eval::spearman";
  phasekv::detail::check_arg(x.size() == y.size(), where, "y.size()", y.size(),
                             "must equal x.size()");
  phasekv::detail::check_arg(x.size() >= 2, where, "x.size()", x.size(), "must be >= 2");
  auto ranks = [](const std::vector<double>& v) {
    std::vector<std::size_t> idx(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) idx[i] = i;
    std::sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return v[a] < v[b]; });
    std::vector<double> r(v.size());
    for (std::size_t i = 0; i < idx.size();) {
      std::size_t j = i;
      while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
      const double avg = 0.5 * static_cast<double>(i + j) + 1.0;
      for (std::size_t k = i; k <= j; ++k) r[idx[k]] = avg;
      i = j + 1;
    }
    return r;
  };
  const std::vector<double> rx = ranks(x), ry = ranks(y);
  const double n = static_cast<double>(x.size());
  double mx = 0, my = 0;
  for (std::size_t i = 0; i < rx.size(); ++i) {
    mx += rx[i];
    my += ry[i];
  }
  mx /= n;
  my /= n;
  double sxy = 0, sxx = 0, syy = 0;
  for (std::size_t i = 0; i < rx.size(); ++i) {
    sxy += (rx[i] - mx) * (ry[i] - my);
    sxx += (rx[i] - mx) * (rx[i] - mx);
    syy += (ry[i] - my) * (ry[i] - my);
  }
  if (sxx == 0.0 || syy == 0.0) return 0.0;
  return sxy / std::sqrt(sxx * syy);
}

/// Detected period of per-residue counts modulo `M = groups.size()`: the smallest divisor `p`
/// of M such that, for every class `c` in `[0, p)`, the groups `r = c, c + p, c + 2p, ...`
/// pass the chi-square homogeneity test at level `alpha / p` (Bonferroni over the p classes).
/// A period of 1 means no detectable phase dependence; M is returned when no smaller divisor
/// fits. Empty groups (n = 0) are ignored. Throws phasekv::invalid_argument for an empty
/// `groups` or `alpha` outside `(0, 1)`.
inline std::int64_t detect_period(const std::vector<Count>& groups,
                                  double alpha = kDefaultPeriodAlpha) {
  const char* where = "phasekv::eval::detect_period";
  phasekv::detail::check_arg(!groups.empty(), where, "groups.size()", groups.size(),
                             "must be >= 1");
  phasekv::detail::check_arg(alpha > 0.0 && alpha < 1.0, where, "alpha", alpha,
                             "must be in (0, 1)");
  const std::int64_t m = static_cast<std::int64_t>(groups.size());
  for (std::int64_t p = 1; p < m; ++p) {
    if (m % p != 0) continue;
    bool fits = true;
    for (std::int64_t c = 0; c < p && fits; ++c) {
      std::vector<Count> cls;
      for (std::int64_t r = c; r < m; r += p) cls.push_back(groups[static_cast<std::size_t>(r)]);
      if (homogeneity_test(cls).p_value < alpha / static_cast<double>(p)) fits = false;
    }
    if (fits) return p;
  }
  return m;
}

/// Per-residue statistics of one group.
struct GroupStats {
  std::int64_t residue = 0;  ///< The residue r in `[0, M)`.
  std::int64_t n = 0;        ///< Trials.
  std::int64_t correct = 0;  ///< Successes.
  double accuracy = 0.0;     ///< `correct / n` (NaN when n = 0).
  double ci_low = 0.0;       ///< Wilson 95 % lower bound.
  double ci_high = 1.0;      ///< Wilson 95 % upper bound.
};

/// The report of a per-residue sweep. Accuracies are fractions in [0, 1].
struct Summary {
  std::int64_t modulus = 0;         ///< M.
  std::vector<GroupStats> groups;   ///< One per residue 0..M-1.
  double mean = 0.0;                ///< Unweighted mean over non-empty groups (as the paper).
  double worst = 0.0;               ///< Lowest group accuracy.
  std::int64_t worst_residue = -1;  ///< Its residue (the first on ties).
  double best = 0.0;                ///< Highest group accuracy.
  std::int64_t best_residue = -1;   ///< Its residue (the first on ties).
  double gap_pp = 0.0;              ///< `100 * (best - worst)`, percentage points.
  double homogeneity_p = 1.0;       ///< Chi-square homogeneity p-value over all groups.
  std::int64_t period = 1;          ///< detect_period of the groups.
  std::int64_t empty_groups = 0;    ///< Residues with no trials (excluded from the above).
};

/// Counts successes and trials per residue modulo M.
class PhaseTally {
 public:
  /// A tally modulo `modulus`; throws phasekv::invalid_argument when `modulus < 1` or
  /// `modulus > 2^20` (a report with more groups than that is not meaningful).
  explicit PhaseTally(std::int64_t modulus) : counts_(checked(modulus)) {}
  /// The modulus M.
  std::int64_t modulus() const { return static_cast<std::int64_t>(counts_.size()); }
  /// Records one trial of residue `r` in `[0, M)`; throws phasekv::invalid_argument otherwise.
  void add_residue(std::int64_t r, bool correct) {
    if (r < 0 || static_cast<std::size_t>(r) >= counts_.size())
      ::phasekv::detail::throw_arg("phasekv::eval::PhaseTally::add_residue", "residue", r,
                                   "must be in [0, modulus)");
    Count& c = counts_.at(static_cast<std::size_t>(r));
    ++c.n;
    c.correct += correct ? 1 : 0;
  }
  /// Records one trial of the target at position `p`, residue `(p - origin) mod M`.
  void add_position(std::int64_t p, bool correct, std::int64_t origin = 0) {
    add_residue(residue(p, modulus(), origin), correct);
  }
  /// Adds the counts of another tally with the same modulus.
  void merge(const PhaseTally& o) {
    phasekv::detail::check_arg(o.modulus() == modulus(), "phasekv::eval::PhaseTally::merge",
                               "other.modulus()", o.modulus(), "must equal modulus()");
    for (std::size_t i = 0; i < counts_.size(); ++i) {
      counts_[i].n += o.counts_[i].n;
      counts_[i].correct += o.counts_[i].correct;
    }
  }
  /// Counts per residue.
  const std::vector<Count>& counts() const { return counts_; }
  /// Count of residue r.
  const Count& operator[](std::int64_t r) const { return counts_.at(static_cast<std::size_t>(r)); }

 private:
  static std::size_t checked(std::int64_t m) {
    phasekv::detail::check_arg(m >= 1 && m <= (std::int64_t{1} << 20), "phasekv::eval::PhaseTally",
                               "modulus", m, "must be in [1, 2^20]");
    return static_cast<std::size_t>(m);
  }
  std::vector<Count> counts_;
};

/// Builds the Summary of per-residue counts (index = residue): Wilson intervals per group,
/// the unweighted mean, worst and best (first residue on ties), the gap in percentage points,
/// the homogeneity p-value and the detected period at level `period_alpha`. Groups with no
/// trials get accuracy NaN and are excluded from every aggregate (Summary::empty_groups says
/// how many). With no trials at all the aggregates are NaN and the residues -1.
inline Summary summarize(const std::vector<Count>& counts,
                         double period_alpha = kDefaultPeriodAlpha) {
  const char* where = "phasekv::eval::summarize";
  phasekv::detail::check_arg(!counts.empty(), where, "counts.size()", counts.size(),
                             "must be >= 1");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Summary s;
  s.modulus = static_cast<std::int64_t>(counts.size());
  double sum = 0.0;
  std::int64_t used = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    const Count& c = counts[r];
    GroupStats g;
    g.residue = static_cast<std::int64_t>(r);
    g.n = c.n;
    g.correct = c.correct;
    const Interval iv = wilson_interval(c.correct, c.n);
    g.ci_low = iv.low;
    g.ci_high = iv.high;
    if (c.n == 0) {
      g.accuracy = nan;
      ++s.empty_groups;
    } else {
      g.accuracy = static_cast<double>(c.correct) / static_cast<double>(c.n);
      sum += g.accuracy;
      if (used == 0 || g.accuracy < s.worst) {
        s.worst = g.accuracy;
        s.worst_residue = g.residue;
      }
      if (used == 0 || g.accuracy > s.best) {
        s.best = g.accuracy;
        s.best_residue = g.residue;
      }
      ++used;
    }
    s.groups.push_back(g);
  }
  if (used == 0) {
    s.mean = s.worst = s.best = s.gap_pp = nan;
    return s;
  }
  s.mean = sum / static_cast<double>(used);
  s.gap_pp = 100.0 * (s.best - s.worst);
  s.homogeneity_p = homogeneity_test(counts).p_value;
  s.period = detect_period(counts, period_alpha);
  return s;
}

/// Summary of a tally (see summarize(const std::vector<Count>&, double)).
inline Summary summarize(const PhaseTally& tally, double period_alpha = kDefaultPeriodAlpha) {
  return summarize(tally.counts(), period_alpha);
}

}  // namespace eval
PHASEKV_NAMESPACE_END
