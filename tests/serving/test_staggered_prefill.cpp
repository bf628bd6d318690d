// Ragged batch prefill with per-KV-head origins (PagedKV::origins), decode rows mixed in: against
// cpu::prefill with origins of each sequence over contiguous buffers (same bits), the double
// reference per head, and across page sizes, rings and thread counts (same bits).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "prefill_case.hpp"
#include "staggered_case.hpp"

namespace {

using phasekv::bf16_t;
using phasekv::f16_t;

// The one prefill case (prefill_case.hpp) with the per-head origins of sst::Shape.
template <class T>
struct PrefillCase : pst::PrefillCase<T> {
  using pst::PrefillCase<T>::PrefillCase;
  using pst::PrefillCase<T>::c;
  using pst::PrefillCase<T>::q;
  using pst::PrefillCase<T>::qo;
  using pst::PrefillCase<T>::out;
  using pst::PrefillCase<T>::lse;
  using pst::PrefillCase<T>::args;
  using pst::PrefillCase<T>::queries;
  // cpu::prefill with per-head origins of sequence b over its contiguous buffers
  void single(std::int64_t b, float* o, float* l) const {
    phasekv::cpu::prefill(this->single_args(b, o, l));
  }
  // every query row of every sequence against the double reference, KV head by KV head
  void expect_close_to_reference(const std::string& what) const {
    const auto& s = c.shape;
    const std::int64_t G = s.group;
    std::vector<double> ro(static_cast<std::size_t>(G * s.d_v)), rl(static_cast<std::size_t>(G));
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t i = 0; i < queries(b); ++i)
        for (std::int64_t h = 0; h < s.kv_heads; ++h) {
          const std::int64_t row = qo[b] + i, t = s.lengths[b] - queries(b) + i;
          const phasekv::VisibleKV<T> kv = phasekv::reference_visible<T>(
              s.head(h), s.L, t, phasekv::head_view(c.rk(b), h), phasekv::head_view(c.rv(b), h),
              phasekv::head_view(c.ek(b), h), phasekv::head_view(c.ev(b), h));
          phasekv::reference_decode<T>(q.data() + (row * c.hq + h * G) * s.d_k, G, kv,
                                       phasekv::cpu::slice_variant(args.variant, h * G), ro.data(),
                                       rl.data());
          const pkt::ErrorStats e =
              pkt::compare(out.data() + (row * c.hq + h * G) * s.d_v,
                           lse.data() + row * c.hq + h * G, ro.data(), rl.data(), G, s.d_v);
          ASSERT_TRUE(e.finite) << what << " sequence " << b << " query " << i << " head " << h;
          EXPECT_LE(e.max_rel, pkt::tolerance<T>()) << what << " sequence " << b << " head " << h;
          EXPECT_LE(e.max_lse, pkt::tolerance<T>()) << what << " sequence " << b << " head " << h;
        }
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

template <class T>
class StaggeredBatchPrefill : public ::testing::Test {};
using Types = ::testing::Types<float, bf16_t, f16_t>;
TYPED_TEST_SUITE(StaggeredBatchPrefill, Types);

// Chunks that start mid-window, chunks longer than a window, whole prompts, decode rows (one
// query) and a sequence of length 0: the bits of cpu::prefill with origins per sequence, for
// page sizes 1, 16, 64 and threads 1, 2, 3; and the double reference per head.
TYPED_TEST(StaggeredBatchPrefill, SameBitsAsStaggeredPrefill) {
  using T = TypeParam;
  sst::Shape s;
  s.kv_heads = 3, s.group = 3, s.d_k = 64, s.d_v = 56;
  s.W = 8, s.S = 4, s.L = 6, s.origins = {0, 5, 2};
  s.lengths = {0, 1, 7, 23, 97, 40, 9, 130};
  const std::vector<std::int64_t> qb = {0, 1, 7, 13, 1, 40, 3, 61};
  PrefillCase<T> base(s, qb, 13);
  std::vector<float> so(base.out.size()), sl(base.lse.size());
  for (std::int64_t b = 0; b < base.c.B; ++b)
    base.single(b, so.data() + base.qo[b] * base.c.hq * s.d_v, sl.data() + base.qo[b] * base.c.hq);
  for (std::int64_t P : {1, 16, 64}) {
    sst::Shape v = s;
    v.page_size = P;
    PrefillCase<T> pc(v, qb, 13, {}, 77 + static_cast<std::uint32_t>(P));
    for (int threads : {1, 2, 3}) {
      pc.run(threads);
      EXPECT_TRUE(same_bits(pc.out, so) && same_bits(pc.lse, sl))
          << v.name() << " threads " << threads;
    }
    if (P == 16) pc.expect_close_to_reference(v.name());
  }
}

// A ring of max(W, L) + 3 slots after O_max with chunks that fit it, HND pages in one pool,
// sinks and soft cap: the bits of the all-raw layout and of cpu::prefill with origins.
TYPED_TEST(StaggeredBatchPrefill, RingAndVariants) {
  using T = TypeParam;
  sst::Shape s;
  s.kv_heads = 4, s.group = 2, s.d_k = 96, s.d_v = 96;
  s.W = 8, s.S = 8, s.L = 8, s.origins = phasekv::even_origins(8, 4);
  s.lengths = {1000, 8, 0, 31, 97};
  const std::vector<std::int64_t> qb = {1, 8, 0, 2, 1};
  std::vector<float> sinks(8);
  for (std::size_t i = 0; i < sinks.size(); ++i) sinks[i] = 0.5f * static_cast<float>(i) - 1.0f;
  phasekv::StandardVariant var;
  var.softcap = 15.0f;
  var.entry_bias = -0.5f;
  var.sinks = sinks.data();
  PrefillCase<T> all(s, qb, 3, var);
  all.run(2);
  sst::Shape r = s;
  r.ring = true, r.one_pool = true, r.layout = phasekv::Layout::HND, r.page_size = 5;
  PrefillCase<T> ring(r, qb, 3, var);
  phasekv::PrefillPlan plan;
  plan.plan(ring.args, 3);
  phasekv::cpu::ThreadPool pool(3);
  phasekv::batch_prefill_parallel(plan, ring.args, pool);
  EXPECT_TRUE(same_bits(all.out, ring.out) && same_bits(all.lse, ring.lse));
  std::vector<float> so(all.out.size()), sl(all.lse.size());
  for (std::int64_t b = 0; b < all.c.B; ++b)
    all.single(b, so.data() + all.qo[b] * all.c.hq * s.d_v, sl.data() + all.qo[b] * all.c.hq);
  EXPECT_TRUE(same_bits(all.out, so) && same_bits(all.lse, sl));
  ring.expect_close_to_reference(r.name());
}

// Equal origins: the same bits as the same pages described without origins, with the rule's
// origin set to the shared one.
TEST(StaggeredBatchPrefillUniform, EqualOriginsAreTheUniformPath) {
  sst::Shape s;
  s.origins = {2, 2, 2};
  s.lengths = {30, 0, 97, 5};
  const std::vector<std::int64_t> qb = {9, 0, 1, 5};
  PrefillCase<float> pc(s, qb, 21);
  pc.run(2);
  const std::vector<float> out = pc.out, lse = pc.lse;
  phasekv::BatchPrefillArgs<float> u = pc.args;
  u.kv.origins = nullptr;
  u.kv.rule = phasekv::cpu::VisibilityRule::compressed(phasekv::Geometry(s.W, s.S, 2), s.L);
  phasekv::PrefillPlan up;
  up.plan(u, 2);
  std::fill(pc.out.begin(), pc.out.end(), std::nanf(""));
  phasekv::batch_prefill(up, u);
  EXPECT_TRUE(same_bits(out, pc.out) && same_bits(lse, pc.lse));
  pc.expect_close_to_reference(s.name());
}

// A chunk that needs raw tokens the ring no longer holds for one head, and queries beyond the
// length: clear errors naming the argument, nothing written.
TEST(StaggeredBatchPrefillErrors, RefusedBeforeAnythingIsWritten) {
  sst::Shape s;
  s.lengths = {60, 20};
  s.ring = true;  // 16 + 3 slots after O_max = 9
  PrefillCase<float> pc(s, {30, 1}, 4);
  phasekv::PrefillPlan plan;
  try {
    plan.plan(pc.args, 1);
    ADD_FAILURE() << "accepted";
  } catch (const phasekv::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("kv.ring_slots"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sequence 0"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(plan.planned());
  PrefillCase<float> pc2(s, {3, 21}, 4);
  EXPECT_THROW(plan.plan(pc2.args, 1), phasekv::invalid_argument);
  EXPECT_THROW(phasekv::batch_prefill_partition(plan, pc2.args, 0, 1), phasekv::invalid_argument);
  for (float x : pc2.out) EXPECT_TRUE(std::isnan(x));
}

}  // namespace
