// Queries and outputs in bf16 and f16 (accumulation f32, lse f32) for batch decode and batch
// prefill: the bits of the f32 path on the same (rounded) queries, rounded once at the end,
// and the measured error against the float64 reference per query/output type.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "phasekv/serving/batch_prefill.hpp"
#include "serving_case.hpp"

namespace {

using phasekv::bf16_t;
using phasekv::f16_t;
using i64 = std::int64_t;

template <class Q>
std::vector<Q> to_q(const std::vector<float>& x) {
  std::vector<Q> r(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) r[i] = phasekv::from_float<Q>(x[i]);
  return r;
}
template <class Q>
std::vector<float> to_f(const std::vector<Q>& x) {
  std::vector<float> r(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) r[i] = phasekv::to_float(x[i]);
  return r;
}
template <class Q>
bool same_bits(const std::vector<Q>& a, const std::vector<Q>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(Q)) == 0;
}
// Rounding of one output element of type Q (relative): the bound added to the kernels' own.
template <class Q>
constexpr double rounding() {
  return std::is_same<Q, bf16_t>::value ? 1.0 / 256 : 1.0 / 2048;
}

template <class Q>
class BatchLowPrecision : public ::testing::Test {};
using QTypes = ::testing::Types<bf16_t, f16_t>;
TYPED_TEST_SUITE(BatchLowPrecision, QTypes);

// Batch decode, bf16 KV pages, queries and outputs of type Q: the bits of the f32 path run on
// the rounded queries, rounded; within the f32 path's bound plus one rounding of the double
// reference; for 1 and 3 workers, pages of 16 and 5 slots, and per-KV-head origins.
TYPED_TEST(BatchLowPrecision, DecodeEqualsTheF32PathRounded) {
  using Q = TypeParam;
  pst::BatchShape s;
  s.W = 8, s.S = 4, s.O = 2, s.L = 20;
  s.kv_heads = 2, s.group = 3, s.d_k = 72, s.d_v = 40;  // d_v over one 64-wide merge tile: 100
  s.lengths = {0, 1, 9, 300, 1000, 77};
  std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f, 1.0f, -0.5f};
  phasekv::StandardVariant var;
  var.sinks = sinks.data();
  for (i64 P : {16, 5, 7}) {  // pages of 7: per-KV-head origins {0, 3}
    for (i64 dv : {40, 100}) {
      s.page_size = P, s.d_v = dv;
      if (P == 7) s.O = 0, s.origins = {0, 3};
      pst::BatchCase<bf16_t> c(s, 31, var);
      const std::vector<Q> q = to_q<Q>(c.q);
      c.q = to_f(q);  // the f32 path on the same query values
      c.args.q = c.q.data();
      c.run(2, 128);
      const std::vector<float> out32 = c.out, lse32 = c.lse;
      for (int workers : {1, 3}) {
        phasekv::BatchDecodeArgs<bf16_t, phasekv::StandardVariant, Q> a;
        a.q = q.data();
        a.q_heads = c.args.q_heads, a.kv_heads = c.args.kv_heads, a.d_k = s.d_k, a.d_v = s.d_v;
        a.kv = c.args.kv;
        a.variant = c.args.variant;
        std::vector<Q> out(c.out.size(), phasekv::from_float<Q>(std::nanf("")));
        std::vector<float> lse(c.lse.size(), std::nanf(""));
        a.out = out.data();
        a.lse = lse.data();
        phasekv::DecodePlan plan;
        plan.plan(a, workers, 128);
        std::vector<unsigned char> ws(plan.workspace_bytes());
        for (int w = workers - 1; w >= 0; --w)
          phasekv::batch_decode_partition(plan, a, ws.data(), ws.size(), w, workers);
        phasekv::batch_decode_merge(plan, a, ws.data(), ws.size(), 1, 2);
        phasekv::batch_decode_merge(plan, a, ws.data(), ws.size(), 0, 2);
        EXPECT_TRUE(same_bits(out, to_q<Q>(out32))) << s.name() << " workers " << workers;
        EXPECT_TRUE(same_bits(lse, lse32)) << s.name() << " workers " << workers;
        // against the double reference (whose query is the rounded one)
        double worst = 0.0;
        const std::vector<float> of = to_f(out);
        for (i64 b = 0; b < c.B; ++b) {
          std::vector<double> ro, rl;
          c.reference(b, ro, rl);
          const pkt::ErrorStats e = pkt::compare(of.data() + b * c.hq * dv, lse.data() + b * c.hq,
                                                 ro.data(), rl.data(), c.hq, dv);
          ASSERT_TRUE(e.finite) << s.name() << " sequence " << b;
          EXPECT_LE(e.max_rel, pkt::tolerance<bf16_t>() + rounding<Q>()) << s.name();
          EXPECT_LE(e.max_lse, pkt::tolerance<bf16_t>()) << s.name();
          worst = std::max(worst, e.max_rel);
        }
        if (P == 16 && dv == 100 && workers == 1)
          std::printf("[ measured ] batch decode, KV bf16, q/out %s: max rel error %.2e\n",
                      std::is_same<Q, bf16_t>::value ? "bf16" : "f16", worst);
      }
    }
  }
}

// Batch prefill (chunks and decode rows mixed), f32 KV pages, queries and outputs of type Q:
// the bits of the f32 path on the rounded queries, rounded; against the double reference.
TYPED_TEST(BatchLowPrecision, PrefillEqualsTheF32PathRounded) {
  using Q = TypeParam;
  pst::BatchShape s;
  s.W = 8, s.S = 4, s.O = 1, s.L = 12;
  s.kv_heads = 2, s.group = 4, s.d_k = 48, s.d_v = 80;
  s.lengths = {0, 1, 40, 300, 129};
  const std::vector<i64> qb = {0, 1, 17, 70, 1};
  pst::BatchCase<float> c(s, 5);
  std::vector<std::int32_t> qo{0};
  for (i64 x : qb) qo.push_back(qo.back() + static_cast<std::int32_t>(x));
  const i64 rows = qo.back(), hq = c.hq;
  const std::vector<float> q32 =
      to_f(to_q<Q>(pkt::random_floats(static_cast<std::size_t>(rows * hq * s.d_k), 77)));
  const std::vector<Q> q = to_q<Q>(q32);
  // the f32 path
  phasekv::BatchPrefillArgs<float> f;
  f.q = q32.data(), f.qo_indptr = qo.data(), f.q_heads = hq, f.kv_heads = s.kv_heads;
  f.d_k = s.d_k, f.d_v = s.d_v, f.kv = c.args.kv, f.variant = c.args.variant;
  std::vector<float> out32(static_cast<std::size_t>(rows * hq * s.d_v), std::nanf(""));
  std::vector<float> lse32(static_cast<std::size_t>(rows * hq), std::nanf(""));
  f.out = out32.data(), f.lse = lse32.data();
  phasekv::PrefillPlan fplan;
  fplan.plan(f, 2);
  phasekv::batch_prefill(fplan, f);
  for (int workers : {1, 3}) {
    phasekv::BatchPrefillArgs<float, phasekv::StandardVariant, Q> a;
    a.q = q.data(), a.qo_indptr = qo.data(), a.q_heads = hq, a.kv_heads = s.kv_heads;
    a.d_k = s.d_k, a.d_v = s.d_v, a.kv = c.args.kv, a.variant = c.args.variant;
    std::vector<Q> out(out32.size(), phasekv::from_float<Q>(std::nanf("")));
    std::vector<float> lse(lse32.size(), std::nanf(""));
    a.out = out.data(), a.lse = lse.data();
    phasekv::PrefillPlan plan;
    plan.plan(a, workers);
    std::vector<unsigned char> ws(plan.workspace_bytes());
    phasekv::batch_prefill(plan, a, ws.data(), ws.size());
    EXPECT_TRUE(same_bits(out, to_q<Q>(out32))) << "workers " << workers;
    EXPECT_TRUE(same_bits(lse, lse32)) << "workers " << workers;
    std::fill(out.begin(), out.end(), phasekv::from_float<Q>(std::nanf("")));
    phasekv::batch_prefill(plan, a);  // the overload that allocates its scratch
    EXPECT_TRUE(same_bits(out, to_q<Q>(out32))) << "allocating, workers " << workers;
    // against the double reference, query by query (cpu::prefill's visible set of position t)
    double worst = 0.0;
    const std::vector<float> of = to_f(out);
    for (i64 b = 0; b < c.B; ++b) {
      for (i64 i = 0; i < qb[static_cast<std::size_t>(b)]; ++i) {
        const i64 r = qo[static_cast<std::size_t>(b)] + i;
        const i64 n =
            s.lengths[static_cast<std::size_t>(b)] - qb[static_cast<std::size_t>(b)] + i + 1;
        std::vector<double> ro(static_cast<std::size_t>(hq * s.d_v)),
            rl(static_cast<std::size_t>(hq));
        using CV = phasekv::StridedView<const float>;
        const i64 J = s.rule().at(n).entries;
        const CV rk = phasekv::make_view<const float>(c.raw_k[b].data(), n, s.kv_heads, s.d_k);
        const CV rv = phasekv::make_view<const float>(c.raw_v[b].data(), n, s.kv_heads, s.d_v);
        const CV ek = phasekv::make_view<const float>(c.ent_k[b].data(), J, s.kv_heads, s.d_k);
        const CV ev = phasekv::make_view<const float>(c.ent_v[b].data(), J, s.kv_heads, s.d_v);
        phasekv::reference_decode<float>(q32.data() + r * hq * s.d_k, hq,
                                         s.rule().template visible_kv<float>(n, rk, rv, ek, ev),
                                         a.variant, ro.data(), rl.data());
        const pkt::ErrorStats e = pkt::compare(of.data() + r * hq * s.d_v, lse.data() + r * hq,
                                               ro.data(), rl.data(), hq, s.d_v);
        ASSERT_TRUE(e.finite) << "sequence " << b << " query " << i;
        EXPECT_LE(e.max_rel, pkt::tolerance<float>() + rounding<Q>()) << "sequence " << b;
        EXPECT_LE(e.max_lse, pkt::tolerance<float>()) << "sequence " << b;
        worst = std::max(worst, e.max_rel);
      }
    }
    if (workers == 1)
      std::printf("[ measured ] batch prefill, KV f32, q/out %s: max rel error %.2e\n",
                  std::is_same<Q, bf16_t>::value ? "bf16" : "f16", worst);
  }
}

}  // namespace
