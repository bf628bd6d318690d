// Numeric extremes (docs/errors.md, "Numeric extremes"): huge logits, soft cap, an entry bias
// of -inf, every key masked, NaN and Inf in the inputs, entry stores that overflow bf16/f16,
// and lengths near the documented maxima. The attention cases run with every instruction set
// this binary has and the CPU runs (explicit tags and arch::Auto); CTest also reruns the
// compression cases with PHASEKV_ARCH=scalar and avx2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "phasekv/attention/cpu/cpu_features.hpp"
#include "phasekv/attention/cpu/decode.hpp"
#include "phasekv/attention/cpu/prefill.hpp"
#include "phasekv/attention/cpu/visibility_rule.hpp"
#include "phasekv/attention/reference.hpp"
#include "phasekv/compress/compress_batch.hpp"
#include "phasekv/compress/compressed_cache.hpp"
#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/compress/uniform_mean.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/phase/geometry.hpp"

namespace {

using i64 = std::int64_t;
namespace cpu = phasekv::cpu;
using phasekv::bf16_t;
using phasekv::f16_t;
constexpr float kInf = std::numeric_limits<float>::infinity();

template <class T>
constexpr double tolerance() {
  return std::is_same<T, float>::value ? 1e-5 : 1e-2;
}

// A decode / prefill problem: n tokens, W8/S4/O2 with local window 12, GQA 3, d 64.
template <class T>
struct Problem {
  i64 n = 203, hkv = 2, G = 3, d = 64, L = 12;
  phasekv::Geometry g{8, 4, 2};
  std::vector<T> rk, rv, ek, ev;
  std::vector<float> q;
  phasekv::StandardVariant variant;

  explicit Problem(std::uint32_t seed, i64 tokens = 203,
                   phasekv::Geometry geometry = phasekv::Geometry(8, 4, 2), i64 local = 12)
      : n(tokens), L(local), g(geometry) {
    const i64 J = std::max<i64>(g.complete_windows(n), 1);
    const i64 nr = std::max<i64>(n, 1);
    rk = normal(nr * hkv * d, seed, 1.0f);
    rv = normal(nr * hkv * d, seed + 1, 0.25f);
    ek = normal(J * hkv * d, seed + 2, 1.0f);
    ev = normal(J * hkv * d, seed + 3, 0.25f);
    std::mt19937 rng(seed + 4);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    q.resize(static_cast<std::size_t>(std::max<i64>(n, 1) * hkv * G * d));
    for (auto& x : q) x = dist(rng);
    variant.scale = phasekv::default_scale(d);
  }
  static std::vector<T> normal(i64 count, std::uint32_t seed, float sd) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, sd);
    std::vector<T> v(static_cast<std::size_t>(count));
    for (auto& x : v) x = phasekv::from_float<T>(dist(rng));
    return v;
  }
  using CV = phasekv::StridedView<const T>;
  CV raw_k() const { return phasekv::make_view<const T>(rk.data(), n, hkv, d); }
  CV raw_v() const { return phasekv::make_view<const T>(rv.data(), n, hkv, d); }
  CV ent_k() const { return phasekv::make_view<const T>(ek.data(), g.complete_windows(n), hkv, d); }
  CV ent_v() const { return phasekv::make_view<const T>(ev.data(), g.complete_windows(n), hkv, d); }
  phasekv::VisibleKV<T> visible() const {
    return cpu::VisibilityRule::compressed(g, L).visible_kv<T>(n, raw_k(), raw_v(), ent_k(),
                                                               ent_v());
  }
  // The largest |<q_h, k>| over the visible keys, in double.
  double max_abs_dot() const {
    const phasekv::VisibleKV<T> kv = visible();
    double m = 0.0;
    for (i64 h = 0; h < hkv * G; ++h)
      for (int s = 0; s < kv.count; ++s)
        for (i64 t = 0; t < kv.segments[s].size(); ++t) {
          const T* k = kv.segments[s].keys.ptr(t, h / G);
          double dot = 0.0;
          for (i64 i = 0; i < d; ++i)
            dot += static_cast<double>(q[static_cast<std::size_t>(h * d + i)]) *
                   phasekv::to_float(k[i]);
          m = std::max(m, std::abs(dot));
        }
    return m;
  }
};

struct Result {
  std::vector<float> out, lse;
};

template <class A, class T, class V>
Result run_decode(const Problem<T>& p, const phasekv::VisibleKV<T>& kv, const V& variant,
                  int parts = 1) {
  cpu::DecodeArgs<T, V> a;
  a.q = p.q.data();
  a.q_heads = p.hkv * p.G;
  a.kv_heads = p.hkv;
  a.d_k = p.d;
  a.d_v = p.d;
  a.kv = kv;
  a.variant = variant;
  Result r;
  r.out.assign(static_cast<std::size_t>(a.q_heads * p.d), std::nanf("1"));
  r.lse.assign(static_cast<std::size_t>(a.q_heads), std::nanf("1"));
  a.out = r.out.data();
  a.lse = r.lse.data();
  if (parts == 1) {
    cpu::decode<A>(a);
  } else {
    std::vector<unsigned char> ws(cpu::decode_workspace_size(a, parts));
    for (int i = 0; i < parts; ++i) cpu::decode_partition<A>(a, ws.data(), ws.size(), i, parts);
    cpu::decode_merge(a, ws.data(), ws.size(), parts);
  }
  return r;
}

// Prefill of the last `nq` queries.
template <class A, class T, class V>
Result run_prefill(const Problem<T>& p, const V& variant, i64 nq) {
  cpu::PrefillArgs<T, V> a;
  a.q = p.q.data();
  a.num_queries = nq;
  a.q_heads = p.hkv * p.G;
  a.kv_heads = p.hkv;
  a.d_k = p.d;
  a.d_v = p.d;
  a.first = p.n - nq;
  a.rule = cpu::VisibilityRule::compressed(p.g, p.L);
  a.raw_k = p.raw_k();
  a.raw_v = p.raw_v();
  a.entry_k = p.ent_k();
  a.entry_v = p.ent_v();
  a.variant = variant;
  Result r;
  r.out.assign(static_cast<std::size_t>(nq * a.q_heads * p.d), std::nanf("1"));
  r.lse.assign(static_cast<std::size_t>(nq * a.q_heads), std::nanf("1"));
  a.out = r.out.data();
  a.lse = r.lse.data();
  cpu::prefill<A>(a);
  return r;
}

struct Ref {
  std::vector<double> out, lse;
};

template <class T, class V>
Ref reference(const Problem<T>& p, const phasekv::VisibleKV<T>& kv, const V& variant,
              const float* q) {
  Ref r;
  r.out.resize(static_cast<std::size_t>(p.hkv * p.G * p.d));
  r.lse.resize(static_cast<std::size_t>(p.hkv * p.G));
  phasekv::reference_decode<T>(q, p.hkv * p.G, kv, variant, r.out.data(), r.lse.data());
  return r;
}

// out within `otol` x max|v| (0.25 sd values: about 1) of the reference, lse within
// tolerance<T>() relative to max(1, |lse|), everything finite.
template <class T>
void expect_close(const Result& r, const Ref& ref, double otol, const std::string& what,
                  std::size_t row0 = 0) {
  const std::size_t d = ref.out.size() / ref.lse.size();
  for (std::size_t h = 0; h < ref.lse.size(); ++h) {
    const float lse = r.lse[row0 + h];
    ASSERT_TRUE(std::isfinite(lse)) << what << " head " << h << " lse " << lse;
    ASSERT_LE(std::abs(lse - ref.lse[h]), tolerance<T>() * std::max(1.0, std::abs(ref.lse[h])))
        << what << " head " << h << " lse " << lse << " reference " << ref.lse[h];
    for (std::size_t i = 0; i < d; ++i) {
      const float o = r.out[(row0 + h) * d + i];
      ASSERT_TRUE(std::isfinite(o)) << what << " head " << h;
      ASSERT_LE(std::abs(o - ref.out[h * d + i]), otol) << what << " head " << h << " ch " << i;
    }
  }
}

// Nothing attended: zeros and lse -inf (or the sink's logit with a sink).
void expect_empty(const Result& r, const std::string& what, const float* sinks = nullptr) {
  const std::size_t d = r.out.size() / r.lse.size();
  for (std::size_t h = 0; h < r.lse.size(); ++h) {
    if (sinks)
      EXPECT_EQ(r.lse[h], sinks[h]) << what << " head " << h;
    else
      EXPECT_TRUE(std::isinf(r.lse[h]) && r.lse[h] < 0)
          << what << " head " << h << " lse " << r.lse[h];
    for (std::size_t i = 0; i < d; ++i)
      ASSERT_EQ(r.out[h * d + i], 0.0f) << what << " head " << h << " ch " << i;
  }
}

// A user variant that masks keys: every key of the masked kinds gets the logit -inf.
struct MaskVariant {
  float scale = 0.125f;
  bool mask_raw = true, mask_entries = true;
  const float* sinks = nullptr;
  float logit(float dot, phasekv::SegmentKind kind) const {
    const bool entry = kind == phasekv::SegmentKind::compressed;
    if ((entry && mask_entries) || (!entry && mask_raw)) return -kInf;
    return scale * dot;
  }
  bool has_sink() const { return sinks != nullptr; }
  float sink(i64 h) const { return sinks[h]; }
};

// The visible set without its compressed segment (what an entry bias of -inf leaves).
template <class T>
phasekv::VisibleKV<T> without_entries(const phasekv::VisibleKV<T>& kv) {
  phasekv::VisibleKV<T> out;
  for (int s = 0; s < kv.count; ++s)
    if (kv.segments[s].kind != phasekv::SegmentKind::compressed) out.push(kv.segments[s]);
  return out;
}

template <class A, class T>
struct Param {
  using Arch = A;
  using Elem = T;
};

template <class P>
class Extremes : public ::testing::Test {};

using Params = ::testing::Types<Param<cpu::arch::Scalar, float>, Param<cpu::arch::Scalar, bf16_t>,
                                Param<cpu::arch::Scalar, f16_t>, Param<cpu::arch::Auto, float>,
                                Param<cpu::arch::Auto, bf16_t>, Param<cpu::arch::Auto, f16_t>
#if PHASEKV_HAS_AVX2
                                ,
                                Param<cpu::arch::Avx2, float>, Param<cpu::arch::Avx2, bf16_t>,
                                Param<cpu::arch::Avx2, f16_t>
#endif
#if PHASEKV_HAS_AVX512
                                ,
                                Param<cpu::arch::Avx512, float>, Param<cpu::arch::Avx512, bf16_t>,
                                Param<cpu::arch::Avx512, f16_t>
#endif
#if PHASEKV_HAS_AVX512BF16
                                ,
                                Param<cpu::arch::Avx512Bf16, bf16_t>
#endif
                                >;
TYPED_TEST_SUITE(Extremes, Params);

template <class A>
bool runs_here() {
  if constexpr (std::is_same<A, cpu::arch::Auto>::value)
    return true;
  else
    return cpu::cpu_supports<A>();
}

#define PKV_SKIP_UNLESS_RUNS()        \
  using A = typename TypeParam::Arch; \
  using T = typename TypeParam::Elem; \
  if (!runs_here<A>()) GTEST_SKIP() << A::name << " does not run on this CPU"

TYPED_TEST(Extremes, LogitsOfMagnitude1e4And3e38StayFinite) {
  PKV_SKIP_UNLESS_RUNS();
  Problem<T> p(11);
  const double m = p.max_abs_dot();
  for (double target : {1e4, 3e38}) {
    // The largest |logit| is `target` (0.1 % below, so f32 rounding cannot reach Inf).
    phasekv::StandardVariant v;
    v.scale = static_cast<float>(target / m * 0.999);
    const phasekv::VisibleKV<T> kv = p.visible();
    const Ref ref = reference(p, kv, v, p.q.data());
    const std::string what = std::string(A::name) + " |logit| " + std::to_string(target);
    // Logits this large are rounded to about |s| x 2^-24 x sqrt(d) in f32, so keys within
    // that of the maximum share the weight differently than in double: the output bound is
    // a fraction of max|v| (about 1), the lse bound the usual relative one.
    for (int parts : {1, 3})
      expect_close<T>(run_decode<A>(p, kv, v, parts), ref, 0.05, what + " decode");
    const Result pre = run_prefill<A>(p, v, 1);
    expect_close<T>(pre, ref, 0.05, what + " prefill");
    // With a sink of logit 0 the sink's weight is exp(-|s|) = 0: the same result.
    std::vector<float> sinks(static_cast<std::size_t>(p.hkv * p.G), 0.0f);
    v.sinks = sinks.data();
    expect_close<T>(run_decode<A>(p, kv, v), reference(p, kv, v, p.q.data()), 0.05,
                    what + " sinks");
  }
}

TYPED_TEST(Extremes, SoftCapTamesHugeLogits) {
  PKV_SKIP_UNLESS_RUNS();
  Problem<T> p(12);
  phasekv::StandardVariant v;
  v.scale = static_cast<float>(3e38 / p.max_abs_dot());
  v.softcap = 30.0f;
  const phasekv::VisibleKV<T> kv = p.visible();
  const Ref ref = reference(p, kv, v, p.q.data());
  // Capped logits are within [-30, 30]: the usual bounds.
  expect_close<T>(run_decode<A>(p, kv, v, 2), ref, tolerance<T>() * 4, "decode");
  expect_close<T>(run_prefill<A>(p, v, 1), ref, tolerance<T>() * 4, "prefill");
}

TYPED_TEST(Extremes, EntryBiasMinusInfExcludesEveryEntry) {
  PKV_SKIP_UNLESS_RUNS();
  Problem<T> p(13);
  phasekv::StandardVariant v = p.variant;
  v.entry_bias = -kInf;
  const phasekv::VisibleKV<T> kv = p.visible();
  ASSERT_GT(p.g.complete_windows(p.n), 0);
  // The same as attending to the prefix and the raw tokens alone.
  phasekv::StandardVariant plain = p.variant;
  const Ref ref = reference(p, without_entries(kv), plain, p.q.data());
  for (int parts : {1, 4})
    expect_close<T>(run_decode<A>(p, kv, v, parts), ref, tolerance<T>(), "decode");
  expect_close<T>(run_prefill<A>(p, v, 1), ref, tolerance<T>(), "prefill");
  // Entries alone (W = S = 4, O = 0, L = 0, n = 16: four complete windows, no raw token
  // visible): nothing is attended.
  Problem<T> q(14, 16, phasekv::Geometry(4, 4, 0), 0);
  const phasekv::VisibleKV<T> only = q.visible();
  ASSERT_EQ(only.count, 1);
  expect_empty(run_decode<A>(q, only, v), "entries only");
  expect_empty(run_decode<A>(q, only, v, 3), "entries only, 3 parts");
}

TYPED_TEST(Extremes, EveryVisibleKeyMaskedGivesZerosAndMinusInf) {
  PKV_SKIP_UNLESS_RUNS();
  Problem<T> p(15);
  const phasekv::VisibleKV<T> kv = p.visible();
  MaskVariant mask;
  mask.scale = p.variant.scale;
  expect_empty(run_decode<A>(p, kv, mask), "all masked");
  expect_empty(run_decode<A>(p, kv, mask, 5), "all masked, 5 parts");
  {
    const Result r = run_prefill<A>(p, mask, 7);
    expect_empty(r, "all masked, prefill");
  }
  std::vector<float> sinks(static_cast<std::size_t>(p.hkv * p.G));
  for (std::size_t h = 0; h < sinks.size(); ++h) sinks[h] = 0.5f * static_cast<float>(h) - 1.0f;
  mask.sinks = sinks.data();
  expect_empty(run_decode<A>(p, kv, mask), "all masked with sinks", sinks.data());
  // Raw tokens masked, entries kept: the entries alone.
  mask.sinks = nullptr;
  mask.mask_entries = false;
  phasekv::VisibleKV<T> entries_only;
  for (int s = 0; s < kv.count; ++s)
    if (kv.segments[s].kind == phasekv::SegmentKind::compressed) entries_only.push(kv.segments[s]);
  expect_close<T>(run_decode<A>(p, kv, mask, 2), reference(p, entries_only, p.variant, p.q.data()),
                  tolerance<T>(), "raw masked");
  // Nothing visible at all (n = 0).
  Problem<T> e(16, 0);
  expect_empty(run_decode<A>(e, e.visible(), e.variant), "n = 0");
}

// NaN / Inf in q, K or V are not checked (that would read every input twice): they reach the
// arithmetic. The other heads are untouched on every instruction set; the heads that meet
// them get NaN / Inf as documented (for q and K on the scalar path only, see below).
TYPED_TEST(Extremes, NanAndInfInQKVPropagateToTheirHeadsOnly) {
  PKV_SKIP_UNLESS_RUNS();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Poison {
    const char* name;
    int where;  // 0: q of head 1, 1: a raw key of KV head 1, 2: a raw value of KV head 0,
                // 3: +Inf in an entry key of KV head 1, 4: Inf in a raw value of KV head 0
    float value;
  };
  for (const Poison& x :
       {Poison{"NaN in q", 0, nan}, Poison{"NaN in K", 1, nan}, Poison{"NaN in V", 2, nan},
        Poison{"+Inf in K", 3, kInf}, Poison{"Inf in V", 4, kInf}}) {
    Problem<T> p(17);
    i64 bad_kv = -1, bad_q = -1;
    const i64 last = p.n - 1;  // the newest raw token is always visible
    switch (x.where) {
      case 0:
        p.q[static_cast<std::size_t>(1 * p.d + 5)] = x.value;
        bad_q = 1;
        break;
      case 1:
        p.rk[static_cast<std::size_t>((last * p.hkv + 1) * p.d + 3)] =
            phasekv::from_float<T>(x.value);
        bad_kv = 1;
        break;
      case 2:
        p.rv[static_cast<std::size_t>((last * p.hkv + 0) * p.d + 7)] =
            phasekv::from_float<T>(x.value);
        bad_kv = 0;
        break;
      case 3:  // every channel +Inf: the logit is +Inf or NaN whatever q's signs
        for (i64 i = 0; i < p.d; ++i)
          p.ek[static_cast<std::size_t>((0 * p.hkv + 1) * p.d + i)] =
              phasekv::from_float<T>(x.value);
        bad_kv = 1;
        break;
      default:
        p.rv[static_cast<std::size_t>((last * p.hkv + 0) * p.d + 7)] =
            phasekv::from_float<T>(x.value);
        bad_kv = 0;
        break;
    }
    const phasekv::VisibleKV<T> kv = p.visible();
    const Result r = run_decode<A>(p, kv, p.variant, 2);
    const Result s = run_decode<cpu::arch::Scalar>(p, kv, p.variant, 2);
    const Result pf = run_prefill<A>(p, p.variant, 1);  // the same query through prefill
    // NaN / Inf anywhere: the same classification on every instruction set (the vector exp
    // propagates a NaN argument as std::exp does).
    for (i64 h = 0; h < p.hkv * p.G; ++h) {
      const bool hit = h == bad_q || h / p.G == bad_kv;
      const std::size_t hs = static_cast<std::size_t>(h);
      for (i64 i = 0; i < p.d; ++i) {
        const std::size_t k = static_cast<std::size_t>(h * p.d + i);
        // the same classification as the scalar path on every instruction set
        EXPECT_EQ(std::isnan(r.out[k]), std::isnan(s.out[k])) << x.name << " head " << h;
        EXPECT_EQ(std::isinf(r.out[k]), std::isinf(s.out[k])) << x.name << " head " << h;
        EXPECT_EQ(std::isnan(pf.out[k]), std::isnan(s.out[k])) << x.name << " prefill " << h;
        EXPECT_EQ(std::isinf(pf.out[k]), std::isinf(s.out[k])) << x.name << " prefill " << h;
        if (!hit) {
          ASSERT_TRUE(std::isfinite(r.out[k])) << x.name << " head " << h;
        }
      }
      if (hit && x.where != 2 && x.where != 4) {  // q or K: the lse is NaN too
        EXPECT_TRUE(std::isnan(r.lse[hs])) << x.name << " head " << h << " lse " << r.lse[hs];
        EXPECT_TRUE(std::isnan(pf.lse[hs])) << x.name << " prefill " << h;
      } else {
        EXPECT_TRUE(std::isfinite(r.lse[hs])) << x.name << " head " << h;
      }
      if (hit) {  // the channel that met the NaN / Inf, or every channel for q and K
        const std::size_t k = static_cast<std::size_t>(h * p.d + 7);
        EXPECT_FALSE(std::isfinite(r.out[k])) << x.name << " head " << h;
      }
    }
  }
}

// ---- compression -------------------------------------------------------------------------

// from_float rounds to nearest even and overflows to +-Inf (no saturation); NaN stays NaN.
TEST(ExtremesStore, Bf16AndF16OverflowToInf) {
  EXPECT_EQ(phasekv::to_float(phasekv::from_float<f16_t>(65504.0f)), 65504.0f);
  EXPECT_EQ(phasekv::to_float(phasekv::from_float<f16_t>(65519.0f)), 65504.0f);  // rounds down
  EXPECT_EQ(phasekv::to_float(phasekv::from_float<f16_t>(65520.0f)), kInf);      // halfway up
  EXPECT_EQ(phasekv::to_float(phasekv::from_float<f16_t>(-1e6f)), -kInf);
  EXPECT_EQ(phasekv::to_float(phasekv::from_float<bf16_t>(3.3895314e38f)), 3.3895314e38f);  // max
  EXPECT_EQ(phasekv::to_float(phasekv::from_float<bf16_t>(std::numeric_limits<float>::max())),
            kInf);
  EXPECT_EQ(phasekv::to_float(phasekv::from_float<bf16_t>(-kInf)), -kInf);
  EXPECT_TRUE(std::isnan(phasekv::to_float(phasekv::from_float<bf16_t>(std::nanf("")))));
  EXPECT_TRUE(std::isnan(phasekv::to_float(phasekv::from_float<f16_t>(std::nanf("")))));
}

// An entry whose f32 value is beyond the storage type's range is stored as +-Inf, the same in
// batch and streaming compression, and on every instruction set (CTest reruns this with
// PHASEKV_ARCH=scalar and avx2).
template <class T>
void expect_entry_overflow_is_inf(float x) {
  const phasekv::Geometry g(4, 2);
  const i64 heads = 2, d = 64, n = 40;
  // Payload maps C = 2 I: the entry is 2 x the gated mean of the window (f32, finite), which
  // overflows T when x is near T's maximum. Head 1 gets -x.
  std::vector<float> payload(static_cast<std::size_t>(heads * 4 * d * d), 0.0f);
  for (i64 h = 0; h < heads; ++h)
    for (i64 w = 0; w < 4; ++w)
      for (i64 c = 0; c < d; ++c)
        payload[static_cast<std::size_t>(((h * 4 + w) * d + c) * d + c)] = 2.0f;
  const phasekv::GatedPool gp(g, heads, d, d, phasekv::GateKind::scalar, {}, {},
                              phasekv::param_view(payload.data(), {heads, 4, d, d}));
  std::vector<T> raw(static_cast<std::size_t>(n * heads * d));
  for (i64 t = 0; t < n; ++t)
    for (i64 h = 0; h < heads; ++h)
      for (i64 c = 0; c < d; ++c)
        raw[static_cast<std::size_t>((t * heads + h) * d + c)] = phasekv::from_float<T>(h ? -x : x);
  const auto rv = phasekv::make_view<const T>(raw.data(), n, heads, d);
  const i64 J = g.complete_windows(n);
  std::vector<T> batch(static_cast<std::size_t>(J * heads * d));
  phasekv::compress_batch<T>(gp, rv, phasekv::make_view(batch.data(), J, heads, d));
  phasekv::CompressedCache<T, phasekv::GatedPool> cache(gp, gp, heads, d, d, 0, n);
  for (i64 t = 0; t < n; t += 3)
    cache.append(rv.slice(t, std::min<i64>(3, n - t)), rv.slice(t, std::min<i64>(3, n - t)));
  for (i64 j = 0; j < J; ++j)
    for (i64 h = 0; h < heads; ++h)
      for (i64 c = 0; c < d; ++c) {
        const float b = phasekv::to_float(batch[static_cast<std::size_t>((j * heads + h) * d + c)]);
        ASSERT_EQ(b, h ? -kInf : kInf) << "entry " << j << " head " << h << " ch " << c;
        ASSERT_EQ(phasekv::to_float(cache.entry_keys()(j, h, c)), b);
      }
}

TEST(ExtremesStore, EntryStoresOverflowToInfInBatchAndStreaming) {
  expect_entry_overflow_is_inf<f16_t>(60000.0f);
  expect_entry_overflow_is_inf<bf16_t>(3e38f);
}

// A NaN gate parameter gives NaN entries for its head (GatedPool's documented rule), the
// same on every instruction set; the other head is untouched.
TEST(ExtremesStore, NanGateParameterGivesNanEntriesOfItsHead) {
  const phasekv::Geometry g(8, 4);
  const i64 heads = 2, d = 64, n = 100;
  std::vector<float> bias(static_cast<std::size_t>(heads * 8), 0.5f);
  bias[3] = std::nanf("");  // head 0, offset 3
  std::vector<float> w(static_cast<std::size_t>(heads * 8 * d), 0.01f);
  const phasekv::GatedPool gp(g, heads, d, d, phasekv::GateKind::scalar,
                              phasekv::param_view(w.data(), {heads, 8, 1, d}),
                              phasekv::param_view(bias.data(), {heads, 8, 1}));
  std::vector<float> raw(static_cast<std::size_t>(n * heads * d), 0.25f);
  const i64 J = g.complete_windows(n);
  std::vector<float> out(static_cast<std::size_t>(J * heads * d));
  phasekv::compress_batch<float>(gp, phasekv::make_view<const float>(raw.data(), n, heads, d),
                                 phasekv::make_view(out.data(), J, heads, d));
  for (i64 j = 0; j < J; ++j)
    for (i64 c = 0; c < d; ++c) {
      EXPECT_TRUE(std::isnan(out[static_cast<std::size_t>((j * heads + 0) * d + c)]));
      EXPECT_FLOAT_EQ(out[static_cast<std::size_t>((j * heads + 1) * d + c)], 0.25f);
    }
}

// ---- lengths near the documented maxima -----------------------------------------------------

TEST(ExtremesLength, GeometryIsDefinedUpTo2To62Tokens) {
  constexpr i64 N = phasekv::kMaxLength, E = phasekv::kMaxGeometryExtent;
  const phasekv::Geometry tiny(1, 1, 0), big(E, E, E);
  EXPECT_EQ(tiny.complete_windows(N), N);
  EXPECT_EQ(tiny.visible(N, E).raw_begin, N - E);  // the local band
  const phasekv::Visibility v = big.visible(N, E);
  EXPECT_EQ(v.entries, (N - 2 * E) / E + 1);
  EXPECT_EQ(v.prefix_end, E);
  EXPECT_LE(v.raw_count(), big.ring_capacity(E));
  EXPECT_EQ(big.completes_at(v.entries - 1) <= N, true);
  EXPECT_GT(big.completes_at(v.entries), N);
  EXPECT_NO_THROW(phasekv::Geometry::check_length("t", "n", N));
  EXPECT_THROW(phasekv::Geometry::check_length("t", "n", N + 1), phasekv::invalid_argument);
  EXPECT_THROW(phasekv::Geometry(E + 1, 1, 0), phasekv::invalid_argument);
}

TEST(ExtremesLength, StorageThatOverflowsIsRefusedBeforeAllocating) {
  const phasekv::Geometry g(1, 1);
  // 2^62 entries of 2 x 8 floats: far beyond int64 bytes.
  try {
    phasekv::CompressedCache<float, phasekv::UniformMean> c(
        phasekv::UniformMean(g, 8), phasekv::UniformMean(g, 8), 1, 8, 8, 0, phasekv::kMaxLength);
    FAIL() << "accepted";
  } catch (const phasekv::capacity_error& e) {
    EXPECT_NE(std::string(e.what()).find("max_length = 4611686018427387904"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(phasekv::cache_extents(g, 0, phasekv::kMaxLength).entries, phasekv::kMaxLength);
}

TEST(ExtremesLength, DecodeWorkspaceSizeThatOverflowsSizeTIsRefused) {
  // 2^31 query heads of dim 2^31: one partition's slot alone is 2^63 floats.
  const float dummy = 0.0f;
  cpu::DecodeArgs<float> a;
  a.q = &dummy;
  a.q_heads = i64{1} << 31;
  a.kv_heads = 1;
  a.d_k = i64{1} << 31;
  a.d_v = i64{1} << 31;
  try {
    (void)cpu::decode_workspace_size(a, 4);
    FAIL() << "accepted";
  } catch (const phasekv::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("q_heads = 2147483648"), std::string::npos) << e.what();
  }
  a.q_heads = 1 << 20;
  a.d_k = a.d_v = 1 << 20;  // 2^40 floats per slot: fits; 2^31 partitions do not
  EXPECT_GT(cpu::decode_workspace_size(a, 1), std::size_t{1} << 42);
  try {
    (void)cpu::decode_workspace_size(a, 1 << 30);
    FAIL() << "accepted";
  } catch (const phasekv::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("partitions = 1073741824"), std::string::npos) << e.what();
  }
  // decode_partition's size query and a caller's too-small workspace take the same check
  std::size_t bytes = 0;
  EXPECT_THROW(cpu::decode_partition(a, nullptr, bytes, 0, 1 << 30), phasekv::invalid_argument);
}

}  // namespace
