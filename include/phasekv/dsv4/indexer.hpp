/// @file
/// @brief The DeepSeek-V4 lightning indexer: scores every visible compressed entry for a query
/// and keeps the top k, deterministically.
///
/// For a query at position t (n = t + 1) with H indexer heads `q(t, h)` (each `dim` wide) and
/// per-head weights `w(t, h)`, the score of compressed indexer key `k(j)` is
///
///     I(t, j) = sum_h w(t, h) * max(0, <q(t, h), k(j)>)
///
/// over the visible entries `j < J(n)`, where `J(n) = geometry.complete_windows(n)` (for the
/// DeepSeek-V4 compressor, `Geometry(ratio, ratio)`: J(n) = floor(n / ratio)). The result is
/// the indices of the k largest scores in descending order of score, ties to the lower index,
/// padded with -1 when fewer than k entries are visible. Any scale the model applies (V4 folds
/// `H^-1/2 * dim^-1/2` into w) is the caller's to fold into `w`.
///
/// Arithmetic (f32; the same inputs give the same scores, and the same selection, on every
/// call, for every position of the key in the tensor and every number of queries): the
/// scoring kernel runs the instruction-set build of the CPU (run-time dispatch,
/// `PHASEKV_ARCH` forces one; or an explicit `Arch` tag), W = 16 (AVX-512), 8 (AVX2), 4 (NEON)
/// or 1 (scalar) lanes:
/// - each dot product `<q(t, h), k(j)>` is W partial sums (lane l adds the channels
///   i = l mod W in channel order, one multiply-add each, fused on the vector paths; the
///   channels are zero padded to a multiple of 16), whose lanes are then added by the fixed
///   tree of `Vec<Arch>::hsumw`;
/// - the head sum is HB partial sums (HB = 4 on AVX-512 and NEON, 2 on AVX2 and scalar): the
///   partial sum r adds `w(t, h) * ReLU(dot)` of the heads h = r mod HB in head order (fused
///   on the vector paths), then the HB partial sums are added in order r = 0, 1, ...
/// Different builds may differ in the last bits (within the f32 error bound of these orders).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "phasekv/attention/cpu/dispatch.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/prefetch.hpp"
#include "phasekv/core/target.hpp"
#include "phasekv/cpu/arch.hpp"
#include "phasekv/cpu/vec.hpp"
#include "phasekv/phase/geometry.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace dsv4 {

/// Shape of a lightning indexer and the geometry that decides which entries a query sees.
struct IndexerParams {
  std::int64_t heads = 64;   ///< H: indexer query heads.
  std::int64_t dim = 128;    ///< Width of each indexer query head and key.
  std::int64_t top_k = 512;  ///< k: indices kept per query.
  Geometry geometry{4, 4};   ///< J(n) = geometry.complete_windows(n) entries are visible.

  /// Host check; throws phasekv::invalid_argument naming `where` and the bad field.
  void check(const char* where) const {
    phasekv::detail::check_arg(heads >= 1 && heads <= 4096, where, "params.heads", heads,
                               "must be in [1, 4096]");
    phasekv::detail::check_arg(dim >= 1 && dim <= 65536, where, "params.dim", dim,
                               "must be in [1, 65536]");
    phasekv::detail::check_arg(top_k >= 1 && top_k <= (std::int64_t{1} << 30), where,
                               "params.top_k", top_k, "must be in [1, 2^30]");
  }
};

namespace detail {

// Channels of a query head or key in the scoring kernel's scratch: `dim` rounded up to 16
// (a multiple of every build's lane count), the padding zero.
inline std::int64_t index_padded_dim(std::int64_t dim) { return (dim + 15) / 16 * 16; }

// Floats of the scoring kernel's scratch for `heads` x `dim` (dsv4/cpu/index_pass.inl, tiles of
// at most 4 heads x 4 keys): the padded query, a block of keys, the tile weights and sums, and
// room to align them to 64 bytes.
inline std::int64_t index_scratch_floats(std::int64_t heads, std::int64_t dim) {
  const std::int64_t hp = (heads + 3) / 4 * 4;
  return (hp + 4) * index_padded_dim(dim) + hp * 4 + 32;  // + the block sums and alignment
}

}  // namespace detail
}  // namespace dsv4
PHASEKV_NAMESPACE_END

#if !defined(PHASEKV_DOXYGEN)  // the scoring kernel, once per target pass
#define PHASEKV_TARGET_BODY "phasekv/dsv4/cpu/index_pass.inl"
#include "phasekv/core/foreach_target.inc"
#endif

PHASEKV_NAMESPACE_BEGIN
namespace dsv4 {
namespace detail {

// Scores of entries [0, count) for one query, in the build of `Arch` (arch::Auto: the CPU's,
// cpu::active_arch()). `scratch` holds index_scratch_floats(heads, dim) floats.
template <class Arch, class T>
void index_scores(const IndexerParams& p, const float* q, const float* w, const T* keys,
                  std::int64_t key_stride, std::int64_t count, float* scores, float* scratch) {
  cpu::detail::with_arch<Arch>([&](auto tag) {
    using A = decltype(tag);
    dsv4_index_scores(cpu::detail::target_t<A>{}, tag, p, q, w, keys, key_stride, count, scores,
                      scratch);
  });
}

// Top-k of scores[0, count) into idx[0, k) (and their scores), descending, ties to the lower
// index, -1 / -inf padding. `order` is scratch.
inline void select_top_k(const float* scores, std::int64_t count, std::int64_t k,
                         std::vector<std::int32_t>& order, std::int32_t* idx, float* out_scores) {
  const std::int64_t m = std::min(count, k);
  order.resize(static_cast<std::size_t>(count));
  for (std::int64_t j = 0; j < count; ++j)
    order[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(j);
  auto before = [scores](std::int32_t a, std::int32_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  };
  if (m < count) std::nth_element(order.begin(), order.begin() + m, order.end(), before);
  std::sort(order.begin(), order.begin() + m, before);
  for (std::int64_t i = 0; i < k; ++i) {
    const bool real = i < m;
    const std::int32_t j = real ? order[static_cast<std::size_t>(i)] : -1;
    idx[i] = j;
    if (out_scores != nullptr) out_scores[i] = real ? scores[j] : -HUGE_VALF;
  }
}

}  // namespace detail

/// Prefill (and decode with `num_queries = 1`): queries at positions `first_position + i`,
/// i in `[0, num_queries)`. `q` is `[num_queries, heads, dim]`, `w` is `[num_queries, heads]`
/// (f32), `keys` the compressed indexer keys `[num_keys, dim]` (row r at `keys + r *
/// key_stride`; f32, bf16 or f16), at least `J(first_position + num_queries)` of them.
/// Writes `indices` (`[num_queries, top_k]` int32) and, when not null, `scores` (same shape;
/// -inf where the index is -1). Throws phasekv::invalid_argument (a capacity_error when keys
/// are missing) before writing anything.
///
/// `Arch` picks the scoring kernel's instruction-set build: cpu::arch::Auto (the default) runs
/// the CPU's (cpu::active_arch(): the widest it supports, or the one the environment variable
/// PHASEKV_ARCH names); an explicit tag (cpu::arch::Scalar, Avx2, Avx512, Neon) runs that one,
/// or throws phasekv::invalid_argument naming it when this CPU cannot (cpu::check_cpu_runs).
template <class T, class Arch = cpu::arch::Auto>
void indexer_top_k(const IndexerParams& params, const float* q, const float* w, const T* keys,
                   std::int64_t num_keys, std::int64_t key_stride, std::int64_t first_position,
                   std::int64_t num_queries, std::int32_t* indices, float* scores = nullptr) {
  const char* where = "phasekv::dsv4::indexer_top_k";
  params.check(where);
  phasekv::detail::check_arg(num_queries >= 0, where, "num_queries", num_queries, "must be >= 0");
  phasekv::detail::check_arg(first_position >= 0 && first_position <= kMaxLength - num_queries,
                             where, "first_position", first_position,
                             "must be in [0, 2^62 - num_queries]");
  if (num_queries == 0) return;
  phasekv::detail::check_arg(key_stride >= params.dim, where, "key_stride", key_stride,
                             "must be >= params.dim");
  const std::int64_t need = params.geometry.complete_windows(first_position + num_queries);
  phasekv::detail::check_arg<capacity_error>(num_keys >= need, where, "num_keys", num_keys,
                                             "must hold J(n) entries of the last query");
  phasekv::detail::check_arg(need <= (std::int64_t{1} << 31) - 1, where, "num_keys", need,
                             "visible entries must fit int32 indices");
  phasekv::detail::check_arg(q != nullptr && w != nullptr, where, "q", "null",
                             "q and w must not be null");
  phasekv::detail::check_arg(need == 0 || keys != nullptr, where, "keys", "null",
                             "must not be null");
  phasekv::detail::check_arg(indices != nullptr, where, "indices", "null", "must not be null");
  std::vector<float> sc(static_cast<std::size_t>(need));
  std::vector<float> scratch(
      static_cast<std::size_t>(detail::index_scratch_floats(params.heads, params.dim)));
  std::vector<std::int32_t> order;
  const std::int64_t k = params.top_k;
  for (std::int64_t i = 0; i < num_queries; ++i) {
    const std::int64_t J = params.geometry.complete_windows(first_position + i + 1);
    detail::index_scores<Arch, T>(params, q + i * params.heads * params.dim, w + i * params.heads,
                                  keys, key_stride, J, sc.data(), scratch.data());
    detail::select_top_k(sc.data(), J, k, order, indices + i * k,
                         scores != nullptr ? scores + i * k : nullptr);
  }
}

/// Decode: the one query at position `n - 1` (n >= 1 tokens seen); see indexer_top_k.
template <class T, class Arch = cpu::arch::Auto>
void indexer_decode(const IndexerParams& params, const float* q, const float* w, const T* keys,
                    std::int64_t num_keys, std::int64_t key_stride, std::int64_t n,
                    std::int32_t* indices, float* scores = nullptr) {
  phasekv::detail::check_arg(n >= 1, "phasekv::dsv4::indexer_decode", "n", n, "must be >= 1");
  indexer_top_k<T, Arch>(params, q, w, keys, num_keys, key_stride, n - 1, 1, indices, scores);
}

}  // namespace dsv4
PHASEKV_NAMESPACE_END
