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
#include "phasekv/serving/append_run.hpp"
#include "phasekv/serving/paged_append.hpp"

namespace {

using i64 = std::int64_t;

template <class T>
bool same(const T* a, const T* b, i64 n) {
  return std::memcmp(a, b, static_cast<std::size_t>(n) * sizeof(T)) == 0;
}

// Appends random chunks to B sequences through paged_append (`planned`: through an AppendPlan
// of 3 workers with items of at most 5 tokens or entries, each worker's phase run on its own,
// in reverse worker order) and through one CompressedCache each; compares every entry and
// every raw token the storage must hold after each round.
template <class T, class KP, class VP>
void append_equals_cache(const KP& kp, const VP& vp, i64 H, i64 local, i64 page, bool ring,
                         std::mt19937_64& rng, const std::string& what, i64 max_chunk = -1,
                         bool planned = false) {
  const phasekv::Geometry g = kp.geometry();
  const i64 dk = kp.input_dim(), dv = vp.input_dim(), B = 5, rounds = 5;
  const i64 W = g.window();
  if (max_chunk < 0) max_chunk = 3 * W + 5;
  // the chunk schedule: some sequences start later (own phase), chunks 0 .. max_chunk
  std::vector<std::vector<i64>> chunk(static_cast<std::size_t>(rounds), std::vector<i64>(B));
  std::vector<i64> total(B, 0);
  for (auto& r : chunk)
    for (i64 b = 0; b < B; ++b) {
      r[b] = pkv_test::rand_int(rng, 0, max_chunk);
      total[b] += r[b];
    }
  std::vector<pkv_test::Tensor<T>> K, V;
  for (i64 b = 0; b < B; ++b) {
    K.emplace_back(total[b], H, dk);
    V.emplace_back(total[b], H, dv);
    K.back().randomize(rng);
    V.back().randomize(rng);
  }
  const i64 ring_slots = ring ? g.ring_capacity(local) + 2 : 0;
  // pages, shuffled, one pool for raw and entries ([K|V] pages)
  std::vector<i64> rp(B), ep(B);
  i64 pages = 0;
  for (i64 b = 0; b < B; ++b) {
    i64 slots = total[b];
    if (ring && slots > g.origin() + ring_slots) slots = g.origin() + ring_slots;
    rp[b] = (slots + page - 1) / page;
    ep[b] = (g.complete_windows(total[b]) + page - 1) / page;
    pages += rp[b] + ep[b];
  }
  std::vector<std::int32_t> perm(static_cast<std::size_t>(pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<std::int32_t> rind, eind, rptr{0}, eptr{0};
  std::size_t next = 0;
  for (i64 b = 0; b < B; ++b) {
    for (i64 i = 0; i < rp[b]; ++i) rind.push_back(perm[next++]);
    for (i64 i = 0; i < ep[b]; ++i) eind.push_back(perm[next++]);
    rptr.push_back(static_cast<std::int32_t>(rind.size()));
    eptr.push_back(static_cast<std::int32_t>(eind.size()));
  }
  rind.push_back(0), eind.push_back(0);  // never empty
  std::vector<T> pool(static_cast<std::size_t>((pages + 1) * page * H * (dk + dv)));
  auto P =
      phasekv::make_kv_page_pool(pool.data(), pages + 1, page, H, dk, dv, phasekv::Layout::HND);
  phasekv::PagedAppendArgs<T> a;
  a.raw_pool = P;
  a.entry_pool = P;
  a.raw_table = phasekv::csr_block_table(rptr.data(), rind.data(), B);
  a.entry_table = phasekv::csr_block_table(eptr.data(), eind.data(), B);
  a.batch = B;
  a.ring_slots = ring_slots;
  std::vector<i64> len(B, 0);
  a.lengths = len.data();
  std::vector<phasekv::CompressedCache<T, KP, VP>> caches;
  for (i64 b = 0; b < B; ++b) caches.emplace_back(kp, vp, H, dk, dv, local, total[b]);
  for (i64 r = 0; r < rounds; ++r) {
    std::vector<std::int32_t> indptr{0};
    for (i64 b = 0; b < B; ++b)
      indptr.push_back(indptr.back() + static_cast<std::int32_t>(chunk[r][b]));
    pkv_test::Tensor<T> nk(indptr.back(), H, dk), nv(indptr.back(), H, dv);
    for (i64 b = 0; b < B; ++b)
      for (i64 t = 0; t < chunk[r][b]; ++t)
        for (i64 h = 0; h < H; ++h) {
          std::memcpy(nk.view().ptr(indptr[b] + t, h), K[b].cview().ptr(len[b] + t, h),
                      dk * sizeof(T));
          std::memcpy(nv.view().ptr(indptr[b] + t, h), V[b].cview().ptr(len[b] + t, h),
                      dv * sizeof(T));
        }
    a.new_indptr = indptr.data();
    a.keys = nk.cview();
    a.values = nv.cview();
    if (planned) {
      phasekv::AppendPlan plan;
      plan.plan(kp, vp, local, a, 3, {}, 5);
      std::vector<char> ws(plan.workspace_bytes());
      for (int w = 2; w >= 0; --w)
        phasekv::paged_append_entries_run(plan, kp, vp, local, a, ws.data(), ws.size(), w);
      for (int w = 2; w >= 0; --w) phasekv::paged_append_raw_run(plan, a, w);
      EXPECT_EQ(plan.lengths_after()[0], len[0] + chunk[r][0]);
    } else {  // two parts, as two workers would
      phasekv::paged_append(kp, vp, local, a, 1, 2);
      phasekv::paged_append(kp, vp, local, a, 0, 2);
    }
    for (i64 b = 0; b < B; ++b) {
      caches[b].append(K[b].cview().slice(len[b], chunk[r][b]),
                       V[b].cview().slice(len[b], chunk[r][b]));
      len[b] += chunk[r][b];
      const i64 J = caches[b].num_entries();
      for (i64 j = 0; j < J; ++j)
        for (i64 h = 0; h < H; ++h) {
          const i64 pg = a.entry_table.page(b, j / page);
          ASSERT_TRUE(same(P.key(pg, j % page, h), caches[b].entry_keys().ptr(j, h), dk))
              << what << " round " << r << " sequence " << b << " entry " << j << " head " << h;
          ASSERT_TRUE(same(P.value(pg, j % page, h), caches[b].entry_values().ptr(j, h), dv))
              << what << " round " << r << " sequence " << b << " entry " << j << " head " << h;
        }
      const phasekv::Visibility vis = g.visible(len[b], local);
      for (i64 p = 0; p < len[b]; ++p) {
        if (ring && p >= vis.prefix_end && p < vis.raw_begin) continue;
        const i64 s = phasekv::PagedKV<T>::raw_slot(p, g.origin(), ring_slots);
        const i64 pg = a.raw_table.page(b, s / page);
        for (i64 h = 0; h < H; ++h) {
          ASSERT_TRUE(same(P.key(pg, s % page, h), K[b].cview().ptr(p, h), dk))
              << what << " raw " << p << " sequence " << b;
          ASSERT_TRUE(same(P.value(pg, s % page, h), V[b].cview().ptr(p, h), dv))
              << what << " raw " << p << " sequence " << b;
        }
      }
    }
  }
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
