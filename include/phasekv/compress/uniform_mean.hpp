/// @file
/// @brief UniformMean: every window becomes the plain mean of its W token vectors
/// (alpha_i = 1/W), the simplest compressor policy.
#pragma once

#include <cstdint>
#include <type_traits>

#include "phasekv/compress/cpu_rows.hpp"
#include "phasekv/compress/float_ops.hpp"
#include "phasekv/compress/policy.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/phase/geometry.hpp"

PHASEKV_NAMESPACE_BEGIN

/// Mean pooling: entry `e[c] = (x_0[c] + x_1[c] + ... + x_{W-1}[c]) / W`, summed in offset
/// order in float and divided once (correctly rounded). d_out = d_in; no parameters, so it
/// works for any number of KV heads.
class UniformMean {
 public:
  /// Default: W = S = 1, O = 0, one channel (mostly useful as a placeholder before assignment).
  constexpr UniformMean() = default;

  /// Mean pooling over windows of `geometry` for vectors of `dim` channels. Throws
  /// phasekv::shape_error when `dim` < 1.
  UniformMean(const Geometry& geometry, std::int64_t dim) : geometry_(geometry), dim_(dim) {
    detail::check_arg<shape_error>(dim >= 1, "phasekv::UniformMean", "dim", dim, "must be >= 1");
  }

  /// The chunk geometry.
  PHASEKV_HOST_DEVICE constexpr Geometry geometry() const { return geometry_; }
  /// Channels of a raw token vector.
  PHASEKV_HOST_DEVICE constexpr std::int64_t input_dim() const { return dim_; }
  /// Channels of an entry (equal to input_dim()).
  PHASEKV_HOST_DEVICE constexpr std::int64_t output_dim() const { return dim_; }

  /// Writes the mean of the window into `out[0, dim)`. `kv_head` is unused (no parameters).
  template <class Load>
  PHASEKV_HOST_DEVICE void compress(std::int64_t kv_head, const Load& x, float* out) const {
    (void)kv_head;
    const std::int64_t w = geometry_.window();
    for (std::int64_t c = 0; c < dim_; ++c) out[c] = x(0, c);
    for (std::int64_t i = 1; i < w; ++i)
      for (std::int64_t c = 0; c < dim_; ++c) out[c] = detail::fp_add(out[c], x(i, c));
    const float wf = static_cast<float>(w);
    for (std::int64_t c = 0; c < dim_; ++c) out[c] = detail::fp_div(out[c], wf);
  }

  /// Host fast path (see policy.hpp, `compress_rows`): the same bits as compress() for a
  /// window whose token at offset i starts at `rows + i * token_stride` (channels contiguous),
  /// vectorized across channels. Always handles the window and returns true.
  template <class T>
  bool compress_rows(std::int64_t kv_head, const T* rows, std::int64_t token_stride,
                     float* out) const {
    (void)kv_head;
    detail::rows::mean(rows, token_stride, geometry_.window(), dim_, out);
    return true;
  }

  /// Host fast path for a run of consecutive windows (see policy.hpp, `compress_rows_run`):
  /// windows r < `count`, window r's token at offset i at `rows + (r * S + i) * token_stride`,
  /// each entry (compress()'s bits converted by from_float) written to
  /// `entries + r * entry_stride`, with non-temporal stores when `stream` is true (the caller
  /// fences). With W = 2 S each token is in two windows, and its row is widened once for both
  /// sums. Covers bf16 rows with W = 2 S and a multiple of 32 channels on translation units
  /// with AVX-512 (F, BW); returns false, writing nothing, otherwise. With `prefetch_tokens` > 0
  /// it prefetches the rows of later tokens a few blocks ahead of its sums (up to that bound).
  template <class T>
  bool compress_rows_run(std::int64_t kv_head, const T* rows, std::int64_t token_stride,
                         std::int64_t count, T* entries, std::int64_t entry_stride,
                         bool stream, std::int64_t prefetch_tokens) const {
    (void)kv_head;
    const std::int64_t s = geometry_.stride();
    if (!std::is_same<T, bf16_t>::value || !detail::rows::mean_run_available() ||
        geometry_.window() != 2 * s || dim_ % 32 != 0)
      return false;
#if PHASEKV_HAS_AVX512 || PHASEKV_DETAIL_ROWS_SIMD_FLAGS >= 512
    if constexpr (std::is_same<T, bf16_t>::value)
      detail::rows::mean_run_bf16(rows, token_stride, s, count, dim_, entries, entry_stride,
                                  stream, prefetch_tokens);
    return true;
#else
    (void)rows, (void)token_stride, (void)count, (void)entries, (void)entry_stride, (void)stream;
    (void)prefetch_tokens;
    return false;
#endif
  }

 private:
  Geometry geometry_{};
  std::int64_t dim_ = 1;
};

PHASEKV_NAMESPACE_END
