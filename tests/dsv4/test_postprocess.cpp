// The model's post-processing blocks (dsv4/postprocess.hpp) against float64 formulas written
// here: YaRN frequencies, interleaved RoPE and its inverse, RMSNorm, tile FP8 fake-quantization
// (against the test's own quantizer), the Hadamard rotation and FP4 E2M1 fake-quantization of
// the indexer (against a matrix product and a quantizer by search), EntryPostprocess as a
// compressor hook whose entries a MODEL1 cache then holds exactly (and with `rotate` as the
// indexer's key hook), and QueryPostprocess for both kinds of query heads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
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

// Random inputs of an overlapping (coff 2) compressor of ratio S over n tokens of width d, and
// a norm weight near 1 (seeds seed .. seed + 3).
struct CompressorInputs {
  std::vector<float> ape, kv, sc, w;
  CompressorInputs(i64 S, i64 d, i64 n, std::uint32_t seed)
      : ape(dsv4t::random_values<float>(static_cast<std::size_t>(S * 2 * d), seed, 0.5f)),
        kv(dsv4t::random_values<float>(static_cast<std::size_t>(n * 2 * d), seed + 1)),
        sc(dsv4t::random_values<float>(static_cast<std::size_t>(n * 2 * d), seed + 2)),
        w(dsv4t::random_values<float>(static_cast<std::size_t>(d), seed + 3, 0.2f, 1.0f)) {}
};

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
  const CompressorInputs in(S, d, n, 21);
  const auto &ape = in.ape, &kv = in.kv, &sc = in.sc, &w = in.w;
  const dsv4::CompressorParams cp{S, 2, d, ape.data()};
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

// ---- the indexer's Hadamard rotation and FP4, the query side ---------------------------------

// H_n x / sqrt(n) as a matrix product in double.
std::vector<double> ref_hadamard(const std::vector<double>& x) {
  const std::size_t n = x.size();
  std::vector<double> y(n, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    double acc = 0.0;
    for (std::size_t j = 0; j < n; ++j) {
      const bool odd = (__builtin_popcountll(static_cast<unsigned long long>(i & j)) & 1) != 0;
      acc += odd ? -x[j] : x[j];
    }
    y[i] = acc / std::sqrt(static_cast<double>(n));
  }
  return y;
}

// The FP4 quantizer written from the description: scale 2^k, the smallest power of two at least
// the f32 product max(amax, 6 * 2^-126) * (1/6); codes by search over the 8 magnitudes, a tie
// to the even code.
double ref_fp4_scale(float amax) {
  const float m = std::max(amax, 6.0f * std::ldexp(1.0f, -126));
  const double r = static_cast<double>(m * (1.0f / 6.0f));
  int k = -126;
  while (std::ldexp(1.0, k) < r) ++k;
  return std::ldexp(1.0, k);
}
double ref_e2m1(double v) {
  static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  const double a = std::abs(v);
  int best = 0;
  for (int c = 1; c < 8; ++c) {
    const double dc = std::abs(a - mag[c]), db = std::abs(a - mag[best]);
    if (dc < db || (dc == db && c % 2 == 0)) best = c;
  }
  return v < 0 ? -mag[best] : mag[best];
}
// Distance of v from the nearest point where ref_e2m1 changes (a midpoint of two magnitudes).
double e2m1_boundary_distance(double v) {
  static const double mid[7] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5};
  double d = INFINITY;
  for (double m : mid) d = std::min(d, std::abs(std::abs(v) - m));
  return d;
}

TEST(Postprocess, HadamardRotationMatchesFloat64) {
  double worst = 0.0;
  for (const i64 n : {i64{1}, i64{2}, i64{4}, i64{32}, i64{128}, i64{512}, i64{4096}}) {
    const auto x = dsv4t::random_values<float>(static_cast<std::size_t>(n), 31, 2.0f, 0.5f);
    std::vector<float> y = x;
    dsv4::hadamard_rotate(y.data(), n);
    const auto want = ref_hadamard(std::vector<double>(x.begin(), x.end()));
    double norm = 0.0, err = 0.0;
    for (float v : x) norm += double(v) * v;
    norm = std::sqrt(norm);
    for (i64 i = 0; i < n; ++i)
      err = std::max(err,
                     std::abs(y[static_cast<std::size_t>(i)] - want[static_cast<std::size_t>(i)]));
    // log2(n) f32 butterflies and one scale: a few ulps of the row norm
    EXPECT_LE(err, 6e-8 * (std::log2(dbl(n)) + 2) * norm) << "n " << n;
    worst = std::max(worst, err / norm);
    dsv4::hadamard_rotate(y.data(), n);  // orthonormal and symmetric: its own inverse
    for (i64 i = 0; i < n; ++i)
      ASSERT_NEAR(y[static_cast<std::size_t>(i)], x[static_cast<std::size_t>(i)], 1e-6 * norm);
  }
  std::printf("[ measured ] hadamard_rotate, n 1 .. 4096: max |y - ref| / ||x|| = %.2e\n", worst);
  EXPECT_TRUE(dsv4::is_power_of_two(1) && dsv4::is_power_of_two(64));
  EXPECT_FALSE(dsv4::is_power_of_two(0) || dsv4::is_power_of_two(96) || dsv4::is_power_of_two(-4));
}

// FP4 fake quantization equals the test's quantizer exactly: awkward lengths and block sizes
// (short last block), ties, saturation-free scales, zero and subnormal blocks.
TEST(Postprocess, Fp4FakeQuantizationEqualsTheTestQuantizer) {
  for (const i64 block : {i64{32}, i64{16}, i64{7}}) {
    const i64 n = 203;
    auto x = dsv4t::random_values<float>(static_cast<std::size_t>(n), 41, 3.0f);
    for (i64 i = 32; i < 64; ++i) x[static_cast<std::size_t>(i)] *= 1e-39f;  // subnormal block
    for (i64 i = 64; i < 96; ++i) x[static_cast<std::size_t>(i)] = 0.0f;
    // exact ties in a block whose amax is 6 * 2^-2 (scale 2^-2)
    const float ties[] = {1.5f, 0.0625f, -0.1875f, 0.3125f, 0.4375f, -0.625f, 0.875f, 1.25f};
    for (i64 i = 96; i < 104; ++i) x[static_cast<std::size_t>(i)] = ties[i - 96];
    std::vector<float> y = x;
    dsv4::fp4_fake_quantize(y.data(), n, block);
    double err = 0.0, mag = 0.0;
    for (i64 b0 = 0; b0 < n; b0 += block) {
      const i64 b1 = std::min(n, b0 + block);
      float amax = 0;
      for (i64 i = b0; i < b1; ++i) amax = std::max(amax, std::abs(x[static_cast<std::size_t>(i)]));
      const double s = ref_fp4_scale(amax);
      for (i64 i = b0; i < b1; ++i) {
        const double want = ref_e2m1(x[static_cast<std::size_t>(i)] / s) * s;
        ASSERT_EQ(y[static_cast<std::size_t>(i)], static_cast<float>(want))
            << "block " << block << " channel " << i << " x " << x[static_cast<std::size_t>(i)];
        ASSERT_EQ(static_cast<float>(want), dsv4t::bf16_value(dsv4t::bf16_nearest(float(want))));
        err = std::max(err, std::abs(want - x[static_cast<std::size_t>(i)]));
        mag = std::max(mag, double(std::abs(x[static_cast<std::size_t>(i)])));
      }
    }
    std::printf("[ measured ] fp4_fake_quantize, block %lld: max |q - x| / max|x| = %.3f\n",
                static_cast<long long>(block), err / mag);
  }
  EXPECT_EQ(dsv4::fp4_e2m1_round(0.25f), 0.0f);
  EXPECT_EQ(dsv4::fp4_e2m1_round(-0.75f), -1.0f);
  EXPECT_EQ(dsv4::fp4_e2m1_round(1.25f), 1.0f);
  EXPECT_EQ(dsv4::fp4_e2m1_round(1.75f), 2.0f);
  EXPECT_EQ(dsv4::fp4_e2m1_round(2.5f), 2.0f);
  EXPECT_EQ(dsv4::fp4_e2m1_round(3.5f), 4.0f);
  EXPECT_EQ(dsv4::fp4_e2m1_round(5.0f), 4.0f);
  EXPECT_EQ(dsv4::fp4_e2m1_round(-100.0f), -6.0f);
  EXPECT_TRUE(std::isnan(dsv4::fp4_e2m1_round(NAN)));
}

// RMS norm (weighted or not), RoPE at `pos` of the last rope.dim channels, then optionally
// Hadamard + FP4 (rotate) or FP8 of the NoPE part, all in double; `flips` counts channels where
// the quantizer's input lies within 1e-4 (of a step) of a rounding point, where the f32 path may
// round the other way (those compare within one step).
struct RefRow {
  std::vector<double> pre, out, scale;
};
RefRow ref_row(std::vector<double> x, const float* w, bool norm, const dsv4::RopeParams& rope,
               i64 pos, bool rotate) {
  const i64 d = static_cast<i64>(x.size());
  if (norm) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / dbl(d) + 1e-6);
    for (i64 i = 0; i < d; ++i) x[static_cast<std::size_t>(i)] *= inv * (w ? w[i] : 1.0);
  }
  for (i64 i = 0; i < rope.dim / 2; ++i) {
    const double ang =
        static_cast<double>(static_cast<float>(pos) * static_cast<float>(ref_frequency(rope, i)));
    double& a = x[static_cast<std::size_t>(d - rope.dim + 2 * i)];
    double& b = x[static_cast<std::size_t>(d - rope.dim + 2 * i + 1)];
    const double a0 = a;
    a = a0 * std::cos(ang) - b * std::sin(ang);
    b = a0 * std::sin(ang) + b * std::cos(ang);
  }
  RefRow r;
  if (rotate) x = ref_hadamard(x);
  r.pre = x;
  r.out = x;
  r.scale.assign(x.size(), 0.0);
  if (rotate) {
    for (i64 b0 = 0; b0 < d; b0 += 32) {
      double amax = 0;
      for (i64 i = b0; i < b0 + 32; ++i)
        amax = std::max(amax, std::abs(x[static_cast<std::size_t>(i)]));
      const double s = ref_fp4_scale(static_cast<float>(amax));
      for (i64 i = b0; i < b0 + 32; ++i) {
        r.out[static_cast<std::size_t>(i)] = ref_e2m1(x[static_cast<std::size_t>(i)] / s) * s;
        r.scale[static_cast<std::size_t>(i)] = s;
      }
    }
  }
  return r;
}

// Compares a quantized row with the reference: equal, or (near a rounding point, where the f32
// path may round the other way) within one FP4 step; unquantized rows within `tol` relative.
void expect_row(const float* got, const RefRow& r, bool rotate, double tol, const char* what,
                i64 at, double& worst) {
  double mag = 1e-30;
  for (double v : r.pre) mag = std::max(mag, std::abs(v));
  for (std::size_t i = 0; i < r.out.size(); ++i) {
    const double g = got[i], want = r.out[i];
    if (!rotate) {
      ASSERT_NEAR(g, want, tol * mag) << what << " " << at << " channel " << i;
      worst = std::max(worst, std::abs(g - want) / mag);
    } else if (g != want) {
      ASSERT_LT(e2m1_boundary_distance(r.pre[i] / r.scale[i]), 1e-4)
          << what << " " << at << " channel " << i << ": " << g << " vs " << want;
      ASSERT_LE(std::abs(g - want), 2 * r.scale[i]) << what << " " << at << " channel " << i;
    }
  }
}

TEST(Postprocess, QueryPostprocessMatchesFloat64) {
  // attention queries (unweighted norm, YaRN RoPE; V4's 512 and an awkward 200 with RoPE 24)
  // and indexer queries (RoPE, Hadamard, FP4; 128 and 64 wide), 3 heads, 5 tokens from 1021
  struct Case {
    i64 dim, rope;
    bool norm, rotate;
  };
  for (const Case c : {Case{512, 64, true, false}, Case{200, 24, true, false},
                       Case{128, 64, false, true}, Case{64, 16, false, true}}) {
    dsv4::QueryPostprocess qp;
    qp.dim = c.dim;
    qp.norm = c.norm;
    qp.rotate = c.rotate;
    qp.rope = yarn();
    qp.rope.dim = c.rope;
    const i64 tokens = 5, heads = 3, first = 1021;
    const auto q0 = dsv4t::random_values<float>(static_cast<std::size_t>(tokens * heads * c.dim),
                                                static_cast<std::uint32_t>(51 + c.dim), 2.0f);
    std::vector<float> q = q0;
    qp.apply(q.data(), tokens, heads, first);
    double worst = 0.0;
    for (i64 t = 0; t < tokens; ++t)
      for (i64 h = 0; h < heads; ++h) {
        const float* src = q0.data() + (t * heads + h) * c.dim;
        const RefRow r = ref_row(std::vector<double>(src, src + c.dim), nullptr, c.norm, qp.rope,
                                 first + t, c.rotate);
        expect_row(q.data() + (t * heads + h) * c.dim, r, c.rotate, 2e-6, "query", t, worst);
      }
    if (!c.rotate)
      std::printf("[ measured ] QueryPostprocess dim %lld: max |q - ref| / max|ref| = %.2e\n",
                  static_cast<long long>(c.dim), worst);
  }
}

// EntryPostprocess with `rotate` as the indexer compressor's hook (V4: 128-wide keys, ratio 4,
// overlapping windows): weighted norm, RoPE at j * ratio, Hadamard, FP4 of each pooled entry.
TEST(Postprocess, IndexerKeyHookMatchesFloat64) {
  const i64 S = 4, d = 128, n = 37;
  const CompressorInputs in(S, d, n, 61);
  const auto &ape = in.ape, &kv = in.kv, &sc = in.sc, &w = in.w;
  const dsv4::CompressorParams cp{S, 2, d, ape.data()};
  dsv4::EntryPostprocess hook;
  hook.dim = d;
  hook.weight = w.data();
  hook.rope = yarn();
  hook.rotate = true;
  hook.check("test");
  const i64 J = n / S;
  std::vector<float> keys(static_cast<std::size_t>(J * d));
  dsv4::compress<float>(cp, kv.data(), sc.data(), n, keys.data(), hook);
  const auto pooled = dsv4t::reference_compress<float>(S, 2, d, ape, kv, sc, n);
  double worst = 0.0;
  for (i64 j = 0; j < J; ++j) {
    const RefRow r =
        ref_row(std::vector<double>(pooled.begin() + j * d, pooled.begin() + (j + 1) * d), w.data(),
                true, hook.rope, j * S, true);
    expect_row(keys.data() + j * d, r, true, 0.0, "entry", j, worst);
    for (i64 i = 0; i < d; ++i) {  // the keys are exact in bf16, the indexer's key storage
      const float k = keys[static_cast<std::size_t>(j * d + i)];
      ASSERT_EQ(k, dsv4t::bf16_value(dsv4t::bf16_nearest(k)));
    }
  }
}

TEST(Postprocess, RotateAndQueryArgumentsRefusedByName) {
  const auto expect_throw = [](auto&& f, const char* needle) {
    try {
      f();
      ADD_FAILURE() << needle;
    } catch (const phasekv::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  dsv4::EntryPostprocess h;
  h.dim = 96;
  h.rotate = true;
  expect_throw([&] { h.check("where"); }, "dim = 96");
  dsv4::QueryPostprocess qp;
  qp.dim = 128;
  qp.rope.dim = 64;
  std::vector<float> q(128, 1.0f);
  expect_throw([&] { qp.apply(q.data(), 1, 0, 0); }, "heads = 0");
  expect_throw([&] { qp.apply(q.data(), 1, 1, -3); }, "first_position = -3");
  expect_throw([&] { qp.apply(nullptr, 1, 1, 0); }, "q = null");
  qp.eps = -1.0f;
  expect_throw([&] { qp.apply(q.data(), 1, 1, 0); }, "eps = -1");
  EXPECT_EQ(q, std::vector<float>(128, 1.0f));  // nothing written
  // as a compressor hook: its check runs first, and its width must be the compressor's
  const CompressorInputs in(4, 64, 9, 81);
  const dsv4::CompressorParams cp{4, 2, 64, in.ape.data()};
  std::vector<float> out(2 * 64, -7.0f);
  dsv4::EntryPostprocess e;
  e.dim = 128;
  e.rope.dim = 16;
  expect_throw([&] { dsv4::compress<float>(cp, in.kv.data(), in.sc.data(), 9, out.data(), e); },
               "hook.dim = 128");
  e.dim = 64;
  e.rotate = true;
  e.eps = -2.0f;
  dsv4::CompressorState<float> st(cp);
  expect_throw([&] { st.append(in.kv.data(), in.sc.data(), 9, out.data(), e); }, "eps = -2");
  EXPECT_EQ(st.tokens(), 0);
  EXPECT_EQ(out, std::vector<float>(2 * 64, -7.0f));  // nothing written
}

}  // namespace
