/// @file
/// @brief Error reporting of the CUDA host launchers: argument validation that never touches the
/// device, a `cudaError_t` return, and the message of the last rejected call.
///
/// Every launcher validates its arguments on the host *before* any CUDA call. A rejected call
/// returns `cudaErrorInvalidValue` and stores a message naming the argument and its value (the
/// same text the matching `check_*` function throws as phasekv::invalid_argument); read it with
/// phasekv::cuda::last_error_message(). The message is thread-local and is cleared by every
/// launcher call that passes validation.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"

/// CUDA back end of phasekv: device kernels and their host launchers.
PHASEKV_NAMESPACE_BEGIN
namespace cuda {

namespace detail {

inline std::string& last_message_storage() {
  thread_local std::string message;
  return message;
}

/// Runs a host validation functor; converts a phasekv::invalid_argument into
/// cudaErrorInvalidValue (recording its message) and clears the message otherwise.
template <class F>
cudaError_t validate_into_status(F&& check) {
  try {
    check();
  } catch (const std::invalid_argument& e) {
    last_message_storage() = e.what();
    return cudaErrorInvalidValue;
  }
  last_message_storage().clear();
  return cudaSuccess;
}

/// Rounds `x` up to a multiple of `a` (a > 0).
constexpr std::size_t round_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

/// Ceil division for non-negative int64 values.
constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace detail

/// Message of the last call on this thread that a phasekv CUDA launcher rejected with
/// `cudaErrorInvalidValue` (empty when the last call passed validation). The pointer stays
/// valid until the next launcher call on the same thread.
inline const char* last_error_message() { return detail::last_message_storage().c_str(); }

/// Workspace protocol shared by the launchers (CUB's two-call style):
/// - `workspace == nullptr`: `*workspace_bytes` receives the bytes needed and the call returns
///   `cudaSuccess` without launching anything (arguments are still validated);
/// - otherwise `*workspace_bytes` must be at least that size (else `cudaErrorInvalidValue`),
///   and `workspace` must be device memory aligned to 256 bytes (what cudaMalloc returns).
inline constexpr std::size_t kWorkspaceAlignment = 256;

}  // namespace cuda
PHASEKV_NAMESPACE_END
