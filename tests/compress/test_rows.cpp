// The compress_rows fast paths (UniformMean, GatedPool scalar gates / identity payload) must
// give exactly the bits of the generic compress() path through a loader: compress_batch with
// the policy is compared with memcmp against compress_batch with a wrapper that hides
// compress_rows, over awkward dims, geometries, layouts, element types and special values.
// Without infinities or NaNs in the input the outputs must be equal byte for byte.
#include <algorithm>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "compress_test_util.hpp"
#include "phasekv/compress/compress_batch.hpp"
#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/compress/uniform_mean.hpp"

namespace {

using pkv_test::i64;

// Forwards the policy contract but not compress_rows, so compress_batch takes the generic
// loader path.
template <class P>
struct GenericOnly {
  P p;
  phasekv::Geometry geometry() const { return p.geometry(); }
  i64 input_dim() const { return p.input_dim(); }
  i64 output_dim() const { return p.output_dim(); }
  i64 kv_heads() const { return phasekv::policy_kv_heads(p); }
  template <class Load>
  void compress(i64 h, const Load& x, float* out) const {
    p.compress(h, x, out);
  }
};

#ifdef PHASEKV_TEST_ROWS_SIMD  // the instruction-set builds of this file (CMakeLists.txt): the
// base pass of the row kernels follows the flags (the policies run the pass of PHASEKV_ARCH)
static_assert(phasekv::detail::tgt_base::rows::simd_width_bits() == PHASEKV_TEST_ROWS_SIMD,
              "this build of test_rows.cpp must exercise the row kernels of its instruction set");
#endif
#ifdef PHASEKV_TEST_ROWS_BF16CVT  // and whether it converts to bf16 with VCVTNE2PS2BF16
static_assert(PHASEKV_DETAIL_ROWS_BF16CVT == PHASEKV_TEST_ROWS_BF16CVT,
              "this build of test_rows.cpp must exercise its bf16 conversion path");
#endif

static_assert(phasekv::detail::has_compress_rows<phasekv::UniformMean, phasekv::bf16_t>::value,
              "UniformMean has the fast path");
static_assert(phasekv::detail::has_compress_rows<phasekv::GatedPool, float>::value,
              "GatedPool has the fast path");
static_assert(!phasekv::detail::has_compress_rows<GenericOnly<phasekv::UniformMean>, float>::value,
              "the wrapper hides it");
static_assert(phasekv::detail::has_compress_rows2<phasekv::GatedPool, phasekv::bf16_t>::value,
              "GatedPool has the two-window fast path");
static_assert(
    phasekv::detail::has_compress_rows_run<phasekv::GatedPool, phasekv::bf16_t>::value &&
        phasekv::detail::has_compress_rows_run<phasekv::UniformMean, phasekv::bf16_t>::value &&
        !phasekv::detail::has_compress_rows_run<GenericOnly<phasekv::GatedPool>,
                                                phasekv::bf16_t>::value,
    "GatedPool and UniformMean have the run fast path, the wrapper does not");
static_assert(
    !phasekv::detail::has_compress_rows2<phasekv::UniformMean, float>::value &&
        !phasekv::detail::has_compress_rows2<GenericOnly<phasekv::GatedPool>, float>::value,
    "UniformMean and the wrapper do not");

// Raw data: `kind` 0 uniform in [-1, 1); 1 adds exact zeros, negative zeros, huge values
// (sums overflow to inf) and tiny ones; 2 adds infinities and NaNs.
template <class T>
void fill_raw(std::vector<T>& v, std::mt19937_64& rng, int kind) {
  for (auto& x : v) {
    float f = pkv_test::uniform(rng);
    if (kind >= 1) {
      const i64 r = pkv_test::rand_int(rng, 0, 19);
      if (r == 0) f = 0.0f;
      if (r == 1) f = -0.0f;
      if (r == 2) f = std::is_same<T, phasekv::f16_t>::value ? 6.0e4f : 3.0e38f;
      if (r == 3) f = std::is_same<T, phasekv::f16_t>::value ? -6.0e4f : -3.0e38f;
      if (r == 4) f = std::is_same<T, phasekv::f16_t>::value ? 1.0e-7f : 1.0e-39f;
      if (kind >= 2 && r == 5) f = std::numeric_limits<float>::infinity();
      if (kind >= 2 && r == 6) f = -std::numeric_limits<float>::infinity();
      if (kind >= 2 && r == 7) f = std::numeric_limits<float>::quiet_NaN();
    }
    x = phasekv::from_float<T>(f);
  }
}

struct Case {
  i64 w, s, d;
};

template <class T, class P>
void expect_same_bits(const P& policy, const phasekv::StridedView<const T>& raw, i64 j,
                      const std::string& what, bool nan_inputs = false) {
  const i64 heads = raw.heads, dout = policy.output_dim();
  std::vector<T> fast(static_cast<std::size_t>(j * heads * dout)), slow(fast.size());
  std::memset(static_cast<void*>(fast.data()), 0xff, fast.size() * sizeof(T));
  std::memset(static_cast<void*>(slow.data()), 0xff, slow.size() * sizeof(T));
  ASSERT_EQ(
      phasekv::compress_batch<T>(policy, raw, phasekv::make_view(fast.data(), j, heads, dout)), j);
  ASSERT_EQ(phasekv::compress_batch<T>(GenericOnly<P>{policy}, raw,
                                       phasekv::make_view(slow.data(), j, heads, dout)),
            j);
  if (!nan_inputs) {
    EXPECT_EQ(std::memcmp(fast.data(), slow.data(), fast.size() * sizeof(T)), 0) << what;
  }
  if (std::memcmp(fast.data(), slow.data(), fast.size() * sizeof(T)) != 0) {
    // Only NaN results may differ, and only in sign and payload (not part of the contract:
    // which NaN operand x86 propagates depends on the operand order the compiler picks).
    for (std::size_t k = 0; k < fast.size(); ++k)
      if (std::memcmp(&fast[k], &slow[k], sizeof(T)) != 0 &&
          !(std::isnan(phasekv::to_float(fast[k])) && std::isnan(phasekv::to_float(slow[k])))) {
        ADD_FAILURE() << what << ": first difference at entry " << k / (heads * dout) << " head "
                      << (k / dout) % heads << " channel " << k % dout << ": fast "
                      << phasekv::to_float(fast[k]) << " generic " << phasekv::to_float(slow[k]);
        return;
      }
  }
}

template <class T>
class CompressRows : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, phasekv::bf16_t, phasekv::f16_t>;
TYPED_TEST_SUITE(CompressRows, ElementTypes);

TYPED_TEST(CompressRows, FastPathEqualsGenericPathBitForBit) {
  using T = TypeParam;
  std::mt19937_64 rng(20240611);
  const i64 heads = 3;
  const Case cases[] = {{8, 4, 0}, {4, 4, 0}, {3, 5, 0}, {16, 8, 0}, {40, 8, 0}};
  const i64 dims[] = {1, 7, 56, 128, 200};
  for (const Case& cs : cases)
    for (i64 d : dims)
      for (int kind = 0; kind < 3; ++kind)
        for (int layout = 0; layout < 3; ++layout) {
          const phasekv::Geometry g(cs.w, cs.s, kind);  // origin 0, 1, 2
          const i64 n = g.origin() + cs.w + 5 * cs.s + 3;
          const i64 j = g.complete_windows(n);
          // layout 0: NHD, 1: HND, 2: NHD with padded tokens and heads (odd strides)
          const i64 pad = layout == 2 ? 3 : 0;
          std::vector<T> buf(static_cast<std::size_t>(n * heads * (d + pad) + 5 * n));
          fill_raw(buf, rng, kind);
          phasekv::StridedView<const T> raw;
          if (layout < 2) {
            raw = phasekv::make_view<const T>(
                buf.data(), n, heads, d, layout == 0 ? phasekv::Layout::NHD : phasekv::Layout::HND);
          } else {
            raw = phasekv::StridedView<const T>{buf.data() + 1,        n,      heads, d,
                                                heads * (d + pad) + 5, d + pad};
          }
          const std::string what = "W" + std::to_string(cs.w) + " S" + std::to_string(cs.s) + " d" +
                                   std::to_string(d) + " kind" + std::to_string(kind) + " layout" +
                                   std::to_string(layout);
          expect_same_bits<T>(phasekv::UniformMean(g, d), raw, j, "UniformMean " + what, kind == 2);

          const i64 w = cs.w;
          std::vector<float> z(static_cast<std::size_t>(heads * w * d)),
              b(static_cast<std::size_t>(heads * w));
          for (auto& x : z) x = pkv_test::uniform(rng, -0.5f, 0.5f);
          for (auto& x : b) x = pkv_test::uniform(rng, -2.0f, 2.0f);
          if (kind >= 1) {  // switch some offsets off, push some logits far apart
            for (std::size_t k = 0; k < b.size(); k += 3)
              b[k] = -std::numeric_limits<float>::infinity();
            if (!b.empty()) b[1 % b.size()] = 90.0f;
          }
          const auto zv = phasekv::param_view(z.data(), {heads, w, 1, d});
          const auto bv = phasekv::param_view(b.data(), {heads, w, 1});
          const phasekv::GatedPool full(g, heads, d, d, phasekv::GateKind::scalar, zv, bv);
          expect_same_bits<T>(full, raw, j, "GatedPool z+b " + what, kind == 2);
          expect_same_bits<T>(full.cycled(3), raw, j, "GatedPool z+b cycled " + what, kind == 2);
          expect_same_bits<T>(phasekv::GatedPool(g, heads, d, d, phasekv::GateKind::scalar, zv, {}),
                              raw, j, "GatedPool z " + what, kind == 2);
          expect_same_bits<T>(phasekv::GatedPool(g, heads, d, d, phasekv::GateKind::scalar, {}, bv),
                              raw, j, "GatedPool b " + what, kind == 2);
          expect_same_bits<T>(phasekv::GatedPool(g, heads, d, d, phasekv::GateKind::scalar, {}, {}),
                              raw, j, "GatedPool none " + what, kind == 2);
        }
}

TYPED_TEST(CompressRows, LargeCallsPrefetchAndStreamSameBits) {
  // Calls that read at least kPrefetchRawBytes of raw rows and write at least
  // kStreamEntryBytes of entries take compress_entries' other loop (software prefetch, and
  // non-temporal entry stores when the entries start on a cache line: offset 0; offset 1 puts
  // them one element off, so they take plain stores).
  using T = TypeParam;
  std::mt19937_64 rng(77);
  const i64 heads = 8, d = 128;
  const phasekv::Geometry g(8, 4);
  const i64 window_bytes = 4 * heads * d * static_cast<i64>(sizeof(T));
  const i64 entry_bytes = heads * d * static_cast<i64>(sizeof(T));
  const i64 j = std::max(phasekv::detail::kPrefetchRawBytes / window_bytes,
                         phasekv::detail::kStreamEntryBytes / entry_bytes) +
                3;
  ASSERT_GE(j * heads * d * static_cast<i64>(sizeof(T)), phasekv::detail::kStreamEntryBytes);
  const i64 n = g.window_end(j - 1) + 2;
  ASSERT_EQ(g.complete_windows(n), j);
  std::vector<T> buf(static_cast<std::size_t>(n * heads * d));
  fill_raw(buf, rng, 1);
  const auto raw = phasekv::make_view<const T>(buf.data(), n, heads, d);
  std::vector<float> z(static_cast<std::size_t>(heads * 8 * d)),
      b(static_cast<std::size_t>(heads * 8));
  for (auto& x : z) x = pkv_test::uniform(rng, -0.5f, 0.5f);
  for (auto& x : b) x = pkv_test::uniform(rng, -2.0f, 2.0f);
  const phasekv::UniformMean mean(g, d);
  const phasekv::GatedPool gated(g, heads, d, d, phasekv::GateKind::scalar,
                                 phasekv::param_view(z.data(), {heads, 8, 1, d}),
                                 phasekv::param_view(b.data(), {heads, 8, 1}));
  const std::size_t count = static_cast<std::size_t>(j * heads * d);
  std::vector<T> fast(count + 64), slow(count);
  for (int which = 0; which < 4; ++which) {
    std::memset(static_cast<void*>(fast.data()), 0xff, fast.size() * sizeof(T));
    std::memset(static_cast<void*>(slow.data()), 0xff, slow.size() * sizeof(T));
    // the first element after a 64-byte boundary, plus one
    T* base = fast.data();
    while (reinterpret_cast<std::uintptr_t>(base) % 64 != 0) ++base;
    T* out = base + which / 2;
    const auto fv = phasekv::make_view(out, j, heads, d);
    const auto sv = phasekv::make_view(slow.data(), j, heads, d);
    if (which % 2 == 0) {
      phasekv::compress_batch<T>(mean, raw, fv);
      phasekv::compress_batch<T>(GenericOnly<phasekv::UniformMean>{mean}, raw, sv);
    } else {
      phasekv::compress_batch<T>(gated, raw, fv);
      phasekv::compress_batch<T>(GenericOnly<phasekv::GatedPool>{gated}, raw, sv);
    }
    EXPECT_EQ(std::memcmp(out, slow.data(), count * sizeof(T)), 0)
        << (which % 2 == 0 ? "UniformMean" : "GatedPool") << " offset " << which / 2;
    for (T* p = fast.data(); p < out; ++p)  // nothing written before the entries
      EXPECT_EQ(std::memcmp(p, &fast.back(), sizeof(T)), 0);
  }
}

TEST(CompressRows, GatedPoolDeclinesVectorGatesAndPayloads) {
  const phasekv::Geometry g(4, 2);
  const i64 heads = 1, d = 5;
  std::vector<float> z(static_cast<std::size_t>(heads * 4 * d * d), 0.1f),
      c(static_cast<std::size_t>(heads * 4 * d * d), 0.2f);
  // `out` has room past d: GCC 12 (-O2 -mavx2, -Warray-bounds) cannot see that the declined
  // calls return before the row kernels and flags their 8-lane stores into a 5-float object.
  std::vector<float> raw(static_cast<std::size_t>(4 * d), 1.0f), out(16, -7.0f);
  const phasekv::GatedPool vec(g, heads, d, d, phasekv::GateKind::vector,
                               phasekv::param_view(z.data(), {heads, 4, d, d}), {});
  const phasekv::GatedPool pay(g, heads, d, d, phasekv::GateKind::scalar, {}, {},
                               phasekv::param_view(c.data(), {heads, 4, d, d}));
  EXPECT_FALSE(vec.compress_rows(0, raw.data(), d, out.data()));
  EXPECT_FALSE(pay.compress_rows(0, raw.data(), d, out.data()));
  for (float x : out) EXPECT_EQ(x, -7.0f);  // nothing written
  // ... and compress_batch still gives the generic bits for them
  std::mt19937_64 rng(7);
  std::vector<float> data(static_cast<std::size_t>(19 * 2 * d));
  fill_raw(data, rng, 1);
  std::vector<float> zz(static_cast<std::size_t>(2 * 4 * d * d)), cc(zz.size());
  for (auto& x : zz) x = pkv_test::uniform(rng);
  for (auto& x : cc) x = pkv_test::uniform(rng);
  const auto rv = phasekv::make_view<const float>(data.data(), 19, 2, d);
  expect_same_bits<float>(phasekv::GatedPool(g, 2, d, d, phasekv::GateKind::vector,
                                             phasekv::param_view(zz.data(), {2, 4, d, d}), {}),
                          rv, g.complete_windows(19), "vector gates");
  expect_same_bits<float>(phasekv::GatedPool(g, 2, d, d, phasekv::GateKind::scalar, {}, {},
                                             phasekv::param_view(cc.data(), {2, 4, d, d})),
                          rv, g.complete_windows(19), "payload");
}

TYPED_TEST(CompressRows, GatedPoolTwoWindowsEqualCompressBitForBit) {
  // compress_rows2 on arbitrary pairs of windows (heads of one window, windows of one head,
  // the same window twice) must give each window compress()'s bits; where it does not apply
  // (windows over 8 tokens, vector gates, no AVX-512) it returns false and writes nothing.
  using T = TypeParam;
  std::mt19937_64 rng(515);
  const i64 heads = 3, n = 40;
  for (i64 d : {56, 128, 200}) {
    for (i64 w : {1, 3, 8, 9}) {
      const phasekv::Geometry g(w, 2);
      std::vector<T> buf(static_cast<std::size_t>(n * heads * d));
      fill_raw(buf, rng, 1);
      const auto raw = phasekv::make_view<const T>(buf.data(), n, heads, d);
      std::vector<float> z(static_cast<std::size_t>(heads * w * d)),
          b(static_cast<std::size_t>(heads * w));
      for (auto& x : z) x = pkv_test::uniform(rng, -0.5f, 0.5f);
      for (auto& x : b) x = pkv_test::uniform(rng, -2.0f, 2.0f);
      b[0] = -std::numeric_limits<float>::infinity();  // one offset off
      const phasekv::GatedPool gp(g, heads, d, d, phasekv::GateKind::scalar,
                                  phasekv::param_view(z.data(), {heads, w, 1, d}),
                                  phasekv::param_view(b.data(), {heads, w, 1}));
      const bool applies = phasekv::detail::rows::gated_pair_available() &&
                           w <= phasekv::detail::rows::kGatedPairMaxWindow;
      const i64 pairs[][4] = {
          {0, 0, 0, 1}, {2, 1, 2, 2}, {5, 2, 5, 2}, {1, 0, 7, 2}};  // (j, h) x 2
      for (const auto& pr : pairs) {
        std::vector<float> out(static_cast<std::size_t>(d), -7.0f), out2(out), want(out),
            want2(out);
        gp.compress(pr[1], phasekv::window_loader<T>(raw, g, pr[0], pr[1]), want.data());
        gp.compress(pr[3], phasekv::window_loader<T>(raw, g, pr[2], pr[3]), want2.data());
        const bool took =
            gp.compress_rows2(pr[1], raw.ptr(g.window_begin(pr[0]), pr[1]), out.data(), pr[3],
                              raw.ptr(g.window_begin(pr[2]), pr[3]), out2.data(), raw.token_stride);
        const std::string what = "d" + std::to_string(d) + " W" + std::to_string(w) + " j" +
                                 std::to_string(pr[0]) + " h" + std::to_string(pr[1]) + " / j" +
                                 std::to_string(pr[2]) + " h" + std::to_string(pr[3]);
        ASSERT_EQ(took, applies) << what;
        if (took) {
          EXPECT_EQ(std::memcmp(out.data(), want.data(), out.size() * sizeof(float)), 0) << what;
          EXPECT_EQ(std::memcmp(out2.data(), want2.data(), out.size() * sizeof(float)), 0) << what;
        } else {
          for (i64 c = 0; c < d; ++c) ASSERT_TRUE(out[c] == -7.0f && out2[c] == -7.0f) << what;
        }
      }
    }
  }
  const phasekv::Geometry g(4, 2);
  std::vector<float> zv(static_cast<std::size_t>(4 * 8 * 8), 0.1f), raw(32, 1.0f), o(8, -7.0f),
      o2(o);
  const phasekv::GatedPool vec(g, 1, 8, 8, phasekv::GateKind::vector,
                               phasekv::param_view(zv.data(), {1, 4, 8, 8}), {});
  EXPECT_FALSE(vec.compress_rows2(0, raw.data(), o.data(), 0, raw.data(), o2.data(), 8));
  for (i64 c = 0; c < 8; ++c) EXPECT_TRUE(o[c] == -7.0f && o2[c] == -7.0f);
}

// Raw bf16 rows of `heads` heads for 34 windows of `g` (and 3 tokens more), filled as
// fill_raw's `kind` (kind 1 head-major, else token-major): the data of the run tests.
struct RunRaw {
  std::vector<phasekv::bf16_t> buf;
  phasekv::StridedView<const phasekv::bf16_t> view;
  RunRaw(const phasekv::Geometry& g, i64 heads, i64 d, int kind, std::mt19937_64& rng) {
    const i64 n = g.window_end(33) + 3;
    buf.resize(static_cast<std::size_t>(n * heads * d));
    fill_raw(buf, rng, kind);
    view = phasekv::make_view<const phasekv::bf16_t>(
        buf.data(), n, heads, d, kind == 1 ? phasekv::Layout::HND : phasekv::Layout::NHD);
  }
};

// Calls `check(cs, g, d, kind, raw, what)` for every case of `cases` (W, S), head dims 32, 96,
// 128, 256 and 56 and fill kinds 0 .. 2, on RunRaw data of 3 heads (`what` names the case).
template <std::size_t N, class Check>
void for_each_run_case(const Case (&cases)[N], std::mt19937_64& rng, const Check& check) {
  for (const Case& cs : cases)
    for (i64 d : {32, 96, 128, 256, 56})
      for (int kind = 0; kind < 3; ++kind) {
        const phasekv::Geometry g(cs.w, cs.s);
        const RunRaw in(g, 3, d, kind, rng);
        const std::string what = "W" + std::to_string(cs.w) + " S" + std::to_string(cs.s) + " d" +
                                 std::to_string(d) + " kind" + std::to_string(kind);
        check(cs, g, d, kind, in.view, what);
      }
}

// compress_batch of `policy` over `raw` (which takes the runs where they apply) against the
// generic path, then compress_rows_run over runs of 1 .. 33 windows of one head (the last ends
// at window 33) against compress() converted by from_float, with plain stores (rows of d + 7,
// one element into a line) and non-temporal ones (64-byte aligned rows, prefetching asked
// for): every entry element must have compress()'s bits and everything else keep its poison;
// where the run does not apply (`applies` false) the call must return false and write nothing.
template <class Policy, class T>
void expect_runs_equal_compress(const Policy& policy, const phasekv::StridedView<const T>& raw,
                                const phasekv::Geometry& g, bool applies, const std::string& what,
                                bool nan_inputs) {
  namespace rk = phasekv::detail::rows;
  expect_same_bits<T>(policy, raw, g.complete_windows(raw.tokens), "compress_batch " + what,
                      nan_inputs);
  const i64 heads = raw.heads, d = policy.output_dim();
  const i64 counts[] = {1, 2, 15, 16, 17, 33};
  for (i64 count : counts) {
    const i64 j0 = 33 - count, h = count % heads;  // the run ends at the last window
    std::vector<float> want(static_cast<std::size_t>(count * d));
    for (i64 r = 0; r < count; ++r)
      policy.compress(h, phasekv::window_loader<T>(raw, g, j0 + r, h), want.data() + r * d);
    for (int stream = 0; stream < 2; ++stream) {
      // stream: 64-byte aligned rows of d elements; plain: rows of d + 7, one element in
      const i64 stride = stream ? d : d + 7;
      std::vector<T> store(static_cast<std::size_t>(count * stride + 64));
      std::memset(static_cast<void*>(store.data()), 0xff, store.size() * sizeof(T));
      T* out = store.data();
      while (reinterpret_cast<std::uintptr_t>(out) % 64 != 0) ++out;
      if (!stream) ++out;
      // with non-temporal stores, also ask for prefetching of every row from the run on
      const i64 t0 = g.window_begin(j0);
      const bool took =
          policy.compress_rows_run(h, raw.ptr(t0, h), raw.token_stride, count, out, stride,
                                   stream == 1, stream == 1 ? raw.tokens - t0 : 0);
      rk::store_fence();
      const std::string at =
          what + " count" + std::to_string(count) + " stream" + std::to_string(stream);
      ASSERT_EQ(took, applies) << at;
      std::size_t bad = 0;
      for (std::size_t k = 0; k < store.size(); ++k) {
        const T* p = store.data() + k;
        const i64 e = p - out, r = e >= 0 ? e / stride : -1, c = e >= 0 ? e % stride : -1;
        const bool entry = took && r >= 0 && r < count && c < d;
        if (!entry) {  // poison must survive everywhere else
          if (p->bits != 0xffff && bad++ < 3) ADD_FAILURE() << at << ": wrote element " << e;
          continue;
        }
        const T expect = phasekv::from_float<T>(want[static_cast<std::size_t>(r * d + c)]);
        const bool both_nan =
            std::isnan(phasekv::to_float(*p)) && std::isnan(phasekv::to_float(expect));
        if (p->bits != expect.bits && !(nan_inputs && both_nan) && bad++ < 3)
          ADD_FAILURE() << at << ": window " << r << " channel " << c << ": run "
                        << phasekv::to_float(*p) << " compress " << phasekv::to_float(expect);
      }
      EXPECT_EQ(bad, 0u) << at;
    }
  }
}

TEST(CompressRows, GatedPoolRunsEqualCompressBitForBit) {
  // compress_rows_run over runs of 1 .. 33 windows of one head (the kernel splits runs longer
  // than kGatedRunMax) must give every window compress()'s bits converted by from_float, with
  // plain and non-temporal stores, and nothing outside the entries; where it does not apply
  // (W != 2S, W > 8, d not a multiple of 32, no AVX-512) it returns false and writes nothing.
  // compress_batch over the same data (which takes the runs) must equal the generic path.
  using T = phasekv::bf16_t;
  namespace rk = phasekv::detail::rows;
  std::mt19937_64 rng(4242);
  const Case cases[] = {{8, 4, 0}, {6, 3, 0}, {4, 2, 0}, {2, 1, 0}, {8, 2, 0}, {10, 5, 0}};
  for_each_run_case(
      cases, rng,
      [&](const Case& cs, const phasekv::Geometry& g, i64 d, int kind,
          const phasekv::StridedView<const T>& raw, const std::string& what) {
        const i64 heads = raw.heads, w = cs.w;
        std::vector<float> z(static_cast<std::size_t>(heads * w * d)),
            b(static_cast<std::size_t>(heads * w));
        for (auto& x : z) x = pkv_test::uniform(rng, -0.5f, 0.5f);
        for (auto& x : b) x = pkv_test::uniform(rng, -2.0f, 2.0f);
        if (kind >= 1) {  // switch some offsets off (one head entirely), push some logits apart
          for (std::size_t k = 0; k < b.size(); k += 3)
            b[k] = -std::numeric_limits<float>::infinity();
          for (i64 i = 0; i < w; ++i)
            b[static_cast<std::size_t>(2 * w + i)] = -std::numeric_limits<float>::infinity();
          b[1 % b.size()] = 90.0f;
        }
        const auto zv = phasekv::param_view(z.data(), {heads, w, 1, d});
        const auto bv = phasekv::param_view(b.data(), {heads, w, 1});
        const phasekv::GatedPool full(g, heads, d, d, phasekv::GateKind::scalar, zv, bv);
        const phasekv::GatedPool variants[] = {
            full,
            full.cycled(3),
            full.cycled(-1),
            phasekv::GatedPool(g, heads, d, d, phasekv::GateKind::scalar, zv, {}),
            phasekv::GatedPool(g, heads, d, d, phasekv::GateKind::scalar, {}, bv),
            phasekv::GatedPool(g, heads, d, d, phasekv::GateKind::scalar, {}, {})};
        const bool applies = rk::gated_run_available() && w == 2 * cs.s && w <= 8 && d % 32 == 0;
        for (std::size_t v = 0; v < std::size(variants); ++v)
          expect_runs_equal_compress(variants[v], raw, g, applies,
                                     what + " variant" + std::to_string(v), kind == 2);
      });
  // other element types never take it
  std::vector<float> zf(8 * 32, 0.1f), rf(40 * 32, 1.0f), of(32, -7.0f);
  const phasekv::GatedPool gf(phasekv::Geometry(8, 4), 1, 32, 32, phasekv::GateKind::scalar,
                              phasekv::param_view(zf.data(), {1, 8, 1, 32}), {});
  EXPECT_FALSE(gf.compress_rows_run(0, rf.data(), 32, 1, of.data(), 32, false, 0));
  for (float x : of) EXPECT_EQ(x, -7.0f);
}

TEST(CompressRows, UniformMeanRunsEqualCompressBitForBit) {
  // As GatedPoolRunsEqualCompressBitForBit for UniformMean's run kernel (bf16, W = 2S, d a
  // multiple of 32, AVX-512): W = 2S with S from 1 to 5 and 64 (power-of-two and other W, so
  // both the reciprocal and the division), and W != 2S, where it must decline.
  using T = phasekv::bf16_t;
  namespace rk = phasekv::detail::rows;
  std::mt19937_64 rng(4343);
  const Case cases[] = {{8, 4, 0},  {6, 3, 0},    {4, 2, 0}, {2, 1, 0},
                        {10, 5, 0}, {128, 64, 0}, {8, 2, 0}, {4, 4, 0}};
  for_each_run_case(
      cases, rng,
      [&](const Case& cs, const phasekv::Geometry& g, i64 d, int kind,
          const phasekv::StridedView<const T>& raw, const std::string& what) {
        const bool applies = rk::mean_run_available() && cs.w == 2 * cs.s && d % 32 == 0;
        expect_runs_equal_compress(phasekv::UniformMean(g, d), raw, g, applies, what, kind == 2);
      });
  // other element types never take it
  std::vector<float> rf(40 * 32, 1.0f), of(32, -7.0f);
  const phasekv::UniformMean mf(phasekv::Geometry(8, 4), 32);
  EXPECT_FALSE(mf.compress_rows_run(0, rf.data(), 32, 1, of.data(), 32, false, 0));
  for (float x : of) EXPECT_EQ(x, -7.0f);
}

TEST(CompressRows, StoreRowEqualsFromFloatOnSpecialValues) {
  // every bf16 rounding case: ties, NaN payloads, infinities, subnormals, signs
  std::vector<float> src;
  const std::uint32_t bits[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x3f808000u,
                                0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u,
                                0xff800000u, 0x7f800001u, 0xffc00001u, 0x7fffffffu, 0x7fbfffffu,
                                0x3f7f8000u, 0x477ff000u, 0x38800000u, 0x33000001u, 0xc77fefffu};
  for (std::uint32_t u : bits) src.push_back(phasekv::detail::fp_from_bits(u));
  std::mt19937_64 rng(3);
  for (int k = 0; k < 1000; ++k)
    src.push_back(phasekv::detail::fp_from_bits(static_cast<std::uint32_t>(rng())));
  const i64 n = static_cast<i64>(src.size());
  std::vector<phasekv::bf16_t> b(src.size());
  std::vector<phasekv::f16_t> h(src.size());
  std::vector<float> f(src.size());
  phasekv::detail::rows::store_row(b.data(), src.data(), n);
  phasekv::detail::rows::store_row(h.data(), src.data(), n);
  phasekv::detail::rows::store_row(f.data(), src.data(), n);
  for (i64 k = 0; k < n; ++k) {
    EXPECT_EQ(b[k].bits, phasekv::float_to_bf16(src[k]).bits) << k;
    EXPECT_EQ(h[k].bits, phasekv::float_to_f16(src[k]).bits) << k;
    EXPECT_EQ(phasekv::detail::fp_bits(f[k]), phasekv::detail::fp_bits(src[k])) << k;
  }
}

TEST(CompressRows, VectorExpEqualsFpExpBitForBit) {
#if PHASEKV_DETAIL_ROWS_SIMD >= 512
  // every 251st float bit pattern (both signs, NaNs, infinities, subnormals) plus the edges
  // of fp_exp's range checks and of its exponent arithmetic
  std::vector<float> x;
  for (std::uint64_t u = 0; u <= 0xffffffffu; u += 251)
    x.push_back(phasekv::detail::fp_from_bits(static_cast<std::uint32_t>(u)));
  for (float e : {88.72283935546875f, -87.3365478515625f, 88.7f, -87.3f, 0.0f, -0.0f})
    for (int k = -40; k <= 40; ++k)
      x.push_back(phasekv::detail::fp_from_bits(
          static_cast<std::uint32_t>(static_cast<std::int64_t>(phasekv::detail::fp_bits(e)) + k)));
  while (x.size() % 16 != 0) x.push_back(1.0f);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < x.size(); i += 16) {
    alignas(64) float r[16];
    _mm512_store_ps(r, phasekv::detail::tgt_base::rows::exp16(_mm512_loadu_ps(x.data() + i)));
    for (int l = 0; l < 16; ++l) {
      const float want = phasekv::detail::fp_exp(x[i + l]);
      if (phasekv::detail::fp_bits(r[l]) != phasekv::detail::fp_bits(want) && bad++ < 5)
        ADD_FAILURE() << "x = " << x[i + l] << " (bits " << std::hex
                      << phasekv::detail::fp_bits(x[i + l]) << "): exp16 " << r[l] << " fp_exp "
                      << want << std::dec;
    }
  }
  EXPECT_EQ(bad, 0u);
#else
  GTEST_SKIP() << "this translation unit has no AVX-512 row kernels";
#endif
}

TEST(CompressRows, Bf16GroupStoresEqualFromFloat) {
#if PHASEKV_DETAIL_ROWS_SIMD >= 512
  // Groups of 32 floats as the bf16 stores see them: in channel order (store_row, streaming
  // stores) and as even/odd channel halves (GatedPool's run kernel). With AVX512-BF16 a group
  // without subnormals goes through VCVTNE2PS2BF16, a group with one through the integer
  // rounding; both must give float_to_bf16's bits. Values: rounding ties, NaN payloads,
  // infinities, the largest finite values (rounding to infinity), signed zeros, random bits.
  namespace rk = phasekv::detail::tgt_base::rows;  // this translation unit's own kernels
  const std::uint32_t specials[] = {
      0x00000000u, 0x80000000u, 0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0xff7fffffu,
      0x7f800000u, 0xff800000u, 0x7f800001u, 0xffc00001u, 0x7fffffffu, 0x7fbfffffu, 0x3f7f8000u,
      0x477ff000u, 0x00800000u, 0x80800000u, 0x00808000u, 0x33000001u, 0xc77fefffu};
  std::mt19937_64 rng(5);
  int groups_with_subnormal = 0, bad = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    alignas(64) float v[32], e[16], o[16];
    for (int c = 0; c < 32; ++c) {
      std::uint32_t u = static_cast<std::uint32_t>(rng());
      if (rng() % 2 == 0) u = specials[rng() % std::size(specials)];
      if ((u & 0x7f800000u) == 0 && (u & 0x007fffffu) != 0) u |= 0x00800000u;  // normal
      v[c] = phasekv::detail::fp_from_bits(u);
    }
    if (trial % 4 == 0) {  // one subnormal (or the smallest ones) somewhere in the group
      const std::uint32_t sub[] = {0x00000001u, 0x807fffffu, 0x00400000u, 0x80000001u};
      v[rng() % 32] = phasekv::detail::fp_from_bits(sub[(trial / 4) % 4]);
      ++groups_with_subnormal;
    }
    for (int i = 0; i < 16; ++i) {
      e[i] = v[2 * i];
      o[i] = v[2 * i + 1];
    }
    alignas(64) std::uint16_t in_order[32], pairs[32];
    _mm512_store_si512(in_order, rk::bf16_round32(_mm512_load_ps(v), _mm512_load_ps(v + 16)));
    _mm512_store_si512(pairs, rk::bf16_round_pairs(_mm512_load_ps(e), _mm512_load_ps(o)));
    for (int c = 0; c < 32; ++c) {
      const std::uint16_t want = phasekv::float_to_bf16(v[c]).bits;
      if ((in_order[c] != want || pairs[c] != want) && bad++ < 5)
        ADD_FAILURE() << "trial " << trial << " channel " << c << " bits " << std::hex
                      << phasekv::detail::fp_bits(v[c]) << ": in order " << in_order[c]
                      << ", pairs " << pairs[c] << ", float_to_bf16 " << want << std::dec;
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(groups_with_subnormal, 1000);
#else
  GTEST_SKIP() << "this translation unit has no AVX-512 row kernels";
#endif
}

}  // namespace
