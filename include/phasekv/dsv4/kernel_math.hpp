/// @file
/// @brief Host/device arithmetic of the DeepSeek-V4 kernels: the indexer score of one entry,
/// the top-k sort key (descending score, ties to the lower index), which rows a sparse
/// attention query visits, one tile step of its online softmax and its final normalization.
///
/// Written once as PHASEKV_HOST_DEVICE code (standard library only): the CUDA kernels of
/// dsv4/cuda call these functions, and the tests run the same functions on the CPU, so the
/// index math, the visibility and the ordering rules are checked without a device.
#pragma once

#include <cmath>
#include <cstdint>

#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/dsv4/fp8.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace dsv4 {

/// Indexer score I(t, j) = sum_h w(h) * max(0, <q(h), k>) of one key row `key` (`dim`
/// elements) for a query `q` (`[heads, dim]` f32) with weights `w` (`[heads]`).
///
/// Order of operations (fixed, so host and device give the same bits): per head, 16 partial
/// sums `acc[i % 16] = fma(q[i], k[i], acc[i % 16])` over i in order, then the halving tree
/// `acc[k] += acc[k + s]` for s = 8, 4, 2, 1 (the CPU indexer's order); the head sum is
/// `s = fma(w[h], relu(dot), s)` in head order. Every multiply-add is an explicit fmaf, so no
/// compiler contraction choice changes the result.
template <class T>
PHASEKV_HOST_DEVICE inline float index_score(const float* q, const float* w, const T* key,
                                             std::int64_t heads, std::int64_t dim) {
  constexpr int B = 16;
  float s = 0.0f;
  for (std::int64_t h = 0; h < heads; ++h) {
    const float* qh = q + h * dim;
    float acc[B];
    for (int k = 0; k < B; ++k) acc[k] = 0.0f;
    std::int64_t i = 0;
    for (; i + B <= dim; i += B)
      for (int k = 0; k < B; ++k) acc[k] = ::fmaf(qh[i + k], to_float(key[i + k]), acc[k]);
    for (int k = 0; i + k < dim; ++k) acc[k] = ::fmaf(qh[i + k], to_float(key[i + k]), acc[k]);
    for (int st = B / 2; st >= 1; st /= 2)
      for (int k = 0; k < st; ++k) acc[k] += acc[k + st];
    s = ::fmaf(w[h], acc[0] > 0.0f ? acc[0] : 0.0f, s);
  }
  return s;
}

/// Sort key of entry `j` (0 <= j < 2^31) with score `score` for the indexer's top-k: sorting
/// keys in descending unsigned order gives descending scores, equal scores by ascending index
/// (the CPU's rule). The high 32 bits map the float monotonically (-0 counts as +0; a NaN
/// sorts above +inf), the low 32 bits hold `~j`.
PHASEKV_HOST_DEVICE inline std::uint64_t topk_key(float score, std::int32_t j) {
  std::uint32_t b = fp_bits(score);
  if (b == 0x80000000u) b = 0u;  // -0 == +0
  const std::uint32_t ord = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<std::uint64_t>(ord) << 32) |
         static_cast<std::uint64_t>(~static_cast<std::uint32_t>(j));
}

/// Entry index of a topk_key().
PHASEKV_HOST_DEVICE inline std::int32_t topk_key_index(std::uint64_t key) {
  return static_cast<std::int32_t>(~static_cast<std::uint32_t>(key & 0xffffffffu));
}

/// Score of a topk_key() (the original bits, except -0 which comes back as +0).
PHASEKV_HOST_DEVICE inline float topk_key_score(std::uint64_t key) {
  const auto ord = static_cast<std::uint32_t>(key >> 32);
  return fp_from_bits((ord & 0x80000000u) ? (ord & 0x7fffffffu) : ~ord);
}

/// Raw rows of the sliding window of a query at position t: positions `[lo, lo + count)`.
struct SparseWindow {
  std::int64_t lo = 0;     ///< First position.
  std::int64_t count = 0;  ///< Rows (min(window, t + 1)).
};

/// The sliding window `[max(0, t + 1 - window), t]` of a query at position t (window >= 0).
PHASEKV_HOST_DEVICE inline SparseWindow sparse_window(std::int64_t t, std::int64_t window) {
  SparseWindow w;
  w.lo = t + 1 - window > 0 ? t + 1 - window : 0;
  w.count = t + 1 - w.lo;
  if (window == 0) w.count = 0;
  return w;
}

/// What item `k` of a sparse attention query is: items `[0, index_count)` are the entries of
/// the index list (or `entries_first + k` without a list), items `[index_count, index_count +
/// window.count)` the window's raw rows in position order.
struct SparseItem {
  /// What an item is.
  enum Kind : int {
    skip = 0,     ///< A -1 of the index list: no row.
    entry = 1,    ///< A compressed entry present in the entries.
    raw = 2,      ///< A raw row of the sliding window.
    invalid = 3,  ///< A list value that is neither -1 nor a present entry.
  };
  Kind kind = skip;      ///< skip: a -1 of the list; invalid: a list value not present.
  std::int64_t row = 0;  ///< Entry index (entry) or raw position (raw).
};

/// Item `k` of a query (see SparseItem). `list` is the query's index list or null; entries
/// `[entries_first, entries_first + entries_count)` are present.
PHASEKV_HOST_DEVICE inline SparseItem sparse_item(std::int64_t k, const std::int32_t* list,
                                                  std::int64_t index_count,
                                                  std::int64_t entries_first,
                                                  std::int64_t entries_count, SparseWindow win) {
  SparseItem it;
  if (k < index_count) {
    if (list == nullptr) {
      it.kind = SparseItem::entry;
      it.row = entries_first + k;
      return it;
    }
    const std::int64_t j = list[k];
    it.row = j;
    if (j == -1)
      it.kind = SparseItem::skip;
    else if (j >= entries_first && j < entries_first + entries_count)
      it.kind = SparseItem::entry;
    else
      it.kind = SparseItem::invalid;
    return it;
  }
  it.kind = SparseItem::raw;
  it.row = win.lo + (k - index_count);
  return it;
}

/// One tile step of one head's online softmax: `logit[0, n)` are the tile's logits (-inf for
/// a skipped item). Raises the running max `m` to the tile's, rescales `den`, writes the
/// weights `p[r] = exp(logit[r] - m)` (0 for -inf) times `row_scale[r]` and adds the
/// unscaled weights to `den`. Returns the factor the accumulator must be multiplied by first
/// (0 when nothing was seen before, 1 when the max did not move).
PHASEKV_HOST_DEVICE inline float softmax_tile_update(float& m, float& den, const float* logit,
                                                     const float* row_scale, int n, float* p) {
  float bmax = -HUGE_VALF;
  for (int r = 0; r < n; ++r) bmax = logit[r] > bmax ? logit[r] : bmax;
  float c = 1.0f;
  if (bmax > m) {
    c = m == -HUGE_VALF ? 0.0f : ::expf(m - bmax);
    den *= c;
    m = bmax;
  }
  for (int r = 0; r < n; ++r) {
    const float e = logit[r] == -HUGE_VALF ? 0.0f : ::expf(logit[r] - m);
    den += e;
    p[r] = e * row_scale[r];
  }
  return c;
}

/// Final factors of one head: `out = (acc * f1) * f2`, and its log-sum-exp.
struct SparseFinish {
  float f1 = 1.0f;   ///< Sink rescale of the accumulator.
  float f2 = 1.0f;   ///< 1 / denominator (0 when nothing is visible).
  float lse = 0.0f;  ///< Log-sum-exp of the logits and the sink (-inf when empty).
};

/// Applies the sink (when `has_sink`) to the running max `m` and denominator `den` as the CPU
/// kernel does, then normalizes: with nothing visible and no sink, f1 = f2 = 0 and lse = -inf.
PHASEKV_HOST_DEVICE inline SparseFinish sparse_finish(float m, float den, bool has_sink,
                                                      float sink) {
  SparseFinish f;
  if (has_sink) {
    if (sink > m) {
      const float c = m == -HUGE_VALF ? 0.0f : ::expf(m - sink);
      den = den * c + 1.0f;
      f.f1 = c;
      m = sink;
    } else {
      den += ::expf(sink - m);
    }
  }
  if (den == 0.0f) {
    f.f1 = 0.0f;
    f.f2 = 0.0f;
    f.lse = -HUGE_VALF;
    return f;
  }
  f.f2 = 1.0f / den;
  f.lse = m + ::logf(den);
  return f;
}

}  // namespace dsv4
PHASEKV_NAMESPACE_END
