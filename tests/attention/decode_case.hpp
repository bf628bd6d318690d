// A decode test case: random raw K/V and entries, the visible set of the query at n - 1, and
// the double reference.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cpu_test_util.hpp"
#include "phasekv/attention/cpu/decode.hpp"
#include "phasekv/attention/cpu/visibility_rule.hpp"
#include "phasekv/attention/reference.hpp"

namespace pkt {

struct DecodeShape {
  std::int64_t n;  // tokens seen
  std::int64_t kv_heads;
  std::int64_t group;  // G
  std::int64_t d_k;
  std::int64_t d_v;
  std::int64_t W, S, O;  // geometry; W == 0 means uncompressed
  std::int64_t L;        // local window (compressed) or sliding window (uncompressed, 0 = causal)
  phasekv::Layout layout = phasekv::Layout::NHD;

  std::string name() const {
    return "n" + std::to_string(n) + "_hkv" + std::to_string(kv_heads) + "_g" +
           std::to_string(group) + "_dk" + std::to_string(d_k) + "_dv" + std::to_string(d_v) +
           (W ? "_W" + std::to_string(W) + "S" + std::to_string(S) + "O" + std::to_string(O)
              : std::string("_raw")) +
           "_L" + std::to_string(L) + (layout == phasekv::Layout::HND ? "_hnd" : "");
  }
  phasekv::cpu::VisibilityRule rule() const {
    if (W == 0)
      return L == 0 ? phasekv::cpu::VisibilityRule::causal()
                    : phasekv::cpu::VisibilityRule::sliding_window(L);
    return phasekv::cpu::VisibilityRule::compressed(phasekv::Geometry(W, S, O), L);
  }
};

// Owns the buffers of one case; `args` points into them.
template <class T>
struct DecodeCase {
  DecodeShape shape;
  std::vector<T> raw_k, raw_v, ent_k, ent_v;
  std::vector<float> q;
  std::vector<float> out, lse;
  std::vector<double> ref, ref_lse;
  phasekv::cpu::DecodeArgs<T> args;

  DecodeCase(const DecodeShape& s, std::uint32_t seed, float q_sd = 1.0f,
             phasekv::StandardVariant var = {})
      : shape(s) {
    const std::int64_t hq = s.kv_heads * s.group;
    const phasekv::cpu::VisibilityRule rule = s.rule();
    const std::int64_t J = rule.at(s.n).entries;
    const std::int64_t nr = s.n > 0 ? s.n : 1;
    const std::int64_t ne = J > 0 ? J : 1;
    raw_k = random_values<T>(static_cast<std::size_t>(nr * s.kv_heads * s.d_k), seed + 1);
    raw_v = random_values<T>(static_cast<std::size_t>(nr * s.kv_heads * s.d_v), seed + 2, 0.25f);
    ent_k = random_values<T>(static_cast<std::size_t>(ne * s.kv_heads * s.d_k), seed + 3);
    ent_v = random_values<T>(static_cast<std::size_t>(ne * s.kv_heads * s.d_v), seed + 4, 0.25f);
    q = random_floats(static_cast<std::size_t>(hq * s.d_k), seed + 5, q_sd);
    using CV = phasekv::StridedView<const T>;
    const CV rk = phasekv::make_view<const T>(raw_k.data(), s.n, s.kv_heads, s.d_k, s.layout);
    const CV rv = phasekv::make_view<const T>(raw_v.data(), s.n, s.kv_heads, s.d_v, s.layout);
    const CV ek = phasekv::make_view<const T>(ent_k.data(), J, s.kv_heads, s.d_k, s.layout);
    const CV ev = phasekv::make_view<const T>(ent_v.data(), J, s.kv_heads, s.d_v, s.layout);
    args.q = q.data();
    args.q_heads = hq;
    args.kv_heads = s.kv_heads;
    args.d_k = s.d_k;
    args.d_v = s.d_v;
    args.kv = rule.visible_kv<T>(s.n, rk, rv, ek, ev);
    if (var.scale == 1.0f) var.scale = phasekv::default_scale(s.d_k);
    args.variant = var;
    out.assign(static_cast<std::size_t>(hq * s.d_v), 123.0f);  // poison
    lse.assign(static_cast<std::size_t>(hq), 123.0f);
    args.out = out.data();
    args.lse = lse.data();
    ref.resize(out.size());
    ref_lse.resize(lse.size());
    phasekv::reference_decode<T>(q.data(), hq, args.kv, args.variant, ref.data(), ref_lse.data());
  }
  void poison() {
    std::fill(out.begin(), out.end(), std::nanf(""));
    std::fill(lse.begin(), lse.end(), std::nanf(""));
  }
  ErrorStats error() const {
    return compare(out.data(), lse.data(), ref.data(), ref_lse.data(), args.q_heads, shape.d_v);
  }
};

}  // namespace pkt
