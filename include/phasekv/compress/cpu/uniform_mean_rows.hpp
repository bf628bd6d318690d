/// @file
/// @brief row_kernels<UniformMean>: the CPU fast paths of UniformMean (a window; a run of
/// windows for bf16 rows with W = 2 S), over the row kernels of compress/cpu/rows.hpp.
#pragma once

#include <cstdint>
#include <type_traits>

#include "phasekv/compress/cpu/row_kernels.hpp"
#include "phasekv/compress/cpu/rows.hpp"
#include "phasekv/compress/uniform_mean.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"

PHASEKV_NAMESPACE_BEGIN

/// The CPU fast paths of UniformMean (see row_kernels for the contract), any `Arch`: the
/// kernels choose the instruction set at run time.
template <class Arch>
struct row_kernels<UniformMean, Arch> {
  /// True: UniformMean has fast paths.
  static constexpr bool fast = true;

  /// One window, vectorized across channels; every configuration (returns true).
  template <class T>
  static bool window(const UniformMean& p, std::int64_t kv_head, const T* rows,
                     std::int64_t token_stride, float* out) {
    (void)kv_head;
    detail::rows::mean(rows, token_stride, p.geometry().window(), p.input_dim(), out);
    return true;
  }

  /// A run of windows: with W = 2 S each token is in two windows, and its row is widened once
  /// for both sums. Covers bf16 rows with W = 2 S and a multiple of 32 channels where an
  /// AVX-512 build runs; returns false, writing nothing, otherwise.
  template <class T>
  static bool run(const UniformMean& p, std::int64_t kv_head, const T* rows,
                  std::int64_t token_stride, std::int64_t count, T* entries,
                  std::int64_t entry_stride, bool stream, std::int64_t prefetch_tokens) {
    (void)kv_head;
    const std::int64_t s = p.geometry().stride(), d = p.input_dim();
    if constexpr (std::is_same<T, bf16_t>::value) {
      if (!detail::rows::mean_run_available() || p.geometry().window() != 2 * s || d % 32 != 0)
        return false;
      detail::rows::mean_run_bf16(rows, token_stride, s, count, d, entries, entry_stride, stream,
                                  prefetch_tokens);
      return true;
    } else {
      (void)rows, (void)token_stride, (void)count, (void)entries, (void)entry_stride;
      (void)stream, (void)prefetch_tokens, (void)s, (void)d;
      return false;
    }
  }
};

PHASEKV_NAMESPACE_END
