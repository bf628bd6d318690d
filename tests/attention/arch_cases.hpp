// Decode and prefill against the reference for one explicit architecture tag: shared by the
// test binaries that are compiled with extra instruction-set flags (test_cpu_avx2.cpp,
// test_cpu_avx512.cpp). Header-only so that each binary instantiates it with its own flags.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "decode_case.hpp"
#include "phasekv/attention/cpu/decode.hpp"
#include "phasekv/attention/cpu/prefill.hpp"

namespace pkt {

// Decode of four awkward shapes (GQA 3, 8, 5, 1; d 128, 56/96, 256/64, 64; compressed with gaps
// and overlap, uncompressed) with architecture `Arch`; outputs poisoned before every run.
template <class Arch, class T>
void expect_decode_matches_reference(const char* label) {
  std::uint32_t seed = 3;
  for (const DecodeShape& s :
       {DecodeShape{1000, 2, 3, 128, 128, 8, 4, 0, 128}, DecodeShape{97, 1, 8, 56, 96, 4, 8, 2, 16},
        DecodeShape{500, 2, 5, 256, 64, 0, 0, 0, 0}, DecodeShape{33, 1, 1, 64, 64, 16, 16, 0, 7}}) {
    DecodeCase<T> c(s, seed += 7);
    c.poison();
    phasekv::cpu::decode<Arch>(c.args);
    const ErrorStats e = c.error();
    EXPECT_TRUE(e.finite) << s.name() << " " << label;
    EXPECT_LE(e.max_rel, tolerance<T>()) << s.name() << " " << label;
    EXPECT_LE(e.max_lse, tolerance<T>()) << s.name() << " " << label;
  }
}

// Prefill of 40 queries over 300 tokens (W8/S4/O1, L = 16, GQA 3, d = 96) with `Arch`.
template <class Arch, class T>
void expect_prefill_matches_reference() {
  namespace cpu = phasekv::cpu;
  const std::int64_t n = 300, T_ = 40, hkv = 2, G = 3, d = 96;
  const auto rk = random_values<T>(n * hkv * d, 1), rv = random_values<T>(n * hkv * d, 2, 0.25f);
  const auto ek = random_values<T>(n * hkv * d, 3), ev = random_values<T>(n * hkv * d, 4, 0.25f);
  const auto q = random_floats(T_ * hkv * G * d, 5);
  std::vector<float> out(T_ * hkv * G * d, 123.0f), lse(T_ * hkv * G, 123.0f);
  cpu::PrefillArgs<T> a;
  a.q = q.data();
  a.num_queries = T_;
  a.q_heads = hkv * G;
  a.kv_heads = hkv;
  a.d_k = d;
  a.d_v = d;
  a.first = n - T_;
  a.rule = cpu::VisibilityRule::compressed(phasekv::Geometry(8, 4, 1), 16);
  a.raw_k = phasekv::make_view<const T>(rk.data(), n, hkv, d);
  a.raw_v = phasekv::make_view<const T>(rv.data(), n, hkv, d);
  a.entry_k = phasekv::make_view<const T>(ek.data(), n, hkv, d);
  a.entry_v = phasekv::make_view<const T>(ev.data(), n, hkv, d);
  a.variant.scale = phasekv::default_scale(d);
  a.out = out.data();
  a.lse = lse.data();
  cpu::prefill<Arch>(a);
  std::vector<double> ref(out.size()), ref_lse(lse.size());
  phasekv::reference_prefill<T>(q.data(), T_, hkv * G, a.first, a.rule.geometry(), 16, a.raw_k,
                                a.raw_v, a.entry_k, a.entry_v, a.variant, ref.data(),
                                ref_lse.data());
  const ErrorStats e = compare(out.data(), lse.data(), ref.data(), ref_lse.data(), T_ * hkv * G, d);
  EXPECT_LE(e.max_rel, tolerance<T>());
}

}  // namespace pkt
