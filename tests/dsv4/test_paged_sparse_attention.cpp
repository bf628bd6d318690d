// Paged sparse attention (decode and ragged prefill over page pools and block tables) against
// the contiguous sparse_attention per sequence (bit for bit) and a float64 reference, for every
// storage type, page sizes 1, 16, 64 with shuffled pages, CSR and dense tables, a raw ring; and
// its refusals of bad tables with nothing written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "dsv4_attention_ref.hpp"
#include "dsv4_test_util.hpp"
#include "phasekv/attention/cpu/dispatch.hpp"
#include "phasekv/dsv4/sparse_attention.hpp"

namespace {

using phasekv::bf16_t;
using phasekv::f16_t;
using phasekv::fp8_e4m3_t;
namespace dsv4 = phasekv::dsv4;
using dsv4t::random_rows;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A pool of pages `pad` elements wider than dim (rows at a stride > dim), filled page by page
// from the sequences' contiguous rows in a shuffled page order; table(b) lists sequence b's pages.
// With ring > 0, slot s of a sequence holds the row of the latest position p < n with
// p mod ring = s.
template <class T>
struct Paged {
  std::vector<T> data;
  std::vector<std::vector<std::int32_t>> pages;  // per sequence
  std::int64_t page_size = 1, pool_pages = 0, row = 0;

  Paged(const std::vector<std::vector<T>>& seqs, std::int64_t dim, std::int64_t P,
        std::uint32_t seed, std::int64_t ring = 0, std::int64_t pad = 3)
      : page_size(P), row(dim + pad) {
    std::vector<std::int64_t> slots;
    for (const auto& s : seqs) {
      const std::int64_t n = static_cast<std::int64_t>(s.size()) / dim;
      slots.push_back(ring > 0 ? std::min(n, ring) : n);
      pool_pages += (slots.back() + P - 1) / P + 1;  // one spare page per sequence
    }
    std::vector<std::int32_t> order(static_cast<std::size_t>(pool_pages));
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int32_t>(i);
    std::mt19937 rng(seed);
    std::shuffle(order.begin(), order.end(), rng);
    data.assign(static_cast<std::size_t>(pool_pages * P * row), dsv4t::store<T>(kNaN));
    std::size_t next = 0;
    for (std::size_t b = 0; b < seqs.size(); ++b) {
      std::vector<std::int32_t> list;
      for (std::int64_t i = 0; i < (slots[b] + P - 1) / P; ++i) list.push_back(order[next++]);
      ++next;  // the spare page stays unused (NaN)
      const std::int64_t n = static_cast<std::int64_t>(seqs[b].size()) / dim;
      for (std::int64_t p = std::max<std::int64_t>(0, n - slots[b]); p < n; ++p) {
        const std::int64_t s = ring > 0 ? p % ring : p;
        T* dst = data.data() + (list[static_cast<std::size_t>(s / P)] * P + s % P) * row;
        std::copy(seqs[b].begin() + p * dim, seqs[b].begin() + (p + 1) * dim, dst);
      }
      pages.push_back(list);
    }
  }
  phasekv::PagePool<const T> pool() const {
    return phasekv::make_page_pool<const T>(data.data(), data.data(), pool_pages, page_size, 1, row,
                                            row);
  }
};

// CSR and dense forms of the page lists (dense rows padded with an out-of-range page that is
// never read).
struct Tables {
  std::vector<std::int32_t> indptr{0}, csr, dense;
  std::int64_t width = 0;
  explicit Tables(const std::vector<std::vector<std::int32_t>>& lists) {
    for (const auto& l : lists) {
      csr.insert(csr.end(), l.begin(), l.end());
      indptr.push_back(static_cast<std::int32_t>(csr.size()));
      width = std::max<std::int64_t>(width, static_cast<std::int64_t>(l.size()));
    }
    for (const auto& l : lists) {
      std::vector<std::int32_t> r = l;
      r.resize(static_cast<std::size_t>(width), 1 << 30);
      dense.insert(dense.end(), r.begin(), r.end());
    }
  }
  phasekv::BlockTable table(bool dense_form, std::int64_t batch) const {
    return dense_form ? phasekv::dense_block_table(dense.data(), batch, width)
                      : phasekv::csr_block_table(indptr.data(), csr.data(), batch);
  }
};

struct Batch {
  std::vector<std::int64_t> lengths, queries;
};

template <class T>
struct Fixture {
  dsv4::SparseAttentionParams p;
  std::int64_t ratio = 4, k = 6;
  bool lists = true;
  Batch batch;
  std::vector<std::vector<T>> raw, ent;
  std::vector<float> q, sinks;
  std::vector<std::int32_t> qo{0}, idx;
  float raw_scale = 1.0f, ent_scale = 1.0f;
  std::int64_t rows = 0;

  void make(std::uint32_t seed) {
    const bool fp8 = std::is_same<T, fp8_e4m3_t>::value;
    raw_scale = fp8 ? 0.0625f : 1.0f;
    ent_scale = fp8 ? 0.03f : 1.0f;
    std::mt19937 rng(seed);
    for (std::size_t b = 0; b < batch.lengths.size(); ++b) {
      const std::int64_t n = batch.lengths[b], J = ratio > 0 ? n / ratio : 0;
      raw.push_back(random_rows<T>(n, p.dim, ++seed, raw_scale));
      ent.push_back(random_rows<T>(J, p.dim, ++seed, ent_scale));
      const std::int64_t qb = batch.queries[b];
      rows += qb;
      qo.push_back(static_cast<std::int32_t>(rows));
      for (std::int64_t i = 0; i < qb; ++i) {  // distinct entries, some -1 padding
        std::vector<std::int32_t> all(static_cast<std::size_t>(J));
        for (std::int64_t j = 0; j < J; ++j) all[static_cast<std::size_t>(j)] = std::int32_t(j);
        std::shuffle(all.begin(), all.end(), rng);
        for (std::int64_t r = 0; r < k; ++r)
          idx.push_back(r < std::min<std::int64_t>(k - (i % 3), J) ? all[std::size_t(r)] : -1);
      }
    }
    q = dsv4t::random_values<float>(static_cast<std::size_t>(rows * p.heads * p.dim), ++seed);
    sinks = dsv4t::random_values<float>(static_cast<std::size_t>(p.heads), ++seed, 2.0f);
    p.sinks = sinks.data();
  }
  std::size_t out_size() const { return static_cast<std::size_t>(rows * p.heads * p.dim_v); }
  std::size_t lse_size() const { return static_cast<std::size_t>(rows * p.heads); }

  // The contiguous kernel (build Arch), per sequence (per query for HCA without lists).
  template <class Arch = phasekv::cpu::arch::Auto>
  void expected(std::vector<float>& out, std::vector<float>& lse) const {
    out.assign(out_size(), kNaN);
    lse.assign(lse_size(), kNaN);
    for (std::size_t b = 0; b < raw.size(); ++b) {
      const std::int64_t n = batch.lengths[b], qb = batch.queries[b], r0 = qo[b];
      const dsv4::LatentRows<T> rr{raw[b].data(), 0, n, p.dim, raw_scale};
      const dsv4::LatentRows<T> er{ent[b].data(), 0, n / std::max<std::int64_t>(ratio, 1), p.dim,
                                   ent_scale};
      if (lists) {
        dsv4::sparse_attention<T, Arch>(
            p, q.data() + r0 * p.heads * p.dim, rr, er, idx.data() + r0 * k, ratio > 0 ? k : 0,
            n - qb, qb, out.data() + r0 * p.heads * p.dim_v, lse.data() + r0 * p.heads);
        continue;
      }
      for (std::int64_t i = 0; i < qb; ++i) {
        const std::int64_t t = n - qb + i, r = r0 + i;
        dsv4::sparse_attention<T, Arch>(p, q.data() + r * p.heads * p.dim, rr, er, nullptr,
                                        (t + 1) / ratio, t, 1, out.data() + r * p.heads * p.dim_v,
                                        lse.data() + r * p.heads);
      }
    }
  }

  dsv4::PagedSparseArgs<T> args(const Paged<T>& rp, const Paged<T>& ep, const Tables& rt,
                                const Tables& et, bool dense, bool decode) const {
    dsv4::PagedSparseArgs<T> a;
    a.q = q.data();
    a.qo_indptr = decode ? nullptr : qo.data();
    a.batch = static_cast<std::int64_t>(raw.size());
    a.lengths = batch.lengths.data();
    a.raw_pool = rp.pool();
    a.raw_table = rt.table(dense, a.batch);
    a.raw_scale = raw_scale;
    a.entry_pool = ep.pool();
    a.entry_table = et.table(dense, a.batch);
    a.entry_scale = ent_scale;
    a.ratio = ratio;
    a.indices = lists ? idx.data() : nullptr;
    a.index_count = lists ? k : 0;
    return a;
  }
};

template <class T>
void expect_bits(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(T)), 0) << what;
}

template <class T>
class PagedSparseAttention : public ::testing::Test {};
using Types = ::testing::Types<float, bf16_t, f16_t, fp8_e4m3_t>;
TYPED_TEST_SUITE(PagedSparseAttention, Types);

// Ragged prefill and decode, CSA lists and HCA (every visible entry), page sizes 1, 16, 64 with
// shuffled pages, CSR and dense tables, split by sequences: the contiguous kernel's bits; and
// those bits against the float64 reference.
TYPED_TEST(PagedSparseAttention, EqualsContiguousPerSequence) {
  using T = TypeParam;
  for (int mode = 0; mode < 3; ++mode) {  // 0: CSA prefill, 1: CSA decode, 2: HCA prefill
    Fixture<T> f;
    f.p.heads = 5;
    f.p.dim = 40;
    f.p.dim_v = 33;
    f.p.window = 7;
    f.p.scale = 0.15f;
    f.ratio = mode == 2 ? 8 : 4;
    f.lists = mode != 2;
    f.batch.lengths = {1, 7, 30, 97, 12};
    f.batch.queries = mode == 1 ? std::vector<std::int64_t>{1, 1, 1, 1, 1}
                                : std::vector<std::int64_t>{1, 7, 0, 10, 3};
    f.make(100 + static_cast<std::uint32_t>(mode));
    std::vector<float> want_o, want_l;
    f.expected(want_o, want_l);
    // the reference
    for (std::size_t b = 0; b < f.raw.size(); ++b) {
      const std::int64_t n = f.batch.lengths[b], qb = f.batch.queries[b];
      const dsv4::LatentRows<T> rr{f.raw[b].data(), 0, n, f.p.dim, f.raw_scale};
      const dsv4::LatentRows<T> er{f.ent[b].data(), 0, n / f.ratio, f.p.dim, f.ent_scale};
      for (std::int64_t i = 0; i < qb; ++i) {
        const std::int64_t r = f.qo[b] + i, t = n - qb + i;
        std::vector<double> ro(static_cast<std::size_t>(f.p.heads * f.p.dim_v)),
            rl(static_cast<std::size_t>(f.p.heads));
        dsv4t::reference<T>(f.p, f.q.data() + r * f.p.heads * f.p.dim, rr, er,
                            f.lists ? f.idx.data() + r * f.k : nullptr,
                            f.lists ? f.k : (t + 1) / f.ratio, t, ro.data(), rl.data());
        for (std::int64_t x = 0; x < f.p.heads * f.p.dim_v; ++x) {
          const double o = want_o[static_cast<std::size_t>(r * f.p.heads * f.p.dim_v + x)];
          ASSERT_NEAR(o, ro[static_cast<std::size_t>(x)], 2e-5) << "mode " << mode << " row " << r;
        }
        for (std::int64_t h = 0; h < f.p.heads; ++h)
          ASSERT_NEAR(want_l[static_cast<std::size_t>(r * f.p.heads + h)],
                      rl[static_cast<std::size_t>(h)], 2e-5 * std::max(1.0, std::abs(rl[h])));
      }
    }
    std::uint32_t seed = 7;
    for (std::int64_t P : {1, 16, 64}) {
      const Paged<T> rp(f.raw, f.p.dim, P, ++seed), ep(f.ent, f.p.dim, P, ++seed);
      const Tables rt(rp.pages), et(ep.pages);
      for (bool dense : {false, true}) {
        const auto a = f.args(rp, ep, rt, et, dense, mode == 1);
        std::vector<float> o(f.out_size(), kNaN), l(f.lse_size(), kNaN);
        auto aa = a;
        aa.out = o.data();
        aa.lse = l.data();
        dsv4::paged_sparse_attention<T>(f.p, aa);
        const std::string what = "mode " + std::to_string(mode) + " P " + std::to_string(P) +
                                 (dense ? " dense" : " csr");
        expect_bits(o, want_o, what);
        expect_bits(l, want_l, what);
        // split by sequences: [0, 2), [2, 3), [3, B)
        std::vector<float> o2(f.out_size(), kNaN), l2(f.lse_size(), kNaN);
        aa.out = o2.data();
        aa.lse = l2.data();
        for (auto [s0, s1] : {std::pair<std::int64_t, std::int64_t>{0, 2}, {2, 3}, {3, 5}})
          dsv4::paged_sparse_attention<T>(f.p, aa, s0, s1);
        expect_bits(o2, want_o, what + " split");
        expect_bits(l2, want_l, what + " split");
      }
    }
  }
}

// A raw ring of R slots (slot p mod R) gives the bits of every raw row kept.
// Every build this CPU runs (explicit tags): paged decode and prefill (CSA lists, HCA) give
// the bits of the same build's contiguous kernel, at 64 heads (4-head tiles) and 3 (padded).
TYPED_TEST(PagedSparseAttention, EveryBuildEqualsContiguous) {
  using T = TypeParam;
  namespace arch = phasekv::cpu::arch;
  auto run = [&](auto tag) {
    using A = decltype(tag);
    for (int mode = 0; mode < 3; ++mode) {
      Fixture<T> f;
      f.p.heads = mode == 1 ? 64 : 3;
      f.p.dim = 72;
      f.p.dim_v = 64;
      f.p.window = 9;
      f.p.scale = 0.12f;
      f.ratio = mode == 2 ? 8 : 4;
      f.lists = mode != 2;
      f.batch.lengths = {5, 40, 97};
      f.batch.queries =
          mode == 1 ? std::vector<std::int64_t>{1, 1, 1} : std::vector<std::int64_t>{2, 0, 19};
      f.make(300 + static_cast<std::uint32_t>(mode));
      std::vector<float> want_o, want_l;
      f.template expected<A>(want_o, want_l);
      const Paged<T> rp(f.raw, f.p.dim, 16, 11), ep(f.ent, f.p.dim, 16, 12);
      const Tables rt(rp.pages), et(ep.pages);
      auto aa = f.args(rp, ep, rt, et, false, mode == 1);
      std::vector<float> o(f.out_size(), kNaN), l(f.lse_size(), kNaN);
      aa.out = o.data();
      aa.lse = l.data();
      dsv4::paged_sparse_attention<T, A>(f.p, aa);
      const std::string what = std::string(A::name) + " mode " + std::to_string(mode);
      expect_bits(o, want_o, what);
      expect_bits(l, want_l, what);
    }
  };
  run(arch::Scalar{});
#if PHASEKV_HAS_AVX2
  if (phasekv::cpu::cpu_supports<arch::Avx2>()) run(arch::Avx2{});
#endif
#if PHASEKV_HAS_AVX512
  if (phasekv::cpu::cpu_supports<arch::Avx512>()) run(arch::Avx512{});
#endif
#if PHASEKV_FLAGS_NEON
  run(arch::Neon{});
#endif
}

TEST(PagedSparseAttention, RawRingEqualsEveryRawRow) {
  Fixture<bf16_t> f;
  f.p.heads = 3;
  f.p.dim = f.p.dim_v = 24;
  f.p.window = 6;
  f.batch.lengths = {50, 9, 23};
  f.batch.queries = {4, 9, 1};
  f.make(300);
  std::vector<float> want_o, want_l;
  f.expected(want_o, want_l);
  const std::int64_t ring = f.p.window + 9 - 1;
  const Paged<bf16_t> rp(f.raw, f.p.dim, 4, 301, ring), ep(f.ent, f.p.dim, 4, 302);
  const Tables rt(rp.pages), et(ep.pages);
  auto a = f.args(rp, ep, rt, et, false, false);
  a.raw_ring = ring;
  std::vector<float> o(f.out_size(), kNaN), l(f.lse_size(), kNaN);
  a.out = o.data();
  a.lse = l.data();
  dsv4::paged_sparse_attention<bf16_t>(f.p, a);
  expect_bits(o, want_o, "ring");
  expect_bits(l, want_l, "ring");
  a.raw_ring = ring - 1;  // too small for the 9 queries of sequence 1
  EXPECT_THROW(dsv4::paged_sparse_attention<bf16_t>(f.p, a), phasekv::invalid_argument);
}

// One case at the model's widths: 576-wide rows (value = first 512), 16 heads, few tokens.
TEST(PagedSparseAttention, WideRows) {
  Fixture<bf16_t> f;
  f.p.heads = 16;
  f.p.dim = 576;
  f.p.dim_v = 512;
  f.p.window = 8;
  f.p.scale = 1.0f / 24.0f;
  f.k = 4;
  f.batch.lengths = {20, 9};
  f.batch.queries = {3, 1};
  f.make(400);
  std::vector<float> want_o, want_l;
  f.expected(want_o, want_l);
  const Paged<bf16_t> rp(f.raw, f.p.dim, 16, 401, 0, 0), ep(f.ent, f.p.dim, 16, 402, 0, 0);
  const Tables rt(rp.pages), et(ep.pages);
  auto a = f.args(rp, ep, rt, et, true, false);
  std::vector<float> o(f.out_size(), kNaN), l(f.lse_size(), kNaN);
  a.out = o.data();
  a.lse = l.data();
  dsv4::paged_sparse_attention<bf16_t>(f.p, a);
  expect_bits(o, want_o, "d 576");
  expect_bits(l, want_l, "d 576");
}

template <class F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const phasekv::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(PagedSparseAttention, RefusesBadTablesAndWritesNothing) {
  Fixture<float> f;
  f.p.heads = 2;
  f.p.dim = f.p.dim_v = 8;
  f.p.window = 4;
  f.batch.lengths = {9, 20, 13};
  f.batch.queries = {1, 2, 1};
  f.make(500);
  const Paged<float> rp(f.raw, f.p.dim, 4, 501), ep(f.ent, f.p.dim, 2, 502);
  std::vector<float> o(f.out_size(), -7.0f), l(f.lse_size(), -7.0f);
  const auto run = [&](const Tables& rt, const Tables& et, bool dense,
                       const std::vector<std::int32_t>* idx = nullptr) {
    return error_of([&] {
      auto a = f.args(rp, ep, rt, et, dense, false);
      if (idx) a.indices = idx->data();
      a.out = o.data();
      a.lse = l.data();
      dsv4::paged_sparse_attention<float>(f.p, a);
    });
  };
  {  // a raw page index out of range: sequence 1, index 2
    auto lists = rp.pages;
    lists[1][2] = static_cast<std::int32_t>(rp.pool_pages);
    const std::string e = run(Tables(lists), Tables(ep.pages), false);
    EXPECT_NE(e.find("raw_table sequence 1 index 2"), std::string::npos) << e;
    EXPECT_NE(e.find("page index must be in [0, "), std::string::npos) << e;
  }
  {  // a negative entry page, dense table: sequence 2, index 1
    auto lists = ep.pages;
    lists[2][1] = -3;
    const std::string e = run(Tables(rp.pages), Tables(lists), true);
    EXPECT_NE(e.find("entry_table sequence 2 index 1 = -3"), std::string::npos) << e;
  }
  {  // a table shorter than the length needs: sequence 0 needs 3 raw pages of 4 for 9 rows
    auto lists = rp.pages;
    lists[0].pop_back();
    const std::string e = run(Tables(lists), Tables(ep.pages), false);
    EXPECT_NE(e.find("raw_table pages of sequence 0 = 2"), std::string::npos) << e;
    EXPECT_NE(e.find("needs 3 pages"), std::string::npos) << e;
  }
  {  // an index beyond the sequence's entries: row 2 is sequence 1's second query
    auto idx = f.idx;
    idx[static_cast<std::size_t>(2 * f.k + 1)] = 5;  // sequence 1 has 20 / 4 = 5 entries
    const std::string e = run(Tables(rp.pages), Tables(ep.pages), false, &idx);
    EXPECT_NE(e.find("(sequence 1, query 1) = 5"), std::string::npos) << e;
  }
  for (float x : o) ASSERT_EQ(x, -7.0f);
  for (float x : l) ASSERT_EQ(x, -7.0f);
}

}  // namespace
