// Batched streaming compression into entry pages (compress_append_paged): entries bit-equal to
// batch compress() and to CompressorState over random per-sequence chunkings, stored in the
// right page and slot for page sizes 1, 16, 64 (shuffled pages) and every storage type; the
// hook sees (sequence, index) in order; bad tables are refused with nothing written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dsv4_test_util.hpp"
#include "phasekv/dsv4/compressor.hpp"

namespace {

using phasekv::bf16_t;
using phasekv::f16_t;
using phasekv::fp8_e4m3_t;
namespace dsv4 = phasekv::dsv4;

template <class E>
E to_storage(float x) {
  return phasekv::from_float<E>(x);
}
template <>
fp8_e4m3_t to_storage<fp8_e4m3_t>(float x) {
  return phasekv::float_to_fp8_e4m3(x);
}
template <class E>
bool same_bits(const E& a, const E& b) {
  return std::memcmp(&a, &b, sizeof(E)) == 0;
}

struct Shape {
  std::int64_t ratio, coff, dim;
};

template <class T, class E>
void run_case(const Shape& sh, std::int64_t page_size, std::uint32_t seed) {
  const std::vector<std::int64_t> lengths = {0, 1, 7, 61, 33};  // tokens per sequence in all
  const std::int64_t B = static_cast<std::int64_t>(lengths.size()), d = sh.dim;
  const std::int64_t rw = sh.coff * d;
  const bool fp8 = std::is_same<E, fp8_e4m3_t>::value;
  const float escale = fp8 ? 0.02f : 1.0f;
  const auto ape = dsv4t::random_values<float>(static_cast<std::size_t>(sh.ratio * rw), seed, 0.5f);
  dsv4::CompressorParams cp{sh.ratio, sh.coff, d, ape.data()};
  std::vector<std::vector<T>> kv, score;
  for (std::int64_t b = 0; b < B; ++b) {
    const auto n = static_cast<std::size_t>(lengths[static_cast<std::size_t>(b)] * rw);
    kv.push_back(dsv4t::random_values<T>(n, seed + 10 + static_cast<std::uint32_t>(b)));
    score.push_back(dsv4t::random_values<T>(n, seed + 20 + static_cast<std::uint32_t>(b), 1.5f));
  }
  // expected entries: batch compress(), with the same hook
  const auto hook_math = [](const dsv4::EntryInfo& info, float* e) {
    e[0] += static_cast<float>(info.index);  // the stored entry is what the hook left
  };
  std::vector<std::vector<float>> want(static_cast<std::size_t>(B));
  for (std::int64_t b = 0; b < B; ++b) {
    const std::size_t sb = static_cast<std::size_t>(b);
    want[sb].assign(static_cast<std::size_t>(cp.entries(lengths[sb]) * d), 0.0f);
    if (!want[sb].empty())
      dsv4::compress<T>(cp, kv[sb].data(), score[sb].data(), lengths[sb], want[sb].data(),
                        hook_math);
  }
  // pages: each sequence's page list shuffled over one pool, rows 2 elements wider than d
  std::vector<std::vector<std::int32_t>> lists(static_cast<std::size_t>(B));
  std::int64_t pool_pages = 0;
  for (std::int64_t b = 0; b < B; ++b)
    pool_pages += (cp.entries(lengths[static_cast<std::size_t>(b)]) + page_size - 1) / page_size;
  std::vector<std::int32_t> order(static_cast<std::size_t>(pool_pages));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int32_t>(i);
  std::mt19937 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<std::int32_t> indptr{0}, indices;
  for (std::int64_t b = 0, next = 0; b < B; ++b) {
    const std::int64_t np =
        (cp.entries(lengths[static_cast<std::size_t>(b)]) + page_size - 1) / page_size;
    for (std::int64_t i = 0; i < np; ++i)
      indices.push_back(order[static_cast<std::size_t>(next++)]);
    indptr.push_back(static_cast<std::int32_t>(indices.size()));
  }
  const std::int64_t row = d + 2;
  const E poison = to_storage<E>(std::numeric_limits<float>::quiet_NaN());
  std::vector<E> pool(
      static_cast<std::size_t>(std::max<std::int64_t>(pool_pages, 1) * page_size * row), poison);
  dsv4::PagedCompressArgs<T, E> a;
  a.batch = B;
  a.entry_pool =
      phasekv::make_page_pool<E>(pool.data(), pool.data(), pool_pages, page_size, 1, row, row);
  a.entry_table = phasekv::csr_block_table(indptr.data(), indices.data(), B);
  a.entry_scale = escale;
  std::vector<std::int64_t> tokens(static_cast<std::size_t>(B), 0);
  std::vector<T> state(static_cast<std::size_t>(B * dsv4::compressor_state_elements(cp)),
                       phasekv::from_float<T>(std::numeric_limits<float>::quiet_NaN()));
  a.tokens = tokens.data();
  a.state = state.data();
  // CompressorState per sequence, fed the same chunks
  std::vector<dsv4::CompressorState<T>> states(static_cast<std::size_t>(B),
                                               dsv4::CompressorState<T>(cp));
  std::vector<std::vector<float>> single(static_cast<std::size_t>(B));
  std::vector<std::vector<float>> hooked(static_cast<std::size_t>(B));
  std::vector<std::pair<std::int64_t, std::int64_t>> seen;  // (sequence, index) in hook order
  std::uniform_int_distribution<int> pick(0, 9);
  for (int step = 0; step < 200; ++step) {
    bool more = false;
    std::vector<std::int32_t> cind{0};
    std::vector<T> ckv, cscore;
    for (std::int64_t b = 0; b < B; ++b) {
      const std::size_t sb = static_cast<std::size_t>(b);
      const std::int64_t left = lengths[sb] - tokens[sb];
      const int r = pick(rng);
      std::int64_t c = r < 3 ? 0 : r < 7 ? 1 : r < 9 ? 3 : 13;  // decode-like and chunks
      c = std::min(c, left);
      ckv.insert(ckv.end(), kv[sb].begin() + tokens[sb] * rw,
                 kv[sb].begin() + (tokens[sb] + c) * rw);
      cscore.insert(cscore.end(), score[sb].begin() + tokens[sb] * rw,
                    score[sb].begin() + (tokens[sb] + c) * rw);
      cind.push_back(cind.back() + static_cast<std::int32_t>(c));
      const std::int64_t k = states[sb].entries_after(c);
      std::vector<float> o(static_cast<std::size_t>(k * d));
      states[sb].append(kv[sb].data() + tokens[sb] * rw, score[sb].data() + tokens[sb] * rw, c,
                        o.data(), hook_math);
      single[sb].insert(single[sb].end(), o.begin(), o.end());
      more = more || left > c;
    }
    a.kv = ckv.data();
    a.score = cscore.data();
    a.chunk_indptr = cind.data();
    dsv4::compress_append_paged<T, E>(cp, a, [&](const dsv4::EntryInfo& info, float* e) {
      hook_math(info, e);
      seen.emplace_back(info.sequence, info.index);
      auto& h = hooked[static_cast<std::size_t>(info.sequence)];
      ASSERT_EQ(static_cast<std::int64_t>(h.size()), info.index * d);
      h.insert(h.end(), e, e + d);
    });
    if (!more) break;
  }
  for (std::int64_t b = 0; b < B; ++b) {
    const std::size_t sb = static_cast<std::size_t>(b);
    ASSERT_EQ(tokens[sb], lengths[sb]);
    const std::string what = "sequence " + std::to_string(b) + " P " + std::to_string(page_size);
    ASSERT_EQ(hooked[sb].size(), want[sb].size()) << what;
    ASSERT_EQ(single[sb].size(), want[sb].size()) << what;
    if (want[sb].empty()) continue;
    ASSERT_EQ(std::memcmp(hooked[sb].data(), want[sb].data(), want[sb].size() * sizeof(float)), 0)
        << what << ": paged entries differ from compress()";
    ASSERT_EQ(std::memcmp(single[sb].data(), want[sb].data(), want[sb].size() * sizeof(float)), 0)
        << what << ": CompressorState differs from compress()";
    for (std::int64_t j = 0; j < cp.entries(lengths[sb]); ++j) {
      const std::int64_t page = indices[static_cast<std::size_t>(indptr[sb] + j / page_size)];
      const E* r = pool.data() + (page * page_size + j % page_size) * row;
      for (std::int64_t c = 0; c < d; ++c)
        ASSERT_TRUE(
            same_bits(r[c], to_storage<E>(want[sb][static_cast<std::size_t>(j * d + c)] / escale)))
            << what << " entry " << j << " channel " << c;
      for (std::int64_t c = d; c < row; ++c) ASSERT_TRUE(same_bits(r[c], poison));
    }
  }
  // hook order: sequences in order within a call, entries in order within a sequence
  std::vector<std::int64_t> last(static_cast<std::size_t>(B), -1);
  for (const auto& [b, j] : seen) {
    EXPECT_EQ(j, last[static_cast<std::size_t>(b)] + 1);
    last[static_cast<std::size_t>(b)] = j;
  }
  // the float64 reference (hook added index to channel 0)
  for (std::int64_t b = 0; b < B; ++b) {
    const std::size_t sb = static_cast<std::size_t>(b);
    const auto ref =
        dsv4t::reference_compress<T>(sh.ratio, sh.coff, d, ape, kv[sb], score[sb], lengths[sb]);
    for (std::size_t i = 0; i < ref.size(); ++i) {
      const double hook_add = i % static_cast<std::size_t>(d) == 0
                                  ? static_cast<double>(i / static_cast<std::size_t>(d))
                                  : 0.0;
      ASSERT_NEAR(hooked[sb][i], ref[i] + hook_add, 2e-5 * (1.0 + std::abs(ref[i] + hook_add)));
    }
  }
}

TEST(PagedCompressor, EqualsBatchAndSingleSequenceStreaming) {
  std::uint32_t seed = 10;
  for (const Shape& sh : {Shape{4, 2, 24}, Shape{8, 1, 17}, Shape{3, 2, 33}}) {
    for (std::int64_t P : {1, 16, 64}) {
      run_case<float, float>(sh, P, seed += 100);
      run_case<bf16_t, bf16_t>(sh, P, seed += 100);
      run_case<bf16_t, fp8_e4m3_t>(sh, P, seed += 100);
      run_case<f16_t, f16_t>(sh, P, seed += 100);
    }
  }
}

TEST(PagedCompressor, ModelWidthFewTokens) { run_case<bf16_t, bf16_t>(Shape{4, 2, 512}, 16, 77); }

template <class F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const phasekv::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(PagedCompressor, RefusesBadTablesAndWritesNothing) {
  const std::int64_t S = 4, d = 8, rw = 2 * d, B = 3, P = 2;
  const auto ape = dsv4t::random_values<float>(static_cast<std::size_t>(S * rw), 1);
  dsv4::CompressorParams cp{S, 2, d, ape.data()};
  // sequences at 3, 6 and 0 tokens append 2, 3 and 9: entries 1, 2 and 2 complete
  std::vector<std::int64_t> tokens = {3, 6, 0};
  std::vector<std::int32_t> cind = {0, 2, 5, 14};
  const auto kv = dsv4t::random_values<float>(static_cast<std::size_t>(14 * rw), 2);
  const auto score = dsv4t::random_values<float>(kv.size(), 3);
  std::vector<float> state(static_cast<std::size_t>(B * dsv4::compressor_state_elements(cp)),
                           -5.0f);
  std::vector<float> pool(static_cast<std::size_t>(6 * P * d), -7.0f);
  // pages needed: sequence 0: 1 entry -> 1 page; 1: 2 -> 1; 2: 2 -> 1
  const auto run = [&](std::vector<std::int32_t> indptr, std::vector<std::int32_t> indices) {
    return error_of([&] {
      dsv4::PagedCompressArgs<float, float> a;
      a.batch = B;
      a.kv = kv.data();
      a.score = score.data();
      a.chunk_indptr = cind.data();
      a.tokens = tokens.data();
      a.state = state.data();
      a.entry_pool = dsv4::latent_page_pool(pool.data(), 6, P, d);
      a.entry_table = phasekv::csr_block_table(indptr.data(), indices.data(), B);
      dsv4::compress_append_paged<float, float>(cp, a);
    });
  };
  std::string e = run({0, 1, 2, 3}, {0, 1, 6});
  EXPECT_NE(e.find("entry_table sequence 2 index 0 = 6"), std::string::npos) << e;
  e = run({0, 1, 1, 2}, {0, 2});
  EXPECT_NE(e.find("entry_table pages of sequence 1 = 0"), std::string::npos) << e;
  EXPECT_NE(e.find("needs 1 pages (2 rows)"), std::string::npos) << e;
  cind[2] = 1;  // chunk_indptr decreasing at sequence 1
  e = run({0, 1, 2, 3}, {0, 1, 2});
  EXPECT_NE(e.find("args.chunk_indptr[2] = 1"), std::string::npos) << e;
  cind[2] = 5;
  for (float x : pool) ASSERT_EQ(x, -7.0f);
  for (float x : state) ASSERT_EQ(x, -5.0f);
  EXPECT_EQ(tokens, (std::vector<std::int64_t>{3, 6, 0}));
  // and the good table writes what the sequences complete
  EXPECT_EQ(run({0, 1, 2, 3}, {0, 1, 2}), "");
  EXPECT_EQ(tokens, (std::vector<std::int64_t>{5, 9, 9}));
}

}  // namespace
