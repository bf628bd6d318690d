// Paged batch decode with per-KV-head origins: against cpu::staggered_decode of each sequence
// over contiguous buffers (same bits), the double reference per head, and across page sizes,
// layouts, rings and thread counts (same bits); equal origins take the uniform path.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "phasekv/serving/batch_decode.hpp"
#include "serving_case.hpp"
#include "staggered_case.hpp"

namespace {

using phasekv::bf16_t;
using phasekv::f16_t;

template <class T>
class StaggeredBatchDecode : public ::testing::Test {};
using Types = ::testing::Types<float, bf16_t, f16_t>;
TYPED_TEST_SUITE(StaggeredBatchDecode, Types);

// Lengths drawn (fixed seed) from {0, 1, 7, W-1, W, W+1, 97, 1000}; sequence 0 has length 0.
std::vector<std::int64_t> draw_lengths(std::int64_t B, std::int64_t W, std::uint32_t seed) {
  const std::int64_t pool[] = {0, 1, 7, W - 1, W, W + 1, 97, 1000};
  std::mt19937 rng(seed);
  std::vector<std::int64_t> v(static_cast<std::size_t>(B));
  for (auto& x : v) x = pool[rng() % 8];
  v[0] = 0;
  return v;
}

bool same_bits(const float* a, const float* b, std::size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

template <class T>
void expect_close_to_reference(const sst::Batch<T>& c, const std::string& what) {
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

// One chunk per (sequence, head): each sequence gives the bits of cpu::staggered_decode, for
// page sizes 1, 16, 64, threads 1, 2, 3, several origin sets (even, above S, above n) and GQA
// groups; and matches the double reference per head.
TYPED_TEST(StaggeredBatchDecode, SameBitsAsStaggeredDecode) {
  using T = TypeParam;
  struct Geo {
    std::int64_t H, G, dk, dv, W, S, L;
    std::vector<std::int64_t> origins;
  };
  const Geo geos[] = {{3, 2, 64, 64, 8, 4, 16, {0, 3, 9}},
                      {4, 5, 56, 96, 8, 8, 0, {0, 2, 4, 6}},
                      {2, 8, 96, 64, 6, 4, 5, {1200, 1}},
                      {5, 1, 64, 56, 16, 8, 8, {0, 7, 3, 13, 1}}};
  std::uint32_t seed = 31;
  for (const Geo& g : geos) {
    sst::Shape s;
    s.kv_heads = g.H, s.group = g.G, s.d_k = g.dk, s.d_v = g.dv;
    s.W = g.W, s.S = g.S, s.L = g.L, s.origins = g.origins;
    s.lengths = draw_lengths(9, s.W, seed);
    s.lengths[2] = 1000;
    for (std::int64_t P : {1, 16, 64}) {
      s.page_size = P;
      sst::Batch<T> c(s, seed);
      std::vector<std::vector<float>> so(static_cast<std::size_t>(c.B)), sl(so.size());
      for (std::int64_t b = 0; b < c.B; ++b) c.single(b, so[b], sl[b]);
      for (int threads : {1, 2, 3}) {
        c.poison();
        const phasekv::StaggeredDecodePlan plan = c.run(threads, 4096);
        ASSERT_FALSE(plan.uniform());
        for (std::int64_t b = 0; b < c.B; ++b) {
          EXPECT_TRUE(
              same_bits(c.out.data() + b * c.hq * s.d_v, so[b].data(),
                        static_cast<std::size_t>(c.hq * s.d_v)) &&
              same_bits(c.lse.data() + b * c.hq, sl[b].data(), static_cast<std::size_t>(c.hq)))
              << s.name() << " threads " << threads << " sequence " << b << " n " << s.lengths[b];
        }
        if (threads == 2) expect_close_to_reference(c, s.name());
      }
    }
    ++seed;
  }
}

// Chunks of 64 visible items (many per head): the bits do not depend on the page size, the
// layout inside a page, one or two pools, a ring, or the thread count; and they match the
// double reference per head.
TYPED_TEST(StaggeredBatchDecode, ChunkedBitsIndependentOfPagesAndThreads) {
  using T = TypeParam;
  sst::Shape s;
  s.kv_heads = 3, s.group = 3, s.d_k = 96, s.d_v = 40;
  s.W = 8, s.S = 4, s.L = 20, s.origins = {5, 0, 2};
  s.lengths = draw_lengths(8, s.W, 9);
  s.lengths[4] = 1000;
  s.page_size = 16;
  sst::Batch<T> base(s, 23);
  base.run(1, 64);
  expect_close_to_reference(base, s.name());
  for (int variant = 0; variant < 6; ++variant) {
    sst::Shape v = s;
    int threads = 1 + variant % 3;
    switch (variant) {
      case 0: v.page_size = 1; break;
      case 1: v.page_size = 64; break;
      case 2: v.layout = phasekv::Layout::HND; break;
      case 3: v.ring = true, v.page_size = 7; break;
      case 4: v.one_pool = true; break;
      default:
        v.ring = true, v.one_pool = true, v.layout = phasekv::Layout::HND, threads = 3;
        break;
    }
    sst::Batch<T> c(v, 23, {}, 57 + static_cast<std::uint32_t>(variant));
    c.run(threads, 64);
    EXPECT_TRUE(same_bits(c.out.data(), base.out.data(), c.out.size()) &&
                same_bits(c.lse.data(), base.lse.data(), c.lse.size()))
        << v.name() << " threads " << threads;
  }
}

// Soft cap, entry bias and sinks (per query head): the bits of cpu::staggered_decode, through
// a thread pool.
TEST(StaggeredBatchDecodeVariants, SoftcapBiasSinks) {
  sst::Shape s;
  s.kv_heads = 4, s.group = 4, s.d_k = 128, s.d_v = 128;
  s.W = 8, s.S = 8, s.L = 8, s.origins = phasekv::even_origins(8, 4);
  s.lengths = draw_lengths(12, s.W, 3);
  s.ring = true;
  std::vector<float> sinks(16);
  for (std::size_t i = 0; i < sinks.size(); ++i) sinks[i] = 0.3f * static_cast<float>(i) - 2.0f;
  phasekv::StandardVariant var;
  var.softcap = 20.0f;
  var.entry_bias = -0.7f;
  var.sinks = sinks.data();
  sst::Batch<float> c(s, 41, var);
  phasekv::StaggeredDecodePlan plan;
  plan.plan(c.args, 3, 1 << 16);
  std::vector<unsigned char> ws(plan.workspace_bytes());
  phasekv::cpu::ThreadPool pool(3);
  phasekv::staggered_batch_decode_parallel(plan, c.args, pool, ws.data(), ws.size());
  for (std::int64_t b = 0; b < c.B; ++b) {
    std::vector<float> so, sl;
    c.single(b, so, sl);
    EXPECT_TRUE(same_bits(c.out.data() + b * c.hq * s.d_v, so.data(), so.size()) &&
                same_bits(c.lse.data() + b * c.hq, sl.data(), sl.size()))
        << "sequence " << b;
  }
  expect_close_to_reference(c, s.name());
}

// Equal origins take the uniform path: the same bits as DecodePlan / batch_decode over the
// same pages with a PagedKV of the same rule, for origins 0 and for a shared nonzero origin.
TEST(StaggeredBatchDecodeUniform, EqualOriginsAreTheUniformPath) {
  for (std::int64_t o : {0, 3}) {
    sst::Shape s;
    s.origins = {o, o, o};
    s.lengths = draw_lengths(10, s.W, 4);
    s.ring = o != 0;
    sst::Batch<float> c(s, 5);
    const phasekv::StaggeredDecodePlan plan = c.run(2, 128);
    EXPECT_TRUE(plan.uniform());
    const std::vector<float> out = c.out, lse = c.lse;
    c.poison();
    const phasekv::BatchDecodeArgs<float> u = c.args.uniform();
    EXPECT_EQ(u.kv.rule.geometry().origin(), o);
    phasekv::DecodePlan up;
    up.plan(u, 2, 128);
    std::vector<unsigned char> ws(up.workspace_bytes());
    phasekv::batch_decode(up, u, ws.data(), ws.size());
    EXPECT_TRUE(same_bits(out.data(), c.out.data(), out.size()) &&
                same_bits(lse.data(), c.lse.data(), lse.size()))
        << o;
    expect_close_to_reference(c, s.name());
  }
}

template <class E, class F>
void expect_throw_naming(F&& f, const std::string& piece) {
  try {
    f();
    ADD_FAILURE() << "accepted; expected an error naming " << piece;
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(piece), std::string::npos) << e.what();
  }
}

// Bad origins, short entry tables (sized for the largest origin's J, not the smallest), a
// ring too small, and runs that do not match the plan: clear errors, nothing written.
TEST(StaggeredBatchDecodeErrors, RefusedBeforeAnythingIsWritten) {
  sst::Shape s;
  s.origins = {0, 3, 40};
  s.lengths = {40, 0, 97};
  sst::Batch<float> c(s, 8);
  phasekv::StaggeredDecodePlan plan;
  auto a = c.args;
  a.kv.geometry = phasekv::StaggeredGeometry(8, 4, {0, 3});
  expect_throw_naming<phasekv::invalid_argument>([&] { plan.plan(a, 1); }, "origins.size()");
  EXPECT_FALSE(plan.planned());
  // an entry table that holds J(n) of origin 40 only (sequence 2 needs J(97) of origin 0)
  std::vector<std::int32_t> ind = c.ent_indices, ptr = c.ent_indptr;
  const std::int64_t need = (c.jmax[2] + s.page_size - 1) / s.page_size;
  const std::int64_t short_pages =
      (phasekv::Geometry(8, 4, 40).complete_windows(97) + s.page_size - 1) / s.page_size;
  ASSERT_LT(short_pages, need);
  ptr[3] = ptr[2] + static_cast<std::int32_t>(short_pages);
  a = c.args;
  a.kv.entry_table = phasekv::csr_block_table(ptr.data(), ind.data(), 3);
  expect_throw_naming<phasekv::capacity_error>([&] { plan.plan(a, 1); },
                                               "entry_table pages of sequence 2");
  // a ring shorter than max(W, L)
  a = c.args;
  a.kv.ring_slots = 10;
  expect_throw_naming<phasekv::invalid_argument>([&] { plan.plan(a, 1); }, "kv.ring_slots");
  // a run with other origins than planned
  plan.plan(c.args, 2);
  std::vector<unsigned char> ws(plan.workspace_bytes());
  a = c.args;
  a.kv.geometry = phasekv::StaggeredGeometry(8, 4, {0, 3, 8});
  expect_throw_naming<phasekv::invalid_argument>(
      [&] { phasekv::staggered_batch_decode(plan, a, ws.data(), ws.size()); }, "kv.geometry");
  expect_throw_naming<phasekv::capacity_error>(
      [&] { phasekv::staggered_batch_decode(plan, c.args, ws.data(), ws.size() - 1); },
      "workspace_bytes");
  for (float x : c.out) EXPECT_TRUE(std::isnan(x));
  for (float x : c.lse) EXPECT_TRUE(std::isnan(x));
  // a bad origin in a uniform-looking list
  a = c.args;
  EXPECT_THROW(a.kv.geometry = phasekv::StaggeredGeometry(8, 4, {0, -1, 0}),
               phasekv::invalid_argument);
}

}  // namespace
