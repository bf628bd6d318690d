/// @file
/// @brief The compressor policy contract: what a type must provide to turn one complete window
/// of W token vectors into one cache entry, the C++20 concept and C++17 trait that check it,
/// and the loaders that feed windows to policies.
///
/// A **compressor policy** is a small, trivially copyable object (it is passed by value to
/// CUDA kernels) with these const members:
///
/// | member | meaning |
/// |---|---|
/// | `phasekv::Geometry geometry() const` | the chunk geometry (W, S, O) it compresses |
/// | `std::int64_t input_dim() const` | d_in: channels of one raw token vector of one KV head |
/// | `std::int64_t output_dim() const` | d_out: channels of one entry |
/// | `template <class Load> void compress(std::int64_t kv_head, const Load& x, float* out) const` |
/// the math, `PHASEKV_HOST_DEVICE` |
///
/// and optionally `std::int64_t kv_heads() const`: the number of KV heads its parameters
/// cover (caches and batch compression then require that many heads; without the member, or
/// when it returns 0, a policy works for any head count).
///
/// CPU fast paths are not members: they are a specialization of phasekv::row_kernels
/// (compress/cpu/row_kernels.hpp) that compress_batch and CompressedCache look up, and CUDA's
/// are a specialization of phasekv::cuda::compress_kernels (compress/cuda/compress_kernels.cuh).
/// Without one a policy takes the generic path through compress(), which is always correct.
///
/// `compress(kv_head, x, out)` reads the window through the loader: `x(i, c)` returns
/// channel `c` (in `[0, input_dim())`) of the token at in-window offset `i` (in `[0, W)`) of
/// KV head `kv_head`, as float. The loader hides the element type and memory layout, so the
/// same policy code reads a global-memory tensor, shared memory or a ring buffer. It must write
/// all `output_dim()` floats of `out` (it may use `out` as scratch, but never read an element
/// before writing it). Rules for the math, so that streaming and batch compression, CPU and
/// CUDA, produce the same bits:
///
/// - compute in float, in an operation order fixed by the code (no data-dependent reordering,
///   no atomics, no reductions whose order depends on threads);
/// - write products that feed sums as phasekv::fp_fma and use phasekv::fp_exp instead of
///   `expf` (see float_ops.hpp);
/// - no virtual functions, no owning containers, no allocation; parameters are non-owning
///   pointers into caller memory (host memory for CPU use, device memory for CUDA use).
///
/// Host-side construction (factories, constructors) validates shapes and throws
/// phasekv::shape_error naming the argument; `compress` itself never checks or throws.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "phasekv/compress/float_ops.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/view.hpp"
#include "phasekv/phase/geometry.hpp"

#if PHASEKV_HAS_CONCEPTS
#include <concepts>
#endif

PHASEKV_NAMESPACE_BEGIN

/// Loader over one window of one KV head in strided memory: `x(i, c)` is
/// `to_float(base[i * token_stride + c])`. Works for any element type with a `to_float`
/// overload (float, bf16_t, f16_t) and on host and device.
template <class T>
struct StridedWindowLoader {
  const T* base = nullptr;        ///< Channel 0 of the token at offset 0 of the window.
  std::int64_t token_stride = 0;  ///< Elements between consecutive tokens.

  /// Channel `c` of the token at in-window offset `i`, as float.
  PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE float operator()(std::int64_t i, std::int64_t c) const {
    return to_float(base[i * token_stride + c]);
  }
};

/// Loader over window `j` of KV head `kv_head` of a `[tokens, heads, dim]` view whose token 0
/// is absolute position 0 (window j starts at position `g.window_begin(j)`).
template <class T>
PHASEKV_HOST_DEVICE StridedWindowLoader<T> window_loader(const StridedView<const T>& raw,
                                                         const Geometry& g, std::int64_t j,
                                                         std::int64_t kv_head) {
  return StridedWindowLoader<T>{raw.ptr(g.window_begin(j), kv_head), raw.token_stride};
}

namespace detail {

// Stand-in loader used only to check the policy contract in unevaluated contexts.
struct loader_archetype {
  PHASEKV_HOST_DEVICE float operator()(std::int64_t, std::int64_t) const;
};

template <class P, class = void>
struct has_geometry : std::false_type {};
template <class P>
struct has_geometry<P, std::enable_if_t<std::is_convertible<
                           decltype(std::declval<const P&>().geometry()), Geometry>::value>>
    : std::true_type {};

template <class P, class = void>
struct has_dims : std::false_type {};
template <class P>
struct has_dims<
    P,
    std::enable_if_t<
        std::is_convertible<decltype(std::declval<const P&>().input_dim()), std::int64_t>::value &&
        std::is_convertible<decltype(std::declval<const P&>().output_dim()), std::int64_t>::value>>
    : std::true_type {};

template <class P, class = void>
struct has_compress : std::false_type {};
template <class P>
struct has_compress<P, decltype(std::declval<const P&>().compress(
                                    std::int64_t{0}, std::declval<const loader_archetype&>(),
                                    static_cast<float*>(nullptr)),
                                void())> : std::true_type {};

template <class P, class = void>
struct has_kv_heads : std::false_type {};
template <class P>
struct has_kv_heads<P, std::enable_if_t<std::is_convertible<
                           decltype(std::declval<const P&>().kv_heads()), std::int64_t>::value>>
    : std::true_type {};

template <class P>
std::int64_t policy_kv_heads_impl(const P& p, std::true_type) {
  return static_cast<std::int64_t>(p.kv_heads());
}
template <class P>
std::int64_t policy_kv_heads_impl(const P&, std::false_type) {
  return 0;
}

}  // namespace detail

/// True when `P` satisfies the compressor policy contract (see policy.hpp): trivially
/// copyable, with `geometry()`, `input_dim()`, `output_dim()` and a const
/// `compress(kv_head, loader, out)` that accepts any loader.
template <class P>
struct is_compressor_policy
    : std::integral_constant<
          bool, std::is_trivially_copyable<P>::value && detail::has_geometry<P>::value &&
                    detail::has_dims<P>::value && detail::has_compress<P>::value> {};

/// `is_compressor_policy<P>::value`.
template <class P>
inline constexpr bool is_compressor_policy_v = is_compressor_policy<P>::value;

#if PHASEKV_HAS_CONCEPTS
/// C++20 concept form of the compressor policy contract (see policy.hpp).
template <class P>
concept CompressorPolicy = std::is_trivially_copyable_v<P> &&
    requires(const P& p, std::int64_t h, const detail::loader_archetype& x, float* out) {
  { p.geometry() } -> std::convertible_to<Geometry>;
  { p.input_dim() } -> std::convertible_to<std::int64_t>;
  { p.output_dim() } -> std::convertible_to<std::int64_t>;
  p.compress(h, x, out);
};
#endif

/// Compile-time check with an actionable message for each missing piece of the contract.
/// Call it (`phasekv::check_policy<P>();`) at the top of any template that takes a policy.
template <class P>
constexpr bool check_policy() {
  static_assert(std::is_trivially_copyable<P>::value,
                "phasekv: a compressor policy must be trivially copyable (no virtual functions, "
                "no owning containers such as std::vector; hold parameters as raw pointers into "
                "caller memory)");
  static_assert(detail::has_geometry<P>::value,
                "phasekv: a compressor policy needs `phasekv::Geometry geometry() const`");
  static_assert(detail::has_dims<P>::value,
                "phasekv: a compressor policy needs `std::int64_t input_dim() const` and "
                "`std::int64_t output_dim() const`");
  static_assert(detail::has_compress<P>::value,
                "phasekv: a compressor policy needs `template <class Load> PHASEKV_HOST_DEVICE "
                "void compress(std::int64_t kv_head, const Load& x, float* out) const` where "
                "x(i, c) returns channel c of the token at in-window offset i as float");
  return is_compressor_policy<P>::value;
}

/// Number of KV heads a policy's parameters cover: `p.kv_heads()` when the policy has that
/// member, else 0 (meaning: any head count).
template <class P>
std::int64_t policy_kv_heads(const P& p) {
  return detail::policy_kv_heads_impl(p, detail::has_kv_heads<P>{});
}

/// Host-side run-time check of a policy's dimensions: `input_dim()` and `output_dim()` >= 1,
/// and, when `kv_heads` > 0 and the policy covers a fixed head count, that the counts match.
/// Throws phasekv::shape_error naming `name` (e.g. "key_policy").
template <class P>
void check_policy_dims(const P& p, std::int64_t kv_heads, const char* where, const char* name) {
  check_policy<P>();
  const std::string n(name);
  const std::int64_t din = p.input_dim(), dout = p.output_dim();
  detail::check_arg<shape_error>(din >= 1, where, (n + ".input_dim()").c_str(), din,
                                 "must be >= 1");
  detail::check_arg<shape_error>(dout >= 1, where, (n + ".output_dim()").c_str(), dout,
                                 "must be >= 1");
  const std::int64_t ph = policy_kv_heads(p);
  detail::check_arg<shape_error>(kv_heads <= 0 || ph <= 0 || ph == kv_heads, where,
                                 (n + ".kv_heads()").c_str(), ph,
                                 "must equal the KV head count of the data it compresses");
}

PHASEKV_NAMESPACE_END
