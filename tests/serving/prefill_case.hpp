// A BatchCase plus q_b new queries per sequence, as batch prefill takes them: the engine-style
// runs and the single-sequence cpu::prefill arguments of each sequence.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "phasekv/attention/cpu/prefill.hpp"
#include "phasekv/serving/batch_prefill.hpp"
#include "serving_case.hpp"

namespace pst {

// A BatchCase plus q_b new queries per sequence (the last q_b positions of each).
template <class T>
struct PrefillCase {
  pst::BatchCase<T> c;
  std::vector<std::int32_t> qo{0};
  std::vector<float> q, out, lse;
  phasekv::BatchPrefillArgs<T> args;

  PrefillCase(const pst::BatchShape& s, const std::vector<std::int64_t>& qb, std::uint32_t seed,
              phasekv::StandardVariant var = {}, std::uint32_t layout_seed = 0)
      : c(s, seed, var, layout_seed) {
    for (std::int64_t x : qb) qo.push_back(qo.back() + static_cast<std::int32_t>(x));
    q = pkt::random_floats(static_cast<std::size_t>(qo.back() * c.hq * s.d_k), seed + 99);
    out.assign(static_cast<std::size_t>(qo.back() * c.hq * s.d_v), std::nanf(""));
    lse.assign(static_cast<std::size_t>(qo.back() * c.hq), std::nanf(""));
    args.q = q.data();
    args.qo_indptr = qo.data();
    args.q_heads = c.hq;
    args.kv_heads = s.kv_heads;
    args.d_k = s.d_k;
    args.d_v = s.d_v;
    args.kv = c.args.kv;
    args.variant = c.args.variant;
    args.out = out.data();
    args.lse = lse.data();
  }
  void run(int threads) {
    std::fill(out.begin(), out.end(), std::nanf(""));
    std::fill(lse.begin(), lse.end(), std::nanf(""));
    phasekv::PrefillPlan plan;
    plan.plan(args, threads);
    if (threads == 2) {  // the overload that allocates its own scratch
      for (int w = threads - 1; w >= 0; --w)
        phasekv::batch_prefill_partition(plan, args, w, threads);
      return;
    }
    // the caller's workspace, poisoned, at an odd address (the run aligns it)
    std::vector<unsigned char> ws(plan.workspace_bytes() + 1, 0xFF);
    for (int w = threads - 1; w >= 0; --w)
      phasekv::batch_prefill_partition(plan, args, ws.data() + 1, ws.size() - 1, w, threads);
  }
  std::int64_t queries(std::int64_t b) const { return qo[b + 1] - qo[b]; }
  // cpu::prefill of sequence b over its contiguous buffers (with the per-head origins)
  phasekv::cpu::PrefillArgs<T> single_args(std::int64_t b, float* o, float* l) const {
    const auto& s = c.shape;
    phasekv::cpu::PrefillArgs<T> p;
    p.q = q.data() + qo[b] * c.hq * s.d_k;
    p.num_queries = queries(b);
    p.q_heads = c.hq;
    p.kv_heads = s.kv_heads;
    p.d_k = s.d_k;
    p.d_v = s.d_v;
    p.first = s.lengths[b] - queries(b);
    p.rule = s.rule();
    p.origins = s.origins.empty() ? nullptr : s.origins.data();
    p.raw_k = c.rk(b);
    p.raw_v = c.rv(b);
    p.entry_k = c.ek(b);
    p.entry_v = c.ev(b);
    p.variant = args.variant;
    p.out = o;
    p.lse = l;
    return p;
  }
};

}  // namespace pst
