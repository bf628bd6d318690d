/// @file
/// @brief DeepSeek-V4 sparse attention: per query token, MQA over the sliding window's raw
/// latent rows plus a list of selected compressed entries, K = V shared rows read once, a
/// per-head sink in the denominator.
///
/// For a query at position t with heads `q(h)` (each `dim` wide), the visible rows are
///   - raw rows of positions `[max(0, t + 1 - window), t]` (the sliding window), and
///   - compressed entries `e(j)` for each j of the query's index list (top-k from the indexer,
///     -1 entries skipped; or all entries `j < count` when no list is given, as in HCA).
/// Each row r is both key and value: `s(h, r) = scale * row_scale * <q(h), r>` over all `dim`
/// channels, and the output is `o(h) = sum_r softmax(s)(h, r) * row_scale * r[0 : dim_v]`, with
/// `exp(sink(h))` added to the softmax denominator when sinks are given. `lse(h)` is the
/// log-sum-exp of the logits and the sink. With nothing visible and no sink, o = 0 and
/// lse = -inf.
///
/// Storage: f32, bf16, f16 or FP8 E4M3 (each row tensor has its own `scale`, 1 for the
/// others), accumulation in f32. A row is converted to f32 once and serves every head's logit
/// and output.
///
/// Kernel: the rows are taken in blocks of 16 (the selected entries in list order, then the
/// window in position order), run by the CPU's instruction-set build (run-time dispatch;
/// PHASEKV_ARCH or an explicit `Arch` tag forces one): per block, the logits of tiles of heads
/// x rows (each logit W lane partial sums over the channels added by a fixed tree, W = 16, 8,
/// 4 or 1 lanes), a vectorized online-softmax update, and the weighted rows added to tiles of
/// heads x channels in row order. The order of the arithmetic is fixed per build (same bits on
/// every call, contiguous or paged, for any page size, split and thread count); builds may
/// differ in the last bits.
///
/// Two ways to hold the rows, one kernel: contiguous tensors (LatentRows, sparse_attention) and
/// page pools with block tables for a batch of sequences (PagedSparseArgs,
/// paged_sparse_attention; decode and ragged prefill), bit-equal to each other.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "phasekv/attention/cpu/dispatch.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/prefetch.hpp"
#include "phasekv/core/target.hpp"
#include "phasekv/cpu/arch.hpp"
#include "phasekv/cpu/vec.hpp"
#include "phasekv/dsv4/cache_format.hpp"
#include "phasekv/dsv4/fp8.hpp"
#include "phasekv/dsv4/paged_latent.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace dsv4 {

/// Shape and softmax parameters of a sparse attention call.
struct SparseAttentionParams {
  std::int64_t heads = 64;       ///< Query heads sharing one latent (1 to 128 and beyond).
  std::int64_t dim = 512;        ///< Row width used for the logits (512; 576 works too).
  std::int64_t dim_v = 512;      ///< Leading channels of a row used as the value (<= dim).
  std::int64_t window = 128;     ///< Sliding window of raw tokens (0: none).
  float scale = 0.0441941738f;   ///< Softmax scale (V4: dim^-1/2).
  const float* sinks = nullptr;  ///< Per-head sink logits `[heads]`, or null for none.

  /// Host check; throws phasekv::invalid_argument naming `where` and the bad field.
  void check(const char* where) const {
    phasekv::detail::check_arg(heads >= 1 && heads <= 4096, where, "params.heads", heads,
                               "must be in [1, 4096]");
    phasekv::detail::check_arg(dim >= 1 && dim <= 65536, where, "params.dim", dim,
                               "must be in [1, 65536]");
    phasekv::detail::check_arg(dim_v >= 1 && dim_v <= dim, where, "params.dim_v", dim_v,
                               "must be in [1, params.dim]");
    phasekv::detail::check_arg(window >= 0 && window <= (std::int64_t{1} << 40), where,
                               "params.window", window, "must be in [0, 2^40]");
    phasekv::detail::check_arg(std::isfinite(scale), where, "params.scale", scale,
                               "must be finite");
  }
};

/// Rows of one tensor (raw tokens or compressed entries), `dim` wide, row r at
/// `data + r * stride`. `first` is the position (raw) or index (entries) of row 0; `count`
/// rows are present. Real values are the stored values times `scale` (a per-tensor FP8 scale;
/// 1 for f32, bf16, f16).
///
/// Rows may also lie in blocks (pages) of `page_size` rows, block i at
/// `data + i * page_stride`, row r in block r / page_size, slot r % page_size. The FlashMLA FP8
/// cache formats (model1_fp8_t, v32_fp8_t: see dsv4/cache_format.hpp) count strides in bytes;
/// MODEL1 needs blocks (its scales follow each block's data), V3.2 rows are `stride` >= 656
/// bytes apart.
template <class T>
struct LatentRows {
  const T* data = nullptr;       ///< Row 0.
  std::int64_t first = 0;        ///< Position / index of row 0.
  std::int64_t count = 0;        ///< Rows present.
  std::int64_t stride = 0;       ///< Elements between rows (>= dim) within a block.
  float scale = 1.0f;            ///< Per-tensor scale of the stored values.
  std::int64_t page_size = 0;    ///< Rows per block, or 0: one run of rows.
  std::int64_t page_stride = 0;  ///< Elements between blocks (page_size > 0).

  /// Row holding position / index `p` (no check): a pointer, or a QuantRow for the FP8 cache
  /// formats.
  PHASEKV_HOST_DEVICE detail::row_t<T> row(std::int64_t p) const {
    const std::int64_t r = p - first;
    if (page_size > 0)
      return CacheFormat<T>::row(data + (r / page_size) * page_stride, page_size, r % page_size,
                                 stride);
    return CacheFormat<T>::row(data, count, r, stride);
  }
};

namespace detail {

inline constexpr std::int64_t kSparseBlock = 16;  // rows converted and scored together

// Running state of the online softmax of every head over the rows seen so far. Heads are
// padded to hp (a multiple of 4; the padding heads have a zero query), channels to dp / dvp
// (multiples of 16; the padding is zero in the query and the rows). The arrays live in one
// allocation, each 64-byte aligned (vector loads that split cache lines cost the block kernel
// about a fifth of its speed). Not copyable: the pointers point into `buf`.
struct SparseAcc {
  std::int64_t hp = 0, dp = 0, dvp = 0;
  const float* fp8 = nullptr;  // FP8 E4M3 code -> f32
  std::vector<float> buf;      // storage of the four arrays below
  float* qp = nullptr;         // [hp, dp] the query, padded
  float* rows = nullptr;       // [kSparseBlock, dp] rows of the current block, f32
  float* logit = nullptr;      // [hp, kSparseBlock] logits, then the block's weights
  float* acc = nullptr;        // [hp, dvp] numerators
  std::vector<float> mx;       // [hp] running max
  std::vector<float> den;      // [hp] running denominator

  SparseAcc() = default;
  SparseAcc(const SparseAcc&) = delete;
  SparseAcc& operator=(const SparseAcc&) = delete;
};

// The 256 values of FP8 E4M3 (the block kernel converts FP8 rows by table).
inline const float* fp8_e4m3_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> x{};
    for (int i = 0; i < 256; ++i)
      x[static_cast<std::size_t>(i)] = fp8_e4m3_to_float(fp8_e4m3_t{static_cast<std::uint8_t>(i)});
    return x;
  }();
  return t.data();
}

}  // namespace detail
}  // namespace dsv4
PHASEKV_NAMESPACE_END

#if !defined(PHASEKV_DOXYGEN)  // the block kernel, once per target pass
#define PHASEKV_TARGET_BODY "phasekv/dsv4/cpu/sparse_pass.inl"
#include "phasekv/core/foreach_target.inc"
#endif

PHASEKV_NAMESPACE_BEGIN
namespace dsv4 {
namespace detail {

// Adds the `n` rows `rows[0, n)` (real values: the rows times `row_scale`) to every head's
// online softmax (see dsv4/cpu/sparse_pass.inl), in the instruction-set build of `Arch`
// (arch::Auto: the CPU's, cpu::active_arch(), so PHASEKV_ARCH forces one).
template <class Arch, class T>
void sparse_block(const SparseAttentionParams& p, SparseAcc& a, const row_t<T>* rows,
                  std::int64_t n, float row_scale) {
  cpu::detail::with_arch<Arch>([&](auto tag) {
    using A = decltype(tag);
    dsv4_sparse_block(cpu::detail::target_t<A>{}, tag, static_cast<const T*>(nullptr), p, a, rows,
                      n, row_scale, a.fp8);
  });
}

template <class T, class Arch>
struct SparseGather {
  const SparseAttentionParams& p;
  SparseAcc& a;
  std::int64_t n = 0;
  float row_scale = 1.0f;
  row_t<T> rows[kSparseBlock] = {};

  void flush() {
    if (n > 0) sparse_block<Arch, T>(p, a, rows, n, row_scale);
    n = 0;
  }
  // Queues one row for the block (flushing when full or when the tensor scale changes).
  void add(row_t<T> row, float scale) {
    if (n > 0 && scale != row_scale) flush();
    row_scale = scale;
    rows[n] = row;
    if (++n == kSparseBlock) flush();
  }
};

inline void sparse_acc_init(const SparseAttentionParams& p, SparseAcc& a) {
  a.hp = (p.heads + 3) / 4 * 4;
  a.dp = (p.dim + 15) / 16 * 16;
  a.dvp = (p.dim_v + 15) / 16 * 16;
  a.fp8 = fp8_e4m3_table();
  const std::int64_t nq = a.hp * a.dp, nr = kSparseBlock * a.dp, nl = a.hp * kSparseBlock;
  const std::int64_t na = a.hp * a.dvp;  // each a multiple of 16 floats (64 bytes)
  a.buf.assign(static_cast<std::size_t>(nq + nr + nl + na + 16), 0.0f);
  const std::uintptr_t base = reinterpret_cast<std::uintptr_t>(a.buf.data());
  a.qp = a.buf.data() + ((64 - base % 64) % 64) / sizeof(float);
  a.rows = a.qp + nq;
  a.logit = a.rows + nr;
  a.acc = a.logit + nl;
  a.mx.resize(static_cast<std::size_t>(a.hp));
  a.den.resize(static_cast<std::size_t>(a.hp));
}

// Bytes of one latent row of `dim` elements of T (for prefetching; a quantized format's
// data part).
template <class T>
constexpr std::int64_t row_bytes(std::int64_t dim) {
  if constexpr (CacheFormat<T>::quantized)
    return CacheFormat<T>::data_bytes;
  else
    return dim * static_cast<std::int64_t>(sizeof(T));
}

// Checks a contiguous row tensor's layout against params.dim (strides, blocks, formats).
template <class T>
void check_rows(const LatentRows<T>& r, std::int64_t dim, const char* where, const char* name) {
  using phasekv::detail::check_arg;
  const std::string n(name);
  check_arg(r.page_size >= 0, where, (n + ".page_size").c_str(), r.page_size, "must be >= 0");
  if constexpr (CacheFormat<T>::quantized) {
    check_format_rows<T>(dim, r.page_size, r.stride, r.page_stride, where, n);
  } else {
    check_arg(r.stride >= dim, where, (n + ".stride").c_str(), r.stride, "must be >= params.dim");
    if (r.page_size > 0)
      check_arg(r.page_stride >= r.page_size * r.stride, where, (n + ".page_stride").c_str(),
                r.page_stride, "must be >= page_size * stride");
  }
}

// Checks `ratio` of a contiguous call (CPU or CUDA): without index lists a chunk of queries needs
// it (each query sees the entries below (t + 1) / ratio).
inline void check_hca_ratio(bool lists, std::int64_t index_count, std::int64_t ratio,
                            std::int64_t num_queries, const char* where) {
  using phasekv::detail::check_arg;
  check_arg(ratio >= 0 && ratio <= (std::int64_t{1} << 40), where, "ratio", ratio,
            "must be in [0, 2^40]");
  check_arg(lists || index_count == 0 || ratio > 0 || num_queries <= 1, where, "num_queries",
            num_queries,
            "must be 1 when indices is null and ratio is 0 (the queries of a chunk see different "
            "entries: pass ratio, or call once per query)");
}

// Entries a query at t attends without a list with `ratio` > 0: those of [first, first +
// index_count) below (t + 1) / ratio (CPU and CUDA).
PHASEKV_HOST_DEVICE inline std::int64_t hca_visible_count(std::int64_t t, std::int64_t ratio,
                                                          std::int64_t first,
                                                          std::int64_t index_count) {
  const std::int64_t vis = (t + 1) / ratio - first;
  return vis < 0 ? 0 : (vis < index_count ? vis : index_count);
}

// One query at position t over any row sources (`raw.row(p)`, `entries.row(j)` and their
// `scale`): contiguous LatentRows and paged rows run this same code, so they agree bit for bit.
// With `list` null the query attends to the entries [entries.first, + index_count) of a
// contiguous tensor, [0, index_count) of a paged one.
template <class T, class Arch, class RawRows, class EntryRows, class Index = std::int32_t>
void sparse_query(const SparseAttentionParams& params, const float* qq, const RawRows& raw,
                  const EntryRows& entries, const Index* list, std::int64_t index_count,
                  std::int64_t t, float* out, float* lse, SparseAcc& a) {
  const std::int64_t H = params.heads, dv = params.dim_v, d = params.dim;
  for (std::int64_t h = 0; h < H; ++h)
    std::copy(qq + h * d, qq + (h + 1) * d, a.qp + h * a.dp);  // padding stays zero
  std::fill(a.acc, a.acc + a.hp * a.dvp, 0.0f);
  std::fill(a.mx.begin(), a.mx.end(), -HUGE_VALF);
  std::fill(a.den.begin(), a.den.end(), 0.0f);
  SparseGather<T, Arch> g{params, a};
  const std::int64_t e0 = list ? 0 : entries.first;
  const std::int64_t rb = row_bytes<T>(d);
  for (std::int64_t k = 0; k < index_count; ++k) {
    if (k + kSparseBlock < index_count) {  // a block ahead: gathered rows miss the caches
      const std::int64_t ja = list ? list[k + kSparseBlock] : e0 + k + kSparseBlock;
      if (ja >= 0) phasekv::detail::prefetch_l2(row_address(entries.row(ja)), rb);
    }
    const std::int64_t j = list ? list[k] : e0 + k;
    if (j >= 0) g.add(entries.row(j), entries.scale);
  }
  g.flush();
  if (params.window > 0)
    for (std::int64_t pos = std::max<std::int64_t>(0, t + 1 - params.window); pos <= t; ++pos) {
      if (pos + kSparseBlock <= t)
        phasekv::detail::prefetch_l2(row_address(raw.row(pos + kSparseBlock)), rb);
      g.add(raw.row(pos), raw.scale);
    }
  g.flush();
  for (std::int64_t h = 0; h < H; ++h) {
    float* o = out + h * dv;
    const float* acc = a.acc + h * a.dvp;
    float m = a.mx[static_cast<std::size_t>(h)];
    float den = a.den[static_cast<std::size_t>(h)];
    if (params.sinks != nullptr) {
      const float sk = params.sinks[h];
      if (sk > m) {
        const float c = m == -HUGE_VALF ? 0.0f : std::exp(m - sk);
        den = den * c + 1.0f;
        for (std::int64_t i = 0; i < dv; ++i) o[i] = acc[i] * c;
        m = sk;
      } else {
        den += std::exp(sk - m);
        for (std::int64_t i = 0; i < dv; ++i) o[i] = acc[i];
      }
    } else {
      for (std::int64_t i = 0; i < dv; ++i) o[i] = acc[i];
    }
    if (den == 0.0f) {
      for (std::int64_t i = 0; i < dv; ++i) o[i] = 0.0f;
      lse[h] = -HUGE_VALF;
      continue;
    }
    const float inv = 1.0f / den;
    for (std::int64_t i = 0; i < dv; ++i) o[i] *= inv;
    lse[h] = m + std::log(den);
  }
}

}  // namespace detail

/// Sparse attention for `num_queries` query tokens at positions `first_position + i`.
///
/// - `q`: `[num_queries, heads, dim]` f32.
/// - `raw`: raw latent rows by position; must hold `[max(0, t + 1 - window), t]` for every
///   query t (row p at `raw.row(p)`).
/// - `entries`: compressed entries by index (`entries.first` is usually 0).
/// - `indices`: `[num_queries, index_count]` int32, -1 = no entry; each other value must be an
///   entry present in `entries`. When null (HCA), query t attends to the entries of
///   `[entries.first, entries.first + index_count)` it can see: with `ratio` > 0 those below
///   `J(t + 1) = floor((t + 1) / ratio)` (causal per query, as paged_sparse_attention does);
///   with `ratio` = 0 all of them, which is allowed for one query only (`num_queries` = 1).
/// - writes `out` `[num_queries, heads, dim_v]` and `lse` `[num_queries, heads]`.
/// - `ratio`: the compression ratio S of the entries (read only when `indices` is null).
///
/// Every argument is checked (indices included) before anything is written; errors throw
/// phasekv::invalid_argument (capacity_error for rows that are not present) naming the
/// argument and the value.
///
/// `Arch` picks the block kernel's instruction-set build: cpu::arch::Auto (the default) runs
/// the CPU's (cpu::active_arch(): the widest it supports, or the one the environment variable
/// PHASEKV_ARCH names); an explicit tag (cpu::arch::Scalar, Avx2, Avx512, Neon) runs that one,
/// or throws phasekv::invalid_argument naming it when this CPU cannot (cpu::check_cpu_runs). Builds
/// may differ in the last bits; one build gives the same bits on every call, paged or contiguous.
template <class T, class Arch = cpu::arch::Auto>
void sparse_attention(const SparseAttentionParams& params, const float* q, const LatentRows<T>& raw,
                      const LatentRows<T>& entries, const std::int32_t* indices,
                      std::int64_t index_count, std::int64_t first_position,
                      std::int64_t num_queries, float* out, float* lse, std::int64_t ratio = 0) {
  const char* where = "phasekv::dsv4::sparse_attention";
  params.check(where);
  using phasekv::detail::check_arg;
  check_arg(num_queries >= 0, where, "num_queries", num_queries, "must be >= 0");
  check_arg(first_position >= 0 && first_position <= (std::int64_t{1} << 62) - num_queries, where,
            "first_position", first_position, "must be in [0, 2^62 - num_queries]");
  check_arg(index_count >= 0, where, "index_count", index_count, "must be >= 0");
  detail::check_hca_ratio(indices != nullptr, index_count, ratio, num_queries, where);
  if (num_queries == 0) return;
  check_arg(q != nullptr, where, "q", "null", "must not be null");
  check_arg(out != nullptr && lse != nullptr, where, "out", "null", "out and lse must not be null");
  check_arg(std::isfinite(raw.scale) && raw.scale > 0.0f, where, "raw.scale", raw.scale,
            "must be finite and > 0");
  check_arg(std::isfinite(entries.scale) && entries.scale > 0.0f, where, "entries.scale",
            entries.scale, "must be finite and > 0");
  if (params.window > 0) {
    const std::int64_t lo = std::max<std::int64_t>(0, first_position + 1 - params.window);
    const std::int64_t hi = first_position + num_queries;  // one past the last raw position
    check_arg(raw.data != nullptr, where, "raw.data", "null", "must not be null (window > 0)");
    detail::check_rows(raw, params.dim, where, "raw");
    check_arg<capacity_error>(raw.first <= lo, where, "raw.first", raw.first,
                              "must be <= the first windowed position of the first query");
    check_arg<capacity_error>(raw.first + raw.count >= hi, where, "raw.count", raw.count,
                              "must reach the last query's position");
  }
  if (index_count > 0 && entries.count > 0) {
    check_arg(entries.data != nullptr, where, "entries.data", "null",
              "must not be null when entries.count > 0");
    detail::check_rows(entries, params.dim, where, "entries");
  }
  if (index_count > 0) {
    if (indices == nullptr) {
      check_arg<capacity_error>(index_count <= entries.count, where, "index_count", index_count,
                                "must be <= entries.count when indices is null");
    } else {
      for (std::int64_t i = 0; i < num_queries * index_count; ++i) {
        const std::int64_t j = indices[i];
        if (j == -1) continue;
        check_arg<capacity_error>(j >= entries.first && j < entries.first + entries.count, where,
                                  "indices[i]", j, "must be -1 or an entry present in entries");
      }
    }
  }
  detail::SparseAcc a;
  detail::sparse_acc_init(params, a);
  for (std::int64_t qi = 0; qi < num_queries; ++qi) {
    const std::int64_t t = first_position + qi;
    std::int64_t count = index_count;  // HCA with a ratio: the entries visible at t only
    if (indices == nullptr && ratio > 0)
      count = detail::hca_visible_count(t, ratio, entries.first, index_count);
    detail::sparse_query<T, Arch>(params, q + qi * params.heads * params.dim, raw, entries,
                                  indices ? indices + qi * index_count : nullptr, count, t,
                                  out + qi * params.heads * params.dim_v, lse + qi * params.heads,
                                  a);
  }
}

/// A batch of sequences for paged sparse attention (one layer): their queries, their latent
/// rows in page pools (see paged_latent.hpp for the slot mapping) and their index lists.
///
/// Sequence b has seen `lengths[b]` = n_b tokens, the new ones included (write their raw rows
/// and the entries they complete into the pages first), and has q_b queries at positions
/// `[n_b - q_b, n_b)`: q_b = `qo_indptr[b + 1] - qo_indptr[b]` (ragged prefill, FlashInfer's
/// `qo_indptr`), or 1 when `qo_indptr` is null (decode). Query rows are concatenated in
/// sequence order: sequence b's queries are rows `[qo_indptr[b], qo_indptr[b + 1])` (row b in
/// decode) of `q`, `indices`, `out` and `lse`.
template <class T>
struct PagedSparseArgs {
  const float* q = nullptr;                 ///< Queries `[rows, heads, dim]` f32.
  const std::int32_t* qo_indptr = nullptr;  ///< `[batch + 1]` query rows per sequence, or null.
  std::int64_t batch = 0;                   ///< Sequences B.
  const std::int64_t* lengths = nullptr;    ///< `[batch]` tokens seen, n_b (new ones included).
  PagePool<const T> raw_pool;               ///< Raw latent rows (one head, d_k >= dim).
  BlockTable raw_table;                     ///< Raw pages per sequence.
  float raw_scale = 1.0f;                   ///< Per-tensor scale of the raw rows (FP8).
  std::int64_t raw_ring = 0;                ///< 0: slot p for position p; R: slot p mod R.
  PagePool<const T> entry_pool;             ///< Compressed entries (may be the raw pool).
  BlockTable entry_table;                   ///< Entry pages per sequence.
  float entry_scale = 1.0f;                 ///< Per-tensor scale of the entries (FP8).
  std::int64_t ratio = 0;                   ///< S: sequence b holds floor(n_b / S) entries
                                            ///< (0: no entries, a window-only layer).
  const std::int32_t* indices = nullptr;    ///< `[rows, index_count]`, -1 padded, or null.
  std::int64_t index_count = 0;             ///< k: entries per index list (ignored when
                                            ///< `indices` is null).
  float* out = nullptr;                     ///< Output `[rows, heads, dim_v]`.
  float* lse = nullptr;                     ///< Log-sum-exp `[rows, heads]`.
};

/// Sparse attention for a batch of sequences over paged latent rows: decode (one query per
/// sequence, `qo_indptr` null) or ragged prefill. Each query t of sequence b attends to
///   - the entries of its index list (`indices` row, -1 skipped; each other value must be in
///     `[0, floor(n_b / ratio))`), or, with `indices` null, to every entry visible at t:
///     `[0, floor((t + 1) / ratio))` (HCA), and
///   - the raw rows of positions `[max(0, t + 1 - window), t]`,
///
/// exactly as sparse_attention() does over contiguous rows: it runs the same per-query code,
/// so the results are bit-equal to calling sparse_attention per sequence over the same rows
/// gathered into contiguous tensors (with `indices` null, per query with
/// `index_count = floor((t + 1) / ratio)`), for any page size and page order.
///
/// Tables: the raw table of sequence b must list the pages of its `n_b` raw slots
/// (`min(n_b, raw_ring)` with a ring), the entry table those of its `floor(n_b / ratio)`
/// entries. A ring must hold every raw row the sequence's queries read: `raw_ring >= window +
/// q_b - 1`.
///
/// Sequences `[seq_begin, seq_end)` only are computed when given (one thread's share; by
/// default all). Every argument of the whole batch is checked (page indices, index lists)
/// before anything is written; errors throw phasekv::invalid_argument (capacity_error for a
/// table too short, shape_error for a pool) naming the argument, the sequence and the index.
/// Runs on the calling thread; allocates only the per-call accumulators. `Arch` as in
/// sparse_attention().
template <class T, class Arch = cpu::arch::Auto>
void paged_sparse_attention(const SparseAttentionParams& params, const PagedSparseArgs<T>& args,
                            std::int64_t seq_begin = 0, std::int64_t seq_end = -1) {
  const char* where = "phasekv::dsv4::paged_sparse_attention";
  using phasekv::detail::check_arg;
  params.check(where);
  const std::int64_t B = args.batch;
  check_arg(B >= 0 && B <= (std::int64_t{1} << 31), where, "args.batch", B, "must be in [0, 2^31]");
  if (seq_end < 0) seq_end = B;
  check_arg(seq_begin >= 0 && seq_begin <= B, where, "seq_begin", seq_begin,
            "must be in [0, batch]");
  check_arg(seq_end >= seq_begin && seq_end <= B, where, "seq_end", seq_end,
            "must be in [seq_begin, batch]");
  if (B == 0) return;
  check_arg(args.lengths != nullptr, where, "args.lengths", "null", "must point to [batch]");
  check_arg(args.ratio >= 0 && args.ratio <= (std::int64_t{1} << 40), where, "args.ratio",
            args.ratio, "must be in [0, 2^40]");
  check_arg(args.index_count >= 0 && args.index_count <= (std::int64_t{1} << 31), where,
            "args.index_count", args.index_count, "must be in [0, 2^31]");
  check_arg(args.ratio > 0 || args.indices == nullptr || args.index_count == 0, where,
            "args.index_count", args.index_count,
            "must be 0 (or indices null) when ratio = 0 (no entries)");
  check_arg(std::isfinite(args.raw_scale) && args.raw_scale > 0.0f, where, "args.raw_scale",
            args.raw_scale, "must be finite and > 0");
  check_arg(std::isfinite(args.entry_scale) && args.entry_scale > 0.0f, where, "args.entry_scale",
            args.entry_scale, "must be finite and > 0");
  check_arg(args.raw_ring >= 0, where, "args.raw_ring", args.raw_ring, "must be >= 0");
  if (args.qo_indptr != nullptr)
    check_arg(args.qo_indptr[0] == 0, where, "args.qo_indptr[0]", args.qo_indptr[0], "must be 0");
  const auto queries_of = [&](std::int64_t b) -> std::int64_t {
    return args.qo_indptr ? std::int64_t{args.qo_indptr[b + 1]} - args.qo_indptr[b] : 1;
  };
  const auto row_of = [&](std::int64_t b) -> std::int64_t {
    return args.qo_indptr ? std::int64_t{args.qo_indptr[b]} : b;
  };
  std::int64_t rows = 0;
  for (std::int64_t b = 0; b < B; ++b) {
    const std::string sb = "[" + std::to_string(b) + "]";
    const std::int64_t n = args.lengths[b], qb = queries_of(b);
    check_arg(n >= 0 && n <= (std::int64_t{1} << 62), where, ("args.lengths" + sb).c_str(), n,
              "must be in [0, 2^62]");
    if (args.qo_indptr == nullptr)
      check_arg(n >= 1, where, ("args.lengths" + sb).c_str(), n,
                "must be >= 1 in decode (the query's own token is in the cache)");
    else
      check_arg(qb >= 0 && qb <= n, where,
                ("args.qo_indptr[" + std::to_string(b + 1) + "]").c_str(), args.qo_indptr[b + 1],
                ("must give 0 <= q_b <= lengths[b] = " + std::to_string(n)).c_str());
    if (args.raw_ring > 0 && params.window > 0 && qb > 0)
      check_arg(args.raw_ring >= params.window + qb - 1, where, "args.raw_ring", args.raw_ring,
                ("must be >= window + q_b - 1 = " + std::to_string(params.window + qb - 1) +
                 " (sequence " + std::to_string(b) + ")")
                    .c_str());
    rows += qb;
  }
  if (rows == 0) return;
  check_arg(args.q != nullptr, where, "args.q", "null", "must not be null");
  check_arg(args.out != nullptr && args.lse != nullptr, where, "args.out", "null",
            "out and lse must not be null");
  if (params.window > 0) {
    detail::check_latent_pool(args.raw_pool, params.dim, where, "args.raw_pool");
    detail::check_latent_table(args.raw_table, B, where, "args.raw_table");
  }
  if (args.ratio > 0) {
    detail::check_latent_pool(args.entry_pool, params.dim, where, "args.entry_pool");
    detail::check_latent_table(args.entry_table, B, where, "args.entry_table");
  }
  for (std::int64_t b = 0; b < B; ++b) {
    if (queries_of(b) == 0) continue;
    const std::int64_t n = args.lengths[b];
    if (params.window > 0)
      detail::check_latent_pages(args.raw_table, args.raw_pool, b,
                                 args.raw_ring > 0 ? std::min(n, args.raw_ring) : n, where,
                                 "args.raw_table");
    if (args.ratio > 0)
      detail::check_latent_pages(args.entry_table, args.entry_pool, b, n / args.ratio, where,
                                 "args.entry_table");
    if (args.indices != nullptr && args.index_count > 0) {
      const std::int64_t J = n / args.ratio;
      const std::int32_t* list = args.indices + row_of(b) * args.index_count;
      for (std::int64_t i = 0; i < queries_of(b) * args.index_count; ++i) {
        const std::int64_t j = list[i];
        if (j == -1 || (j >= 0 && j < J)) continue;
        const std::string what =
            "args.indices[" + std::to_string(row_of(b) * args.index_count + i) + "] (sequence " +
            std::to_string(b) + ", query " + std::to_string(i / args.index_count) + ")";
        const std::string req =
            "must be -1 or an entry of the sequence, in [0, " + std::to_string(J) + ")";
        phasekv::detail::throw_arg<capacity_error>(where, what.c_str(), j, req.c_str());
      }
    }
  }
  const std::int64_t H = params.heads, d = params.dim, dv = params.dim_v;
  detail::SparseAcc a;
  detail::sparse_acc_init(params, a);
  for (std::int64_t b = seq_begin; b < seq_end; ++b) {
    const std::int64_t qb = queries_of(b), r0 = row_of(b), n = args.lengths[b];
    if (qb == 0) continue;
    const auto raw =
        detail::paged_rows<T>(args.raw_pool, args.raw_table, b, args.raw_ring, args.raw_scale);
    const auto ent =
        detail::paged_rows<T>(args.entry_pool, args.entry_table, b, 0, args.entry_scale);
    for (std::int64_t i = 0; i < qb; ++i) {
      const std::int64_t r = r0 + i, t = n - qb + i;
      const std::int32_t* list = args.indices ? args.indices + r * args.index_count : nullptr;
      const std::int64_t count =
          args.indices ? args.index_count : (args.ratio > 0 ? (t + 1) / args.ratio : 0);
      detail::sparse_query<T, Arch>(params, args.q + r * H * d, raw, ent, list, count, t,
                                    args.out + r * H * dv, args.lse + r * H, a);
    }
  }
}

}  // namespace dsv4
PHASEKV_NAMESPACE_END
