/// @file
/// @brief Online-softmax state and the exact log-sum-exp merge of partial results, written once
/// for host and device.
///
/// A *partial result* is a normalized output vector `o` together with its log-sum-exp `lse`:
/// `o = sum_i exp(s_i - lse) v_i`, `lse = log sum_i exp(s_i)`. Two partials over disjoint key
/// sets merge exactly. An empty partial has `lse = -inf` (its output is ignored), and merging
/// with it is the identity, so empty split-KV partitions are safe.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "phasekv/core/config.hpp"

PHASEKV_NAMESPACE_BEGIN

/// -infinity as a float, the log-sum-exp of an empty set.
/// (Written with HUGE_VALF rather than std::numeric_limits, whose constexpr host function
/// nvcc refuses in device code without --expt-relaxed-constexpr.)
PHASEKV_HOST_DEVICE constexpr float neg_inf() { return -HUGE_VALF; }

/// Running max and denominator of an online softmax over a stream of logits.
///
/// Usage: for each logit s, `float c = st.update(s);` returns the factor by which previously
/// accumulated numerators must be rescaled, and `st.weight(s)` the weight of the new value;
/// at the end divide by `st.denom` and take `st.lse()`.
struct OnlineSoftmax {
  float max = neg_inf();  ///< Largest logit so far (-inf when empty).
  float denom = 0.0f;     ///< Sum of exp(s - max) so far.

  /// True while no logit has been added.
  PHASEKV_HOST_DEVICE bool empty() const { return denom == 0.0f; }

  /// Raises the running max to include `s_max` (the max of a block of logits). Returns the
  /// rescale factor for previously accumulated numerators (1 when the max did not change).
  PHASEKV_HOST_DEVICE float raise_max(float s_max) {
    if (!(s_max > max)) return 1.0f;
    const float c = (max == neg_inf()) ? 0.0f : expf(max - s_max);
    denom *= c;
    max = s_max;
    return c;
  }
  /// Weight `exp(s - max)` of a logit already covered by raise_max; also adds it to denom.
  PHASEKV_HOST_DEVICE float add(float s) {
    const float w = expf(s - max);
    denom += w;
    return w;
  }
  /// Log-sum-exp of all logits added (-inf when empty).
  PHASEKV_HOST_DEVICE float lse() const { return empty() ? neg_inf() : max + logf(denom); }
};

/// Merges partial `(o_b, lse_b)` into `(o_a, lse_a)` in place; `dv` elements.
/// Either side may be empty (lse = -inf).
PHASEKV_HOST_DEVICE inline void merge_partial(float* o_a, float& lse_a, const float* o_b,
                                              float lse_b, std::int64_t dv) {
  if (lse_b == neg_inf()) return;
  if (lse_a == neg_inf()) {
    for (std::int64_t i = 0; i < dv; ++i) o_a[i] = o_b[i];
    lse_a = lse_b;
    return;
  }
  const float m = lse_a > lse_b ? lse_a : lse_b;
  const float wa = expf(lse_a - m);
  const float wb = expf(lse_b - m);
  const float inv = 1.0f / (wa + wb);
  for (std::int64_t i = 0; i < dv; ++i) o_a[i] = (wa * o_a[i] + wb * o_b[i]) * inv;
  lse_a = m + logf(wa + wb);
}

/// Adds a sink logit to a finished partial: the sink joins the denominator and contributes no
/// value. With an empty partial the output stays zero and lse becomes `sink`.
PHASEKV_HOST_DEVICE inline void apply_sink(float* o, float& lse, float sink, std::int64_t dv) {
  if (lse == neg_inf()) {
    for (std::int64_t i = 0; i < dv; ++i) o[i] = 0.0f;
    lse = sink;
    return;
  }
  const float m = lse > sink ? lse : sink;
  const float wa = expf(lse - m);
  const float ws = expf(sink - m);
  const float f = wa / (wa + ws);
  for (std::int64_t i = 0; i < dv; ++i) o[i] *= f;
  lse = m + logf(wa + ws);
}

PHASEKV_NAMESPACE_END
