/// @file
/// @brief DeepSeek-V4 latent rows in the serving layout: one K = V row per slot of a page pool
/// (phasekv::PagePool with one head, keys only) addressed through per-sequence block tables
/// (phasekv::BlockTable, FlashInfer CSR or vLLM dense), and the checks of such tables.
///
/// Slot mapping: row j of sequence b (entry j, or raw position j) lives in page
/// `table.page(b, j / P)`, slot `j % P`; with a raw ring of R slots (R > 0), raw position p
/// lives at slot `p mod R` instead. The row is `pool.key(page, slot, 0)`, `pool.d_k >= dim`
/// elements wide; `pool.values` is not read (the latent is key and value at once).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/dsv4/cache_format.hpp"
#include "phasekv/serving/paged.hpp"
#include "phasekv/serving/paged_check.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace dsv4 {

/// A pool of `pages` pages of `page_size` latent rows, each `dim` elements, densely packed
/// (`data` holds `pages * page_size * dim` elements; row (page, slot) at
/// `data + (page * page_size + slot) * dim`). Values alias the keys: K = V.
template <class T>
PagePool<T> latent_page_pool(T* data, std::int64_t pages, std::int64_t page_size,
                             std::int64_t dim) {
  return make_page_pool<T>(data, data, pages, page_size, 1, dim, dim, Layout::NHD);
}

namespace detail {

// Latent rows of one sequence in pages: row j at pool.key(pages[slot / P], slot % P, 0) with
// slot = j, or j mod ring for a ring of `ring` slots.
template <class T>
struct PagedLatentRows {
  const T* base = nullptr;              // key of page 0, slot 0, head 0
  const std::int32_t* pages = nullptr;  // the sequence's page list
  std::int64_t page_size = 1;           // P
  std::int64_t page_stride = 0;         // elements between pages
  std::int64_t slot_stride = 0;         // elements between slots
  std::int64_t ring = 0;                // 0: slot = j; R: slot = j mod R
  float scale = 1.0f;                   // per-tensor scale of the stored values
  std::int64_t first = 0;               // rows are numbered from 0

  PHASEKV_HOST_DEVICE row_t<T> row(std::int64_t j) const {
    const std::int64_t s = ring > 0 ? j % ring : j;
    return CacheFormat<T>::row(base + pages[s / page_size] * page_stride, page_size, s % page_size,
                               slot_stride);
  }
};

template <class T, class U>
PHASEKV_HOST_DEVICE PagedLatentRows<T> paged_rows(const PagePool<U>& pool, const BlockTable& table,
                                                  std::int64_t b, std::int64_t ring, float scale) {
  PagedLatentRows<T> r;
  r.base = pool.keys;
  r.pages = table.indices == nullptr ? nullptr : table.indices + table.begin(b);
  r.page_size = pool.page_size;
  r.page_stride = pool.key_page_stride;
  r.slot_stride = pool.key_slot_stride();
  r.ring = ring;
  r.scale = scale;
  return r;
}

// Checks a latent pool (one head, rows at least `dim` wide); names the argument `name`.
template <class U>
void check_latent_pool(const PagePool<U>& p, std::int64_t dim, const char* where,
                       const std::string& name) {
  using phasekv::detail::check_arg;
  check_arg<shape_error>(p.pages >= 0, where, (name + ".pages").c_str(), p.pages, "must be >= 0");
  check_arg<shape_error>(p.page_size >= 1, where, (name + ".page_size").c_str(), p.page_size,
                         "must be >= 1");
  check_arg<shape_error>(p.heads == 1, where, (name + ".heads").c_str(), p.heads,
                         "must be 1 (one latent row per slot)");
  check_arg<shape_error>(p.d_k >= dim, where, (name + ".d_k").c_str(), p.d_k,
                         "must be >= the row width used (params.dim)");
  check_arg<shape_error>(p.key_page_stride >= 0, where, (name + ".key_page_stride").c_str(),
                         p.key_page_stride, "must be >= 0");
  check_arg<shape_error>(p.pages == 0 || p.keys != nullptr, where, (name + ".keys").c_str(), "null",
                         "must point to the pages");
  check_format_rows<std::remove_const_t<U>>(dim, p.page_size, p.key_slot_stride(),
                                            p.key_page_stride, where, name, ".d_k",
                                            ".key_page_stride");
}

// Checks the table's shape against `batch` (indices may be null only if no page is listed).
inline void check_latent_table(const BlockTable& t, std::int64_t batch, const char* where,
                               const std::string& name) {
  using phasekv::detail::check_arg;
  check_arg(t.batch == batch, where, (name + ".batch").c_str(), t.batch, "must equal batch");
  if (t.indptr == nullptr)
    check_arg(t.row_stride >= 0, where, (name + ".row_stride").c_str(), t.row_stride,
              "must be >= 0");
  for (std::int64_t b = 0; t.indptr != nullptr && b < batch; ++b)
    check_arg(t.indptr[b + 1] >= t.indptr[b], where, (name + ".indptr").c_str(), b + 1,
              "must not decrease (at this sequence)");
  const bool lists =
      batch > 0 && (t.indptr != nullptr ? t.indptr[batch] != t.indptr[0] : t.row_stride > 0);
  check_arg(!lists || t.indices != nullptr, where, (name + ".indices").c_str(), "null",
            "must point to the pages");
}

// Checks that sequence b's table lists at least the pages that `slots` slots need and that each
// of them is a page of the pool: the serving path's table walk (phasekv::detail::check_table_pages,
// paged_check.hpp). The errors name the table, the sequence and the index.
template <class U>
void check_latent_pages(const BlockTable& t, const PagePool<U>& pool, std::int64_t b,
                        std::int64_t slots, const char* where, const std::string& name) {
  phasekv::detail::check_table_pages(t, pool.pages, pool.page_size, b, slots, where, name, "rows");
}

// Totals of a batched append of token chunks (compress_append_paged and its CUDA twin).
struct AppendTotals {
  std::int64_t rows = 0;         // input rows, sum of c_b
  std::int64_t entries = 0;      // entries that complete, sum over b
  std::int64_t max_entries = 0;  // the most entries one sequence completes
};

// Checks the per-sequence counts of a batched append: `tokens[b]` = n_b in [0, 2^40], chunk
// counts c_b from `chunk_indptr` (null: 1 each; [0] must be 0) in [0, 2^40]; the entries of
// sequence b are floor((n_b + c_b) / ratio) - floor(n_b / ratio). The messages are
// compress_append_paged's. `tokens` must be host memory.
inline AppendTotals check_append_counts(std::int64_t batch, const std::int64_t* tokens,
                                        const std::int32_t* chunk_indptr, std::int64_t ratio,
                                        const char* where, const char* tokens_name,
                                        const char* indptr_name) {
  using phasekv::detail::check_arg;
  AppendTotals t;
  if (batch == 0) return t;
  check_arg(tokens != nullptr, where, tokens_name, "null", "must point to [batch]");
  if (chunk_indptr != nullptr)
    check_arg(chunk_indptr[0] == 0, where, (std::string(indptr_name) + "[0]").c_str(),
              chunk_indptr[0], "must be 0");
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t n = tokens[b];
    const std::int64_t c =
        chunk_indptr ? std::int64_t{chunk_indptr[b + 1]} - chunk_indptr[b] : std::int64_t{1};
    check_arg(n >= 0 && n <= (std::int64_t{1} << 40), where,
              (std::string(tokens_name) + "[" + std::to_string(b) + "]").c_str(), n,
              "must be in [0, 2^40]");
    check_arg(c >= 0 && c <= (std::int64_t{1} << 40), where,
              (std::string(indptr_name) + "[" + std::to_string(b + 1) + "]").c_str(),
              chunk_indptr ? std::int64_t{chunk_indptr[b + 1]} : b + 1,
              "must not be below chunk_indptr[b] (at most 2^40 tokens a chunk)");
    const std::int64_t e = (n + c) / ratio - n / ratio;
    t.rows += c;
    t.entries += e;
    t.max_entries = e > t.max_entries ? e : t.max_entries;
  }
  return t;
}

// Checks the entry pages of a batched append: the pool holds rows at least `dim` wide, the
// table fits the batch, every sequence that completes an entry lists the pages of its
// floor((n_b + c_b) / ratio) entries, each a page of the pool, and no page written (one of the
// new entries) shares memory with a page of another sequence that writes, by address range as in
// the serving path (paged_check.hpp) (compress_append_paged's checks; host memory).
template <class U>
void check_append_entry_pages(const PagePool<U>& pool, const BlockTable& table, std::int64_t batch,
                              const std::int64_t* tokens, const std::int32_t* chunk_indptr,
                              std::int64_t ratio, std::int64_t dim, const char* where,
                              const std::string& pool_name, const std::string& table_name) {
  check_latent_pool(pool, dim, where, pool_name);
  check_latent_table(table, batch, where, table_name);
  std::vector<phasekv::detail::PageUse> uses;  // the pages of the sequences that write
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t n = tokens[b];
    const std::int64_t c =
        chunk_indptr ? std::int64_t{chunk_indptr[b + 1]} - chunk_indptr[b] : std::int64_t{1};
    if ((n + c) / ratio <= n / ratio) continue;
    check_latent_pages(table, pool, b, (n + c) / ratio, where, table_name);
    const std::int64_t first_written = n / ratio / pool.page_size;
    for (std::int64_t i = 0; i <= ((n + c) / ratio - 1) / pool.page_size; ++i) {
      const std::size_t at = uses.size();
      phasekv::detail::push_page_uses(uses, pool, table.page(b, i), b, i, 1);
      for (std::size_t k = at; k < uses.size(); ++k) uses[k].write = i >= first_written;
    }
  }
  const std::string names[2] = {table_name, table_name};
  phasekv::detail::check_page_uses(uses, where, names);
}

}  // namespace detail
}  // namespace dsv4
PHASEKV_NAMESPACE_END
