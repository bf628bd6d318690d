// CPU prefill against reference_prefill (per-query visible sets), scalar and native paths.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cpu_test_util.hpp"
#include "phasekv/attention/cpu/cpu_features.hpp"
#include "phasekv/attention/cpu/prefill.hpp"
#include "phasekv/attention/cpu/thread_driver.hpp"
#include "phasekv/attention/reference.hpp"

namespace {

namespace cpu = phasekv::cpu;
using phasekv::bf16_t;
using phasekv::f16_t;

struct PrefillShape {
  std::int64_t first, T, kv_heads, group, d_k, d_v, W, S, O,
      L;  // W == 0: uncompressed (L = window)
  std::string name() const {
    return "first" + std::to_string(first) + "_T" + std::to_string(T) + "_hkv" +
           std::to_string(kv_heads) + "_g" + std::to_string(group) + "_dk" + std::to_string(d_k) +
           "_dv" + std::to_string(d_v) + "_W" + std::to_string(W) + "S" + std::to_string(S) + "O" +
           std::to_string(O) + "_L" + std::to_string(L);
  }
};

template <class T>
struct PrefillCase {
  PrefillShape sh;
  std::vector<T> rk, rv, ek, ev;
  std::vector<float> q, out, lse;
  std::vector<double> ref, ref_lse;
  cpu::PrefillArgs<T> args;

  PrefillCase(const PrefillShape& s, std::uint32_t seed, phasekv::StandardVariant var = {})
      : sh(s) {
    const std::int64_t n = s.first + s.T, hq = s.kv_heads * s.group;
    const bool comp = s.W > 0;
    args.rule =
        comp ? cpu::VisibilityRule::compressed(phasekv::Geometry(s.W, s.S, s.O), s.L)
             : (s.L > 0 ? cpu::VisibilityRule::sliding_window(s.L) : cpu::VisibilityRule::causal());
    const std::int64_t J = args.rule.at(n).entries;
    rk = pkt::random_values<T>(static_cast<std::size_t>(n * s.kv_heads * s.d_k), seed + 1);
    rv = pkt::random_values<T>(static_cast<std::size_t>(n * s.kv_heads * s.d_v), seed + 2, 0.25f);
    ek = pkt::random_values<T>(static_cast<std::size_t>((J + 1) * s.kv_heads * s.d_k), seed + 3);
    ev = pkt::random_values<T>(static_cast<std::size_t>((J + 1) * s.kv_heads * s.d_v), seed + 4,
                               0.25f);
    q = pkt::random_floats(static_cast<std::size_t>(s.T * hq * s.d_k), seed + 5, 1.5f);
    args.q = q.data();
    args.num_queries = s.T;
    args.q_heads = hq;
    args.kv_heads = s.kv_heads;
    args.d_k = s.d_k;
    args.d_v = s.d_v;
    args.first = s.first;
    args.raw_k = phasekv::make_view<const T>(rk.data(), n, s.kv_heads, s.d_k);
    args.raw_v = phasekv::make_view<const T>(rv.data(), n, s.kv_heads, s.d_v);
    args.entry_k = phasekv::make_view<const T>(ek.data(), J, s.kv_heads, s.d_k);
    args.entry_v = phasekv::make_view<const T>(ev.data(), J, s.kv_heads, s.d_v);
    if (var.scale == 1.0f) var.scale = phasekv::default_scale(s.d_k);
    args.variant = var;
    out.assign(static_cast<std::size_t>(s.T * hq * s.d_v), std::nanf(""));
    lse.assign(static_cast<std::size_t>(s.T * hq), std::nanf(""));
    args.out = out.data();
    args.lse = lse.data();
    ref.resize(out.size());
    ref_lse.resize(lse.size());
    // reference: the decode reference on each query's visible set
    for (std::int64_t i = 0; i < s.T; ++i) {
      const phasekv::VisibleKV<T> kv = args.rule.template visible_kv<T>(
          s.first + i + 1, args.raw_k, args.raw_v, args.entry_k, args.entry_v);
      phasekv::reference_decode<T>(q.data() + i * hq * s.d_k, hq, kv, args.variant,
                                   ref.data() + i * hq * s.d_v, ref_lse.data() + i * hq);
    }
  }
  pkt::ErrorStats error() const {
    return pkt::compare(out.data(), lse.data(), ref.data(), ref_lse.data(), sh.T * args.q_heads,
                        sh.d_v);
  }
};

template <class P>
class CpuPrefill : public ::testing::Test {};
template <class A, class T>
struct Param {
  using Arch = A;
  using Elem = T;
};
using Params = ::testing::Types<Param<cpu::arch::Scalar, float>, Param<cpu::arch::Scalar, bf16_t>,
                                Param<cpu::NativeArch, float>, Param<cpu::NativeArch, bf16_t>,
                                Param<cpu::NativeArch, f16_t>, Param<cpu::arch::Auto, float>,
                                Param<cpu::arch::Auto, bf16_t>
#if PHASEKV_DISPATCH
                                ,
                                Param<cpu::arch::Avx2, bf16_t>, Param<cpu::arch::Avx512, bf16_t>
#endif
                                >;
TYPED_TEST_SUITE(CpuPrefill, Params);

std::vector<PrefillShape> shapes() {
  // first, T, Hkv, G, dk, dv, W, S, O, L
  return {
      {0, 1, 1, 1, 64, 64, 8, 4, 0, 16},
      {0, 7, 2, 3, 56, 56, 4, 4, 0, 2},
      {0, 97, 1, 5, 96, 96, 8, 4, 3, 16},      // overlap + prefix, starts at 0
      {200, 97, 2, 8, 128, 128, 4, 8, 0, 0},   // gaps, no local window
      {900, 100, 1, 3, 64, 96, 16, 16, 5, 7},  // tiling + prefix, dk != dv
      {4900, 100, 1, 1, 256, 256, 8, 4, 0, 128},
      {50, 70, 2, 4, 64, 64, 0, 0, 0, 0},    // uncompressed causal
      {300, 65, 1, 3, 56, 56, 0, 0, 0, 33},  // uncompressed sliding window
      {3, 9, 1, 2, 5, 3, 2, 1, 1, 1},        // tiny dims
  };
}

TYPED_TEST(CpuPrefill, MatchesReference) {
  using A = typename TypeParam::Arch;
  using T = typename TypeParam::Elem;
  if (!cpu::cpu_supports<A>()) GTEST_SKIP() << A::name << " does not run on this CPU";
  std::uint32_t seed = 1000;
  for (const PrefillShape& s : shapes()) {
    if (s.first + s.T > 2000 && std::is_same<A, cpu::arch::Scalar>::value) continue;
    PrefillCase<T> c(s, seed += 10);
    cpu::prefill<A>(c.args);
    const pkt::ErrorStats e = c.error();
    EXPECT_TRUE(e.finite) << s.name();
    EXPECT_LE(e.max_rel, pkt::tolerance<T>()) << s.name() << " mean " << e.mean_rel;
    EXPECT_LE(e.max_lse, pkt::tolerance<T>()) << s.name();
  }
}

TYPED_TEST(CpuPrefill, VariantsAndThreads) {
  using A = typename TypeParam::Arch;
  using T = typename TypeParam::Elem;
  if (!cpu::cpu_supports<A>()) GTEST_SKIP() << A::name << " does not run on this CPU";
  std::vector<float> sinks(12);
  for (std::size_t h = 0; h < sinks.size(); ++h) sinks[h] = 0.3f * static_cast<float>(h) - 1.0f;
  phasekv::StandardVariant var;
  var.softcap = 6.0f;
  var.entry_bias = 2.0794f;
  var.sinks = sinks.data();
  PrefillCase<T> c({40, 60, 3, 4, 64, 64, 8, 4, 2, 16}, 77, var);
  cpu::ThreadPool pool(3);
  cpu::prefill_parallel<A>(c.args, pool);
  const pkt::ErrorStats e = c.error();
  EXPECT_TRUE(e.finite);
  EXPECT_LE(e.max_rel, pkt::tolerance<T>());
  EXPECT_LE(e.max_lse, pkt::tolerance<T>());
}

TYPED_TEST(CpuPrefill, FirstQueryWithNothingVisibleButItself) {
  using A = typename TypeParam::Arch;
  using T = typename TypeParam::Elem;
  if (!cpu::cpu_supports<A>()) GTEST_SKIP() << A::name << " does not run on this CPU";
  // O = 5: the first queries see only the prefix; huge logits must stay finite
  PrefillCase<T> c({0, 12, 1, 2, 64, 64, 4, 2, 5, 0}, 5, [] {
    phasekv::StandardVariant v;
    v.scale = 200.0f;
    return v;
  }());
  cpu::prefill<A>(c.args);
  const pkt::ErrorStats e = c.error();
  EXPECT_TRUE(e.finite);
  EXPECT_LE(e.max_rel, pkt::tolerance<T>());
}

}  // namespace
