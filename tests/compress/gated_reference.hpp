// An independent, straightforward double-precision GatedPool for the tests, plus random
// GatedPool parameter sets.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "compress_test_util.hpp"
#include "phasekv/compress/gated_pool.hpp"

namespace pkv_test {

// Parameters of a GatedPool in test-owned memory. Absent tensors are empty vectors.
struct GatedParams {
  phasekv::Geometry g;
  i64 heads = 1, d_in = 1, d_out = 1;
  phasekv::GateKind kind = phasekv::GateKind::scalar;
  std::vector<float> z, b, c;  // [H, W, G, d_in], [H, W, G], [H, W, d_out, d_in]

  i64 gdim() const { return kind == phasekv::GateKind::scalar ? 1 : d_out; }

  phasekv::GatedPool policy() const {
    const i64 w = g.window(), G = gdim();
    return phasekv::GatedPool(
        g, heads, d_in, d_out, kind,
        z.empty() ? phasekv::ParamView{} : phasekv::param_view(z.data(), {heads, w, G, d_in}),
        b.empty() ? phasekv::ParamView{} : phasekv::param_view(b.data(), {heads, w, G}),
        c.empty() ? phasekv::ParamView{} : phasekv::param_view(c.data(), {heads, w, d_out, d_in}));
  }

  // Random parameters. Gate weights are scaled so logits spread over a few units.
  static GatedParams random(std::mt19937_64& rng, const phasekv::Geometry& g, i64 heads, i64 d_in,
                            i64 d_out, phasekv::GateKind kind, bool with_z, bool with_b,
                            bool with_c) {
    GatedParams p;
    p.g = g;
    p.heads = heads;
    p.d_in = d_in;
    p.d_out = with_c ? d_out : d_in;
    p.kind = kind;
    const i64 w = g.window(), G = p.gdim();
    const float zs = 3.0f / std::sqrt(static_cast<float>(d_in));
    if (with_z) {
      p.z.resize(static_cast<std::size_t>(heads * w * G * d_in));
      for (auto& v : p.z) v = uniform(rng, -zs, zs);
    }
    if (with_b) {
      p.b.resize(static_cast<std::size_t>(heads * w * G));
      for (auto& v : p.b) v = uniform(rng, -2.0f, 2.0f);
    }
    if (with_c) {
      p.c.resize(static_cast<std::size_t>(heads * w * p.d_out * d_in));
      const float cs = 1.0f / std::sqrt(static_cast<float>(d_in));
      for (auto& v : p.c) v = uniform(rng, -cs, cs);
    }
    return p;
  }
};

// Reference result of one channel: value and an error scale for float evaluation.
struct RefChannel {
  double value = 0.0;
  double scale = 0.0;  // sum_i alpha_i * (|payload terms| + |y_i| * logit magnitude)
};

// Double-precision GatedPool of one window. `x(i, k)` gives the window tokens as double.
// `shift` is the gate shift: gates of stored offset s act at offset (s + shift) mod W.
template <class X>
std::vector<RefChannel> gated_reference(const GatedParams& p, i64 h, i64 shift, const X& x) {
  const i64 w = p.g.window(), G = p.gdim();
  std::vector<RefChannel> out(static_cast<std::size_t>(p.d_out));
  for (i64 c = 0; c < p.d_out; ++c) {
    const i64 gi = p.kind == phasekv::GateKind::scalar ? 0 : c;
    std::vector<double> logit(static_cast<std::size_t>(w)), gmag(static_cast<std::size_t>(w)),
        y(static_cast<std::size_t>(w)), ymag(static_cast<std::size_t>(w));
    for (i64 i = 0; i < w; ++i) {
      const i64 src = ((i - shift) % w + w) % w;
      const i64 row = (h * w + src) * G + gi;
      double s = p.b.empty() ? 0.0 : p.b[static_cast<std::size_t>(row)];
      double m = std::abs(s);
      if (!p.z.empty())
        for (i64 k = 0; k < p.d_in; ++k) {
          const double t =
              static_cast<double>(p.z[static_cast<std::size_t>(row * p.d_in + k)]) * x(i, k);
          s += t;
          m += std::abs(t);
        }
      logit[static_cast<std::size_t>(i)] = s;
      gmag[static_cast<std::size_t>(i)] = m;
      if (p.c.empty()) {
        y[static_cast<std::size_t>(i)] = x(i, c);
        ymag[static_cast<std::size_t>(i)] = std::abs(x(i, c));
      } else {
        double v = 0.0, vm = 0.0;
        for (i64 k = 0; k < p.d_in; ++k) {
          const double t =
              static_cast<double>(
                  p.c[static_cast<std::size_t>(((h * w + i) * p.d_out + c) * p.d_in + k)]) *
              x(i, k);
          v += t;
          vm += std::abs(t);
        }
        y[static_cast<std::size_t>(i)] = v;
        ymag[static_cast<std::size_t>(i)] = vm;
      }
    }
    double mx = -std::numeric_limits<double>::infinity();
    for (double s : logit) mx = std::max(mx, s);
    if (mx == -std::numeric_limits<double>::infinity()) continue;  // all gates off: 0
    double den = 0.0, num = 0.0, sc = 0.0, gm = 0.0;
    for (i64 i = 0; i < w; ++i) gm = std::max(gm, gmag[static_cast<std::size_t>(i)]);
    for (i64 i = 0; i < w; ++i) {
      const double e = std::exp(logit[static_cast<std::size_t>(i)] - mx);
      den += e;
      num += e * y[static_cast<std::size_t>(i)];
      sc += e * (ymag[static_cast<std::size_t>(i)] +
                 std::abs(y[static_cast<std::size_t>(i)]) * (1.0 + gm));
    }
    out[static_cast<std::size_t>(c)] = {num / den, sc / den};
  }
  return out;
}

}  // namespace pkv_test
