// Per-KV-head origins (staggered windows) as data of the one path: CompressedCache and
// compress_batch with `origins`, cpu::decode with `head_kv` and cpu::prefill with `origins`,
// each KV head checked against the double reference with that head's geometry (W, S, O_h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu_test_util.hpp"
#include "phasekv/attention/cpu/decode.hpp"
#include "phasekv/attention/cpu/prefill.hpp"
#include "phasekv/attention/reference.hpp"
#include "phasekv/compress/compressed_cache.hpp"
#include "phasekv/compress/fixed_gates.hpp"
#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/compress/head_policy.hpp"
#include "phasekv/compress/uniform_mean.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/phase/origins.hpp"

namespace {

using phasekv::bf16_t;
using phasekv::f16_t;
using phasekv::FixedGates;
using phasekv::Geometry;
using phasekv::Layout;
using phasekv::StridedView;
using phasekv::VisibleKV;

struct Case {
  std::int64_t n, group, d_k, d_v, kv_heads, W, S, L;
  std::vector<std::int64_t> origins;  // empty: h * S / H
};

// Lengths 0, 1, 7, 97, 1000; GQA groups 1, 3, 5, 8, 64; head dims 56, 64, 96, 128, 256, 512;
// tiling, overlapping and gapped windows; even origins h*S/H and arbitrary ones (below S,
// above S, above n).
std::vector<Case> cases() {
  return {
      {0, 1, 64, 64, 2, 8, 8, 4, {}},
      {1, 3, 96, 96, 3, 8, 4, 0, {0, 1, 3}},
      {7, 5, 128, 128, 2, 4, 4, 2, {2, 9}},
      {97, 8, 64, 64, 4, 8, 8, 16, {}},
      {97, 1, 96, 64, 5, 16, 8, 0, {0, 7, 3, 13, 1}},
      {97, 3, 128, 128, 8, 8, 8, 8, {}},
      {1000, 3, 128, 128, 4, 8, 8, 16, {}},
      {1000, 5, 64, 64, 3, 6, 4, 5, {0, 3, 21}},
      {1000, 8, 96, 96, 2, 2, 5, 0, {4, 1}},
      {1000, 1, 64, 128, 3, 8, 8, 0, {1200, 5, 0}},
      {97, 64, 512, 512, 2, 8, 4, 8, {}},
      {97, 64, 56, 56, 2, 8, 8, 0, {0, 5}},
      {1000, 1, 256, 512, 2, 8, 4, 4, {3, 0}},
  };
}

std::string name(const Case& c) {
  std::string s = "n=" + std::to_string(c.n) + " G=" + std::to_string(c.group) +
                  " d_k=" + std::to_string(c.d_k) + " d_v=" + std::to_string(c.d_v) +
                  " Hkv=" + std::to_string(c.kv_heads) + " W=" + std::to_string(c.W) +
                  " S=" + std::to_string(c.S) + " L=" + std::to_string(c.L) + " O={";
  for (std::int64_t o : c.origins) s += std::to_string(o) + ",";
  return s + "}";
}

template <class T>
bool same_bits(const StridedView<const T>& a, const StridedView<const T>& b, std::int64_t rows) {
  for (std::int64_t j = 0; j < rows; ++j)
    if (std::memcmp(a.ptr(j, 0), b.ptr(j, 0), static_cast<std::size_t>(a.dim) * sizeof(T)) != 0)
      return false;
  return true;
}

// Everything of one case: random raw K/V, per-head gates, the streamed cache and the batch
// entries.
template <class T>
struct Setup {
  Case c;
  std::int64_t Hq;
  std::vector<T> rk, rv;
  std::vector<float> wk, wv;
  FixedGates kp, vp;
  std::vector<T> ek, ev;
  std::int64_t jmax = 0;

  explicit Setup(Case cs, std::uint32_t seed) : c(std::move(cs)) {
    if (c.origins.empty()) c.origins = phasekv::even_origins(c.S, c.kv_heads);
    Hq = c.group * c.kv_heads;
    const std::size_t n = static_cast<std::size_t>(c.n > 0 ? c.n : 1);
    rk = pkt::random_values<T>(n * c.kv_heads * c.d_k, seed);
    rv = pkt::random_values<T>(n * c.kv_heads * c.d_v, seed + 1);
    // Different positive gates per head, so a head reading another head's gates would show.
    std::mt19937 rng(seed + 2);
    std::uniform_real_distribution<float> u(0.05f, 1.0f);
    wk.resize(static_cast<std::size_t>(c.kv_heads * c.W));
    wv.resize(wk.size());
    for (float& x : wk) x = u(rng);
    for (float& x : wv) x = u(rng);
    const Geometry g(c.W, c.S, 0);
    kp = FixedGates(g, c.d_k, c.kv_heads, wk.data());
    vp = FixedGates(g, c.d_v, c.kv_heads, wv.data());
    jmax = phasekv::max_complete_windows(Geometry(c.W, c.S), c.origins, c.n);
    const std::size_t rows = static_cast<std::size_t>(jmax > 0 ? jmax : 1);
    ek.assign(rows * c.kv_heads * c.d_k, phasekv::from_float<T>(NAN));
    ev.assign(rows * c.kv_heads * c.d_v, phasekv::from_float<T>(NAN));
    EXPECT_EQ(phasekv::compress_batch<T>(kp, c.origins, raw_k(), entry_k()), jmax);
    EXPECT_EQ(phasekv::compress_batch<T>(vp, c.origins, raw_v(), entry_v()), jmax);
  }
  // KV head h's geometry (W, S, O_h).
  Geometry head(std::int64_t h) const {
    return Geometry(c.W, c.S, c.origins[static_cast<std::size_t>(h)]);
  }
  StridedView<const T> raw_k() const {
    return phasekv::make_view<const T>(rk.data(), c.n, c.kv_heads, c.d_k);
  }
  StridedView<const T> raw_v() const {
    return phasekv::make_view<const T>(rv.data(), c.n, c.kv_heads, c.d_v);
  }
  StridedView<T> entry_k() { return phasekv::make_view<T>(ek.data(), jmax, c.kv_heads, c.d_k); }
  StridedView<T> entry_v() { return phasekv::make_view<T>(ev.data(), jmax, c.kv_heads, c.d_v); }
  StridedView<const T> centry_k() const {
    return phasekv::make_view<const T>(ek.data(), jmax, c.kv_heads, c.d_k);
  }
  StridedView<const T> centry_v() const {
    return phasekv::make_view<const T>(ev.data(), jmax, c.kv_heads, c.d_v);
  }

  // The cache, streamed in random chunk sizes.
  phasekv::CompressedCache<T, FixedGates> stream(std::uint32_t seed) const {
    phasekv::CompressedCache<T, FixedGates> cache(kp, vp, c.kv_heads, c.d_k, c.d_v, c.L, c.n,
                                                  Layout::NHD, c.origins);
    std::mt19937 rng(seed);
    std::int64_t p = 0;
    while (p < c.n) {
      const std::int64_t t =
          std::min<std::int64_t>(c.n - p, std::uniform_int_distribution<std::int64_t>(0, 40)(rng));
      cache.append(raw_k().slice(p, t), raw_v().slice(p, t));
      p += t;
    }
    return cache;
  }

  // Reference decode of KV head h's query group at position t (queries q: [Hq, d_k]).
  void reference_head(std::int64_t h, std::int64_t t, const float* q, double* out,
                      double* lse) const {
    const VisibleKV<T> kv = phasekv::reference_visible<T>(
        head(h), c.L, t, phasekv::head_view(raw_k(), h), phasekv::head_view(raw_v(), h),
        phasekv::head_view(centry_k(), h), phasekv::head_view(centry_v(), h));
    phasekv::StandardVariant v;
    v.scale = phasekv::default_scale(c.d_k);
    phasekv::reference_decode<T>(q + h * c.group * c.d_k, c.group, kv, v, out, lse);
  }
};

template <class T>
class Staggered : public ::testing::Test {};
using Types = ::testing::Types<float, bf16_t, f16_t>;
TYPED_TEST_SUITE(Staggered, Types);

TYPED_TEST(Staggered, StreamingEqualsBatchBitForBit) {
  using T = TypeParam;
  std::uint32_t seed = 100;
  for (const Case& cs : cases()) {
    SCOPED_TRACE(name(cs));
    const Setup<T> s(cs, seed++);
    const auto cache = s.stream(seed++);
    ASSERT_EQ(cache.size(), s.c.n);
    for (std::int64_t h = 0; h < s.c.kv_heads; ++h) {
      const std::int64_t J = s.head(h).complete_windows(s.c.n);
      ASSERT_EQ(cache.num_entries(h), J);
      EXPECT_TRUE(same_bits<T>(cache.entry_keys(h), phasekv::head_view(s.centry_k(), h), J)) << h;
      EXPECT_TRUE(same_bits<T>(cache.entry_values(h), phasekv::head_view(s.centry_v(), h), J)) << h;
    }
  }
}

// Head h of the staggered batch equals a one-head compress_batch with Geometry(W, S, O_h) and
// head h's gates alone: the origin moves the windows, nothing else.
TYPED_TEST(Staggered, HeadEqualsOneHeadCompressionWithItsOrigin) {
  using T = TypeParam;
  const Setup<T> s({97, 1, 64, 64, 4, 8, 8, 0, {0, 3, 5, 11}}, 7);
  for (std::int64_t h = 0; h < 4; ++h) {
    const Geometry g(8, 8, s.c.origins[static_cast<std::size_t>(h)]);
    const FixedGates one(g, 64, 1, s.wk.data() + h * 8);
    const std::int64_t J = g.complete_windows(97);
    std::vector<T> e(static_cast<std::size_t>(J * 64));
    phasekv::compress_batch<T>(one, phasekv::head_view(s.raw_k(), h),
                               phasekv::make_view<T>(e.data(), J, 1, 64));
    EXPECT_TRUE(same_bits<T>(phasekv::make_view<const T>(e.data(), J, 1, 64),
                             phasekv::head_view(s.centry_k(), h), J))
        << h;
  }
}

// HeadPolicy forwards the inner policy's CPU fast paths (GatedPool's, UniformMean's): batch
// compression through them, streaming through the cache, and the policy's generic compress()
// over each head's windows give the same bits.
template <class T, class Policy>
void expect_fast_paths_match_compress(const Policy& pol, std::int64_t H, std::int64_t d,
                                      const std::vector<std::int64_t>& origins) {
  static_assert(phasekv::detail::has_compress_rows<phasekv::HeadPolicy<Policy>, T>::value ==
                    phasekv::detail::has_compress_rows<Policy, T>::value,
                "HeadPolicy must forward the window fast path");
  static_assert(phasekv::detail::has_compress_rows_run<phasekv::HeadPolicy<Policy>, T>::value ==
                    phasekv::detail::has_compress_rows_run<Policy, T>::value,
                "HeadPolicy must forward the run fast path");
  const std::int64_t n = 301;
  const std::vector<T> raw = pkt::random_values<T>(static_cast<std::size_t>(n * H * d), 41);
  const auto rv = phasekv::make_view<const T>(raw.data(), n, H, d);
  const std::int64_t J = phasekv::max_complete_windows(pol.geometry(), origins, n);
  std::vector<T> ent(static_cast<std::size_t>(J * H * d));
  phasekv::compress_batch<T>(pol, origins, rv, phasekv::make_view<T>(ent.data(), J, H, d));
  phasekv::CompressedCache<T, Policy> cache(pol, pol, H, d, d, 0, n, Layout::NHD, origins);
  for (std::int64_t p = 0; p < n; p += 13) {
    const std::int64_t t = std::min<std::int64_t>(13, n - p);
    cache.append(rv.slice(p, t), rv.slice(p, t));
  }
  std::vector<float> out(static_cast<std::size_t>(d));
  for (std::int64_t h = 0; h < H; ++h) {
    const Geometry g(pol.geometry().window(), pol.geometry().stride(),
                     origins[static_cast<std::size_t>(h)]);
    ASSERT_EQ(cache.num_entries(h), g.complete_windows(n));
    for (std::int64_t j = 0; j < g.complete_windows(n); ++j) {
      pol.compress(h,
                   phasekv::StridedWindowLoader<T>{rv.ptr(g.window_begin(j), h), rv.token_stride},
                   out.data());
      for (std::int64_t c = 0; c < d; ++c) {
        const T want = phasekv::from_float<T>(out[static_cast<std::size_t>(c)]);
        const T* got = ent.data() + (j * H + h) * d + c;
        ASSERT_EQ(std::memcmp(got, &want, sizeof(T)), 0) << "head " << h << " entry " << j;
        ASSERT_EQ(std::memcmp(cache.entry_keys(h).ptr(j, 0) + c, &want, sizeof(T)), 0)
            << "head " << h << " entry " << j;
      }
    }
  }
}

TYPED_TEST(Staggered, ForwardedFastPathsGiveThePolicyBits) {
  using T = TypeParam;
  const std::int64_t H = 3, d = 64, W = 8;
  const std::vector<float> z = pkt::random_floats(static_cast<std::size_t>(H * W * d), 51, 0.1f);
  const std::vector<float> b = pkt::random_floats(static_cast<std::size_t>(H * W), 52);
  const phasekv::GatedPool gp(Geometry(W, 4, 0), H, d, d, phasekv::GateKind::scalar,
                              phasekv::param_view(z.data(), {H, W, 1, d}),
                              phasekv::param_view(b.data(), {H, W, 1}));
  expect_fast_paths_match_compress<T>(gp, H, d, {0, 1, 6});
  expect_fast_paths_match_compress<T>(phasekv::UniformMean(Geometry(W, 8, 0), d), H, d, {5, 0, 19});
}

TYPED_TEST(Staggered, DecodeMatchesReferencePerHead) {
  using T = TypeParam;
  std::uint32_t seed = 200;
  for (const Case& cs : cases()) {
    SCOPED_TRACE(name(cs));
    const Setup<T> s(cs, seed++);
    const auto cache = s.stream(seed++);
    const std::int64_t Hq = s.Hq, H = s.c.kv_heads;
    const std::vector<float> q = pkt::random_floats(static_cast<std::size_t>(Hq * s.c.d_k), seed++);
    const std::vector<VisibleKV<T>> kv = cache.visible_per_head(s.c.L);
    phasekv::cpu::DecodeArgs<T> a;
    a.q = q.data();
    a.q_heads = Hq;
    a.kv_heads = H;
    a.d_k = s.c.d_k;
    a.d_v = s.c.d_v;
    a.head_kv = kv.data();
    a.variant.scale = phasekv::default_scale(s.c.d_k);
    std::vector<float> out(static_cast<std::size_t>(Hq * s.c.d_v), NAN), lse(Hq, NAN);
    a.out = out.data();
    a.lse = lse.data();
    phasekv::cpu::decode(a);
    const std::int64_t G = s.c.group;
    for (std::int64_t h = 0; h < H; ++h) {
      std::vector<double> ro(static_cast<std::size_t>(G * s.c.d_v)), rl(G);
      if (s.c.n > 0) {
        s.reference_head(h, s.c.n - 1, q.data(), ro.data(), rl.data());
      } else {  // nothing visible: zeros and -inf
        for (double& x : rl) x = -std::numeric_limits<double>::infinity();
      }
      const pkt::ErrorStats e = pkt::compare(out.data() + h * G * s.c.d_v, lse.data() + h * G,
                                             ro.data(), rl.data(), G, s.c.d_v);
      EXPECT_TRUE(e.finite) << h;
      EXPECT_LE(e.max_rel, pkt::tolerance<T>()) << h;
      EXPECT_LE(e.max_lse, pkt::tolerance<T>()) << h;
    }
    // Split-KV over 3 partitions (every head's set split), merged: within the bounds again,
    // and one partition gives decode's bits.
    std::vector<float> out2(out.size(), NAN), lse2(lse.size(), NAN);
    a.out = out2.data();
    a.lse = lse2.data();
    std::size_t bytes = 0;
    phasekv::cpu::decode_partition(a, nullptr, bytes, 0, 3);
    ASSERT_EQ(bytes, phasekv::cpu::decode_workspace_size(a, 3));
    std::vector<char> ws(bytes);
    for (int t = 0; t < 3; ++t) phasekv::cpu::decode_partition(a, ws.data(), bytes, t, 3);
    phasekv::cpu::decode_merge(a, ws.data(), bytes, 3);
    for (std::int64_t h = 0; h < H && s.c.n > 0; ++h) {
      std::vector<double> ro(static_cast<std::size_t>(G * s.c.d_v)), rl(G);
      s.reference_head(h, s.c.n - 1, q.data(), ro.data(), rl.data());
      const pkt::ErrorStats e = pkt::compare(out2.data() + h * G * s.c.d_v, lse2.data() + h * G,
                                             ro.data(), rl.data(), G, s.c.d_v);
      EXPECT_LE(e.max_rel, pkt::tolerance<T>()) << h;
      EXPECT_LE(e.max_lse, pkt::tolerance<T>()) << h;
    }
    std::vector<char> ws1(phasekv::cpu::decode_workspace_size(a, 1));
    phasekv::cpu::decode_partition(a, ws1.data(), ws1.size(), 0, 1);
    phasekv::cpu::decode_merge(a, ws1.data(), ws1.size(), 1);
    EXPECT_EQ(std::memcmp(out.data(), out2.data(), out.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(lse.data(), lse2.data(), lse.size() * sizeof(float)), 0);
  }
}

TYPED_TEST(Staggered, PrefillMatchesReferencePerHead) {
  using T = TypeParam;
  std::uint32_t seed = 300;
  for (const Case& cs : cases()) {
    SCOPED_TRACE(name(cs));
    Setup<T> s(cs, seed++);
    const std::int64_t Hq = s.Hq, H = s.c.kv_heads, n = s.c.n, G = s.c.group;
    const std::vector<float> q =
        pkt::random_floats(static_cast<std::size_t>((n > 0 ? n : 1) * Hq * s.c.d_k), seed++);
    phasekv::cpu::PrefillArgs<T> a;
    a.q = q.data();
    a.num_queries = n;
    a.q_heads = Hq;
    a.kv_heads = H;
    a.d_k = s.c.d_k;
    a.d_v = s.c.d_v;
    a.rule = phasekv::cpu::VisibilityRule::compressed(Geometry(s.c.W, s.c.S), s.c.L);
    a.origins = s.c.origins.data();
    a.raw_k = s.raw_k();
    a.raw_v = s.raw_v();
    a.entry_k = s.centry_k();
    a.entry_v = s.centry_v();
    a.variant.scale = phasekv::default_scale(s.c.d_k);
    std::vector<float> out(static_cast<std::size_t>((n > 0 ? n : 1) * Hq * s.c.d_v), NAN);
    std::vector<float> lse(static_cast<std::size_t>((n > 0 ? n : 1) * Hq), NAN);
    a.out = out.data();
    a.lse = lse.data();
    phasekv::cpu::prefill(a);
    if (n == 0) {
      EXPECT_TRUE(std::isnan(out[0]));  // nothing to write
      continue;
    }
    // Every row up to 97 queries, then a sample (every 13th and the last 3).
    for (std::int64_t i = 0; i < n; ++i) {
      if (n > 97 && i % 13 != 0 && i < n - 3) continue;
      const float* qi = q.data() + i * Hq * s.c.d_k;
      for (std::int64_t h = 0; h < H; ++h) {
        std::vector<double> ro(static_cast<std::size_t>(G * s.c.d_v)), rl(G);
        s.reference_head(h, i, qi, ro.data(), rl.data());
        const pkt::ErrorStats e =
            pkt::compare(out.data() + (i * Hq + h * G) * s.c.d_v, lse.data() + i * Hq + h * G,
                         ro.data(), rl.data(), G, s.c.d_v);
        ASSERT_TRUE(e.finite) << "query " << i << " head " << h;
        ASSERT_LE(e.max_rel, pkt::tolerance<T>()) << "query " << i << " head " << h;
        ASSERT_LE(e.max_lse, pkt::tolerance<T>()) << "query " << i << " head " << h;
      }
    }
    // Split over 3 threads ((KV head, query tile) items, as the uniform prefill): the
    // reference again, every row written.
    std::vector<float> out2(out.size(), NAN), lse2(lse.size(), NAN);
    a.out = out2.data();
    a.lse = lse2.data();
    for (int t = 0; t < 3; ++t) phasekv::cpu::prefill_partition(a, t, 3);
    for (std::int64_t i = 0; i < n; i += (n > 97 ? 13 : 1)) {
      for (std::int64_t h = 0; h < H; ++h) {
        std::vector<double> ro(static_cast<std::size_t>(G * s.c.d_v)), rl(G);
        s.reference_head(h, i, q.data() + i * Hq * s.c.d_k, ro.data(), rl.data());
        const pkt::ErrorStats e =
            pkt::compare(out2.data() + (i * Hq + h * G) * s.c.d_v, lse2.data() + i * Hq + h * G,
                         ro.data(), rl.data(), G, s.c.d_v);
        ASSERT_TRUE(e.finite) << "query " << i << " head " << h;
        ASSERT_LE(e.max_rel, pkt::tolerance<T>()) << "query " << i << " head " << h;
        ASSERT_LE(e.max_lse, pkt::tolerance<T>()) << "query " << i << " head " << h;
      }
    }
  }
}

// Uniform origins give exactly what the multi-head CompressedCache and cpu::decode give.
TEST(StaggeredUniform, EqualsTheMultiHeadCacheAndKernelBits) {
  for (std::int64_t O : {0, 5}) {
    const std::int64_t H = 3, G = 3, d = 64, n = 333, L = 16;
    const std::vector<float> rk = pkt::random_floats(n * H * d, 11),
                             rv = pkt::random_floats(n * H * d, 12);
    const phasekv::UniformMean pol0(Geometry(8, 8, 0), d), polO(Geometry(8, 8, O), d);
    phasekv::CompressedCache<float, phasekv::UniformMean> st(pol0, pol0, H, d, d, L, n, Layout::NHD,
                                                             {O, O, O});
    phasekv::CompressedCache<float, phasekv::UniformMean> mc(polO, polO, H, d, d, L, n);
    const auto K = phasekv::make_view<const float>(rk.data(), n, H, d);
    const auto V = phasekv::make_view<const float>(rv.data(), n, H, d);
    st.append(K.slice(0, 100), V.slice(0, 100));
    st.append(K.slice(100, n - 100), V.slice(100, n - 100));
    mc.append(K, V);
    const std::vector<float> q = pkt::random_floats(H * G * d, 13);
    const std::vector<VisibleKV<float>> kv = st.visible_per_head(L);
    std::vector<float> o1(H * G * d), l1(H * G), o2(o1.size()), l2(l1.size());
    phasekv::cpu::DecodeArgs<float> a;
    a.q = q.data();
    a.q_heads = H * G;
    a.kv_heads = H;
    a.d_k = a.d_v = d;
    a.head_kv = kv.data();
    a.variant.scale = 0.125f;
    a.out = o1.data();
    a.lse = l1.data();
    phasekv::cpu::decode(a);
    phasekv::cpu::DecodeArgs<float> b = a;  // the same call over one set of every head
    b.head_kv = nullptr;
    b.kv = mc.visible();
    b.out = o2.data();
    b.lse = l2.data();
    phasekv::cpu::decode(b);
    EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)), 0) << O;
    EXPECT_EQ(std::memcmp(l1.data(), l2.data(), l1.size() * sizeof(float)), 0) << O;
    // Equal origins given as a list serve one visible set of every head: the same bits.
    b.kv = st.visible(L);
    b.out = o2.data();
    phasekv::cpu::decode(b);
    EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)), 0) << O;
  }
}

// Sinks are per query head: head group kh reads sinks [kh * G, (kh + 1) * G).
TEST(StaggeredDecode, SinksFollowTheQueryGroup) {
  const std::int64_t H = 2, G = 3, d = 64, n = 50;
  const std::vector<float> rk = pkt::random_floats(n * H * d, 21),
                           rv = pkt::random_floats(n * H * d, 22);
  const phasekv::UniformMean pol(Geometry(4, 4, 0), d);
  phasekv::CompressedCache<float, phasekv::UniformMean> st(pol, pol, H, d, d, 4, n, Layout::NHD,
                                                           {1, 3});
  st.append(phasekv::make_view<const float>(rk.data(), n, H, d),
            phasekv::make_view<const float>(rv.data(), n, H, d));
  const std::vector<float> q = pkt::random_floats(H * G * d, 23);
  const std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 1.5f, 0.0f, -0.5f};
  std::vector<VisibleKV<float>> kv = {st.visible(0, 4), st.visible(1, 4)};
  phasekv::cpu::DecodeArgs<float> a;
  a.q = q.data();
  a.q_heads = H * G;
  a.kv_heads = H;
  a.d_k = a.d_v = d;
  a.head_kv = kv.data();
  a.variant.scale = 0.125f;
  a.variant.sinks = sinks.data();
  std::vector<float> out(H * G * d, NAN), lse(H * G, NAN);
  a.out = out.data();
  a.lse = lse.data();
  phasekv::cpu::decode(a);
  for (std::int64_t h = 0; h < H; ++h) {
    std::vector<double> ro(G * d), rl(G);
    phasekv::StandardVariant v = a.variant;
    v.sinks = sinks.data() + h * G;
    phasekv::reference_decode<float>(q.data() + h * G * d, G, kv[h], v, ro.data(), rl.data());
    const pkt::ErrorStats e =
        pkt::compare(out.data() + h * G * d, lse.data() + h * G, ro.data(), rl.data(), G, d);
    EXPECT_LE(e.max_rel, 1e-5) << h;
    EXPECT_LE(e.max_lse, 1e-5) << h;
  }
}

template <class F>
void expect_error(F&& f, const std::string& name, const std::string& value) {
  try {
    f();
    ADD_FAILURE() << "no error for " << name;
  } catch (const phasekv::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(name), std::string::npos) << m;
    EXPECT_NE(m.find(value), std::string::npos) << m;
  }
}

TEST(StaggeredErrors, BadOriginListsNameTheArgumentAndValue) {
  const phasekv::UniformMean pol(Geometry(8, 8, 0), 64);
  using Cache = phasekv::CompressedCache<float, phasekv::UniformMean>;
  expect_error(
      [&] {
        Cache c(pol, pol, 3, 64, 64, 0, 10, Layout::NHD, {0, 4});
      },
      "origins.size()", "2");
  expect_error(
      [&] {
        Cache c(pol, pol, 3, 64, 64, 0, 10, Layout::NHD, {0, -3, 4});
      },
      "origins[1]", "-3");
  EXPECT_EQ(Cache(pol, pol, 3, 64, 64, 0, 10, Layout::NHD, {}).origins(),
            (std::vector<std::int64_t>{0, 0, 0}));  // empty: every head at the policy's origin
  expect_error([&] { phasekv::check_origins("t", {0, 2, -1}, 3); }, "origins[2]", "-1");
  expect_error([&] { phasekv::check_origins("t", {}, 1); }, "origins.size()", "0");
  const phasekv::UniformMean pol4(Geometry(8, 8, 4), 64);
  expect_error(
      [&] {
        Cache c(pol4, pol4, 2, 64, 64, 0, 10, Layout::NHD, {0, 1});
      },
      "key_policy.geometry().origin()", "4");
  // Different origins have no one visible set of every head.
  const Cache two(pol, pol, 2, 64, 64, 0, 10, Layout::NHD, {0, 1});
  expect_error([&] { (void)two.visible(0); }, "origins", "per-head");
  expect_error([&] { (void)two.visible(2, 0); }, "h", "2");

  std::vector<float> raw(10 * 2 * 64, 1.0f), ent(2 * 64, NAN);
  const auto rv = phasekv::make_view<const float>(raw.data(), 10, 1, 64);
  const auto ev = phasekv::make_view<float>(ent.data(), 1, 1, 64);
  expect_error([&] { phasekv::compress_batch<float>(pol, {0, 1}, rv, ev); }, "origins.size()", "2");
  expect_error([&] { phasekv::compress_batch<float>(pol, {-7}, rv, ev); }, "origins[0]", "-7");
  expect_error([&] { phasekv::compress_batch<float>(pol4, {1}, rv, ev); },
               "policy.geometry().origin()", "4");
  EXPECT_TRUE(std::isnan(ent[0]));  // nothing written
}

TEST(StaggeredErrors, BadAppendWritesNothing) {
  const phasekv::UniformMean pol(Geometry(4, 4, 0), 8);
  phasekv::CompressedCache<float, phasekv::UniformMean> c(pol, pol, 2, 8, 8, 0, 8, Layout::NHD,
                                                          {0, 2});
  std::vector<float> k(9 * 2 * 8, 1.0f);
  const auto kv = phasekv::make_view<const float>(k.data(), 9, 2, 8);
  expect_error([&] { c.append(kv, kv); }, "keys.tokens", "9");
  EXPECT_EQ(c.size(), 0);
  const auto k3 = phasekv::make_view<const float>(k.data(), 4, 3, 8);
  expect_error([&] { c.append(k3, k3); }, "keys.heads", "3");
  EXPECT_EQ(c.size(), 0);
  c.append(kv.slice(0, 8), kv.slice(0, 8));
  EXPECT_EQ(c.size(), 8);
  EXPECT_EQ(c.num_entries(0), 2);
  EXPECT_EQ(c.num_entries(1), 1);
}

TEST(StaggeredErrors, PrefillOriginsNeedACompressedRuleWithOriginZero) {
  const std::vector<std::int64_t> origins = {0, -1};
  phasekv::cpu::PrefillArgs<float> a;
  a.q_heads = 4;
  a.kv_heads = 2;
  a.d_k = a.d_v = 8;
  a.origins = origins.data();
  expect_error([&] { phasekv::cpu::prefill(a); }, "origins", "non-null");  // causal rule
  a.rule = phasekv::cpu::VisibilityRule::compressed(Geometry(4, 4, 2), 0);
  expect_error([&] { phasekv::cpu::prefill(a); }, "rule.geometry().origin()", "2");
  a.rule = phasekv::cpu::VisibilityRule::compressed(Geometry(4, 4), 0);
  expect_error([&] { phasekv::cpu::prefill(a); }, "origins[1]", "-1");
}

TEST(StaggeredErrors, DecodeHeadKvNeedsAnEmptySharedSet) {
  const phasekv::UniformMean pol(Geometry(4, 4, 0), 8);
  phasekv::CompressedCache<float, phasekv::UniformMean> c(pol, pol, 2, 8, 8, 0, 8, Layout::NHD,
                                                          {0, 2});
  std::vector<float> k(8 * 2 * 8, 1.0f), q(2 * 8, 1.0f), out(2 * 8, NAN), lse(2, NAN);
  c.append(phasekv::make_view<const float>(k.data(), 8, 2, 8),
           phasekv::make_view<const float>(k.data(), 8, 2, 8));
  const std::vector<VisibleKV<float>> kv = c.visible_per_head(0);
  phasekv::cpu::DecodeArgs<float> a;
  a.q = q.data();
  a.q_heads = a.kv_heads = 2;
  a.d_k = a.d_v = 8;
  a.head_kv = kv.data();
  a.kv = kv[0];
  a.out = out.data();
  a.lse = lse.data();
  expect_error([&] { phasekv::cpu::decode(a); }, "kv.count", "");
  EXPECT_TRUE(std::isnan(out[0]));
}

TEST(OriginsTest, EvenOriginsRunsAndPerHeadRules) {
  EXPECT_EQ(phasekv::even_origins(8, 4), (std::vector<std::int64_t>{0, 2, 4, 6}));
  EXPECT_EQ(phasekv::even_origins(8, 3), (std::vector<std::int64_t>{0, 2, 5}));
  const std::vector<std::int64_t> o = {0, 4, 20};
  // head 0: 3, head 1: 2, head 2: 0
  EXPECT_EQ(phasekv::max_complete_windows(Geometry(8, 8), o, 27), 3);
  EXPECT_EQ(Geometry(8, 8, 20).complete_windows(27), 0);
  EXPECT_FALSE(phasekv::origins_uniform(o));
  EXPECT_TRUE(phasekv::origins_uniform({3, 3, 3, 3}));
  const std::vector<phasekv::OriginRun> runs = phasekv::origin_runs({2, 2, 5, 2});
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].head, 0);
  EXPECT_EQ(runs[0].count, 2);
  EXPECT_EQ(runs[1].origin, 5);
  EXPECT_EQ(runs[2].head, 3);
  const phasekv::UniformMean pol(Geometry(8, 8, 0), 8);
  phasekv::CompressedCache<float, phasekv::UniformMean> c(pol, pol, 3, 8, 8, 0, 27, Layout::NHD, o);
  EXPECT_EQ(c.head_geometry(1), Geometry(8, 8, 4));
  expect_error([&] { (void)c.head_geometry(3); }, "h", "3");
  EXPECT_EQ(c.extents().prefix_tokens, 20);
  EXPECT_EQ(c.extents().entries, 3);
}

}  // namespace
