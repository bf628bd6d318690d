// The FlashMLA FP8 cache formats (MODEL1, V3.2): the bytes the writers store equal those of the
// test's own quantizer (dsv4_format_ref.hpp); they round-trip within E4M3's and bf16's steps;
// the sparse attention over those bytes (contiguous and paged, every CPU build) equals a
// float64 reference over the dequantized rows; bad layouts are refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "dsv4_attention_ref.hpp"
#include "dsv4_builds.hpp"
#include "dsv4_format_ref.hpp"
#include "dsv4_test_util.hpp"
#include "phasekv/dsv4/cache_format.hpp"
#include "phasekv/dsv4/compressor.hpp"
#include "phasekv/dsv4/latent_append.hpp"
#include "phasekv/dsv4/sparse_attention.hpp"

namespace {

namespace dsv4 = phasekv::dsv4;
using phasekv::model1_fp8_t;
using phasekv::v32_fp8_t;
using i64 = std::int64_t;

template <class E>
const dsv4t::Layout& layout_of() {
  return std::is_same<E, model1_fp8_t>::value ? dsv4t::kModel1 : dsv4t::kV32;
}

// A pool of `pages` blocks of P tokens in format E, poisoned with 0xA5: MODEL1 blocks padded as
// FlashMLA pads them, V3.2 tokens `stride` bytes apart.
template <class E>
struct Pool {
  i64 pages, P, stride, block;
  std::vector<E> bytes;
  Pool(i64 pages_, i64 P_, i64 stride_ = 656) : pages(pages_), P(P_), stride(stride_) {
    block = std::is_same<E, model1_fp8_t>::value ? dsv4::model1_block_bytes(P) : P * stride;
    bytes.assign(static_cast<std::size_t>(pages * block), E{0xA5});
  }
  phasekv::PagePool<E> pool() {
    auto p = phasekv::make_page_pool<E>(bytes.data(), bytes.data(), pages, P, 1,
                                        dsv4::CacheFormat<E>::token_bytes,
                                        dsv4::CacheFormat<E>::token_bytes);
    p.key_page_stride = block;
    if (!std::is_same<E, model1_fp8_t>::value) p.d_k = p.d_v = stride;
    return p;
  }
  std::uint8_t* page(i64 pg) { return reinterpret_cast<std::uint8_t*>(bytes.data()) + pg * block; }
};

// Rows with a spread of tile magnitudes (so scales differ by tile and row) and some tiny tiles
// (the 1e-4 floor of the scale).
std::vector<float> spread_rows(i64 n, i64 d, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n * d));
  for (i64 r = 0; r < n; ++r)
    for (i64 t = 0; t * 128 < d; ++t) {
      const float mag =
          (r + t) % 5 == 2 ? 1e-6f : std::ldexp(1.0f, static_cast<int>(rng() % 9) - 4);
      for (i64 i = t * 128; i < std::min(d, (t + 1) * 128); ++i)
        v[static_cast<std::size_t>(r * d + i)] = nd(rng) * mag;
    }
  return v;
}

template <class E>
class CacheFormats : public ::testing::Test {};
using Formats = ::testing::Types<model1_fp8_t, v32_fp8_t>;
TYPED_TEST_SUITE(CacheFormats, Formats);

// append_latent_paged writes the test quantizer's bytes, page by page (shuffled pages, a ring),
// and leaves every other byte (the block padding, pages not listed) untouched.
TYPED_TEST(CacheFormats, RawAppendWritesTheLayoutsBytes) {
  using E = TypeParam;
  const auto& f = layout_of<E>();
  const i64 d = f.dim, P = 5, B = 2;
  Pool<E> got(9, P, 664), want(9, P, 664);
  const std::vector<std::int32_t> table = {7, 2, 5, 0, 8, 1, 3, 6};  // 4 pages each
  const std::vector<i64> tokens = {3, 11};
  const std::vector<std::int32_t> indptr = {0, 9, 13};
  const auto rows = spread_rows(13, d, 5);
  dsv4::PagedLatentAppendArgs<float, E> a;
  a.batch = B;
  a.rows = rows.data();
  a.chunk_indptr = indptr.data();
  a.tokens = tokens.data();
  a.pool = got.pool();
  a.table = phasekv::dense_block_table(table.data(), B, 4);
  dsv4::append_latent_paged(d, a);
  for (i64 b = 0; b < B; ++b)
    for (i64 p = tokens[static_cast<std::size_t>(b)];
         p < tokens[static_cast<std::size_t>(b)] + indptr[b + 1] - indptr[b]; ++p) {
      const i64 pg = table[static_cast<std::size_t>(b * 4 + p / P)];
      dsv4t::quantize_token(f,
                            rows.data() + (indptr[b] + p - tokens[static_cast<std::size_t>(b)]) * d,
                            want.page(pg), P, p % P, 664);
    }
  for (std::size_t i = 0; i < got.bytes.size(); ++i)
    ASSERT_EQ(int(got.bytes[i].bits), int(want.bytes[i].bits)) << "byte " << i;
  // a ring of 6 slots: only the chunk's last 6 positions are written, at p mod 6
  Pool<E> ring(4, 3, 656), ring_want(4, 3, 656);
  const std::vector<std::int32_t> rt = {3, 1};
  const std::vector<i64> t0 = {4};
  const std::vector<std::int32_t> ip = {0, 9};
  a.batch = 1;
  a.tokens = t0.data();
  a.chunk_indptr = ip.data();
  a.pool = ring.pool();
  a.table = phasekv::dense_block_table(rt.data(), 1, 2);
  a.ring = 6;
  dsv4::append_latent_paged(d, a);
  for (i64 p = 7; p < 13; ++p)
    dsv4t::quantize_token(f, rows.data() + (p - 4) * d,
                          ring_want.page(rt[static_cast<std::size_t>((p % 6) / 3)]), 3, (p % 6) % 3,
                          656);
  for (std::size_t i = 0; i < ring.bytes.size(); ++i)
    ASSERT_EQ(int(ring.bytes[i].bits), int(ring_want.bytes[i].bits)) << "ring byte " << i;
}

// compress_append_paged stores the quantizer's bytes of each pooled entry (the entries of a
// CompressorState fed the same tokens), and the stored rows round-trip: NoPE within half an
// E4M3 step of its tile scale, RoPE within half a bf16 step.
TYPED_TEST(CacheFormats, CompressorWritesTheLayoutsBytesAndTheyRoundTrip) {
  using E = TypeParam;
  const auto& f = layout_of<E>();
  const i64 d = f.dim, S = 4, n = 37, P = 3;
  const auto ape = dsv4t::random_values<float>(static_cast<std::size_t>(S * 2 * d), 21, 0.5f);
  const dsv4::CompressorParams cp{S, 2, d, ape.data()};
  const auto kv = spread_rows(n, 2 * d, 22);
  const auto sc = dsv4t::random_values<float>(static_cast<std::size_t>(n * 2 * d), 23);
  const i64 J = n / S;
  std::vector<float> entries(static_cast<std::size_t>(J * d));
  dsv4::CompressorState<float> st(cp);
  st.append(kv.data(), sc.data(), n, entries.data());
  Pool<E> got(5, P, 656), want(5, P, 656);
  const std::vector<std::int32_t> table = {4, 0, 3, 1};
  std::vector<float> state(static_cast<std::size_t>(dsv4::compressor_state_elements(cp)));
  std::vector<i64> tokens = {0};
  const std::vector<std::int32_t> indptr = {0, static_cast<std::int32_t>(n)};
  dsv4::PagedCompressArgs<float, E> c;
  c.batch = 1;
  c.kv = kv.data();
  c.score = sc.data();
  c.chunk_indptr = indptr.data();
  c.tokens = tokens.data();
  c.state = state.data();
  c.entry_pool = got.pool();
  const std::vector<std::int32_t> csr = {0, 4};
  c.entry_table = phasekv::csr_block_table(csr.data(), table.data(), 1);
  dsv4::compress_append_paged(cp, c);
  EXPECT_EQ(tokens[0], n);
  for (i64 j = 0; j < J; ++j)
    dsv4t::quantize_token(f, entries.data() + j * d,
                          want.page(table[static_cast<std::size_t>(j / P)]), P, j % P, 656);
  for (std::size_t i = 0; i < got.bytes.size(); ++i)
    ASSERT_EQ(int(got.bytes[i].bits), int(want.bytes[i].bits)) << "byte " << i;
  for (i64 j = 0; j < J; ++j) {
    const auto* blk = got.page(table[static_cast<std::size_t>(j / P)]);
    const auto x = dsv4t::dequantize_token(f, blk, P, j % P, 656);
    const auto row = dsv4::CacheFormat<E>::row(blk, P, j % P, 656);
    for (i64 i = 0; i < d; ++i) {
      const double e = entries[static_cast<std::size_t>(j * d + i)];
      const double g = x[static_cast<std::size_t>(i)];
      EXPECT_EQ(dsv4::detail::load_channel<E>(row, i), x[static_cast<std::size_t>(i)])
          << j << " " << i;
      if (i >= f.nope) {
        ASSERT_LE(std::abs(g - e), std::abs(e) * std::ldexp(1.0, -8)) << j << " " << i;
      } else {
        float amax = 0.0f;
        const i64 t0 = i / f.tile * f.tile;
        for (i64 k = t0; k < t0 + f.tile; ++k)
          amax = std::max(amax, std::abs(entries[static_cast<std::size_t>(j * d + k)]));
        const double s = std::ldexp(1.0, dsv4t::scale_exponent(amax));
        ASSERT_LE(std::abs(g - e),
                  std::max(std::abs(e) * std::ldexp(1.0, -4), s * std::ldexp(1.0, -10)))
            << j << " " << i;
      }
    }
  }
}

// Sparse attention over the bytes (contiguous: MODEL1 in blocks, V3.2 rows; paged: shuffled
// pages) equals the float64 reference over the dequantized rows, on every build; paged equals
// contiguous bit for bit.
TYPED_TEST(CacheFormats, AttentionOverTheBytesMatchesReference) {
  using E = TypeParam;
  const auto& f = layout_of<E>();
  const i64 d = f.dim, dv = 512, H = 7, n = 46, J = 23, P = 4, Q = 3, k = 9;
  const i64 rp = (n + P - 1) / P, ep = (J + P - 1) / P;
  Pool<E> raw(rp, P, 656), ent(ep, P, 656);
  const auto xr = spread_rows(n, d, 31), xe = spread_rows(J, d, 32);
  std::vector<float> dr(static_cast<std::size_t>(n * d)), de(static_cast<std::size_t>(J * d));
  for (i64 r = 0; r < n; ++r) {
    dsv4t::quantize_token(f, xr.data() + r * d, raw.page(r / P), P, r % P, 656);
    const auto x = dsv4t::dequantize_token(f, raw.page(r / P), P, r % P, 656);
    std::copy(x.begin(), x.end(), dr.begin() + r * d);
  }
  for (i64 r = 0; r < J; ++r) {
    dsv4t::quantize_token(f, xe.data() + r * d, ent.page(r / P), P, r % P, 656);
    const auto x = dsv4t::dequantize_token(f, ent.page(r / P), P, r % P, 656);
    std::copy(x.begin(), x.end(), de.begin() + r * d);
  }
  const auto q = dsv4t::random_values<float>(static_cast<std::size_t>(Q * H * d), 33, 0.2f);
  const auto sinks = dsv4t::random_values<float>(static_cast<std::size_t>(H), 34);
  std::mt19937 rng(35);
  std::vector<std::int32_t> idx(static_cast<std::size_t>(Q * k));
  for (i64 i = 0; i < Q; ++i) dsv4t::random_index_list(rng, J, k, idx.data() + i * k);
  dsv4::SparseAttentionParams p;
  p.heads = H;
  p.dim = d;
  p.dim_v = dv;
  p.window = 10;
  p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  p.sinks = sinks.data();
  const bool m1 = std::is_same<E, model1_fp8_t>::value;
  const dsv4::LatentRows<E> rr{raw.bytes.data(), 0, n, 656, 1.0f, m1 ? P : 0, raw.block};
  const dsv4::LatentRows<E> er{ent.bytes.data(), 0, J, 656, 1.0f, m1 ? P : 0, ent.block};
  const dsv4::LatentRows<float> fr{dr.data(), 0, n, d, 1.0f}, fe{de.data(), 0, J, d, 1.0f};
  dsv4t::for_each_build([&](auto tag) {
    using A = decltype(tag);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> out(static_cast<std::size_t>(Q * H * dv), nan), lse(Q * H, nan);
    dsv4::sparse_attention<E, A>(p, q.data(), rr, er, idx.data(), k, n - Q, Q, out.data(),
                                 lse.data());
    for (i64 i = 0; i < Q; ++i) {
      std::vector<double> ro(static_cast<std::size_t>(H * dv)), rl(static_cast<std::size_t>(H));
      dsv4t::reference<float>(p, q.data() + i * H * d, fr, fe, idx.data() + i * k, k, n - Q + i,
                              ro.data(), rl.data());
      dsv4t::expect_query_matches(out.data() + i * H * dv, lse.data() + i * H, ro.data(), rl.data(),
                                  H, dv, std::string(A::name) + " query " + std::to_string(i));
    }
    // the same rows through pages in another order
    std::vector<std::int32_t> rt(static_cast<std::size_t>(rp)), et(static_cast<std::size_t>(ep));
    std::iota(rt.begin(), rt.end(), 0);
    std::iota(et.begin(), et.end(), 0);
    Pool<E> raw2(rp, P, 656), ent2(ep, P, 656);
    std::reverse(rt.begin(), rt.end());
    for (i64 pg = 0; pg < rp; ++pg)
      std::copy(raw.bytes.begin() + pg * raw.block, raw.bytes.begin() + (pg + 1) * raw.block,
                raw2.bytes.begin() + rt[static_cast<std::size_t>(pg)] * raw.block);
    std::reverse(et.begin(), et.end());
    for (i64 pg = 0; pg < ep; ++pg)
      std::copy(ent.bytes.begin() + pg * ent.block, ent.bytes.begin() + (pg + 1) * ent.block,
                ent2.bytes.begin() + et[static_cast<std::size_t>(pg)] * ent.block);
    const i64 len = n;
    const std::vector<std::int32_t> qo = {0, static_cast<std::int32_t>(Q)};
    dsv4::PagedSparseArgs<E> a;
    a.q = q.data();
    a.qo_indptr = qo.data();
    a.batch = 1;
    a.lengths = &len;
    a.raw_pool = raw2.pool();
    a.raw_table = phasekv::dense_block_table(rt.data(), 1, rp);
    a.entry_pool = ent2.pool();
    a.entry_table = phasekv::dense_block_table(et.data(), 1, ep);
    a.ratio = 2;
    a.indices = idx.data();
    a.index_count = k;
    std::vector<float> out2(out.size(), nan), lse2(lse.size(), nan);
    a.out = out2.data();
    a.lse = lse2.data();
    dsv4::paged_sparse_attention<E, A>(p, a);
    EXPECT_EQ(out, out2) << A::name;
    EXPECT_EQ(lse, lse2) << A::name;
  });
}

template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const phasekv::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// Layouts the formats cannot have are refused by name, before anything is written.
TYPED_TEST(CacheFormats, RefusesBadLayoutsByName) {
  using E = TypeParam;
  const auto& f = layout_of<E>();
  const bool m1 = std::is_same<E, model1_fp8_t>::value;
  const i64 d = f.dim, P = 4;
  Pool<E> raw(3, P, 656);
  std::vector<float> q(static_cast<std::size_t>(2 * d), 1.0f),
      out(static_cast<std::size_t>(2 * 512), -7.0f), lse(2, -7.0f);
  dsv4::SparseAttentionParams p;
  p.heads = 2;
  p.dim = d;
  p.dim_v = 512;
  p.window = 4;
  const dsv4::LatentRows<E> good{raw.bytes.data(), 0, 12, 656, 1.0f, m1 ? P : 0, raw.block};
  const dsv4::LatentRows<E> none{};
  auto run = [&](const dsv4::SparseAttentionParams& pp, const dsv4::LatentRows<E>& rr) {
    return error_of([&] {
      dsv4::sparse_attention<E>(pp, q.data(), rr, none, nullptr, 0, 11, 1, out.data(), lse.data());
    });
  };
  EXPECT_EQ(run(p, good), "");
  std::fill(out.begin(), out.end(), -7.0f);
  std::fill(lse.begin(), lse.end(), -7.0f);
  auto bad = p;
  bad.dim = d - 8;
  bad.dim_v = 400;
  EXPECT_NE(run(bad, good).find("params.dim = " + std::to_string(d - 8)), std::string::npos);
  auto r = good;
  if (m1) {
    r.page_size = 0;
    EXPECT_NE(run(p, r).find("raw.page_size = 0"), std::string::npos) << run(p, r);
    r = good;
    r.page_stride = P * 584 - 2;
    EXPECT_NE(run(p, r).find("raw.page_stride = " + std::to_string(P * 584 - 2)),
              std::string::npos);
  } else {
    r.stride = 650;
    EXPECT_NE(run(p, r).find("raw.stride = 650"), std::string::npos) << run(p, r);
    r = good;
    r.page_size = 2;
    r.page_stride = 1000;
    EXPECT_NE(run(p, r).find("raw.page_stride = 1000"), std::string::npos);
  }
  r = good;
  r.page_size = -1;
  EXPECT_NE(run(p, r).find("raw.page_size = -1"), std::string::npos);
  for (float x : out) ASSERT_EQ(x, -7.0f);
  for (float x : lse) ASSERT_EQ(x, -7.0f);
  // the writers: a pool with blocks too small
  auto pool = raw.pool();
  pool.key_page_stride = m1 ? P * 584 - 1 : P * 656 - 4;
  const std::vector<float> rows(static_cast<std::size_t>(d), 1.0f);
  const std::vector<std::int32_t> table = {0};
  const i64 t0 = 0;
  dsv4::PagedLatentAppendArgs<float, E> a;
  a.batch = 1;
  a.rows = rows.data();
  a.tokens = &t0;
  a.pool = pool;
  a.table = phasekv::dense_block_table(table.data(), 1, 1);
  const auto before = raw.bytes;
  const std::string msg = error_of([&] { dsv4::append_latent_paged(d, a); });
  EXPECT_NE(msg.find("args.pool.key_page_stride = " + std::to_string(pool.key_page_stride)),
            std::string::npos)
      << msg;
  a.pool = raw.pool();
  EXPECT_NE(
      error_of([&] { dsv4::append_latent_paged(d + 1, a); }).find("dim = " + std::to_string(d + 1)),
      std::string::npos);
  for (std::size_t i = 0; i < before.size(); ++i) ASSERT_EQ(raw.bytes[i].bits, before[i].bits);
}

}  // namespace

namespace {

// Relative error of the attention output over rows stored in E (written by append_latent_paged)
// against float64 over the unquantized rows, V4 decode shape: 64 heads, a 128-row window,
// 128 index slots (a fifth -1); ||out - ref|| / ||ref|| over all heads' outputs.
template <class E>
double stored_error(i64 d, float scale, std::uint32_t seed, bool spread) {
  const i64 H = 64, n = 1024, J = 256, k = 128, P = 64;
  const auto xr = spread ? spread_rows(n, d, seed)
                         : dsv4t::random_values<float>(static_cast<std::size_t>(n * d), seed);
  const auto xe = spread ? spread_rows(J, d, seed + 1)
                         : dsv4t::random_values<float>(static_cast<std::size_t>(J * d), seed + 1);
  const auto q = dsv4t::random_values<float>(static_cast<std::size_t>(H * d), seed + 2, 1.5f);
  std::vector<std::int32_t> idx(static_cast<std::size_t>(k));
  std::mt19937 rng(seed + 3);
  dsv4t::random_index_list(rng, J, k, idx.data());
  dsv4::SparseAttentionParams p;
  p.heads = H;
  p.dim = d;
  p.dim_v = 512;
  p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  auto store = [&](const std::vector<float>& x, i64 rows, std::vector<E>& bytes) {
    i64 tb = d;
    if constexpr (dsv4::CacheFormat<E>::quantized) tb = dsv4::CacheFormat<E>::token_bytes;
    const i64 block = std::is_same<E, model1_fp8_t>::value ? dsv4::model1_block_bytes(P) : P * tb;
    const i64 pages = (rows + P - 1) / P;
    bytes.assign(static_cast<std::size_t>(pages * block), E{});
    auto pool = phasekv::make_page_pool<E>(bytes.data(), bytes.data(), pages, P, 1, tb, tb);
    pool.key_page_stride = block;
    std::vector<std::int32_t> table(static_cast<std::size_t>(pages));
    std::iota(table.begin(), table.end(), 0);
    const i64 zero = 0;
    const std::vector<std::int32_t> ip = {0, static_cast<std::int32_t>(rows)};
    dsv4::PagedLatentAppendArgs<float, E> a;
    a.batch = 1;
    a.rows = x.data();
    a.chunk_indptr = ip.data();
    a.tokens = &zero;
    a.pool = pool;
    a.table = phasekv::dense_block_table(table.data(), 1, pages);
    a.scale = scale;
    dsv4::append_latent_paged(d, a);
    return dsv4::LatentRows<E>{bytes.data(), 0, rows, tb, scale, P, block};
  };
  std::vector<E> rb, eb;
  const auto rr = store(xr, n, rb);
  const auto er = store(xe, J, eb);
  std::vector<float> out(static_cast<std::size_t>(H * 512)), lse(static_cast<std::size_t>(H));
  dsv4::sparse_attention<E>(p, q.data(), rr, er, idx.data(), k, n - 1, 1, out.data(), lse.data());
  std::vector<double> ro(out.size()), rl(lse.size());
  const dsv4::LatentRows<float> fr{xr.data(), 0, n, d, 1.0f}, fe{xe.data(), 0, J, d, 1.0f};
  dsv4t::reference<float>(p, q.data(), fr, fe, idx.data(), k, n - 1, ro.data(), rl.data());
  double err = 0, mag = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    err += (out[i] - ro[i]) * (out[i] - ro[i]);
    mag += ro[i] * ro[i];
  }
  const double worst = std::sqrt(err / mag);
  return worst;
}

// The FP8 cache formats against bf16 rows and per-tensor FP8 (RoPE channels quantized too), at
// the V4 decode shape, rows and queries N(0, 1) and N(0, 1.5^2): the norm-wise relative error of
// all outputs, ||out - ref|| / ||ref|| (printed for docs/deepseek_v4.md; the bounds are loose
// ceilings).
TEST(CacheFormatError, AgainstUnquantizedRows) {
  for (const bool spread : {false, true}) {
    double bf16 = 0, m1 = 0, v32 = 0, tensor = 0;
    const float ts = spread ? 16.0f / 448 : 5.0f / 448;  // per-tensor FP8: the largest value
    for (std::uint32_t s = 0; s < 3; ++s) {
      const std::uint32_t seed = 100 + 10 * s;
      bf16 = std::max(bf16, stored_error<phasekv::bf16_t>(512, 1.0f, seed, spread));
      tensor = std::max(tensor, stored_error<phasekv::fp8_e4m3_t>(512, ts, seed, spread));
      m1 = std::max(m1, stored_error<model1_fp8_t>(512, 1.0f, seed, spread));
      v32 = std::max(v32, stored_error<v32_fp8_t>(576, 1.0f, seed, spread));
    }
    std::printf(
        "%s rows: ||out - ref|| / ||ref|| (max of 3 seeds): bf16 %.2e, MODEL1 %.2e, "
        "V3.2 %.2e, per-tensor FP8 %.2e\n",
        spread ? "tile-spread" : "N(0, 1)", bf16, m1, v32, tensor);
    EXPECT_LT(bf16, 1e-2);
    EXPECT_LT(m1, 2e-1);
    EXPECT_LT(v32, 2e-1);
    EXPECT_GT(m1, bf16);  // FP8 NoPE errs more than bf16 rows
  }
}

}  // namespace
