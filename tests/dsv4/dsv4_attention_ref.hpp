// Float64 reference of DeepSeek-V4 sparse attention, written from the formulas of
// docs/deepseek_v4.md (never by calling the kernels), and random latent rows stored as T.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "dsv4_test_util.hpp"
#include "phasekv/dsv4/fp8.hpp"
#include "phasekv/dsv4/sparse_attention.hpp"

namespace dsv4t {

namespace dsv4 = phasekv::dsv4;

template <class T>
T store(float x) {
  return phasekv::from_float<T>(x);
}
template <>
inline phasekv::fp8_e4m3_t store<phasekv::fp8_e4m3_t>(float x) {
  return phasekv::float_to_fp8_e4m3(x);
}

// Rows of `count` x `dim` stored as T; with FP8 the real values are code * scale.
template <class T>
std::vector<T> random_rows(std::int64_t count, std::int64_t dim, std::uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<T> v(static_cast<std::size_t>(count * dim));
  for (auto& x : v) x = store<T>(nd(rng) / scale);
  return v;
}

// Reference of one query: rows chosen by the formulas (entries by list, then the window).
template <class T>
void reference(const dsv4::SparseAttentionParams& p, const float* q, const dsv4::LatentRows<T>& raw,
               const dsv4::LatentRows<T>& ent, const std::int32_t* idx, std::int64_t k,
               std::int64_t t, double* out, double* lse) {
  std::vector<const T*> rows;
  std::vector<double> scales;
  for (std::int64_t i = 0; i < k; ++i) {
    const std::int64_t j = idx ? idx[i] : ent.first + i;
    if (j < 0) continue;
    rows.push_back(ent.data + (j - ent.first) * ent.stride);
    scales.push_back(ent.scale);
  }
  for (std::int64_t pos = std::max<std::int64_t>(0, t + 1 - p.window); p.window > 0 && pos <= t;
       ++pos) {
    rows.push_back(raw.data + (pos - raw.first) * raw.stride);
    scales.push_back(raw.scale);
  }
  for (std::int64_t h = 0; h < p.heads; ++h) {
    std::vector<double> s(rows.size());
    double m = p.sinks ? p.sinks[h] : -std::numeric_limits<double>::infinity();
    for (std::size_t r = 0; r < rows.size(); ++r) {
      double dot = 0.0;
      for (std::int64_t i = 0; i < p.dim; ++i)
        dot += static_cast<double>(q[h * p.dim + i]) * val(rows[r][i]) * scales[r];
      s[r] = static_cast<double>(p.scale) * dot;
      m = std::max(m, s[r]);
    }
    double* o = out + h * p.dim_v;
    std::fill(o, o + p.dim_v, 0.0);
    if (rows.empty() && !p.sinks) {
      lse[h] = -std::numeric_limits<double>::infinity();
      continue;
    }
    double den = p.sinks ? std::exp(p.sinks[h] - m) : 0.0;
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const double w = std::exp(s[r] - m);
      den += w;
      for (std::int64_t i = 0; i < p.dim_v; ++i) o[i] += w * val(rows[r][i]) * scales[r];
    }
    for (std::int64_t i = 0; i < p.dim_v; ++i) o[i] /= den;
    lse[h] = m + std::log(den);
  }
}

// One query's outputs `out` [heads, dim_v] and `lse` [heads] against the reference's `ro`, `rl`:
// per head the largest |error| within tol times the largest |output| (at least 1e-3), lse
// within tol times max(1, |lse|). Inputs exact in T leave only f32 arithmetic to err.
inline void expect_query_matches(const float* out, const float* lse, const double* ro,
                                 const double* rl, std::int64_t heads, std::int64_t dim_v,
                                 const std::string& what, double tol = 2e-5) {
  for (std::int64_t h = 0; h < heads; ++h) {
    double err = 0.0, mag = 0.0;
    for (std::int64_t x = 0; x < dim_v; ++x) {
      ASSERT_TRUE(std::isfinite(out[h * dim_v + x])) << what << " head " << h;
      err = std::max(err, std::abs(out[h * dim_v + x] - ro[h * dim_v + x]));
      mag = std::max(mag, std::abs(ro[h * dim_v + x]));
    }
    EXPECT_LE(err, tol * std::max(mag, 1e-3)) << what << " head " << h;
    EXPECT_NEAR(lse[h], rl[h], tol * std::max(1.0, std::abs(rl[h]))) << what << " head " << h;
  }
}

}  // namespace dsv4t
