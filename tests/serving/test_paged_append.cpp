// Batched streaming compression into pages: B sequences, each at its own length, appended in
// rounds of ragged chunks, against one CompressedCache per sequence (same bits), for every
// built-in policy and f32/bf16/f16, all-raw and ring storage, page sizes 1, 3 and 16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "compress/compress_test_util.hpp"
#include "compress/gated_reference.hpp"
#include "phasekv/compress/compressed_cache.hpp"
#include "phasekv/compress/max_pool.hpp"
#include "phasekv/compress/offset_select.hpp"
#include "phasekv/compress/uniform_mean.hpp"
#include "append_case.hpp"
#include "phasekv/serving/append_run.hpp"
#include "phasekv/serving/paged_append.hpp"

namespace {

using i64 = std::int64_t;

// Without origins: paged_append in two parts, or (`planned`) AppendPlan's runs.
template <class T, class KP, class VP>
void append_equals_cache(const KP& kp, const VP& vp, i64 H, i64 local, i64 page, bool ring,
                         std::mt19937_64& rng, const std::string& what, i64 max_chunk = -1,
                         bool planned = false) {
  pac::append_equals_cache<T>(kp, vp, H, {}, local, page, ring, rng, what, max_chunk,
                              planned ? pac::AppendBy::plan : pac::AppendBy::parts);
}

template <class T>
class PagedAppend : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, phasekv::bf16_t, phasekv::f16_t>;
TYPED_TEST_SUITE(PagedAppend, ElementTypes);

TYPED_TEST(PagedAppend, EqualsCompressedCacheForEveryPolicy) {
  using T = TypeParam;
  std::mt19937_64 rng(77 + sizeof(T));
  const phasekv::Geometry geos[] = {phasekv::Geometry(8, 4, 2), phasekv::Geometry(4, 4, 0),
                                    phasekv::Geometry(3, 5, 1)};
  int k = 0;
  for (const phasekv::Geometry& g : geos) {
    const i64 H = 2, dk = 8, dv = 6, local = k == 1 ? 0 : 6;
    const i64 page = k == 0 ? 16 : (k == 1 ? 1 : 3);
    const bool ring = k != 1;
    const std::string where = "W" + std::to_string(g.window()) + "S" + std::to_string(g.stride()) +
                              "O" + std::to_string(g.origin()) + " P" + std::to_string(page) +
                              (ring ? " ring" : " all");
    append_equals_cache<T>(phasekv::UniformMean(g, dk), phasekv::UniformMean(g, dv), H, local, page,
                           ring, rng, "UniformMean " + where);
    append_equals_cache<T>(phasekv::MaxPool(g, dk), phasekv::UniformMean(g, dv), H, local, page,
                           ring, rng, "MaxPool " + where);
    append_equals_cache<T>(phasekv::OffsetSelect(g, dk, 1 % g.window()),
                           phasekv::OffsetSelect(g, dv, 2 % g.window()), H, local, page, ring, rng,
                           "OffsetSelect " + where);
    const auto pk = pkv_test::GatedParams::random(rng, g, H, dk, dk, phasekv::GateKind::scalar,
                                                  true, true, true);
    const auto pv = pkv_test::GatedParams::random(rng, g, H, dv, dv, phasekv::GateKind::vector,
                                                  true, true, false);
    append_equals_cache<T>(pk.policy(), pv.policy(), H, local, page, ring, rng,
                           "GatedPool " + where);
    ++k;
  }
}

// The same through AppendPlan (items split inside chunks, 3 workers, reverse order): the bits
// of CompressedCache for every policy, ring and all-raw storage, pages of 16, 1 and 3 slots,
// and the fast paths (d 64, W = 2S).
TYPED_TEST(PagedAppend, PlanRunEqualsCompressedCache) {
  using T = TypeParam;
  std::mt19937_64 rng(277 + sizeof(T));
  const phasekv::Geometry geos[] = {phasekv::Geometry(8, 4, 2), phasekv::Geometry(4, 4, 0),
                                    phasekv::Geometry(3, 5, 1)};
  int k = 0;
  for (const phasekv::Geometry& g : geos) {
    const i64 H = 2, dk = 8, dv = 6, local = k == 1 ? 0 : 6;
    const i64 page = k == 0 ? 16 : (k == 1 ? 1 : 3);
    const bool ring = k != 1;
    const std::string where = "W" + std::to_string(g.window()) + "S" + std::to_string(g.stride()) +
                              "O" + std::to_string(g.origin()) + " P" + std::to_string(page);
    append_equals_cache<T>(phasekv::MaxPool(g, dk), phasekv::UniformMean(g, dv), H, local, page,
                           ring, rng, "MaxPool " + where, -1, true);
    const auto pk = pkv_test::GatedParams::random(rng, g, H, dk, dk, phasekv::GateKind::scalar,
                                                  true, true, true);
    append_equals_cache<T>(pk.policy(), phasekv::OffsetSelect(g, dv, 1 % g.window()), H, local,
                           page, ring, rng, "GatedPool " + where, -1, true);
    ++k;
  }
  const phasekv::Geometry g(8, 4);
  append_equals_cache<T>(phasekv::UniformMean(g, 64), phasekv::UniformMean(g, 64), 2, 12, 5, true,
                         rng, "UniformMean W8S4 d64 P5", 300, true);
}

// Head dims and geometries where the policies' row kernels apply (d a multiple of 32; W = 2S
// for the run kernels), chunks of up to 300 tokens: the windows inside a chunk go through the
// window loop, one call per entry page (pages of 16 and of 5 entries, so calls start and end
// mid-run), and must still give the cache's bits.
TYPED_TEST(PagedAppend, FastPathsPerEntryPageEqualCompressedCache) {
  using T = TypeParam;
  std::mt19937_64 rng(177 + sizeof(T));
  const phasekv::Geometry geos[] = {phasekv::Geometry(8, 4), phasekv::Geometry(16, 8, 3),
                                    phasekv::Geometry(8, 8, 1)};
  for (const phasekv::Geometry& g : geos)
    for (const i64 page : {i64{16}, i64{5}}) {
      const i64 H = 2, d = page == 16 ? 64 : 96, local = 12;
      const std::string where = "W" + std::to_string(g.window()) + "S" +
                                std::to_string(g.stride()) + "O" + std::to_string(g.origin()) +
                                " P" + std::to_string(page);
      append_equals_cache<T>(phasekv::UniformMean(g, d), phasekv::UniformMean(g, d), H, local, page,
                             true, rng, "UniformMean " + where, 300);
      const auto pk = pkv_test::GatedParams::random(rng, g, H, d, d, phasekv::GateKind::scalar,
                                                    true, true, false);
      append_equals_cache<T>(pk.policy(), phasekv::MaxPool(g, d), H, local, page, false, rng,
                             "GatedPool/MaxPool " + where, 300);
    }
}

TEST(PagedAppendErrors, ShortEntryTableWritesNothing) {
  const phasekv::Geometry g(4, 2, 0);
  const phasekv::UniformMean p(g, 4);
  std::vector<float> pool(8 * 4 * 1 * 8, 0.5f);
  auto P = phasekv::make_kv_page_pool(pool.data(), 8, 4, 1, 4, 4);
  // sequence 1 appends 9 tokens: 9 raw slots (3 pages) and J(9) = 3 entries (1 page)
  const std::int32_t rptr[] = {0, 1, 4}, rind[] = {0, 1, 2, 3};
  const std::int32_t eptr[] = {0, 0, 0}, eind[] = {7};  // no entry page for sequence 1
  const std::int64_t len[] = {2, 0};
  const std::int32_t indptr[] = {0, 1, 10};
  std::vector<float> k(10 * 4, 1.0f), v(10 * 4, 2.0f);
  phasekv::PagedAppendArgs<float> a;
  a.raw_pool = P;
  a.entry_pool = P;
  a.raw_table = phasekv::csr_block_table(rptr, rind, 2);
  a.entry_table = phasekv::csr_block_table(eptr, eind, 2);
  a.lengths = len;
  a.batch = 2;
  a.new_indptr = indptr;
  a.keys = phasekv::make_view<const float>(k.data(), 10, 1, 4);
  a.values = phasekv::make_view<const float>(v.data(), 10, 1, 4);
  const std::vector<float> before = pool;
  try {
    phasekv::paged_append(p, p, 0, a);
    ADD_FAILURE() << "accepted";
  } catch (const phasekv::capacity_error& e) {
    EXPECT_NE(std::string(e.what()).find("entry_table pages of sequence 1"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(pool, before);
  const std::int32_t eptr2[] = {0, 0, 1};
  a.entry_table = phasekv::csr_block_table(eptr2, eind, 2);
  EXPECT_NO_THROW(phasekv::paged_append(p, p, 0, a));
  EXPECT_NE(pool, before);
}

}  // namespace
