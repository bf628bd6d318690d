// Paged batch decode with per-KV-head origins: against cpu::decode with head_kv of each sequence
// over contiguous buffers (same bits), the double reference per head, and across page sizes,
// layouts, rings and thread counts (same bits); equal origins give the bits of the uniform
// layout. f32 here
// (with the variants, the uniform path and the errors); bf16 and f16 in their own files.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "phasekv/serving/batch_decode.hpp"
#include "staggered_decode_checks.hpp"

namespace {

using sstd::draw_lengths;
using sstd::expect_close_to_reference;
using sstd::same_bits;

TEST(StaggeredBatchDecode, SameBitsAsStaggeredDecodeF32) {
  sstd::same_bits_as_per_head_decode<float>();
}

TEST(StaggeredBatchDecode, ChunkedBitsIndependentOfPagesAndThreadsF32) {
  sstd::chunked_bits_independent_of_pages_and_threads<float>();
}

// Soft cap, entry bias and sinks (per query head): the bits of cpu::decode with head_kv, through
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
  phasekv::DecodePlan plan;
  plan.plan(c.args, 3, 1 << 16);
  std::vector<unsigned char> ws(plan.workspace_bytes());
  phasekv::cpu::ThreadPool pool(3);
  phasekv::batch_decode_parallel(plan, c.args, pool, ws.data(), ws.size());
  for (std::int64_t b = 0; b < c.B; ++b) {
    std::vector<float> so, sl;
    c.single(b, so, sl);
    EXPECT_TRUE(same_bits(c.out.data() + b * c.hq * s.d_v, so.data(), so.size()) &&
                same_bits(c.lse.data() + b * c.hq, sl.data(), sl.size()))
        << "sequence " << b;
  }
  expect_close_to_reference(c, s.name());
}

// Equal origins are one run of every head: the same bits as the same pages described without
// origins, with the rule's origin set to the shared one (0 and a nonzero origin).
TEST(StaggeredBatchDecodeUniform, EqualOriginsAreTheUniformPath) {
  for (std::int64_t o : {0, 3}) {
    sst::Shape s;
    s.origins = {o, o, o};
    s.lengths = draw_lengths(10, s.W, 4);
    s.ring = o != 0;
    sst::Batch<float> c(s, 5);
    const phasekv::DecodePlan plan = c.run(2, 128);
    EXPECT_EQ(plan.runs().size(), 1u);
    const std::vector<float> out = c.out, lse = c.lse;
    c.poison();
    phasekv::BatchDecodeArgs<float> u = c.args;
    u.kv.origins = nullptr;
    u.kv.rule = phasekv::cpu::VisibilityRule::compressed(phasekv::Geometry(s.W, s.S, o), s.L);
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
  phasekv::DecodePlan plan;
  auto a = c.args;
  a.kv.rule = phasekv::cpu::VisibilityRule::compressed(phasekv::Geometry(8, 4, 2), s.L);
  expect_throw_naming<phasekv::invalid_argument>([&] { plan.plan(a, 1); },
                                                 "kv.rule.geometry().origin()");
  a.kv.rule = phasekv::cpu::VisibilityRule::sliding_window(16);
  expect_throw_naming<phasekv::invalid_argument>([&] { plan.plan(a, 1); }, "kv.origins");
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
  const std::vector<std::int64_t> other{0, 3, 8};
  a.kv.origins = other.data();
  expect_throw_naming<phasekv::invalid_argument>(
      [&] { phasekv::batch_decode(plan, a, ws.data(), ws.size()); }, "kv.origins[2]");
  a.kv.origins = nullptr;
  expect_throw_naming<phasekv::invalid_argument>(
      [&] { phasekv::batch_decode(plan, a, ws.data(), ws.size()); }, "kv.origins");
  expect_throw_naming<phasekv::capacity_error>(
      [&] { phasekv::batch_decode(plan, c.args, ws.data(), ws.size() - 1); }, "workspace_bytes");
  for (float x : c.out) EXPECT_TRUE(std::isnan(x));
  for (float x : c.lse) EXPECT_TRUE(std::isnan(x));
  // a bad origin in a uniform-looking list
  a = c.args;
  const std::vector<std::int64_t> bad{0, -1, 0};
  a.kv.origins = bad.data();
  expect_throw_naming<phasekv::invalid_argument>([&] { plan.plan(a, 1); }, "kv.origins[1]");
}

}  // namespace
