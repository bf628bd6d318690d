// The attention argument layer (attention/args.hpp): every refusal with its exact message, one
// validation per public call, the null-workspace size query, and the head-dim dispatch list.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "decode_case.hpp"
#include "phasekv/attention/args.hpp"
#include "phasekv/attention/cpu/decode.hpp"
#include "phasekv/attention/cpu/prefill.hpp"
#include "phasekv/attention/cpu/thread_driver.hpp"
#include "phasekv/attention/head_dims.hpp"

namespace {

namespace cpu = phasekv::cpu;

// Runs f, expects exception E with exactly `message`.
template <class E>
void expect_message(const std::function<void()>& f, const std::string& message) {
  try {
    f();
    ADD_FAILURE() << "no exception, expected: " << message;
  } catch (const E& e) {
    EXPECT_EQ(std::string(e.what()), message);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what() << " (expected: " << message << ")";
  }
}

// A StandardVariant whose host check counts its calls: every validation of a decode or
// prefill call checks the variant once, so the count is the number of validations.
struct CountingVariant : phasekv::StandardVariant {
  int* checks = nullptr;
  void check(const char* where) const {
    ++*checks;
    phasekv::StandardVariant::check(where);
  }
};

pkt::DecodeShape small_shape() { return {100, 2, 3, 64, 48, 8, 4, 0, 16}; }

TEST(CpuArgs, DecodeRefusalsKeepTheirMessages) {
  pkt::DecodeCase<float> c(small_shape(), 7);
  using A = cpu::DecodeArgs<float>;
  const std::string w = "phasekv::cpu::decode: ";
  const auto refuse = [&](const std::function<void(A&)>& edit, const std::string& msg, bool shape) {
    A a = c.args;
    edit(a);
    if (shape)
      expect_message<phasekv::shape_error>([&] { cpu::decode(a); }, w + msg);
    else
      expect_message<phasekv::invalid_argument>([&] { cpu::decode(a); }, w + msg);
  };
  refuse([](A& a) { a.q_heads = 0; }, "q_heads = 0 is invalid (must be >= 1)", false);
  refuse([](A& a) { a.kv_heads = 0; }, "kv_heads = 0 is invalid (must be >= 1)", false);
  refuse([](A& a) { a.q_heads = 5; }, "q_heads = 5 is invalid (must be a multiple of kv_heads)",
         true);
  refuse([](A& a) { a.d_k = 0; }, "d_k = 0 is invalid (must be >= 1)", true);
  refuse([](A& a) { a.d_v = -3; }, "d_v = -3 is invalid (must be >= 1)", true);
  refuse([](A& a) { a.q = nullptr; }, "q = null is invalid (must point to [q_heads, d_k] floats)",
         false);
  refuse([](A& a) { a.out = nullptr; },
         "out = null is invalid (must point to [q_heads, d_v] floats)", false);
  refuse([](A& a) { a.lse = nullptr; }, "lse = null is invalid (must point to [q_heads] floats)",
         false);
  refuse([](A& a) { a.kv.count = 5; }, "kv.count = 5 is invalid (must be in [0, 4])", false);
  refuse([](A& a) { a.kv.segments[0].keys.data = nullptr; },
         "kv.segments[].keys = null is invalid (data is null but the view is not empty)", true);
  refuse([](A& a) { a.kv.segments[1].values.token_stride = -1; },
         "kv.segments[].values = -1 is invalid (strides must be >= 0)", true);
  refuse([](A& a) { a.kv.segments[0].values.tokens += 1; },
         "kv.segments[].values.tokens = " + std::to_string(c.args.kv.segments[0].keys.tokens + 1) +
             " is invalid (must equal keys.tokens)",
         true);
  refuse([](A& a) { a.kv.segments[1].keys.heads = 3; },
         "kv.segments[].keys.heads = 3 is invalid (must equal kv_heads)", true);
  refuse([](A& a) { a.kv.segments[0].values.heads = 1; },
         "kv.segments[].values.heads = 1 is invalid (must equal kv_heads)", true);
  refuse([](A& a) { a.kv.segments[1].keys.dim = 32; },
         "kv.segments[].keys.dim = 32 is invalid (must equal d_k)", true);
  refuse([](A& a) { a.kv.segments[1].values.dim = 64; },
         "kv.segments[].values.dim = 64 is invalid (must equal d_v)", true);
  refuse([](A& a) { a.variant.scale = std::numeric_limits<float>::infinity(); },
         "variant.scale = inf is invalid (must be finite)", false);
}

TEST(CpuArgs, EveryDecodeEntryPointNamesItself) {
  pkt::DecodeCase<float> c(small_shape(), 8);
  auto a = c.args;
  a.kv_heads = 0;
  cpu::ThreadPool pool(2);
  std::vector<float> ws(cpu::decode_workspace_size(c.args, 2) / sizeof(float));
  std::size_t bytes = ws.size() * sizeof(float);
  const std::string tail = ": kv_heads = 0 is invalid (must be >= 1)";
  using E = phasekv::invalid_argument;
  expect_message<E>([&] { cpu::decode_workspace_size(a, 1); },
                    "phasekv::cpu::decode_workspace_size" + tail);
  expect_message<E>([&] { cpu::decode_partition(a, ws.data(), bytes, 0, 2); },
                    "phasekv::cpu::decode_partition" + tail);
  expect_message<E>([&] { cpu::decode_merge(a, ws.data(), bytes, 2); },
                    "phasekv::cpu::decode_merge" + tail);
  expect_message<E>([&] { cpu::decode_parallel(a, pool); }, "phasekv::cpu::decode_parallel" + tail);
  expect_message<E>([&] { cpu::decode_parallel(a, pool, ws.data(), bytes); },
                    "phasekv::cpu::decode_parallel" + tail);
  expect_message<E>(
      [&] { cpu::decode_partition(c.args, ws.data(), bytes - 1, 0, 2); },
      "phasekv::cpu::decode_partition: workspace_bytes = " + std::to_string(bytes - 1) +
          " is invalid (must be >= decode_workspace_size())");
  expect_message<E>([&] { cpu::decode_parallel(c.args, pool, ws.data(), std::size_t{64}); },
                    "phasekv::cpu::decode_parallel: workspace_bytes = 64 is invalid (must be >= "
                    "decode_workspace_size())");
  expect_message<E>([&] { cpu::decode_merge(c.args, nullptr, bytes, 2); },
                    "phasekv::cpu::decode_merge: workspace = null is invalid (must point to "
                    "decode_workspace_size() bytes)");
}

TEST(CpuArgs, NullWorkspaceAsksForTheSize) {
  pkt::DecodeCase<float> c(small_shape(), 9);
  for (int parts : {1, 2, 3, 7}) {
    std::size_t bytes = 0;
    const std::vector<float> before = c.out;
    cpu::decode_partition(c.args, nullptr, bytes, 0, parts);
    EXPECT_EQ(bytes, cpu::decode_workspace_size(c.args, parts)) << parts;
    EXPECT_EQ(c.out, before);  // a query computes nothing
    // the queried size is enough: the split run succeeds and merges to the reference
    std::vector<unsigned char> ws(bytes);
    for (int p = 0; p < parts; ++p) cpu::decode_partition(c.args, ws.data(), bytes, p, parts);
    c.poison();
    cpu::decode_merge(c.args, ws.data(), bytes, parts);
    const pkt::ErrorStats e = c.error();
    EXPECT_TRUE(e.finite);
    EXPECT_LT(e.max_rel, 1e-5) << parts;
  }
  // the query checks the arguments first and leaves the size alone when they are bad
  auto bad = c.args;
  bad.d_k = 63;
  std::size_t bytes = 12345;
  EXPECT_THROW(cpu::decode_partition(bad, nullptr, bytes, 0, 2), phasekv::shape_error);
  EXPECT_EQ(bytes, 12345u);
  EXPECT_THROW(cpu::decode_partition(c.args, nullptr, bytes, 2, 2), phasekv::invalid_argument);
  EXPECT_EQ(bytes, 12345u);
  // a size that cannot be written back cannot be a query
  expect_message<phasekv::invalid_argument>(
      [&] { cpu::decode_partition(c.args, nullptr, std::size_t{0}, 0, 2); },
      "phasekv::cpu::decode_partition: workspace = null is invalid (must point to "
      "decode_workspace_size() bytes)");
}

TEST(CpuArgs, NullWorkspaceAsksDecodeParallelForTheSize) {
  pkt::DecodeCase<float> c(small_shape(), 10);
  for (int threads : {1, 3}) {
    cpu::ThreadPool pool(threads);
    std::size_t bytes = 0;
    c.poison();
    cpu::decode_parallel(c.args, pool, nullptr, bytes);
    EXPECT_EQ(bytes, cpu::decode_workspace_size(c.args, threads));
    for (float x : c.out) EXPECT_TRUE(std::isnan(x));  // nothing written
    std::vector<unsigned char> ws(bytes);
    cpu::decode_parallel(c.args, pool, ws.data(), bytes);
    const std::vector<float> par = c.out, par_lse = c.lse;
    // same partitions through the public split calls: the same bits
    std::vector<unsigned char> ws2(bytes);
    for (int p = 0; p < threads; ++p) cpu::decode_partition(c.args, ws2.data(), bytes, p, threads);
    c.poison();
    cpu::decode_merge(c.args, ws2.data(), bytes, threads);
    EXPECT_EQ(0, std::memcmp(par.data(), c.out.data(), par.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(par_lse.data(), c.lse.data(), par_lse.size() * sizeof(float)));
    EXPECT_LT(c.error().max_rel, 1e-5);
  }
}

TEST(CpuArgs, EachPublicCallValidatesOnce) {
  pkt::DecodeCase<float> c(small_shape(), 11);
  int checks = 0;
  cpu::DecodeArgs<float, CountingVariant> a;
  a.q = c.args.q;
  a.q_heads = c.args.q_heads;
  a.kv_heads = c.args.kv_heads;
  a.d_k = c.args.d_k;
  a.d_v = c.args.d_v;
  a.kv = c.args.kv;
  a.out = c.args.out;
  a.lse = c.args.lse;
  static_cast<phasekv::StandardVariant&>(a.variant) = c.args.variant;
  a.variant.checks = &checks;
  const auto count = [&](const std::function<void()>& f) {
    checks = 0;
    f();
    return checks;
  };
  EXPECT_EQ(count([&] { cpu::decode(a); }), 1);
  EXPECT_LT(c.error().max_rel, 1e-5);
  for (int threads : {1, 2, 4}) {
    cpu::ThreadPool pool(threads);
    EXPECT_EQ(count([&] { cpu::decode_parallel(a, pool); }), 1) << threads;
    std::size_t bytes = 0;
    EXPECT_EQ(count([&] { cpu::decode_parallel(a, pool, nullptr, bytes); }), 1);
    std::vector<unsigned char> ws(bytes);
    EXPECT_EQ(count([&] { cpu::decode_parallel(a, pool, ws.data(), bytes); }), 1) << threads;
    EXPECT_EQ(count([&] { cpu::decode_partition(a, ws.data(), bytes, 0, threads); }), 1);
    EXPECT_EQ(count([&] { cpu::decode_merge(a, ws.data(), bytes, threads); }), 1);
    EXPECT_EQ(count([&] { cpu::decode_workspace_size(a, threads); }), 1);
  }

  std::vector<float> rk(40 * 2 * 16), q(8 * 4 * 16), out(8 * 4 * 16), lse(32);
  for (std::size_t i = 0; i < rk.size(); ++i) rk[i] = static_cast<float>(i % 7) * 0.1f;
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(i % 5) * 0.2f;
  cpu::PrefillArgs<float, CountingVariant> p;
  p.q = q.data();
  p.num_queries = 8;
  p.q_heads = 4;
  p.kv_heads = 2;
  p.d_k = p.d_v = 16;
  p.first = 32;
  p.raw_k = p.raw_v = phasekv::make_view<const float>(rk.data(), 40, 2, 16);
  p.out = out.data();
  p.lse = lse.data();
  p.variant.checks = &checks;
  EXPECT_EQ(count([&] { cpu::prefill(p); }), 1);
  EXPECT_EQ(count([&] { cpu::prefill_partition(p, 0, 2); }), 1);
  for (int threads : {1, 3}) {
    cpu::ThreadPool pool(threads);
    EXPECT_EQ(count([&] { cpu::prefill_parallel(p, pool); }), 1) << threads;
  }
}

TEST(CpuArgs, PrefillRefusalsKeepTheirMessages) {
  std::vector<float> rk(100 * 2 * 16), ek(30 * 2 * 16), q(10 * 4 * 16), out(10 * 4 * 16), lse(40);
  cpu::PrefillArgs<float> base;
  base.q = q.data();
  base.num_queries = 10;
  base.q_heads = 4;
  base.kv_heads = 2;
  base.d_k = base.d_v = 16;
  base.first = 90;
  base.rule = cpu::VisibilityRule::compressed(phasekv::Geometry(4, 4), 8);  // J(100) = 25
  base.raw_k = base.raw_v = phasekv::make_view<const float>(rk.data(), 100, 2, 16);
  base.entry_k = base.entry_v = phasekv::make_view<const float>(ek.data(), 30, 2, 16);
  base.out = out.data();
  base.lse = lse.data();
  cpu::prefill(base);  // valid
  using A = cpu::PrefillArgs<float>;
  const auto refuse = [&](const std::function<void(A&)>& edit, const std::string& msg, int kind) {
    A a = base;
    edit(a);
    const std::string m = "phasekv::cpu::prefill: " + msg;
    const auto run = [&] { cpu::prefill(a); };
    if (kind == 1)
      expect_message<phasekv::shape_error>(run, m);
    else if (kind == 2)
      expect_message<phasekv::capacity_error>(run, m);
    else
      expect_message<phasekv::invalid_argument>(run, m);
  };
  refuse([](A& a) { a.num_queries = -1; }, "num_queries = -1 is invalid (must be >= 0)", 0);
  refuse([](A& a) { a.q_heads = 0; }, "q_heads = 0 is invalid (must be >= 1)", 0);
  refuse([](A& a) { a.kv_heads = 0; }, "kv_heads = 0 is invalid (must be >= 1)", 0);
  refuse([](A& a) { a.q_heads = 3; }, "q_heads = 3 is invalid (must be a multiple of kv_heads)", 1);
  refuse([](A& a) { a.d_k = 0; }, "d_k = 0 is invalid (must be >= 1)", 1);
  refuse([](A& a) { a.d_v = 0; }, "d_v = 0 is invalid (must be >= 1)", 1);
  refuse([](A& a) { a.q = nullptr; },
         "q = null is invalid (must point to [T, q_heads, d_k] floats)", 0);
  refuse([](A& a) { a.out = nullptr; },
         "out = null is invalid (must point to [T, q_heads, d_v] floats)", 0);
  refuse([](A& a) { a.lse = nullptr; }, "lse = null is invalid (must point to [T, q_heads] floats)",
         0);
  refuse([](A& a) { a.raw_k.data = nullptr; },
         "raw_k = null is invalid (data is null but the view is not empty)", 1);
  refuse([](A& a) { a.raw_v.heads = -1; }, "raw_v = -1 is invalid (heads must be >= 0)", 1);
  refuse([](A& a) { a.raw_k.tokens = 99; },
         "raw_k.tokens = 99 is invalid (must be >= first + num_queries)", 2);
  refuse([](A& a) { a.raw_v.tokens = 98; },
         "raw_v.tokens = 98 is invalid (must be >= first + num_queries)", 2);
  refuse([](A& a) { a.raw_k.heads = 1; }, "raw_k.heads = 1 is invalid (must equal kv_heads)", 1);
  refuse([](A& a) { a.raw_v.heads = 4; }, "raw_v.heads = 4 is invalid (must equal kv_heads)", 1);
  refuse([](A& a) { a.raw_k.dim = 8; }, "raw_k.dim = 8 is invalid (must equal d_k)", 1);
  refuse([](A& a) { a.raw_v.dim = 8; }, "raw_v.dim = 8 is invalid (must equal d_v)", 1);
  refuse([](A& a) { a.entry_k.data = nullptr; },
         "entry_k = null is invalid (data is null but the view is not empty)", 1);
  refuse([](A& a) { a.entry_k.tokens = 24; },
         "entry_k.tokens = 24 is invalid (must hold J(first + num_queries))", 2);
  refuse([](A& a) { a.entry_v.tokens = 0; },
         "entry_v.tokens = 0 is invalid (must hold J(first + num_queries))", 2);
  refuse([](A& a) { a.entry_k.heads = 3; }, "entry_k.heads = 3 is invalid (must equal kv_heads)",
         1);
  refuse([](A& a) { a.entry_v.heads = 1; }, "entry_v.heads = 1 is invalid (must equal kv_heads)",
         1);
  refuse([](A& a) { a.entry_k.dim = 15; }, "entry_k.dim = 15 is invalid (must equal d_k)", 1);
  refuse([](A& a) { a.entry_v.dim = 17; }, "entry_v.dim = 17 is invalid (must equal d_v)", 1);
  refuse([](A& a) { a.variant.softcap = -1.0f; },
         "variant.softcap = -1 is invalid (must be finite and >= 0 (0 disables))", 0);
  // no entries are visible before the first window completes: entry views are not read
  A early = base;
  early.first = 0;
  early.num_queries = 3;
  early.entry_k = early.entry_v = {};
  EXPECT_NO_THROW(cpu::prefill(early));
  // the other entry points name themselves
  A bad = base;
  bad.kv_heads = 0;
  cpu::ThreadPool pool(2);
  const std::string tail = ": kv_heads = 0 is invalid (must be >= 1)";
  expect_message<phasekv::invalid_argument>([&] { cpu::prefill_partition(bad, 0, 1); },
                                            "phasekv::cpu::prefill_partition" + tail);
  expect_message<phasekv::invalid_argument>([&] { cpu::prefill_parallel(bad, pool); },
                                            "phasekv::cpu::prefill_parallel" + tail);
  expect_message<phasekv::invalid_argument>([&] { cpu::prefill_work_items(bad, 2); },
                                            "phasekv::cpu::prefill_work_items" + tail);
}

TEST(HeadDims, OneListDispatchesEveryDim) {
  static_assert(std::is_same<phasekv::fast_head_dims, phasekv::head_dim_list<64, 128, 256>>::value,
                "the fast head dims");
  for (std::int64_t d = 0; d <= 512; ++d) {
    const bool fast = d == 64 || d == 128 || d == 256;
    EXPECT_EQ(phasekv::is_fast_head_dim(d), fast) << d;
    const int got = phasekv::dispatch_head_dim(d, [](auto dim) { return decltype(dim)::value; });
    EXPECT_EQ(got, fast ? static_cast<int>(d) : 0) << d;
    int seen = -1;
    phasekv::dispatch_head_dim(d, [&](auto dim) { seen = decltype(dim)::value; });
    EXPECT_EQ(seen, got) << d;
  }
}

}  // namespace

namespace {

// VisibilityRule::visible_kv and reference_visible build the same visible set (one builder,
// make_visible_kv), and refuse short views with their own messages.
TEST(VisibleSet, RuleAndReferenceBuildTheSameSet) {
  namespace pk = phasekv;
  std::vector<float> raw(300 * 2 * 8), ent(300 * 2 * 8);
  const auto rk = pk::make_view<const float>(raw.data(), 300, 2, 8);
  const auto ek = pk::make_view<const float>(ent.data(), 300, 2, 8);
  for (const pk::Geometry& g :
       {pk::Geometry(8, 4), pk::Geometry(8, 8, 3), pk::Geometry(1, 4, 2), pk::Geometry(16, 8, 5)})
    for (std::int64_t local : {0, 5, 16})
      for (std::int64_t n = 1; n <= 300; n += 7) {
        const pk::VisibleKV<float> a =
            cpu::VisibilityRule::compressed(g, local).visible_kv<float>(n, rk, rk, ek, ek);
        const pk::VisibleKV<float> b =
            pk::reference_visible<float>(g, local, n - 1, rk, rk, ek, ek);
        ASSERT_EQ(a.count, b.count);
        for (int s = 0; s < a.count; ++s) {
          EXPECT_EQ(a.segments[s].kind, b.segments[s].kind);
          EXPECT_EQ(a.segments[s].first, b.segments[s].first);
          EXPECT_EQ(a.segments[s].keys.data, b.segments[s].keys.data);
          EXPECT_EQ(a.segments[s].keys.tokens, b.segments[s].keys.tokens);
          EXPECT_EQ(a.segments[s].values.data, b.segments[s].values.data);
        }
        const pk::Visibility v = g.visible(n, local);
        EXPECT_EQ(a.total(), v.prefix_end + v.entries + v.raw_count());
      }
  const pk::Geometry g(8, 4);
  const auto rule = cpu::VisibilityRule::compressed(g, 16);
  expect_message<phasekv::capacity_error>(
      [&] { rule.visible_kv<float>(301, rk, rk, ek, ek); },
      "phasekv::cpu::VisibilityRule::visible_kv: raw_k.tokens = 300 is invalid (must be >= n)");
  expect_message<phasekv::capacity_error>(
      [&] { rule.visible_kv<float>(100, rk, rk, ek.slice(0, 23), ek); },
      "phasekv::cpu::VisibilityRule::visible_kv: entry_k.tokens = 23 is invalid (must hold J(n) "
      "entries)");
  expect_message<phasekv::capacity_error>(
      [&] { pk::reference_visible<float>(g, 16, 300, rk, rk, ek, ek); },
      "phasekv::reference_visible: raw_k.tokens = 300 is invalid (must cover position t)");
  expect_message<phasekv::capacity_error>(
      [&] { pk::reference_visible<float>(g, 16, 99, rk, rk, ek.slice(0, 23), ek); },
      "phasekv::reference_visible: entry_k.tokens = 23 is invalid (must hold J(t + 1) entries)");
}

}  // namespace
