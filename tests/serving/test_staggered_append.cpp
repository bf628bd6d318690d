// Batched streaming compression with per-KV-head origins (PagedAppendArgs::origins): B
// sequences, each at its own length, appended in rounds of ragged chunks through paged_append
// and through AppendPlan's runs, against one CompressedCache with these origins per sequence
// (same bits per head), for every built-in policy and f32/bf16/f16, all-raw and ring storage.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "compress/compress_test_util.hpp"
#include "compress/gated_reference.hpp"
#include "phasekv/compress/fixed_gates.hpp"
#include "phasekv/compress/max_pool.hpp"
#include "phasekv/compress/offset_select.hpp"
#include "phasekv/compress/compressed_cache.hpp"
#include "phasekv/phase/origins.hpp"
#include "phasekv/compress/uniform_mean.hpp"
#include "append_case.hpp"
#include "phasekv/serving/append_run.hpp"
#include "phasekv/serving/paged_append.hpp"

namespace {

using i64 = std::int64_t;

// Per-head origins, the rounds alternately through paged_append and AppendPlan.
template <class T, class KP, class VP>
void append_equals_cache(const KP& kp, const VP& vp, const std::vector<i64>& origins, i64 local,
                         i64 page, bool ring, std::mt19937_64& rng, const std::string& what,
                         i64 max_chunk = -1) {
  pac::append_equals_cache<T>(kp, vp, static_cast<i64>(origins.size()), origins, local, page, ring,
                              rng, what, max_chunk, pac::AppendBy::alternate);
}

template <class T>
class StaggeredPagedAppend : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, phasekv::bf16_t, phasekv::f16_t>;
TYPED_TEST_SUITE(StaggeredPagedAppend, ElementTypes);

// Head dims where the policies' row kernels apply (d a multiple of 32, W = 2S for the run
// kernels) and chunks of up to 300 tokens: each head's windows inside a chunk go through the
// window loop as a HeadPolicy, one call per entry page (pages of 16 and 5 entries).
TYPED_TEST(StaggeredPagedAppend, FastPathsPerHeadAndPageEqualTheCacheWithOrigins) {
  using T = TypeParam;
  std::mt19937_64 rng(191 + sizeof(T));
  const phasekv::Geometry g(8, 4, 0);
  const std::vector<i64> o{0, 3, 1, 6};
  for (const i64 page : {i64{16}, i64{5}}) {
    const i64 H = static_cast<i64>(o.size()), d = page == 16 ? 64 : 96;
    const std::string where = "P" + std::to_string(page);
    append_equals_cache<T>(phasekv::UniformMean(g, d), phasekv::UniformMean(g, d), o, 10, page,
                           true, rng, "UniformMean " + where, 300);
    const auto pk = pkv_test::GatedParams::random(rng, g, H, d, d, phasekv::GateKind::scalar, true,
                                                  true, false);
    append_equals_cache<T>(pk.policy(), phasekv::MaxPool(g, d), o, 10, page, false, rng,
                           "GatedPool/MaxPool " + where, 300);
  }
}

TYPED_TEST(StaggeredPagedAppend, EqualsTheCacheWithOriginsForEveryPolicy) {
  using T = TypeParam;
  std::mt19937_64 rng(91 + sizeof(T));
  const phasekv::Geometry geos[] = {phasekv::Geometry(8, 4, 0), phasekv::Geometry(4, 4, 0),
                                    phasekv::Geometry(3, 5, 0)};
  const std::vector<i64> origin_sets[] = {{0, 1, 2}, {5, 0, 11}, {2, 0, 7}};
  int k = 0;
  for (const phasekv::Geometry& g : geos) {
    const std::vector<i64>& o = origin_sets[k];
    const i64 H = static_cast<i64>(o.size()), dk = 8, dv = 6, local = k == 1 ? 0 : 6;
    const i64 page = k == 0 ? 16 : (k == 1 ? 1 : 3);
    const bool ring = k != 1;
    std::string where = "W" + std::to_string(g.window()) + "S" + std::to_string(g.stride()) + " P" +
                        std::to_string(page) + (ring ? " ring" : " all") + " O";
    for (i64 x : o) where += "," + std::to_string(x);
    append_equals_cache<T>(phasekv::UniformMean(g, dk), phasekv::UniformMean(g, dv), o, local, page,
                           ring, rng, "UniformMean " + where);
    append_equals_cache<T>(phasekv::MaxPool(g, dk), phasekv::UniformMean(g, dv), o, local, page,
                           ring, rng, "MaxPool " + where);
    append_equals_cache<T>(phasekv::OffsetSelect(g, dk, 1 % g.window()),
                           phasekv::OffsetSelect(g, dv, 2 % g.window()), o, local, page, ring, rng,
                           "OffsetSelect " + where);
    const auto pk = pkv_test::GatedParams::random(rng, g, H, dk, dk, phasekv::GateKind::scalar,
                                                  true, true, true);
    const auto pv = pkv_test::GatedParams::random(rng, g, H, dv, dv, phasekv::GateKind::vector,
                                                  true, true, false);
    append_equals_cache<T>(pk.policy(), pv.policy(), o, local, page, ring, rng,
                           "GatedPool " + where);
    std::vector<float> w(static_cast<std::size_t>(H * g.window()));
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.1f + 0.05f * static_cast<float>(i);
    append_equals_cache<T>(phasekv::FixedGates(g, dk, H, w.data()),
                           phasekv::FixedGates(g, dv, H, w.data()), o, local, page, ring, rng,
                           "FixedGates " + where);
    ++k;
  }
}

// Equal zero origins give the bits of no origins (same pages written), through paged_append and
// through AppendPlan.
TEST(StaggeredPagedAppendUniform, ZeroOriginsArePagedAppend) {
  const phasekv::Geometry g(4, 2, 0);
  const phasekv::UniformMean p(g, 4);
  std::vector<float> pool1(16 * 4 * 2 * 8, 0.5f), pool2 = pool1;
  const std::int32_t rptr[] = {0, 3, 6}, rind[] = {0, 1, 2, 3, 4, 5};
  const std::int32_t eptr[] = {0, 2, 4}, eind[] = {6, 7, 8, 9};
  const std::int64_t len[] = {2, 0};
  const std::int32_t indptr[] = {0, 9, 19};
  std::vector<float> k(19 * 2 * 4), v(19 * 2 * 4);
  for (std::size_t i = 0; i < k.size(); ++i)
    k[i] = 0.01f * static_cast<float>(i), v[i] = -0.02f * static_cast<float>(i);
  phasekv::PagedAppendArgs<float> a;
  a.raw_table = phasekv::csr_block_table(rptr, rind, 2);
  a.entry_table = phasekv::csr_block_table(eptr, eind, 2);
  a.lengths = len;
  a.batch = 2;
  a.new_indptr = indptr;
  a.keys = phasekv::make_view<const float>(k.data(), 19, 2, 4);
  a.values = phasekv::make_view<const float>(v.data(), 19, 2, 4);
  a.raw_pool = a.entry_pool = phasekv::make_kv_page_pool(pool1.data(), 16, 4, 2, 4, 4);
  phasekv::paged_append(p, p, 0, a);
  a.raw_pool = a.entry_pool = phasekv::make_kv_page_pool(pool2.data(), 16, 4, 2, 4, 4);
  const std::vector<i64> zero{0, 0};
  a.origins = zero.data();
  phasekv::paged_append(p, p, 0, a);
  EXPECT_EQ(pool1, pool2);
  std::vector<float> pool3(pool1.size(), 0.5f);
  a.raw_pool = a.entry_pool = phasekv::make_kv_page_pool(pool3.data(), 16, 4, 2, 4, 4);
  phasekv::AppendPlan plan;
  plan.plan(p, p, 0, a, 2);
  std::vector<unsigned char> ws(plan.workspace_bytes());
  phasekv::paged_append_run(plan, p, p, 0, a, ws.data(), ws.size());
  EXPECT_EQ(pool1, pool3);
  // a run without the planned origins is refused
  a.origins = nullptr;
  EXPECT_THROW(phasekv::paged_append_run(plan, p, p, 0, a, ws.data(), ws.size()),
               phasekv::invalid_argument);
}

// Bad origins, a policy with its own origin, and an entry table sized for the largest
// origin's J instead of the smallest: clear errors, nothing written.
TEST(StaggeredPagedAppendErrors, RefusedBeforeAnythingIsWritten) {
  const phasekv::Geometry g(4, 2, 0);
  const phasekv::UniformMean p(g, 4);
  std::vector<float> pool(8 * 4 * 2 * 8, 0.5f);
  auto P = phasekv::make_kv_page_pool(pool.data(), 8, 4, 2, 4, 4);
  // sequence 1 appends 9 tokens: 9 raw slots (3 pages); J(9) = 3 entries for origin 0 (1 page)
  const std::int32_t rptr[] = {0, 1, 4}, rind[] = {0, 1, 2, 3};
  const std::int32_t eptr[] = {0, 0, 1}, eind[] = {7};
  const std::int64_t len[] = {2, 0};
  const std::int32_t indptr[] = {0, 1, 10};
  std::vector<float> k(10 * 2 * 4, 1.0f), v(10 * 2 * 4, 2.0f);
  phasekv::PagedAppendArgs<float> a;
  a.raw_pool = P;
  a.entry_pool = P;
  a.raw_table = phasekv::csr_block_table(rptr, rind, 2);
  a.entry_table = phasekv::csr_block_table(eptr, eind, 2);
  a.lengths = len;
  a.batch = 2;
  a.new_indptr = indptr;
  a.keys = phasekv::make_view<const float>(k.data(), 10, 2, 4);
  a.values = phasekv::make_view<const float>(v.data(), 10, 2, 4);
  const std::vector<float> before = pool;
  const auto expect_refused = [&](const std::vector<i64>& origins, const auto& kp,
                                  const std::string& piece) {
    a.origins = origins.data();
    try {
      phasekv::paged_append(kp, kp, 0, a);
      ADD_FAILURE() << "accepted; expected " << piece;
    } catch (const phasekv::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(piece), std::string::npos) << e.what();
    }
    EXPECT_EQ(pool, before) << piece;
  };
  expect_refused({0, -3}, p, "origins[1]");
  expect_refused({0, i64{1} << 41}, p, "origins[1]");
  expect_refused({0, 1}, phasekv::UniformMean(phasekv::Geometry(4, 2, 1), 4),
                 "key_policy.geometry().origin()");
  // sequence 1 needs max_h J_h(9) = 3 entries (head 1, origin 0): one entry page
  const std::int32_t eptr0[] = {0, 0, 0};
  a.entry_table = phasekv::csr_block_table(eptr0, eind, 2);
  expect_refused({3, 0}, p, "entry_table pages of sequence 1");
  a.entry_table = phasekv::csr_block_table(eptr, eind, 2);
  const std::vector<i64> ok{3, 0};
  a.origins = ok.data();
  EXPECT_NO_THROW(phasekv::paged_append(p, p, 0, a));
  EXPECT_NE(pool, before);
}

}  // namespace
