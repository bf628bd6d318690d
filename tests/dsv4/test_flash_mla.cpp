// dsv4::flash_mla_with_kvcache (FlashMLA's sparse decode arguments on the CPU) against a float64
// reference written from FlashMLA's definition (two caches, block * P + offset indices with -1,
// topk_length, sinks outside the lse, lonely queries: out 0, lse +inf), for bf16 and MODEL1
// caches on every build; bad indices refused by name before anything is written.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "dsv4_builds.hpp"
#include "dsv4_flash_mla_cache.hpp"
#include "dsv4_format_ref.hpp"
#include "dsv4_test_util.hpp"
#include "phasekv/dsv4/flash_mla.hpp"

namespace {

namespace dsv4 = phasekv::dsv4;
using dsv4t::Cache;
using dsv4t::random_indices;
using phasekv::bf16_t;
using phasekv::model1_fp8_t;
using i64 = std::int64_t;

template <class T>
void expect_matches_reference(i64 d) {
  const i64 B = 3, s_q = 2, H = 5, dv = d > 448 ? 448 : d - 16, topk = 11, etopk = 5;
  Cache<T> c0(6, 7, d, 41), c1(4, 3, d, 42);
  std::mt19937 rng(43);
  const auto idx = random_indices(rng, B * s_q * topk, topk, 6 * 7);
  auto eidx = random_indices(rng, B * s_q * etopk, etopk, 4 * 3);
  const std::vector<std::int32_t> tl = {11, 0, 7}, etl = {5, 0, 2};
  for (i64 k = 0; k < 2; ++k) eidx[static_cast<std::size_t>((2 * s_q + 1) * etopk + 2 + k)] = 99;
  // (beyond extra_topk_length[2] = 2: never read, never checked)
  const auto q = dsv4t::random_values<float>(static_cast<std::size_t>(B * s_q * H * d), 44, 0.3f);
  const auto sink = dsv4t::random_values<float>(static_cast<std::size_t>(H), 45);
  dsv4::FlashMlaArgs<T> a;
  a.q = q.data();
  a.batch = B;
  a.s_q = s_q;
  a.h_q = H;
  a.head_dim = d;
  a.k_cache = c0.view;
  a.head_dim_v = dv;
  a.softmax_scale = 0.0f;
  a.indices = idx.data();
  a.topk = topk;
  a.attn_sink = sink.data();
  a.extra_k_cache = c1.view;
  a.extra_indices_in_kvcache = eidx.data();
  a.extra_topk = etopk;
  a.topk_length = tl.data();
  a.extra_topk_length = etl.data();
  dsv4t::for_each_build([&](auto tag) {
    using A = decltype(tag);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> out(static_cast<std::size_t>(B * s_q * H * dv), nan),
        lse(static_cast<std::size_t>(B * H * s_q), nan);
    a.out = out.data();
    a.lse = lse.data();
    dsv4::flash_mla_with_kvcache<T, A>(a);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    for (i64 b = 0; b < B; ++b)
      for (i64 i = 0; i < s_q; ++i) {
        std::vector<const float*> rows;
        for (i64 k = 0; k < tl[static_cast<std::size_t>(b)]; ++k) {
          const i64 j = idx[static_cast<std::size_t>((b * s_q + i) * topk + k)];
          if (j >= 0) rows.push_back(c0.rows.data() + j * d);
        }
        for (i64 k = 0; k < etl[static_cast<std::size_t>(b)]; ++k) {
          const i64 j = eidx[static_cast<std::size_t>((b * s_q + i) * etopk + k)];
          if (j >= 0) rows.push_back(c1.rows.data() + j * d);
        }
        for (i64 h = 0; h < H; ++h) {
          const float* qq = q.data() + ((b * s_q + i) * H + h) * d;
          std::vector<double> s(rows.size());
          double m = -HUGE_VAL;
          for (std::size_t r = 0; r < rows.size(); ++r) {
            double dot = 0;
            for (i64 x = 0; x < d; ++x) dot += double(qq[x]) * rows[r][x];
            s[r] = scale * dot;
            m = std::max(m, s[r]);
          }
          double den = 0;
          for (double v : s) den += std::exp(v - m);
          const double l = rows.empty() ? HUGE_VAL : m + std::log(den);
          const double f =
              rows.empty() ? 0.0 : 1.0 / (1.0 + std::exp(sink[static_cast<std::size_t>(h)] - l));
          const float gl = lse[static_cast<std::size_t>((b * H + h) * s_q + i)];
          if (rows.empty())
            EXPECT_TRUE(std::isinf(gl) && gl > 0) << A::name << " " << b << " " << i;
          else
            EXPECT_NEAR(gl, l, 2e-5 * std::max(1.0, std::abs(l))) << A::name;
          double err = 0, mag = 0;
          for (i64 x = 0; x < dv; ++x) {
            double o = 0;
            for (std::size_t r = 0; r < rows.size(); ++r) o += std::exp(s[r] - l) * rows[r][x];
            o *= f;
            const double g = out[static_cast<std::size_t>(((b * s_q + i) * H + h) * dv + x)];
            ASSERT_TRUE(std::isfinite(g)) << A::name;
            err = std::max(err, std::abs(g - o));
            mag = std::max(mag, std::abs(o));
          }
          EXPECT_LE(err, 2e-5 * std::max(mag, 1e-3)) << A::name << " b " << b << " i " << i;
        }
      }
  });
}

TEST(FlashMla, Bf16CacheMatchesReference) { expect_matches_reference<bf16_t>(96); }
TEST(FlashMla, Model1CacheMatchesReference) { expect_matches_reference<model1_fp8_t>(512); }

TEST(FlashMla, RefusesBadArgumentsByNameAndWritesNothing) {
  Cache<bf16_t> c0(2, 4, 16, 51);
  const std::vector<std::int32_t> idx = {0, 7, -1, 3, 8, 1};  // 8 is outside 2 blocks of 4
  const std::vector<float> q(static_cast<std::size_t>(2 * 16), 1.0f);
  std::vector<float> out(static_cast<std::size_t>(2 * 16), -7.0f), lse(2, -7.0f);
  dsv4::FlashMlaArgs<bf16_t> a;
  a.q = q.data();
  a.batch = 2;
  a.s_q = 1;
  a.h_q = 1;
  a.head_dim = a.head_dim_v = 16;
  a.k_cache = c0.view;
  a.indices = idx.data();
  a.topk = 3;
  a.out = out.data();
  a.lse = lse.data();
  auto error = [&](const dsv4::FlashMlaArgs<bf16_t>& x) -> std::string {
    try {
      dsv4::flash_mla_with_kvcache(x);
    } catch (const phasekv::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error(a).find("indices[1][0][1] = 8"), std::string::npos) << error(a);
  const std::vector<std::int32_t> tl = {3, 4};
  auto b = a;
  b.topk_length = tl.data();
  EXPECT_NE(error(b).find("topk_length[1] = 4"), std::string::npos) << error(b);
  b = a;
  b.k_cache.block_stride = 60;
  EXPECT_NE(error(b).find("k_cache.block_stride = 60"), std::string::npos) << error(b);
  b = a;
  b.extra_topk_length = tl.data();  // lengths of an extra cache that is not there
  EXPECT_NE(error(b).find("extra_k_cache.data = null"), std::string::npos) << error(b);
  b = a;
  b.head_dim_v = 17;
  EXPECT_NE(error(b).find("head_dim_v = 17"), std::string::npos) << error(b);
  for (float x : out) ASSERT_EQ(x, -7.0f);
  for (float x : lse) ASSERT_EQ(x, -7.0f);
  const std::vector<std::int32_t> tl2 = {3, 0};  // the bad index is past topk_length: not read
  b = a;
  b.topk_length = tl2.data();
  EXPECT_EQ(error(b), "");
  EXPECT_TRUE(std::isinf(lse[1]) && lse[1] > 0);
  for (std::int64_t x = 16; x < 32; ++x) EXPECT_EQ(out[static_cast<std::size_t>(x)], 0.0f);
}

}  // namespace
