// The lightning indexer against a float64 reference: scores, the selected set, the order,
// exact ties to the lower index, -1 padding, visibility through the geometry, refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "dsv4_builds.hpp"
#include "dsv4_test_util.hpp"
#include "phasekv/attention/cpu/dispatch.hpp"
#include "phasekv/dsv4/indexer.hpp"

namespace {

using phasekv::bf16_t;
using phasekv::f16_t;
using phasekv::Geometry;
namespace dsv4 = phasekv::dsv4;
namespace cpu = phasekv::cpu;

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

// Calls f(tag) for every build of the scoring kernel this CPU runs, then for arch::Auto.
template <class F>
void for_each_arch(F&& f) {
  dsv4t::for_each_build(f);
  f(cpu::arch::Auto{});
}

// f32 lanes of the scoring kernel's build `A` (arch::Auto: the build active_arch() names).
template <class A>
int lanes_of() {
  if (!std::is_same<A, cpu::arch::Auto>::value) return A::lanes;
  switch (cpu::active_arch()) {
    case cpu::ArchId::avx512: return 16;
    case cpu::ArchId::avx2: return 8;
    case cpu::ArchId::neon: return 4;
    default: return 1;
  }
}

// f32 error bound of one score with the kernel's order (dsv4/indexer.hpp) on a build of W
// lanes (`lanes`): each dot product has
// ceil(dim / W) + log2(W) rounded steps, the head sum at most heads + 1 (u = 2^-24, 1 % slack).
double score_bound(std::int64_t H, std::int64_t dim, int lanes, const float* q, const float* w,
                   const double* key) {
  const double u = std::ldexp(1.0, -24) * 1.01;
  int lg = 0;
  while ((1 << lg) < lanes) ++lg;
  const double dot_steps = static_cast<double>((dim + lanes - 1) / lanes + lg + 1);
  double dot_err = 0.0, head_abs = 0.0;
  for (std::int64_t h = 0; h < H; ++h) {
    double dot = 0.0, mag = 0.0;
    for (std::int64_t i = 0; i < dim; ++i) {
      const double x = static_cast<double>(q[h * dim + i]) * key[i];
      dot += x;
      mag += std::abs(x);
    }
    dot_err += std::abs(static_cast<double>(w[h])) * dot_steps * u * mag;
    head_abs += std::abs(static_cast<double>(w[h]) * std::max(dot, 0.0));
  }
  return dot_err * (1.0 + 1e-6) + static_cast<double>(H + 1) * u * head_abs + 1e-38;
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
      const float* qi = q.data() + i * c.H * c.dim;
      const float* wi = w.data() + i * c.H;
      const auto ref = reference_scores<T>(c.H, c.dim, qi, wi, keys, J);
      std::vector<double> bound(static_cast<std::size_t>(J)), key(static_cast<std::size_t>(c.dim));
      double tol = 0.0;  // the largest bound: the set check's slack
      for (std::int64_t j = 0; j < J; ++j) {
        for (std::int64_t x = 0; x < c.dim; ++x)
          key[static_cast<std::size_t>(x)] =
              dsv4t::val(keys[static_cast<std::size_t>(j * c.dim + x)]);
        bound[static_cast<std::size_t>(j)] =
            score_bound(c.H, c.dim, lanes_of<cpu::arch::Auto>(), qi, wi, key.data());
        tol = std::max(tol, bound[static_cast<std::size_t>(j)]);
      }
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
        EXPECT_NEAR(srow[r], ref[static_cast<std::size_t>(row[r])],
                    bound[static_cast<std::size_t>(row[r])]);
        if (r > 0) {  // descending, ties to the lower index (on the kernel's own scores)
          EXPECT_TRUE(srow[r - 1] > srow[r] || (srow[r - 1] == srow[r] && row[r - 1] < row[r]));
        }
      }
      // the selected set is the top m up to rounding (twice the largest bound)
      double worst_in = std::numeric_limits<double>::infinity(), best_out = -worst_in;
      for (std::int64_t j = 0; j < J; ++j) {
        const double s = ref[static_cast<std::size_t>(j)];
        if (chosen[static_cast<std::size_t>(j)])
          worst_in = std::min(worst_in, s);
        else
          best_out = std::max(best_out, s);
      }
      EXPECT_GE(worst_in, best_out - 2 * tol) << "query " << i;
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

// Every build against the float64 reference on awkward sizes: dims 56, 64, 128; 1, 3, 64
// heads; 0, 1, 7, 97, 1000 visible entries (k = 50: padding where fewer are visible);
// outputs poisoned first. Each score lies within the f32 bound of the kernel's order, the
// ranks descend (ties to the lower index), nothing left out beats something kept beyond the
// bounds, and a second call gives the same bits.
TYPED_TEST(Indexer, EveryBuildMatchesReferenceOnAwkwardSizes) {
  using T = TypeParam;
  for_each_arch([&](auto tag) {
    using A = decltype(tag);
    const int lanes = lanes_of<A>();
    std::uint32_t seed = 900;
    for (std::int64_t dim : {56, 64, 128})
      for (std::int64_t H : {1, 3, 64})
        for (std::int64_t J : {0, 1, 7, 97, 1000}) {
          const std::string what = std::string(A::name) + " dim " + std::to_string(dim) +
                                   " heads " + std::to_string(H) + " entries " + std::to_string(J);
          const std::int64_t k = 50, stride = dim + 3;  // rows with a gap between them
          const auto keys =
              dsv4t::random_values<T>(static_cast<std::size_t>((J + 1) * stride), ++seed);
          const auto q = dsv4t::random_values<float>(static_cast<std::size_t>(H * dim), ++seed);
          auto w = dsv4t::random_values<float>(static_cast<std::size_t>(H), ++seed);
          w[0] = -std::abs(w[0]);  // one negative weight: scores of both signs
          const dsv4::IndexerParams p{H, dim, k, Geometry(2, 2)};  // J(2J + 1) = J
          std::vector<std::int32_t> idx(static_cast<std::size_t>(k), -7);
          std::vector<float> sc(idx.size(), std::numeric_limits<float>::quiet_NaN());
          dsv4::indexer_decode<T, A>(p, q.data(), w.data(), keys.data(), J + 1, stride, 2 * J + 1,
                                     idx.data(), sc.data());
          std::vector<double> ref(static_cast<std::size_t>(J)), bound(ref.size());
          std::vector<double> key(static_cast<std::size_t>(dim));
          for (std::int64_t j = 0; j < J; ++j) {
            for (std::int64_t i = 0; i < dim; ++i)
              key[static_cast<std::size_t>(i)] =
                  dsv4t::val(keys[static_cast<std::size_t>(j * stride + i)]);
            double s = 0.0;
            for (std::int64_t h = 0; h < H; ++h) {
              double dot = 0.0;
              for (std::int64_t i = 0; i < dim; ++i)
                dot += static_cast<double>(q[static_cast<std::size_t>(h * dim + i)]) *
                       key[static_cast<std::size_t>(i)];
              s += static_cast<double>(w[static_cast<std::size_t>(h)]) * std::max(dot, 0.0);
            }
            ref[static_cast<std::size_t>(j)] = s;
            bound[static_cast<std::size_t>(j)] =
                score_bound(H, dim, lanes, q.data(), w.data(), key.data());
          }
          const std::int64_t m = std::min(J, k);
          std::vector<bool> kept(static_cast<std::size_t>(J), false);
          double floor_kept = std::numeric_limits<double>::infinity();
          for (std::int64_t r = 0; r < k; ++r) {
            const std::int32_t j = idx[static_cast<std::size_t>(r)];
            const float s = sc[static_cast<std::size_t>(r)];
            if (r >= m) {
              EXPECT_EQ(j, -1) << what << " rank " << r;
              EXPECT_TRUE(std::isinf(s) && s < 0) << what << " rank " << r;
              continue;
            }
            ASSERT_TRUE(j >= 0 && j < J) << what << " rank " << r << ": " << j;
            ASSERT_FALSE(kept[static_cast<std::size_t>(j)]) << what << ": " << j << " twice";
            kept[static_cast<std::size_t>(j)] = true;
            const double e = std::abs(static_cast<double>(s) - ref[static_cast<std::size_t>(j)]);
            EXPECT_LE(e, bound[static_cast<std::size_t>(j)]) << what << " entry " << j;
            floor_kept = std::min(
                floor_kept, ref[static_cast<std::size_t>(j)] + bound[static_cast<std::size_t>(j)]);
            if (r > 0) {
              const float sp = sc[static_cast<std::size_t>(r - 1)];
              EXPECT_TRUE(sp > s || (sp == s && idx[static_cast<std::size_t>(r - 1)] < j))
                  << what << " rank " << r;
            }
          }
          for (std::int64_t j = 0; j < J; ++j) {
            if (kept[static_cast<std::size_t>(j)]) continue;
            EXPECT_LE(ref[static_cast<std::size_t>(j)] - bound[static_cast<std::size_t>(j)],
                      floor_kept)
                << what << ": entry " << j << " left out";
          }
          std::vector<std::int32_t> again(idx.size(), -7);
          std::vector<float> again_s(idx.size(), std::numeric_limits<float>::quiet_NaN());
          dsv4::indexer_decode<T, A>(p, q.data(), w.data(), keys.data(), J + 1, stride, 2 * J + 1,
                                     again.data(), again_s.data());
          EXPECT_EQ(again, idx) << what;
          EXPECT_EQ(0, std::memcmp(again_s.data(), sc.data(), sc.size() * sizeof(float))) << what;
        }
  });
}

// Exact ties on every build: small integers make every product and sum exact in f32, so each
// build reproduces the reference order exactly, duplicates by index, zero scores (ReLU) last.
TEST(Indexer, EveryBuildBreaksExactTiesToTheLowerIndex) {
  for_each_arch([&](auto tag) {
    using A = decltype(tag);
    for (std::int64_t dim : {19, 64, 70}) {
      const std::int64_t H = 5, nk = 61, k = 20;
      std::mt19937 rng(static_cast<std::uint32_t>(dim));
      std::uniform_int_distribution<int> small(-3, 3);
      std::vector<float> keys(static_cast<std::size_t>(nk * dim));
      for (std::int64_t j = 0; j < nk; ++j)
        for (std::int64_t i = 0; i < dim; ++i)
          keys[static_cast<std::size_t>(j * dim + i)] =
              j % 3 == 2 ? keys[static_cast<std::size_t>((j - 1) * dim + i)]
                         : static_cast<float>(small(rng));
      std::vector<float> q(static_cast<std::size_t>(H * dim)), w = {1.0f, 0.5f, 2.0f, 0.25f, 1.0f};
      for (auto& x : q) x = static_cast<float>(small(rng));
      const auto ref = reference_scores<float>(H, dim, q.data(), w.data(), keys, nk);
      const auto order = reference_order(ref);
      const dsv4::IndexerParams p{H, dim, k, Geometry(1, 1)};
      std::vector<std::int32_t> idx(static_cast<std::size_t>(k), -7);
      std::vector<float> sc(idx.size());
      dsv4::indexer_decode<float, A>(p, q.data(), w.data(), keys.data(), nk, dim, nk, idx.data(),
                                     sc.data());
      for (std::int64_t r = 0; r < k; ++r) {
        EXPECT_EQ(idx[static_cast<std::size_t>(r)], order[static_cast<std::size_t>(r)])
            << A::name << " dim " << dim << " rank " << r;
        EXPECT_EQ(static_cast<double>(sc[static_cast<std::size_t>(r)]),
                  ref[static_cast<std::size_t>(order[static_cast<std::size_t>(r)])])
            << A::name << " dim " << dim << " rank " << r;
      }
    }
  });
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
