/// @file
/// @brief Host/device arithmetic of the DeepSeek-V4 kernels: the indexer score of one entry,
/// the top-k sort key (descending score, ties to the lower index), which rows a sparse
/// attention query visits (contiguous or paged, ragged batches), one tile step of its online
/// softmax and its final normalization, and the compressor's per-channel pooling over input
/// and streaming-state rows with the state's row layout.
///
/// Written once as PHASEKV_HOST_DEVICE code (standard library only): the CUDA kernels of
/// dsv4/cuda call these functions, and the tests run the same functions on the CPU, so the
/// index math, the visibility and the ordering rules are checked without a device.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

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

/// Rows of sequence b in a batch whose rows are concatenated: `[row, row + count)`, given by
/// `indptr[b]` and `indptr[b + 1]` (FlashInfer's `qo_indptr`, the compressor's `chunk_indptr`),
/// or row b alone when `indptr` is null (decode: one row per sequence).
struct ChunkRows {
  std::int64_t row = 0;    ///< First row.
  std::int64_t count = 0;  ///< Rows.
};

/// The rows of sequence `b` (see ChunkRows).
PHASEKV_HOST_DEVICE inline ChunkRows chunk_rows(std::int64_t b, const std::int32_t* indptr) {
  ChunkRows r;
  r.row = indptr != nullptr ? std::int64_t{indptr[b]} : b;
  r.count = indptr != nullptr ? std::int64_t{indptr[b + 1]} - indptr[b] : 1;
  return r;
}

/// Sequence that row `row` of a ragged batch belongs to: the largest b in `[0, batch)` with
/// `indptr[b] <= row` (so sequences without rows are passed over). Needs `indptr[0] = 0 <= row <
/// indptr[batch]`, indptr non-decreasing; binary search, `log2(batch)` reads.
PHASEKV_HOST_DEVICE inline std::int64_t sequence_of_row(std::int64_t row,
                                                        const std::int32_t* indptr,
                                                        std::int64_t batch) {
  std::int64_t lo = 0, hi = batch;
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (std::int64_t{indptr[mid]} <= row)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

/// What query row `row` of a paged sparse attention batch (dsv4::PagedSparseArgs) attends to.
struct PagedSparseQuery {
  std::int64_t seq = 0;          ///< Its sequence b.
  std::int64_t t = 0;            ///< Its position: `n_b - q_b + (row - first row of b)`.
  std::int64_t index_count = 0;  ///< Items of its list: `index_count` with a list, else the
                                 ///< entries visible at t, `floor((t + 1) / ratio)` (0 when
                                 ///< ratio = 0).
  std::int64_t entries = 0;      ///< Entries the sequence holds: `floor(n_b / ratio)`.
};

/// The query of row `row` (see PagedSparseQuery): `qo_indptr` `[batch + 1]` or null (decode),
/// `lengths` `[batch]` the tokens n_b, `has_list` whether index lists are given.
PHASEKV_HOST_DEVICE inline PagedSparseQuery paged_sparse_query(
    std::int64_t row, const std::int32_t* qo_indptr, std::int64_t batch,
    const std::int64_t* lengths, std::int64_t ratio, bool has_list, std::int64_t index_count) {
  PagedSparseQuery q;
  q.seq = qo_indptr != nullptr ? sequence_of_row(row, qo_indptr, batch) : row;
  const ChunkRows rows = chunk_rows(q.seq, qo_indptr);
  const std::int64_t n = lengths[q.seq];
  q.t = n - rows.count + (row - rows.row);
  q.entries = ratio > 0 ? n / ratio : 0;
  q.index_count = has_list ? index_count : (ratio > 0 ? (q.t + 1) / ratio : 0);
  return q;
}

// ---- the compressor (dsv4/compressor.hpp) ----------------------------------------------------

/// Block seen through half `h` of compressor entry `j`: `j - coff + 1 + h` (below 0: absent, the
/// window reaches before token 0).
PHASEKV_HOST_DEVICE inline std::int64_t compressor_block(std::int64_t j, std::int64_t h,
                                                         std::int64_t coff) {
  return j - coff + 1 + h;
}

/// Row of a streaming state (`coff * ratio` rows, compressor.hpp's layout) that holds token p:
/// block `p / ratio` lives in slot `(p / ratio) mod coff`, its rows in order.
PHASEKV_HOST_DEVICE inline std::int64_t compressor_state_row(std::int64_t p, std::int64_t ratio,
                                                             std::int64_t coff) {
  return (p / ratio) % coff * ratio + p % ratio;
}

/// First token whose rows a streaming state holds after n tokens: it holds tokens
/// `[compressor_state_begin(n), n)`, the rows of the block in progress and, with coff = 2, of
/// the last complete block (what the next entry pools besides new tokens).
PHASEKV_HOST_DEVICE inline std::int64_t compressor_state_begin(std::int64_t n, std::int64_t ratio,
                                                               std::int64_t coff) {
  const std::int64_t b = (n / ratio - coff + 1) * ratio;
  return b > 0 ? b : 0;
}

/// The kv and score rows one sequence's compressor reads while it appends tokens `[n, n +
/// count)`: token p >= n is input row `p - n`; token p < n comes from the streaming state (row
/// compressor_state_row(p)), which holds `[compressor_state_begin(n), n)`. A batch compression
/// is the case n = 0 (every row from the input, no state).
template <class T>
struct CompressorRows {
  const T* kv = nullptr;           ///< Input kv rows of tokens `[n, ...)`.
  const T* score = nullptr;        ///< Input score rows.
  const T* state_kv = nullptr;     ///< The state's kv rows (may be null when n = 0).
  const T* state_score = nullptr;  ///< The state's score rows.
  std::int64_t n = 0;              ///< Tokens before the input.
  std::int64_t ratio = 1;          ///< S.
  std::int64_t coff = 1;           ///< 1 or 2.
  std::int64_t row_width = 1;      ///< `coff * dim` elements a row.

  /// Offset of token p's row from its base (input or state).
  PHASEKV_HOST_DEVICE std::int64_t offset(std::int64_t p) const {
    return (p >= n ? p - n : compressor_state_row(p, ratio, coff)) * row_width;
  }
  /// kv row of token p.
  PHASEKV_HOST_DEVICE const T* kv_row(std::int64_t p) const {
    return (p >= n ? kv : state_kv) + offset(p);
  }
  /// score row of token p.
  PHASEKV_HOST_DEVICE const T* score_row(std::int64_t p) const {
    return (p >= n ? score : state_score) + offset(p);
  }
};

/// Channel c of compressor entry j (the formulas of compressor.hpp): over the window's tokens p
/// (halves h in order, rows in order) `z = score(p)[h*d + c] + ape[p mod S][h*d + c]`, the max
/// m of the z, then `den += w`, `acc = fmaf(w, kv(p)[h*d + c], acc)` with `w = expf(z - m)`;
/// returns `acc / den`. `ape` is `[ratio, coff * dim]`. One thread per channel on the device;
/// the CUDA batch and streaming paths both call it, so they agree bit for bit. The exp is the
/// platform's expf (CUDA's, within 2 ulp, on the device), not the CPU kernel's polynomial, so
/// the bits differ from dsv4::compress by a few ulp of the weights.
template <class T>
PHASEKV_HOST_DEVICE inline float compressor_pool_channel(const CompressorRows<T>& rows,
                                                         const float* ape, std::int64_t j,
                                                         std::int64_t c, std::int64_t dim) {
  const std::int64_t S = rows.ratio, coff = rows.coff, rw = rows.row_width;
  float m = -HUGE_VALF;
  for (std::int64_t h = 0; h < coff; ++h) {
    const std::int64_t b = compressor_block(j, h, coff);
    if (b < 0) continue;
    for (std::int64_t i = 0; i < S; ++i) {
      const std::int64_t ch = h * dim + c;
      const float z = to_float(rows.score_row(b * S + i)[ch]) + ape[i * rw + ch];
      m = z > m ? z : m;
    }
  }
  float den = 0.0f, acc = 0.0f;
  for (std::int64_t h = 0; h < coff; ++h) {
    const std::int64_t b = compressor_block(j, h, coff);
    if (b < 0) continue;
    for (std::int64_t i = 0; i < S; ++i) {
      const std::int64_t p = b * S + i, ch = h * dim + c;
      const float z = to_float(rows.score_row(p)[ch]) + ape[i * rw + ch];
      const float w = ::expf(z - m);
      den += w;
      acc = ::fmaf(w, to_float(rows.kv_row(p)[ch]), acc);
    }
  }
  return acc / den;
}

/// Storage conversion of a pooled value: E(x) rounded to nearest even (float, bf16_t, f16_t),
/// FP8 E4M3 saturating at 448 (float_to_fp8_e4m3). The caller divides by the tensor's scale.
template <class E>
PHASEKV_HOST_DEVICE inline E store_element(float x) {
  if constexpr (std::is_same<E, fp8_e4m3_t>::value)
    return float_to_fp8_e4m3(x);
  else
    return from_float<E>(x);
}

}  // namespace dsv4
PHASEKV_NAMESPACE_END
