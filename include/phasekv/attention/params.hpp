/// @file
/// @brief Attention parameters and variants: small hook structs (logit transform, sink) in the
/// style of FlashInfer's variants. Kernels are templates on the variant type.
#pragma once

#include <cmath>
#include <cstdint>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/view.hpp"

PHASEKV_NAMESPACE_BEGIN

/// The standard variant: scaled dot-product logits with an optional soft cap, an optional
/// additive bias on compressed entries and optional per-head sink logits.
///
/// For a key k of kind `kind` the logit is
/// `s = scale * <q, k>`, then `s = softcap * tanh(s / softcap)` when `softcap > 0`, then
/// `s += entry_bias` when the key is a compressed entry. A sink adds `exp(sinks[h])` to the
/// softmax denominator of query head h (it attends to nothing and contributes no value).
///
/// A user variant provides the same members: `logit(s, kind)` applied to the raw dot product,
/// `has_sink()` and `sink(h)`.
struct StandardVariant {
  float scale = 1.0f;            ///< Multiplies `<q, k>`; usually `1/sqrt(d_k)`.
  float softcap = 0.0f;          ///< Soft cap of the logits; 0 disables it.
  float entry_bias = 0.0f;       ///< Added to the logits of compressed entries (e.g. ln W);
                                 ///< -inf excludes every entry (raw tokens still attended).
  const float* sinks = nullptr;  ///< Per query head sink logits (host or device memory as the
                                 ///< kernel requires), or null for none.

  /// Logit of a key of kind `kind` whose dot product with the query is `dot`.
  PHASEKV_HOST_DEVICE float logit(float dot, SegmentKind kind) const {
    float s = scale * dot;
    if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
    if (kind == SegmentKind::compressed) s += entry_bias;
    return s;
  }
  /// True when a per-head sink logit is present.
  PHASEKV_HOST_DEVICE bool has_sink() const { return sinks != nullptr; }
  /// Sink logit of query head `h`.
  PHASEKV_HOST_DEVICE float sink(std::int64_t h) const { return sinks[h]; }

  /// Host check; throws phasekv::invalid_argument naming the bad field.
  void check(const char* where) const {
    phasekv::detail::check_arg(std::isfinite(scale), where, "variant.scale", scale,
                               "must be finite");
    phasekv::detail::check_arg(std::isfinite(softcap) && softcap >= 0.0f, where, "variant.softcap",
                               softcap, "must be finite and >= 0 (0 disables)");
    phasekv::detail::check_arg(std::isfinite(entry_bias) || entry_bias == -HUGE_VALF, where,
                               "variant.entry_bias", entry_bias,
                               "must be finite, or -inf to exclude every compressed entry");
  }
};

/// The default scale `1/sqrt(d_k)`.
inline float default_scale(std::int64_t d_k) { return 1.0f / std::sqrt(static_cast<float>(d_k)); }

PHASEKV_NAMESPACE_END
