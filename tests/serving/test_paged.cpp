// Page pools, block tables and their validation: bad tables are refused with the table, the
// sequence and the index named, and nothing is written.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "serving_case.hpp"

namespace {

TEST(PagePool, Addressing) {
  std::vector<float> k(3 * 4 * 2 * 5), v(3 * 4 * 2 * 6);
  auto nhd = phasekv::make_page_pool(k.data(), v.data(), 3, 4, 2, 5, 6, phasekv::Layout::NHD);
  EXPECT_EQ(nhd.key(2, 3, 1) - k.data(), 2 * 40 + (3 * 2 + 1) * 5);
  EXPECT_EQ(nhd.value(1, 2, 0) - v.data(), 1 * 48 + (2 * 2 + 0) * 6);
  auto hnd = phasekv::make_page_pool(k.data(), v.data(), 3, 4, 2, 5, 6, phasekv::Layout::HND);
  EXPECT_EQ(hnd.key(2, 3, 1) - k.data(), 2 * 40 + (1 * 4 + 3) * 5);
  EXPECT_EQ(hnd.value(1, 2, 1) - v.data(), 1 * 48 + (1 * 4 + 2) * 6);
  std::vector<float> kv(3 * 4 * 2 * 11);
  auto one = phasekv::make_kv_page_pool(kv.data(), 3, 4, 2, 5, 6);
  EXPECT_EQ(one.key(1, 0, 0) - kv.data(), 88);
  EXPECT_EQ(one.value(1, 0, 0) - kv.data(), 88 + 40);
  EXPECT_EQ(one.value(2, 3, 1) - kv.data(), 2 * 88 + 40 + (3 * 2 + 1) * 6);
}

TEST(BlockTable, CsrDenseAndLastPageLen) {
  const std::int32_t indptr[] = {0, 2, 2, 5};
  const std::int32_t indices[] = {7, 3, 1, 0, 9};
  const auto t = phasekv::csr_block_table(indptr, indices, 3);
  EXPECT_EQ(t.count(0), 2);
  EXPECT_EQ(t.count(1), 0);
  EXPECT_EQ(t.page(2, 1), 0);
  const std::int32_t dense[] = {7, 3, -1, 1, 0, 9};
  const auto d = phasekv::dense_block_table(dense, 2, 3);
  EXPECT_EQ(d.count(1), 3);
  EXPECT_EQ(d.page(1, 2), 9);
  const std::int32_t last[] = {3, 0, 16};
  std::int64_t len[3] = {-1, -1, -1};
  phasekv::lengths_from_last_page_len(indptr, last, 16, 3, len);
  EXPECT_EQ(len[0], 19);
  EXPECT_EQ(len[1], 0);
  EXPECT_EQ(len[2], 48);
  const std::int32_t bad[] = {3, 0, 17};
  std::int64_t keep[3] = {-1, -1, -1};
  try {
    phasekv::lengths_from_last_page_len(indptr, bad, 16, 3, keep);
    ADD_FAILURE() << "accepted";
  } catch (const phasekv::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("last_page_len[2] = 17"), std::string::npos) << e.what();
  }
  EXPECT_EQ(keep[0], -1);  // nothing written
}

// Runs plan + batch_decode on a broken copy of a good case and expects a refusal whose
// message holds every piece of `expect`; out and lse keep their poison.
template <class Fn>
void expect_refused(Fn&& breaker, std::vector<std::string> expect) {
  pst::BatchShape s;
  s.W = 8, s.S = 4, s.O = 2, s.L = 16;
  s.lengths = {40, 0, 100, 9, 33};
  s.page_size = 16;
  pst::BatchCase<float> c(s, 5);
  breaker(c);
  phasekv::DecodePlan plan;
  std::vector<float> before = c.out;
  try {
    plan.plan(c.args, 2, 128);
    ADD_FAILURE() << "plan accepted a bad table";
  } catch (const phasekv::invalid_argument& e) {
    for (const auto& piece : expect)
      EXPECT_NE(std::string(e.what()).find(piece), std::string::npos)
          << "'" << piece << "' not in: " << e.what();
  }
  EXPECT_FALSE(plan.planned());
  std::vector<unsigned char> ws(1 << 16);
  EXPECT_THROW(phasekv::batch_decode(plan, c.args, ws.data(), ws.size()),
               phasekv::invalid_argument);
  for (std::size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(std::isnan(c.out[i]));
  for (float x : c.lse) EXPECT_TRUE(std::isnan(x));
}

TEST(PagedValidation, GoodCasePasses) {
  pst::BatchShape s;
  s.lengths = {40, 0, 100, 9, 33};
  pst::BatchCase<float> c(s, 5);
  EXPECT_NO_THROW(phasekv::check_paged_kv(c.args.kv, s.kv_heads, s.d_k, s.d_v, "test"));
}

TEST(PagedValidation, PageOutOfRange) {
  // sequence 2 (n = 100): raw pages [2, 9); its index 3 -> a page past the pool
  expect_refused([](pst::BatchCase<float>& c) { c.raw_indices[c.raw_indptr[2] + 3] = 100000; },
                 {"raw_table sequence 2 index 3", "100000", "[0, "});
  expect_refused([](pst::BatchCase<float>& c) { c.ent_indices[c.ent_indptr[2] + 1] = -1; },
                 {"entry_table sequence 2 index 1", "-1"});
}

TEST(PagedValidation, TableTooShort) {
  // sequence 4 (n = 33) needs 3 raw pages; give it 2 by moving indptr
  expect_refused([](pst::BatchCase<float>& c) { c.raw_indptr[5] -= 1; },
                 {"raw_table pages of sequence 4", "needs 3 pages"});
  // lengths longer than the pages hold
  expect_refused([](pst::BatchCase<float>& c) { c.shape.lengths[0] = 49; },
                 {"raw_table pages of sequence 0", "needs 4 pages"});
}

TEST(PagedValidation, OverlappingPages) {
  // sequence 3 takes one of sequence 0's raw pages
  expect_refused(
      [](pst::BatchCase<float>& c) {
        c.raw_indices[c.raw_indptr[3]] = c.raw_indices[c.raw_indptr[0] + 1];
      },
      {"raw_table sequence 3 index 0", "overlaps that of page", "raw_table sequence 0 index 1"});
  // one pool: an entry page that is also a raw page
  pst::BatchShape s;
  s.lengths = {40, 0, 100, 9, 33};
  s.one_pool = true;
  pst::BatchCase<float> c(s, 5);
  c.ent_indices[c.ent_indptr[2] + 1] = c.raw_indices[c.raw_indptr[4] + 2];
  phasekv::DecodePlan plan;
  try {
    plan.plan(c.args, 1, 128);
    ADD_FAILURE() << "accepted";
  } catch (const phasekv::invalid_argument& e) {
    // both places are named, the later one (in table order) first
    EXPECT_NE(std::string(e.what()).find("raw_table sequence 4 index 2"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("overlaps that of page"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("entry_table sequence 2 index 1"), std::string::npos)
        << e.what();
  }
}

TEST(PagedValidation, RingTooSmallAndBadArguments) {
  expect_refused([](pst::BatchCase<float>& c) { c.args.kv.ring_slots = 10; },
                 {"kv.ring_slots = 10", ">= 16"});
  expect_refused([](pst::BatchCase<float>& c) { c.args.kv.raw_pool.heads = 3; },
                 {"kv.raw_pool.heads = 3"});
  expect_refused([](pst::BatchCase<float>& c) { c.shape.lengths[1] = -4; }, {"kv.lengths[1] = -4"});
}

}  // namespace
