// The model's post-processing blocks (dsv4/postprocess.hpp) against float64 formulas written
// here: YaRN frequencies, interleaved RoPE and its inverse, RMSNorm, tile FP8 fake-quantization
// (against the test's own quantizer), and EntryPostprocess as a compressor hook whose entries a
// MODEL1 cache then holds exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "dsv4_format_ref.hpp"
#include "dsv4_test_util.hpp"
#include "phasekv/dsv4/compressor.hpp"
#include "phasekv/dsv4/postprocess.hpp"

namespace {

namespace dsv4 = phasekv::dsv4;
using i64 = std::int64_t;

double dbl(i64 v) { return static_cast<double>(v); }

// V4-like YaRN parameters for the compressed entries (theta 160000, factor 16).
dsv4::RopeParams yarn() {
  dsv4::RopeParams r;
  r.dim = 64;
  r.base = 160000.0f;
  r.original_seq_len = 65536;
  r.factor = 16.0f;
  r.beta_fast = 32.0f;
  r.beta_slow = 1.0f;
  return r;
}

// f_i from the formula in double.
double ref_frequency(const dsv4::RopeParams& p, i64 i) {
  const double f = std::pow(static_cast<double>(p.base), -2.0 * dbl(i) / dbl(p.dim));
  if (p.original_seq_len <= 0) return f;
  const double pi = std::acos(-1.0);
  auto c = [&](double r) {
    return dbl(p.dim) * std::log(dbl(p.original_seq_len) / (r * 2 * pi)) /
           (2 * std::log(double(p.base)));
  };
  const double lo = std::max(std::floor(c(p.beta_fast)), 0.0);
  double hi = std::min(std::ceil(c(p.beta_slow)), double(p.dim - 1));
  if (lo == hi) hi += 0.001;
  const double ramp = std::min(1.0, std::max(0.0, (dbl(i) - lo) / (hi - lo)));
  const double s = 1.0 - ramp;
  return f / p.factor * (1.0 - s) + f * s;
}

TEST(Postprocess, RopeFrequenciesMatchTheFormula) {
  for (const dsv4::RopeParams& p : {dsv4::RopeParams{}, yarn()}) {
    int yarn_changed = 0;
    for (i64 i = 0; i < p.dim / 2; ++i) {
      const double want = ref_frequency(p, i);
      EXPECT_NEAR(dsv4::rope_frequency(p, i), want, 2e-7 * want) << i;
      yarn_changed +=
          std::abs(want - std::pow(double(p.base), -2.0 * dbl(i) / dbl(p.dim))) > 1e-6 * want;
    }
    if (p.original_seq_len > 0) {
      EXPECT_GT(yarn_changed, 10);
    }  // YaRN moves the low frequencies
  }
}

// RoPE at positions up to 10^6 against double rotation by the model's f32 angle, and the
// inverse brings the row back.
TEST(Postprocess, RopeAndItsInverseMatchFloat64) {
  std::mt19937 rng(7);
  for (const dsv4::RopeParams& p : {dsv4::RopeParams{}, yarn()}) {
    for (const i64 t : {i64{0}, i64{1}, i64{127}, i64{4096}, i64{65535}, i64{1000003}}) {
      const auto x = dsv4t::random_values<float>(static_cast<std::size_t>(p.dim),
                                                 static_cast<std::uint32_t>(rng()));
      std::vector<float> y = x;
      dsv4::rope_apply(p, t, y.data());
      for (i64 i = 0; i < p.dim / 2; ++i) {
        const float f = dsv4::rope_frequency(p, i);  // checked above; its f32 rounding
        // matters at t = 10^6, so the rotation is checked on the same f32 frequency
        const double ang = static_cast<double>(static_cast<float>(t) * f);  // the model's f32
        const double a = x[2 * i], b = x[2 * i + 1];
        const double r0 = a * std::cos(ang) - b * std::sin(ang);
        const double r1 = a * std::sin(ang) + b * std::cos(ang);
        const double tol = 2e-6 * (std::abs(a) + std::abs(b)) + 1e-7;
        ASSERT_NEAR(y[2 * i], r0, tol) << "t " << t << " pair " << i;
        ASSERT_NEAR(y[2 * i + 1], r1, tol) << "t " << t << " pair " << i;
      }
      dsv4::rope_apply(p, t, y.data(), true);
      for (i64 i = 0; i < p.dim; ++i)
        ASSERT_NEAR(y[i], x[i], 4e-6 * (1 + std::abs(x[i]))) << "t " << t << " channel " << i;
    }
  }
}

TEST(Postprocess, RmsNormMatchesFloat64) {
  for (const i64 n : {i64{1}, i64{7}, i64{512}}) {
    const auto x = dsv4t::random_values<float>(static_cast<std::size_t>(n), 11, 3.0f);
    const auto w = dsv4t::random_values<float>(static_cast<std::size_t>(n), 12, 0.5f, 1.0f);
    for (const bool weighted : {false, true}) {
      std::vector<float> y = x;
      dsv4::rms_norm(y.data(), n, weighted ? w.data() : nullptr, 1e-6f);
      double ss = 0;
      for (float v : x) ss += double(v) * v;
      const double inv = 1.0 / std::sqrt(ss / dbl(n) + 1e-6);
      for (i64 i = 0; i < n; ++i) {
        const double want = x[static_cast<std::size_t>(i)] * inv *
                            (weighted ? double(w[static_cast<std::size_t>(i)]) : 1.0);
        ASSERT_NEAR(y[static_cast<std::size_t>(i)], want, 3e-7 * (1 + std::abs(want))) << n << i;
      }
    }
  }
}

// Fake quantization equals the test's quantizer (nearest E4M3 by search, scale 2^k from the
// exponent of amax / 448) exactly, short last tile and tiny tiles included.
TEST(Postprocess, FakeQuantizationEqualsTheTestQuantizer) {
  const i64 n = 200;
  auto x = dsv4t::random_values<float>(static_cast<std::size_t>(n), 13, 2.0f);
  for (i64 i = 64; i < 128; ++i) x[static_cast<std::size_t>(i)] *= 1e-7f;  // the 1e-4 floor
  std::vector<float> y = x;
  dsv4::fp8_fake_quantize(y.data(), n, 64);
  for (i64 t0 = 0; t0 < n; t0 += 64) {
    float amax = 0;
    for (i64 i = t0; i < std::min(n, t0 + 64); ++i)
      amax = std::max(amax, std::abs(x[static_cast<std::size_t>(i)]));
    const double s = std::ldexp(1.0, dsv4t::scale_exponent(amax));
    for (i64 i = t0; i < std::min(n, t0 + 64); ++i) {
      const double want =
          dsv4t::e4m3_value(dsv4t::e4m3_nearest(x[static_cast<std::size_t>(i)] / s)) * s;
      ASSERT_EQ(y[static_cast<std::size_t>(i)], static_cast<float>(want)) << i;
    }
  }
}

// EntryPostprocess as the hook of compress_append_paged into a MODEL1 cache: each hooked entry
// equals float64 norm + RoPE (at j * ratio) + fake quantization of the pooled entry, and the
// cache holds its FP8 channels exactly (its RoPE channels rounded to bf16).
TEST(Postprocess, EntryHookIntoModel1) {
  const i64 S = 4, d = 512, n = 23, P = 2;
  const auto ape = dsv4t::random_values<float>(static_cast<std::size_t>(S * 2 * d), 21, 0.5f);
  const dsv4::CompressorParams cp{S, 2, d, ape.data()};
  const auto kv = dsv4t::random_values<float>(static_cast<std::size_t>(n * 2 * d), 22);
  const auto sc = dsv4t::random_values<float>(static_cast<std::size_t>(n * 2 * d), 23);
  const auto w = dsv4t::random_values<float>(static_cast<std::size_t>(d), 24, 0.2f, 1.0f);
  dsv4::EntryPostprocess hook;
  hook.weight = w.data();
  hook.rope = yarn();
  hook.check("test");
  const i64 J = n / S;
  std::vector<float> hooked(static_cast<std::size_t>(J * d));
  dsv4::CompressorState<float> st(cp);
  st.append(kv.data(), sc.data(), n, hooked.data(), hook);
  const auto pooled = dsv4t::reference_compress<float>(S, 2, d, ape, kv, sc, n);
  for (i64 j = 0; j < J; ++j) {
    std::vector<double> x(pooled.begin() + j * d, pooled.begin() + (j + 1) * d);
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / dbl(d) + 1e-6);
    for (i64 i = 0; i < d; ++i)
      x[static_cast<std::size_t>(i)] *= inv * w[static_cast<std::size_t>(i)];
    for (i64 i = 0; i < 32; ++i) {
      const double ang = static_cast<double>(static_cast<float>(j * S) *
                                             static_cast<float>(ref_frequency(hook.rope, i)));
      double& a = x[static_cast<std::size_t>(448 + 2 * i)];
      double& b = x[static_cast<std::size_t>(449 + 2 * i)];
      const double a0 = a;
      a = a0 * std::cos(ang) - b * std::sin(ang);
      b = a0 * std::sin(ang) + b * std::cos(ang);
    }
    for (i64 i = 0; i < d; ++i) {
      const double got = hooked[static_cast<std::size_t>(j * d + i)];
      const double want = x[static_cast<std::size_t>(i)];
      // NoPE: within one E4M3 step (the f32 pooling may cross a rounding point): 2^-3
      // relative, or 2^-9 of the tile scale (at most amax / 224) for subnormal codes
      double amax = 0;
      for (i64 k = i / 64 * 64; i < 448 && k < i / 64 * 64 + 64; ++k)
        amax = std::max(amax, std::abs(x[static_cast<std::size_t>(k)]));
      const double tol =
          i < 448 ? std::abs(want) * std::ldexp(1.0, -3) + amax / 224 * std::ldexp(1.0, -9) : 2e-5;
      ASSERT_NEAR(got, want, tol) << "entry " << j << " channel " << i;
    }
  }
  // the same tokens through compress_append_paged into MODEL1 pages
  const i64 blocks = (J + P - 1) / P, bb = dsv4::model1_block_bytes(P);
  std::vector<phasekv::model1_fp8_t> bytes(static_cast<std::size_t>(blocks * bb));
  auto pool = phasekv::make_page_pool(bytes.data(), bytes.data(), blocks, P, 1, 584, 584);
  pool.key_page_stride = bb;
  std::vector<std::int32_t> table(static_cast<std::size_t>(blocks));
  for (i64 b = 0; b < blocks; ++b)
    table[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(blocks - 1 - b);
  std::vector<float> state(static_cast<std::size_t>(dsv4::compressor_state_elements(cp)));
  i64 tokens = 0;
  dsv4::PagedCompressArgs<float, phasekv::model1_fp8_t> c;
  c.batch = 1;
  c.kv = kv.data();
  c.score = sc.data();
  const std::vector<std::int32_t> ip = {0, static_cast<std::int32_t>(n)};
  c.chunk_indptr = ip.data();
  c.tokens = &tokens;
  c.state = state.data();
  c.entry_pool = pool;
  c.entry_table = phasekv::dense_block_table(table.data(), 1, blocks);
  dsv4::compress_append_paged(cp, c, hook);
  for (i64 j = 0; j < J; ++j) {
    const auto* blk = reinterpret_cast<const std::uint8_t*>(bytes.data()) +
                      table[static_cast<std::size_t>(j / P)] * bb;
    const auto x = dsv4t::dequantize_token(dsv4t::kModel1, blk, P, j % P, 0);
    for (i64 i = 0; i < d; ++i) {
      const float h = hooked[static_cast<std::size_t>(j * d + i)];
      if (i < 448)
        ASSERT_EQ(x[static_cast<std::size_t>(i)], h) << "entry " << j << " channel " << i;
      else
        ASSERT_EQ(x[static_cast<std::size_t>(i)], dsv4t::bf16_value(dsv4t::bf16_nearest(h)));
    }
  }
}

TEST(Postprocess, RefusesBadParametersByName) {
  dsv4::EntryPostprocess h;
  h.rope.dim = 63;
  try {
    h.check("where");
    ADD_FAILURE();
  } catch (const phasekv::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("rope.dim = 63"), std::string::npos) << e.what();
  }
  h.rope.dim = 64;
  h.dim = 32;
  try {
    h.check("where");
    ADD_FAILURE();
  } catch (const phasekv::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("dim = 32"), std::string::npos) << e.what();
  }
}

}  // namespace
