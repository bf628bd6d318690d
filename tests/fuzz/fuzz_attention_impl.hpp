#pragma once
// Part of the fuzz_attention target (one translation unit per element type, so that the
// kernels of the three types compile in parallel). Differential fuzz target: cpu::decode (split
// into a drawn number of partitions, merged) and cpu::prefill (partitioned the same way) against
// the double-precision reference (reference.hpp), with shapes (GQA group 1..7, head dims 1..256,
// d_k != d_v), geometries or uncompressed rules, local windows, variants (scale, soft cap, entry
// bias, sinks), NHD/HND, f32/bf16/f16 and every instruction set this CPU runs drawn from the input.
// Bound: the kernel tests' tolerance (1e-5 for f32, 1e-2 for bf16/f16) relative to the largest
// visible |value| for the output (a convex combination of the values) and relative to max(1, |lse|)
// for the log-sum-exp; an empty visible set must give zeros and lse = -inf exactly.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "fuzz_input.hpp"
#include "fuzz_attention.hpp"
#include "phasekv/attention/cpu/cpu_features.hpp"
#include "phasekv/attention/cpu/decode.hpp"
#include "phasekv/attention/cpu/prefill.hpp"
#include "phasekv/attention/cpu/visibility_rule.hpp"
#include "phasekv/attention/reference.hpp"
#include "phasekv/core/element.hpp"

namespace pkv_fuzz {
namespace {

using i64 = std::int64_t;
using pkv_fuzz::FuzzInput;
namespace cpu = phasekv::cpu;

template <class T>
std::vector<T> normal(std::size_t count, std::uint32_t seed, float sd) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<T> v(count);
  for (auto& x : v) x = phasekv::from_float<T>(dist(rng));
  return v;
}

template <class T>
double max_abs(const std::vector<T>& v) {
  double m = 0.0;
  for (const T& x : v) m = std::max(m, std::abs(static_cast<double>(phasekv::to_float(x))));
  return m;
}

template <class T>
constexpr double tolerance() {
  return std::is_same<T, float>::value ? 1e-5 : 1e-2;
}

// Checks `rows` outputs of width d against the reference; `vmax` bounds |values|.
template <class T>
void expect_close(const char* what, const float* out, const float* lse, const double* ref,
                  const double* ref_lse, i64 rows, i64 d, double vmax, const char* arch) {
  const double tol = tolerance<T>();
  for (i64 r = 0; r < rows; ++r) {
    if (std::isinf(ref_lse[r])) {
      PKV_FUZZ_CHECK(std::isinf(lse[r]) && lse[r] < 0 && ref_lse[r] < 0,
                     "%s [%s] row %lld: lse %g, reference %g", what, arch, (long long)r,
                     (double)lse[r], ref_lse[r]);
      for (i64 i = 0; i < d; ++i)
        PKV_FUZZ_CHECK(out[r * d + i] == 0.0f,
                       "%s [%s] row %lld: nothing visible but out[%lld] = %g", what, arch,
                       (long long)r, (long long)i, (double)out[r * d + i]);
      continue;
    }
    PKV_FUZZ_CHECK(std::abs(lse[r] - ref_lse[r]) <= tol * std::max(1.0, std::abs(ref_lse[r])),
                   "%s [%s] row %lld: lse %.9g, reference %.9g", what, arch, (long long)r,
                   (double)lse[r], ref_lse[r]);
    for (i64 i = 0; i < d; ++i) {
      const double o = out[r * d + i], e = ref[r * d + i];
      PKV_FUZZ_CHECK(std::isfinite(o) && std::abs(o - e) <= tol * std::max(vmax, 1e-30),
                     "%s [%s] row %lld channel %lld: %.9g, reference %.9g (max |v| %g)", what, arch,
                     (long long)r, (long long)i, o, e, vmax);
    }
  }
}

template <class Arch, class T>
void decode_case(const Case& c, const std::vector<T>& rk, const std::vector<T>& rv,
                 const std::vector<T>& ek, const std::vector<T>& ev, const std::vector<float>& q,
                 double vmax) {
  using CV = phasekv::StridedView<const T>;
  const i64 hq = c.kv_heads * c.group, J = c.rule.at(c.n).entries;
  const CV rkv = phasekv::make_view<const T>(rk.data(), c.n, c.kv_heads, c.dk, c.layout);
  const CV rvv = phasekv::make_view<const T>(rv.data(), c.n, c.kv_heads, c.dv, c.layout);
  const CV ekv = phasekv::make_view<const T>(ek.data(), J, c.kv_heads, c.dk, c.layout);
  const CV evv = phasekv::make_view<const T>(ev.data(), J, c.kv_heads, c.dv, c.layout);
  std::vector<float> out(static_cast<std::size_t>(hq * c.dv), std::nanf("")),
      lse(static_cast<std::size_t>(hq), std::nanf(""));
  cpu::DecodeArgs<T> a;
  a.q = q.data();
  a.q_heads = hq;
  a.kv_heads = c.kv_heads;
  a.d_k = c.dk;
  a.d_v = c.dv;
  a.kv = c.rule.visible_kv<T>(c.n, rkv, rvv, ekv, evv);
  a.variant = c.variant;
  a.out = out.data();
  a.lse = lse.data();
  std::vector<double> ref(out.size()), ref_lse(lse.size());
  phasekv::reference_decode<T>(q.data(), hq, a.kv, a.variant, ref.data(), ref_lse.data());
  const std::size_t bytes = cpu::decode_workspace_size(a, c.threads);
  std::vector<unsigned char> ws(bytes, 0xff);
  for (int t = 0; t < c.threads; ++t)
    cpu::decode_partition<Arch>(a, ws.data(), bytes, t, c.threads);
  const int merges = 1 + (c.threads + 1) % 3;
  for (int m = 0; m < merges; ++m) cpu::decode_merge(a, ws.data(), bytes, c.threads, m, merges);
  expect_close<T>("decode", out.data(), lse.data(), ref.data(), ref_lse.data(), hq, c.dv, vmax,
                  Arch::name);
}

template <class Arch, class T>
void prefill_case(const Case& c, const std::vector<T>& rk, const std::vector<T>& rv,
                  const std::vector<T>& ek, const std::vector<T>& ev, const std::vector<float>& q,
                  double vmax) {
  const i64 hq = c.kv_heads * c.group, nq = c.n - c.first, J = c.rule.at(c.n).entries;
  cpu::PrefillArgs<T> a;
  a.q = q.data();
  a.num_queries = nq;
  a.q_heads = hq;
  a.kv_heads = c.kv_heads;
  a.d_k = c.dk;
  a.d_v = c.dv;
  a.first = c.first;
  a.rule = c.rule;
  a.raw_k = phasekv::make_view<const T>(rk.data(), c.n, c.kv_heads, c.dk, c.layout);
  a.raw_v = phasekv::make_view<const T>(rv.data(), c.n, c.kv_heads, c.dv, c.layout);
  a.entry_k = phasekv::make_view<const T>(ek.data(), J, c.kv_heads, c.dk, c.layout);
  a.entry_v = phasekv::make_view<const T>(ev.data(), J, c.kv_heads, c.dv, c.layout);
  a.variant = c.variant;
  const i64 rows = nq * hq;
  std::vector<float> out(static_cast<std::size_t>(rows * c.dv), std::nanf("")),
      lse(static_cast<std::size_t>(rows), std::nanf(""));
  a.out = out.data();
  a.lse = lse.data();
  for (int t = 0; t < c.threads; ++t) cpu::prefill_partition<Arch>(a, t, c.threads);
  // The reference, query by query (the uncompressed rules through VisibilityRule).
  std::vector<double> ref(out.size()), ref_lse(lse.size());
  for (i64 i = 0; i < nq; ++i) {
    const phasekv::VisibleKV<T> kv =
        c.rule.visible_kv<T>(c.first + i + 1, a.raw_k, a.raw_v, a.entry_k, a.entry_v);
    phasekv::reference_decode<T>(q.data() + i * hq * c.dk, hq, kv, a.variant,
                                 ref.data() + i * hq * c.dv, ref_lse.data() + i * hq);
  }
  expect_close<T>("prefill", out.data(), lse.data(), ref.data(), ref_lse.data(), rows, c.dv, vmax,
                  Arch::name);
}

template <class Arch, class T>
bool try_arch(bool prefill, const Case& c, const std::vector<T>& rk, const std::vector<T>& rv,
              const std::vector<T>& ek, const std::vector<T>& ev, const std::vector<float>& q,
              double vmax) {
  if constexpr (cpu::arch_available<Arch>::value || std::is_same<Arch, cpu::arch::Auto>::value) {
    if constexpr (!std::is_same<Arch, cpu::arch::Auto>::value)
      if (!cpu::cpu_supports<Arch>()) return false;
    if (prefill)
      prefill_case<Arch>(c, rk, rv, ek, ev, q, vmax);
    else
      decode_case<Arch>(c, rk, rv, ek, ev, q, vmax);
    return true;
  } else {
    (void)prefill, (void)c, (void)rk, (void)rv, (void)ek, (void)ev, (void)q, (void)vmax;
    return false;
  }
}

}  // namespace

template <class T>
void run_case(FuzzInput& in, Case& c, bool prefill) {
  const i64 J = c.rule.at(c.n).entries;
  const i64 nb = std::max<i64>(c.n, 1), jb = std::max<i64>(J, 1);
  const std::vector<T> rk =
      normal<T>(static_cast<std::size_t>(nb * c.kv_heads * c.dk), in.seed(), 1.0f);
  const std::vector<T> rv =
      normal<T>(static_cast<std::size_t>(nb * c.kv_heads * c.dv), in.seed(), 0.25f);
  const std::vector<T> ek =
      normal<T>(static_cast<std::size_t>(jb * c.kv_heads * c.dk), in.seed(), 1.0f);
  const std::vector<T> ev =
      normal<T>(static_cast<std::size_t>(jb * c.kv_heads * c.dv), in.seed(), 0.25f);
  const i64 nq = prefill ? c.n - c.first : 1;
  const std::vector<float> q =
      normal<float>(static_cast<std::size_t>(std::max<i64>(nq, 1) * c.kv_heads * c.group * c.dk),
                    in.seed(), 1.0f);
  const double vmax = std::max(max_abs(rv), max_abs(ev));
  bool ran = false;
  switch (in.range(0, 4)) {
    case 0: ran = try_arch<cpu::arch::Avx2, T>(prefill, c, rk, rv, ek, ev, q, vmax); break;
    case 1: ran = try_arch<cpu::arch::Avx512, T>(prefill, c, rk, rv, ek, ev, q, vmax); break;
    case 2: ran = try_arch<cpu::arch::Avx512Bf16, T>(prefill, c, rk, rv, ek, ev, q, vmax); break;
    case 3: ran = try_arch<cpu::arch::Auto, T>(prefill, c, rk, rv, ek, ev, q, vmax); break;
    default: break;
  }
  if (!ran) try_arch<cpu::arch::Scalar, T>(prefill, c, rk, rv, ek, ev, q, vmax);
}

}  // namespace pkv_fuzz

#define PKV_FUZZ_INSTANTIATE(T) \
  template void pkv_fuzz::run_case<T>(pkv_fuzz::FuzzInput&, pkv_fuzz::Case&, bool);
