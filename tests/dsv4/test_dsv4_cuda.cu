// The CUDA twin of the DeepSeek-V4 sparse attention (dsv4/cuda/sparse_attention.cuh) and the
// host/device math it shares (dsv4/kernel_math.hpp).
//
// Always run (no device needed): the shared math (windows, items, softmax step, finish), a host
// model of the kernel (the same tiles of 8 rows, the same item order, the same warp butterfly)
// built from that math against a float64 reference written from the formulas, and the host
// checks of the launcher. With a device: the kernel against the same reference (poisoned
// outputs, every element type, d 56/512/576, heads 1/3/64/128, 1/7/97/1000 tokens, sinks, HCA,
// -1 padding, nothing visible, an invalid index) and the same bits on a second run.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/cuda_test_util.hpp"
#include "dsv4_test_util.hpp"
#include "phasekv/dsv4/cuda/sparse_attention.cuh"
#include "phasekv/dsv4/kernel_math.hpp"

namespace {

namespace dsv4 = phasekv::dsv4;
using phasekv::bf16_t;
using phasekv::f16_t;
using phasekv::fp8_e4m3_t;
using pkv_cuda_test::DeviceBuffer;
using pkv_cuda_test::has_device;
using pkv_cuda_test::to_device;
using i64 = std::int64_t;

template <class T>
T make_elem(float x, float scale) {
  if constexpr (std::is_same_v<T, fp8_e4m3_t>)
    return phasekv::float_to_fp8_e4m3(x / scale);
  else
    return phasekv::from_float<T>(x);
}

// ---- the shared math --------------------------------------------------------------------

TEST(Dsv4KernelMath, SparseWindow) {
  EXPECT_EQ(dsv4::sparse_window(0, 0).count, 0);
  EXPECT_EQ(dsv4::sparse_window(500, 0).count, 0);
  EXPECT_EQ(dsv4::sparse_window(0, 128).lo, 0);
  EXPECT_EQ(dsv4::sparse_window(0, 128).count, 1);
  EXPECT_EQ(dsv4::sparse_window(5, 128).lo, 0);
  EXPECT_EQ(dsv4::sparse_window(5, 128).count, 6);
  EXPECT_EQ(dsv4::sparse_window(127, 128).count, 128);
  EXPECT_EQ(dsv4::sparse_window(200, 128).lo, 73);
  EXPECT_EQ(dsv4::sparse_window(200, 128).count, 128);
  EXPECT_EQ(dsv4::sparse_window(200, 1).lo, 200);
  EXPECT_EQ(dsv4::sparse_window(200, 1).count, 1);
}

TEST(Dsv4KernelMath, SparseItems) {
  const std::int32_t list[] = {4, -1, 9, 2, 10, -2};
  const dsv4::SparseWindow w = dsv4::sparse_window(40, 3);  // positions 38, 39, 40
  using K = dsv4::SparseItem;
  // entries [2, 10) are present
  const K::Kind want[] = {K::entry, K::skip, K::entry, K::entry, K::invalid, K::invalid};
  for (int k = 0; k < 6; ++k) {
    const K it = dsv4::sparse_item(k, list, 6, 2, 8, w);
    EXPECT_EQ(it.kind, want[k]) << k;
    EXPECT_EQ(it.row, list[k]) << k;
  }
  for (int k = 6; k < 9; ++k) {
    const K it = dsv4::sparse_item(k, list, 6, 2, 8, w);
    EXPECT_EQ(it.kind, K::raw);
    EXPECT_EQ(it.row, 38 + k - 6);
  }
  // no list: entries first + k
  for (int k = 0; k < 4; ++k) {
    const K it = dsv4::sparse_item(k, nullptr, 4, 5, 4, w);
    EXPECT_EQ(it.kind, K::entry);
    EXPECT_EQ(it.row, 5 + k);
  }
  EXPECT_EQ(dsv4::sparse_item(4, nullptr, 4, 5, 4, w).row, 38);
}

TEST(Dsv4KernelMath, SoftmaxStepAndFinish) {
  const float rs[4] = {1.0f, 1.0f, 2.0f, 1.0f};
  float m = -HUGE_VALF, den = 0.0f, p[4];
  const float none[4] = {-HUGE_VALF, -HUGE_VALF, -HUGE_VALF, -HUGE_VALF};
  EXPECT_EQ(dsv4::softmax_tile_update(m, den, none, rs, 4, p), 1.0f);  // nothing moves
  EXPECT_EQ(m, -HUGE_VALF);
  EXPECT_EQ(den, 0.0f);
  for (float x : p) EXPECT_EQ(x, 0.0f);
  const float l1[4] = {0.5f, -HUGE_VALF, 1.5f, 0.0f};
  EXPECT_EQ(dsv4::softmax_tile_update(m, den, l1, rs, 4, p), 0.0f);  // first rows: acc * 0
  EXPECT_EQ(m, 1.5f);
  EXPECT_NEAR(den, std::exp(-1.0) + 1.0 + std::exp(-1.5), 1e-6);
  EXPECT_EQ(p[1], 0.0f);
  EXPECT_FLOAT_EQ(p[2], 2.0f);  // weight 1 times row scale 2
  const float l2[2] = {2.5f, 1.0f};
  const float c = dsv4::softmax_tile_update(m, den, l2, rs, 2, p);
  EXPECT_NEAR(c, std::exp(-1.0), 1e-7);
  EXPECT_EQ(m, 2.5f);
  // finish: nothing and no sink; nothing and a sink; rows and a larger sink
  dsv4::SparseFinish f = dsv4::sparse_finish(-HUGE_VALF, 0.0f, false, 0.0f);
  EXPECT_EQ(f.f1, 0.0f);
  EXPECT_EQ(f.f2, 0.0f);
  EXPECT_EQ(f.lse, -HUGE_VALF);
  f = dsv4::sparse_finish(-HUGE_VALF, 0.0f, true, 0.75f);
  EXPECT_EQ(f.f1, 0.0f);
  EXPECT_EQ(f.f2, 1.0f);
  EXPECT_EQ(f.lse, 0.75f);
  f = dsv4::sparse_finish(1.0f, 2.0f, true, 3.0f);  // den 2 e^1 + e^3 over max 3
  EXPECT_NEAR(f.f1, std::exp(-2.0), 1e-7);
  EXPECT_NEAR(f.lse, std::log(2.0 * std::exp(1.0) + std::exp(3.0)), 1e-6);
  EXPECT_NEAR(f.f1 * f.f2, std::exp(-2.0) / (2.0 * std::exp(-2.0) + 1.0), 1e-7);
}

// ---- cases, reference, host model --------------------------------------------------------

struct Case {
  std::string name;
  i64 heads = 1, dim = 56, dim_v = 56, window = 8;
  i64 first = 0, queries = 1;  // tokens n = first + queries
  i64 ratio = 4;               // J(n) = n / ratio entries
  i64 k = 0;                   // index_count
  bool hca = false;            // indices null, index_count = J(first + 1)
  bool sinks = false;
  float raw_scale = 1.0f, entry_scale = 1.0f;
  std::uint32_t seed = 1;
};

template <class T>
struct Data {
  Case c;
  i64 n = 0, J = 0, stride = 0, index_count = 0;
  std::vector<T> raw, ent;
  std::vector<float> q, sinks;
  std::vector<std::int32_t> idx;  // empty: null
  dsv4::SparseAttentionParams params;
  dsv4::LatentRows<T> rr, er;

  explicit Data(const Case& cc) : c(cc) {
    n = c.first + c.queries;
    J = n / c.ratio;
    stride = c.dim + 3;  // rows padded: the stride is honoured
    std::mt19937 rng(c.seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    raw.resize(static_cast<std::size_t>(std::max<i64>(n, 1) * stride));
    ent.resize(static_cast<std::size_t>(std::max<i64>(J, 1) * stride));
    for (auto& x : raw) x = make_elem<T>(nd(rng), c.raw_scale);
    for (auto& x : ent) x = make_elem<T>(nd(rng), c.entry_scale);
    q.resize(static_cast<std::size_t>(c.queries * c.heads * c.dim));
    for (auto& x : q) x = nd(rng);
    if (c.sinks) {
      sinks.resize(static_cast<std::size_t>(c.heads));
      for (auto& x : sinks) x = nd(rng);
    }
    if (c.hca) {
      index_count = (c.first + 1) / c.ratio;
    } else {
      index_count = c.k;
      idx.assign(static_cast<std::size_t>(c.queries * c.k), -1);
      for (i64 i = 0; i < c.queries; ++i) {
        const i64 vis = (c.first + i + 1) / c.ratio;
        dsv4t::random_index_list(rng, vis, c.k, idx.data() + i * c.k);
      }
    }
    params.heads = c.heads;
    params.dim = c.dim;
    params.dim_v = c.dim_v;
    params.window = c.window;
    params.scale = 1.0f / std::sqrt(static_cast<float>(c.dim));
    rr = dsv4::LatentRows<T>{raw.data(), 0, n, stride, c.raw_scale};
    er = dsv4::LatentRows<T>{ent.data(), 0, J, stride, c.entry_scale};
  }

  const std::int32_t* list(i64 i) const {
    return idx.empty() ? nullptr : idx.data() + i * index_count;
  }

  // float64 reference of query i from the formulas.
  void reference(i64 i, std::vector<double>& o, std::vector<double>& l) const {
    const i64 t = c.first + i, H = c.heads, d = c.dim, dv = c.dim_v;
    std::vector<const T*> rows;
    std::vector<double> rsc;
    for (i64 s = 0; s < index_count; ++s) {
      const i64 j = list(i) ? list(i)[s] : s;
      if (j < 0) continue;
      rows.push_back(ent.data() + j * stride);
      rsc.push_back(c.entry_scale);
    }
    if (c.window > 0)
      for (i64 p = std::max<i64>(0, t + 1 - c.window); p <= t; ++p) {
        rows.push_back(raw.data() + p * stride);
        rsc.push_back(c.raw_scale);
      }
    o.assign(static_cast<std::size_t>(H * dv), 0.0);
    l.assign(static_cast<std::size_t>(H), 0.0);
    for (i64 h = 0; h < H; ++h) {
      const float* qh = q.data() + (i * H + h) * d;
      std::vector<double> s(rows.size());
      double m = c.sinks ? sinks[static_cast<std::size_t>(h)] : -HUGE_VAL;
      for (std::size_t r = 0; r < rows.size(); ++r) {
        double dot = 0.0;
        for (i64 x = 0; x < d; ++x) dot += double{qh[x]} * phasekv::to_float(rows[r][x]);
        s[r] = double{params.scale} * rsc[r] * dot;
        m = std::max(m, s[r]);
      }
      if (m == -HUGE_VAL) {
        l[static_cast<std::size_t>(h)] = -HUGE_VAL;
        continue;
      }
      double den = c.sinks ? std::exp(double{sinks[static_cast<std::size_t>(h)]} - m) : 0.0;
      for (std::size_t r = 0; r < rows.size(); ++r) {
        const double w = std::exp(s[r] - m);
        den += w;
        for (i64 x = 0; x < dv; ++x)
          o[static_cast<std::size_t>(h * dv + x)] += w * rsc[r] * phasekv::to_float(rows[r][x]);
      }
      for (i64 x = 0; x < dv; ++x) o[static_cast<std::size_t>(h * dv + x)] /= den;
      l[static_cast<std::size_t>(h)] = m + std::log(den);
    }
  }

  // The kernel's algorithm on the host from the shared math: items in tiles of 8, the warp
  // butterfly of 32 lanes for each logit, the softmax step, f32 accumulation, the finish.
  void host_model(std::vector<float>& out, std::vector<float>& lse) const {
    const i64 H = c.heads, d = c.dim, dv = c.dim_v;
    constexpr int R = 8;
    out.assign(static_cast<std::size_t>(c.queries * H * dv), NAN);
    lse.assign(static_cast<std::size_t>(c.queries * H), NAN);
    for (i64 i = 0; i < c.queries; ++i) {
      const dsv4::SparseWindow win = dsv4::sparse_window(c.first + i, c.window);
      const i64 total = index_count + win.count;
      for (i64 h = 0; h < H; ++h) {
        const float* qh = q.data() + (i * H + h) * d;
        float m = -HUGE_VALF, den = 0.0f;
        bool bad = false;
        std::vector<float> acc(static_cast<std::size_t>(dv), 0.0f);
        for (i64 base = 0; base < total; base += R) {
          const int nt = static_cast<int>(std::min<i64>(R, total - base));
          const T* ptr[R] = {};
          float rs[R], logit[R], p[R];
          for (int r = 0; r < nt; ++r) {
            const dsv4::SparseItem it =
                dsv4::sparse_item(base + r, list(i), index_count, er.first, er.count, win);
            rs[r] = 1.0f;
            if (it.kind == dsv4::SparseItem::entry) {
              ptr[r] = er.row(it.row);
              rs[r] = er.scale;
            } else if (it.kind == dsv4::SparseItem::raw) {
              ptr[r] = rr.row(it.row);
              rs[r] = rr.scale;
            } else if (it.kind == dsv4::SparseItem::invalid) {
              bad = true;
            }
            logit[r] = -HUGE_VALF;
            if (ptr[r] == nullptr) continue;
            float lanes[32] = {};
            for (i64 x = 0; x < d; ++x)
              lanes[x % 32] = ::fmaf(qh[x], phasekv::to_float(ptr[r][x]), lanes[x % 32]);
            for (int off = 16; off >= 1; off /= 2) {
              float nv[32];
              for (int a = 0; a < 32; ++a) nv[a] = lanes[a] + lanes[a ^ off];
              std::memcpy(lanes, nv, sizeof(nv));
            }
            logit[r] = (params.scale * rs[r]) * lanes[0];
          }
          const float cc = dsv4::softmax_tile_update(m, den, logit, rs, nt, p);
          for (i64 x = 0; x < dv; ++x) {
            float a = acc[static_cast<std::size_t>(x)] * cc;
            for (int r = 0; r < nt; ++r)
              a = ::fmaf(p[r], ptr[r] ? phasekv::to_float(ptr[r][x]) : 0.0f, a);
            acc[static_cast<std::size_t>(x)] = a;
          }
        }
        const dsv4::SparseFinish f = dsv4::sparse_finish(
            m, den, c.sinks, c.sinks ? sinks[static_cast<std::size_t>(h)] : 0.0f);
        for (i64 x = 0; x < dv; ++x)
          out[static_cast<std::size_t>((i * H + h) * dv + x)] =
              bad ? NAN : (acc[static_cast<std::size_t>(x)] * f.f1) * f.f2;
        lse[static_cast<std::size_t>(i * H + h)] = bad ? NAN : f.lse;
      }
    }
  }

  // Outputs against the reference: per head, max |o - ref| <= 2e-5 * max(max |ref|, 1e-3)
  // (inputs are exact in T, only the f32 arithmetic errs: the CPU kernel's bound) and lse
  // within 2e-5 * max(1, |lse|).
  void expect_close(const std::vector<float>& out, const std::vector<float>& lse,
                    const std::string& what) const {
    for (i64 i = 0; i < c.queries; ++i) {
      std::vector<double> ro, rl;
      reference(i, ro, rl);
      for (i64 h = 0; h < c.heads; ++h) {
        double err = 0.0, mag = 0.0;
        for (i64 x = 0; x < c.dim_v; ++x) {
          const double o = out[static_cast<std::size_t>((i * c.heads + h) * c.dim_v + x)];
          ASSERT_TRUE(std::isfinite(o)) << what << " query " << i << " head " << h << " ch " << x;
          const double r = ro[static_cast<std::size_t>(h * c.dim_v + x)];
          err = std::max(err, std::abs(o - r));
          mag = std::max(mag, std::abs(r));
        }
        EXPECT_LE(err, 2e-5 * std::max(mag, 1e-3)) << what << " query " << i << " head " << h;
        const double l = lse[static_cast<std::size_t>(i * c.heads + h)];
        const double r = rl[static_cast<std::size_t>(h)];
        if (r == -HUGE_VAL)
          EXPECT_EQ(l, -HUGE_VAL) << what << " query " << i << " head " << h;
        else
          EXPECT_NEAR(l, r, 2e-5 * std::max(1.0, std::abs(r)))
              << what << " query " << i << " head " << h;
      }
    }
  }
};

// Runs the kernel on device copies into NaN-poisoned outputs.
template <class T>
void run_device(const Data<T>& h, std::vector<float>& out, std::vector<float>& lse,
                const std::vector<std::int32_t>* override_idx = nullptr) {
  auto raw = to_device(h.raw), ent = to_device(h.ent);
  auto q = to_device(h.q), sinks = to_device(h.sinks);
  auto idx = to_device(override_idx ? *override_idx : h.idx);
  DeviceBuffer<float> o(static_cast<std::size_t>(h.c.queries * h.c.heads * h.c.dim_v));
  DeviceBuffer<float> l(static_cast<std::size_t>(h.c.queries * h.c.heads));
  ASSERT_TRUE(o.ok(o.size()) && l.ok(l.size()) && raw.ok(h.raw.size()) && ent.ok(h.ent.size()));
  PKV_CUDA_OK(o.poison());
  PKV_CUDA_OK(l.poison());
  dsv4::SparseAttentionParams p = h.params;
  p.sinks = h.sinks.empty() ? nullptr : sinks.get();
  dsv4::LatentRows<T> rr = h.rr, er = h.er;
  rr.data = raw.get();
  er.data = ent.get();
  const std::int32_t* list = h.idx.empty() ? nullptr : idx.get();
  PKV_CUDA_OK(dsv4::cuda::sparse_attention<T>(p, q.get(), rr, er, list, h.index_count, h.c.first,
                                              h.c.queries, o.get(), l.get()));
  PKV_CUDA_OK(cudaDeviceSynchronize());
  PKV_CUDA_OK(o.download(out));
  PKV_CUDA_OK(l.download(lse));
}

template <class T>
void check_case(const Case& c) {
  const Data<T> h(c);
  std::vector<float> mo, ml;
  h.host_model(mo, ml);
  h.expect_close(mo, ml, c.name + " (host model)");
  if (!has_device()) GTEST_SKIP() << "no CUDA device visible (cudaGetDeviceCount)";
  std::vector<float> o1, l1, o2, l2;
  run_device(h, o1, l1);
  h.expect_close(o1, l1, c.name + " (device)");
  run_device(h, o2, l2);
  EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float))) << c.name;
  EXPECT_EQ(0, std::memcmp(l1.data(), l2.data(), l1.size() * sizeof(float))) << c.name;
}

Case make(const std::string& name, i64 heads, i64 dim, i64 dim_v, i64 window, i64 first,
          i64 queries, i64 k, bool hca, bool sinks, std::uint32_t seed) {
  Case c;
  c.name = name;
  c.heads = heads, c.dim = dim, c.dim_v = dim_v, c.window = window;
  c.first = first, c.queries = queries, c.k = k, c.hca = hca, c.sinks = sinks, c.seed = seed;
  return c;
}

// 7 tokens, one head, d 56, a window of 8 and lists of 5 over at most one entry (-1 padding).
TEST(SparseAttentionCuda, F32SevenTokensOneHead) {
  check_case<float>(make("f32 n7 H1 d56", 1, 56, 56, 8, 0, 7, 5, false, false, 11));
}

// 1000 tokens, 3 heads, d 512 / d_v 448, window 128, lists of 37, sinks.
TEST(SparseAttentionCuda, Bf16ThousandTokensThreeHeadsSinks) {
  check_case<bf16_t>(make("bf16 n1000 H3 d512", 3, 512, 448, 128, 900, 100, 37, false, true, 12));
}

// 97 tokens, 64 heads, d 576 / 512, window 16, HCA (every entry), sinks.
TEST(SparseAttentionCuda, F16NinetySevenTokens64HeadsHca) {
  check_case<f16_t>(make("f16 n97 H64 d576 hca", 64, 576, 512, 16, 96, 1, 0, true, true, 13));
}

// 1000 tokens, 128 heads, d 576 / 512, window 128, top-64 lists, FP8 with two scales, sinks.
TEST(SparseAttentionCuda, Fp8ThousandTokens128HeadsScaled) {
  Case c = make("fp8 n1000 H128 d576", 128, 576, 512, 128, 998, 2, 64, false, true, 14);
  c.raw_scale = 0.03f;
  c.entry_scale = 0.07f;
  check_case<fp8_e4m3_t>(c);
}

// One token; and nothing visible (no window, lists of -1 only) without and with a sink.
TEST(SparseAttentionCuda, OneTokenAndNothingVisible) {
  check_case<float>(make("f32 n1", 3, 56, 40, 128, 0, 1, 0, false, false, 15));
  Case c = make("f32 nothing", 3, 56, 56, 0, 2, 3, 4, false, false, 16);
  c.ratio = 1000;  // no entry is visible: every list is -1
  check_case<float>(c);
  c.name = "f32 nothing + sink";
  c.sinks = true;
  check_case<float>(c);
}

// An index outside the entries makes that query's outputs NaN; the other queries are exact.
TEST(SparseAttentionCuda, InvalidIndexGivesNanForItsQuery) {
  const Case c = make("f32 bad index", 5, 56, 56, 4, 40, 3, 6, false, true, 17);
  const Data<float> h(c);
  if (!has_device()) GTEST_SKIP() << "no CUDA device visible (cudaGetDeviceCount)";
  std::vector<float> good_o, good_l, o, l;
  run_device(h, good_o, good_l);
  std::vector<std::int32_t> bad = h.idx;
  bad[static_cast<std::size_t>(1 * c.k + 2)] = static_cast<std::int32_t>(h.J);  // query 1
  run_device(h, o, l, &bad);
  const i64 per = c.heads * c.dim_v;
  for (i64 x = 0; x < 3 * per; ++x) {
    const bool q1 = x / per == 1;
    if (q1)
      EXPECT_TRUE(std::isnan(o[static_cast<std::size_t>(x)])) << x;
    else
      EXPECT_EQ(o[static_cast<std::size_t>(x)], good_o[static_cast<std::size_t>(x)]) << x;
  }
  for (i64 x = 0; x < 3 * c.heads; ++x)
    EXPECT_EQ(std::isnan(l[static_cast<std::size_t>(x)]), x / c.heads == 1) << x;
}

// ---- host checks (no device needed) ------------------------------------------------------

// Calls the launcher with non-null fake pointers (never dereferenced: the checks come first).
struct Bad {
  dsv4::SparseAttentionParams p;
  dsv4::LatentRows<float> raw, ent;
  const float* q = reinterpret_cast<const float*>(0x1000);
  float* out = reinterpret_cast<float*>(0x2000);
  float* lse = reinterpret_cast<float*>(0x3000);
  const std::int32_t* idx = reinterpret_cast<const std::int32_t*>(0x4000);
  i64 k = 4, first = 99, queries = 2;
  Bad() {
    p.heads = 4, p.dim = 64, p.dim_v = 64, p.window = 16;
    raw = dsv4::LatentRows<float>{reinterpret_cast<const float*>(0x5000), 0, 101, 64, 1.0f};
    ent = dsv4::LatentRows<float>{reinterpret_cast<const float*>(0x6000), 0, 25, 64, 1.0f};
  }
  std::string run() const {
    const cudaError_t e =
        dsv4::cuda::sparse_attention<float>(p, q, raw, ent, idx, k, first, queries, out, lse);
    if (e != cudaErrorInvalidValue) return "status " + std::to_string(static_cast<int>(e));
    return phasekv::cuda::last_error_message();
  }
};

TEST(SparseAttentionCudaChecks, RejectedBeforeAnyCudaCall) {
  const auto expect_msg = [](const Bad& b, const char* arg) {
    const std::string m = b.run();
    EXPECT_NE(m.find(std::string(": ") + arg + " = "), std::string::npos) << "message: " << m;
    EXPECT_NE(m.find("phasekv::dsv4::cuda::sparse_attention"), std::string::npos) << m;
  };
  Bad b;
  b.p.dim = 1025, b.p.dim_v = 64;
  expect_msg(b, "params.dim");
  b = Bad(), b.p.dim = 1024, b.p.dim_v = 769;
  expect_msg(b, "params.dim_v");
  b = Bad(), b.p.dim_v = 65;
  expect_msg(b, "params.dim_v");
  b = Bad(), b.p.heads = 0;
  expect_msg(b, "params.heads");
  b = Bad(), b.p.scale = NAN;
  expect_msg(b, "params.scale");
  b = Bad(), b.q = nullptr;
  expect_msg(b, "q");
  b = Bad(), b.lse = nullptr;
  expect_msg(b, "out");
  b = Bad(), b.k = -1;
  expect_msg(b, "index_count");
  b = Bad(), b.raw.first = 90;  // the first query (t = 99, window 16) needs position 84
  expect_msg(b, "raw.first");
  b = Bad(), b.raw.count = 100;  // the last query is at position 100
  expect_msg(b, "raw.count");
  b = Bad(), b.raw.stride = 63;
  expect_msg(b, "raw.stride");
  b = Bad(), b.ent.scale = 0.0f;
  expect_msg(b, "entries.scale");
  b = Bad(), b.ent.data = nullptr;
  expect_msg(b, "entries.data");
  b = Bad(), b.idx = nullptr, b.k = 26, b.queries = 1;  // HCA over more entries than present
  expect_msg(b, "index_count");
  b = Bad(), b.idx = nullptr, b.k = 2;  // a chunk without lists and without the ratio
  expect_msg(b, "num_queries");
  b = Bad(), b.first = -1;
  expect_msg(b, "first_position");
  // the throwing form names the error type
  b = Bad();
  b.raw.count = 100;
  EXPECT_THROW(dsv4::cuda::check_sparse_attention_args<float>(b.p, b.q, b.raw, b.ent, b.idx, b.k,
                                                              b.first, b.queries, b.out, b.lse),
               phasekv::capacity_error);
  // zero queries: accepted, nothing launched (no device needed)
  b = Bad(), b.queries = 0, b.q = nullptr;
  EXPECT_EQ(dsv4::cuda::sparse_attention<float>(b.p, b.q, b.raw, b.ent, b.idx, b.k, b.first, 0,
                                                b.out, b.lse),
            cudaSuccess);
  EXPECT_STREQ(phasekv::cuda::last_error_message(), "");
}

}  // namespace
