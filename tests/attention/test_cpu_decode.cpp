// CPU decode kernels against the double-precision reference, for the scalar path and the
// native path of this build (AVX2 under -march=native), over awkward shapes.
#include <gtest/gtest.h>

#include <vector>

#include "decode_case.hpp"
#include "phasekv/attention/cpu/cpu_features.hpp"
#include "phasekv/attention/cpu/decode.hpp"

namespace {

using phasekv::bf16_t;
using phasekv::f16_t;
using phasekv::Layout;
using pkt::DecodeCase;
using pkt::DecodeShape;
namespace arch = phasekv::cpu::arch;

// n, kv_heads, G, d_k, d_v, W, S, O, L
std::vector<DecodeShape> shapes() {
  return {
      {1, 1, 1, 64, 64, 8, 4, 0, 16},
      {7, 2, 3, 56, 56, 4, 4, 0, 2},
      {97, 2, 5, 96, 96, 8, 4, 3, 16},       // overlap + prefix
      {97, 1, 8, 128, 128, 4, 8, 0, 0},      // gaps, no local window
      {1000, 2, 3, 128, 128, 8, 4, 0, 128},  // DeepSeek CSA shape
      {1000, 1, 5, 256, 256, 16, 16, 4, 7},  // tiling + prefix
      {1000, 2, 1, 64, 96, 1, 3, 0, 5},      // strided sampling, d_k != d_v
      {97, 3, 8, 56, 64, 0, 0, 0, 0},        // uncompressed causal
      {1000, 1, 3, 96, 56, 0, 0, 0, 33},     // uncompressed sliding window
      {5000, 2, 8, 128, 128, 8, 4, 0, 128},
      {5000, 1, 3, 64, 64, 0, 0, 0, 0},
      {1000, 2, 5, 64, 64, 8, 4, 0, 16, Layout::HND},
      {7, 1, 1, 3, 5, 2, 1, 1, 1},  // tiny head dims (all tail code)
  };
}

template <class P>
class CpuDecode : public ::testing::Test {};

template <class A, class T>
struct Param {
  using Arch = A;
  using Elem = T;
};

using Params = ::testing::Types<
    Param<arch::Scalar, float>, Param<arch::Scalar, bf16_t>, Param<arch::Scalar, f16_t>,
    Param<phasekv::cpu::NativeArch, float>, Param<phasekv::cpu::NativeArch, bf16_t>,
    Param<phasekv::cpu::NativeArch, f16_t>,
    // run-time dispatch (the default), and each x86 build it can
    // pick, compiled whatever this file's flags (skipped on CPUs
    // without them)
    Param<arch::Auto, float>, Param<arch::Auto, bf16_t>, Param<arch::Auto, f16_t>
#if PHASEKV_DISPATCH
    ,
    Param<arch::Avx2, float>, Param<arch::Avx2, bf16_t>, Param<arch::Avx2, f16_t>,
    Param<arch::Avx512, float>, Param<arch::Avx512, bf16_t>, Param<arch::Avx512, f16_t>
#endif
    >;
TYPED_TEST_SUITE(CpuDecode, Params);

TYPED_TEST(CpuDecode, MatchesReference) {
  using A = typename TypeParam::Arch;
  using T = typename TypeParam::Elem;
  if (!phasekv::cpu::cpu_supports<A>()) GTEST_SKIP() << A::name << " does not run on this CPU";
  std::uint32_t seed = 10;
  for (const DecodeShape& s : shapes()) {
    // the 5000-token cases only on the native path (the scalar path is slow and covered above)
    if (s.n >= 5000 && std::is_same<A, arch::Scalar>::value) continue;
    DecodeCase<T> c(s, seed += 10);
    c.poison();
    phasekv::cpu::decode<A>(c.args);
    const pkt::ErrorStats e = c.error();
    EXPECT_TRUE(e.finite) << s.name();
    EXPECT_LE(e.max_rel, pkt::tolerance<T>()) << s.name() << " mean " << e.mean_rel;
    EXPECT_LE(e.max_lse, pkt::tolerance<T>()) << s.name();
  }
}

TYPED_TEST(CpuDecode, EmptyGivesZerosAndNegInf) {
  using A = typename TypeParam::Arch;
  using T = typename TypeParam::Elem;
  if (!phasekv::cpu::cpu_supports<A>()) GTEST_SKIP() << A::name << " does not run on this CPU";
  DecodeCase<T> c({0, 2, 3, 64, 48, 8, 4, 0, 16}, 7);
  ASSERT_EQ(c.args.kv.count, 0);
  c.poison();
  phasekv::cpu::decode<A>(c.args);
  for (float x : c.out) EXPECT_EQ(x, 0.0f);
  for (float x : c.lse) EXPECT_EQ(x, phasekv::neg_inf());
}

TYPED_TEST(CpuDecode, EmptyWithSinkGivesSinkLse) {
  using A = typename TypeParam::Arch;
  using T = typename TypeParam::Elem;
  if (!phasekv::cpu::cpu_supports<A>()) GTEST_SKIP() << A::name << " does not run on this CPU";
  std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 3.0f, -4.0f, 0.0f};
  phasekv::StandardVariant var;
  var.sinks = sinks.data();
  DecodeCase<T> c({0, 2, 3, 64, 48, 8, 4, 0, 16}, 7, 1.0f, var);
  c.poison();
  phasekv::cpu::decode<A>(c.args);
  for (float x : c.out) EXPECT_EQ(x, 0.0f);
  for (std::size_t h = 0; h < sinks.size(); ++h) EXPECT_EQ(c.lse[h], sinks[h]);
}

TYPED_TEST(CpuDecode, Variants) {
  using A = typename TypeParam::Arch;
  using T = typename TypeParam::Elem;
  if (!phasekv::cpu::cpu_supports<A>()) GTEST_SKIP() << A::name << " does not run on this CPU";
  std::vector<float> sinks(40);
  for (std::size_t h = 0; h < sinks.size(); ++h) sinks[h] = 0.37f * static_cast<float>(h) - 3.0f;
  struct V {
    const char* name;
    float softcap, bias;
    bool sink;
  };
  const V vs[] = {{"softcap", 5.0f, 0.0f, false},
                  {"entry_bias", 0.0f, 2.0794f, false},
                  {"sink", 0.0f, 0.0f, true},
                  {"all", 7.5f, -1.5f, true}};
  std::uint32_t seed = 500;
  for (const V& v : vs) {
    for (const DecodeShape& s : {DecodeShape{97, 2, 5, 64, 64, 8, 4, 2, 16},
                                 DecodeShape{1000, 1, 8, 128, 128, 128, 128, 0, 128}}) {
      phasekv::StandardVariant var;
      var.softcap = v.softcap;
      var.entry_bias = v.bias;
      var.sinks = v.sink ? sinks.data() : nullptr;
      DecodeCase<T> c(s, seed += 3, 3.0f, var);
      c.poison();
      phasekv::cpu::decode<A>(c.args);
      const pkt::ErrorStats e = c.error();
      EXPECT_TRUE(e.finite) << v.name << " " << s.name();
      EXPECT_LE(e.max_rel, pkt::tolerance<T>()) << v.name << " " << s.name();
      EXPECT_LE(e.max_lse, pkt::tolerance<T>()) << v.name << " " << s.name();
    }
  }
}

// A user variant through the generic logit hook (no check() member, no sink); it computes
// what StandardVariant{scale 0.125, entry_bias 0.75} does, so the reference can check it.
struct ShiftVariant {
  float scale = 0.125f;
  float logit(float dot, phasekv::SegmentKind kind) const {
    return scale * dot + (kind == phasekv::SegmentKind::compressed ? 0.75f : 0.0f);
  }
  bool has_sink() const { return false; }
  float sink(std::int64_t) const { return 0.0f; }
};

TYPED_TEST(CpuDecode, UserVariant) {
  using A = typename TypeParam::Arch;
  using T = typename TypeParam::Elem;
  if (!phasekv::cpu::cpu_supports<A>()) GTEST_SKIP() << A::name << " does not run on this CPU";
  DecodeCase<T> c({200, 2, 3, 64, 64, 8, 4, 1, 16}, 77);
  phasekv::cpu::DecodeArgs<T, ShiftVariant> a;
  a.q = c.args.q;
  a.q_heads = c.args.q_heads;
  a.kv_heads = c.args.kv_heads;
  a.d_k = c.args.d_k;
  a.d_v = c.args.d_v;
  a.kv = c.args.kv;
  a.out = c.out.data();
  a.lse = c.lse.data();
  phasekv::StandardVariant same;
  same.scale = 0.125f;
  same.entry_bias = 0.75f;
  phasekv::reference_decode<T>(a.q, a.q_heads, a.kv, same, c.ref.data(), c.ref_lse.data());
  c.poison();
  phasekv::cpu::decode<A>(a);
  const pkt::ErrorStats e = c.error();
  EXPECT_LE(e.max_rel, pkt::tolerance<T>());
  EXPECT_LE(e.max_lse, pkt::tolerance<T>());
}

TYPED_TEST(CpuDecode, HugeLogitsStayFinite) {
  using A = typename TypeParam::Arch;
  using T = typename TypeParam::Elem;
  if (!phasekv::cpu::cpu_supports<A>()) GTEST_SKIP() << A::name << " does not run on this CPU";
  // |q| large enough that logits reach |s| ~ 1e4
  for (const DecodeShape& s : {DecodeShape{500, 2, 3, 64, 64, 8, 4, 0, 16},
                               DecodeShape{300, 1, 4, 128, 128, 0, 0, 0, 0}}) {
    // (the case uses the default scale 1/sqrt(d_k))
    DecodeCase<T> c(s, 99, 4000.0f);
    // lse >= the largest logit of a head: check that the logits really reach ~1e4
    double max_lse = 0.0;
    for (double x : c.ref_lse) max_lse = std::max(max_lse, std::abs(x));
    ASSERT_GT(max_lse, 1e4) << "test does not reach |s| = 1e4";
    c.poison();
    phasekv::cpu::decode<A>(c.args);
    const pkt::ErrorStats e = c.error();
    EXPECT_TRUE(e.finite) << s.name();
    for (float x : c.lse) EXPECT_TRUE(std::isfinite(x));
    EXPECT_LE(e.max_rel, pkt::tolerance<T>()) << s.name();
  }
}

}  // namespace
