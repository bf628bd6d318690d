// The bad-input catalogue of docs/errors.md: every case there names the test that checks it.
// Each refusal here asserts the exact exception type, a message substring naming the argument
// and its value, and that nothing was written: the outputs, workspaces and caches the call
// could write are compared byte for byte with a snapshot taken before the call (outputs are
// poisoned first, so a partial write of any value shows).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <typeinfo>
#include <vector>

#include "phasekv/attention/cpu/cpu_features.hpp"
#include "phasekv/attention/cpu/decode.hpp"
#include "phasekv/attention/cpu/dispatch.hpp"
#include "phasekv/attention/cpu/prefill.hpp"
#include "phasekv/attention/cpu/thread_driver.hpp"
#include "phasekv/attention/cpu/thread_pool.hpp"
#include "phasekv/attention/cpu/visibility_rule.hpp"
#include "phasekv/compress/compress_batch.hpp"
#include "phasekv/compress/compressed_cache.hpp"
#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/compress/max_pool.hpp"
#include "phasekv/compress/offset_select.hpp"
#include "phasekv/compress/uniform_mean.hpp"
#include "phasekv/dsv4/indexer.hpp"
#include "phasekv/dsv4/sparse_attention.hpp"
#include "phasekv/eval/stats.hpp"
#include "phasekv/phase/geometry.hpp"
#include "phasekv/phase/residue.hpp"

namespace {

using i64 = std::int64_t;
namespace cpu = phasekv::cpu;

// Bytes that a refused call must leave as they were.
struct Watch {
  const void* p;
  std::size_t n;
};

template <class T>
Watch watch(const std::vector<T>& v) {
  return {v.data(), v.size() * sizeof(T)};
}

// Calls f; it must throw exactly E with `text` in the message, and leave `watched` unchanged.
template <class E>
void expect_refused(const char* id, const std::function<void()>& f, const std::string& text,
                    const std::vector<Watch>& watched = {}) {
  std::vector<std::vector<unsigned char>> before;
  for (const Watch& w : watched) {
    const auto* b = static_cast<const unsigned char*>(w.p);
    before.emplace_back(b, b + w.n);
  }
  try {
    f();
    ADD_FAILURE() << id << ": accepted; expected " << typeid(E).name() << " naming '" << text
                  << "'";
  } catch (const std::exception& e) {
    EXPECT_EQ(typeid(e), typeid(E)) << id << ": " << typeid(e).name() << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos)
        << id << ": message '" << e.what() << "' does not contain '" << text << "'";
  }
  for (std::size_t i = 0; i < watched.size(); ++i)
    EXPECT_EQ(std::memcmp(before[i].data(), watched[i].p, watched[i].n), 0)
        << id << ": watched buffer " << i << " changed by a refused call";
}

std::vector<float> filled(i64 n, float x) {
  return std::vector<float>(static_cast<std::size_t>(n), x);
}

std::vector<float> ramp(i64 n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37f * static_cast<float>(i));
  return v;
}

// ---- geometry, residues ----------------------------------------------------------------------

TEST(ErrorCatalogue, Geometry) {
  using phasekv::Geometry;
  using phasekv::invalid_argument;
  expect_refused<invalid_argument>(
      "G1", [] { Geometry(0, 4); }, "phasekv::Geometry: window = 0 is invalid (must be >= 1)");
  expect_refused<invalid_argument>(
      "G2", [] { Geometry(8, 0); }, "stride = 0");
  expect_refused<invalid_argument>(
      "G3", [] { Geometry(8, 4, -1); }, "origin = -1");
  expect_refused<invalid_argument>(
      "G4", [] { Geometry(i64{1} << 41, 4); },
      "window = 2199023255552 is invalid (must be <= 2^40");
  expect_refused<invalid_argument>(
      "G5", [] { Geometry::check_length("f", "n", -1); },
      "f: n = -1 is invalid (must be in [0, 2^62])");
  expect_refused<invalid_argument>(
      "G6", [] { Geometry::check_local("f", "local", -2); }, "local = -2");
  expect_refused<invalid_argument>(
      "G7", [] { (void)phasekv::checked_lcm(0, 4); }, "a = 0");
  expect_refused<invalid_argument>(
      "G8", [] { (void)phasekv::checked_lcm(std::numeric_limits<i64>::max(), 2); },
      "b = 2 is invalid (lcm(a, b) overflows int64)");
}

TEST(ErrorCatalogue, VisibilityRule) {
  using phasekv::invalid_argument;
  const phasekv::Geometry g(8, 4);
  expect_refused<invalid_argument>(
      "V1", [&] { cpu::VisibilityRule::compressed(g, -1); }, "local = -1");
  expect_refused<invalid_argument>(
      "V2", [] { cpu::VisibilityRule::sliding_window(0); }, "window = 0");
  const auto raw = ramp(10 * 8);
  const auto v = phasekv::make_view<const float>(raw.data(), 10, 1, 8);
  expect_refused<phasekv::capacity_error>(
      "V3", [&] { cpu::VisibilityRule::causal().visible_kv<float>(11, v, v); },
      "raw_k.tokens = 10");
  expect_refused<invalid_argument>(
      "V4", [&] { cpu::VisibilityRule::causal().visible_kv<float>(-1, v, v); }, "n = -1");
}

// ---- compression -----------------------------------------------------------------------------

TEST(ErrorCatalogue, Policies) {
  const phasekv::Geometry g(8, 4);
  expect_refused<phasekv::shape_error>(
      "P1", [&] { phasekv::UniformMean(g, 0); }, "dim = 0");
  expect_refused<phasekv::shape_error>(
      "P2", [&] { phasekv::MaxPool(g, -3); }, "dim = -3");
  expect_refused<phasekv::invalid_argument>(
      "P3", [&] { phasekv::OffsetSelect(g, 16, 8); }, "offset = 8 is invalid (must be in [0, W)");
  const auto z = filled(2 * 7 * 1 * 16, 0.1f);
  expect_refused<phasekv::shape_error>(
      "P4",
      [&] {
        phasekv::GatedPool(g, 2, 16, 16, phasekv::GateKind::scalar,
                           phasekv::param_view(z.data(), {2, 7, 1, 16}), {});
      },
      "gate_weight.shape[1] = 7 is invalid (must equal W = 8)");
  expect_refused<phasekv::shape_error>(
      "P5", [&] { phasekv::GatedPool(g, 2, 16, 8, phasekv::GateKind::scalar, {}, {}); },
      "d_out = 8 is invalid (must equal d_in when no payload maps are given)");
  expect_refused<phasekv::shape_error>(
      "P6",
      [&] {
        phasekv::param_view(z.data(), {1, 2, 3, 4, 5});
      },
      "shape.size() = 5");
  expect_refused<phasekv::shape_error>(
      "P7", [&] { phasekv::GatedPool(g, 0, 16, 16, phasekv::GateKind::scalar, {}, {}); },
      "kv_heads = 0");
}

TEST(ErrorCatalogue, CompressBatch) {
  const phasekv::Geometry g(8, 4);
  const i64 n = 100, h = 2, d = 16, J = g.complete_windows(n);
  const auto raw = ramp(n * h * d);
  const auto rv = phasekv::make_view<const float>(raw.data(), n, h, d);
  auto ent = filled(J * h * d, std::nanf("7"));
  const auto ev = phasekv::make_view(ent.data(), J, h, d);
  const phasekv::UniformMean um(g, d);
  expect_refused<phasekv::invalid_argument>(
      "C1", [&] { phasekv::compress_batch<float>(um, rv, ev, 0, 0); }, "thread_count = 0",
      {watch(ent)});
  expect_refused<phasekv::invalid_argument>(
      "C2", [&] { phasekv::compress_batch<float>(um, rv, ev, 3, 3); }, "thread_index = 3",
      {watch(ent)});
  expect_refused<phasekv::capacity_error>(
      "C3", [&] { phasekv::compress_batch<float>(um, rv, ev.slice(0, J - 1)); },
      "entries.tokens = 23", {watch(ent)});
  expect_refused<phasekv::shape_error>(
      "C4", [&] { phasekv::compress_batch<float>(phasekv::UniformMean(g, 8), rv, ev); },
      "raw.dim = 16", {watch(ent)});
  const auto b = filled(3 * 8, 0.0f);
  const phasekv::GatedPool three(g, 3, d, d, phasekv::GateKind::scalar, {},
                                 phasekv::param_view(b.data(), {3, 8, 1}));
  expect_refused<phasekv::shape_error>(
      "C5", [&] { phasekv::compress_batch<float>(three, rv, ev); },
      "policy.kv_heads() = 3 is invalid (must equal the KV head count of the data", {watch(ent)});
  auto bad = rv;
  bad.data = nullptr;
  expect_refused<phasekv::shape_error>(
      "C6", [&] { phasekv::compress_batch<float>(um, bad, ev); },
      "raw = null is invalid (data is null but the view is not empty)", {watch(ent)});
}

// A cache with some tokens in it, and every byte it holds.
struct FilledCache {
  phasekv::Geometry g{8, 4, 2};
  i64 h = 2, d = 16, n = 53;
  phasekv::CompressedCache<float, phasekv::UniformMean> cache;
  std::vector<float> raw;
  FilledCache()
      : cache(phasekv::UniformMean(g, 16), phasekv::UniformMean(g, 16), 2, 16, 16, 12, 100),
        raw(ramp(200 * 2 * 16)) {
    const auto v = phasekv::make_view<const float>(raw.data(), n, h, d);
    cache.append(v, v);
  }
  std::vector<Watch> bytes() const {
    std::vector<Watch> w;
    const phasekv::CacheStorage<float>& s = cache.storage();
    for (const phasekv::StridedView<float>* v : {&s.prefix_keys, &s.prefix_values, &s.entry_keys,
                                                 &s.entry_values, &s.ring_keys, &s.ring_values})
      if (v->tokens > 0)
        w.push_back({v->data, static_cast<std::size_t>(v->tokens * h * d) * sizeof(float)});
    w.push_back({&cache, sizeof cache});  // size, counters: the object itself
    return w;
  }
};

TEST(ErrorCatalogue, CompressedCache) {
  const phasekv::Geometry g(8, 4);
  const phasekv::UniformMean um(g, 16);
  using Cache = phasekv::CompressedCache<float, phasekv::UniformMean>;
  expect_refused<phasekv::shape_error>(
      "K1", [&] { Cache(um, um, 0, 16, 16, 0, 100); }, "kv_heads = 0");
  expect_refused<phasekv::shape_error>(
      "K2", [&] { Cache(phasekv::UniformMean(g, 32), um, 1, 16, 16, 0, 100); },
      "key_policy.input_dim() = 32 is invalid (must equal d_k)");
  expect_refused<phasekv::invalid_argument>(
      "K3",
      [&] { Cache(um, phasekv::UniformMean(phasekv::Geometry(4, 4), 16), 1, 16, 16, 0, 100); },
      "value_policy.geometry() = (W=4, S=4, O=0) is invalid (must equal key_policy.geometry() = "
      "(W=8, S=4, O=0))");
  expect_refused<phasekv::invalid_argument>(
      "K4", [&] { Cache(um, um, 1, 16, 16, -1, 100); }, "local = -1");
  expect_refused<phasekv::invalid_argument>(
      "K5", [&] { Cache(um, um, 1, 16, 16, 0, -1); }, "max_length = -1");
  expect_refused<phasekv::capacity_error>(
      "K6",
      [&] {
        Cache(phasekv::UniformMean(phasekv::Geometry(1, 1), 16),
              phasekv::UniformMean(phasekv::Geometry(1, 1), 16), 1, 16, 16, 0, phasekv::kMaxLength);
      },
      "max_length = 4611686018427387904 is invalid (storage size overflows)");
  std::vector<float> small(10 * 16);
  phasekv::CacheStorage<float> st;
  const phasekv::CacheExtents ex = phasekv::cache_extents(g, 0, 100);
  std::vector<float> big(static_cast<std::size_t>(100 * 16));
  st.prefix_keys = st.prefix_values = phasekv::make_view(big.data(), 0, 1, 16);
  st.ring_keys = st.ring_values = phasekv::make_view(big.data(), ex.ring_tokens, 1, 16);
  st.entry_keys = phasekv::make_view(small.data(), 10, 1, 16);
  st.entry_values = phasekv::make_view(big.data(), ex.entries, 1, 16);
  expect_refused<phasekv::capacity_error>(
      "K7", [&] { Cache(um, um, 1, 16, 16, 0, 100, st); },
      "storage.entry_keys.tokens = 10 is invalid (must be >= 24");
  expect_refused<phasekv::invalid_argument>(
      "K8", [&] { (void)phasekv::cache_extents(g, 0, phasekv::kMaxLength + 1); },
      "max_length = 4611686018427387905");

  FilledCache f;
  const auto v = phasekv::make_view<const float>(f.raw.data() + f.n * f.h * f.d, 3, f.h, f.d);
  expect_refused<phasekv::shape_error>(
      "K9",
      [&] {
        const auto w = phasekv::make_view<const float>(f.raw.data(), 3, 1, 32);
        f.cache.append(w, v);
      },
      "keys.heads = 1 is invalid (must equal the cache's kv_heads)", f.bytes());
  expect_refused<phasekv::shape_error>(
      "K10", [&] { f.cache.append(v, v.slice(0, 2)); }, "values.tokens = 2", f.bytes());
  expect_refused<phasekv::capacity_error>(
      "K11",
      [&] {
        const auto w = phasekv::make_view<const float>(f.raw.data(), 48, f.h, f.d);
        f.cache.append(w, w);
      },
      "keys.tokens = 48 is invalid (size() + tokens must be <= max_length() = 100 (size() = 53))",
      f.bytes());
  auto nul = v;
  nul.data = nullptr;
  expect_refused<phasekv::shape_error>(
      "K12", [&] { f.cache.append(nul, v); }, "keys = null is invalid", f.bytes());
  expect_refused<phasekv::invalid_argument>(
      "K13", [&] { (void)f.cache.visible(13); }, "local = 13 is invalid (must be in [0, L]");
  EXPECT_EQ(f.cache.size(), 53);
}

// ---- attention -------------------------------------------------------------------------------

struct DecodeFixture {
  i64 n = 60, hkv = 2, G = 3, d = 16;
  phasekv::Geometry g{8, 4, 1};
  std::vector<float> rk = ramp(60 * 2 * 16), rv = ramp(60 * 2 * 16), q = ramp(6 * 16);
  std::vector<float> out = filled(6 * 16, std::nanf("3")), lse = filled(6, std::nanf("3"));
  cpu::DecodeArgs<float> args;
  DecodeFixture() {
    const auto k = phasekv::make_view<const float>(rk.data(), n, hkv, d);
    const auto v = phasekv::make_view<const float>(rv.data(), n, hkv, d);
    args.q = q.data();
    args.q_heads = hkv * G;
    args.kv_heads = hkv;
    args.d_k = d;
    args.d_v = d;
    args.kv = cpu::VisibilityRule::compressed(g, 8).visible_kv<float>(
        n, k, v, k.slice(0, g.complete_windows(n)), v.slice(0, g.complete_windows(n)));
    args.variant.scale = 0.25f;
    args.out = out.data();
    args.lse = lse.data();
  }
  std::vector<Watch> outputs() const { return {watch(out), watch(lse)}; }
};

TEST(ErrorCatalogue, Decode) {
  DecodeFixture f;
  using A = cpu::DecodeArgs<float>;
  auto refuse = [&](const char* id, const std::function<void(A&)>& edit, const std::string& text,
                    bool shape) {
    A a = f.args;
    edit(a);
    if (shape)
      expect_refused<phasekv::shape_error>(
          id, [&] { cpu::decode(a); }, text, f.outputs());
    else
      expect_refused<phasekv::invalid_argument>(
          id, [&] { cpu::decode(a); }, text, f.outputs());
  };
  refuse(
      "A1", [](A& a) { a.q = nullptr; }, "q = null", false);
  refuse(
      "A2", [](A& a) { a.out = nullptr; }, "out = null", false);
  refuse(
      "A3", [](A& a) { a.lse = nullptr; }, "lse = null", false);
  refuse(
      "A4", [](A& a) { a.q_heads = 5; }, "q_heads = 5 is invalid (must be a multiple of kv_heads)",
      true);
  refuse(
      "A5", [](A& a) { a.kv_heads = 0; }, "kv_heads = 0", false);
  refuse(
      "A6", [](A& a) { a.d_k = 0; }, "d_k = 0", true);
  refuse(
      "A7", [](A& a) { a.kv.segments[1].keys.dim = 8; }, "kv.segments[].keys.dim = 8", true);
  refuse(
      "A8", [](A& a) { a.kv.segments[0].values.tokens += 1; }, "kv.segments[].values.tokens", true);
  refuse(
      "A9", [](A& a) { a.variant.scale = std::nanf(""); }, "variant.scale = nan", false);
  refuse(
      "A10", [](A& a) { a.variant.softcap = -1.0f; }, "variant.softcap = -1", false);
  refuse(
      "A11", [](A& a) { a.variant.entry_bias = std::numeric_limits<float>::infinity(); },
      "variant.entry_bias = inf", false);
  refuse(
      "A12", [](A& a) { a.kv.count = 5; }, "kv.count = 5", false);

  // Split-KV: the workspace and the outputs stay untouched on refusal.
  const std::size_t need = cpu::decode_workspace_size(f.args, 2);
  std::vector<unsigned char> ws(need, 0xab);
  std::vector<Watch> all = f.outputs();
  all.push_back(watch(ws));
  expect_refused<phasekv::invalid_argument>(
      "A13", [&] { cpu::decode_partition(f.args, ws.data(), need, 2, 2); },
      "thread_index = 2 is invalid (must be in [0, thread_count))", all);
  expect_refused<phasekv::capacity_error>(
      "A14", [&] { cpu::decode_partition(f.args, ws.data(), need - 1, 0, 2); },
      "workspace_bytes = " + std::to_string(need - 1), all);
  expect_refused<phasekv::invalid_argument>(
      "A15", [&] { cpu::decode_merge(f.args, nullptr, need, 2); }, "workspace = null", all);
  expect_refused<phasekv::invalid_argument>(
      "A16", [&] { cpu::decode_merge(f.args, ws.data(), need, 0); }, "thread_count = 0", all);
  expect_refused<phasekv::invalid_argument>(
      "A17", [&] { (void)cpu::decode_workspace_size(f.args, 0); }, "partitions = 0");
  {
    A a = f.args;
    a.q_heads = a.kv_heads = i64{1} << 31;
    a.d_k = a.d_v = i64{1} << 31;
    a.kv = {};
    expect_refused<phasekv::invalid_argument>(
        "A18", [&] { (void)cpu::decode_workspace_size(a, 1); },
        "q_heads = 2147483648 is invalid (q_heads x (d_k + d_v + 2) workspace floats overflow "
        "size_t)");
  }
  expect_refused<phasekv::invalid_argument>(
      "A19", [] { cpu::ThreadPool p(0); }, "threads = 0");
  expect_refused<phasekv::invalid_argument>(
      "A20", [] { cpu::ThreadPool p(2, -1); }, "spin_us = -1");
  {
    cpu::ThreadPool pool(2, 0);
    expect_refused<phasekv::capacity_error>(
        "A21", [&] { cpu::decode_parallel(f.args, pool, ws.data(), 10); }, "workspace_bytes = 10",
        all);
  }
  expect_refused<phasekv::invalid_argument>(
      "A22", [] { (void)cpu::detail::arch_from_env("avx9", [](cpu::ArchId) { return true; }); },
      "PHASEKV_ARCH = avx9 is invalid (must be one of scalar, avx2, avx512, neon (or unset))");
}

TEST(ErrorCatalogue, Prefill) {
  const i64 n = 60, hkv = 2, G = 2, d = 16, T = 10;
  const phasekv::Geometry g(8, 4, 1);
  const auto rk = ramp(n * hkv * d), q = ramp(T * hkv * G * d);
  auto out = filled(T * hkv * G * d, std::nanf("5")), lse = filled(T * hkv * G, std::nanf("5"));
  cpu::PrefillArgs<float> base;
  base.q = q.data();
  base.num_queries = T;
  base.q_heads = hkv * G;
  base.kv_heads = hkv;
  base.d_k = d;
  base.d_v = d;
  base.first = n - T;
  base.rule = cpu::VisibilityRule::compressed(g, 4);
  base.raw_k = base.raw_v = phasekv::make_view<const float>(rk.data(), n, hkv, d);
  base.entry_k = base.entry_v =
      phasekv::make_view<const float>(rk.data(), g.complete_windows(n), hkv, d);
  base.out = out.data();
  base.lse = lse.data();
  const std::vector<Watch> outs = {watch(out), watch(lse)};
  using P = cpu::PrefillArgs<float>;
  auto refuse = [&](const char* id, const std::function<void(P&)>& edit, const std::string& text,
                    int kind) {  // 0 invalid_argument, 1 shape_error, 2 capacity_error
    P a = base;
    edit(a);
    const auto f = [&] { cpu::prefill(a); };
    if (kind == 0) expect_refused<phasekv::invalid_argument>(id, f, text, outs);
    if (kind == 1) expect_refused<phasekv::shape_error>(id, f, text, outs);
    if (kind == 2) expect_refused<phasekv::capacity_error>(id, f, text, outs);
  };
  refuse(
      "F1", [](P& a) { a.num_queries = -1; }, "num_queries = -1", 0);
  refuse(
      "F2", [](P& a) { a.first = -1; }, "first = -1", 0);
  refuse(
      "F3", [](P& a) { a.raw_k.tokens = 55; }, "raw_k.tokens = 55", 2);
  refuse(
      "F4", [&](P& a) { a.entry_v.tokens = 2; }, "entry_v.tokens = 2", 2);
  refuse(
      "F5", [](P& a) { a.raw_v.dim = 8; }, "raw_v.dim = 8", 1);
  refuse(
      "F6", [](P& a) { a.q = nullptr; }, "q = null", 0);
  refuse(
      "F7", [](P& a) { a.variant.softcap = std::numeric_limits<float>::infinity(); },
      "variant.softcap = inf", 0);
  expect_refused<phasekv::invalid_argument>(
      "F8", [&] { cpu::prefill_partition(base, 1, 1); }, "thread_index = 1", outs);
}

// ---- explicit instruction-set tags ------------------------------------------------------------

// Every entry point that takes an explicit architecture tag refuses one this CPU cannot run,
// naming the tag and the missing extension, before it writes anything. The CPU's answer is
// forced (cpu::ScopedCpuFeatures), so the refusal is tested on every machine; on a CPU that
// really lacks AVX-512 the unforced call is refused too (the SIGILL of issue 38).
template <class Arch>
void expect_explicit_arch_refused(const cpu::CpuFeatures& forced, const std::string& missing) {
  const std::string text = std::string("Arch = ") + Arch::name + " is invalid (needs " + missing;
  const cpu::ScopedCpuFeatures scope(forced);
  DecodeFixture f;
  const std::size_t need = cpu::decode_workspace_size(f.args, 2);
  std::vector<unsigned char> ws(need, 0xab);
  std::vector<Watch> all = f.outputs();
  all.push_back(watch(ws));
  expect_refused<phasekv::invalid_argument>(
      "X1 decode", [&] { cpu::decode<Arch>(f.args); }, text, all);
  expect_refused<phasekv::invalid_argument>(
      "X2 decode_partition", [&] { cpu::decode_partition<Arch>(f.args, ws.data(), need, 0, 2); },
      text, all);
  {
    cpu::ThreadPool pool(2, 0);
    expect_refused<phasekv::invalid_argument>(
        "X3 decode_parallel", [&] { cpu::decode_parallel<Arch>(f.args, pool, ws.data(), need); },
        text, all);
  }
  // Prefill over the same cache: the last 4 tokens as queries.
  cpu::PrefillArgs<float> p;
  const i64 T = 4;
  const auto pq = ramp(T * f.hkv * f.G * f.d);
  auto pout = filled(T * f.hkv * f.G * f.d, std::nanf("7")), plse = filled(T * f.hkv * f.G, 1.0f);
  p.q = pq.data();
  p.num_queries = T;
  p.q_heads = f.hkv * f.G;
  p.kv_heads = f.hkv;
  p.d_k = p.d_v = f.d;
  p.first = f.n - T;
  p.rule = cpu::VisibilityRule::compressed(f.g, 8);
  p.raw_k = phasekv::make_view<const float>(f.rk.data(), f.n, f.hkv, f.d);
  p.raw_v = phasekv::make_view<const float>(f.rv.data(), f.n, f.hkv, f.d);
  p.entry_k = p.raw_k.slice(0, f.g.complete_windows(f.n));
  p.entry_v = p.raw_v.slice(0, f.g.complete_windows(f.n));
  p.out = pout.data();
  p.lse = plse.data();
  const std::vector<Watch> pouts = {watch(pout), watch(plse)};
  expect_refused<phasekv::invalid_argument>(
      "X4 prefill", [&] { cpu::prefill<Arch>(p); }, text, pouts);
  expect_refused<phasekv::invalid_argument>(
      "X5 prefill_partition", [&] { cpu::prefill_partition<Arch>(p, 0, 1); }, text, pouts);
  {
    cpu::ThreadPool pool(2, 0);
    expect_refused<phasekv::invalid_argument>(
        "X6 prefill_parallel", [&] { cpu::prefill_parallel<Arch>(p, pool); }, text, pouts);
  }
  // DeepSeek-V4: the sparse attention (K = V latent rows) and the indexer's scoring.
  phasekv::dsv4::SparseAttentionParams sp;
  sp.heads = 3;
  sp.dim = sp.dim_v = 16;
  sp.window = 8;
  sp.scale = 0.25f;
  phasekv::dsv4::LatentRows<float> raw;
  raw.data = f.rk.data();
  raw.count = f.n;
  raw.stride = 16;
  const phasekv::dsv4::LatentRows<float> none;
  auto sout = filled(3 * 16, std::nanf("9")), slse = filled(3, 2.0f);
  const std::vector<Watch> souts = {watch(sout), watch(slse)};
  expect_refused<phasekv::invalid_argument>(
      "X7 dsv4::sparse_attention",
      [&] {
        phasekv::dsv4::sparse_attention<float, Arch>(sp, f.q.data(), raw, none, nullptr, 0, f.n - 1,
                                                     1, sout.data(), slse.data());
      },
      text, souts);
  phasekv::dsv4::IndexerParams ip;
  ip.geometry = phasekv::Geometry(4, 4);
  ip.heads = 2;
  ip.dim = 16;
  ip.top_k = 4;
  const auto w = ramp(2);
  std::vector<std::int32_t> idx(4, -7);
  expect_refused<phasekv::invalid_argument>("X8 dsv4::indexer_decode",
                                            [&] {
                                              phasekv::dsv4::indexer_decode<float, Arch>(
                                                  ip, f.q.data(), w.data(), f.rk.data(), 15, 16,
                                                  f.n, idx.data());
                                            },
                                            text, {watch(idx)});
}

TEST(ErrorCatalogue, ExplicitArchTheCpuLacks) {
  const cpu::CpuFeatures none;  // a CPU without any of the extensions
#if PHASEKV_HAS_AVX2
  expect_explicit_arch_refused<cpu::arch::Avx2>(none, "avx2");
#endif
#if PHASEKV_HAS_AVX512
  expect_explicit_arch_refused<cpu::arch::Avx512>(none, "avx2");
  cpu::CpuFeatures epyc;  // AVX2-only (AMD Zen 2/3)
  epyc.avx2 = epyc.fma = epyc.f16c = true;
  expect_explicit_arch_refused<cpu::arch::Avx512>(epyc, "avx512f");
  cpu::CpuFeatures skx = epyc;  // AVX-512 without BF16 (Skylake-SP)
  skx.avx512f = skx.avx512bw = skx.avx512vl = skx.avx512dq = true;
  EXPECT_EQ(cpu::missing_cpu_feature<cpu::arch::Avx512>(skx), nullptr);
  EXPECT_STREQ(cpu::missing_cpu_feature<cpu::arch::Avx512Bf16>(skx), "avx512_bf16");
#endif
#if PHASEKV_HAS_AVX512BF16
  expect_explicit_arch_refused<cpu::arch::Avx512Bf16>(none, "avx2");
#endif
#if PHASEKV_FLAGS_NEON
  expect_explicit_arch_refused<cpu::arch::Neon>(none, "neon");
#endif
  // The scalar tag runs on any CPU, also the forced one.
  const cpu::ScopedCpuFeatures scope(none);
  DecodeFixture f;
  cpu::decode<cpu::arch::Scalar>(f.args);
  EXPECT_TRUE(std::isfinite(f.lse[0]));
}

// Without forcing: on this machine an explicit tag runs exactly when cpu_supports says so.
TEST(ErrorCatalogue, ExplicitArchFollowsThisCpu) {
#if PHASEKV_HAS_AVX512
  DecodeFixture f;
  if (cpu::cpu_supports<cpu::arch::Avx512>()) {
    cpu::decode<cpu::arch::Avx512>(f.args);
    EXPECT_TRUE(std::isfinite(f.lse[0]));
  } else {
    expect_refused<phasekv::invalid_argument>(
        "X9", [&] { cpu::decode<cpu::arch::Avx512>(f.args); }, "Arch = avx512 is invalid (needs ",
        f.outputs());
  }
#else
  GTEST_SKIP() << "the AVX-512 build is not compiled here (no run-time dispatch on this target)";
#endif
}

// ---- evaluation ------------------------------------------------------------------------------

TEST(ErrorCatalogue, Evaluation) {
  expect_refused<phasekv::invalid_argument>(
      "E1", [] { phasekv::eval::PhaseTally t(0); }, "modulus = 0");
}

}  // namespace
