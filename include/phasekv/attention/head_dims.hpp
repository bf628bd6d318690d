/// @file
/// @brief The head dims that have specialized attention kernels (64, 128, 256), listed once
/// for the CPU and CUDA backends, and the dispatch from a run-time head dim to a kernel
/// instantiated for it. Every other head dim runs the generic path.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "phasekv/core/config.hpp"

PHASEKV_NAMESPACE_BEGIN

/// A compile-time list of head dims.
template <int... Dims>
struct head_dim_list {
  /// True when `d` is in the list.
  static constexpr bool contains(std::int64_t d) { return ((d == Dims) || ...); }
};

/// The head dims with fast paths: the CPU decode kernels' qk/pv rows and the CUDA
/// tensor-core prefill (which also needs d_k == d_v). Any other dim takes the generic path.
using fast_head_dims = head_dim_list<64, 128, 256>;

/// True when `d` has a fast path (is in fast_head_dims).
constexpr bool is_fast_head_dim(std::int64_t d) { return fast_head_dims::contains(d); }

/// The compile-time head dim a dispatch passes: `D` for a dim of fast_head_dims, 0 for the
/// generic path.
template <int D>
using head_dim_constant = std::integral_constant<int, D>;

namespace detail {

template <class F, int... Dims>
PHASEKV_FORCEINLINE decltype(auto) dispatch_head_dim_in(std::int64_t d, F&& f,
                                                        head_dim_list<Dims...>) {
  using R = decltype(f(head_dim_constant<0>{}));
  if constexpr (std::is_void<R>::value) {
    const bool hit = ((d == Dims ? (f(head_dim_constant<Dims>{}), true) : false) || ...);
    if (!hit) f(head_dim_constant<0>{});
  } else {
    R r{};
    const bool hit = ((d == Dims ? (r = f(head_dim_constant<Dims>{}), true) : false) || ...);
    if (!hit) r = f(head_dim_constant<0>{});
    return r;
  }
}

}  // namespace detail

/// Calls `f(head_dim_constant<D>{})` with `D = d` when `d` is one of fast_head_dims, and
/// `f(head_dim_constant<0>{})` (the generic path) otherwise; returns what `f` returns (which
/// must be the same type for every D, and default-constructible unless void). Host code; `f`
/// is inlined into the caller (which may be a kernel compiled for a wider instruction set).
template <class F>
PHASEKV_FORCEINLINE decltype(auto) dispatch_head_dim(std::int64_t d, F&& f) {
  return detail::dispatch_head_dim_in(d, std::forward<F>(f), fast_head_dims{});
}

PHASEKV_NAMESPACE_END
