/// @file
/// @brief Double-precision reference attention over the DESIGN semantics. Straightforward and
/// obviously right rather than fast; every kernel test compares against it.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "phasekv/attention/params.hpp"
#include "phasekv/attention/visible_set.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/view.hpp"
#include "phasekv/phase/geometry.hpp"

PHASEKV_NAMESPACE_BEGIN

/// Reference decode: one query token (`q`: `[q_heads, d_k]`, row-major) attends to every
/// segment of `kv`. Writes `out` (`[q_heads, d_v]`) and `lse` (`[q_heads]`) in double.
///
/// Query head h reads KV head `h / (q_heads / kv_heads)`. Logits follow `variant` exactly as
/// StandardVariant documents, evaluated in double. A logit of -inf gives its key weight 0; with
/// nothing visible, or every logit -inf (and no sink, or a sink of -inf), the output is zero
/// and lse is -inf.
template <class T, class Variant = StandardVariant>
void reference_decode(const float* q, std::int64_t q_heads, const VisibleKV<T>& kv,
                      const Variant& variant, double* out, double* lse) {
  const char* where = "phasekv::reference_decode";
  phasekv::detail::check_arg(q_heads >= 1, where, "q_heads", q_heads, "must be >= 1");
  std::int64_t kv_heads = 0, d_k = 0, d_v = 0;
  for (int s = 0; s < kv.count; ++s) {
    kv_heads = kv.segments[s].keys.heads;
    d_k = kv.segments[s].keys.dim;
    d_v = kv.segments[s].values.dim;
  }
  const std::int64_t group = kv_heads > 0 ? q_heads / kv_heads : 1;
  if (kv_heads > 0)
    phasekv::detail::check_arg(q_heads % kv_heads == 0, where, "q_heads", q_heads,
                               "must be a multiple of the KV head count");
  for (std::int64_t h = 0; h < q_heads; ++h) {
    std::vector<double> logits;
    std::vector<const T*> vals;
    const std::int64_t kh = kv_heads > 0 ? h / group : 0;
    for (int s = 0; s < kv.count; ++s) {
      const KVSegment<T>& seg = kv.segments[s];
      for (std::int64_t t = 0; t < seg.size(); ++t) {
        const T* k = seg.keys.ptr(t, kh);
        double dot = 0.0;
        for (std::int64_t i = 0; i < d_k; ++i)
          dot += static_cast<double>(q[h * d_k + i]) * static_cast<double>(to_float(k[i]));
        double x = static_cast<double>(variant.scale) * dot;
        if (variant.softcap > 0.0f) {
          const double c = variant.softcap;
          x = c * std::tanh(x / c);
        }
        if (seg.kind == SegmentKind::compressed) x += static_cast<double>(variant.entry_bias);
        logits.push_back(x);
        vals.push_back(seg.values.ptr(t, kh));
      }
    }
    double m = -std::numeric_limits<double>::infinity();
    for (double x : logits) m = x > m ? x : m;
    const bool sink = variant.has_sink();
    const double sink_logit = sink ? static_cast<double>(variant.sink(h)) : 0.0;
    if (sink && sink_logit > m) m = sink_logit;
    double* o = out + h * d_v;
    for (std::int64_t i = 0; i < d_v; ++i) o[i] = 0.0;
    if (m == -std::numeric_limits<double>::infinity()) {  // nothing visible, or all masked
      lse[h] = -std::numeric_limits<double>::infinity();
      continue;
    }
    double denom = sink ? std::exp(sink_logit - m) : 0.0;
    for (std::size_t t = 0; t < logits.size(); ++t) {
      const double w = std::exp(logits[t] - m);
      denom += w;
      for (std::int64_t i = 0; i < d_v; ++i) o[i] += w * static_cast<double>(to_float(vals[t][i]));
    }
    for (std::int64_t i = 0; i < d_v; ++i) o[i] /= denom;
    lse[h] = m + std::log(denom);
  }
}

/// The visible set of a query at position `t` (n = t + 1) built from a full raw sequence
/// (`raw_k`/`raw_v`, indexed by absolute position, covering at least `[0, t]`) and the
/// compressed entries (`entry_k`/`entry_v`, indexed by window, at least J(t + 1) of them).
template <class T>
VisibleKV<T> reference_visible(const Geometry& g, std::int64_t local, std::int64_t t,
                               StridedView<const T> raw_k, StridedView<const T> raw_v,
                               StridedView<const T> entry_k, StridedView<const T> entry_v) {
  VisibleSetRequirements req;
  req.raw = "must cover position t";
  req.entries = "must hold J(t + 1) entries";
  return make_visible_kv<T>("phasekv::reference_visible", g.visible(t + 1, local), t + 1, raw_k,
                            raw_v, entry_k, entry_v, req);
}

/// Reference prefill: `T` queries at consecutive positions `first, first + 1, ...` (`q`:
/// `[T, q_heads, d_k]` row-major), each with its own visible set. Writes `out`
/// (`[T, q_heads, d_v]`) and `lse` (`[T, q_heads]`).
template <class T, class Variant = StandardVariant>
void reference_prefill(const float* q, std::int64_t num_queries, std::int64_t q_heads,
                       std::int64_t first, const Geometry& g, std::int64_t local,
                       StridedView<const T> raw_k, StridedView<const T> raw_v,
                       StridedView<const T> entry_k, StridedView<const T> entry_v,
                       const Variant& variant, double* out, double* lse) {
  for (std::int64_t i = 0; i < num_queries; ++i) {
    const VisibleKV<T> kv =
        reference_visible<T>(g, local, first + i, raw_k, raw_v, entry_k, entry_v);
    reference_decode<T>(q + i * q_heads * raw_k.dim, q_heads, kv, variant,
                        out + i * q_heads * raw_v.dim, lse + i * q_heads);
  }
}

PHASEKV_NAMESPACE_END
