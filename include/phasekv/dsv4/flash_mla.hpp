/// @file
/// @brief FlashMLA's sparse decode call, `flash_mla_with_kvcache` with `indices`, on the CPU:
/// the same arguments with the same meaning (shapes, index encoding, `topk_length`, the extra
/// cache, sinks, `out` and `lse` layouts), run by phasekv's DeepSeek-V4 sparse attention kernel.
///
/// For batch b and query i (of s_q), the rows attended are those of `indices[b][i][k]` for
/// `k < topk_length[b]` (all topk without it), then those of `extra_indices_in_kvcache[b][i][k]`
/// for `k < extra_topk_length[b]`; an index is `block * page_block_size + offset` into its
/// cache, -1 skips the slot. With logits `s = softmax_scale * <q, row>` over `head_dim`
/// channels and `lse = log sum exp(s)` (no sink in it, as FlashMLA returns it):
///
///     out = sum softmax(s) * row[0 : head_dim_v] * 1 / (1 + exp(attn_sink[h] - lse))
///
/// A query with no row gets `out = 0` and `lse = +inf` (FlashMLA's convention). The caches'
/// bytes: bf16 (or f32, f16, FP8 E4M3 with scale 1) rows, or FlashMLA's FP8 formats
/// phasekv::model1_fp8_t (V4, `head_dim` 512) and phasekv::v32_fp8_t (V3.2, 576); see
/// dsv4/cache_format.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/dsv4/cache_format.hpp"
#include "phasekv/dsv4/sparse_attention.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace dsv4 {

/// A paged latent cache as FlashMLA sees it: `k_cache` `[num_blocks, page_block_size, 1,
/// head_bytes]` with its strides (elements of T; bytes for the FP8 formats). MODEL1 blocks are
/// the layout of dsv4/cache_format.hpp (`block_stride` >= `page_block_size * 584`, FlashMLA
/// pads to model1_block_bytes()); `token_stride` is not read for MODEL1.
template <class T>
struct FlashMlaKvCache {
  const T* data = nullptr;           ///< Block 0.
  std::int64_t num_blocks = 0;       ///< `k_cache.size(0)`.
  std::int64_t page_block_size = 0;  ///< `k_cache.size(1)`, P.
  std::int64_t block_stride = 0;     ///< `k_cache.stride(0)`.
  std::int64_t token_stride = 0;     ///< `k_cache.stride(1)`.
};

/// The cache view of a densely packed pool of `num_blocks` blocks of P tokens in T:
/// FlashMLA's padded MODEL1 blocks, 656-byte V3.2 tokens, or `head_dim` elements a token.
template <class T>
FlashMlaKvCache<T> flash_mla_kv_cache(const T* data, std::int64_t num_blocks, std::int64_t P,
                                      std::int64_t head_dim) {
  FlashMlaKvCache<T> c{data, num_blocks, P, 0, head_dim};
  if constexpr (CacheFormat<T>::quantized) c.token_stride = CacheFormat<T>::token_bytes;
  c.block_stride =
      std::is_same<T, model1_fp8_t>::value ? model1_block_bytes(P) : P * c.token_stride;
  return c;
}

/// Arguments of flash_mla_with_kvcache(), named as FlashMLA names them.
template <class T>
struct FlashMlaArgs {
  const float* q = nullptr;               ///< `[batch, s_q, h_q, head_dim]`.
  std::int64_t batch = 0;                 ///< B.
  std::int64_t s_q = 0;                   ///< Queries per sequence.
  std::int64_t h_q = 0;                   ///< Query heads.
  std::int64_t head_dim = 512;            ///< q's and the rows' width used for the logits.
  FlashMlaKvCache<T> k_cache;             ///< The cache `indices` point into.
  std::int64_t head_dim_v = 512;          ///< Leading channels used as the value.
  float softmax_scale = 0.0f;             ///< 0: `head_dim^-1/2` (FlashMLA's None).
  const std::int32_t* indices = nullptr;  ///< `[batch, s_q, topk]`.
  std::int64_t topk = 0;                  ///< Last dim of `indices`.
  const float* attn_sink = nullptr;       ///< `[h_q]` or null.
  FlashMlaKvCache<T> extra_k_cache;       ///< Second cache (data null: none).
  const std::int32_t* extra_indices_in_kvcache = nullptr;  ///< `[batch, s_q, extra_topk]`.
  std::int64_t extra_topk = 0;                             ///< Last dim of the extra indices.
  const std::int32_t* topk_length = nullptr;               ///< `[batch]` or null (all topk).
  const std::int32_t* extra_topk_length = nullptr;         ///< `[batch]` or null.
  float* out = nullptr;                                    ///< `[batch, s_q, h_q, head_dim_v]`.
  float* lse = nullptr;                                    ///< `[batch, h_q, s_q]`.
};

namespace detail {

// Rows of the two caches of a FlashMLA call by one index space: [0, n0) the first cache's
// `block * P + offset`, [n0, ...) the extra cache's, shifted by n0.
template <class T>
struct FlashMlaRows {
  FlashMlaKvCache<T> c0, c1;
  std::int64_t n0 = 0;
  float scale = 1.0f;
  std::int64_t first = 0;
  PHASEKV_HOST_DEVICE row_t<T> row(std::int64_t j) const {
    const FlashMlaKvCache<T>& c = j < n0 ? c0 : c1;
    if (j >= n0) j -= n0;
    const std::int64_t P = c.page_block_size;
    return CacheFormat<T>::row(c.data + (j / P) * c.block_stride, P, j % P, c.token_stride);
  }
};

template <class T>
void check_flash_mla_cache(const FlashMlaKvCache<T>& c, std::int64_t head_dim, const char* where,
                           const std::string& name) {
  using phasekv::detail::check_arg;
  check_arg<shape_error>(c.data != nullptr, where, (name + ".data").c_str(), "null",
                         "must point to the blocks");
  check_arg<shape_error>(c.num_blocks >= 1, where, (name + ".num_blocks").c_str(), c.num_blocks,
                         "must be >= 1");
  check_arg<shape_error>(c.page_block_size >= 1 && c.page_block_size <= (1 << 20), where,
                         (name + ".page_block_size").c_str(), c.page_block_size,
                         "must be in [1, 2^20]");
  check_arg<shape_error>(c.num_blocks * c.page_block_size <= (std::int64_t{1} << 31), where,
                         (name + ".num_blocks").c_str(), c.num_blocks,
                         "times page_block_size must be <= 2^31 (int32 indices)");
  if constexpr (CacheFormat<T>::quantized) {
    check_format_rows<T>(head_dim, c.page_block_size, c.token_stride, c.block_stride, where, name,
                         ".token_stride", ".block_stride");
  } else {
    check_arg<shape_error>(c.token_stride >= head_dim, where, (name + ".token_stride").c_str(),
                           c.token_stride, "must be >= head_dim");
    check_arg<shape_error>(c.block_stride >= c.page_block_size * c.token_stride, where,
                           (name + ".block_stride").c_str(), c.block_stride,
                           "must be >= page_block_size * token_stride");
  }
}

// Checks sequence b's lengths and index lists of one cache (every index read must be -1 or in
// [0, num_blocks * P)).
inline void check_flash_mla_indices(const std::int32_t* idx, std::int64_t topk,
                                    const std::int32_t* lengths, std::int64_t batch,
                                    std::int64_t s_q, std::int64_t rows, const char* where,
                                    const char* idx_name, const char* len_name) {
  using phasekv::detail::check_arg;
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t len = lengths ? lengths[b] : topk;
    check_arg(len >= 0 && len <= topk, where,
              (std::string(len_name) + "[" + std::to_string(b) + "]").c_str(), len,
              "must be in [0, topk]");
    for (std::int64_t i = 0; i < s_q; ++i)
      for (std::int64_t k = 0; k < len; ++k) {
        const std::int64_t j = idx[(b * s_q + i) * topk + k];
        if (j == -1 || (j >= 0 && j < rows)) continue;
        const std::string what = std::string(idx_name) + "[" + std::to_string(b) + "][" +
                                 std::to_string(i) + "][" + std::to_string(k) + "]";
        const std::string req =
            "must be -1 or block * page_block_size + offset in [0, " + std::to_string(rows) + ")";
        phasekv::detail::throw_arg<capacity_error>(where, what.c_str(), j, req.c_str());
      }
  }
}

// Every check of a FlashMLA call (flash_mla_with_kvcache): shapes, pointers, the caches'
// layouts, and, when `lists_on_host` (the CPU call; on CUDA they are device memory), every
// length and index read. Throws phasekv::invalid_argument naming the argument, with `where`.
template <class T>
void check_flash_mla_args(const FlashMlaArgs<T>& a, const char* where, bool lists_on_host) {
  using phasekv::detail::check_arg;
  check_arg(a.batch >= 0 && a.batch <= (std::int64_t{1} << 31), where, "batch", a.batch,
            "must be in [0, 2^31]");
  check_arg(a.s_q >= 0 && a.s_q <= (std::int64_t{1} << 31), where, "s_q", a.s_q,
            "must be in [0, 2^31]");
  check_arg(a.h_q >= 1 && a.h_q <= 4096, where, "h_q", a.h_q, "must be in [1, 4096]");
  check_arg(a.head_dim >= 1 && a.head_dim <= 65536, where, "head_dim", a.head_dim,
            "must be in [1, 65536]");
  check_arg(a.head_dim_v >= 1 && a.head_dim_v <= a.head_dim, where, "head_dim_v", a.head_dim_v,
            "must be in [1, head_dim]");
  check_arg(std::isfinite(a.softmax_scale), where, "softmax_scale", a.softmax_scale,
            "must be finite (0: head_dim^-1/2)");
  check_arg(a.topk >= 0 && a.topk <= (std::int64_t{1} << 24), where, "topk", a.topk,
            "must be in [0, 2^24]");
  check_arg(a.extra_topk >= 0 && a.extra_topk <= (std::int64_t{1} << 24), where, "extra_topk",
            a.extra_topk, "must be in [0, 2^24]");
  const bool extra = a.extra_k_cache.data != nullptr;
  check_arg(extra || a.extra_topk == 0, where, "extra_topk", a.extra_topk,
            "must be 0 without extra_k_cache");
  check_arg(extra || (a.extra_indices_in_kvcache == nullptr && a.extra_topk_length == nullptr),
            where, "extra_k_cache.data", "null",
            "must point to the extra cache when extra indices or lengths are given");
  if (a.batch == 0 || a.s_q == 0) return;
  check_arg(a.q != nullptr, where, "q", "null", "must not be null");
  check_arg(a.out != nullptr && a.lse != nullptr, where, "out", "null",
            "out and lse must not be null");
  check_arg(a.topk == 0 || a.indices != nullptr, where, "indices", "null",
            "must point to [batch, s_q, topk]");
  check_arg(a.extra_topk == 0 || a.extra_indices_in_kvcache != nullptr, where,
            "extra_indices_in_kvcache", "null", "must point to [batch, s_q, extra_topk]");
  check_flash_mla_cache(a.k_cache, a.head_dim, where, "k_cache");
  if (extra) check_flash_mla_cache(a.extra_k_cache, a.head_dim, where, "extra_k_cache");
  const std::int64_t n0 = a.k_cache.num_blocks * a.k_cache.page_block_size;
  if (!lists_on_host) return;
  check_flash_mla_indices(a.indices, a.topk, a.topk_length, a.batch, a.s_q, n0, where, "indices",
                          "topk_length");
  if (extra)
    check_flash_mla_indices(a.extra_indices_in_kvcache, a.extra_topk, a.extra_topk_length, a.batch,
                            a.s_q, a.extra_k_cache.num_blocks * a.extra_k_cache.page_block_size,
                            where, "extra_indices_in_kvcache", "extra_topk_length");
}

// The sparse attention a FlashMLA call runs (CPU and CUDA): h_q heads over head_dim, the
// value head_dim_v, no window, FlashMLA's default scale, and no sink (FlashMLA's lse has none:
// the sink scales the output afterwards).
template <class T>
SparseAttentionParams flash_mla_sparse_params(const FlashMlaArgs<T>& a) {
  SparseAttentionParams p;
  p.heads = a.h_q;
  p.dim = a.head_dim;
  p.dim_v = a.head_dim_v;
  p.window = 0;
  p.scale =
      a.softmax_scale != 0.0f ? a.softmax_scale : 1.0f / std::sqrt(static_cast<float>(a.head_dim));
  p.sinks = nullptr;
  return p;
}

// Both caches of a FlashMLA call by one index space.
template <class T>
FlashMlaRows<T> flash_mla_rows(const FlashMlaArgs<T>& a) {
  const bool extra = a.extra_k_cache.data != nullptr;
  return FlashMlaRows<T>{a.k_cache, extra ? a.extra_k_cache : a.k_cache,
                         a.k_cache.num_blocks * a.k_cache.page_block_size, 1.0f, 0};
}

}  // namespace detail

/// FlashMLA's `flash_mla_with_kvcache(q, k_cache, None, None, head_dim_v, meta, None,
/// softmax_scale, False, True, indices, attn_sink, extra_k_cache, extra_indices_in_kvcache,
/// topk_length, extra_topk_length)` (sparse decode) on the CPU: see the file description for
/// what it computes. Writes `out` `[batch, s_q, h_q, head_dim_v]` and `lse` `[batch, h_q, s_q]`.
///
/// Every argument (every index read) is checked before anything is written; errors throw
/// phasekv::invalid_argument (capacity_error for an index outside its cache, shape_error for a
/// cache layout) naming the argument, e.g. `indices[1][0][3] = 4096`. Runs on the calling
/// thread; allocates the per-call accumulators. `Arch` as in sparse_attention().
template <class T, class Arch = cpu::arch::Auto>
void flash_mla_with_kvcache(const FlashMlaArgs<T>& a) {
  detail::check_flash_mla_args(a, "phasekv::dsv4::flash_mla_with_kvcache", true);
  if (a.batch == 0 || a.s_q == 0) return;
  const bool extra = a.extra_k_cache.data != nullptr;
  const std::int64_t n0 = a.k_cache.num_blocks * a.k_cache.page_block_size;
  const SparseAttentionParams p = detail::flash_mla_sparse_params(a);
  const detail::FlashMlaRows<T> rows = detail::flash_mla_rows(a);
  detail::SparseAcc acc;
  detail::sparse_acc_init(p, acc);
  std::vector<std::int64_t> list(static_cast<std::size_t>(a.topk + a.extra_topk));
  std::vector<float> lse(static_cast<std::size_t>(a.h_q));
  const std::int64_t H = a.h_q, d = a.head_dim, dv = a.head_dim_v;
  for (std::int64_t b = 0; b < a.batch; ++b) {
    const std::int64_t k0 = a.topk_length ? a.topk_length[b] : a.topk;
    const std::int64_t k1 = !extra                ? 0
                            : a.extra_topk_length ? a.extra_topk_length[b]
                                                  : a.extra_topk;
    for (std::int64_t i = 0; i < a.s_q; ++i) {
      const std::int64_t r = b * a.s_q + i;
      std::int64_t m = 0;
      for (std::int64_t k = 0; k < k0; ++k)
        list[static_cast<std::size_t>(m++)] = a.indices[r * a.topk + k];
      for (std::int64_t k = 0; k < k1; ++k) {
        const std::int64_t j = a.extra_indices_in_kvcache[r * a.extra_topk + k];
        list[static_cast<std::size_t>(m++)] = j < 0 ? -1 : n0 + j;
      }
      float* o = a.out + r * H * dv;
      detail::sparse_query<T, Arch>(p, a.q + r * H * d, rows, rows, list.data(), m, 0, o,
                                    lse.data(), acc);
      for (std::int64_t h = 0; h < H; ++h) {
        float l = lse[static_cast<std::size_t>(h)];
        if (l == -HUGE_VALF) {
          l = HUGE_VALF;  // no row: out is already 0
        } else if (a.attn_sink != nullptr) {
          const float f = 1.0f / (1.0f + std::exp(a.attn_sink[h] - l));
          for (std::int64_t x = 0; x < dv; ++x) o[h * dv + x] *= f;
        }
        a.lse[(b * H + h) * a.s_q + i] = l;
      }
    }
  }
}

}  // namespace dsv4
PHASEKV_NAMESPACE_END
