// Built-in policies (GatedPool, OffsetSelect, MaxPool) against independent double-precision
// implementations, and gate cycling.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "compress_test_util.hpp"
#include "gated_reference.hpp"
#include "phasekv/compress/compress_batch.hpp"
#include "phasekv/compress/gate_cycling.hpp"
#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/compress/max_pool.hpp"
#include "phasekv/compress/offset_select.hpp"

namespace {

using pkv_test::GatedParams;
using pkv_test::i64;
using pkv_test::Tensor;

static_assert(phasekv::is_compressor_policy_v<phasekv::GatedPool>, "GatedPool");
static_assert(phasekv::is_compressor_policy_v<phasekv::OffsetSelect>, "OffsetSelect");
static_assert(phasekv::is_compressor_policy_v<phasekv::MaxPool>, "MaxPool");

// Batch-compresses random f32 data with `pol` and checks every entry against `ref(j, h)`
// (returns vector<RefChannel>) within 1e-6 of the reference's error scale. Returns the worst
// observed error / scale.
template <class Policy, class Ref>
double check_against_reference(const Policy& pol, const Tensor<float>& raw, Ref&& ref) {
  const phasekv::Geometry g = pol.geometry();
  const i64 J = g.complete_windows(raw.tokens);
  Tensor<float> entries(J + 1, raw.heads, pol.output_dim(), raw.layout);
  entries.poison();
  EXPECT_EQ(phasekv::compress_batch<float>(pol, raw.cview(), entries.view()), J);
  double worst = 0.0;
  for (i64 j = 0; j < J; ++j)
    for (i64 h = 0; h < raw.heads; ++h) {
      const std::vector<pkv_test::RefChannel> r = ref(j, h);
      for (i64 c = 0; c < pol.output_dim(); ++c) {
        const double got = entries.cview()(j, h, c);
        const auto& rc = r[static_cast<std::size_t>(c)];
        const double err = std::abs(got - rc.value);
        EXPECT_LE(err, 1e-6 * rc.scale)
            << "W=" << g.window() << " S=" << g.stride() << " O=" << g.origin() << " j=" << j
            << " h=" << h << " c=" << c << " got=" << got << " ref=" << rc.value;
        if (err > 1e-6 * rc.scale) return worst;
        if (rc.scale > 0) worst = std::max(worst, err / rc.scale);
      }
    }
  for (i64 h = 0; h < raw.heads; ++h)  // nothing past J(n) is written
    EXPECT_TRUE(std::isnan(entries.cview()(J, h, 0)));
  return worst;
}

TEST(GatedPool, MatchesDoubleReference) {
  std::mt19937_64 rng(2024);
  double worst = 0.0;
  int configs = 0;
  for (int trial = 0; trial < 72; ++trial) {
    const phasekv::Geometry g = pkv_test::random_geometry(rng, trial % 3, 12, 6);
    const i64 heads = 1 + trial % 3;
    const i64 d_in = std::vector<i64>{1, 3, 8, 17}[trial % 4];
    const i64 d_out = std::vector<i64>{1, 5, 8}[(trial / 4) % 3];
    const auto kind = trial % 2 ? phasekv::GateKind::vector : phasekv::GateKind::scalar;
    const bool with_c = (trial / 2) % 3 != 0, with_z = (trial / 6) % 4 != 0,
               with_b = (trial / 6) % 4 != 1;
    const GatedParams p =
        GatedParams::random(rng, g, heads, d_in, d_out, kind, with_z, with_b, with_c);
    const i64 n = pkv_test::rand_int(rng, 0, 120);
    Tensor<float> raw(n, heads, d_in, trial % 5 == 0 ? phasekv::Layout::HND : phasekv::Layout::NHD);
    raw.randomize(rng);
    const phasekv::GatedPool pol = p.policy();
    worst = std::max(worst, check_against_reference(pol, raw, [&](i64 j, i64 h) {
                       return pkv_test::gated_reference(p, h, 0, [&](i64 i, i64 k) {
                         return raw.at(g.window_begin(j) + i, h, k);
                       });
                     }));
    ++configs;
  }
  RecordProperty("worst_error_over_scale", pkv_test::fmt_g(worst));
  EXPECT_EQ(configs, 72);
}

TEST(GatedPool, HardGatesAndDisabledOffsets) {
  // b = -inf everywhere except offset r: the entry is exactly payload(x_r) (here the token).
  std::mt19937_64 rng(5);
  const phasekv::Geometry g(6, 4, 2);
  const i64 heads = 2, d = 7, r = 4;
  std::vector<float> b(static_cast<std::size_t>(heads * 6),
                       -std::numeric_limits<float>::infinity());
  for (i64 h = 0; h < heads; ++h) b[static_cast<std::size_t>(h * 6 + r)] = 0.5f;
  const phasekv::GatedPool pol(g, heads, d, d, phasekv::GateKind::scalar, phasekv::ParamView{},
                               phasekv::param_view(b.data(), {heads, 6, 1}));
  Tensor<float> raw(50, heads, d), entries(20, heads, d), sel(20, heads, d);
  raw.randomize(rng);
  entries.poison();
  sel.poison();
  const i64 J = phasekv::compress_batch<float>(pol, raw.cview(), entries.view());
  phasekv::compress_batch<float>(phasekv::OffsetSelect(g, d, r), raw.cview(), sel.view());
  EXPECT_EQ(std::memcmp(entries.data.data(), sel.data.data(),
                        static_cast<std::size_t>(J * heads * d) * 4),
            0);
  // All offsets off: the entry is 0, not NaN.
  std::fill(b.begin(), b.end(), -std::numeric_limits<float>::infinity());
  phasekv::compress_batch<float>(pol, raw.cview(), entries.view());
  for (i64 j = 0; j < J; ++j) EXPECT_EQ(entries.cview()(j, 1, 3), 0.0f);
  // A NaN input propagates.
  std::fill(b.begin(), b.end(), 0.0f);
  raw.data[static_cast<std::size_t>((g.window_begin(1) + 2) * heads * d)] = std::nanf("");
  phasekv::compress_batch<float>(pol, raw.cview(), entries.view());
  EXPECT_TRUE(std::isnan(entries.cview()(1, 0, 0)));
  EXPECT_FALSE(std::isnan(entries.cview()(1, 0, 1)));
}

TEST(GatedPool, ScalarGatesEqualRepeatedVectorGatesBitForBit) {
  std::mt19937_64 rng(9);
  const phasekv::Geometry g(8, 4, 0);
  const i64 heads = 2, d_in = 12, d_out = 6;
  const GatedParams s =
      GatedParams::random(rng, g, heads, d_in, d_out, phasekv::GateKind::scalar, true, true, true);
  GatedParams v = s;
  v.kind = phasekv::GateKind::vector;
  v.z.clear();
  v.b.clear();
  for (i64 hw = 0; hw < heads * 8; ++hw)
    for (i64 c = 0; c < d_out; ++c) {
      for (i64 k = 0; k < d_in; ++k) v.z.push_back(s.z[static_cast<std::size_t>(hw * d_in + k)]);
      v.b.push_back(s.b[static_cast<std::size_t>(hw)]);
    }
  Tensor<float> raw(77, heads, d_in), a(20, heads, d_out), b(20, heads, d_out);
  raw.randomize(rng);
  a.poison();
  b.poison();
  phasekv::compress_batch<float>(s.policy(), raw.cview(), a.view());
  phasekv::compress_batch<float>(v.policy(), raw.cview(), b.view());
  EXPECT_EQ(std::memcmp(a.data.data(), b.data.data(), a.data.size() * 4), 0);
}

template <class F>
void expect_shape_error(F&& f, const std::string& needle) {
  try {
    f();
    FAIL() << "expected shape_error mentioning " << needle;
  } catch (const phasekv::shape_error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(GatedPool, RejectsWrongParameterShapes) {
  const phasekv::Geometry g(8, 8);
  std::vector<float> z(2 * 8 * 1 * 4), b(2 * 8), c(2 * 8 * 3 * 4), zv(2 * 8 * 3 * 4);
  using phasekv::param_view;
  const auto S = phasekv::GateKind::scalar;
  EXPECT_NO_THROW(phasekv::GatedPool(g, 2, 4, 3, S, param_view(z.data(), {2, 8, 1, 4}),
                                     param_view(b.data(), {2, 8, 1}),
                                     param_view(c.data(), {2, 8, 3, 4})));
  expect_shape_error(
      [&] {
        phasekv::GatedPool(g, 2, 4, 3, S, param_view(z.data(), {2, 7, 1, 4}), {},
                           param_view(c.data(), {2, 8, 3, 4}));
      },
      "gate_weight.shape[1] = 7");
  expect_shape_error(
      [&] {
        phasekv::GatedPool(g, 2, 4, 3, S, param_view(z.data(), {2, 8, 1, 4}),
                           param_view(b.data(), {2, 8}), param_view(c.data(), {2, 8, 3, 4}));
      },
      "gate_bias.rank");
  expect_shape_error(
      [&] {
        phasekv::GatedPool(g, 2, 4, 3, S, {}, {}, param_view(c.data(), {2, 8, 4, 3}));
      },
      "payload.shape[2] = 4");
  expect_shape_error(
      [&] {
        phasekv::GatedPool(g, 2, 4, 3, phasekv::GateKind::vector,
                           param_view(z.data(), {2, 8, 1, 4}), {},
                           param_view(c.data(), {2, 8, 3, 4}));
      },
      "gate_weight.shape[2] = 1");
  EXPECT_NO_THROW(phasekv::GatedPool(g, 2, 4, 3, phasekv::GateKind::vector,
                                     param_view(zv.data(), {2, 8, 3, 4}), {},
                                     param_view(c.data(), {2, 8, 3, 4})));
  expect_shape_error(
      [&] {
        phasekv::GatedPool(g, 3, 4, 3, S, param_view(z.data(), {2, 8, 1, 4}), {},
                           param_view(c.data(), {3, 8, 3, 4}));
      },
      "gate_weight.shape[0] = 2");
  expect_shape_error(
      [&] {
        phasekv::GatedPool(g, 2, 4, 3, S, param_view(nullptr, {2, 8, 1, 4}), {},
                           param_view(c.data(), {2, 8, 3, 4}));
      },
      "gate_weight.data");
  expect_shape_error([&] { phasekv::GatedPool(g, 2, 4, 3, S, {}, {}, {}); }, "d_out = 3");
  expect_shape_error([&] { phasekv::GatedPool(g, 0, 4, 4, S, {}, {}, {}); }, "kv_heads = 0");
  expect_shape_error([&] { phasekv::param_view(z.data(), {1, 2, 3, 4, 5}); }, "shape.size()");
  // A policy with kv_heads() = 2 refuses data with 3 heads.
  Tensor<float> raw(16, 3, 4), out(2, 3, 4);
  const phasekv::GatedPool pol(g, 2, 4, 4, S, param_view(z.data(), {2, 8, 1, 4}), {}, {});
  expect_shape_error([&] { phasekv::compress_batch<float>(pol, raw.cview(), out.view()); },
                     "policy.kv_heads() = 2");
}

// Builds the GatedPool with gate arrays physically rotated by delta offsets.
GatedParams rotate_gates(const GatedParams& p, i64 delta) {
  GatedParams q = p;
  const i64 w = p.g.window(), G = p.gdim();
  for (i64 h = 0; h < p.heads; ++h)
    for (i64 i = 0; i < w; ++i) {
      const i64 to = ((i + delta) % w + w) % w;
      for (i64 gi = 0; gi < G; ++gi) {
        if (!p.b.empty())
          q.b[static_cast<std::size_t>((h * w + to) * G + gi)] =
              p.b[static_cast<std::size_t>((h * w + i) * G + gi)];
        if (!p.z.empty())
          for (i64 k = 0; k < p.d_in; ++k)
            q.z[static_cast<std::size_t>(((h * w + to) * G + gi) * p.d_in + k)] =
                p.z[static_cast<std::size_t>(((h * w + i) * G + gi) * p.d_in + k)];
      }
    }
  return q;
}

TEST(GateCycling, MovesEveryGateParameterByDelta) {
  std::mt19937_64 rng(77);
  for (int trial = 0; trial < 24; ++trial) {
    const phasekv::Geometry g = pkv_test::random_geometry(rng, trial % 3, 9, 3);
    const i64 w = g.window(), heads = 1 + trial % 2, d_in = 5, d_out = 4;
    const auto kind = trial % 2 ? phasekv::GateKind::vector : phasekv::GateKind::scalar;
    const GatedParams p = GatedParams::random(rng, g, heads, d_in, d_out, kind, true, true, true);
    Tensor<float> raw(60, heads, d_in);
    raw.randomize(rng);
    const i64 J = g.complete_windows(60);
    const phasekv::GatedPool base = p.policy();
    for (i64 delta = -w - 1; delta <= 2 * w + 1; ++delta) {
      const phasekv::GatedPool cyc = phasekv::cycle_gates(base, delta);
      EXPECT_EQ(cyc.gate_shift(), ((delta % w) + w) % w);
      const GatedParams rp = rotate_gates(p, delta);
      Tensor<float> a(J, heads, d_out), b(J, heads, d_out), c(J, heads, d_out);
      a.poison();
      b.poison();
      c.poison();
      phasekv::compress_batch<float>(cyc, raw.cview(), a.view());
      phasekv::compress_batch<float>(rp.policy(), raw.cview(), b.view());
      phasekv::compress_batch<float>(base, raw.cview(), c.view());
      // Cycling equals physically moving (Z_i, b_i) to offset i + delta, bit for bit.
      ASSERT_EQ(std::memcmp(a.data.data(), b.data.data(), a.data.size() * 4), 0)
          << "delta " << delta;
      // ... and matches the double reference with shifted gates.
      for (i64 j = 0; j < J; ++j)
        for (i64 h = 0; h < heads; ++h) {
          const auto r = pkv_test::gated_reference(p, h, ((delta % w) + w) % w, [&](i64 i, i64 k) {
            return raw.at(g.window_begin(j) + i, h, k);
          });
          for (i64 ch = 0; ch < d_out; ++ch)
            ASSERT_LE(std::abs(a.cview()(j, h, ch) - r[static_cast<std::size_t>(ch)].value),
                      1e-6 * r[static_cast<std::size_t>(ch)].scale);
        }
      const bool identity = delta % w == 0;
      const bool same = std::memcmp(a.data.data(), c.data.data(), a.data.size() * 4) == 0;
      if (identity) {
        EXPECT_TRUE(same) << "delta = " << delta << " must be the identity";
      } else if (J > 0) {
        EXPECT_FALSE(same) << "delta = " << delta << " changed nothing";
      }
    }
    // Shifts compose.
    EXPECT_EQ(base.cycled(3).cycled(w - 1).gate_shift(), base.cycled(2 + w).gate_shift());
    EXPECT_EQ(base.cycled(w).gate_shift(), 0);
  }
}

TEST(OffsetSelect, IsExactOneHot) {
  std::mt19937_64 rng(31);
  for (int trial = 0; trial < 30; ++trial) {
    const phasekv::Geometry g = pkv_test::random_geometry(rng, trial % 3, 10, 5);
    const i64 r = pkv_test::rand_int(rng, 0, g.window() - 1), heads = 1 + trial % 4,
              d = 1 + trial % 9;
    Tensor<phasekv::f16_t> raw(pkv_test::rand_int(rng, 0, 90), heads, d);
    raw.randomize(rng);
    const i64 J = g.complete_windows(raw.tokens);
    Tensor<phasekv::f16_t> e(J, heads, d);
    e.poison();
    phasekv::compress_batch<phasekv::f16_t>(phasekv::OffsetSelect(g, d, r), raw.cview(), e.view());
    for (i64 j = 0; j < J; ++j)
      for (i64 h = 0; h < heads; ++h)
        for (i64 c = 0; c < d; ++c)
          ASSERT_EQ(e.cview()(j, h, c).bits, raw.cview()(g.window_begin(j) + r, h, c).bits);
  }
  const phasekv::Geometry g(4, 4);
  try {
    phasekv::OffsetSelect(g, 3, 4);
    FAIL();
  } catch (const phasekv::invalid_argument& ex) {
    EXPECT_NE(std::string(ex.what()).find("offset = 4"), std::string::npos) << ex.what();
  }
}

TEST(MaxPool, MatchesElementwiseMax) {
  std::mt19937_64 rng(41);
  for (int trial = 0; trial < 30; ++trial) {
    const phasekv::Geometry g = pkv_test::random_geometry(rng, trial % 3, 10, 5);
    const i64 heads = 1 + trial % 3, d = 1 + trial % 11;
    Tensor<float> raw(pkv_test::rand_int(rng, 0, 90), heads, d);
    raw.randomize(rng);
    const i64 J = g.complete_windows(raw.tokens);
    Tensor<float> e(J, heads, d);
    e.poison();
    phasekv::compress_batch<float>(phasekv::MaxPool(g, d), raw.cview(), e.view());
    for (i64 j = 0; j < J; ++j)
      for (i64 h = 0; h < heads; ++h)
        for (i64 c = 0; c < d; ++c) {
          double m = -1e300;
          for (i64 i = 0; i < g.window(); ++i) m = std::max(m, raw.at(g.window_begin(j) + i, h, c));
          ASSERT_EQ(static_cast<double>(e.cview()(j, h, c)), m);
        }
  }
  // NaN propagates through the max.
  const phasekv::Geometry g(3, 3);
  Tensor<float> raw(3, 1, 2), e(1, 1, 2);
  raw.data = {1.0f, 2.0f, std::nanf(""), -1.0f, 0.5f, 7.0f};
  phasekv::compress_batch<float>(phasekv::MaxPool(g, 2), raw.cview(), e.view());
  EXPECT_TRUE(std::isnan(e.data[0]));
  EXPECT_EQ(e.data[1], 7.0f);
}

}  // namespace
