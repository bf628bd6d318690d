/// @file
/// @brief Storage element types (f32, bf16, f16) and bit-exact conversions.
///
/// `bf16_t` and `f16_t` are plain 16-bit storage types. Conversion from `float` rounds to
/// nearest, ties to even; NaN stays NaN and infinities saturate to infinity. The conversions
/// are written once as PHASEKV_HOST_DEVICE code, so host and device produce identical bits
/// (a requirement for streaming and batch compression to agree bit for bit).
#pragma once

#include <cstdint>
#include <cstring>

#include "phasekv/core/config.hpp"

PHASEKV_NAMESPACE_BEGIN

/// bfloat16 storage: the upper 16 bits of an IEEE-754 binary32.
struct bf16_t {
  std::uint16_t bits;  ///< Raw bit pattern.
};

/// IEEE-754 binary16 storage.
struct f16_t {
  std::uint16_t bits;  ///< Raw bit pattern.
};

/// Identifies a storage element type at run time (for messages and dispatch).
enum class ElementKind : std::uint8_t {
  f32,   ///< IEEE-754 binary32.
  bf16,  ///< bfloat16.
  f16,   ///< IEEE-754 binary16.
};

/// The bit pattern of `f` (IEEE-754 binary32), host and device.
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE std::uint32_t fp_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

/// The float whose bit pattern is `u`, host and device.
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE float fp_from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

namespace detail {
using phasekv::fp_bits;
using phasekv::fp_from_bits;
}  // namespace detail

/// Converts a float to bfloat16, rounding to nearest even (NaN stays a quiet NaN).
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE bf16_t float_to_bf16(float f) {
  const std::uint32_t x = fp_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<std::uint16_t>((x >> 16) | 0x40u)};
  return bf16_t{static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16)};
}

/// Converts bfloat16 to float (exact).
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE float bf16_to_float(bf16_t h) {
  return fp_from_bits(static_cast<std::uint32_t>(h.bits) << 16);
}

/// Converts a float to IEEE binary16, rounding to nearest even, with subnormals; values of
/// magnitude >= 65520 become infinity; NaN stays a quiet NaN.
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE f16_t float_to_f16(float f) {
  const std::uint32_t x = fp_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or nan
    const std::uint32_t nan = ax > 0x7f800000u ? (0x200u | ((ax >> 13) & 0x3ffu)) : 0u;
    return f16_t{static_cast<std::uint16_t>(sign | 0x7c00u | nan)};
  }
  if (ax >= 0x477ff000u) return f16_t{static_cast<std::uint16_t>(sign | 0x7c00u)};
  if (ax < 0x38800000u) {  // result is subnormal or zero
    if (ax < 0x33000000u) return f16_t{static_cast<std::uint16_t>(sign)};
    const std::uint32_t e = ax >> 23;
    const std::uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - e;  // 14..24
    std::uint32_t q = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return f16_t{static_cast<std::uint16_t>(sign | q)};
  }
  const std::uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u) - 0x38000000u;
  return f16_t{static_cast<std::uint16_t>(sign | (r >> 13))};
}

/// Converts IEEE binary16 to float (exact).
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE float f16_to_float(f16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  std::uint32_t e = (h.bits >> 10) & 0x1fu;
  std::uint32_t m = h.bits & 0x3ffu;
  if (e == 0) {
    if (m == 0) return fp_from_bits(sign);
    e = 1;
    while (!(m & 0x400u)) {
      m <<= 1;
      --e;
    }
    m &= 0x3ffu;
    return fp_from_bits(sign | ((e + 112u) << 23) | (m << 13));
  }
  if (e == 31) return fp_from_bits(sign | 0x7f800000u | (m << 13));
  return fp_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

/// Converts a storage element to float: the identity for float.
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE float to_float(float x) { return x; }
/// Converts a storage element to float.
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE float to_float(bf16_t x) { return bf16_to_float(x); }
/// Converts a storage element to float.
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE float to_float(f16_t x) { return f16_to_float(x); }

/// Properties of a storage element type. Specialized for `float`, `bf16_t` and `f16_t`;
/// the primary template rejects any other type with an actionable message.
template <class T>
struct element_traits {
  static_assert(sizeof(T) == 0,
                "phasekv: unsupported storage element type; use float, phasekv::bf16_t or "
                "phasekv::f16_t (or specialize phasekv::element_traits)");
};

/// Traits of `float` storage.
template <>
struct element_traits<float> {
  static constexpr ElementKind kind = ElementKind::f32;  ///< Run-time tag.
  static constexpr const char* name = "f32";             ///< Short name.
  /// Converts from float (identity).
  PHASEKV_HOST_DEVICE static float from_float(float x) { return x; }
};

/// Traits of `bf16_t` storage.
template <>
struct element_traits<bf16_t> {
  static constexpr ElementKind kind = ElementKind::bf16;  ///< Run-time tag.
  static constexpr const char* name = "bf16";             ///< Short name.
  /// Converts from float, rounding to nearest even.
  PHASEKV_HOST_DEVICE static bf16_t from_float(float x) { return float_to_bf16(x); }
};

/// Traits of `f16_t` storage.
template <>
struct element_traits<f16_t> {
  static constexpr ElementKind kind = ElementKind::f16;  ///< Run-time tag.
  static constexpr const char* name = "f16";             ///< Short name.
  /// Converts from float, rounding to nearest even.
  PHASEKV_HOST_DEVICE static f16_t from_float(float x) { return float_to_f16(x); }
};

/// Converts a float to storage type `T`, rounding to nearest even.
template <class T>
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE T from_float(float x) {
  return element_traits<T>::from_float(x);
}

/// Short name of an element kind ("f32", "bf16", "f16").
inline const char* element_name(ElementKind k) {
  switch (k) {
    case ElementKind::f32: return "f32";
    case ElementKind::bf16: return "bf16";
    case ElementKind::f16: return "f16";
  }
  return "unknown";
}

PHASEKV_NAMESPACE_END
