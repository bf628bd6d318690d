// Ragged batch prefill over paged storage, decode rows mixed in: against cpu::prefill of each
// sequence over contiguous buffers (same bits), the double reference, and across page sizes
// and thread counts (same bits).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "phasekv/serving/batch_prefill.hpp"
#include "prefill_case.hpp"
#include "serving_case.hpp"

namespace {

using phasekv::bf16_t;
using phasekv::f16_t;

using pst::PrefillCase;

template <class T>
class BatchPrefill : public ::testing::Test {};
using Types = ::testing::Types<float, bf16_t, f16_t>;
TYPED_TEST_SUITE(BatchPrefill, Types);

TYPED_TEST(BatchPrefill, SameBitsAsSinglePrefillAndReference) {
  using T = TypeParam;
  pst::BatchShape s;
  s.W = 8, s.S = 4, s.O = 2, s.L = 16;
  s.kv_heads = 2, s.group = 3, s.d_k = 64, s.d_v = 40;
  // (n, q): decode rows (q = 1), a chunk starting mid-window, chunks longer than a window,
  // a whole prefill, an idle sequence (q = 0), an empty one
  s.lengths = {0, 1, 7, 300, 333, 40, 1000, 9, 700};
  const std::vector<std::int64_t> qb = {0, 1, 7, 1, 45, 0, 130, 9, 1};
  std::vector<std::vector<float>> base_o, base_l;
  for (std::int64_t P : {16, 1, 64}) {
    s.page_size = P;
    PrefillCase<T> pc(s, qb, 5);
    for (int threads : {1, 2, 3}) {
      pc.run(threads);
      for (std::int64_t b = 0; b < pc.c.B; ++b) {
        const std::int64_t nq = pc.queries(b);
        if (nq == 0) continue;
        std::vector<float> so(static_cast<std::size_t>(nq * pc.c.hq * s.d_v), std::nanf(""));
        std::vector<float> sl(static_cast<std::size_t>(nq * pc.c.hq), std::nanf(""));
        phasekv::cpu::prefill(pc.single_args(b, so.data(), sl.data()));
        const float* o = pc.out.data() + pc.qo[b] * pc.c.hq * s.d_v;
        const float* l = pc.lse.data() + pc.qo[b] * pc.c.hq;
        EXPECT_EQ(std::memcmp(o, so.data(), so.size() * sizeof(float)), 0)
            << s.name() << " threads " << threads << " sequence " << b;
        EXPECT_EQ(std::memcmp(l, sl.data(), sl.size() * sizeof(float)), 0)
            << s.name() << " threads " << threads << " sequence " << b;
        if (P == 16 && threads == 2) {
          std::vector<double> ro(so.size()), rl(sl.size());
          const auto p = pc.single_args(b, nullptr, nullptr);
          phasekv::reference_prefill<T>(p.q, nq, pc.c.hq, p.first, phasekv::Geometry(s.W, s.S, s.O),
                                        s.L, p.raw_k, p.raw_v, p.entry_k, p.entry_v, p.variant,
                                        ro.data(), rl.data());
          const pkt::ErrorStats e = pkt::compare(o, l, ro.data(), rl.data(), nq * pc.c.hq, s.d_v);
          EXPECT_TRUE(e.finite) << b;
          EXPECT_LE(e.max_rel, pkt::tolerance<T>()) << "sequence " << b;
          EXPECT_LE(e.max_lse, pkt::tolerance<T>()) << "sequence " << b;
        }
      }
    }
  }
}

// A ring of raw slots serves decode rows and short chunks; a chunk that needs more raw tokens
// than the ring holds is refused, naming the sequence.
TEST(BatchPrefillRing, ShortChunksAndRefusal) {
  pst::BatchShape s;
  s.W = 8, s.S = 4, s.O = 2, s.L = 16;
  s.ring = true;  // 16 + 3 slots
  s.lengths = {100, 35, 1, 500};
  PrefillCase<float> pc(s, {1, 3, 1, 2}, 8);
  pc.run(2);
  for (std::int64_t b = 0; b < pc.c.B; ++b) {
    const std::int64_t nq = pc.queries(b);
    std::vector<float> so(static_cast<std::size_t>(nq * pc.c.hq * s.d_v)),
        sl(static_cast<std::size_t>(nq * pc.c.hq));
    phasekv::cpu::prefill(pc.single_args(b, so.data(), sl.data()));
    EXPECT_EQ(std::memcmp(pc.out.data() + pc.qo[b] * pc.c.hq * s.d_v, so.data(), so.size() * 4), 0)
        << b;
  }
  PrefillCase<float> bad(s, {1, 3, 1, 10}, 8);
  phasekv::PrefillPlan plan;
  try {
    plan.plan(bad.args, 1);
    ADD_FAILURE() << "accepted";
  } catch (const phasekv::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("chunk of sequence 3"), std::string::npos) << e.what();
  }
  PrefillCase<float> more(s, {1, 36, 1, 1}, 8);  // 36 queries but length 35
  EXPECT_THROW(plan.plan(more.args, 1), phasekv::invalid_argument);
  EXPECT_FALSE(plan.planned());
}

TEST(BatchPrefillWorkspace, SizeAndRefusals) {
  pst::BatchShape s;
  s.W = 8, s.S = 4, s.L = 16, s.kv_heads = 2, s.group = 2, s.d_k = 32, s.d_v = 32;
  s.lengths = {40, 9};
  PrefillCase<float> pc(s, {5, 9}, 3);
  phasekv::PrefillPlan plan;
  plan.plan(pc.args, 2);
  const std::size_t need = plan.workspace_bytes();
  EXPECT_GT(need, 64u);
  std::vector<unsigned char> ws(need, 0);
  std::fill(pc.out.begin(), pc.out.end(), 7.0f);
  EXPECT_THROW(phasekv::batch_prefill_partition(plan, pc.args, ws.data(), need - 1, 0, 2),
               phasekv::capacity_error);
  EXPECT_THROW(phasekv::batch_prefill_partition(plan, pc.args, nullptr, need, 0, 2),
               phasekv::invalid_argument);
  for (float x : pc.out) ASSERT_EQ(x, 7.0f);  // nothing written
  phasekv::batch_prefill(plan, pc.args, ws.data(), need);
  for (float x : pc.out) ASSERT_TRUE(std::isfinite(x));
  // no queries: no workspace
  PrefillCase<float> idle(s, {0, 0}, 3);
  phasekv::PrefillPlan none;
  none.plan(idle.args, 1);
  EXPECT_EQ(none.workspace_bytes(), 0u);
  phasekv::batch_prefill(none, idle.args, nullptr, 0);
}

}  // namespace
