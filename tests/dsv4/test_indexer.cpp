// The lightning indexer against a float64 reference: scores, the selected set, the order,
// exact ties to the lower index, -1 padding, visibility through the geometry, refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "dsv4_test_util.hpp"
#include "phasekv/dsv4/indexer.hpp"

namespace {

using phasekv::bf16_t;
using phasekv::f16_t;
using phasekv::Geometry;
namespace dsv4 = phasekv::dsv4;

// I(t, j) in double for j < count.
template <class T>
std::vector<double> reference_scores(std::int64_t H, std::int64_t dim, const float* q,
                                     const float* w, const std::vector<T>& keys,
                                     std::int64_t count) {
  std::vector<double> s(static_cast<std::size_t>(count));
  for (std::int64_t j = 0; j < count; ++j) {
    double total = 0.0;
    for (std::int64_t h = 0; h < H; ++h) {
      double dot = 0.0;
      for (std::int64_t i = 0; i < dim; ++i)
        dot += static_cast<double>(q[h * dim + i]) *
               dsv4t::val(keys[static_cast<std::size_t>(j * dim + i)]);
      total += static_cast<double>(w[h]) * std::max(0.0, dot);
    }
    s[static_cast<std::size_t>(j)] = total;
  }
  return s;
}

// Indices in descending order of score, ties to the lower index.
std::vector<std::int32_t> reference_order(const std::vector<double>& s) {
  std::vector<std::int32_t> o(s.size());
  std::iota(o.begin(), o.end(), 0);
  std::stable_sort(o.begin(), o.end(), [&](std::int32_t a, std::int32_t b) {
    return s[static_cast<std::size_t>(a)] > s[static_cast<std::size_t>(b)];
  });
  return o;
}

template <class T>
class Indexer : public ::testing::Test {};
using Types = ::testing::Types<float, bf16_t, f16_t>;
TYPED_TEST_SUITE(Indexer, Types);

struct Case {
  std::int64_t H, dim, k;
  Geometry g;
  std::int64_t first, queries;
};

TYPED_TEST(Indexer, MatchesReference) {
  using T = TypeParam;
  const std::vector<Case> cases = {
      {3, 20, 5, Geometry(4, 4), 0, 60},      // k > visible for the early queries
      {64, 128, 16, Geometry(4, 4), 200, 9},  // V4-Flash head shape
      {5, 33, 7, Geometry(8, 4), 10, 30},     // overlapping geometry, awkward dim
      {2, 16, 4, Geometry(128, 128), 100, 300},
  };
  std::uint32_t seed = 40;
  for (const Case& c : cases) {
    const std::int64_t last_n = c.first + c.queries;
    const std::int64_t nk = c.g.complete_windows(last_n) + 3;  // a few invisible extra keys
    const auto keys = dsv4t::random_values<T>(static_cast<std::size_t>(nk * c.dim), ++seed);
    const auto q =
        dsv4t::random_values<float>(static_cast<std::size_t>(c.queries * c.H * c.dim), ++seed);
    auto w = dsv4t::random_values<float>(static_cast<std::size_t>(c.queries * c.H), ++seed);
    for (auto& x : w) x = std::abs(x);
    dsv4::IndexerParams p{c.H, c.dim, c.k, c.g};
    std::vector<std::int32_t> idx(static_cast<std::size_t>(c.queries * c.k), -7);
    std::vector<float> sc(idx.size(), std::numeric_limits<float>::quiet_NaN());
    dsv4::indexer_top_k<T>(p, q.data(), w.data(), keys.data(), nk, c.dim, c.first, c.queries,
                           idx.data(), sc.data());
    for (std::int64_t i = 0; i < c.queries; ++i) {
      const std::int64_t J = c.g.complete_windows(c.first + i + 1);
      const auto ref =
          reference_scores<T>(c.H, c.dim, q.data() + i * c.H * c.dim, w.data() + i * c.H, keys, J);
      double mag = 1e-30;
      for (double x : ref) mag = std::max(mag, std::abs(x));
      const double tol = 1e-5 * mag;
      const std::int32_t* row = idx.data() + i * c.k;
      const float* srow = sc.data() + i * c.k;
      const std::int64_t m = std::min(J, c.k);
      std::vector<bool> chosen(static_cast<std::size_t>(J), false);
      for (std::int64_t r = 0; r < c.k; ++r) {
        if (r >= m) {
          EXPECT_EQ(row[r], -1) << "query " << i << " rank " << r;
          EXPECT_TRUE(std::isinf(srow[r]) && srow[r] < 0);
          continue;
        }
        ASSERT_GE(row[r], 0);
        ASSERT_LT(row[r], J) << "an invisible entry was selected";
        ASSERT_FALSE(chosen[static_cast<std::size_t>(row[r])]) << "selected twice";
        chosen[static_cast<std::size_t>(row[r])] = true;
        EXPECT_NEAR(srow[r], ref[static_cast<std::size_t>(row[r])], tol);
        if (r > 0) {  // descending, ties to the lower index (on the kernel's own scores)
          EXPECT_TRUE(srow[r - 1] > srow[r] || (srow[r - 1] == srow[r] && row[r - 1] < row[r]));
        }
      }
      // the selected set is the top m up to rounding
      double worst_in = std::numeric_limits<double>::infinity(), best_out = -worst_in;
      for (std::int64_t j = 0; j < J; ++j) {
        const double s = ref[static_cast<std::size_t>(j)];
        if (chosen[static_cast<std::size_t>(j)])
          worst_in = std::min(worst_in, s);
        else
          best_out = std::max(best_out, s);
      }
      EXPECT_GE(worst_in, best_out - tol) << "query " << i;
    }
  }
}

// Small integers make every product and sum exact in f32, so the kernel must reproduce the
// reference order exactly, with duplicate keys (equal scores) ordered by index and keys whose
// dot products are all negative (score 0, ReLU) tied at the bottom.
TEST(Indexer, ExactTiesGoToTheLowerIndex) {
  const std::int64_t H = 2, dim = 19, nk = 40, k = 12;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> small(-3, 3);
  std::vector<float> keys(static_cast<std::size_t>(nk * dim));
  for (std::int64_t j = 0; j < nk; ++j) {
    const std::int64_t src = (j % 3 == 2) ? j - 1 : j;  // every third key repeats the previous
    for (std::int64_t i = 0; i < dim; ++i)
      keys[static_cast<std::size_t>(j * dim + i)] =
          src == j ? static_cast<float>(small(rng)) : keys[static_cast<std::size_t>(src * dim + i)];
  }
  std::vector<float> q(static_cast<std::size_t>(H * dim)), w = {1.0f, 0.5f};
  for (auto& x : q) x = static_cast<float>(small(rng));
  const auto ref = reference_scores<float>(H, dim, q.data(), w.data(), keys, nk);
  const auto order = reference_order(ref);
  std::int64_t ties = 0, zeros = 0;
  for (std::int64_t r = 1; r < k; ++r)
    ties += ref[static_cast<std::size_t>(order[static_cast<std::size_t>(r)])] ==
            ref[static_cast<std::size_t>(order[static_cast<std::size_t>(r - 1)])];
  for (double s : ref) zeros += s == 0.0;
  ASSERT_GT(ties, 2) << "the case must contain ties inside the top k";
  for (std::int64_t kk : {k, nk, nk + 5}) {
    dsv4::IndexerParams p{H, dim, kk, Geometry(1, 1)};
    std::vector<std::int32_t> idx(static_cast<std::size_t>(kk), -7);
    dsv4::indexer_decode<float>(p, q.data(), w.data(), keys.data(), nk, dim, nk, idx.data());
    for (std::int64_t r = 0; r < kk; ++r)
      EXPECT_EQ(idx[static_cast<std::size_t>(r)], r < nk ? order[static_cast<std::size_t>(r)] : -1)
          << "k " << kk << " rank " << r << " (" << zeros << " zero scores)";
  }
}

TEST(Indexer, DecodeEqualsPrefillRowAndNothingVisibleIsAllPadding) {
  const std::int64_t H = 4, dim = 24, k = 6, T = 23;
  const Geometry g(4, 4);
  const auto keys = dsv4t::random_values<bf16_t>(static_cast<std::size_t>(8 * dim), 5);
  const auto q = dsv4t::random_values<float>(static_cast<std::size_t>(T * H * dim), 6);
  const auto w = dsv4t::random_values<float>(static_cast<std::size_t>(T * H), 7);
  dsv4::IndexerParams p{H, dim, k, g};
  std::vector<std::int32_t> all(static_cast<std::size_t>(T * k));
  std::vector<float> all_s(all.size());
  dsv4::indexer_top_k<bf16_t>(p, q.data(), w.data(), keys.data(), 8, dim, 0, T, all.data(),
                              all_s.data());
  for (std::int64_t t = 0; t < T; ++t) {
    std::vector<std::int32_t> one(static_cast<std::size_t>(k));
    std::vector<float> one_s(one.size());
    dsv4::indexer_decode<bf16_t>(p, q.data() + t * H * dim, w.data() + t * H, keys.data(), 8, dim,
                                 t + 1, one.data(), one_s.data());
    for (std::int64_t r = 0; r < k; ++r) {
      EXPECT_EQ(one[static_cast<std::size_t>(r)], all[static_cast<std::size_t>(t * k + r)]);
      EXPECT_EQ(one_s[static_cast<std::size_t>(r)], all_s[static_cast<std::size_t>(t * k + r)]);
    }
    if (t < 3) {  // n < 4: no entry yet
      for (std::int64_t r = 0; r < k; ++r) EXPECT_EQ(one[static_cast<std::size_t>(r)], -1);
    }
  }
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const phasekv::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(Indexer, RefusesBadArgumentsAndWritesNothing) {
  std::vector<float> keys(10 * 8, 1.0f), q(2 * 8, 1.0f), w(2, 1.0f);
  std::vector<std::int32_t> idx(4, -7);
  dsv4::IndexerParams p{2, 8, 4, Geometry(4, 4)};
  // 12 tokens -> J = 3 entries needed, only 2 given
  std::string msg;
  try {
    dsv4::indexer_decode<float>(p, q.data(), w.data(), keys.data(), 2, 8, 12, idx.data());
  } catch (const phasekv::capacity_error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("num_keys = 2"), std::string::npos) << msg;
  auto bad = p;
  bad.top_k = 0;
  EXPECT_NE(error_of([&] {
              dsv4::indexer_decode<float>(bad, q.data(), w.data(), keys.data(), 10, 8, 12,
                                          idx.data());
            }).find("params.top_k = 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              dsv4::indexer_decode<float>(p, q.data(), w.data(), keys.data(), 10, 8, 0, idx.data());
            }).find("n = 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              dsv4::indexer_decode<float>(p, q.data(), w.data(), keys.data(), 10, 4, 12,
                                          idx.data());
            }).find("key_stride = 4"),
            std::string::npos);
  for (auto x : idx) EXPECT_EQ(x, -7);
}

}  // namespace
