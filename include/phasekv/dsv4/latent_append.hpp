/// @file
/// @brief The raw-window append of DeepSeek-V4 serving: each sequence's new latent rows (the
/// model's kv rows after its norm and RoPE) written into its raw pages, in any storage type of
/// the sparse attention (f32, bf16, f16, FP8 E4M3 with a per-tensor scale, or a FlashMLA FP8
/// cache format: model1_fp8_t, v32_fp8_t), all of the sequence's positions or a ring.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/dsv4/cache_format.hpp"
#include "phasekv/dsv4/paged_latent.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace dsv4 {

/// A batch of sequences appending latent rows to their raw pages.
///
/// Sequence b has seen `tokens[b]` = n_b tokens and appends c_b rows, positions
/// `[n_b, n_b + c_b)`: c_b = `chunk_indptr[b + 1] - chunk_indptr[b]` (its rows of `rows` are
/// `[chunk_indptr[b], chunk_indptr[b + 1])`), or 1 when `chunk_indptr` is null (decode: row b).
/// Position p goes to slot p (or `p mod ring` with a ring of R slots, where only the last R
/// positions of the chunk are written) of the sequence's pages (paged_latent.hpp's mapping).
///
/// @tparam T input element type (float, bf16_t, f16_t).
/// @tparam E storage type of the pages.
template <class T, class E>
struct PagedLatentAppendArgs {
  std::int64_t batch = 0;                      ///< Sequences B.
  const T* rows = nullptr;                     ///< `[rows, dim]` the chunks' latent rows.
  const std::int32_t* chunk_indptr = nullptr;  ///< `[batch + 1]` rows per sequence, or null.
  const std::int64_t* tokens = nullptr;        ///< `[batch]` n_b before the chunk (not changed).
  PagePool<E> pool;                            ///< Raw pages (one head; written).
  BlockTable table;                            ///< Raw pages per sequence.
  std::int64_t ring = 0;                       ///< 0: slot p; R: slot p mod R.
  float scale = 1.0f;                          ///< Per-tensor scale of the stored values.
};

/// Writes each sequence's new latent rows, `dim` wide, into its raw pages as `E(x / scale)`
/// (nearest even; FP8 saturates at 448) or quantized per tile into a FlashMLA FP8 format (as
/// compress_append_paged stores entries; see dsv4/cache_format.hpp). The token counts are not
/// advanced (compress_append_paged does that for the same tokens). Sequence b's table must list
/// the pages of its `n_b + c_b` slots (`min(n_b + c_b, ring)` with a ring).
///
/// Everything is checked before anything is written; errors throw phasekv::invalid_argument
/// (capacity_error for a table too short, shape_error for the pool) naming the argument.
/// Allocates `dim` floats of scratch.
template <class T, class E>
void append_latent_paged(std::int64_t dim, const PagedLatentAppendArgs<T, E>& args) {
  const char* where = "phasekv::dsv4::append_latent_paged";
  using phasekv::detail::check_arg;
  check_arg(dim >= 1 && dim <= (std::int64_t{1} << 20), where, "dim", dim, "must be in [1, 2^20]");
  const std::int64_t B = args.batch;
  check_arg(B >= 0 && B <= (std::int64_t{1} << 31), where, "args.batch", B, "must be in [0, 2^31]");
  if (B == 0) return;
  check_arg(std::isfinite(args.scale) && args.scale > 0.0f, where, "args.scale", args.scale,
            "must be finite and > 0");
  check_arg(args.ring >= 0, where, "args.ring", args.ring, "must be >= 0");
  const detail::AppendTotals totals = detail::check_append_counts(
      B, args.tokens, args.chunk_indptr, 1, where, "args.tokens", "args.chunk_indptr");
  if (totals.rows == 0) return;
  check_arg(args.rows != nullptr, where, "args.rows", "null", "must not be null");
  if constexpr (CacheFormat<E>::quantized)
    check_arg<shape_error>(dim == CacheFormat<E>::dim, where, "dim", dim,
                           "must be the format's row width (512 MODEL1, 576 V3.2)");
  detail::check_latent_pool(args.pool, dim, where, "args.pool");
  detail::check_latent_table(args.table, B, where, "args.table");
  const auto count_of = [&](std::int64_t b) -> std::int64_t {
    return args.chunk_indptr ? std::int64_t{args.chunk_indptr[b + 1]} - args.chunk_indptr[b] : 1;
  };
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t n1 = args.tokens[b] + count_of(b);
    if (count_of(b) > 0)
      detail::check_latent_pages(args.table, args.pool, b,
                                 args.ring > 0 ? std::min(n1, args.ring) : n1, where, "args.table");
  }
  std::vector<float> x(static_cast<std::size_t>(dim));
  const std::int64_t P = args.pool.page_size;
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t c = count_of(b), n0 = args.tokens[b];
    const std::int64_t r0 = args.chunk_indptr ? std::int64_t{args.chunk_indptr[b]} : b;
    const std::int64_t p0 = args.ring > 0 ? std::max(n0, n0 + c - args.ring) : n0;
    for (std::int64_t p = p0; p < n0 + c; ++p) {
      const T* src = args.rows + (r0 + p - n0) * dim;
      for (std::int64_t i = 0; i < dim; ++i) x[static_cast<std::size_t>(i)] = to_float(src[i]);
      const std::int64_t s = args.ring > 0 ? p % args.ring : p;
      E* block = args.pool.key(args.table.page(b, s / P), 0, 0);
      detail::store_row<E>(x.data(), dim, args.scale,
                           CacheFormat<E>::row(block, P, s % P, args.pool.key_slot_stride()));
    }
  }
}

}  // namespace dsv4
PHASEKV_NAMESPACE_END
