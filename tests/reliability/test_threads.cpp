// The threaded paths, for ThreadSanitizer (the `tsan` preset runs every test whose name holds
// "Thread"): compress_batch split over std::threads (cached and DRAM-sized calls, the latter
// with prefetch and non-temporal entry stores), independent caches on threads sharing one
// policy's parameters, concurrent first calls of the dispatched kernels, and the ThreadPool
// drivers (spinning and blocking) against the single-threaded results.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "phasekv/attention/cpu/decode.hpp"
#include "phasekv/attention/cpu/prefill.hpp"
#include "phasekv/attention/cpu/thread_driver.hpp"
#include "phasekv/attention/cpu/visibility_rule.hpp"
#include "phasekv/attention/reference.hpp"
#include "phasekv/compress/compress_batch.hpp"
#include "phasekv/compress/compressed_cache.hpp"
#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/compress/uniform_mean.hpp"
#include "phasekv/core/element.hpp"

namespace {

using i64 = std::int64_t;
namespace cpu = phasekv::cpu;

template <class T>
std::vector<T> normal(std::size_t count, std::uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<T> v(count);
  for (auto& x : v) x = phasekv::from_float<T>(dist(rng));
  return v;
}

// compress_batch with `threads` partitions on std::threads equals one call, bit for bit.
template <class T, class Policy>
void expect_threaded_batch_equals_one_call(const Policy& policy, i64 n, i64 heads, i64 d,
                                           int threads) {
  const std::vector<T> raw = normal<T>(static_cast<std::size_t>(n * heads * d), 11);
  const auto rv = phasekv::make_view<const T>(raw.data(), n, heads, d);
  const i64 J = policy.geometry().complete_windows(n);
  std::vector<T> one(static_cast<std::size_t>(J * heads * d)), many(one.size());
  phasekv::compress_batch<T>(policy, rv, phasekv::make_view(one.data(), J, heads, d));
  std::memset(static_cast<void*>(many.data()), 0xff, many.size() * sizeof(T));
  const auto mv = phasekv::make_view(many.data(), J, heads, d);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] { phasekv::compress_batch<T>(policy, rv, mv, t, threads); });
  for (std::thread& th : pool) th.join();
  EXPECT_EQ(std::memcmp(one.data(), many.data(), one.size() * sizeof(T)), 0)
      << "n " << n << " threads " << threads;
}

TEST(ThreadedCompress, BatchPartitionsOnThreadsEqualOneCall) {
  const phasekv::Geometry g(8, 4, 1);
  expect_threaded_batch_equals_one_call<float>(phasekv::UniformMean(g, 64), 3001, 2, 64, 3);
  expect_threaded_batch_equals_one_call<phasekv::bf16_t>(phasekv::UniformMean(g, 96), 2000, 3, 96,
                                                         4);
  const std::vector<float> bias = normal<float>(2 * 8, 5);
  const phasekv::GatedPool gp(g, 2, 64, 64, phasekv::GateKind::scalar, {},
                              phasekv::param_view(bias.data(), {2, 8, 1}));
  expect_threaded_batch_equals_one_call<phasekv::f16_t>(gp, 1500, 2, 64, 3);
}

TEST(ThreadedCompress, DramSizedBatchWithStreamingStoresOnThreads) {
  // 2 x 64 MiB of bf16 raw rows, W = S = 2: each thread's share reads far more than the
  // 256 KiB that switch compress_batch to prefetching and writes more than the 128 KiB that
  // allow non-temporal entry stores (fenced before each call returns).
  const i64 heads = 2, d = 128, n = (i64{64} << 20) / (heads * d * 2);
  expect_threaded_batch_equals_one_call<phasekv::bf16_t>(
      phasekv::UniformMean(phasekv::Geometry(2, 2), d), n, heads, d, 2);
}

TEST(ThreadedCompress, IndependentCachesShareOnePolicy) {
  // Four threads stream four sequences through their own caches, all reading one GatedPool's
  // parameters; each cache equals compress_batch of its sequence.
  const phasekv::Geometry g(8, 4);
  const i64 heads = 2, d = 32, n = 700;
  const std::vector<float> w = normal<float>(static_cast<std::size_t>(heads * 8 * d), 3, 0.2f);
  const std::vector<float> b = normal<float>(static_cast<std::size_t>(heads * 8), 4);
  const phasekv::GatedPool gp(g, heads, d, d, phasekv::GateKind::scalar,
                              phasekv::param_view(w.data(), {heads, 8, 1, d}),
                              phasekv::param_view(b.data(), {heads, 8, 1}));
  std::vector<std::vector<float>> raw(4);
  for (std::size_t s = 0; s < raw.size(); ++s)
    raw[s] =
        normal<float>(static_cast<std::size_t>(n * heads * d), 100 + static_cast<std::uint32_t>(s));
  std::vector<std::vector<float>> streamed(4);
  std::vector<std::thread> th;
  for (std::size_t s = 0; s < raw.size(); ++s)
    th.emplace_back([&, s] {
      phasekv::CompressedCache<float, phasekv::GatedPool> cache(gp, gp, heads, d, d, 16, n);
      const auto v = phasekv::make_view<const float>(raw[s].data(), n, heads, d);
      for (i64 t = 0; t < n; t += 37) {
        const i64 c = t + 37 <= n ? 37 : n - t;
        cache.append(v.slice(t, c), v.slice(t, c));
      }
      const auto e = cache.entry_keys();
      streamed[s].assign(e.data, e.data + e.tokens * heads * d);
    });
  for (std::thread& t : th) t.join();
  for (std::size_t s = 0; s < raw.size(); ++s) {
    const i64 J = g.complete_windows(n);
    std::vector<float> batch(static_cast<std::size_t>(J * heads * d));
    phasekv::compress_batch<float>(gp, phasekv::make_view<const float>(raw[s].data(), n, heads, d),
                                   phasekv::make_view(batch.data(), J, heads, d));
    EXPECT_EQ(streamed[s], batch) << "sequence " << s;
  }
}

// A decode problem over a compressed visible set with sinks and a soft cap.
struct Decode {
  i64 n = 900, hkv = 2, G = 5, d = 64;
  std::vector<phasekv::bf16_t> rk, rv, ek, ev;
  std::vector<float> q, sinks;
  cpu::DecodeArgs<phasekv::bf16_t> args;
  std::vector<double> ref, ref_lse;

  Decode() {
    const phasekv::Geometry g(8, 4, 2);
    const i64 J = g.complete_windows(n);
    rk = normal<phasekv::bf16_t>(static_cast<std::size_t>(n * hkv * d), 1);
    rv = normal<phasekv::bf16_t>(static_cast<std::size_t>(n * hkv * d), 2, 0.25f);
    ek = normal<phasekv::bf16_t>(static_cast<std::size_t>(J * hkv * d), 3);
    ev = normal<phasekv::bf16_t>(static_cast<std::size_t>(J * hkv * d), 4, 0.25f);
    q = normal<float>(static_cast<std::size_t>(hkv * G * d), 5);
    sinks = normal<float>(static_cast<std::size_t>(hkv * G), 6);
    using CV = phasekv::StridedView<const phasekv::bf16_t>;
    const CV k = phasekv::make_view<const phasekv::bf16_t>(rk.data(), n, hkv, d);
    const CV v = phasekv::make_view<const phasekv::bf16_t>(rv.data(), n, hkv, d);
    const CV a = phasekv::make_view<const phasekv::bf16_t>(ek.data(), J, hkv, d);
    const CV b = phasekv::make_view<const phasekv::bf16_t>(ev.data(), J, hkv, d);
    args.q = q.data();
    args.q_heads = hkv * G;
    args.kv_heads = hkv;
    args.d_k = d;
    args.d_v = d;
    args.kv = cpu::VisibilityRule::compressed(g, 32).visible_kv<phasekv::bf16_t>(n, k, v, a, b);
    args.variant.scale = phasekv::default_scale(d);
    args.variant.softcap = 20.0f;
    args.variant.sinks = sinks.data();
    ref.resize(static_cast<std::size_t>(hkv * G * d));
    ref_lse.resize(static_cast<std::size_t>(hkv * G));
    phasekv::reference_decode<phasekv::bf16_t>(q.data(), hkv * G, args.kv, args.variant, ref.data(),
                                               ref_lse.data());
  }
  void expect_close(const std::vector<float>& out, const std::vector<float>& lse) const {
    for (std::size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-2 * 0.25 * 5);
    for (std::size_t h = 0; h < lse.size(); ++h) ASSERT_NEAR(lse[h], ref_lse[h], 1e-2);
  }
};

TEST(ThreadedDecode, ConcurrentFirstCallsAndPools) {
  Decode p;
  // Eight threads call the dispatched decode at once (the first calls of the process decide
  // the instruction set and the CPU features: the once-only initialization must be safe).
  std::vector<std::vector<float>> outs(8), lses(8);
  std::vector<std::thread> th;
  for (std::size_t t = 0; t < outs.size(); ++t)
    th.emplace_back([&, t] {
      outs[t].assign(p.ref.size(), -1.0f);
      lses[t].assign(p.ref_lse.size(), -1.0f);
      auto a = p.args;
      a.out = outs[t].data();
      a.lse = lses[t].data();
      cpu::decode(a);
    });
  for (std::thread& t : th) t.join();
  for (std::size_t t = 0; t < outs.size(); ++t) {
    p.expect_close(outs[t], lses[t]);
    EXPECT_EQ(outs[t], outs[0]) << "thread " << t;  // same code, same bits
  }
  // The pool drivers, spinning and blocking, several steps in a row on one pool.
  for (int spin : {200, 0}) {
    cpu::ThreadPool pool(4, spin);
    for (int step = 0; step < 3; ++step) {
      std::vector<float> out(p.ref.size(), -1.0f), lse(p.ref_lse.size(), -1.0f);
      auto a = p.args;
      a.out = out.data();
      a.lse = lse.data();
      cpu::decode_parallel(a, pool);
      p.expect_close(out, lse);
    }
  }
}

TEST(ThreadedPrefill, PoolMatchesOneThreadBitForBit) {
  // Prefill work items are independent: the pool's result has the same bits as one thread.
  const i64 n = 300, T = 48, hkv = 2, G = 3, d = 64;
  const phasekv::Geometry g(8, 4, 1);
  const i64 J = g.complete_windows(n);
  const auto rk = normal<float>(static_cast<std::size_t>(n * hkv * d), 1);
  const auto rv = normal<float>(static_cast<std::size_t>(n * hkv * d), 2, 0.25f);
  const auto ek = normal<float>(static_cast<std::size_t>(J * hkv * d), 3);
  const auto ev = normal<float>(static_cast<std::size_t>(J * hkv * d), 4, 0.25f);
  const auto q = normal<float>(static_cast<std::size_t>(T * hkv * G * d), 5);
  cpu::PrefillArgs<float> a;
  a.q = q.data();
  a.num_queries = T;
  a.q_heads = hkv * G;
  a.kv_heads = hkv;
  a.d_k = d;
  a.d_v = d;
  a.first = n - T;
  a.rule = cpu::VisibilityRule::compressed(g, 16);
  a.raw_k = phasekv::make_view<const float>(rk.data(), n, hkv, d);
  a.raw_v = phasekv::make_view<const float>(rv.data(), n, hkv, d);
  a.entry_k = phasekv::make_view<const float>(ek.data(), J, hkv, d);
  a.entry_v = phasekv::make_view<const float>(ev.data(), J, hkv, d);
  a.variant.scale = phasekv::default_scale(d);
  std::vector<float> one(static_cast<std::size_t>(T * hkv * G * d)),
      one_lse(static_cast<std::size_t>(T * hkv * G));
  a.out = one.data();
  a.lse = one_lse.data();
  cpu::prefill(a);
  for (int threads : {2, 3, 5}) {
    cpu::ThreadPool pool(threads, threads == 3 ? 0 : 100);
    std::vector<float> out(one.size(), -1.0f), lse(one_lse.size(), -1.0f);
    auto b = a;
    b.out = out.data();
    b.lse = lse.data();
    cpu::prefill_parallel(b, pool);
    EXPECT_EQ(out, one) << threads << " threads";
    EXPECT_EQ(lse, one_lse) << threads << " threads";
  }
}

TEST(ThreadedPool, ExceptionsReachTheCallerAndThePoolStaysUsable) {
  cpu::ThreadPool pool(3, 50);
  EXPECT_THROW(pool.run([](int i, int) {
    if (i == 2) throw std::runtime_error("worker 2");
  }),
               std::runtime_error);
  std::vector<int> hits(3, 0);
  pool.run([&](int i, int n) {
    EXPECT_EQ(n, 3);
    hits[static_cast<std::size_t>(i)] += 1;
  });
  EXPECT_EQ(hits, std::vector<int>({1, 1, 1}));
}

}  // namespace
