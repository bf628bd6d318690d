/// @file
/// @brief phasekv::row_kernels: the CPU fast paths of a compressor policy, a specialization
/// point. compress_batch and CompressedCache::append look a policy up here; the built-in
/// policies specialize it like anyone else (compress/cpu/uniform_mean_rows.hpp,
/// compress/cpu/gated_pool_rows.hpp).
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "phasekv/core/config.hpp"
#include "phasekv/cpu/arch.hpp"

PHASEKV_NAMESPACE_BEGIN

/// CPU fast paths of compressor policy `Policy` for the architecture tag `Arch`.
///
/// **The primary template is the generic path**: `fast` is false and there are no kernels, so
/// compress_batch, compress_entries and CompressedCache call `Policy::compress` through a
/// loader, window by window. That is always correct; a fast path only adds speed.
///
/// To give a policy a fast path, specialize it (usually for every `Arch`):
/// @code
/// template <class Arch>
/// struct phasekv::row_kernels<MyPolicy, Arch> {
///   static constexpr bool fast = true;
///   template <class T>
///   static bool window(const MyPolicy& p, std::int64_t kv_head, const T* rows,
///                      std::int64_t token_stride, float* out);
/// };
/// @endcode
/// with `fast = true` and any of these static members (each optional; T is float, bf16_t or
/// f16_t):
///
/// - `window(p, kv_head, rows, token_stride, out) -> bool`: one window of head `kv_head`
///   whose token at in-window offset i starts at `rows + i * token_stride` (channels
///   contiguous) into `out[0, output_dim())`.
/// - `window_pair(p, kv_head, rows, out, kv_head2, rows2, out2, token_stride) -> bool`: two
///   windows at once (compress_batch pairs the KV heads of a window: one window's dependency
///   chain leaves much of a core idle).
/// - `run(p, kv_head, rows, token_stride, count, entries, entry_stride, stream,
///   prefetch_tokens) -> bool`: `count` consecutive windows of one head, window r's token at
///   offset i at `rows + (r * S + i) * token_stride`, entry r (output_dim() elements of T:
///   compress()'s floats converted by `from_float<T>`) written to `entries + r * entry_stride`.
///   With `stream` the entry rows start on 64-byte lines and may be written with non-temporal
///   stores (the caller fences). `prefetch_tokens` > 0 marks a DRAM-sized call: the rows of
///   tokens t < prefetch_tokens exist and may be prefetched ahead of the work (0: do not).
///
/// Each must either write exactly the bits `Policy::compress` gives (and return true) or write
/// nothing and return false for configurations it does not cover; the caller then takes the
/// next path (run, then window_pair, then window, then compress). Bit-identical output is what
/// keeps streaming equal to batch compression; write the arithmetic with phasekv::fp_fma and
/// friends (compress/float_ops.hpp) and vectorize across channels, never reassociating.
///
/// `Arch` is the architecture tag of the caller: compress_batch and CompressedCache ask for
/// cpu::arch::Auto (choose the instruction set at run time, as the built-in kernels do); a
/// specialization for one explicit tag only serves callers that name it. CUDA has its own
/// trait, phasekv::cuda::compress_kernels (compress/cuda/compress_kernels.cuh).
template <class Policy, class Arch = cpu::arch::Auto>
struct row_kernels {
  /// False: no fast path; callers use `Policy::compress` through a loader.
  static constexpr bool fast = false;
};

namespace detail {

template <class P, class T, class = void>
struct has_compress_rows : std::false_type {};
/// Whether row_kernels<P> has `window` for rows of T.
template <class P, class T>
struct has_compress_rows<
    P, T,
    std::enable_if_t<row_kernels<P>::fast &&
                     std::is_convertible<decltype(row_kernels<P>::window(
                                             std::declval<const P&>(), std::int64_t{0},
                                             static_cast<const T*>(nullptr), std::int64_t{0},
                                             static_cast<float*>(nullptr))),
                                         bool>::value>> : std::true_type {};

template <class P, class T, class = void>
struct has_compress_rows2 : std::false_type {};
/// Whether row_kernels<P> has `window_pair` for rows of T.
template <class P, class T>
struct has_compress_rows2<
    P, T,
    std::enable_if_t<
        row_kernels<P>::fast &&
        std::is_convertible<decltype(row_kernels<P>::window_pair(
                                std::declval<const P&>(), std::int64_t{0},
                                static_cast<const T*>(nullptr), static_cast<float*>(nullptr),
                                std::int64_t{0}, static_cast<const T*>(nullptr),
                                static_cast<float*>(nullptr), std::int64_t{0})),
                            bool>::value>> : std::true_type {};

template <class P, class T, class = void>
struct has_compress_rows_run : std::false_type {};
/// Whether row_kernels<P> has `run` for rows and entries of T.
template <class P, class T>
struct has_compress_rows_run<
    P, T,
    std::enable_if_t<
        row_kernels<P>::fast &&
        std::is_convertible<decltype(row_kernels<P>::run(
                                std::declval<const P&>(), std::int64_t{0},
                                static_cast<const T*>(nullptr), std::int64_t{0}, std::int64_t{0},
                                static_cast<T*>(nullptr), std::int64_t{0}, false, std::int64_t{0})),
                            bool>::value>> : std::true_type {};

/// `P` itself, as a type that depends on `T` (so that a policy's member templates look its
/// row_kernels specialization up when they are instantiated, not when they are defined).
template <class P, class T>
struct dependent_policy {
  using type = P;  ///< P.
};
/// dependent_policy<P, T>::type.
template <class P, class T>
using dependent_policy_t = typename dependent_policy<P, T>::type;

}  // namespace detail

PHASEKV_NAMESPACE_END
