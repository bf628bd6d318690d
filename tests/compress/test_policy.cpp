// The policy contract (trait, concept, static checks), UniformMean against a double
// reference, and compress_batch argument checking and threading.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "compress_test_util.hpp"
#include "phasekv/compress/compress_batch.hpp"
#include "phasekv/compress/policy.hpp"
#include "phasekv/compress/uniform_mean.hpp"

namespace {

using pkv_test::i64;
using pkv_test::Tensor;

struct NotAPolicy {
  int x = 0;
};

struct NoCompress {
  phasekv::Geometry geometry() const { return {}; }
  i64 input_dim() const { return 1; }
  i64 output_dim() const { return 1; }
};

struct HasVirtual {
  virtual ~HasVirtual() = default;
  phasekv::Geometry geometry() const { return {}; }
  i64 input_dim() const { return 1; }
  i64 output_dim() const { return 1; }
  template <class Load>
  void compress(i64, const Load& x, float* out) const {
    out[0] = x(0, 0);
  }
};

struct Minimal {
  phasekv::Geometry geometry() const { return phasekv::Geometry(2, 2); }
  i64 input_dim() const { return 1; }
  i64 output_dim() const { return 1; }
  template <class Load>
  void compress(i64, const Load& x, float* out) const {
    out[0] = x(1, 0);
  }
};

struct WithHeads : Minimal {
  i64 kv_heads() const { return 3; }
};

static_assert(phasekv::is_compressor_policy_v<phasekv::UniformMean>, "UniformMean is a policy");
static_assert(phasekv::is_compressor_policy_v<Minimal>, "Minimal is a policy");
static_assert(!phasekv::is_compressor_policy_v<NotAPolicy>, "no members");
static_assert(!phasekv::is_compressor_policy_v<NoCompress>, "no compress");
static_assert(!phasekv::is_compressor_policy_v<HasVirtual>, "not trivially copyable");
#if PHASEKV_HAS_CONCEPTS
static_assert(phasekv::CompressorPolicy<phasekv::UniformMean>);
static_assert(phasekv::CompressorPolicy<Minimal>);
static_assert(!phasekv::CompressorPolicy<NoCompress>);
static_assert(!phasekv::CompressorPolicy<HasVirtual>);
#endif

TEST(Policy, KvHeadsIsOptional) {
  EXPECT_EQ(phasekv::policy_kv_heads(Minimal{}), 0);
  EXPECT_EQ(phasekv::policy_kv_heads(WithHeads{}), 3);
  EXPECT_NO_THROW(phasekv::check_policy_dims(WithHeads{}, 3, "t", "key_policy"));
  try {
    phasekv::check_policy_dims(WithHeads{}, 2, "t", "key_policy");
    FAIL() << "expected shape_error";
  } catch (const phasekv::shape_error& e) {
    EXPECT_NE(std::string(e.what()).find("key_policy.kv_heads()"), std::string::npos) << e.what();
  }
}

TEST(Policy, DeterministicExpIsAccurate) {
  // fp_exp is the building block of every softmax gate: check it against std::exp in double.
  double worst = 0.0;
  for (int k = -87000; k <= 88000; k += 7) {
    const float x = static_cast<float>(k) * 1e-3f + 1.2345e-4f;
    const double ref = std::exp(static_cast<double>(x));
    const double got = phasekv::detail::fp_exp(x);
    worst = std::max(worst, std::abs(got - ref) / ref);
  }
  EXPECT_LT(worst, 3.0 * 5.96e-8);  // a few ulp
  EXPECT_EQ(phasekv::detail::fp_exp(0.0f), 1.0f);
  EXPECT_EQ(phasekv::detail::fp_exp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_TRUE(std::isinf(phasekv::detail::fp_exp(std::numeric_limits<float>::infinity())));
  EXPECT_TRUE(std::isnan(phasekv::detail::fp_exp(std::nanf(""))));
  EXPECT_EQ(phasekv::detail::fp_exp(-100.0f), 0.0f);
}

// UniformMean against a double-precision mean, f32 storage, many random geometries.
TEST(UniformMean, MatchesDoubleReference) {
  std::mt19937_64 rng(101);
  double worst = 0.0;
  for (int trial = 0; trial < 60; ++trial) {
    const phasekv::Geometry g = pkv_test::random_geometry(rng, trial % 3, 16, 7);
    const i64 n = pkv_test::rand_int(rng, 0, 150), heads = 1 + trial % 3;
    const i64 dim = std::vector<i64>{1, 5, 16, 33}[trial % 4];
    const phasekv::Layout layout = trial % 2 ? phasekv::Layout::HND : phasekv::Layout::NHD;
    Tensor<float> raw(n, heads, dim, layout);
    raw.randomize(rng);
    const i64 J = g.complete_windows(n);
    Tensor<float> entries(J + 2, heads, dim, layout);
    entries.poison();
    const phasekv::UniformMean pol(g, dim);
    ASSERT_EQ(phasekv::compress_batch<float>(pol, raw.cview(), entries.view()), J);
    for (i64 j = 0; j < J + 2; ++j)
      for (i64 h = 0; h < heads; ++h)
        for (i64 c = 0; c < dim; ++c) {
          const float got = entries.cview()(j, h, c);
          if (j >= J) {
            ASSERT_TRUE(std::isnan(got)) << "entry past J(n) was written";
            continue;
          }
          double sum = 0.0, mag = 0.0;
          for (i64 i = 0; i < g.window(); ++i) {
            sum += raw.at(g.window_begin(j) + i, h, c);
            mag += std::abs(raw.at(g.window_begin(j) + i, h, c));
          }
          const double ref = sum / static_cast<double>(g.window());
          mag /= static_cast<double>(g.window());
          const double err = std::abs(static_cast<double>(got) - ref);
          ASSERT_LE(err, 1e-6 * mag)
              << "W=" << g.window() << " S=" << g.stride() << " O=" << g.origin() << " j=" << j;
          if (mag > 0) worst = std::max(worst, err / mag);
        }
  }
  RecordProperty("worst_relative_error", pkv_test::fmt_g(worst));
}

TEST(CompressBatch, ThreadsPartitionTheSameEntries) {
  std::mt19937_64 rng(7);
  const phasekv::Geometry g(5, 3, 2);
  Tensor<phasekv::bf16_t> raw(97, 3, 24), one(40, 3, 24), many(40, 3, 24);
  raw.randomize(rng);
  one.poison();
  many.poison();
  const phasekv::UniformMean pol(g, 24);
  const i64 J = phasekv::compress_batch<phasekv::bf16_t>(pol, raw.cview(), one.view());
  ASSERT_EQ(J, g.complete_windows(97));
  for (int t = 0; t < 5; ++t)
    EXPECT_EQ(phasekv::compress_batch<phasekv::bf16_t>(pol, raw.cview(), many.view(), t, 5), J);
  EXPECT_EQ(std::memcmp(one.data.data(), many.data.data(), one.data.size() * 2), 0);
}

template <class F>
void expect_error_naming(F&& f, const char* name) {
  try {
    f();
    FAIL() << "expected an exception naming " << name;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
}

TEST(CompressBatch, RejectsBadArgumentsWithoutWriting) {
  std::mt19937_64 rng(3);
  const phasekv::Geometry g(4, 4, 1);
  Tensor<float> raw(21, 2, 8), entries(5, 2, 8), small(4, 2, 8), wrong_dim(5, 2, 7),
      wrong_heads(5, 3, 8);
  raw.randomize(rng);
  for (Tensor<float>* t : {&entries, &small, &wrong_dim, &wrong_heads}) t->poison();
  const phasekv::UniformMean pol(g, 8);
  expect_error_naming([&] { phasekv::compress_batch<float>(pol, raw.cview(), small.view()); },
                      "entries.tokens");
  expect_error_naming([&] { phasekv::compress_batch<float>(pol, raw.cview(), wrong_dim.view()); },
                      "entries.dim");
  expect_error_naming([&] { phasekv::compress_batch<float>(pol, raw.cview(), wrong_heads.view()); },
                      "entries.heads");
  expect_error_naming(
      [&] {
        phasekv::compress_batch<float>(phasekv::UniformMean(g, 9), raw.cview(), entries.view());
      },
      "raw.dim");
  auto null_raw = raw.cview();
  null_raw.data = nullptr;
  expect_error_naming([&] { phasekv::compress_batch<float>(pol, null_raw, entries.view()); },
                      "raw");
  expect_error_naming(
      [&] { phasekv::compress_batch<float>(pol, raw.cview(), entries.view(), 2, 2); },
      "thread_index");
  expect_error_naming([&] { phasekv::UniformMean(g, 0); }, "dim");
  for (Tensor<float>* t : {&entries, &small, &wrong_dim, &wrong_heads})
    EXPECT_TRUE(pkv_test::is_poison_bytes(t->data.data(), t->data.size() * sizeof(float)));
  // Empty input with null data is fine and writes nothing.
  phasekv::StridedView<const float> empty{nullptr, 0, 2, 8, 16, 8};
  EXPECT_EQ(phasekv::compress_batch<float>(pol, empty, entries.view()), 0);
}

}  // namespace
