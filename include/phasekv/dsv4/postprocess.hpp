/// @file
/// @brief The DeepSeek-V4 model's per-row post-processing as host/device building blocks: the
/// (weighted) RMSNorm, RoPE on interleaved channel pairs with YaRN frequencies (and its inverse
/// for the attention output), FP8 fake-quantization in tiles of 64 with power-of-two scales,
/// the Hadamard rotation and FP4 (E2M1) fake-quantization in blocks of 32 of the indexer; plus
/// EntryPostprocess (the compressor hook that chains them as the model does for each compressed
/// entry, and for each raw latent row) and QueryPostprocess (the same for the query heads).
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
/// - Hadamard rotation of n = 2^m channels: `y = H_n x / sqrt(n)`, H_n the Sylvester
///   (natural-order Walsh) matrix, `H[i][j] = (-1)^popcount(i & j)`; orthonormal, its own inverse.
///   Computed by the fast transform in f32 (m butterfly stages, then the scale).
/// - FP4 fake-quantization of n channels in blocks of `block`: each block's scale is the
///   smallest power of two >= `max(amax, 6 * 2^-126) * (1/6)` (f32 product), each value becomes
///   `e2m1(x / scale) * scale`, e2m1 the nearest of 0, 0.5, 1, 1.5, 2, 3, 4, 6 with its sign
///   (ties to the even code: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4,
///   5 -> 4). The result is exactly representable in bf16.
///
/// Where the model applies them (DeepSeek-V4 inference `model.py`, docs/deepseek_v4_engines.md):
/// the latent rows and entries: weighted RMSNorm, RoPE of the last 64, FP8 of the other 448;
/// the indexer's keys (its compressor has `rotate`): weighted RMSNorm, RoPE, Hadamard over the
/// whole row, FP4 in blocks of 32; the attention queries: unweighted RMS norm per head, RoPE;
/// the indexer queries: RoPE, Hadamard, FP4; the attention output: inverse RoPE.
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

/// Rounds `x` to the nearest integer, ties to even (host and device, no rounding-mode state).
PHASEKV_HOST_DEVICE inline float round_half_even(float x) {
  const float f = std::floor(x), r = x - f;
  if (r > 0.5f) return f + 1.0f;
  if (r < 0.5f) return f;
  return std::fmod(f, 2.0f) == 0.0f ? f : f + 1.0f;
}

/// The nearest FP4 E2M1 value to `v` (0, 0.5, 1, 1.5, 2, 3, 4, 6 with the sign of `v`), ties
/// to the even code; magnitudes above 6 saturate to 6, NaN stays NaN.
PHASEKV_HOST_DEVICE inline float fp4_e2m1_round(float v) {
  const float a = std::fabs(v);
  if (!(a == a)) return v;
  float q = 6.0f;
  if (a < 6.0f) {
    const float step = a < 2.0f ? 0.5f : (a < 4.0f ? 1.0f : 2.0f);  // powers of two: exact
    q = round_half_even(a / step) * step;
  }
  return v < 0.0f ? -q : q;
}

/// The power-of-two scale of an FP4 block of largest magnitude `amax` (finite): the smallest
/// power of two >= `max(amax, 6 * 2^-126) * (1/6)` (an f32 product, as the model computes it).
PHASEKV_HOST_DEVICE inline float fp4_block_scale(float amax) {
  const float m = amax > 6.0f * 1.17549435e-38f ? amax : 6.0f * 1.17549435e-38f;
  const std::uint32_t b = fp_bits(m * (1.0f / 6.0f));
  const std::uint32_t e = (b >> 23) + ((b & 0x7fffffu) != 0u ? 1u : 0u);  // ceil(log2) + 127
  return fp_from_bits((e < 1u ? 1u : e) << 23);
}

namespace detail {

// Fake-quantization of `x[0, n)` in place in blocks of `block` channels (the last may be
// shorter): per block the scale `Grid::scale(amax)`, each value `Grid::round(x / s) * s`.
template <class Grid>
PHASEKV_HOST_DEVICE void block_fake_quantize(float* x, std::int64_t n, std::int64_t block) {
  for (std::int64_t b0 = 0; b0 < n; b0 += block) {
    const std::int64_t b1 = b0 + block < n ? b0 + block : n;
    float amax = 0.0f;
    for (std::int64_t i = b0; i < b1; ++i) amax = std::fabs(x[i]) > amax ? std::fabs(x[i]) : amax;
    const float s = Grid::scale(amax);
    for (std::int64_t i = b0; i < b1; ++i) x[i] = Grid::round(x[i] / s) * s;
  }
}

// FP8 E4M3 with FlashMLA's tile scales; FP4 E2M1 with the model's block scales.
struct Fp8Grid {
  PHASEKV_HOST_DEVICE static float scale(float amax) { return fp8_tile_scale(amax); }
  PHASEKV_HOST_DEVICE static float round(float v) {
    return fp8_e4m3_to_float(float_to_fp8_e4m3(v));
  }
};
struct Fp4Grid {
  PHASEKV_HOST_DEVICE static float scale(float amax) { return fp4_block_scale(amax); }
  PHASEKV_HOST_DEVICE static float round(float v) { return fp4_e2m1_round(v); }
};

}  // namespace detail

/// FP8 fake-quantization of `x[0, n)` in place, tiles of `tile` channels (the last tile may be
/// shorter): power-of-two scale per tile (phasekv::fp8_tile_scale), `e4m3(x / s) * s`.
PHASEKV_HOST_DEVICE inline void fp8_fake_quantize(float* x, std::int64_t n,
                                                  std::int64_t tile = 64) {
  detail::block_fake_quantize<detail::Fp8Grid>(x, n, tile);
}

/// FP4 E2M1 fake-quantization of `x[0, n)` in place, blocks of `block` channels (the last may
/// be shorter): power-of-two scale per block (fp4_block_scale), `e2m1(x / s) * s`.
PHASEKV_HOST_DEVICE inline void fp4_fake_quantize(float* x, std::int64_t n,
                                                  std::int64_t block = 32) {
  detail::block_fake_quantize<detail::Fp4Grid>(x, n, block);
}

/// Whether `n` >= 1 is a power of two (the sizes hadamard_rotate() takes).
PHASEKV_HOST_DEVICE constexpr bool is_power_of_two(std::int64_t n) {
  return n >= 1 && (n & (n - 1)) == 0;
}

/// Hadamard rotation of `x[0, n)` in place, n a power of two (not checked here: see
/// is_power_of_two): `x <- H_n x / sqrt(n)` by the fast Walsh-Hadamard transform in f32.
PHASEKV_HOST_DEVICE inline void hadamard_rotate(float* x, std::int64_t n) {
  for (std::int64_t h = 1; h < n; h *= 2)
    for (std::int64_t i = 0; i < n; i += 2 * h)
      for (std::int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  const float s = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  for (std::int64_t i = 0; i < n; ++i) x[i] *= s;
}

namespace detail {

// The model's row post-processing in its order: RMSNorm (`norm`; `weight` null: unweighted),
// RoPE of the last rope.dim channels at `position`, then either the Hadamard rotation of the
// whole row and FP4 in blocks of 32 (`rotate`) or FP8 of the channels before the RoPE ones in
// tiles of 64 (`fp8`).
PHASEKV_HOST_DEVICE inline void postprocess_row(float* x, std::int64_t dim, bool norm,
                                                const float* weight, float eps,
                                                const RopeParams& rope, std::int64_t position,
                                                bool rotate, bool fp8) {
  if (norm) rms_norm(x, dim, weight, eps);
  rope_apply(rope, position, x + dim - rope.dim);
  if (rotate) {
    hadamard_rotate(x, dim);
    fp4_fake_quantize(x, dim, 32);
  } else if (fp8) {
    fp8_fake_quantize(x, dim - rope.dim, 64);
  }
}

// Checks what every post-processing struct shares; throws phasekv::invalid_argument.
inline void check_postprocess(std::int64_t dim, const RopeParams& rope, float eps, bool rotate,
                              const char* where) {
  rope.check(where);
  phasekv::detail::check_arg(dim >= rope.dim && dim <= (std::int64_t{1} << 20), where, "dim", dim,
                             "must be in [rope.dim, 2^20]");
  phasekv::detail::check_arg(eps >= 0.0f, where, "eps", eps, "must be >= 0");
  if (rotate)
    phasekv::detail::check_arg(is_power_of_two(dim), where, "dim", dim,
                               "must be a power of two with rotate (the Hadamard rotation)");
}

}  // namespace detail

/// The model's post-processing of each compressed entry, as a compressor hook (compress,
/// CompressorState::append, compress_append_paged): weighted RMSNorm of the `dim` channels,
/// RoPE of the last `rope.dim` at the entry's position `j * ratio` (EntryInfo::position), then
/// FP8 fake-quantization of the others in tiles of 64 (`fake_quant`, the main latent), or, with
/// `rotate` (the indexer's keys: the model's `Compressor(rotate=True)`), the Hadamard rotation
/// of the whole entry and FP4 fake-quantization in blocks of 32.
///
/// apply() runs the same steps on one row at any position: the model's raw latent row of token
/// t (`kv_norm`, RoPE at t, FP8 of the NoPE channels) is `apply(t, row)` with the attention's
/// `kv_norm` weight.
struct EntryPostprocess {
  std::int64_t dim = 512;         ///< Entry width (a power of two with `rotate`).
  const float* weight = nullptr;  ///< The compressor's norm weight `[dim]` (null: 1).
  float eps = 1e-6f;              ///< The norm's epsilon.
  RopeParams rope;                ///< RoPE of the last rope.dim channels.
  bool fake_quant = true;         ///< FP8 fake-quantize the channels before the RoPE ones.
  bool rotate = false;            ///< Instead: Hadamard of the whole row, then FP4 (indexer keys).

  /// Checks the fields (rope.dim <= dim, eps >= 0, dim a power of two with `rotate`); throws
  /// phasekv::invalid_argument naming the field and its value.
  void check(const char* where) const { detail::check_postprocess(dim, rope, eps, rotate, where); }
  /// The steps on row `x` (`dim` floats) at `position`, in place.
  PHASEKV_HOST_DEVICE void apply(std::int64_t position, float* x) const {
    detail::postprocess_row(x, dim, true, weight, eps, rope, position, rotate, fake_quant);
  }
  /// The hook: apply() at the entry's position.
  PHASEKV_HOST_DEVICE void operator()(const EntryInfo& e, float* x) const { apply(e.position, x); }
};

/// The model's post-processing of the query heads: the attention's queries get an unweighted
/// RMS norm over each head's `dim` channels, then RoPE of the last `rope.dim` at the token's
/// position (`norm = true`, `rotate = false`); the indexer's queries get RoPE, then the
/// Hadamard rotation of the head and FP4 in blocks of 32 (`norm = false`, `rotate = true`).
/// The RoPE parameters are the layer's (for a compressed layer V4 uses compress_rope_theta with
/// YaRN for the queries, the window rows and the entries alike).
struct QueryPostprocess {
  std::int64_t dim = 512;  ///< Head width (a power of two with `rotate`).
  bool norm = true;        ///< Unweighted RMS norm of each head first.
  float eps = 1e-6f;       ///< The norm's epsilon.
  RopeParams rope;         ///< RoPE of the last rope.dim channels of each head.
  bool rotate = false;     ///< Then Hadamard rotation and FP4 (the indexer's queries).

  /// Checks the fields; throws phasekv::invalid_argument naming the field and its value.
  void check(const char* where) const { detail::check_postprocess(dim, rope, eps, rotate, where); }
  /// One head `q` (`dim` floats) of the token at `position`, in place.
  PHASEKV_HOST_DEVICE void operator()(std::int64_t position, float* q) const {
    detail::postprocess_row(q, dim, norm, nullptr, eps, rope, position, rotate, false);
  }
  /// Every head of `tokens` consecutive tokens, `q` `[tokens, heads, dim]`, token i at
  /// position `first_position + i`. Checks the fields and arguments first (throws
  /// phasekv::invalid_argument naming them; nothing is written then).
  void apply(float* q, std::int64_t tokens, std::int64_t heads, std::int64_t first_position) const {
    const char* where = "phasekv::dsv4::QueryPostprocess::apply";
    using phasekv::detail::check_arg;
    check(where);
    check_arg(tokens >= 0, where, "tokens", tokens, "must be >= 0");
    check_arg(heads >= 1 && heads <= 65536, where, "heads", heads, "must be in [1, 65536]");
    check_arg(first_position >= 0, where, "first_position", first_position, "must be >= 0");
    if (tokens == 0) return;
    check_arg(q != nullptr, where, "q", "null", "must point to [tokens, heads, dim]");
    for (std::int64_t t = 0; t < tokens; ++t)
      for (std::int64_t h = 0; h < heads; ++h)
        (*this)(first_position + t, q + (t * heads + h) * dim);
  }
};

}  // namespace dsv4
PHASEKV_NAMESPACE_END
