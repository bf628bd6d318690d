// CompressedCache: streaming equals batch bit for bit (every policy, every element type, token
// by token and in random chunks), visible() equals reference_visible, memory accounting,
// caller-owned storage, and bad input that leaves the cache unchanged.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "compress_test_util.hpp"
#include "gated_reference.hpp"
#include "phasekv/attention/reference.hpp"
#include "phasekv/compress/compress_batch.hpp"
#include "phasekv/compress/compressed_cache.hpp"
#include "phasekv/compress/gate_cycling.hpp"
#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/compress/max_pool.hpp"
#include "phasekv/compress/offset_select.hpp"
#include "phasekv/compress/uniform_mean.hpp"

namespace {

using pkv_test::GatedParams;
using pkv_test::i64;
using pkv_test::Tensor;

// Serializes a visible set item by item (kind, position or entry index, key and value bits of
// every head), so two sets compare equal exactly when they hold the same items in the same
// order, however they are split into segments.
template <class T>
std::vector<std::string> flatten(const phasekv::VisibleKV<T>& kv) {
  std::vector<std::string> items;
  for (int s = 0; s < kv.count; ++s) {
    const auto& seg = kv.segments[s];
    EXPECT_GT(seg.size(), 0) << "empty segment";
    EXPECT_EQ(seg.keys.tokens, seg.values.tokens);
    for (i64 t = 0; t < seg.size(); ++t) {
      std::string item(1, static_cast<char>(seg.kind));
      const i64 pos = seg.first + t;
      item.append(reinterpret_cast<const char*>(&pos), sizeof pos);
      for (i64 h = 0; h < seg.keys.heads; ++h) {
        item.append(reinterpret_cast<const char*>(seg.keys.ptr(t, h)), sizeof(T) * seg.keys.dim);
        item.append(reinterpret_cast<const char*>(seg.values.ptr(t, h)),
                    sizeof(T) * seg.values.dim);
      }
      items.push_back(std::move(item));
    }
  }
  return items;
}

template <class T>
bool same_bits(phasekv::StridedView<const T> a, phasekv::StridedView<const T> b) {
  if (a.tokens != b.tokens || a.heads != b.heads || a.dim != b.dim) return false;
  for (i64 t = 0; t < a.tokens; ++t)
    for (i64 h = 0; h < a.heads; ++h)
      if (std::memcmp(a.ptr(t, h), b.ptr(t, h), sizeof(T) * a.dim) != 0) return false;
  return true;
}

// Bytes of every storage view plus size(): equal snapshots mean an unchanged cache.
template <class Cache>
std::string snapshot(const Cache& c) {
  using T = typename Cache::element_type;
  std::string s;
  const i64 n = c.size();
  s.append(reinterpret_cast<const char*>(&n), sizeof n);
  const auto& st = c.storage();
  for (const phasekv::StridedView<T>* v : {&st.prefix_keys, &st.prefix_values, &st.entry_keys,
                                           &st.entry_values, &st.ring_keys, &st.ring_values})
    for (i64 t = 0; t < v->tokens; ++t)
      for (i64 h = 0; h < v->heads; ++h)
        s.append(reinterpret_cast<const char*>(v->ptr(t, h)), sizeof(T) * v->dim);
  return s;
}

// Streams n random tokens through three caches (token by token, random chunks, all at once)
// and checks entries against compress_batch bit for bit and visible() against
// reference_visible for many n and L.
template <class T, class KP, class VP>
void stream_equals_batch(const KP& kp, const VP& vp, i64 heads, i64 local, i64 n,
                         std::mt19937_64& rng, const std::string& label) {
  SCOPED_TRACE(label);
  const phasekv::Geometry g = kp.geometry();
  const i64 dk = kp.input_dim(), dv = vp.input_dim();
  Tensor<T> K(n, heads, dk), V(n, heads, dv);
  K.randomize(rng);
  V.randomize(rng);
  const i64 J = g.complete_windows(n);
  Tensor<T> EK(J, heads, dk), EV(J, heads, dv);
  EK.poison();
  EV.poison();
  ASSERT_EQ(phasekv::compress_batch<T>(kp, K.cview(), EK.view()), J);
  ASSERT_EQ(phasekv::compress_batch<T>(vp, V.cview(), EV.view()), J);

  using Cache = phasekv::CompressedCache<T, KP, VP>;
  const phasekv::Layout lay = rng() % 2 ? phasekv::Layout::HND : phasekv::Layout::NHD;
  Cache one(kp, vp, heads, dk, dv, local, n, lay), chunks(kp, vp, heads, dk, dv, local, n + 5),
      all(kp, vp, heads, dk, dv, local, n);
  for (Cache* c : {&one, &chunks, &all}) {  // poison the storage: nothing may read it unwritten
    const auto& st = c->storage();
    for (const phasekv::StridedView<T>* v : {&st.prefix_keys, &st.prefix_values, &st.entry_keys,
                                             &st.entry_values, &st.ring_keys, &st.ring_values})
      for (i64 t = 0; t < v->tokens; ++t)
        for (i64 h = 0; h < v->heads; ++h)
          std::memset(static_cast<void*>(v->ptr(t, h)), 0xff, sizeof(T) * v->dim);
  }
  auto check_visible = [&](const Cache& c) {
    const i64 m = c.size();
    for (i64 l : {local, i64{0}, local / 2, local > 0 ? local - 1 : 0}) {
      const auto got = c.visible(l);
      ASSERT_LE(got.count, 4);
      const auto want =
          phasekv::reference_visible<T>(g, l, m - 1, K.cview(), V.cview(), EK.cview(), EV.cview());
      ASSERT_EQ(got.total(), g.visible(m, l).total());
      ASSERT_TRUE(flatten(got) == flatten(want)) << "n=" << m << " L=" << l;
    }
  };
  for (i64 p = 0; p < n; ++p) {
    one.append(K.cview().slice(p, 1), V.cview().slice(p, 1));
    ASSERT_EQ(one.num_entries(), g.complete_windows(p + 1));
    if (p < 120 || p % 61 == 0 || p == n - 1) check_visible(one);
  }
  for (i64 p = 0; p < n;) {
    const i64 t = std::min<i64>(n - p, pkv_test::rand_int(rng, 0, 3 * g.window() + local + 2));
    chunks.append(K.cview().slice(p, t), V.cview().slice(p, t));
    p += t;
    if (t > 0 && (p < 240 || p % 11 == 0)) check_visible(chunks);
  }
  all.append(K.cview(), V.cview());
  for (const Cache* c : {&one, &chunks, &all}) {
    ASSERT_EQ(c->size(), n);
    ASSERT_EQ(c->num_entries(), J);
    EXPECT_TRUE(same_bits<T>(c->entry_keys(), EK.cview()));
    EXPECT_TRUE(same_bits<T>(c->entry_values(), EV.cview()));
    check_visible(*c);
  }
}

template <class T>
class CacheStreaming : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, phasekv::bf16_t, phasekv::f16_t>;
TYPED_TEST_SUITE(CacheStreaming, ElementTypes);

TYPED_TEST(CacheStreaming, EqualsBatchBitForBitForEveryPolicy) {
  using T = TypeParam;
  std::mt19937_64 rng(1234 + sizeof(T));
  for (int geo = 0; geo < 3; ++geo) {
    const phasekv::Geometry g = pkv_test::random_geometry(rng, geo, 12, 6);
    const i64 heads = pkv_test::rand_int(rng, 1, 3);
    const i64 local = pkv_test::rand_int(rng, 0, 20);
    const i64 n = geo == 2 ? pkv_test::rand_int(rng, 1500, 3000) : pkv_test::rand_int(rng, 0, 400);
    const std::string where = "W=" + std::to_string(g.window()) +
                              " S=" + std::to_string(g.stride()) +
                              " O=" + std::to_string(g.origin()) + " L=" + std::to_string(local) +
                              " n=" + std::to_string(n) + " H=" + std::to_string(heads);
    const i64 dk = 8, dv = 6;
    stream_equals_batch<T>(phasekv::UniformMean(g, dk), phasekv::UniformMean(g, dv), heads, local,
                           n, rng, "UniformMean " + where);
    stream_equals_batch<T>(phasekv::MaxPool(g, dk), phasekv::UniformMean(g, dv), heads, local, n,
                           rng, "MaxPool/UniformMean " + where);
    const i64 r = pkv_test::rand_int(rng, 0, g.window() - 1);
    stream_equals_batch<T>(phasekv::OffsetSelect(g, dk, r),
                           phasekv::OffsetSelect(g, dv, (r + 1) % g.window()), heads, local, n, rng,
                           "OffsetSelect " + where);
    const GatedParams pk =
        GatedParams::random(rng, g, heads, dk, dk, phasekv::GateKind::scalar, true, true, true);
    const GatedParams pv =
        GatedParams::random(rng, g, heads, dv, dv, phasekv::GateKind::vector, true, true, false);
    stream_equals_batch<T>(pk.policy(), pv.policy(), heads, local, n, rng, "GatedPool " + where);
    // Tied K/V (d_k = d_v, one policy object for both), gates cycled.
    const phasekv::GatedPool tied = phasekv::cycle_gates(pk.policy(), 1 + geo);
    stream_equals_batch<T>(tied, tied, heads, local, n, rng, "GatedPool tied+cycled " + where);
  }
}

TEST(CompressedCache, VisibleSplitsTheRingAndMatchesGeometry) {
  // W=4, S=2, O=3, L=6: ring of 6 slots; check the wrap and that segments are in order.
  std::mt19937_64 rng(8);
  const phasekv::Geometry g(4, 2, 3);
  const phasekv::UniformMean p(g, 5);
  phasekv::CompressedCache<float, phasekv::UniformMean> c(p, p, 2, 5, 5, 6, 100);
  Tensor<float> K(100, 2, 5), V(100, 2, 5);
  K.randomize(rng);
  V.randomize(rng);
  bool saw_split = false;
  for (i64 i = 0; i < 100; ++i) {
    c.append(K.cview().slice(i, 1), V.cview().slice(i, 1));
    const auto kv = c.visible();
    i64 raw = 0, next = -1;
    for (int s = 0; s < kv.count; ++s)
      if (kv.segments[s].kind == phasekv::SegmentKind::raw) {
        if (next >= 0) {
          EXPECT_EQ(kv.segments[s].first, next);
          saw_split = true;
        }
        next = kv.segments[s].first + kv.segments[s].size();
        raw += kv.segments[s].size();
        for (i64 t = 0; t < kv.segments[s].size(); ++t)
          EXPECT_EQ(kv.segments[s].keys(t, 1, 4), K.cview()(kv.segments[s].first + t, 1, 4));
      }
    EXPECT_EQ(raw, g.visible(i + 1, 6).raw_count());
    if (raw > 0) {
      EXPECT_EQ(next, i + 1);
    }
  }
  EXPECT_TRUE(saw_split);
}

TEST(CompressedCache, MemoryAccounting) {
  // W = S = 8, O = 4, L = 16, 2 KV heads, d_k = d_v = 16, bf16, after n = 1000 tokens:
  // 4 prefix tokens + J = (1000 - 4 - 8) / 8 + 1 = 124 entries + 16 raw tokens in the ring.
  const phasekv::Geometry g(8, 8, 4);
  const phasekv::UniformMean p(g, 16);
  phasekv::CompressedCache<phasekv::bf16_t, phasekv::UniformMean> c(p, p, 2, 16, 16, 16, 4096);
  EXPECT_EQ(c.memory_bytes(), 0);
  EXPECT_EQ(c.memory_ratio(), 1.0);
  Tensor<phasekv::bf16_t> K(1000, 2, 16);
  std::mt19937_64 rng(1);
  K.randomize(rng);
  c.append(K.cview(), K.cview());
  const i64 per_token = 2 * (16 + 16) * 2;
  EXPECT_EQ(c.num_entries(), 124);
  EXPECT_EQ(c.memory_bytes(), (4 + 124 + 16) * per_token);
  EXPECT_EQ(c.uncompressed_bytes(), 1000 * per_token);
  EXPECT_DOUBLE_EQ(c.memory_ratio(), 144.0 / 1000.0);
  EXPECT_EQ(c.max_entries(), g.complete_windows(4096));
  EXPECT_EQ(c.capacity_bytes(), (4 + g.complete_windows(4096) + 16) * per_token);
  // Short sequences: everything is still raw (ratio 1 while no window is complete).
  c.clear();
  c.append(K.cview().slice(0, 7), K.cview().slice(0, 7));
  EXPECT_EQ(c.memory_bytes(), 7 * per_token);
  EXPECT_EQ(c.memory_ratio(), 1.0);
}

TEST(CompressedCache, CallerStorageHndWithPaddingEqualsOwning) {
  std::mt19937_64 rng(99);
  const phasekv::Geometry g(6, 3, 2);
  const i64 H = 3, dk = 8, dv = 5, L = 7, maxlen = 300;
  const GatedParams pk =
      GatedParams::random(rng, g, H, dk, dk, phasekv::GateKind::vector, true, true, true);
  const phasekv::UniformMean pv(g, dv);
  const phasekv::CacheExtents e = phasekv::cache_extents(g, L, maxlen);
  EXPECT_EQ(e.prefix_tokens, 2);
  EXPECT_EQ(e.entries, g.complete_windows(maxlen));
  EXPECT_EQ(e.ring_tokens, 7);
  // HND buffers with padded token stride (d + 3) and one spare token per buffer.
  std::vector<std::vector<float>> bufs;
  auto make = [&](i64 tokens, i64 d) {
    tokens += 1;
    bufs.emplace_back(static_cast<std::size_t>(H * tokens * (d + 3)), 0.0f);
    return phasekv::StridedView<float>{bufs.back().data(), tokens, H, d, d + 3, tokens * (d + 3)};
  };
  bufs.reserve(6);
  phasekv::CacheStorage<float> st;
  st.prefix_keys = make(e.prefix_tokens, dk);
  st.prefix_values = make(e.prefix_tokens, dv);
  st.entry_keys = make(e.entries, dk);
  st.entry_values = make(e.entries, dv);
  st.ring_keys = make(e.ring_tokens, dk);
  st.ring_values = make(e.ring_tokens, dv);
  using Cache = phasekv::CompressedCache<float, phasekv::GatedPool, phasekv::UniformMean>;
  Cache ext(pk.policy(), pv, H, dk, dv, L, maxlen, st);
  Cache own(pk.policy(), pv, H, dk, dv, L, maxlen);
  EXPECT_FALSE(ext.owns_storage());
  EXPECT_TRUE(own.owns_storage());
  Tensor<float> K(maxlen, H, dk), V(maxlen, H, dv);
  K.randomize(rng);
  V.randomize(rng);
  for (i64 p = 0; p < maxlen;) {
    const i64 t = std::min<i64>(maxlen - p, pkv_test::rand_int(rng, 1, 11));
    ext.append(K.cview().slice(p, t), V.cview().slice(p, t));
    own.append(K.cview().slice(p, t), V.cview().slice(p, t));
    p += t;
    ASSERT_TRUE(flatten(ext.visible(5)) == flatten(own.visible(5)));
  }
  EXPECT_TRUE(same_bits<float>(ext.entry_keys(), own.entry_keys()));
  // The caller's entry buffer holds the entries (the cache wrote into caller memory).
  EXPECT_EQ(st.entry_keys(3, 2, 7), own.entry_keys()(3, 2, 7));
  // A moved cache keeps working.
  Cache moved(std::move(own));
  EXPECT_TRUE(flatten(ext.visible()) == flatten(moved.visible()));
}

template <class F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    FAIL() << "expected an exception mentioning " << needle;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(CompressedCache, BadInputThrowsAndLeavesTheCacheUnchanged) {
  std::mt19937_64 rng(5);
  const phasekv::Geometry g(4, 2, 1);
  const i64 H = 2, dk = 6, dv = 4, L = 5, maxlen = 40;
  const phasekv::UniformMean pk(g, dk), pv(g, dv);
  using Cache = phasekv::CompressedCache<phasekv::f16_t, phasekv::UniformMean>;
  Cache c(pk, pv, H, dk, dv, L, maxlen);
  Tensor<phasekv::f16_t> K(50, H, dk), V(50, H, dv), Kbad(5, H, dk + 1), Vbad(5, H + 1, dv);
  K.randomize(rng);
  V.randomize(rng);
  Kbad.randomize(rng);
  Vbad.randomize(rng);
  c.append(K.cview().slice(0, 13), V.cview().slice(0, 13));
  const std::string before = snapshot(c);
  expect_error([&] { c.append(Kbad.cview(), V.cview().slice(13, 5)); }, "keys.dim = 7");
  expect_error([&] { c.append(K.cview().slice(13, 5), Vbad.cview()); }, "values.heads = 3");
  expect_error([&] { c.append(K.cview().slice(13, 5), V.cview().slice(13, 4)); },
               "values.tokens = 4");
  auto null_k = K.cview().slice(13, 5);
  null_k.data = nullptr;
  expect_error([&] { c.append(null_k, V.cview().slice(13, 5)); }, "keys");
  // Capacity: 13 + 28 > 40. The whole chunk is refused, none of it written.
  expect_error([&] { c.append(K.cview().slice(13, 28), V.cview().slice(13, 28)); },
               "keys.tokens = 28");
  try {
    c.append(K.cview().slice(13, 28), V.cview().slice(13, 28));
  } catch (const phasekv::capacity_error&) {}
  expect_error([&] { (void)c.visible(L + 1); }, "local = 6");
  expect_error([&] { (void)c.visible(-1); }, "local = -1");
  EXPECT_EQ(snapshot(c), before);
  EXPECT_EQ(c.size(), 13);
  // Exactly max_length tokens fit.
  c.append(K.cview().slice(13, 27), V.cview().slice(13, 27));
  EXPECT_EQ(c.size(), maxlen);
  EXPECT_EQ(c.num_entries(), c.max_entries());
  const std::string full = snapshot(c);
  EXPECT_THROW(c.append(K.cview().slice(40, 1), V.cview().slice(40, 1)), phasekv::capacity_error);
  EXPECT_EQ(snapshot(c), full);
  c.append(K.cview().slice(40, 0), V.cview().slice(40, 0));  // empty append is fine when full
}

TEST(CompressedCache, ConstructorRejectsPolicyAndStorageMismatches) {
  const phasekv::Geometry g(4, 2, 1), other(4, 4, 1);
  std::vector<float> c(2 * 4 * 3 * 6), z(3 * 4 * 1 * 6);
  const phasekv::GatedPool shrink(g, 2, 6, 3, phasekv::GateKind::scalar, {}, {},
                                  phasekv::param_view(c.data(), {2, 4, 3, 6}));
  const phasekv::GatedPool three_heads(g, 3, 6, 6, phasekv::GateKind::scalar,
                                       phasekv::param_view(z.data(), {3, 4, 1, 6}), {});
  using GCache = phasekv::CompressedCache<float, phasekv::GatedPool, phasekv::UniformMean>;
  using UCache = phasekv::CompressedCache<float, phasekv::UniformMean>;
  expect_error([&] { GCache(shrink, phasekv::UniformMean(g, 4), 2, 6, 4, 3, 50); },
               "key_policy.output_dim() = 3");
  expect_error([&] { GCache(three_heads, phasekv::UniformMean(g, 4), 2, 6, 4, 3, 50); },
               "key_policy.kv_heads() = 3");
  expect_error(
      [&] { UCache(phasekv::UniformMean(g, 6), phasekv::UniformMean(other, 4), 2, 6, 4, 3, 50); },
      "value_policy.geometry() = (W=4, S=4, O=1)");
  expect_error(
      [&] { UCache(phasekv::UniformMean(g, 6), phasekv::UniformMean(g, 4), 2, 8, 4, 3, 50); },
      "key_policy.input_dim() = 6");
  expect_error(
      [&] { UCache(phasekv::UniformMean(g, 6), phasekv::UniformMean(g, 5), 2, 6, 4, 3, 50); },
      "value_policy.input_dim() = 5");
  expect_error(
      [&] { UCache(phasekv::UniformMean(g, 6), phasekv::UniformMean(g, 4), 0, 6, 4, 3, 50); },
      "kv_heads = 0");
  expect_error(
      [&] { UCache(phasekv::UniformMean(g, 6), phasekv::UniformMean(g, 4), 2, 6, 4, -1, 50); },
      "local = -1");
  expect_error(
      [&] { UCache(phasekv::UniformMean(g, 6), phasekv::UniformMean(g, 4), 2, 6, 4, 3, -5); },
      "max_length = -5");
  // Caller storage that is too small, has the wrong dim, or is null.
  const phasekv::CacheExtents e = phasekv::cache_extents(g, 3, 50);
  std::vector<float> buf(1000);
  phasekv::CacheStorage<float> st;
  st.prefix_keys = phasekv::make_view(buf.data(), e.prefix_tokens, 2, 6);
  st.prefix_values = phasekv::make_view(buf.data(), e.prefix_tokens, 2, 4);
  st.entry_keys = phasekv::make_view(buf.data(), e.entries - 1, 2, 6);
  st.entry_values = phasekv::make_view(buf.data(), e.entries, 2, 4);
  st.ring_keys = phasekv::make_view(buf.data(), e.ring_tokens, 2, 6);
  st.ring_values = phasekv::make_view(buf.data(), e.ring_tokens, 2, 4);
  auto build = [&] {
    UCache(phasekv::UniformMean(g, 6), phasekv::UniformMean(g, 4), 2, 6, 4, 3, 50, st);
  };
  expect_error(build, "storage.entry_keys.tokens");
  st.entry_keys.tokens = e.entries;
  EXPECT_NO_THROW(build());
  st.ring_values.dim = 5;
  expect_error(build, "storage.ring_values.dim = 5");
  st.ring_values.dim = 4;
  st.prefix_keys.data = nullptr;
  expect_error(build, "storage.prefix_keys");
}

// Head dims where the policies' row kernels apply (d a multiple of 32, W = 2S for the run
// kernels): windows wholly inside an appended chunk go through compress_batch's window loop
// and must still give the batch bits, chunk by chunk and token by token.
TYPED_TEST(CacheStreaming, FastPathsInChunksEqualBatchBitForBit) {
  using T = TypeParam;
  std::mt19937_64 rng(4321 + sizeof(T));
  for (const phasekv::Geometry g : {phasekv::Geometry(8, 4), phasekv::Geometry(4, 2, 3),
                                    phasekv::Geometry(8, 8), phasekv::Geometry(16, 8)}) {
    for (const i64 d : {i64{64}, i64{96}}) {
      const i64 heads = 2, local = 5, n = 700;
      const std::string where = "W=" + std::to_string(g.window()) +
                                " S=" + std::to_string(g.stride()) +
                                " O=" + std::to_string(g.origin()) + " d=" + std::to_string(d);
      stream_equals_batch<T>(phasekv::UniformMean(g, d), phasekv::UniformMean(g, d), heads, local,
                             n, rng, "UniformMean " + where);
      const GatedParams pk =
          GatedParams::random(rng, g, heads, d, d, phasekv::GateKind::scalar, true, true, false);
      stream_equals_batch<T>(pk.policy(), phasekv::UniformMean(g, d), heads, local, n, rng,
                             "GatedPool scalar " + where);
    }
  }
}

// Chunks past the window loop's prefetch threshold (256 KiB of raw rows: 4 heads x 128
// elements, 256+ tokens in bf16), with a ring longer than most chunks (its copies wrap inside
// a chunk): entries and every visible raw token must still be the batch's and the input's, for
// the run kernels (UniformMean, GatedPool at W = 2S) and the per-window path (MaxPool).
TYPED_TEST(CacheStreaming, LargeChunksCopyTheRingAsTheyAreRead) {
  using T = TypeParam;
  std::mt19937_64 rng(777 + sizeof(T));
  const phasekv::Geometry g(8, 4);
  const i64 heads = 4, d = 128, local = 300, n = 2600;
  stream_equals_batch<T>(phasekv::UniformMean(g, d), phasekv::UniformMean(g, d), heads, local, n,
                         rng, "UniformMean");
  const GatedParams pk =
      GatedParams::random(rng, g, heads, d, d, phasekv::GateKind::scalar, true, true, false);
  stream_equals_batch<T>(pk.policy(), phasekv::MaxPool(g, d), heads, local, n, rng,
                         "GatedPool scalar / MaxPool");
}

}  // namespace
