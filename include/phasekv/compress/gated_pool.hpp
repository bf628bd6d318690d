/// @file
/// @brief GatedPool: the general learned compressor of the phase sensitivity paper and
/// DeepSeek-V4. Per in-window offset i and KV head, gate logits `s_i = Z_i x_i + b_i`, softmax
/// over the window, optional payload maps `C_i`, entry `e = sum_i alpha_i (.) C_i x_i`.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "phasekv/compress/cpu/row_kernels.hpp"
#include "phasekv/compress/float_ops.hpp"
#include "phasekv/compress/policy.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/phase/geometry.hpp"

PHASEKV_NAMESPACE_BEGIN

/// A non-owning view of a dense, row-major float parameter tensor (rank 0 to 4) in caller
/// memory, host or device. Only its shape is inspected on the host; the data is never read
/// there. A default-constructed view (null, rank 0) means "absent".
struct ParamView {
  static constexpr int kMaxRank = 4;            ///< Largest supported rank.
  const float* data = nullptr;                  ///< First element (row-major, dense).
  int rank = 0;                                 ///< Number of dimensions in use.
  std::int64_t shape[kMaxRank] = {0, 0, 0, 0};  ///< Extents; only the first `rank` are used.

  /// Number of elements (product of the extents; 0 for an absent view).
  std::int64_t size() const {
    if (rank == 0) return 0;
    std::int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= shape[i];
    return n;
  }
  /// True when the view is absent (null data and rank 0).
  bool absent() const { return data == nullptr && rank == 0; }
};

/// Describes a dense row-major parameter tensor at `data` with the given extents, e.g.
/// `param_view(z, {kv_heads, W, 1, d_in})`. Throws phasekv::shape_error for more than
/// ParamView::kMaxRank extents.
inline ParamView param_view(const float* data, std::initializer_list<std::int64_t> shape) {
  detail::check_arg<shape_error>(shape.size() <= ParamView::kMaxRank, "phasekv::param_view",
                                 "shape.size()", shape.size(), "must be <= 4");
  ParamView v;
  v.data = data;
  v.rank = static_cast<int>(shape.size());
  int i = 0;
  for (std::int64_t e : shape) v.shape[i++] = e;
  return v;
}

/// How many gate logits each offset has.
enum class GateKind : std::uint8_t {
  scalar,  ///< one logit per offset (Z_i is 1 x d_in, b_i is a scalar): alpha_i is a scalar.
  vector,  ///< one logit per output channel (Z_i is d_out x d_in, b_i has d_out entries).
};

/// The gated pooling compressor.
///
/// For window tokens `x_0 .. x_{W-1}` of KV head h (each d_in floats), with G = 1 (scalar
/// gates) or G = d_out (vector gates):
/// - gate logits `s_i[g] = (sum_k Z_i[g][k] x_i[k]) + b_i[g]` for g < G;
/// - weights `alpha_i[g] = softmax over i of s_i[g]`;
/// - payload `y_i = C_i x_i` (d_out channels) or `y_i = x_i` without payload maps;
/// - entry `e[c] = sum_i alpha_i[g(c)] * y_i[c]` with g(c) = 0 (scalar) or c (vector).
///
/// Parameters (dense row-major float arrays in caller memory, host or device; not owned):
/// - `gate_weight` Z: `[kv_heads, W, G, d_in]`, or absent (all-zero Z: gates from b only);
/// - `gate_bias` b: `[kv_heads, W, G]`, or absent (zero);
/// - `payload` C: `[kv_heads, W, d_out, d_in]`, or absent (identity; requires d_out = d_in).
///
/// A logit of -inf switches an offset off (hard one-hot gates are expressible through b). If
/// every offset of a channel is switched off the entry channel is 0; a NaN logit gives NaN.
///
/// The arithmetic is a single-pass online softmax in float with a fixed order (offsets
/// ascending, channels ascending, dot products as phasekv::fp_dot), so
/// the result is bit-identical on every platform, and scalar gates give the same bits as
/// vector gates whose rows are all equal.
///
/// Gate cycling (the paper's causal intervention) is built in: cycled(delta) (or the free
/// function cycle_gates) moves the gate parameters (Z_i, b_i) of every offset i to offset
/// (i + delta) mod W and leaves the payload maps where they are.
class GatedPool {
 public:
  /// Default: an unusable placeholder (W = S = 1, one channel, no parameters = identity).
  constexpr GatedPool() = default;

  /// Builds the policy over caller-owned parameters, checking every shape on the host.
  ///
  /// @param geometry    chunk geometry; W fixes the second extent of every parameter.
  /// @param kv_heads    KV heads the parameters cover (first extent), >= 1.
  /// @param d_in        channels of a raw token vector, >= 1.
  /// @param d_out       channels of an entry, >= 1 (must equal d_in without payload maps).
  /// @param gates       scalar or vector gates (G = 1 or d_out).
  /// @param gate_weight Z, `[kv_heads, W, G, d_in]` or absent.
  /// @param gate_bias   b, `[kv_heads, W, G]` or absent.
  /// @param payload     C, `[kv_heads, W, d_out, d_in]` or absent.
  ///
  /// Throws phasekv::shape_error naming the argument and extent (e.g.
  /// `gate_weight.shape[1] = 7 is invalid (must equal W = 8)`), or when a view has null data
  /// but a non-zero size.
  GatedPool(const Geometry& geometry, std::int64_t kv_heads, std::int64_t d_in, std::int64_t d_out,
            GateKind gates, const ParamView& gate_weight, const ParamView& gate_bias,
            const ParamView& payload = ParamView{})
      : geometry_(geometry),
        kv_heads_(kv_heads),
        d_in_(d_in),
        d_out_(d_out),
        gate_dim_(gates == GateKind::scalar ? 1 : d_out),
        gates_(gates),
        gate_weight_(gate_weight.data),
        gate_bias_(gate_bias.data),
        payload_(payload.data) {
    const char* where = "phasekv::GatedPool";
    detail::check_arg<shape_error>(kv_heads >= 1, where, "kv_heads", kv_heads, "must be >= 1");
    detail::check_arg<shape_error>(d_in >= 1, where, "d_in", d_in, "must be >= 1");
    detail::check_arg<shape_error>(d_out >= 1, where, "d_out", d_out, "must be >= 1");
    const std::int64_t w = geometry.window();
    check_param(gate_weight, "gate_weight", {kv_heads, w, gate_dim_, d_in},
                {"kv_heads", "W",
                 gates == GateKind::scalar ? "1 (scalar gates)" : "d_out (vector gates)", "d_in"});
    check_param(gate_bias, "gate_bias", {kv_heads, w, gate_dim_},
                {"kv_heads", "W",
                 gates == GateKind::scalar ? "1 (scalar gates)" : "d_out (vector gates)", ""});
    check_param(payload, "payload", {kv_heads, w, d_out, d_in}, {"kv_heads", "W", "d_out", "d_in"});
    if (payload.absent())
      detail::check_arg<shape_error>(d_out == d_in, where, "d_out", d_out,
                                     "must equal d_in when no payload maps are given");
  }

  /// The chunk geometry.
  PHASEKV_HOST_DEVICE constexpr Geometry geometry() const { return geometry_; }
  /// d_in.
  PHASEKV_HOST_DEVICE constexpr std::int64_t input_dim() const { return d_in_; }
  /// d_out.
  PHASEKV_HOST_DEVICE constexpr std::int64_t output_dim() const { return d_out_; }
  /// KV heads the parameters cover.
  PHASEKV_HOST_DEVICE constexpr std::int64_t kv_heads() const { return kv_heads_; }
  /// Scalar or vector gates.
  PHASEKV_HOST_DEVICE constexpr GateKind gate_kind() const { return gates_; }
  /// Current gate shift in `[0, W)`: the gate parameters used at offset i are the stored ones
  /// of offset `(i - gate_shift()) mod W`.
  PHASEKV_HOST_DEVICE constexpr std::int64_t gate_shift() const { return gate_shift_; }
  /// Z (may be null).
  PHASEKV_HOST_DEVICE constexpr const float* gate_weight() const { return gate_weight_; }
  /// b (may be null).
  PHASEKV_HOST_DEVICE constexpr const float* gate_bias() const { return gate_bias_; }
  /// C (may be null).
  PHASEKV_HOST_DEVICE constexpr const float* payload() const { return payload_; }

  /// The same policy with the gate parameters (Z_i, b_i) moved by `delta` offsets
  /// circularly (the gates stored for offset i act at offset (i + delta) mod W); payload maps
  /// stay in place. Any integer delta; delta = W (or any multiple) is the identity.
  PHASEKV_HOST_DEVICE constexpr GatedPool cycled(std::int64_t delta) const {
    GatedPool p = *this;
    const std::int64_t w = geometry_.window();
    std::int64_t s = (gate_shift_ + delta % w) % w;
    if (s < 0) s += w;
    p.gate_shift_ = s;
    return p;
  }

  /// Compresses one window of KV head `kv_head` into `out[0, d_out)`.
  template <class Load>
  PHASEKV_HOST_DEVICE void compress(std::int64_t kv_head, const Load& x, float* out) const {
    const std::int64_t w = geometry_.window();
    const float neg_inf = -fp_from_bits(0x7f800000u);
    if (gate_dim_ == 1) {
      // Scalar gates: one online softmax state, the entry accumulates in `out`.
      float m = neg_inf, l = 0.0f;
      for (std::int64_t c = 0; c < d_out_; ++c) out[c] = 0.0f;
      for (std::int64_t i = 0; i < w; ++i) {
        const float s = logit(kv_head, i, 0, x);
        if (s == neg_inf) continue;
        if (s > m) {  // new maximum: rescale by exp(m - s); this offset's weight is 1
          const float r = fp_exp(fp_sub(m, s));
          l = fp_fma(l, r, 1.0f);
          for (std::int64_t c = 0; c < d_out_; ++c)
            out[c] = fp_fma(out[c], r, value(kv_head, i, c, x));
          m = s;
        } else {
          const float p = fp_exp(fp_sub(s, m));
          l = fp_add(l, p);
          for (std::int64_t c = 0; c < d_out_; ++c)
            out[c] = fp_fma(p, value(kv_head, i, c, x), out[c]);
        }
      }
      for (std::int64_t c = 0; c < d_out_; ++c)
        out[c] = l > 0.0f || l != l ? fp_div(out[c], l) : 0.0f;
      return;
    }
    // Vector gates: an online softmax state per output channel, kept in registers.
    for (std::int64_t c = 0; c < d_out_; ++c) {
      float m = neg_inf, l = 0.0f, acc = 0.0f;
      for (std::int64_t i = 0; i < w; ++i) {
        const float s = logit(kv_head, i, c, x);
        if (s == neg_inf) continue;
        if (s > m) {
          const float r = fp_exp(fp_sub(m, s));
          l = fp_fma(l, r, 1.0f);
          acc = fp_fma(acc, r, value(kv_head, i, c, x));
          m = s;
        } else {
          const float p = fp_exp(fp_sub(s, m));
          l = fp_add(l, p);
          acc = fp_fma(p, value(kv_head, i, c, x), acc);
        }
      }
      out[c] = l > 0.0f || l != l ? fp_div(acc, l) : 0.0f;
    }
  }

  /// The window fast path, row_kernels<GatedPool>::window (compress/cpu/gated_pool_rows.hpp):
  /// the same bits as compress() for a window whose token at offset i starts at
  /// `rows + i * token_stride`, for scalar gates without payload maps; returns false, writing
  /// nothing, otherwise (callers then use compress()).
  template <class T>
  bool compress_rows(std::int64_t kv_head, const T* rows, std::int64_t token_stride,
                     float* out) const {
    return row_kernels<detail::dependent_policy_t<GatedPool, T>>::window(*this, kv_head, rows,
                                                                         token_stride, out);
  }

  /// The two-window fast path, row_kernels<GatedPool>::window_pair: the windows of heads
  /// `kv_head` and `kv_head2` at `rows` and `rows2` into `out` and `out2`, each with the bits
  /// compress() gives it, or false and nothing written where it does not apply.
  template <class T>
  bool compress_rows2(std::int64_t kv_head, const T* rows, float* out, std::int64_t kv_head2,
                      const T* rows2, float* out2, std::int64_t token_stride) const {
    return row_kernels<detail::dependent_policy_t<GatedPool, T>>::window_pair(
        *this, kv_head, rows, out, kv_head2, rows2, out2, token_stride);
  }

  /// The run fast path, row_kernels<GatedPool>::run: `count` consecutive windows of one head,
  /// entries written by the kernel, or false and nothing written where it does not apply.
  template <class T>
  bool compress_rows_run(std::int64_t kv_head, const T* rows, std::int64_t token_stride,
                         std::int64_t count, T* entries, std::int64_t entry_stride, bool stream,
                         std::int64_t prefetch_tokens) const {
    return row_kernels<detail::dependent_policy_t<GatedPool, T>>::run(
        *this, kv_head, rows, token_stride, count, entries, entry_stride, stream, prefetch_tokens);
  }

 private:
  // Gate logit g (0 for scalar gates) at in-window offset i.
  template <class Load>
  PHASEKV_HOST_DEVICE float logit(std::int64_t h, std::int64_t i, std::int64_t g,
                                  const Load& x) const {
    std::int64_t src = i - gate_shift_;
    if (src < 0) src += geometry_.window();
    const std::int64_t row = (h * geometry_.window() + src) * gate_dim_ + g;
    const float bias = gate_bias_ != nullptr ? gate_bias_[row] : 0.0f;
    if (gate_weight_ == nullptr) return bias;
    return fp_add(fp_dot(gate_weight_ + row * d_in_, x, i, d_in_), bias);
  }

  // Payload channel c of the token at offset i: (C_i x_i)[c], or x_i[c] without maps.
  template <class Load>
  PHASEKV_HOST_DEVICE float value(std::int64_t h, std::int64_t i, std::int64_t c,
                                  const Load& x) const {
    if (payload_ == nullptr) return x(i, c);
    const float* row = payload_ + ((h * geometry_.window() + i) * d_out_ + c) * d_in_;
    return fp_dot(row, x, i, d_in_);
  }

  static void check_param(const ParamView& v, const char* name,
                          std::initializer_list<std::int64_t> want,
                          std::initializer_list<const char*> what) {
    const char* where = "phasekv::GatedPool";
    if (v.absent()) return;
    const std::string n(name);
    detail::check_arg<shape_error>(v.rank == static_cast<int>(want.size()), where,
                                   (n + ".rank").c_str(), v.rank,
                                   want.size() == 4 ? "must be 4" : "must be 3");
    int d = 0;
    auto wi = what.begin();
    for (std::int64_t e : want) {
      if (v.shape[d] != e) {
        const std::string req = std::string("must equal ") + *wi + " = " + std::to_string(e);
        detail::throw_arg<shape_error>(where, (n + ".shape[" + std::to_string(d) + "]").c_str(),
                                       v.shape[d], req.c_str());
      }
      ++d;
      ++wi;
    }
    detail::check_arg<shape_error>(v.data != nullptr || v.size() == 0, where, (n + ".data").c_str(),
                                   "null", "data is null but the shape is not empty");
  }

  Geometry geometry_{};
  std::int64_t kv_heads_ = 1;
  std::int64_t d_in_ = 1;
  std::int64_t d_out_ = 1;
  std::int64_t gate_dim_ = 1;
  GateKind gates_ = GateKind::scalar;
  std::int64_t gate_shift_ = 0;
  const float* gate_weight_ = nullptr;
  const float* gate_bias_ = nullptr;
  const float* payload_ = nullptr;
};

/// Gate cycling, the phase sensitivity paper's causal intervention: returns `policy` with its
/// gate parameters (Z_i, b_i) circularly shifted by `delta` offsets (those that acted at offset
/// i act at offset `(i + delta) mod W`) while the payload maps C_i stay in place; if a head's
/// retrieval weakness follows its gate, cycling the gate moves the weak phase by delta. Shifts
/// compose (cycling by a then b equals cycling by a + b), negative delta shifts the other way,
/// and any multiple of W (delta = W in particular) is the identity. No parameter memory is
/// touched (only gate_shift() changes), so this is free and works for device-resident
/// parameters. The same as `policy.cycled(delta)`.
PHASEKV_HOST_DEVICE constexpr GatedPool cycle_gates(const GatedPool& policy, std::int64_t delta) {
  return policy.cycled(delta);
}

PHASEKV_NAMESPACE_END

// The CPU fast paths (row_kernels<GatedPool>), always available with the policy.
#include "phasekv/compress/cpu/gated_pool_rows.hpp"
