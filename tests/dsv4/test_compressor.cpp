// The DeepSeek-V4 compressor against its float64 reference, streaming against batch (bit for
// bit, random chunks), the hook, and the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "dsv4_test_util.hpp"
#include "phasekv/dsv4/compressor.hpp"

namespace {

using phasekv::bf16_t;
using phasekv::f16_t;
namespace dsv4 = phasekv::dsv4;

struct Shape {
  std::int64_t S, coff, d, n;
};

// Awkward sizes: channel blocks with and without a tail, a ratio of 1, the HCA and CSA ratios,
// lengths that end mid-block and shorter than one block. The pooling kernel takes channels in
// register blocks (64 on AVX-512, 16 on AVX2, 16 on NEON, 4 scalar), then single vectors, then
// single channels: d = 83 and 136 between them reach each of those steps on every path.
std::vector<Shape> shapes() {
  return {{4, 2, 40, 37},    {4, 2, 16, 16}, {4, 2, 7, 3},  {3, 2, 33, 50}, {1, 2, 5, 9},
          {128, 1, 24, 300}, {5, 1, 17, 26}, {4, 1, 64, 8}, {4, 2, 83, 21}, {128, 1, 136, 260}};
}

// The entries of tokens [0, n) pooled by the instruction-set build `arch` (the loop of
// compress(), through detail::pool_entry_on instead of the build active_arch() picks).
template <class T>
std::vector<float> compress_on(phasekv::cpu::ArchId arch, const dsv4::CompressorParams& p,
                               const std::vector<T>& kv, const std::vector<T>& score,
                               std::int64_t n) {
  const std::int64_t S = p.ratio, rw = p.row_width(), J = n / S;
  std::vector<float> out(static_cast<std::size_t>(J * p.dim) + 1,
                         std::numeric_limits<float>::quiet_NaN());
  for (std::int64_t j = 0; j < J; ++j) {
    const T* kvb[2] = {nullptr, nullptr};
    const T* sb[2] = {nullptr, nullptr};
    for (std::int64_t h = 0; h < p.coff; ++h) {
      const std::int64_t b = j - p.coff + 1 + h;
      if (b < 0) continue;
      kvb[h] = kv.data() + b * S * rw;
      sb[h] = score.data() + b * S * rw;
    }
    dsv4::detail::pool_entry_on<T>(arch, p, kvb, sb, rw, out.data() + j * p.dim);
  }
  return out;
}

// The builds this binary compiles and this CPU runs.
std::vector<phasekv::cpu::ArchId> runnable_archs() {
  using phasekv::cpu::ArchId;
  std::vector<ArchId> out;
  for (ArchId a : {ArchId::scalar, ArchId::avx2, ArchId::avx512, ArchId::neon})
    if (phasekv::cpu::arch_compiled(a) && phasekv::cpu::arch_supported(a)) out.push_back(a);
  return out;
}

// The bound on |entry - reference|. An entry is sum_i w_i kv_i / sum_i w_i over W = coff * S
// terms, w_i = exp(z_i - m), z_i = score + ape, all in f32 with the exp of Vec (relative error
// below 2e-7, the same polynomial on every build). Each w_i is off by a relative 2e-7 plus the
// roundings of z_i and z_i - m; the two sums add about one rounding (6e-8) per term each: a few
// ulp per term relative to the largest |kv| (the inputs are exact in T), as below.
double tolerance(const Shape& s, double kv_max) {
  return 4e-7 * static_cast<double>(s.coff * s.S + 8) * kv_max;
}

template <class T>
class Compressor : public ::testing::Test {};
using Types = ::testing::Types<float, bf16_t, f16_t>;
TYPED_TEST_SUITE(Compressor, Types);

std::string name(const Shape& s) {
  return "S" + std::to_string(s.S) + " coff" + std::to_string(s.coff) + " d" + std::to_string(s.d) +
         " n" + std::to_string(s.n);
}

TYPED_TEST(Compressor, BatchMatchesReference) {
  using T = TypeParam;
  std::uint32_t seed = 100;
  for (const Shape& s : shapes()) {
    const std::int64_t rw = s.coff * s.d;
    const auto kv = dsv4t::random_values<T>(static_cast<std::size_t>(s.n * rw), ++seed);
    const auto score = dsv4t::random_values<T>(static_cast<std::size_t>(s.n * rw), ++seed, 2.0f);
    const auto ape = dsv4t::random_values<float>(static_cast<std::size_t>(s.S * rw), ++seed);
    dsv4::CompressorParams p{s.S, s.coff, s.d, ape.data()};
    const std::int64_t J = s.n / s.S;
    std::vector<float> out(static_cast<std::size_t>(J * s.d) + 1,
                           std::numeric_limits<float>::quiet_NaN());
    dsv4::compress<T>(p, kv.data(), score.data(), s.n, out.data());
    EXPECT_TRUE(std::isnan(out.back())) << "wrote past the entries " << name(s);
    const auto ref = dsv4t::reference_compress<T>(s.S, s.coff, s.d, ape, kv, score, s.n);
    double kv_max = 0.0;
    for (const T& x : kv) kv_max = std::max(kv_max, std::abs(dsv4t::val(x)));
    const double tol = tolerance(s, kv_max);
    for (std::int64_t i = 0; i < J * s.d; ++i) {
      ASSERT_TRUE(std::isfinite(out[static_cast<std::size_t>(i)])) << name(s) << " i " << i;
      ASSERT_NEAR(out[static_cast<std::size_t>(i)], ref[static_cast<std::size_t>(i)], tol)
          << name(s) << " entry " << i / s.d << " channel " << i % s.d;
    }
  }
}

// Every build this binary compiles and this CPU runs (scalar always; AVX2, AVX-512 or NEON
// where present) against the reference, outputs poisoned first; the build compress() runs gives
// its bits exactly.
TYPED_TEST(Compressor, EveryBuildMatchesReference) {
  using T = TypeParam;
  std::uint32_t seed = 900;
  const auto archs = runnable_archs();
  ASSERT_FALSE(archs.empty());
  for (const Shape& s : shapes()) {
    const std::int64_t rw = s.coff * s.d, J = s.n / s.S;
    const auto kv = dsv4t::random_values<T>(static_cast<std::size_t>(s.n * rw), ++seed);
    const auto score = dsv4t::random_values<T>(static_cast<std::size_t>(s.n * rw), ++seed, 2.0f);
    const auto ape = dsv4t::random_values<float>(static_cast<std::size_t>(s.S * rw), ++seed);
    dsv4::CompressorParams p{s.S, s.coff, s.d, ape.data()};
    const auto ref = dsv4t::reference_compress<T>(s.S, s.coff, s.d, ape, kv, score, s.n);
    double kv_max = 0.0;
    for (const T& x : kv) kv_max = std::max(kv_max, std::abs(dsv4t::val(x)));
    const double tol = tolerance(s, kv_max);
    std::vector<float> native(static_cast<std::size_t>(J * s.d) + 1,
                              std::numeric_limits<float>::quiet_NaN());
    dsv4::compress<T>(p, kv.data(), score.data(), s.n, native.data());
    for (phasekv::cpu::ArchId a : archs) {
      const auto out = compress_on<T>(a, p, kv, score, s.n);
      EXPECT_TRUE(std::isnan(out.back())) << "wrote past the entries " << name(s);
      for (std::int64_t i = 0; i < J * s.d; ++i) {
        ASSERT_TRUE(std::isfinite(out[static_cast<std::size_t>(i)]))
            << phasekv::cpu::arch_name(a) << " " << name(s) << " i " << i;
        ASSERT_NEAR(out[static_cast<std::size_t>(i)], ref[static_cast<std::size_t>(i)], tol)
            << phasekv::cpu::arch_name(a) << " " << name(s) << " entry " << i / s.d << " channel "
            << i % s.d;
      }
      if (a == phasekv::cpu::active_arch()) {
        EXPECT_EQ(0, std::memcmp(out.data(), native.data(),
                                 static_cast<std::size_t>(J * s.d) * sizeof(float)))
            << phasekv::cpu::arch_name(a) << " " << name(s);
      }
    }
  }
}

// Independent of the reference: with one score far above the rest the entry is that token's
// kv, so each half must read the block and the channels the model assigns it.
TEST(Compressor, OverlapHalvesReadTheirBlocksAndChannels) {
  const std::int64_t S = 4, d = 3, rw = 2 * d, n = 12;
  std::vector<float> kv(static_cast<std::size_t>(n * rw)), score(kv.size(), 0.0f);
  for (std::size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<float>(i);
  std::vector<float> ape(static_cast<std::size_t>(S * rw), 0.0f);
  dsv4::CompressorParams p{S, 2, d, ape.data()};
  // entry 2: block 1 (tokens 4..7) through channels [0, d), block 2 (8..11) through [d, 2d).
  // channel 0: token 5's first half wins; channel 1: token 10's second half; channel 2: ape
  // slot 3 of the first half (token 7).
  score[5 * rw + 0] = 60.0f;
  score[10 * rw + d + 1] = 60.0f;
  ape[3 * rw + 2] = 60.0f;
  std::vector<float> out(static_cast<std::size_t>(3 * d));
  dsv4::compress<float>(p, kv.data(), score.data(), n, out.data());
  EXPECT_FLOAT_EQ(out[2 * d + 0], kv[5 * rw + 0]);
  EXPECT_FLOAT_EQ(out[2 * d + 1], kv[10 * rw + d + 1]);
  EXPECT_FLOAT_EQ(out[2 * d + 2], kv[7 * rw + 2]);
  // entry 0 has no earlier half: with equal scores it is the mean of block 0's second half
  // except where ape slot 3 (first half only) does not reach it.
  for (std::int64_t c = 0; c < d; ++c) {
    double mean = 0.0;
    for (std::int64_t t = 0; t < S; ++t) mean += kv[static_cast<std::size_t>(t * rw + d + c)];
    EXPECT_NEAR(out[static_cast<std::size_t>(c)], mean / S, 1e-4) << c;
  }
}

// Random chunk sizes (0 included), token by token and all at once: the same bits as compress.
TYPED_TEST(Compressor, StreamingEqualsBatchBitForBit) {
  using T = TypeParam;
  std::mt19937 rng(7);
  std::uint32_t seed = 500;
  for (const Shape& s0 : shapes()) {
    Shape s = s0;
    s.n = s0.n * 3 + 5;
    const std::int64_t rw = s.coff * s.d;
    const auto kv = dsv4t::random_values<T>(static_cast<std::size_t>(s.n * rw), ++seed);
    const auto score = dsv4t::random_values<T>(static_cast<std::size_t>(s.n * rw), ++seed, 3.0f);
    const auto ape = dsv4t::random_values<float>(static_cast<std::size_t>(s.S * rw), ++seed);
    dsv4::CompressorParams p{s.S, s.coff, s.d, ape.data()};
    const std::int64_t J = s.n / s.S;
    std::vector<float> batch(static_cast<std::size_t>(J * s.d));
    dsv4::compress<T>(p, kv.data(), score.data(), s.n, batch.data());
    for (int mode = 0; mode < 4; ++mode) {
      dsv4::CompressorState<T> st(p);
      std::vector<float> stream(static_cast<std::size_t>(J * s.d),
                                std::numeric_limits<float>::quiet_NaN());
      std::int64_t pos = 0, got = 0;
      while (pos < s.n) {
        std::int64_t c = 1;
        if (mode == 1) c = s.n;
        if (mode >= 2) {
          const std::int64_t hi = mode == 2 ? 2 * s.coff * s.S + 3 : 3;
          c = std::uniform_int_distribution<std::int64_t>(0, hi)(rng);
        }
        c = std::min(c, s.n - pos);
        const std::int64_t expect = st.entries_after(c);
        const std::int64_t w =
            st.append(kv.data() + pos * rw, score.data() + pos * rw, c, stream.data() + got * s.d);
        ASSERT_EQ(w, expect);
        got += w;
        pos += c;
        ASSERT_EQ(st.tokens(), pos);
        ASSERT_EQ(st.entries(), got);
      }
      ASSERT_EQ(got, J);
      EXPECT_EQ(0, std::memcmp(stream.data(), batch.data(), batch.size() * sizeof(float)))
          << name(s) << " mode " << mode;
    }
  }
}

TEST(Compressor, HookSeesEachEntryOnceInOrderAndMayChangeIt) {
  const std::int64_t S = 4, d = 20, n = 27;
  const auto kv = dsv4t::random_values<float>(static_cast<std::size_t>(n * 2 * d), 1);
  const auto score = dsv4t::random_values<float>(kv.size(), 2);
  const auto ape = dsv4t::random_values<float>(static_cast<std::size_t>(S * 2 * d), 3);
  dsv4::CompressorParams p{S, 2, d, ape.data()};
  std::vector<float> plain(static_cast<std::size_t>(6 * d)), hooked(plain.size()),
      streamed(plain.size());
  dsv4::compress<float>(p, kv.data(), score.data(), n, plain.data());
  std::vector<dsv4::EntryInfo> seen;
  auto hook = [&](const dsv4::EntryInfo& e, float* x) {
    seen.push_back(e);
    for (std::int64_t c = 0; c < d; ++c) x[c] = 2.0f * x[c] + static_cast<float>(e.index);
  };
  dsv4::compress<float>(p, kv.data(), score.data(), n, hooked.data(), hook);
  ASSERT_EQ(seen.size(), 6u);
  for (std::int64_t j = 0; j < 6; ++j) {
    const dsv4::EntryInfo& e = seen[static_cast<std::size_t>(j)];
    EXPECT_EQ(e.index, j);
    EXPECT_EQ(e.position, j * S);
    EXPECT_EQ(e.first, std::max<std::int64_t>(0, (j - 1) * S));
    EXPECT_EQ(e.last, (j + 1) * S - 1);
    for (std::int64_t c = 0; c < d; ++c) {
      const std::size_t i = static_cast<std::size_t>(j * d + c);
      EXPECT_EQ(hooked[i], 2.0f * plain[i] + static_cast<float>(j));
    }
  }
  seen.clear();
  dsv4::CompressorState<float> st(p);
  std::int64_t got = 0;
  for (std::int64_t pos = 0; pos < n; pos += 5) {
    const std::int64_t c = std::min<std::int64_t>(5, n - pos);
    got += st.append(kv.data() + pos * 2 * d, score.data() + pos * 2 * d, c,
                     streamed.data() + got * d, hook);
  }
  EXPECT_EQ(0, std::memcmp(streamed.data(), hooked.data(), hooked.size() * sizeof(float)));
  ASSERT_EQ(seen.size(), 6u);
  for (std::int64_t j = 0; j < 6; ++j) EXPECT_EQ(seen[static_cast<std::size_t>(j)].index, j);
}

// A range of entries (one thread's share) writes only those rows, with the same bits.
TEST(Compressor, EntryRangeWritesOnlyItsRows) {
  const std::int64_t S = 4, d = 24, n = 40;
  const auto kv = dsv4t::random_values<bf16_t>(static_cast<std::size_t>(n * 2 * d), 11);
  const auto score = dsv4t::random_values<bf16_t>(kv.size(), 12);
  const auto ape = dsv4t::random_values<float>(static_cast<std::size_t>(S * 2 * d), 13);
  dsv4::CompressorParams p{S, 2, d, ape.data()};
  std::vector<float> all(static_cast<std::size_t>(10 * d));
  dsv4::compress<bf16_t>(p, kv.data(), score.data(), n, all.data());
  std::vector<float> part(all.size(), std::numeric_limits<float>::quiet_NaN());
  dsv4::compress<bf16_t>(p, kv.data(), score.data(), n, part.data(), dsv4::NoHook{}, 3, 7);
  for (std::size_t i = 0; i < all.size(); ++i) {
    const std::int64_t j = static_cast<std::int64_t>(i) / d;
    if (j >= 3 && j < 7)
      EXPECT_EQ(part[i], all[i]);
    else
      EXPECT_TRUE(std::isnan(part[i]));
  }
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const phasekv::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(Compressor, RefusesBadArgumentsNamingThemAndWritesNothing) {
  std::vector<float> ape(64, 0.0f), kv(16 * 16, 1.0f), out(64, -7.0f);
  dsv4::CompressorParams p{4, 2, 8, ape.data()};
  auto bad = p;
  bad.coff = 3;
  EXPECT_NE(error_of([&] {
              dsv4::compress<float>(bad, kv.data(), kv.data(), 16, out.data());
            }).find("params.coff = 3"),
            std::string::npos);
  bad = p;
  bad.ratio = 0;
  EXPECT_NE(error_of([&] { dsv4::CompressorState<float> st(bad); }).find("params.ratio = 0"),
            std::string::npos);
  bad = p;
  bad.ape = nullptr;
  EXPECT_NE(error_of([&] {
              dsv4::compress<float>(bad, kv.data(), kv.data(), 16, out.data());
            }).find("params.ape"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              dsv4::compress<float>(p, kv.data(), kv.data(), -1, out.data());
            }).find("n = -1"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              dsv4::compress<float>(p, kv.data(), kv.data(), 16, out.data(), dsv4::NoHook{}, 2, 5);
            }).find("entry_end = 5"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              dsv4::compress<float>(p, nullptr, kv.data(), 16, out.data());
            }).find("kv = null"),
            std::string::npos);
  dsv4::CompressorState<float> st(p);
  EXPECT_NE(error_of([&] { st.append(kv.data(), kv.data(), 4, nullptr); }).find("out = null"),
            std::string::npos);
  EXPECT_EQ(st.tokens(), 0);
  EXPECT_NE(error_of([&] { st.append(kv.data(), kv.data(), -2, out.data()); }).find("count = -2"),
            std::string::npos);
  for (float x : out) EXPECT_EQ(x, -7.0f);
  // too few tokens for an entry: nothing is needed and nothing is written
  EXPECT_EQ(st.append(kv.data(), kv.data(), 3, nullptr), 0);
  EXPECT_EQ(st.tokens(), 3);
}

}  // namespace
