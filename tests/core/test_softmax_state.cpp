#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "phasekv/attention/softmax_state.hpp"

namespace {

// Softmax-weighted average of values in double, and its log-sum-exp.
void direct(const std::vector<float>& s, const std::vector<float>& v, int dv,
            std::vector<double>& o, double& lse) {
  double m = -INFINITY;
  for (float x : s) m = std::max(m, static_cast<double>(x));
  double d = 0;
  o.assign(dv, 0.0);
  for (size_t i = 0; i < s.size(); ++i) {
    const double w = std::exp(s[i] - m);
    d += w;
    for (int k = 0; k < dv; ++k) o[k] += w * v[i * dv + k];
  }
  for (auto& x : o) x /= d;
  lse = m + std::log(d);
}

// Online accumulation of a slice into a partial (normalized output + lse).
void partial(const std::vector<float>& s, const std::vector<float>& v, int dv, size_t a, size_t b,
             std::vector<float>& o, float& lse) {
  phasekv::OnlineSoftmax st;
  o.assign(dv, 0.0f);
  for (size_t i = a; i < b; ++i) {
    const float c = st.raise_max(s[i]);
    for (auto& x : o) x *= c;
    const float w = st.add(s[i]);
    for (int k = 0; k < dv; ++k) o[k] += w * v[i * dv + k];
  }
  if (!st.empty())
    for (auto& x : o) x /= st.denom;
  lse = st.lse();
}

TEST(SoftmaxState, SplitAndMergeEqualsDirect) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  const int dv = 5;
  for (int n : {1, 2, 7, 97}) {
    std::vector<float> s(n), v(n * dv);
    for (auto& x : s) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    std::vector<double> want;
    double want_lse;
    direct(s, v, dv, want, want_lse);
    for (int parts = 1; parts <= 8; ++parts) {
      std::vector<float> acc(dv, 123.0f);  // poisoned; empty lse means ignored
      float acc_lse = phasekv::neg_inf();
      for (int p = 0; p < parts; ++p) {
        const size_t a = static_cast<size_t>(n) * p / parts,
                     b = static_cast<size_t>(n) * (p + 1) / parts;
        std::vector<float> o;
        float l;
        partial(s, v, dv, a, b, o, l);
        phasekv::merge_partial(acc.data(), acc_lse, o.data(), l, dv);
      }
      EXPECT_NEAR(acc_lse, want_lse, 1e-5 * (1 + std::fabs(want_lse)));
      for (int k = 0; k < dv; ++k) EXPECT_NEAR(acc[k], want[k], 1e-5 * (1 + std::fabs(want[k])));
    }
  }
}

TEST(SoftmaxState, EmptyMergesAndSink) {
  float o[2] = {7.0f, 7.0f};
  float lse = phasekv::neg_inf();
  const float e[2] = {9.0f, 9.0f};
  phasekv::merge_partial(o, lse, e, phasekv::neg_inf(), 2);
  EXPECT_EQ(lse, phasekv::neg_inf());
  phasekv::apply_sink(o, lse, 1.5f, 2);  // empty + sink: zeros and lse = sink
  EXPECT_EQ(o[0], 0.0f);
  EXPECT_EQ(lse, 1.5f);
  float o2[1] = {2.0f};
  float lse2 = 0.0f;  // one key with logit 0 and value 2
  phasekv::apply_sink(o2, lse2, 0.0f, 1);
  EXPECT_NEAR(o2[0], 1.0f, 1e-6);
  EXPECT_NEAR(lse2, std::log(2.0f), 1e-6);
  // Huge logits stay finite.
  phasekv::OnlineSoftmax st;
  st.raise_max(1e4f);
  st.add(1e4f);
  st.raise_max(-1e4f);
  st.add(-1e4f);
  EXPECT_TRUE(std::isfinite(st.lse()));
}

}  // namespace
