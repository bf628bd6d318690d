// CUDA decode and prefill attention against the double-precision reference, plus host-side
// argument validation (which runs without a device).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "phasekv/attention/cuda/decode.cuh"
#include "phasekv/attention/cuda/prefill.cuh"
#include "phasekv/attention/params.hpp"
#include "phasekv/attention/reference.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/view.hpp"
#include "phasekv/phase/geometry.hpp"

namespace {

using namespace pkv_cuda_test;
using phasekv::bf16_t;
using phasekv::f16_t;
using phasekv::Geometry;
using phasekv::Layout;
using phasekv::StridedView;
using phasekv::VisibleKV;

// One test shape: a sequence of n tokens (the query sits at n - 1 for decode), KV heads,
// group size, head dims, geometry, local window and variant switches.
struct Shape {
  i64 n = 1;
  i64 kv_heads = 1;
  i64 group = 1;
  i64 d_k = 64;
  i64 d_v = 64;
  Geometry geo{8, 8, 0};
  i64 local = 0;
  int splits = 0;
  bool softcap = false;
  bool entry_bias = false;
  bool sink = false;
  Layout layout = Layout::NHD;
  bool misalign = false;  // offset the K/V base by one element: no 16-byte loads
};

std::string describe(const Shape& s) {
  std::string r = "n=" + std::to_string(s.n) + " kvh=" + std::to_string(s.kv_heads) +
                  " G=" + std::to_string(s.group) + " dk=" + std::to_string(s.d_k) +
                  " dv=" + std::to_string(s.d_v) + " W=" + std::to_string(s.geo.window()) +
                  " S=" + std::to_string(s.geo.stride()) + " O=" + std::to_string(s.geo.origin()) +
                  " L=" + std::to_string(s.local) + " splits=" + std::to_string(s.splits);
  if (s.softcap) r += " softcap";
  if (s.entry_bias) r += " bias";
  if (s.sink) r += " sink";
  if (s.layout == Layout::HND) r += " HND";
  if (s.misalign) r += " misaligned";
  return r;
}

// Raw K/V of `tokens` positions and the entries of the complete windows, on host and device
// with identical layouts.
template <class T>
struct Cache {
  std::vector<T> rk, rv, ek, ev;
  DeviceBuffer<T> drk, drv, dek, dev;
  StridedView<const T> hrk, hrv, hek, hev;  // host views
  StridedView<const T> vrk, vrv, vek, vev;  // device views

  Cache(std::mt19937_64& rng, const Shape& s, i64 tokens) {
    const i64 entries = s.geo.complete_windows(tokens);
    const i64 off = s.misalign ? 1 : 0;
    auto make = [&](std::vector<T>& h, DeviceBuffer<T>& d, StridedView<const T>& hv,
                    StridedView<const T>& dv, i64 t, i64 dim) {
      h = random_elems<T>(rng, static_cast<std::size_t>(t * s.kv_heads * dim + off));
      d = to_device(h);
      hv = phasekv::make_view<const T>(h.data() + off, t, s.kv_heads, dim, s.layout);
      dv = rebase<T, T>(hv, d.get(), h.data());
    };
    make(rk, drk, hrk, vrk, tokens, s.d_k);
    make(rv, drv, hrv, vrv, tokens, s.d_v);
    make(ek, dek, hek, vek, entries, s.d_k);
    make(ev, dev, hev, vev, entries, s.d_v);
  }
};

template <class T>
VisibleKV<T> rebase_kv(const VisibleKV<T>& h, const Cache<T>& c) {
  VisibleKV<T> d = h;
  for (int i = 0; i < h.count; ++i) {
    const auto& seg = h.segments[i];
    const bool entry = seg.kind == phasekv::SegmentKind::compressed;
    const T* hk = entry ? c.ek.data() : c.rk.data();
    const T* hv = entry ? c.ev.data() : c.rv.data();
    d.segments[i].keys = rebase<T, T>(seg.keys, entry ? c.dek.get() : c.drk.get(), hk);
    d.segments[i].values = rebase<T, T>(seg.values, entry ? c.dev.get() : c.drv.get(), hv);
  }
  return d;
}

phasekv::StandardVariant make_variant(const Shape& s, const float* sinks) {
  phasekv::StandardVariant v;
  v.scale = phasekv::default_scale(s.d_k);
  if (s.softcap) v.softcap = 1.5f;
  if (s.entry_bias) v.entry_bias = std::log(static_cast<float>(s.geo.window()));
  v.sinks = s.sink ? sinks : nullptr;
  return v;
}

// |got - want| <= tol * (1 + |want|) (values and outputs are O(1)); both -inf also passes.
bool close(double got, double want, double tol) {
  if (std::isinf(want) && std::isinf(got) && (want < 0) == (got < 0)) return true;
  return std::fabs(got - want) <= tol * (1.0 + std::fabs(want));
}

template <class T, class OutT = float>
void check_decode(const Shape& s, std::uint64_t seed, double tol) {
  SCOPED_TRACE(describe(s) + " T=" + phasekv::element_traits<T>::name +
               " Out=" + phasekv::element_traits<OutT>::name);
  std::mt19937_64 rng(seed);
  Cache<T> c(rng, s, s.n);
  const i64 qh = s.kv_heads * s.group;
  const std::vector<float> q = random_elems<float>(rng, static_cast<std::size_t>(qh * s.d_k));
  const std::vector<float> sinks =
      random_elems<float>(rng, static_cast<std::size_t>(qh), -2.0f, 2.0f);
  const VisibleKV<T> hkv =
      phasekv::reference_visible<T>(s.geo, s.local, s.n - 1, c.hrk, c.hrv, c.hek, c.hev);
  std::vector<double> ref(static_cast<std::size_t>(qh * s.d_v), 0.0), ref_lse(qh);
  phasekv::reference_decode<T>(q.data(), qh, hkv, make_variant(s, sinks.data()), ref.data(),
                               ref_lse.data());

  DeviceBuffer<float> dq = to_device(q), dsinks = to_device(sinks);
  DeviceBuffer<OutT> dout(static_cast<std::size_t>(qh * s.d_v));
  DeviceBuffer<float> dlse(static_cast<std::size_t>(qh));
  PKV_CUDA_OK(dout.poison());
  PKV_CUDA_OK(dlse.poison());
  phasekv::cuda::DecodeArgs<T, OutT> a;
  a.q = dq.get();
  a.q_heads = qh;
  a.kv_heads = s.kv_heads;
  a.d_k = s.d_k;
  a.d_v = s.d_v;
  a.kv = rebase_kv(hkv, c);
  a.variant = make_variant(s, dsinks.get());
  a.out = dout.get();
  a.lse = dlse.get();
  a.num_splits = s.splits;
  std::size_t bytes = 0;
  PKV_CUDA_OK(phasekv::cuda::decode(a, nullptr, bytes));
  ASSERT_GT(bytes, 0u);
  DeviceBuffer<unsigned char> ws(bytes);
  PKV_CUDA_OK(ws.poison());
  PKV_CUDA_OK(phasekv::cuda::decode(a, ws.get(), bytes));
  PKV_CUDA_OK(cudaDeviceSynchronize());
  std::vector<OutT> out;
  std::vector<float> lse;
  PKV_CUDA_OK(dout.download(out));
  PKV_CUDA_OK(dlse.download(lse));
  int bad = 0;
  for (i64 h = 0; h < qh && bad < 5; ++h) {
    if (!close(lse[h], ref_lse[h], tol)) {
      ADD_FAILURE() << "lse h=" << h << " got " << lse[h] << " want " << ref_lse[h];
      ++bad;
    }
    for (i64 i = 0; i < s.d_v && bad < 5; ++i) {
      const double got = phasekv::to_float(out[h * s.d_v + i]);
      const double want = ref[h * s.d_v + i];
      if (!close(got, want, tol)) {
        ADD_FAILURE() << "out h=" << h << " i=" << i << " got " << got << " want " << want;
        ++bad;
      }
    }
  }
}

// Shapes covering lengths 1, 7, 97, 1000, groups 1, 3, 5, 8, head dims 56..256, gaps,
// tiling, overlap, prefixes, local windows, splits and variants.
std::vector<Shape> decode_shapes() {
  const Geometry geos[] = {Geometry(2, 5, 3), Geometry(8, 8, 0), Geometry(8, 4, 2),
                           Geometry(1, 3, 0), Geometry(16, 16, 4)};
  const i64 dims[] = {56, 64, 96, 128, 256};
  const i64 lengths[] = {1, 7, 97, 1000};
  const i64 groups[] = {1, 3, 5, 8};
  const i64 locals[] = {0, 16, 5};
  const int splits[] = {0, 1, 3};
  std::vector<Shape> v;
  int k = 0;
  for (i64 n : lengths)
    for (i64 g : groups) {
      Shape s;
      s.n = n;
      s.group = g;
      s.kv_heads = 1 + k % 3;
      s.d_k = s.d_v = dims[k % 5];
      s.geo = geos[k % 5];
      s.local = locals[k % 3];
      s.splits = splits[k % 3];
      s.softcap = k % 4 == 1;
      s.entry_bias = k % 3 == 2;
      s.sink = k % 5 == 3;
      ++k;
      v.push_back(s);
    }
  Shape s;
  s.n = 300;
  s.kv_heads = 2;
  s.group = 3;
  s.d_k = 96;
  s.d_v = 64;  // d_k != d_v
  s.geo = Geometry(8, 4, 1);
  s.local = 32;
  v.push_back(s);
  s.d_k = 64;
  s.d_v = 128;
  s.layout = Layout::HND;
  s.sink = true;
  v.push_back(s);
  s.misalign = true;  // scalar loads
  s.d_k = 57;
  s.d_v = 33;
  s.layout = Layout::NHD;
  v.push_back(s);
  s = Shape{};
  s.n = 1000;
  s.group = 16;  // two blocks per KV head
  s.d_k = s.d_v = 128;
  s.geo = Geometry(8, 4, 0);
  s.local = 128;
  s.splits = 40;
  s.softcap = s.entry_bias = s.sink = true;
  v.push_back(s);
  s = Shape{};
  s.n = 0;  // nothing visible
  s.group = 3;
  v.push_back(s);
  s.sink = true;
  v.push_back(s);
  return v;
}

class CudaDecode : public DeviceTest {};

TEST_F(CudaDecode, F32MatchesReference) {
  std::uint64_t seed = 100;
  for (const Shape& s : decode_shapes()) check_decode<float>(s, seed++, 1e-5);
}

// bf16/f16 K/V are exactly representable in float and the kernel computes in f32 with a float
// output, so the f32 tolerance applies (tighter than the 1e-2 a rounded output would need).
TEST_F(CudaDecode, Bf16MatchesReference) {
  std::uint64_t seed = 200;
  for (const Shape& s : decode_shapes()) check_decode<bf16_t>(s, seed++, 1e-5);
}

TEST_F(CudaDecode, F16MatchesReference) {
  std::uint64_t seed = 300;
  for (const Shape& s : decode_shapes()) check_decode<f16_t>(s, seed++, 1e-5);
}

// A bf16 output is the f32 result rounded once: relative error <= 2^-8 < 1e-2.
TEST_F(CudaDecode, Bf16OutputMatchesReference) {
  std::uint64_t seed = 400;
  for (const Shape& s : decode_shapes()) check_decode<bf16_t, bf16_t>(s, seed++, 1e-2);
}

// ---------------------------------------------------------------------------------------------
// Prefill
// ---------------------------------------------------------------------------------------------

struct PrefillShape {
  Shape s;
  i64 first = 0;
  i64 num_queries = 1;
  phasekv::cuda::PrefillPath path = phasekv::cuda::PrefillPath::generic;
};

// Error bound of the tensor-core path for one (query, head) row (see docs/cuda.md): the query
// is rounded to T (unit roundoff u) before the multiplication, which moves each logit by at most
// eps = scale * u * max_t sum_i |q_i k_ti| (the soft cap is 1-Lipschitz, the bias exact); the
// weights are rounded to T before P V (relative u; f16 adds absolute underflow terms). Then
// |o - o_ref| <= max|v| * (exp(2 eps) (1 + u) - 1) and |lse - lse_ref| <= eps, plus the f32
// slack of the generic path. A sink only rescales by a factor whose relative change is <= eps.
struct RowBound {
  double out = 0.0;
  double lse = 0.0;
};

template <class T>
RowBound mma_bound(const VisibleKV<T>& kv, const float* q, i64 kh, i64 d_k, float scale,
                   bool sink) {
  const bool f16 = phasekv::element_traits<T>::kind == phasekv::ElementKind::f16;
  const double u = f16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  // f16 also underflows: values below 2^-14 round with an absolute error <= 2^-25 instead of
  // a relative one (bf16 has the float exponent range: no such term).
  const double tiny = f16 ? std::ldexp(1.0, -25) : 0.0;
  double a_max = 0.0, v_max = 0.0, k_abs_max = 0.0;
  i64 items = 0;
  for (int s = 0; s < kv.count; ++s) {
    const auto& seg = kv.segments[s];
    items += seg.size();
    for (i64 t = 0; t < seg.size(); ++t) {
      double a = 0.0, k_abs = 0.0;
      for (i64 i = 0; i < d_k; ++i) {
        const double k = phasekv::to_float(seg.keys(t, kh, i));
        a += std::fabs(static_cast<double>(q[i]) * k);
        k_abs += std::fabs(k);
      }
      a_max = std::max(a_max, a);
      k_abs_max = std::max(k_abs_max, k_abs);
      for (i64 i = 0; i < seg.values.dim; ++i)
        v_max = std::max(v_max,
                         std::fabs(static_cast<double>(phasekv::to_float(seg.values(t, kh, i)))));
    }
  }
  const double eps = std::fabs(static_cast<double>(scale)) * (u * a_max + tiny * k_abs_max);
  RowBound b;
  // Each weight p <= 1 after the max shift also loses up to `tiny` absolutely when rounded.
  b.out = v_max * (std::exp(2.0 * eps) * (1.0 + u) - 1.0 + (sink ? eps : 0.0) +
                   tiny * static_cast<double>(items));
  b.lse = eps;
  return b;
}

template <class T>
void check_prefill(const PrefillShape& p, std::uint64_t seed) {
  const Shape& s = p.s;
  const bool mma = p.path != phasekv::cuda::PrefillPath::generic;
  SCOPED_TRACE(describe(s) + " first=" + std::to_string(p.first) +
               " nq=" + std::to_string(p.num_queries) + " T=" + phasekv::element_traits<T>::name +
               (mma ? " tensor-core" : " generic"));
  std::mt19937_64 rng(seed);
  const i64 tokens = p.first + p.num_queries;
  Cache<T> c(rng, s, tokens);
  const i64 qh = s.kv_heads * s.group;
  const std::vector<float> q =
      random_elems<float>(rng, static_cast<std::size_t>(p.num_queries * qh * s.d_k));
  const std::vector<float> sinks =
      random_elems<float>(rng, static_cast<std::size_t>(qh), -2.0f, 2.0f);
  const phasekv::StandardVariant hv = make_variant(s, sinks.data());
  std::vector<double> ref(static_cast<std::size_t>(p.num_queries * qh * s.d_v), 0.0);
  std::vector<double> ref_lse(static_cast<std::size_t>(p.num_queries * qh));
  phasekv::reference_prefill<T>(q.data(), p.num_queries, qh, p.first, s.geo, s.local, c.hrk, c.hrv,
                                c.hek, c.hev, hv, ref.data(), ref_lse.data());

  DeviceBuffer<float> dq = to_device(q), dsinks = to_device(sinks);
  DeviceBuffer<float> dout(ref.size()), dlse(ref_lse.size());
  PKV_CUDA_OK(dout.poison());
  PKV_CUDA_OK(dlse.poison());
  phasekv::cuda::PrefillArgs<T> a;
  a.q = dq.get();
  a.num_queries = p.num_queries;
  a.q_heads = qh;
  a.first = p.first;
  a.geometry = s.geo;
  a.local = s.local;
  a.raw_k = c.vrk;
  a.raw_v = c.vrv;
  a.entry_k = c.vek;
  a.entry_v = c.vev;
  a.variant = make_variant(s, dsinks.get());
  a.out = dout.get();
  a.lse = dlse.get();
  a.path = p.path;
  const cudaError_t e = phasekv::cuda::prefill(a);
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << " " << phasekv::cuda::last_error_message();
  PKV_CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> out, lse;
  PKV_CUDA_OK(dout.download(out));
  PKV_CUDA_OK(dlse.download(lse));
  int bad = 0;
  for (i64 t = 0; t < p.num_queries && bad < 5; ++t) {
    VisibleKV<T> kv;
    if (mma)
      kv = phasekv::reference_visible<T>(s.geo, s.local, p.first + t, c.hrk, c.hrv, c.hek, c.hev);
    for (i64 h = 0; h < qh && bad < 5; ++h) {
      const i64 row = t * qh + h;
      RowBound b;
      if (mma) b = mma_bound(kv, q.data() + row * s.d_k, h / s.group, s.d_k, hv.scale, s.sink);
      const double tol = 1e-5;
      if (!(std::isinf(ref_lse[row]) && std::isinf(lse[row]) && lse[row] < 0) &&
          !(std::fabs(lse[row] - ref_lse[row]) <= b.lse + tol * (1.0 + std::fabs(ref_lse[row])))) {
        ADD_FAILURE() << "lse t=" << t << " h=" << h << " got " << lse[row] << " want "
                      << ref_lse[row] << " bound " << b.lse;
        ++bad;
      }
      for (i64 i = 0; i < s.d_v && bad < 5; ++i) {
        const double got = out[row * s.d_v + i], want = ref[row * s.d_v + i];
        if (!(std::fabs(got - want) <= b.out + tol * (1.0 + std::fabs(want)))) {
          ADD_FAILURE() << "out t=" << t << " h=" << h << " i=" << i << " got " << got << " want "
                        << want << " bound " << b.out;
          ++bad;
        }
      }
    }
  }
}

std::vector<PrefillShape> prefill_shapes(bool tensor_core) {
  const Geometry geos[] = {Geometry(2, 5, 3), Geometry(8, 8, 0), Geometry(8, 4, 2),
                           Geometry(16, 16, 4)};
  const i64 generic_dims[] = {56, 64, 96, 128, 256};
  const i64 mma_dims[] = {64, 128, 256};
  const i64 counts[] = {1, 7, 97, 200};
  const i64 firsts[] = {0, 5, 90, 0};
  const i64 groups[] = {1, 3, 5, 8};
  const i64 locals[] = {0, 16, 5};
  std::vector<PrefillShape> v;
  int k = 0;
  for (int a = 0; a < 4; ++a)
    for (i64 g : groups) {
      PrefillShape p;
      p.num_queries = counts[a];
      p.first = firsts[(a + k) % 4];
      p.s.group = g;
      p.s.kv_heads = 1 + k % 2;
      p.s.d_k = p.s.d_v = tensor_core ? mma_dims[k % 3] : generic_dims[k % 5];
      p.s.geo = geos[k % 4];
      p.s.local = locals[k % 3];
      p.s.softcap = k % 4 == 1;
      p.s.entry_bias = k % 3 == 2;
      p.s.sink = k % 5 == 3;
      p.s.layout = k % 7 == 4 ? Layout::HND : Layout::NHD;
      p.path = tensor_core ? phasekv::cuda::PrefillPath::tensor_core
                           : phasekv::cuda::PrefillPath::generic;
      ++k;
      v.push_back(p);
    }
  if (!tensor_core) {
    PrefillShape p;
    p.num_queries = 50;
    p.first = 3;
    p.s.kv_heads = 2;
    p.s.group = 2;
    p.s.d_k = 72;
    p.s.d_v = 40;  // d_k != d_v
    p.s.geo = Geometry(4, 2, 1);
    p.s.local = 8;
    p.s.misalign = true;
    v.push_back(p);
  } else {
    PrefillShape p;  // misaligned: tensor cores with scalar loads
    p.num_queries = 70;
    p.first = 10;
    p.s.group = 4;
    p.s.d_k = p.s.d_v = 64;
    p.s.geo = Geometry(8, 4, 0);
    p.s.local = 16;
    p.s.misalign = true;
    p.s.sink = true;
    v.push_back(p);
  }
  return v;
}

class CudaPrefill : public DeviceTest {};

TEST_F(CudaPrefill, GenericF32MatchesReference) {
  std::uint64_t seed = 500;
  for (const auto& p : prefill_shapes(false)) check_prefill<float>(p, seed++);
}
TEST_F(CudaPrefill, GenericBf16MatchesReference) {
  std::uint64_t seed = 600;
  for (const auto& p : prefill_shapes(false)) check_prefill<bf16_t>(p, seed++);
}
TEST_F(CudaPrefill, GenericF16MatchesReference) {
  std::uint64_t seed = 700;
  for (const auto& p : prefill_shapes(false)) check_prefill<f16_t>(p, seed++);
}
TEST_F(CudaPrefill, TensorCoreBf16WithinDerivedBound) {
  std::uint64_t seed = 800;
  for (const auto& p : prefill_shapes(true)) check_prefill<bf16_t>(p, seed++);
}
TEST_F(CudaPrefill, TensorCoreF16WithinDerivedBound) {
  std::uint64_t seed = 900;
  for (const auto& p : prefill_shapes(true)) check_prefill<f16_t>(p, seed++);
}

// ---------------------------------------------------------------------------------------------
// Argument validation: host only, runs without a device.
// ---------------------------------------------------------------------------------------------

phasekv::cuda::DecodeArgs<bf16_t> good_decode_args() {
  // Fake, never dereferenced device addresses (validation only inspects values).
  static const bf16_t* base = reinterpret_cast<const bf16_t*>(std::uintptr_t{1} << 20);
  phasekv::cuda::DecodeArgs<bf16_t> a;
  a.q = reinterpret_cast<const float*>(std::uintptr_t{1} << 21);
  a.out = reinterpret_cast<float*>(std::uintptr_t{1} << 22);
  a.q_heads = 8;
  a.kv_heads = 2;
  a.d_k = 128;
  a.d_v = 128;
  a.variant.scale = 0.1f;
  const auto v = phasekv::make_view(base, 100, 2, 128);
  a.kv.push({v, v, 0, phasekv::SegmentKind::raw});
  return a;
}

void expect_decode_rejects(const phasekv::cuda::DecodeArgs<bf16_t>& a, const std::string& name) {
  std::size_t bytes = 0;
  EXPECT_EQ(phasekv::cuda::decode(a, nullptr, bytes), cudaErrorInvalidValue) << name;
  EXPECT_NE(std::string(phasekv::cuda::last_error_message()).find(name), std::string::npos)
      << phasekv::cuda::last_error_message();
  EXPECT_THROW(phasekv::cuda::check_decode_args(a), phasekv::invalid_argument) << name;
}

TEST(CudaValidation, DecodeWorkspaceQueryNeedsNoDevice) {
  auto a = good_decode_args();
  std::size_t bytes = 0;
  EXPECT_EQ(phasekv::cuda::decode(a, nullptr, bytes), cudaSuccess)
      << phasekv::cuda::last_error_message();
  EXPECT_GT(bytes, 0u);
  EXPECT_STREQ(phasekv::cuda::last_error_message(), "");
  // More splits need more workspace; the size depends on the plan only.
  a.num_splits = 1;
  std::size_t one = 0;
  ASSERT_EQ(phasekv::cuda::decode(a, nullptr, one), cudaSuccess);
  a.num_splits = 2;
  std::size_t two = 0;
  ASSERT_EQ(phasekv::cuda::decode(a, nullptr, two), cudaSuccess);
  EXPECT_GT(two, one);
}

TEST(CudaValidation, DecodeRejectsBadArguments) {
  auto a = good_decode_args();
  a.q_heads = 7;
  expect_decode_rejects(a, "q_heads");
  a = good_decode_args();
  a.kv_heads = 0;
  expect_decode_rejects(a, "kv_heads");
  a = good_decode_args();
  a.d_k = 0;
  expect_decode_rejects(a, "d_k");
  a = good_decode_args();
  a.d_v = 64;  // segments have 128
  expect_decode_rejects(a, "values.dim");
  a = good_decode_args();
  a.q = nullptr;
  expect_decode_rejects(a, "q");
  a = good_decode_args();
  a.out = nullptr;
  expect_decode_rejects(a, "out");
  a = good_decode_args();
  a.num_splits = -1;
  expect_decode_rejects(a, "num_splits");
  a = good_decode_args();
  a.variant.softcap = -1.0f;
  expect_decode_rejects(a, "variant.softcap");
  a = good_decode_args();
  a.kv.segments[0].keys.heads = 3;
  expect_decode_rejects(a, "keys.heads");
  a = good_decode_args();
  a.kv.segments[0].values.tokens = 99;
  expect_decode_rejects(a, "values.tokens");
  a = good_decode_args();
  a.d_k = a.d_v = 4000;
  a.kv.segments[0].keys.dim = a.kv.segments[0].values.dim = 4000;
  expect_decode_rejects(a, "d_k + d_v");
}

TEST(CudaValidation, DecodeRejectsSmallOrMisalignedWorkspace) {
  const auto a = good_decode_args();
  std::size_t need = 0;
  ASSERT_EQ(phasekv::cuda::decode(a, nullptr, need), cudaSuccess);
  void* fake = reinterpret_cast<void*>(std::uintptr_t{1} << 24);
  std::size_t small = need - 1;
  EXPECT_EQ(phasekv::cuda::decode(a, fake, small), cudaErrorInvalidValue);
  EXPECT_NE(std::string(phasekv::cuda::last_error_message()).find("workspace_bytes"),
            std::string::npos);
  void* odd = reinterpret_cast<void*>((std::uintptr_t{1} << 24) + 8);
  EXPECT_EQ(phasekv::cuda::decode(a, odd, need), cudaErrorInvalidValue);
  EXPECT_NE(std::string(phasekv::cuda::last_error_message()).find("aligned"), std::string::npos);
}

phasekv::cuda::PrefillArgs<float> good_prefill_args() {
  static const float* base = reinterpret_cast<const float*>(std::uintptr_t{1} << 20);
  phasekv::cuda::PrefillArgs<float> a;
  a.q = reinterpret_cast<const float*>(std::uintptr_t{1} << 21);
  a.out = reinterpret_cast<float*>(std::uintptr_t{1} << 22);
  a.num_queries = 10;
  a.q_heads = 6;
  a.first = 20;
  a.geometry = Geometry(8, 4, 0);
  a.local = 4;
  a.raw_k = a.raw_v = phasekv::make_view(base, 30, 2, 64);
  a.entry_k = a.entry_v = phasekv::make_view(base, 6, 2, 64);  // J(30) = 6
  return a;
}

void expect_prefill_rejects(const phasekv::cuda::PrefillArgs<float>& a, const std::string& name) {
  EXPECT_EQ(phasekv::cuda::prefill(a), cudaErrorInvalidValue) << name;
  EXPECT_NE(std::string(phasekv::cuda::last_error_message()).find(name), std::string::npos)
      << phasekv::cuda::last_error_message();
  EXPECT_THROW(phasekv::cuda::check_prefill_args(a), phasekv::invalid_argument) << name;
}

TEST(CudaValidation, PrefillRejectsBadArguments) {
  EXPECT_NO_THROW(phasekv::cuda::check_prefill_args(good_prefill_args()));
  auto a = good_prefill_args();
  a.raw_k.tokens = 29;
  expect_prefill_rejects(a, "raw_k.tokens");
  a = good_prefill_args();
  a.entry_k.tokens = 5;
  expect_prefill_rejects(a, "entry_k.tokens");
  a = good_prefill_args();
  a.q_heads = 5;
  expect_prefill_rejects(a, "raw_k.heads");
  a = good_prefill_args();
  a.num_queries = -1;
  expect_prefill_rejects(a, "num_queries");
  a = good_prefill_args();
  a.local = -2;
  expect_prefill_rejects(a, "local");
  a = good_prefill_args();
  a.entry_v.dim = 32;
  expect_prefill_rejects(a, "entry_v.dim");
  a = good_prefill_args();
  a.path = phasekv::cuda::PrefillPath::tensor_core;  // f32 has no tensor-core path
  expect_prefill_rejects(a, "path");
  a = good_prefill_args();
  a.out = nullptr;
  expect_prefill_rejects(a, "out");
}

TEST(CudaValidation, PrefillWithNoQueriesIsANoOp) {
  auto a = good_prefill_args();
  a.num_queries = 0;
  a.q = nullptr;
  a.out = nullptr;
  EXPECT_EQ(phasekv::cuda::prefill(a), cudaSuccess) << phasekv::cuda::last_error_message();
}

}  // namespace
