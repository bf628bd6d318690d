/// @file
/// @brief The DeepSeek-V4 model's per-row post-processing as host/device building blocks: the
/// (weighted) RMSNorm, RoPE on interleaved channel pairs with YaRN frequencies (and its inverse
/// for the attention output), and FP8 fake-quantization in tiles of 64 with power-of-two scales;
/// plus EntryPostprocess, the compressor hook that chains them as the model does for each
/// compressed entry.
///
/// Formulas (the model's inference code, written again here):
///
/// - RMSNorm of n channels: `y_i = x_i / sqrt(mean(x^2) + eps) * w_i` (w = 1 unweighted).
/// - RoPE on `dim` channels (V4: the last 64 of a row) at position t: pair i, channels
///   `(2i, 2i + 1)`, is rotated by the angle `t * f_i` (the inverse by `-t * f_i`), with
///   `f_i = base^(-2i / dim)`; with YaRN (`original_seq_len` > 0)
///   `f_i = f_i / factor * (1 - s_i) + f_i * s_i`,
///   `s_i = 1 - clamp((i - low) / (high - low), 0, 1)`, `low = max(floor(c(beta_fast)), 0)`,
///   `high = min(ceil(c(beta_slow)), dim - 1)`,
///   `c(r) = dim * ln(original_seq_len / (2 pi r)) / (2 ln(base))`. The model keeps `f_i` and
///   the angle `t * f_i` in f32; so do these functions (cosine and sine then in double).
/// - FP8 fake-quantization of n channels in tiles of `tile`: each tile's scale is the smallest
///   power of two >= `max(amax / 448, 1e-4)`, each value becomes `e4m3(x / scale) * scale`
///   (nearest even). Stored in a MODEL1 cache such a row keeps its values exactly.
#pragma once

#include <cmath>
#include <cstdint>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/dsv4/cache_format.hpp"
#include "phasekv/dsv4/compressor.hpp"
#include "phasekv/dsv4/fp8.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace dsv4 {

/// RoPE frequencies of the model: plain, or YaRN when `original_seq_len` > 0.
struct RopeParams {
  std::int64_t dim = 64;              ///< Rotated channels (even): V4's rope_head_dim.
  float base = 10000.0f;              ///< rope_theta (compress_rope_theta for entries).
  std::int64_t original_seq_len = 0;  ///< YaRN's original context (0: no YaRN).
  float factor = 1.0f;                ///< YaRN's rope_factor.
  float beta_fast = 32.0f;            ///< YaRN's beta_fast.
  float beta_slow = 1.0f;             ///< YaRN's beta_slow.

  /// Host check; throws phasekv::invalid_argument naming `where` and the bad field.
  void check(const char* where) const {
    using phasekv::detail::check_arg;
    check_arg(dim >= 2 && dim % 2 == 0 && dim <= 65536, where, "rope.dim", dim,
              "must be even and in [2, 65536]");
    check_arg(std::isfinite(base) && base > 1.0f, where, "rope.base", base, "must be > 1");
    check_arg(original_seq_len >= 0, where, "rope.original_seq_len", original_seq_len,
              "must be >= 0");
    if (original_seq_len > 0) {
      check_arg(std::isfinite(factor) && factor > 0.0f, where, "rope.factor", factor,
                "must be finite and > 0");
      check_arg(std::isfinite(beta_fast) && beta_fast > 0.0f, where, "rope.beta_fast", beta_fast,
                "must be finite and > 0");
      check_arg(std::isfinite(beta_slow) && beta_slow > 0.0f, where, "rope.beta_slow", beta_slow,
                "must be finite and > 0");
    }
  }
};

/// Frequency `f_i` of pair i (f32, as the model's table holds it).
PHASEKV_HOST_DEVICE inline float rope_frequency(const RopeParams& p, std::int64_t i) {
  const float e = static_cast<float>(2 * i) / static_cast<float>(p.dim);
  float f = static_cast<float>(1.0 / std::pow(static_cast<double>(p.base), static_cast<double>(e)));
  if (p.original_seq_len <= 0) return f;
  const double two_pi = 6.283185307179586, lb = 2.0 * std::log(static_cast<double>(p.base));
  const auto corr = [&](double r) {
    return static_cast<double>(p.dim) *
           std::log(static_cast<double>(p.original_seq_len) / (r * two_pi)) / lb;
  };
  double low = std::floor(corr(p.beta_fast)), high = std::ceil(corr(p.beta_slow));
  low = low < 0.0 ? 0.0 : low;
  high = high > static_cast<double>(p.dim - 1) ? static_cast<double>(p.dim - 1) : high;
  const float lo = static_cast<float>(low);
  float hi = static_cast<float>(high);
  if (lo == hi) hi += 0.001f;
  float ramp = (static_cast<float>(i) - lo) / (hi - lo);
  ramp = ramp < 0.0f ? 0.0f : (ramp > 1.0f ? 1.0f : ramp);
  const float smooth = 1.0f - ramp;
  return f / p.factor * (1.0f - smooth) + f * smooth;
}

/// Rotates the `p.dim` channels of `x` (interleaved pairs) to position `position`, or back
/// from it when `inverse` (the model's RoPE of q and kv, and its inverse on the output).
PHASEKV_HOST_DEVICE inline void rope_apply(const RopeParams& p, std::int64_t position, float* x,
                                           bool inverse = false) {
  const float t = static_cast<float>(position);
  for (std::int64_t i = 0; i < p.dim / 2; ++i) {
    const double ang = static_cast<double>(t * rope_frequency(p, i));  // f32 product
    const float c = static_cast<float>(std::cos(ang));
    const float s = static_cast<float>(inverse ? -std::sin(ang) : std::sin(ang));
    const float a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = a * c - b * s;
    x[2 * i + 1] = a * s + b * c;
  }
}

/// RMSNorm of `x[0, n)` in place: `x_i / sqrt(mean(x^2) + eps) * weight_i` (`weight` null: 1).
PHASEKV_HOST_DEVICE inline void rms_norm(float* x, std::int64_t n, const float* weight, float eps) {
  double ss = 0.0;
  for (std::int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (std::int64_t i = 0; i < n; ++i) x[i] = weight ? x[i] * inv * weight[i] : x[i] * inv;
}

/// FP8 fake-quantization of `x[0, n)` in place, tiles of `tile` channels (the last tile may be
/// shorter): power-of-two scale per tile (phasekv::fp8_tile_scale), `e4m3(x / s) * s`.
PHASEKV_HOST_DEVICE inline void fp8_fake_quantize(float* x, std::int64_t n,
                                                  std::int64_t tile = 64) {
  for (std::int64_t t0 = 0; t0 < n; t0 += tile) {
    const std::int64_t t1 = t0 + tile < n ? t0 + tile : n;
    float amax = 0.0f;
    for (std::int64_t i = t0; i < t1; ++i) amax = std::fabs(x[i]) > amax ? std::fabs(x[i]) : amax;
    const float s = fp8_tile_scale(amax);
    for (std::int64_t i = t0; i < t1; ++i)
      x[i] = fp8_e4m3_to_float(float_to_fp8_e4m3(x[i] / s)) * s;
  }
}

/// The model's post-processing of each compressed entry, as a compressor hook (compress,
/// CompressorState::append, compress_append_paged): weighted RMSNorm of the `dim` channels,
/// RoPE of the last `rope.dim` at the entry's position `j * ratio` (EntryInfo::position), and
/// FP8 fake-quantization of the others in tiles of 64 (`fake_quant`; the main latent, not the
/// indexer's keys, which the model rotates and quantizes to FP4 instead).
struct EntryPostprocess {
  std::int64_t dim = 512;         ///< Entry width.
  const float* weight = nullptr;  ///< The compressor's norm weight `[dim]` (null: 1).
  float eps = 1e-6f;              ///< The norm's epsilon.
  RopeParams rope;                ///< RoPE of the last rope.dim channels.
  bool fake_quant = true;         ///< FP8 fake-quantize the channels before the RoPE ones.

  /// Checks the fields (rope.dim <= dim, eps >= 0); throws phasekv::invalid_argument.
  void check(const char* where) const {
    rope.check(where);
    phasekv::detail::check_arg(dim >= rope.dim && dim <= (std::int64_t{1} << 20), where, "dim", dim,
                               "must be in [rope.dim, 2^20]");
    phasekv::detail::check_arg(eps >= 0.0f, where, "eps", eps, "must be >= 0");
  }
  /// The hook: norm, RoPE, fake quantization of entry `x` in place.
  void operator()(const EntryInfo& e, float* x) const {
    rms_norm(x, dim, weight, eps);
    rope_apply(rope, e.position, x + dim - rope.dim);
    if (fake_quant) fp8_fake_quantize(x, dim - rope.dim, 64);
  }
};

}  // namespace dsv4
PHASEKV_NAMESPACE_END
