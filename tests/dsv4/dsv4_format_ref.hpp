// The FlashMLA FP8 cache layouts written again from their description (docs/deepseek_v4.md,
// FlashMLA's flash_mla_interface.py and tests/quant.py), never by calling phasekv's writers or
// readers: a quantizer, a dequantizer, and the pools the tests fill.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "phasekv/dsv4/fp8.hpp"

namespace dsv4t {

// Layout constants of a format (MODEL1: blocks of data then scales; V3.2: 656-byte tokens).
struct Layout {
  bool model1;
  int dim, nope, tile, tiles;
};
inline constexpr Layout kModel1{true, 512, 448, 64, 7};
inline constexpr Layout kV32{false, 576, 512, 128, 4};

// Nearest E4M3 code to v (|v| <= 448), ties to the even code, by search over the codes.
inline std::uint8_t e4m3_nearest(double v) {
  int best = 0;
  double bd = 1e300;
  for (int c = 0; c < 127; ++c) {  // 0x7f is NaN
    const double m = c < 8 ? c / 512.0 : (1.0 + (c & 7) / 8.0) * std::ldexp(1.0, (c >> 3) - 7);
    const double dd = std::abs(std::abs(v) - m);
    if (dd < bd || (dd == bd && (c & 1) == 0)) best = c, bd = dd;
  }
  return static_cast<std::uint8_t>(best | (std::signbit(v) ? 0x80 : 0));
}
inline double e4m3_value(std::uint8_t c) {
  const int m = c & 0x7f;
  const double a = m < 8 ? m / 512.0 : (1.0 + (m & 7) / 8.0) * std::ldexp(1.0, (m >> 3) - 7);
  return (c & 0x80) ? -a : a;
}
// Nearest bf16 bits to the float f (ties to even), from the two neighbours.
inline std::uint16_t bf16_nearest(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const std::uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
  float flo, fhi;
  std::memcpy(&flo, &lo, 4);
  std::memcpy(&fhi, &hi, 4);
  const double dl = std::abs(double(f) - flo), dh = std::abs(double(fhi) - f);
  if (dl < dh || (dl == dh && ((lo >> 16) & 1) == 0)) return static_cast<std::uint16_t>(lo >> 16);
  return static_cast<std::uint16_t>(hi >> 16);
}
inline float bf16_value(std::uint16_t b) {
  const std::uint32_t u = std::uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Exponent k of the tile scale 2^k: the smallest power of two >= max(amax / 448, 1e-4).
inline int scale_exponent(float amax) {
  float s = amax / 448.0f;
  if (s < 1e-4f) s = 1e-4f;
  int e;
  const double m = std::frexp(static_cast<double>(s), &e);  // s = m * 2^e, m in [0.5, 1)
  return m == 0.5 ? e - 1 : e;
}

// Byte offsets of token `slot` of a block of P tokens: its data and its scales.
inline std::size_t data_at(const Layout& f, std::int64_t P, std::int64_t slot,
                           std::int64_t stride) {
  (void)P;
  return static_cast<std::size_t>(f.model1 ? slot * 576 : slot * stride);
}
inline std::size_t scales_at(const Layout& f, std::int64_t P, std::int64_t slot,
                             std::int64_t stride) {
  return static_cast<std::size_t>(f.model1 ? P * 576 + slot * 8 : slot * stride + 512);
}
inline std::size_t rope_at(const Layout& f) { return f.model1 ? 448 : 528; }

// Writes x[0, dim) as token `slot` of the block at `block` (P tokens, V3.2 rows `stride` apart).
inline void quantize_token(const Layout& f, const float* x, std::uint8_t* block, std::int64_t P,
                           std::int64_t slot, std::int64_t stride) {
  std::uint8_t* d = block + data_at(f, P, slot, stride);
  std::uint8_t* s = block + scales_at(f, P, slot, stride);
  for (int t = 0; t < f.tiles; ++t) {
    float amax = 0.0f;
    for (int i = t * f.tile; i < (t + 1) * f.tile; ++i) amax = std::max(amax, std::abs(x[i]));
    const int k = scale_exponent(amax);
    const double sc = std::ldexp(1.0, k);
    if (f.model1) {
      s[t] = static_cast<std::uint8_t>(k + 127);
    } else {
      const float fs = static_cast<float>(sc);
      std::uint32_t u;
      std::memcpy(&u, &fs, 4);
      for (int b = 0; b < 4; ++b) s[4 * t + b] = static_cast<std::uint8_t>(u >> (8 * b));
    }
    for (int i = t * f.tile; i < (t + 1) * f.tile; ++i) d[i] = e4m3_nearest(x[i] / sc);
  }
  if (f.model1) s[7] = 0;
  for (int i = 0; i < f.dim - f.nope; ++i) {
    const std::uint16_t b = bf16_nearest(x[f.nope + i]);
    d[rope_at(f) + 2 * i] = static_cast<std::uint8_t>(b & 0xff);
    d[rope_at(f) + 2 * i + 1] = static_cast<std::uint8_t>(b >> 8);
  }
}

// The real values of token `slot` (exact in float).
inline std::vector<float> dequantize_token(const Layout& f, const std::uint8_t* block,
                                           std::int64_t P, std::int64_t slot, std::int64_t stride) {
  const std::uint8_t* d = block + data_at(f, P, slot, stride);
  const std::uint8_t* s = block + scales_at(f, P, slot, stride);
  std::vector<float> x(static_cast<std::size_t>(f.dim));
  for (int t = 0; t < f.tiles; ++t) {
    double sc;
    if (f.model1) {
      sc = std::ldexp(1.0, int(s[t]) - 127);
    } else {
      std::uint32_t u = 0;
      for (int b = 0; b < 4; ++b) u |= std::uint32_t{s[4 * t + b]} << (8 * b);
      float fs;
      std::memcpy(&fs, &u, 4);
      sc = fs;
    }
    for (int i = t * f.tile; i < (t + 1) * f.tile; ++i)
      x[static_cast<std::size_t>(i)] = static_cast<float>(e4m3_value(d[i]) * sc);
  }
  for (int i = 0; i < f.dim - f.nope; ++i)
    x[static_cast<std::size_t>(f.nope + i)] = bf16_value(
        static_cast<std::uint16_t>(d[rope_at(f) + 2 * i] | (d[rope_at(f) + 2 * i + 1] << 8)));
  return x;
}

}  // namespace dsv4t
