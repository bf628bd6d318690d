// Sparse attention over (selected compressed entries) + (sliding window) against a float64
// reference, for f32, bf16, f16 and FP8 E4M3 with per-tensor scales; outputs poisoned first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "dsv4_attention_ref.hpp"
#include "dsv4_builds.hpp"
#include "dsv4_test_util.hpp"
#include "phasekv/attention/cpu/dispatch.hpp"
#include "phasekv/dsv4/fp8.hpp"
#include "phasekv/dsv4/sparse_attention.hpp"

namespace {

using phasekv::bf16_t;
using phasekv::f16_t;
using phasekv::fp8_e4m3_t;
namespace dsv4 = phasekv::dsv4;
namespace cpu = phasekv::cpu;
using dsv4t::random_rows;
using dsv4t::reference;

struct Case {
  std::int64_t heads, dim, dim_v, window, k;
  std::int64_t entries, first, queries;
  bool sinks, list;        // list: index lists (with -1 padding and a repeat-free random choice)
  std::int64_t ratio = 0;  // without lists: query t sees the entries below (t + 1) / ratio
};

// Entries query t attends without an index list: those of [0, k) visible at t (ratio > 0).
std::int64_t hca_count(const Case& c, std::int64_t k, std::int64_t t) {
  return c.ratio > 0 ? std::min(k, (t + 1) / c.ratio) : k;
}

template <class T>
class SparseAttention : public ::testing::Test {};
using Types = ::testing::Types<float, bf16_t, f16_t, fp8_e4m3_t>;
TYPED_TEST_SUITE(SparseAttention, Types);

// The cases below with build `Arch` against the float64 reference; outputs poisoned first.
template <class T, class Arch>
void expect_matches_reference(const std::vector<Case>& cases) {
  const bool fp8 = std::is_same<T, fp8_e4m3_t>::value;
  std::uint32_t seed = 900;
  std::mt19937 rng(1);
  for (const Case& c : cases) {
    const std::string what = std::string(Arch::name) + " heads " + std::to_string(c.heads) + " d " +
                             std::to_string(c.dim) + " dv " + std::to_string(c.dim_v);
    const float raw_scale = fp8 ? 0.0625f : 1.0f, ent_scale = fp8 ? 0.03f : 1.0f;
    const std::int64_t n = c.first + c.queries;
    const auto raw = random_rows<T>(n, c.dim, ++seed, raw_scale);
    const auto ent = random_rows<T>(c.entries, c.dim, ++seed, ent_scale);
    const auto q =
        dsv4t::random_values<float>(static_cast<std::size_t>(c.queries * c.heads * c.dim), ++seed);
    const auto sinks = dsv4t::random_values<float>(static_cast<std::size_t>(c.heads), ++seed, 2.0f);
    std::vector<std::int32_t> idx(static_cast<std::size_t>(c.queries * c.k), -1);
    for (std::int64_t i = 0; i < c.queries; ++i) {
      std::vector<std::int32_t> all(static_cast<std::size_t>(c.entries));
      for (std::int64_t j = 0; j < c.entries; ++j)
        all[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(j);
      std::shuffle(all.begin(), all.end(), rng);
      const std::int64_t take = std::min<std::int64_t>(c.k - (i % 3), c.entries);  // some -1
      for (std::int64_t r = 0; r < take; ++r)
        idx[static_cast<std::size_t>(i * c.k + r)] = all[static_cast<std::size_t>(r)];
    }
    dsv4::SparseAttentionParams p;
    p.heads = c.heads;
    p.dim = c.dim;
    p.dim_v = c.dim_v;
    p.window = c.window;
    p.scale = 1.0f / std::sqrt(static_cast<float>(c.dim));
    p.sinks = c.sinks ? sinks.data() : nullptr;
    dsv4::LatentRows<T> rr{raw.data(), 0, n, c.dim, raw_scale};
    dsv4::LatentRows<T> er{ent.data(), 0, c.entries, c.dim, ent_scale};
    const std::int64_t kk = c.list ? c.k : std::min(c.k, c.entries);
    const std::int32_t* list = c.list ? idx.data() : nullptr;
    std::vector<float> out(static_cast<std::size_t>(c.queries * c.heads * c.dim_v),
                           std::numeric_limits<float>::quiet_NaN());
    std::vector<float> lse(static_cast<std::size_t>(c.queries * c.heads),
                           std::numeric_limits<float>::quiet_NaN());
    dsv4::sparse_attention<T, Arch>(p, q.data(), rr, er, list, kk, c.first, c.queries, out.data(),
                                    lse.data(), c.ratio);
    for (std::int64_t i = 0; i < c.queries; ++i) {
      std::vector<double> ro(static_cast<std::size_t>(c.heads * c.dim_v)),
          rl(static_cast<std::size_t>(c.heads));
      reference<T>(p, q.data() + i * c.heads * c.dim, rr, er, list ? list + i * kk : nullptr,
                   list ? kk : hca_count(c, kk, c.first + i), c.first + i, ro.data(), rl.data());
      for (std::int64_t h = 0; h < c.heads; ++h) {
        double err = 0.0, mag = 0.0;
        for (std::int64_t x = 0; x < c.dim_v; ++x) {
          const double o = out[static_cast<std::size_t>((i * c.heads + h) * c.dim_v + x)];
          ASSERT_TRUE(std::isfinite(o)) << what;
          err = std::max(err, std::abs(o - ro[static_cast<std::size_t>(h * c.dim_v + x)]));
          mag = std::max(mag, std::abs(ro[static_cast<std::size_t>(h * c.dim_v + x)]));
        }
        // inputs are exact in T, so only f32 arithmetic errs: dot products of dim terms
        EXPECT_LE(err, 2e-5 * std::max(mag, 1e-3)) << what << " query " << i << " head " << h;
        const double l = lse[static_cast<std::size_t>(i * c.heads + h)];
        EXPECT_NEAR(l, rl[static_cast<std::size_t>(h)],
                    2e-5 * std::max(1.0, std::abs(rl[static_cast<std::size_t>(h)])))
            << what;
      }
    }
    // one query alone gives the same bits as its row of the batch
    std::vector<float> o1(static_cast<std::size_t>(c.heads * c.dim_v)),
        l1(static_cast<std::size_t>(c.heads));
    const std::int64_t last = c.queries - 1;
    dsv4::sparse_attention<T, Arch>(p, q.data() + last * c.heads * c.dim, rr, er,
                                    list ? list + last * kk : nullptr, kk, c.first + last, 1,
                                    o1.data(), l1.data(), c.ratio);
    for (std::size_t x = 0; x < o1.size(); ++x)
      ASSERT_EQ(o1[x], out[static_cast<std::size_t>(last * c.heads * c.dim_v) + x]) << what;
  }
}

TYPED_TEST(SparseAttention, MatchesReference) {
  using T = TypeParam;
  const std::vector<Case> cases = {
      {5, 40, 40, 4, 6, 9, 0, 12, true, true},          // window clipped at 0, padding
      {64, 512, 512, 128, 16, 40, 150, 2, true, true},  // V4-Flash decode shape, smaller k
      {16, 576, 512, 7, 5, 12, 20, 3, false, true},     // 576-wide rows, value = first 512
      {128, 64, 64, 16, 8, 30, 40, 2, true, true},      // 128 heads on one latent
      {3, 33, 17, 0, 6, 6, 30, 1, true, false},         // HCA: every entry, no window
      {7, 24, 24, 5, 4, 10, 9, 4, false, false, 3},     // HCA chunk: 3, 3, 4, 4 entries
      {4, 40, 40, 6, 9, 9, 11, 9, true, false, 2},      // HCA chunk: 6 .. 9 entries (capped)
  };
  expect_matches_reference<T, cpu::arch::Auto>(cases);
}

// Every build this CPU runs (scalar, AVX2, AVX-512; NEON on AArch64) on awkward sizes: 1, 3 and
// 64 heads; dims 56, 64, 128 (value widths 56, 40, 100); 0, 1, 7 and 97 selected entries
// (partial blocks of 16 rows, several blocks), windows 0, 1, 9, 40.
TYPED_TEST(SparseAttention, EveryBuildMatchesReference) {
  using T = TypeParam;
  const std::vector<Case> cases = {
      {1, 56, 56, 9, 7, 20, 30, 2, true, true},         // one head, partial tiles
      {3, 64, 40, 1, 1, 5, 12, 2, false, true},         // 3 heads (padded to 4), one entry
      {64, 128, 100, 40, 97, 120, 200, 1, true, true},  // 97 entries: 7 blocks
      {3, 128, 128, 0, 0, 10, 20, 1, true, false},      // nothing but the sink
      {64, 56, 56, 0, 97, 97, 300, 1, false, false},    // HCA: every entry, no window
  };
  dsv4t::for_each_build([&](auto tag) { expect_matches_reference<T, decltype(tag)>(cases); });
}

// FP8 rows are converted exactly on every build: one query over one raw row holding every
// code but the two NaNs (and a tail past the last full vector) outputs the row itself (weight
// exactly 1; the accumulation turns -0 into +0).
TEST(SparseAttention, EveryBuildConvertsEveryFp8Code) {
  std::vector<fp8_e4m3_t> row;
  for (int b = 0; b < 256; ++b)
    if ((b & 0x7f) != 0x7f) row.push_back(fp8_e4m3_t{static_cast<std::uint8_t>(b)});
  const std::int64_t d = static_cast<std::int64_t>(row.size()) + 3;  // 257: a scalar tail
  row.resize(static_cast<std::size_t>(d), fp8_e4m3_t{0x38});         // 1.0
  dsv4t::for_each_build([&](auto tag) {
    using A = decltype(tag);
    dsv4::SparseAttentionParams p;
    p.heads = 1;
    p.dim = p.dim_v = d;
    p.window = 1;
    p.scale = 0.0f;  // every logit 0
    const std::vector<float> q(static_cast<std::size_t>(d), 1.0f);
    const dsv4::LatentRows<fp8_e4m3_t> rr{row.data(), 0, 1, d, 1.0f}, none{};
    std::vector<float> out(static_cast<std::size_t>(d), std::numeric_limits<float>::quiet_NaN());
    float lse = std::numeric_limits<float>::quiet_NaN();
    dsv4::sparse_attention<fp8_e4m3_t, A>(p, q.data(), rr, none, nullptr, 0, 0, 1, out.data(),
                                          &lse);
    for (std::int64_t i = 0; i < d; ++i) {
      const float want = phasekv::fp8_e4m3_to_float(row[static_cast<std::size_t>(i)]);
      const float got = out[static_cast<std::size_t>(i)];  // -0 comes out as 0 (0 + -0)
      EXPECT_EQ(phasekv::fp_bits(got), phasekv::fp_bits(want == 0.0f ? 0.0f : want))
          << A::name << " code " << int(row[static_cast<std::size_t>(i)].bits);
    }
    EXPECT_EQ(lse, 0.0f) << A::name;
  });
}

// Rows held from an offset (a window buffer holding positions [first, first + count), entries
// numbered from entries.first) give the same bits as the whole tensors.
TEST(SparseAttention, RowsFromAnOffsetEqualTheWholeTensor) {
  const std::int64_t H = 6, d = 48, n = 90, J = 20, k = 7, W = 16, Q = 5;
  const auto raw = random_rows<bf16_t>(n, d, 71, 1.0f);
  const auto ent = random_rows<bf16_t>(J, d, 72, 1.0f);
  const auto q = dsv4t::random_values<float>(static_cast<std::size_t>(Q * H * d), 73);
  std::vector<std::int32_t> idx(static_cast<std::size_t>(Q * k));
  for (std::size_t i = 0; i < idx.size(); ++i)
    idx[i] = static_cast<std::int32_t>(10 + (i * 7) % 10);
  dsv4::SparseAttentionParams p;
  p.heads = H;
  p.dim = p.dim_v = d;
  p.window = W;
  const std::int64_t first = n - Q;
  std::vector<float> o1(static_cast<std::size_t>(Q * H * d)), o2(o1.size()),
      l1(static_cast<std::size_t>(Q * H)), l2(l1.size());
  dsv4::sparse_attention<bf16_t>(p, q.data(), {raw.data(), 0, n, d, 1.0f},
                                 {ent.data(), 0, J, d, 1.0f}, idx.data(), k, first, Q, o1.data(),
                                 l1.data());
  const std::int64_t r0 = first + 1 - W;  // the first windowed position
  dsv4::sparse_attention<bf16_t>(p, q.data(), {raw.data() + r0 * d, r0, n - r0, d, 1.0f},
                                 {ent.data() + 10 * d, 10, J - 10, d, 1.0f}, idx.data(), k, first,
                                 Q, o2.data(), l2.data());
  EXPECT_EQ(o1, o2);
  EXPECT_EQ(l1, l2);
}

// The documented ways to split a call over threads give the same bits: a decode step by heads,
// a prefill by queries.
TEST(SparseAttention, SplitByHeadsOrQueriesGivesTheSameBits) {
  const std::int64_t H = 11, d = 40, n = 60, J = 14, k = 5, Q = 6;
  const auto raw = random_rows<f16_t>(n, d, 81, 1.0f);
  const auto ent = random_rows<f16_t>(J, d, 82, 1.0f);
  const auto q = dsv4t::random_values<float>(static_cast<std::size_t>(Q * H * d), 83);
  const auto sinks = dsv4t::random_values<float>(static_cast<std::size_t>(H), 84);
  std::vector<std::int32_t> idx(static_cast<std::size_t>(Q * k));
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<std::int32_t>((i * 5) % J);
  dsv4::SparseAttentionParams p;
  p.heads = H;
  p.dim = p.dim_v = d;
  p.window = 9;
  p.sinks = sinks.data();
  const dsv4::LatentRows<f16_t> rr{raw.data(), 0, n, d, 1.0f}, er{ent.data(), 0, J, d, 1.0f};
  const std::int64_t first = n - Q;
  std::vector<float> o(static_cast<std::size_t>(Q * H * d)), l(static_cast<std::size_t>(Q * H));
  dsv4::sparse_attention<f16_t>(p, q.data(), rr, er, idx.data(), k, first, Q, o.data(), l.data());
  // by queries: [0, 2) and [2, Q)
  std::vector<float> o2(o.size()), l2(l.size());
  dsv4::sparse_attention<f16_t>(p, q.data(), rr, er, idx.data(), k, first, 2, o2.data(), l2.data());
  dsv4::sparse_attention<f16_t>(p, q.data() + 2 * H * d, rr, er, idx.data() + 2 * k, k, first + 2,
                                Q - 2, o2.data() + 2 * H * d, l2.data() + 2 * H);
  EXPECT_EQ(o, o2);
  EXPECT_EQ(l, l2);
  // the last query by heads: [0, 4), [4, 5), [5, 11)
  const std::int64_t t = Q - 1;
  std::vector<float> o3(static_cast<std::size_t>(H * d)), l3(static_cast<std::size_t>(H));
  for (auto [h0, hn] : {std::pair<std::int64_t, std::int64_t>{0, 4}, {4, 1}, {5, 6}}) {
    auto ph = p;
    ph.heads = hn;
    ph.sinks = sinks.data() + h0;
    dsv4::sparse_attention<f16_t>(ph, q.data() + (t * H + h0) * d, rr, er, idx.data() + t * k, k,
                                  first + t, 1, o3.data() + h0 * d, l3.data() + h0);
  }
  for (std::int64_t i = 0; i < H * d; ++i)
    ASSERT_EQ(o3[static_cast<std::size_t>(i)], o[static_cast<std::size_t>(t * H * d + i)]) << i;
  for (std::int64_t h = 0; h < H; ++h)
    ASSERT_EQ(l3[static_cast<std::size_t>(h)], l[static_cast<std::size_t>(t * H + h)]) << h;
}

// HCA over a prefill chunk without index lists is causal per query: query t sees the entries
// below J(t + 1) = floor((t + 1) / ratio), as the paged call does, and equals the same query
// alone with index_count = J(t + 1); a chunk without the ratio is refused (earlier queries
// would see later entries).
TEST(SparseAttention, HcaChunkIsCausalPerQuery) {
  const std::int64_t H = 4, d = 32, S = 4, p0 = 13, Q = 11;  // J(14) = 3 .. J(24) = 6
  const std::int64_t n = p0 + Q, J = n / S;
  const auto raw = random_rows<float>(n, d, 81, 1.0f);
  const auto ent = random_rows<float>(J, d, 82, 1.0f);
  const auto q = dsv4t::random_values<float>(static_cast<std::size_t>(Q * H * d), 83);
  dsv4::SparseAttentionParams p;
  p.heads = H;
  p.dim = p.dim_v = d;
  p.window = 5;
  const dsv4::LatentRows<float> rr{raw.data(), 0, n, d, 1.0f}, er{ent.data(), 0, J, d, 1.0f};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(static_cast<std::size_t>(Q * H * d), nan), lse(Q * H, nan);
  dsv4::sparse_attention<float>(p, q.data(), rr, er, nullptr, J, p0, Q, out.data(), lse.data(), S);
  for (std::int64_t i = 0; i < Q; ++i) {
    const std::int64_t t = p0 + i;
    std::vector<double> ro(static_cast<std::size_t>(H * d)), rl(static_cast<std::size_t>(H));
    reference<float>(p, q.data() + i * H * d, rr, er, nullptr, (t + 1) / S, t, ro.data(),
                     rl.data());
    for (std::int64_t x = 0; x < H * d; ++x)
      ASSERT_NEAR(out[static_cast<std::size_t>(i * H * d + x)], ro[static_cast<std::size_t>(x)],
                  2e-5)
          << "query " << t << " channel " << x;
    std::vector<float> o1(static_cast<std::size_t>(H * d)), l1(static_cast<std::size_t>(H));
    dsv4::sparse_attention<float>(p, q.data() + i * H * d, rr, er, nullptr, (t + 1) / S, t, 1,
                                  o1.data(), l1.data());
    for (std::int64_t x = 0; x < H * d; ++x)
      ASSERT_EQ(o1[static_cast<std::size_t>(x)], out[static_cast<std::size_t>(i * H * d + x)]);
  }
  std::vector<float> o2(out.size(), -7.0f), l2(lse.size(), -7.0f);
  try {
    dsv4::sparse_attention<float>(p, q.data(), rr, er, nullptr, J, p0, Q, o2.data(), l2.data());
    ADD_FAILURE() << "a chunk without lists and without the ratio was accepted";
  } catch (const phasekv::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("num_queries = 11"), std::string::npos) << e.what();
  }
  for (float x : o2) ASSERT_EQ(x, -7.0f);
  for (float x : l2) ASSERT_EQ(x, -7.0f);
}

TEST(SparseAttention, NothingVisibleGivesZerosAndTheSink) {
  const std::int64_t H = 3, d = 8;
  std::vector<float> q(H * d, 1.0f), ent(4 * d, 1.0f), sinks = {0.5f, -1.0f, 2.0f};
  std::vector<std::int32_t> idx = {-1, -1};
  dsv4::SparseAttentionParams p;
  p.heads = H;
  p.dim = p.dim_v = d;
  p.window = 0;
  dsv4::LatentRows<float> none{};
  dsv4::LatentRows<float> er{ent.data(), 0, 4, d, 1.0f};
  std::vector<float> out(H * d, std::numeric_limits<float>::quiet_NaN()), lse(H, 0.0f);
  dsv4::sparse_attention<float>(p, q.data(), none, er, idx.data(), 2, 10, 1, out.data(),
                                lse.data());
  for (float x : out) EXPECT_EQ(x, 0.0f);
  for (float x : lse) EXPECT_TRUE(std::isinf(x) && x < 0);
  p.sinks = sinks.data();
  dsv4::sparse_attention<float>(p, q.data(), none, er, idx.data(), 2, 10, 1, out.data(),
                                lse.data());
  for (float x : out) EXPECT_EQ(x, 0.0f);
  for (std::int64_t h = 0; h < H; ++h)
    EXPECT_EQ(lse[static_cast<std::size_t>(h)], sinks[static_cast<std::size_t>(h)]);
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

TEST(SparseAttention, RefusesBadArgumentsAndWritesNothing) {
  const std::int64_t H = 2, d = 8;
  std::vector<float> q(H * d, 1.0f), raw(20 * d, 1.0f), ent(4 * d, 1.0f);
  std::vector<std::int32_t> idx = {0, 9};
  dsv4::SparseAttentionParams p;
  p.heads = H;
  p.dim = p.dim_v = d;
  p.window = 4;
  dsv4::LatentRows<float> rr{raw.data(), 0, 20, d, 1.0f};
  dsv4::LatentRows<float> er{ent.data(), 0, 4, d, 1.0f};
  std::vector<float> out(H * d, -7.0f), lse(H, -7.0f);
  EXPECT_NE(error_of([&] {
              dsv4::sparse_attention<float>(p, q.data(), rr, er, idx.data(), 2, 10, 1, out.data(),
                                            lse.data());
            }).find("indices[i] = 9"),
            std::string::npos);
  auto rshift = rr;
  rshift.first = 8;  // window of position 10 starts at 7
  EXPECT_NE(error_of([&] {
              dsv4::sparse_attention<float>(p, q.data(), rshift, er, idx.data(), 1, 10, 1,
                                            out.data(), lse.data());
            }).find("raw.first = 8"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              dsv4::sparse_attention<float>(p, q.data(), rr, er, idx.data(), 1, 20, 1, out.data(),
                                            lse.data());
            }).find("raw.count = 20"),
            std::string::npos);
  auto bad = p;
  bad.dim_v = 9;
  EXPECT_NE(error_of([&] {
              dsv4::sparse_attention<float>(bad, q.data(), rr, er, idx.data(), 1, 10, 1, out.data(),
                                            lse.data());
            }).find("params.dim_v = 9"),
            std::string::npos);
  auto fp = er;
  fp.scale = 0.0f;
  EXPECT_NE(error_of([&] {
              dsv4::sparse_attention<float>(p, q.data(), rr, fp, idx.data(), 1, 10, 1, out.data(),
                                            lse.data());
            }).find("entries.scale = 0"),
            std::string::npos);
  for (float x : out) EXPECT_EQ(x, -7.0f);
  for (float x : lse) EXPECT_EQ(x, -7.0f);
}

}  // namespace
