/// @file
/// @brief FP8 E4M3 storage (the OCP "E4M3FN" format DeepSeek-V4 caches use) with exact decode
/// and round-to-nearest-even encode, written once for host and device.
///
/// Layout: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits. Exponent field 0 holds the
/// subnormals `m * 2^-9`; fields 1..15 hold `(1 + m/8) * 2^(e - 7)`, except `S.1111.111`, the
/// only NaN. There is no infinity; the largest finite magnitude is 448.
///
/// A tensor stored as E4M3 usually carries one float scale: the real value of code c is
/// `fp8_e4m3_to_float(c) * scale`, and an engine writes `float_to_fp8_e4m3(x / scale)`.
#pragma once

#include <cstdint>

#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"

PHASEKV_NAMESPACE_BEGIN

/// FP8 E4M3 (OCP E4M3FN) storage.
struct fp8_e4m3_t {
  std::uint8_t bits;  ///< Raw bit pattern.
};

/// Largest finite E4M3 magnitude.
inline constexpr float kFp8E4M3Max = 448.0f;

/// Converts E4M3 to float (exact; `S.1111.111` gives a quiet NaN).
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE float fp8_e4m3_to_float(fp8_e4m3_t c) {
  const std::uint32_t sign = static_cast<std::uint32_t>(c.bits & 0x80u) << 24;
  const std::uint32_t e = (c.bits >> 3) & 0xfu;
  const std::uint32_t m = c.bits & 0x7u;
  if (e == 15u && m == 7u) return fp_from_bits(sign | 0x7fc00000u);
  if (e == 0u) {
    const float v = static_cast<float>(m) * 0.001953125f;  // m * 2^-9, exact
    return sign ? -v : v;
  }
  return fp_from_bits(sign | ((e + 120u) << 23) | (m << 20));
}

/// Converts a float to E4M3, rounding to nearest, ties to even. Magnitudes that round above
/// 448 (and infinities) saturate to +-448 (the "satfinite" convention of FP8 KV caches); NaN
/// becomes the NaN code with the input's sign.
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE fp8_e4m3_t float_to_fp8_e4m3(float f) {
  const std::uint32_t x = fp_bits(f);
  const std::uint32_t sign = (x >> 24) & 0x80u;
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return fp8_e4m3_t{static_cast<std::uint8_t>(sign | 0x7fu)};
  if (ax >= 0x43e00000u) return fp8_e4m3_t{static_cast<std::uint8_t>(sign | 0x7eu)};  // >= 448
  if (ax < 0x3c800000u) {  // below 2^-6: subnormal or zero
    if (ax <= 0x3a800000u) return fp8_e4m3_t{static_cast<std::uint8_t>(sign)};  // <= 2^-10
    const std::uint32_t e = ax >> 23;                      // 117..120 (2^-10 .. 2^-7)
    const std::uint32_t m = (ax & 0x7fffffu) | 0x800000u;  // value = m * 2^(e - 150)
    const std::uint32_t shift = 141u - e;                  // q = m * 2^(e - 141), 21..24
    std::uint32_t q = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;  // q == 8 is the smallest normal
    return fp8_e4m3_t{static_cast<std::uint8_t>(sign | q)};
  }
  // normal: keep 3 of the 23 mantissa bits, rounding to nearest even (a carry moves the
  // exponent up, which is the right answer); rebias 127 -> 7
  const std::uint32_t r = (ax + 0x7ffffu + ((ax >> 20) & 1u)) >> 20;
  std::uint32_t code = r - (120u << 3);
  if (code > 0x7eu) code = 0x7eu;  // 448 <= |x| < 464 rounded to 480: saturate
  return fp8_e4m3_t{static_cast<std::uint8_t>(sign | code)};
}

/// Converts a storage element to float.
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE float to_float(fp8_e4m3_t x) {
  return fp8_e4m3_to_float(x);
}

PHASEKV_NAMESPACE_END
