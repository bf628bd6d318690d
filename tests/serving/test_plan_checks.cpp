// A run is either exactly what its plan was made for, or refused before anything is read or
// written (issue 39, point 1). The seven cases an outside check found accepted (three of them
// read past a block table under AddressSanitizer), and the messages that named the wrong field.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "phasekv/compress/uniform_mean.hpp"
#include "phasekv/dsv4/paged_latent.hpp"
#include "phasekv/serving/batch_prefill.hpp"
#include "phasekv/serving/paged_append.hpp"
#include "prefill_case.hpp"
#include "serving_case.hpp"

namespace {

using i64 = std::int64_t;

// Runs `f`, expects a phasekv::invalid_argument whose message holds every one of `parts`,
// and that nothing of `out` changed (it was poisoned with NaN before).
template <class F>
void expect_refused(F&& f, const std::vector<std::string>& parts, const std::vector<float>& out,
                    const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": accepted";
  } catch (const phasekv::invalid_argument& e) {
    const std::string m = e.what();
    for (const std::string& p : parts)
      EXPECT_NE(m.find(p), std::string::npos) << what << ": '" << p << "' not in: " << m;
  }
  for (float x : out) {
    EXPECT_TRUE(std::isnan(x)) << what << ": an output was written";
    if (!std::isnan(x)) break;
  }
}

// A prefill case planned on one worker, with its workspace: what each case then runs with
// one argument changed.
struct PlannedPrefill {
  pst::PrefillCase<float> p;
  phasekv::PrefillPlan plan;
  std::vector<unsigned char> ws;

  PlannedPrefill(const pst::BatchShape& s, const std::vector<i64>& qb) : p(s, qb, 7) {
    plan.plan(p.args, 1);
    ws.resize(plan.workspace_bytes());
  }
  // Expects `run` refused with `parts` in the message, nothing written.
  void refused(const phasekv::BatchPrefillArgs<float>& run, const std::vector<std::string>& parts,
               const std::string& what) {
    expect_refused([&] { phasekv::batch_prefill(plan, run, ws.data(), ws.size()); }, parts, p.out,
                   what);
  }
};

// Case 1: batch decode planned with W8 S4 O2 and run with W1 S4 O0, whose visible totals are
// the same (n = 23, L = 16: 2 + 4 + 16 and 0 + 6 + 16): the old run compared only the totals
// and read entries 4 and 5 through a one-page entry table of 4-slot pages.
TEST(PlanChecks, DecodeRefusesAnotherRuleWithTheSameTotals) {
  pst::BatchShape s;
  s.W = 8, s.S = 4, s.O = 2, s.L = 16, s.page_size = 4;
  s.lengths = {23};
  pst::BatchCase<float> c(s, 3);
  phasekv::DecodePlan plan;
  plan.plan(c.args, 1, 64);
  std::vector<unsigned char> ws(plan.workspace_bytes());
  phasekv::BatchDecodeArgs<float> run = c.args;
  run.kv.rule = phasekv::cpu::VisibilityRule::compressed(phasekv::Geometry(1, 4, 0), 16);
  ASSERT_EQ(run.kv.rule.at(23).total(), c.args.kv.rule.at(23).total());
  c.poison();
  expect_refused([&] { phasekv::batch_decode(plan, run, ws.data(), ws.size()); },
                 {"kv.rule", "plan again"}, c.out, "decode, other rule");
  expect_refused([&] { phasekv::batch_decode_partition(plan, run, ws.data(), ws.size(), 0, 1); },
                 {"kv.rule"}, c.out, "decode partition, other rule");
  // the planned rule still runs
  ASSERT_NO_THROW(phasekv::batch_decode(plan, c.args, ws.data(), ws.size()));
}

// Case 2: batch prefill checked no rule at all.
TEST(PlanChecks, PrefillRefusesAnotherRule) {
  pst::BatchShape s;
  s.W = 8, s.S = 4, s.O = 2, s.L = 16, s.page_size = 4;
  s.lengths = {23, 9};
  PlannedPrefill t(s, {3, 1});
  for (const auto& rule : {phasekv::cpu::VisibilityRule::compressed(phasekv::Geometry(1, 4, 0), 16),
                           phasekv::cpu::VisibilityRule::compressed(phasekv::Geometry(8, 4, 2), 17),
                           phasekv::cpu::VisibilityRule::causal()}) {
    phasekv::BatchPrefillArgs<float> run = t.p.args;
    run.kv.rule = rule;
    t.refused(run, {"kv.rule", "plan again"}, "prefill, other rule");
  }
  ASSERT_NO_THROW(phasekv::batch_prefill(t.plan, t.p.args, t.ws.data(), t.ws.size()));
}

// Case 3: batch prefill accepted another ring_slots (the output moved by 2.46).
TEST(PlanChecks, PrefillRefusesAnotherRing) {
  pst::BatchShape s;
  s.W = 8, s.S = 4, s.O = 2, s.L = 16, s.page_size = 4, s.ring = true;
  s.lengths = {60, 9};
  PlannedPrefill t(s, {2, 1});
  phasekv::BatchPrefillArgs<float> run = t.p.args;
  run.kv.ring_slots += 2;
  t.refused(run, {"kv.ring_slots = " + std::to_string(run.kv.ring_slots), "planned"},
            "prefill, other ring");
}

// Case 4: batch prefill accepted a pool of 2-slot pages where 4 were planned (out of bounds).
TEST(PlanChecks, PrefillRefusesAnotherPageSize) {
  pst::BatchShape s;
  s.W = 8, s.S = 4, s.O = 2, s.L = 16, s.page_size = 4;
  s.lengths = {23, 40};
  PlannedPrefill t(s, {3, 5});
  phasekv::BatchPrefillArgs<float> run = t.p.args;
  run.kv.raw_pool.page_size = 2;
  t.refused(run, {"kv.raw_pool.page_size = 2", "4"}, "prefill, raw page size");
  run = t.p.args;
  run.kv.entry_pool.page_size = 2;
  t.refused(run, {"kv.entry_pool.page_size = 2"}, "prefill, entry page size");
}

// Case 5: a pool that declares fewer pages than planned (the planned page indices may lie
// past it), in prefill and decode.
TEST(PlanChecks, RunsRefuseAPoolWithFewerPages) {
  pst::BatchShape s;
  s.W = 8, s.S = 4, s.O = 2, s.L = 16, s.page_size = 4;
  s.lengths = {23, 40};
  PlannedPrefill t(s, {3, 5});
  phasekv::BatchPrefillArgs<float> run = t.p.args;
  run.kv.raw_pool.pages -= 3;
  t.refused(run, {"kv.raw_pool.pages = " + std::to_string(run.kv.raw_pool.pages)},
            "prefill, fewer raw pages");
  pst::BatchCase<float>& c = t.p.c;
  phasekv::DecodePlan dplan;
  dplan.plan(c.args, 2, 64);
  std::vector<unsigned char> dws(dplan.workspace_bytes());
  phasekv::BatchDecodeArgs<float> drun = c.args;
  drun.kv.entry_pool.pages -= 1;
  c.poison();
  expect_refused([&] { phasekv::batch_decode(dplan, drun, dws.data(), dws.size()); },
                 {"kv.entry_pool.pages = " + std::to_string(drun.kv.entry_pool.pages)}, c.out,
                 "decode, fewer entry pages");
}

// A table changed after the plan (same lengths): refused, naming the table, the sequence and
// the index.
TEST(PlanChecks, RunsRefuseAChangedTable) {
  pst::BatchShape s;
  s.W = 8, s.S = 4, s.O = 2, s.L = 16, s.page_size = 4;
  s.lengths = {23, 40};
  PlannedPrefill t(s, {3, 5});
  pst::BatchCase<float>& c = t.p.c;
  std::vector<std::int32_t> raw = c.raw_indices;
  std::swap(raw[1], raw[7]);  // sequence 0 index 1 and sequence 1 index 1 (6 + 1)
  phasekv::BatchPrefillArgs<float> run = t.p.args;
  run.kv.raw_table.indices = raw.data();
  t.refused(run, {"kv.raw_table sequence 0 index 1"}, "prefill, changed raw table");
  phasekv::DecodePlan dplan;
  dplan.plan(c.args, 1, 64);
  std::vector<unsigned char> dws(dplan.workspace_bytes());
  phasekv::BatchDecodeArgs<float> drun = c.args;
  std::vector<std::int32_t> ent = c.ent_indices;
  ent.back() = ent.front();
  drun.kv.entry_table.indices = ent.data();
  c.poison();
  expect_refused([&] { phasekv::batch_decode(dplan, drun, dws.data(), dws.size()); },
                 {"kv.entry_table sequence 1 index"}, c.out, "decode, changed entry table");
}

// One [K|V] pool holding 12 pages of 4 slots, H 1, d 4: an append of sequence 0 (raw pages
// 0, 1) and sequence 1 (raw page 2, entry page 0 of `entry_pool`).
struct AppendSetup {
  static constexpr i64 P = 4, H = 1, d = 4;
  std::vector<float> data = std::vector<float>(static_cast<std::size_t>(12 * P * H * 2 * d), 0.f);
  std::vector<i64> lengths{0, 0};
  std::vector<std::int32_t> new_indptr{0, 8, 16};
  std::vector<std::int32_t> raw_ptr{0, 2, 4}, raw_ind{0, 1, 2, 3};
  std::vector<std::int32_t> ent_ptr{0, 1, 2}, ent_ind{4, 5};
  std::vector<float> k = pkt::random_floats(16 * H * d, 1), v = pkt::random_floats(16 * H * d, 2);
  phasekv::PagedAppendArgs<float> a;

  AppendSetup() {
    a.raw_pool = phasekv::make_kv_page_pool(data.data(), 12, P, H, d, d);
    a.entry_pool = a.raw_pool;
    a.raw_table = phasekv::csr_block_table(raw_ptr.data(), raw_ind.data(), 2);
    a.entry_table = phasekv::csr_block_table(ent_ptr.data(), ent_ind.data(), 2);
    a.lengths = lengths.data();
    a.batch = 2;
    a.new_indptr = new_indptr.data();
    a.keys = phasekv::make_view<const float>(k.data(), 16, H, d);
    a.values = phasekv::make_view<const float>(v.data(), 16, H, d);
  }
};

// Case 6: an entry pool described over the raw pool's memory with another page count was
// taken for another pool, and entries went into another sequence's raw pages. Overlap is a
// matter of memory, not of descriptors.
TEST(PlanChecks, AppendRefusesPagesThatShareMemory) {
  const phasekv::UniformMean pol(phasekv::Geometry(4, 4), AppendSetup::d);
  {
    AppendSetup s;  // entry page 0 of sequence 1 is raw page 0 of sequence 0
    s.ent_ind = {4, 0};
    s.a.entry_pool = phasekv::make_kv_page_pool(s.data.data(), 6, AppendSetup::P, AppendSetup::H,
                                                AppendSetup::d, AppendSetup::d);
    const std::vector<float> before = s.data;
    try {
      phasekv::paged_append(pol, pol, 0, s.a);
      ADD_FAILURE() << "overlapping pages accepted";
    } catch (const phasekv::invalid_argument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("entry_table sequence 1 index 0"), std::string::npos) << m;
      EXPECT_NE(m.find("raw_table sequence 0 index 0"), std::string::npos) << m;
    }
    EXPECT_EQ(s.data, before) << "something was written";
  }
  {
    AppendSetup s;  // an entry pool whose pages straddle two raw pages (half a page offset)
    s.ent_ind = {7, 8};
    s.a.entry_pool =
        phasekv::make_kv_page_pool(s.data.data() + AppendSetup::P * AppendSetup::d, 10,
                                   AppendSetup::P, AppendSetup::H, AppendSetup::d, AppendSetup::d);
    s.raw_ind = {0, 1, 8, 9};
    EXPECT_THROW(phasekv::paged_append(pol, pol, 0, s.a), phasekv::invalid_argument);
  }
  {
    AppendSetup s;  // the same memory described twice, but disjoint pages: accepted
    s.a.entry_pool = phasekv::make_kv_page_pool(s.data.data(), 6, AppendSetup::P, AppendSetup::H,
                                                AppendSetup::d, AppendSetup::d);
    EXPECT_NO_THROW(phasekv::paged_append(pol, pol, 0, s.a));
  }
}

// Case 7: four messages named the wrong field.
TEST(PlanChecks, MessagesNameTheFieldThatDiffers) {
  const phasekv::UniformMean pol(phasekv::Geometry(4, 4), AppendSetup::d);
  const auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const phasekv::invalid_argument& e) {
      return e.what();
    }
    return "accepted";
  };
  {
    AppendSetup s;  // values.dim, not keys.dim
    std::vector<float> v5(16 * 5);
    s.a.values = phasekv::make_view<const float>(v5.data(), 16, 1, 5);
    const std::string m = message([&] { phasekv::paged_append(pol, pol, 0, s.a); });
    EXPECT_NE(m.find("values.dim = 5"), std::string::npos) << m;
  }
  {
    AppendSetup s;  // a null lengths, not new_indptr
    s.a.lengths = nullptr;
    const std::string m = message([&] { phasekv::paged_append(pol, pol, 0, s.a); });
    EXPECT_NE(m.find("lengths = null"), std::string::npos) << m;
  }
  {
    AppendSetup s;  // a value policy that differs in S and O: both geometries in full
    const phasekv::UniformMean vpol(phasekv::Geometry(4, 2, 1), AppendSetup::d);
    const std::string m = message([&] { phasekv::paged_append(pol, vpol, 0, s.a); });
    EXPECT_NE(m.find("value_policy.geometry() = (W 4, S 2, O 1)"), std::string::npos) << m;
    EXPECT_NE(m.find("(W 4, S 4, O 0)"), std::string::npos) << m;
  }
  {
    pst::BatchShape s;  // a changed rule is named as the rule, not as kv.lengths[0]
    s.lengths = {50};
    pst::BatchCase<float> c(s, 3);
    phasekv::DecodePlan plan;
    plan.plan(c.args, 1, 64);
    std::vector<unsigned char> ws(plan.workspace_bytes());
    phasekv::BatchDecodeArgs<float> run = c.args;
    run.kv.rule = phasekv::cpu::VisibilityRule::compressed(phasekv::Geometry(8, 8, 2), s.L);
    const std::string m = message([&] { phasekv::batch_decode(plan, run, ws.data(), ws.size()); });
    EXPECT_NE(m.find("kv.rule"), std::string::npos) << m;
    EXPECT_EQ(m.find("kv.lengths"), std::string::npos) << m;
  }
}

}  // namespace

// The DeepSeek-V4 paged append (compress_append_paged) checks its tables with the same walk and
// refuses a page it writes that another sequence of the call also lists (writes or reads);
// pages both only read (a shared prefix of complete entries) are accepted.
TEST(PlanChecks, LatentAppendRefusesWritesIntoSharedPages) {
  std::vector<float> data(8 * 2 * 4);
  const auto pool = phasekv::dsv4::latent_page_pool(data.data(), 8, 2, 4);
  const std::vector<i64> tokens = {5, 5};  // one new token each, ratio 1: entry 5 (index 2)
  std::vector<std::int32_t> ptr{0, 3, 6};
  const auto check = [&](std::vector<std::int32_t> ind) {
    const phasekv::BlockTable t = phasekv::csr_block_table(ptr.data(), ind.data(), 2);
    phasekv::dsv4::detail::check_append_entry_pages(pool, t, 2, tokens.data(), nullptr, 1, 4,
                                                    "test", "pool", "entry_table");
  };
  EXPECT_NO_THROW(check({0, 1, 2, 3, 4, 5}));
  EXPECT_NO_THROW(check({0, 1, 2, 0, 1, 5}));  // entries 0-3 shared, read by both
  const auto refused = [&](std::vector<std::int32_t> ind, const std::string& a,
                           const std::string& b) {
    try {
      check(ind);
      ADD_FAILURE() << "accepted";
    } catch (const phasekv::invalid_argument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(a), std::string::npos) << m;
      EXPECT_NE(m.find(b), std::string::npos) << m;
    }
  };
  refused({0, 1, 2, 3, 4, 2}, "entry_table sequence 1 index 2", "entry_table sequence 0 index 2");
  refused({0, 1, 2, 2, 4, 5}, "entry_table sequence 1 index 0", "entry_table sequence 0 index 2");
  EXPECT_THROW(check({0, 1, 2, 3, 4, 9}), phasekv::invalid_argument);  // outside the pool
}
