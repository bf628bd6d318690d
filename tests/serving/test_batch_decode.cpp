// Batch decode over paged storage: against the double reference, against the single-sequence
// cpu::decode (same bits), and across page sizes, layouts, table forms, rings and thread
// counts (same bits).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "serving_case.hpp"

namespace {

using phasekv::bf16_t;
using phasekv::f16_t;

template <class T>
class BatchDecode : public ::testing::Test {};
using Types = ::testing::Types<float, bf16_t, f16_t>;
TYPED_TEST_SUITE(BatchDecode, Types);

// Lengths drawn (fixed seed) from {0, 1, 7, W-1, W, W+1, 1000, 5000}, at most `big` of 5000.
std::vector<std::int64_t> draw_lengths(std::int64_t B, std::int64_t W, std::uint32_t seed,
                                       int big) {
  const std::int64_t pool[] = {0, 1, 7, W - 1, W, W + 1, 1000, 5000};
  std::mt19937 rng(seed);
  std::vector<std::int64_t> v(static_cast<std::size_t>(B));
  for (auto& x : v) {
    x = pool[rng() % 8];
    if (x == 5000 && big-- <= 0) x = 1000;
  }
  v[0] = 0;  // always a sequence of length 0
  return v;
}

template <class T>
void expect_close_to_reference(const pst::BatchCase<T>& c, const std::string& what) {
  for (std::int64_t b = 0; b < c.B; ++b) {
    std::vector<double> ro, rl;
    c.reference(b, ro, rl);
    const pkt::ErrorStats e =
        pkt::compare(c.out.data() + b * c.hq * c.shape.d_v, c.lse.data() + b * c.hq, ro.data(),
                     rl.data(), c.hq, c.shape.d_v);
    ASSERT_TRUE(e.finite) << what << " sequence " << b;
    EXPECT_LE(e.max_rel, pkt::tolerance<T>()) << what << " sequence " << b;
    EXPECT_LE(e.max_lse, pkt::tolerance<T>()) << what << " sequence " << b;
  }
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// One chunk per sequence: every sequence gives the bits of cpu::decode over its contiguous
// buffers, for page sizes 1, 16, 64 and 1, 2, 3 threads.
TYPED_TEST(BatchDecode, SameBitsAsSingleSequenceDecode) {
  using T = TypeParam;
  pst::BatchShape s;
  s.W = 8, s.S = 4, s.O = 2, s.L = 16;
  s.lengths = draw_lengths(12, s.W, 5, 2);
  s.lengths[3] = 5000;
  for (std::int64_t P : {1, 16, 64}) {
    s.page_size = P;
    pst::BatchCase<T> c(s, 17);
    std::vector<std::vector<float>> so(static_cast<std::size_t>(c.B)), sl(so.size());
    for (std::int64_t b = 0; b < c.B; ++b) c.single(b, so[b], sl[b]);
    for (int threads : {1, 2, 3}) {
      c.poison();
      c.run(threads, 8192);
      for (std::int64_t b = 0; b < c.B; ++b) {
        const std::vector<float> o(c.out.begin() + b * c.hq * s.d_v,
                                   c.out.begin() + (b + 1) * c.hq * s.d_v);
        const std::vector<float> l(c.lse.begin() + b * c.hq, c.lse.begin() + (b + 1) * c.hq);
        EXPECT_TRUE(same_bits(o, so[b]) && same_bits(l, sl[b]))
            << s.name() << " threads " << threads << " sequence " << b << " n " << s.lengths[b];
      }
      if (P == 16 && threads == 2) expect_close_to_reference(c, s.name());
    }
  }
}

// Chunks of 128 visible items: the bits do not depend on the page size, the layout inside a
// page, the table form, one or two pools, a ring, or the thread count; and they match the
// double reference.
TYPED_TEST(BatchDecode, ChunkedBitsIndependentOfPagesAndThreads) {
  using T = TypeParam;
  pst::BatchShape s;
  s.W = 8, s.S = 4, s.O = 3, s.L = 20;
  s.kv_heads = 2, s.group = 5, s.d_k = 96, s.d_v = 40;  // G = 5, generic dims, d_k != d_v
  s.lengths = draw_lengths(10, s.W, 9, 1);
  s.lengths[4] = 1000;
  s.page_size = 16;
  pst::BatchCase<T> base(s, 23);
  base.run(1, 128);
  expect_close_to_reference(base, s.name());
  for (int variant = 0; variant < 7; ++variant) {
    pst::BatchShape v = s;
    int threads = 1 + variant % 3;
    switch (variant) {
      case 0: v.page_size = 1; break;
      case 1: v.page_size = 64; break;
      case 2: v.layout = phasekv::Layout::HND; break;
      case 3: v.ring = true, v.page_size = 7; break;
      case 4: v.one_pool = true; break;
      case 5: v.dense_table = true, v.page_size = 5; break;
      default:
        v.ring = true, v.one_pool = true, v.layout = phasekv::Layout::HND, threads = 3;
        break;
    }
    pst::BatchCase<T> c(v, 23);
    c.run(threads, 128);
    EXPECT_TRUE(same_bits(c.out, base.out) && same_bits(c.lse, base.lse))
        << v.name() << " threads " << threads;
  }
}

// B = 64, with soft cap, entry bias and sinks, G = 4, d = 128, chunks of 256.
TEST(BatchDecodeVariants, B64SoftcapBiasSinks) {
  pst::BatchShape s;
  s.W = 8, s.S = 4, s.O = 0, s.L = 32;
  s.kv_heads = 2, s.group = 4, s.d_k = 128, s.d_v = 128;
  s.lengths = draw_lengths(64, s.W, 31, 2);
  s.page_size = 16;
  std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f, 1.0f, -0.5f, 0.25f, 3.0f};
  phasekv::StandardVariant var;
  var.softcap = 5.0f;
  var.entry_bias = std::log(8.0f);
  var.sinks = sinks.data();
  pst::BatchCase<bf16_t> c(s, 41, var);
  c.run(3, 256);
  expect_close_to_reference(c, s.name());
  // the zero-length sequence: output 0, lse = the sink
  for (std::int64_t h = 0; h < c.hq; ++h) {
    EXPECT_EQ(c.lse[static_cast<std::size_t>(h)], sinks[static_cast<std::size_t>(h)]);
    for (std::int64_t i = 0; i < s.d_v; ++i)
      EXPECT_EQ(c.out[static_cast<std::size_t>(h * s.d_v + i)], 0.0f);
  }
  std::vector<float> o1 = c.out, l1 = c.lse;
  c.poison();
  c.run(1, 256);
  EXPECT_TRUE(same_bits(c.out, o1) && same_bits(c.lse, l1));
}

// Uncompressed caches: causal over every raw token, and a sliding window kept in a ring.
TEST(BatchDecodeVariants, Uncompressed) {
  for (int mode = 0; mode < 2; ++mode) {
    pst::BatchShape s;
    s.W = 0, s.L = mode == 0 ? 0 : 100;
    s.ring = mode == 1;
    s.lengths = {0, 1, 7, 99, 100, 101, 1000, 300};
    s.page_size = 16;
    pst::BatchCase<float> c(s, 3);
    c.run(2, 128);
    expect_close_to_reference(c, s.name());
    std::vector<float> o = c.out, l = c.lse;
    pst::BatchShape t = s;
    t.page_size = 1;
    pst::BatchCase<float> c1(t, 3);
    c1.run(3, 128);
    EXPECT_TRUE(same_bits(c1.out, o) && same_bits(c1.lse, l)) << s.name();
    // the sequence of length 0
    for (std::int64_t h = 0; h < c.hq; ++h)
      EXPECT_EQ(c.lse[static_cast<std::size_t>(h)], phasekv::neg_inf());
  }
}

// One plan serves several layers (pools of the same shape with other data).
TEST(BatchDecodePlan, OnePlanManyLayers) {
  pst::BatchShape s;
  s.lengths = {5, 0, 300, 64, 1000};
  pst::BatchCase<float> a(s, 1, {}, 99), b(s, 2, {}, 99);  // same pages, other data
  ASSERT_EQ(a.raw_indices, b.raw_indices);
  phasekv::DecodePlan plan;
  plan.plan(a.args, 2, 128);
  std::vector<unsigned char> ws(plan.workspace_bytes());
  phasekv::batch_decode(plan, a.args, ws.data(), ws.size());
  phasekv::batch_decode(plan, b.args, ws.data(), ws.size());
  expect_close_to_reference(a, "layer 1");
  expect_close_to_reference(b, "layer 2");
  // a stale plan is refused
  std::vector<std::int64_t> longer = s.lengths;
  longer[2] += 1;
  phasekv::BatchDecodeArgs<float> stale = a.args;
  stale.kv.lengths = longer.data();
  try {
    phasekv::batch_decode(plan, stale, ws.data(), ws.size());
    ADD_FAILURE() << "stale plan accepted";
  } catch (const phasekv::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("kv.lengths[2] = 301"), std::string::npos) << e.what();
  }
  // too small a workspace
  EXPECT_THROW(phasekv::batch_decode(plan, a.args, ws.data(), ws.size() - 1),
               phasekv::capacity_error);
  // worker count must match the plan
  EXPECT_THROW(phasekv::batch_decode_partition(plan, a.args, ws.data(), ws.size(), 0, 3),
               phasekv::invalid_argument);
}

TEST(BatchDecodePlan, PlanMath) {
  const std::int64_t totals[] = {0, 5000, 1, 130, 0, 64};
  const std::int64_t n = phasekv::plan_items(totals, 6, 128, nullptr, nullptr);
  EXPECT_EQ(n, 40 + 1 + 2 + 1);
  std::vector<phasekv::WorkItem> items(static_cast<std::size_t>(n));
  std::vector<std::int64_t> first(7);
  phasekv::plan_items(totals, 6, 128, items.data(), first.data());
  for (std::int64_t b = 0; b < 6; ++b) {
    std::int64_t covered = 0;
    for (std::int64_t i = first[b]; i < first[b + 1]; ++i) {
      EXPECT_EQ(items[i].sequence, b);
      EXPECT_EQ(items[i].begin, covered);
      EXPECT_LE(items[i].end - items[i].begin, 128);
      covered = items[i].end;
    }
    EXPECT_EQ(covered, totals[b]);
  }
  std::int64_t all = 0, largest = 0;
  for (const auto& w : items)
    all += phasekv::plan_item_cost(w), largest = std::max(largest, phasekv::plan_item_cost(w));
  for (std::int64_t workers : {1, 2, 3, 7, 64}) {
    std::vector<std::int64_t> wf(static_cast<std::size_t>(workers + 1));
    phasekv::plan_balance(items.data(), n, workers, wf.data());
    EXPECT_EQ(wf[0], 0);
    EXPECT_EQ(wf[static_cast<std::size_t>(workers)], n);
    for (std::int64_t w = 0; w < workers; ++w) {
      EXPECT_LE(wf[w], wf[w + 1]);
      std::int64_t cost = 0;
      for (std::int64_t i = wf[w]; i < wf[w + 1]; ++i) cost += phasekv::plan_item_cost(items[i]);
      EXPECT_LE(cost, all / workers + largest) << "worker " << w << " of " << workers;
    }
  }
}

}  // namespace

// Found by fuzz_serving: a table that lists no page (no sequence has an entry yet, or every
// sequence is empty) may leave its indices null, as an empty std::vector's data() is; the plan
// refused it.
TEST(BatchDecodeRegression, TablesWithoutPagesMayHaveNullIndices) {
  pst::BatchShape s;
  s.W = 8, s.S = 4, s.O = 0, s.L = 4;
  s.lengths = {0, 3, 7};  // J = 0 everywhere: the CSR entry table lists no page
  pst::BatchCase<float> c(s, 3);
  c.args.kv.entry_table.indices = nullptr;
  ASSERT_NO_THROW(c.run(2, 64));
  expect_close_to_reference(c, "no entries");
  s.lengths = {0, 0};  // no raw page either
  pst::BatchCase<float> e(s, 4);
  e.args.kv.raw_table.indices = nullptr;
  e.args.kv.entry_table.indices = nullptr;
  ASSERT_NO_THROW(e.run(1, 64));
  for (float l : e.lse) EXPECT_TRUE(std::isinf(l) && l < 0);
  // a table that does list pages still needs them
  s.lengths = {9};
  pst::BatchCase<float> bad(s, 5);
  bad.args.kv.raw_table.indices = nullptr;
  EXPECT_THROW(bad.run(1, 64), phasekv::invalid_argument);
}
