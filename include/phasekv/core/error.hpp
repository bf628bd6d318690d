/// @file
/// @brief Exceptions thrown on bad input, and the helpers that build their messages.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

#include "phasekv/core/config.hpp"

PHASEKV_NAMESPACE_BEGIN

/// Thrown for any invalid argument passed to a phasekv host API.
///
/// The message always names the function or type that rejected the input, the argument (or
/// field) and the offending value, e.g.
/// `phasekv::Geometry: window = 0 is invalid (must be >= 1)`.
class invalid_argument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Thrown when a shape (dimension, head count, stride, parameter size) does not match.
class shape_error : public invalid_argument {
 public:
  using invalid_argument::invalid_argument;
};

/// Thrown when an operation would write past the capacity of a caller-provided buffer or
/// of a cache.
class capacity_error : public invalid_argument {
 public:
  using invalid_argument::invalid_argument;
};

namespace detail {

template <class E = invalid_argument, class T>
[[noreturn]] inline void throw_arg(const char* where, const char* name, const T& value,
                                   const char* requirement) {
  std::ostringstream os;
  os << where << ": " << name << " = " << value << " is invalid (" << requirement << ")";
  throw E(os.str());
}

template <class E = invalid_argument, class T>
inline void check_arg(bool ok, const char* where, const char* name, const T& value,
                      const char* requirement) {
  if (!ok) throw_arg<E>(where, name, value, requirement);
}

}  // namespace detail
PHASEKV_NAMESPACE_END
