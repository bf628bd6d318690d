/// @file
/// @brief The loss of the paper's idealized induction model (task R2): its settings
/// (InductionConfig), the gate logits, and the exact orthonormal-limit losses with analytic
/// gradients (limit_loss for tiling, design_limit_loss for every design). The trainer that
/// follows their gradients is InductionModel (phasekv/eval/induction_model.hpp).
///
/// Model: windows of W = S tokens tile a context of T = J W distinct tokens with random unit
/// embeddings E(x) in R^d. Each of m heads has key gate logits `a_h` and value gate logits
/// `c_h` over the W offsets; `alpha_h = softmax(a_h)`, `beta_h = softmax(c_h)`. Entry j of head h
/// has key `K_hj = sum_i alpha_hi E(x_{jW+i})` and value `V_hj = sum_i beta_hi E(x_{jW+i})`.
/// For a target position p the query `q = gamma E(x_p)` attends over the J entries of each head:
/// `w_hj = softmax_j <q, K_hj>`; the output is `o = sum_h sum_j w_hj V_hj`; the next-token
/// logits are `z_y = tau <o, E(y)>` over the vocabulary; the loss is the cross-entropy of the
/// successor `x_{p+1}`, averaged over every target p < T-1 of the batch. Training is plain
/// gradient descent from small random logits.
///
/// Beyond tiling (the mitigation study, phasekv/eval/mitigations.hpp), InductionConfig also
/// takes a stride S != W (overlap or gaps), per-head origins, a local raw window, phase dropout,
/// untrained mean-pooling heads and initial offsets; those designs are trained on the exact
/// orthonormal-limit loss, design_limit_loss, whose visible set per head follows DESIGN.md.
#pragma once
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/phase/geometry.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace eval {

/// Settings of the idealized induction model and its training.
struct InductionConfig {
  std::int64_t window = 8;     ///< W = S (offsets per gate).
  std::int64_t windows = 8;    ///< J windows per context (T = J W tokens).
  std::int64_t heads = 4;      ///< m heads.
  std::int64_t dim = 64;       ///< Embedding dimension d.
  std::int64_t vocab = 64;     ///< Vocabulary size N (>= T).
  double gamma = 16.0;         ///< Query scale.
  double tau = 16.0;           ///< Output logit scale.
  double init_scale = 0.01;    ///< Initial logits are N(0, init_scale^2).
  double learning_rate = 1.0;  ///< Gradient-descent step size.
  std::int64_t batch = 4;      ///< Contexts per step (fresh ones every step).
  std::uint64_t seed = 1;      ///< Seed of embeddings, initialization and data.
  /// Orthonormal embeddings (the d -> infinity limit): E(y) is the y-th standard basis vector
  /// (requires dim >= vocab). Every context then has the same loss, that of limit_loss().
  bool orthonormal = false;

  // Designs beyond W = S tiling (the mitigation study, phasekv/eval/mitigations.hpp). With
  // every field below at its default the model is the one described above, bit for bit; any
  // other value is supported by the exact orthonormal-limit loss (design_limit_loss) only.

  /// Stride S; 0 = `window` (tiling). `window > stride` overlaps, `window < stride` leaves
  /// gaps. With a stride set the context has `T = windows * stride` tokens.
  std::int64_t stride = 0;
  /// Per-head origins O_h (empty: all 0; else one per head, each in `[0, T - window]`): head
  /// h's windows start at `O_h + j S`, its positions below O_h are a raw prefix.
  std::vector<std::int64_t> origins{};
  /// Local window L: the last L tokens of the context are visible raw as well (DESIGN.md).
  std::int64_t local = 0;
  /// Phase dropout: each training step rotates every head's gate vectors by one random
  /// offset delta, uniform in `[0, window)` (the gates of offset i act at `(i + delta) mod W`,
  /// as phasekv::GatedPool::cycled does at inference).
  bool phase_dropout = false;
  /// Heads that are not trained: their logits start at 0 (uniform weights: mean pooling) and
  /// get no gradient. The others are trained as usual (a mix of policies across heads).
  std::vector<std::int64_t> mean_heads{};
  /// Per-head initial offsets (empty: none): head h's key logit at offset `init_offsets[h]`
  /// and its value logit at the next offset get `init_bias` added after the random draw.
  std::vector<std::int64_t> init_offsets{};
  /// Bias of init_offsets.
  double init_bias = 0.0;
};

/// True when `cfg` uses only the W = S tiling model (stride 0 or W, no origins, L = 0, no
/// phase dropout, no untrained heads, no initial offsets).
inline bool is_tiling_model(const InductionConfig& cfg) {
  return (cfg.stride == 0 || cfg.stride == cfg.window) && cfg.origins.empty() && cfg.local == 0 &&
         !cfg.phase_dropout && cfg.mean_heads.empty() && cfg.init_offsets.empty();
}

/// True when the loss of `cfg` is the tiling model's (stride 0 or W, no origins, L = 0):
/// phase dropout, untrained heads and initial offsets change training, not the loss.
inline bool has_tiling_loss(const InductionConfig& cfg) {
  return (cfg.stride == 0 || cfg.stride == cfg.window) && cfg.origins.empty() && cfg.local == 0;
}

/// Stride S of `cfg` (`window` when unset).
inline std::int64_t stride_of(const InductionConfig& cfg) {
  return cfg.stride > 0 ? cfg.stride : cfg.window;
}

/// Tokens per context T: `windows * S`.
inline std::int64_t context_of(const InductionConfig& cfg) { return cfg.windows * stride_of(cfg); }

/// The model's parameters: `[heads, W]` row-major key and value gate logits.
struct GateLogits {
  std::vector<double> key;    ///< a, `[heads, W]`.
  std::vector<double> value;  ///< c, `[heads, W]`.
};

/// Softmax of each row of a `[rows, w]` row-major matrix.
inline std::vector<double> softmax_rows(const std::vector<double>& logits, std::int64_t w) {
  std::vector<double> out(logits.size());
  for (std::size_t r = 0; r < logits.size(); r += static_cast<std::size_t>(w)) {
    double m = logits[r];
    for (std::int64_t i = 1; i < w; ++i) m = std::max(m, logits[r + static_cast<std::size_t>(i)]);
    double s = 0.0;
    for (std::int64_t i = 0; i < w; ++i) {
      out[r + static_cast<std::size_t>(i)] = std::exp(logits[r + static_cast<std::size_t>(i)] - m);
      s += out[r + static_cast<std::size_t>(i)];
    }
    for (std::int64_t i = 0; i < w; ++i) out[r + static_cast<std::size_t>(i)] /= s;
  }
  return out;
}

/// `exp(entropy)` of a probability row (the effective number of offsets it uses, in [1, W]).
inline double perplexity(const double* p, std::int64_t w) {
  double h = 0.0;
  for (std::int64_t i = 0; i < w; ++i)
    if (p[i] > 0.0) h -= p[i] * std::log(p[i]);
  return std::exp(h);
}

namespace detail {

// Pulls gradients w.r.t. the gate weights (alpha, beta: per head a softmax over W offsets)
// back to their logits: dL/da_i = alpha_i (dL/dalpha_i - sum_k alpha_k dL/dalpha_k), scaled by
// `inv` (the mean over samples).
inline void softmax_pullback(const std::vector<double>& alpha, const std::vector<double>& beta,
                             const std::vector<double>& g_alpha, const std::vector<double>& g_beta,
                             std::int64_t H, std::int64_t W, double inv, GateLogits* grad) {
  grad->key.assign(alpha.size(), 0.0);
  grad->value.assign(beta.size(), 0.0);
  for (std::int64_t h = 0; h < H; ++h) {
    double sa = 0.0, sb = 0.0;
    for (std::int64_t i = 0; i < W; ++i) {
      const std::size_t k = static_cast<std::size_t>(h * W + i);
      sa += alpha[k] * g_alpha[k];
      sb += beta[k] * g_beta[k];
    }
    for (std::int64_t i = 0; i < W; ++i) {
      const std::size_t k = static_cast<std::size_t>(h * W + i);
      grad->key[k] = alpha[k] * (g_alpha[k] - sa) * inv;
      grad->value[k] = beta[k] * (g_beta[k] - sb) * inv;
    }
  }
}

}  // namespace detail

/// Exact loss in the orthonormal-embedding limit for every design of InductionConfig (stride,
/// per-head origins, local window, gate rotation, untrained heads), with its analytic gradient
/// when `grad` is not null. Only window, windows, heads, vocab, gamma, tau, stride, origins,
/// local and mean_heads of `cfg` matter (phase_dropout and the initial offsets act in
/// InductionModel::step and its constructor).
///
/// The context has `T = windows * S` distinct tokens. Head h sees what a decode query after T
/// tokens sees under geometry (W, S, O_h) with local window L (phasekv::Geometry::visible): its
/// raw prefix, its complete windows j (key `K = sum_i alpha'_hi E(x_{O_h + jS + i})`, value
/// likewise with beta') and its raw tail and local tokens (key and value `E(x_t)`), where
/// `alpha'_h` is alpha_h rotated by `gate_shift` (the weight of offset i acts at offset
/// `(i + gate_shift) mod W`). For each target p < T - 1 the query `gamma E(x_p)` attends over
/// each head's items, the head outputs are summed, the logits are `tau <o, E(y)>` over the
/// vocabulary (0 outside the context) and the loss is the cross-entropy of `x_{p+1}`, averaged
/// over the T - 1 targets. Heads in `cfg.mean_heads` get a zero gradient. `per_phase`, when not
/// null, receives the mean loss of the targets of each residue `p mod S`.
///
/// With the tiling defaults it equals limit_loss() (to rounding); it costs
/// O(T * heads * (T / S) * W) per call.
inline double design_limit_loss(const InductionConfig& cfg, const GateLogits& params,
                                GateLogits* grad, std::int64_t gate_shift = 0,
                                std::vector<double>* per_phase = nullptr) {
  const std::int64_t W = cfg.window, S = stride_of(cfg), H = cfg.heads, T = context_of(cfg);
  const std::int64_t shift = ((gate_shift % W) + W) % W;
  const double N = static_cast<double>(cfg.vocab);
  const std::vector<double> alpha = softmax_rows(params.key, W);
  const std::vector<double> beta = softmax_rows(params.value, W);
  const auto at = [](std::int64_t i) { return static_cast<std::size_t>(i); };
  // Rotated weights: a[h][k] = alpha[h][(k - shift) mod W].
  std::vector<double> a(alpha.size()), b(beta.size());
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t k = 0; k < W; ++k) {
      a[at(h * W + k)] = alpha[at(h * W + (k - shift + W) % W)];
      b[at(h * W + k)] = beta[at(h * W + (k - shift + W) % W)];
    }
  // Items per head: window starts, then raw positions.
  std::vector<std::vector<std::int64_t>> starts(at(H)), raws(at(H));
  std::size_t most = 1;
  for (std::int64_t h = 0; h < H; ++h) {
    const std::int64_t o = cfg.origins.empty() ? 0 : cfg.origins[at(h)];
    const Visibility v = Geometry(W, S, o).visible(T, cfg.local);
    for (std::int64_t t = 0; t < v.prefix_end; ++t) raws[at(h)].push_back(t);
    for (std::int64_t j = 0; j < v.entries; ++j) starts[at(h)].push_back(o + j * S);
    for (std::int64_t t = v.raw_begin; t < v.raw_end; ++t) raws[at(h)].push_back(t);
    most = std::max(most, starts[at(h)].size() + raws[at(h)].size());
  }
  std::vector<double> ga(a.size(), 0.0), gb(b.size(), 0.0);
  std::vector<double> w(at(H) * most), c(at(T)), gc(at(T));
  std::vector<double> phase_sum(at(S), 0.0), phase_n(at(S), 0.0);
  double total = 0.0;
  for (std::int64_t p = 0; p + 1 < T; ++p) {
    std::fill(c.begin(), c.end(), 0.0);
    for (std::int64_t h = 0; h < H; ++h) {
      const std::vector<std::int64_t>& st = starts[at(h)];
      const std::vector<std::int64_t>& rw = raws[at(h)];
      double* wh = &w[at(h) * most];
      const std::size_t ns = st.size(), nr = rw.size();
      double mx = -HUGE_VAL;
      for (std::size_t k = 0; k < ns; ++k) {
        const std::int64_t off = p - st[k];
        wh[k] = off >= 0 && off < W ? cfg.gamma * a[at(h * W + off)] : 0.0;
        mx = std::max(mx, wh[k]);
      }
      for (std::size_t k = 0; k < nr; ++k) {
        wh[ns + k] = rw[k] == p ? cfg.gamma : 0.0;
        mx = std::max(mx, wh[ns + k]);
      }
      double den = 0.0;
      for (std::size_t k = 0; k < ns + nr; ++k) {
        wh[k] = std::exp(wh[k] - mx);
        den += wh[k];
      }
      for (std::size_t k = 0; k < ns + nr; ++k) wh[k] /= den;
      for (std::size_t k = 0; k < ns; ++k)
        for (std::int64_t i = 0; i < W; ++i) c[at(st[k] + i)] += wh[k] * b[at(h * W + i)];
      for (std::size_t k = 0; k < nr; ++k) c[at(rw[k])] += wh[ns + k];
    }
    double mz = 0.0;  // the N - T tokens outside the context have logit 0
    for (std::int64_t t = 0; t < T; ++t) mz = std::max(mz, cfg.tau * c[at(t)]);
    double Z = (N - static_cast<double>(T)) * std::exp(-mz);
    for (std::int64_t t = 0; t < T; ++t) Z += std::exp(cfg.tau * c[at(t)] - mz);
    const double loss_p = mz + std::log(Z) - cfg.tau * c[at(p + 1)];
    total += loss_p;
    phase_sum[at(p % S)] += loss_p;
    phase_n[at(p % S)] += 1.0;
    if (!grad) continue;
    for (std::int64_t t = 0; t < T; ++t)
      gc[at(t)] = cfg.tau * (std::exp(cfg.tau * c[at(t)] - mz) / Z - (t == p + 1 ? 1.0 : 0.0));
    for (std::int64_t h = 0; h < H; ++h) {
      const std::vector<std::int64_t>& st = starts[at(h)];
      const std::vector<std::int64_t>& rw = raws[at(h)];
      const double* wh = &w[at(h) * most];
      const std::size_t ns = st.size(), nr = rw.size();
      // dL/dw_k = <dL/dc, V_k>; dL/ds_k = w_k (dL/dw_k - sum_k' w_k' dL/dw_k').
      std::vector<double> dw(ns + nr);
      double wbar = 0.0;
      for (std::size_t k = 0; k < ns; ++k) {
        double acc = 0.0;
        for (std::int64_t i = 0; i < W; ++i) {
          acc += b[at(h * W + i)] * gc[at(st[k] + i)];
          gb[at(h * W + i)] += wh[k] * gc[at(st[k] + i)];
        }
        dw[k] = acc;
        wbar += wh[k] * acc;
      }
      for (std::size_t k = 0; k < nr; ++k) {
        dw[ns + k] = gc[at(rw[k])];
        wbar += wh[ns + k] * dw[ns + k];
      }
      for (std::size_t k = 0; k < ns; ++k) {
        const std::int64_t off = p - st[k];
        if (off >= 0 && off < W) ga[at(h * W + off)] += cfg.gamma * wh[k] * (dw[k] - wbar);
      }
    }
  }
  const double inv = 1.0 / static_cast<double>(T - 1);
  if (per_phase) {
    per_phase->assign(at(S), 0.0);
    for (std::int64_t r = 0; r < S; ++r)
      (*per_phase)[at(r)] = phase_n[at(r)] > 0 ? phase_sum[at(r)] / phase_n[at(r)] : 0.0;
  }
  if (grad) {
    // Back through the rotation: offset k of a[h] is offset (k - shift) mod W of alpha[h].
    std::vector<double> g_alpha(ga.size()), g_beta(gb.size());
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t k = 0; k < W; ++k) {
        g_alpha[at(h * W + (k - shift + W) % W)] = ga[at(h * W + k)];
        g_beta[at(h * W + (k - shift + W) % W)] = gb[at(h * W + k)];
      }
    detail::softmax_pullback(alpha, beta, g_alpha, g_beta, H, W, inv, grad);
    for (std::int64_t h : cfg.mean_heads)
      for (std::int64_t i = 0; i < W; ++i)
        grad->key[at(h * W + i)] = grad->value[at(h * W + i)] = 0.0;
  }
  return total * inv;
}

/// Exact loss of the model in the orthonormal-embedding limit (E(y) orthonormal, so
/// `<E(x), E(y)> = [x = y]`), averaged over all `J W - 1` targets of a context (every context
/// gives the same value), with its analytic gradient when `grad` is not null. Only the
/// settings window, windows, heads, vocab, gamma and tau of `cfg` matter.
///
/// For a target at phase r, head h puts weight
/// `A_h = exp(gamma alpha_hr) / (exp(gamma alpha_hr) + J - 1)` on the target's window and
/// `B_h = (1 - A_h) / (J - 1)` on each other window; the logits are
/// `u_i = tau sum_h A_h beta_hi` for the target window's tokens,
/// `v_i = tau sum_h B_h beta_hi` for the other windows' tokens and 0 for the N - T tokens
/// outside the context; the successor is `u_(r+1)` for r < W-1 and `v_0` (next window) for the
/// boundary phase r = W-1, which has J - 1 targets instead of J. `per_phase`, when not null,
/// receives the loss of one target of each phase.
inline double limit_loss(const InductionConfig& cfg, const GateLogits& params, GateLogits* grad,
                         std::vector<double>* per_phase = nullptr) {
  if (!has_tiling_loss(cfg)) return design_limit_loss(cfg, params, grad, 0, per_phase);
  const std::int64_t W = cfg.window, J = cfg.windows, H = cfg.heads;
  const double N = static_cast<double>(cfg.vocab), T = static_cast<double>(W * J);
  const double Jm1 = static_cast<double>(J - 1);
  const std::vector<double> alpha = softmax_rows(params.key, W);
  const std::vector<double> beta = softmax_rows(params.value, W);
  std::vector<double> g_alpha(alpha.size(), 0.0), g_beta(beta.size(), 0.0);
  std::vector<double> A(static_cast<std::size_t>(H)), B(A.size()), u(static_cast<std::size_t>(W)),
      v(u.size()), du(u.size()), dv(u.size());
  if (per_phase) per_phase->assign(static_cast<std::size_t>(W), 0.0);
  double total = 0.0;
  for (std::int64_t r = 0; r < W; ++r) {
    const double weight = r == W - 1 ? Jm1 : static_cast<double>(J);
    for (std::int64_t h = 0; h < H; ++h) {
      const double e = cfg.gamma * alpha[static_cast<std::size_t>(h * W + r)];
      // A = 1 / (1 + (J-1) e^{-gamma alpha}), computed stably.
      A[static_cast<std::size_t>(h)] = 1.0 / (1.0 + Jm1 * std::exp(-e));
      B[static_cast<std::size_t>(h)] = (1.0 - A[static_cast<std::size_t>(h)]) / Jm1;
    }
    double mx = 0.0;  // the N - T outside tokens have logit 0
    for (std::int64_t i = 0; i < W; ++i) {
      double su = 0.0, sv = 0.0;
      for (std::int64_t h = 0; h < H; ++h) {
        su += A[static_cast<std::size_t>(h)] * beta[static_cast<std::size_t>(h * W + i)];
        sv += B[static_cast<std::size_t>(h)] * beta[static_cast<std::size_t>(h * W + i)];
      }
      u[static_cast<std::size_t>(i)] = cfg.tau * su;
      v[static_cast<std::size_t>(i)] = cfg.tau * sv;
      mx = std::max(mx, std::max(u[static_cast<std::size_t>(i)], v[static_cast<std::size_t>(i)]));
    }
    double Z = (N - T) * std::exp(-mx);
    for (std::int64_t i = 0; i < W; ++i)
      Z += std::exp(u[static_cast<std::size_t>(i)] - mx) +
           Jm1 * std::exp(v[static_cast<std::size_t>(i)] - mx);
    const bool boundary = r == W - 1;
    const double zt = boundary ? v[0] : u[static_cast<std::size_t>(r + 1)];
    const double loss_r = mx + std::log(Z) - zt;
    if (per_phase) (*per_phase)[static_cast<std::size_t>(r)] = loss_r;
    total += weight * loss_r;
    if (!grad) continue;
    for (std::int64_t i = 0; i < W; ++i) {
      du[static_cast<std::size_t>(i)] = std::exp(u[static_cast<std::size_t>(i)] - mx) / Z;
      dv[static_cast<std::size_t>(i)] = Jm1 * std::exp(v[static_cast<std::size_t>(i)] - mx) / Z;
    }
    if (boundary)
      dv[0] -= 1.0;
    else
      du[static_cast<std::size_t>(r + 1)] -= 1.0;
    for (std::int64_t h = 0; h < H; ++h) {
      const double a = A[static_cast<std::size_t>(h)], b = B[static_cast<std::size_t>(h)];
      double dA = 0.0;
      for (std::int64_t i = 0; i < W; ++i) {
        const std::size_t k = static_cast<std::size_t>(h * W + i);
        g_beta[k] += weight * cfg.tau *
                     (a * du[static_cast<std::size_t>(i)] + b * dv[static_cast<std::size_t>(i)]);
        dA += cfg.tau * beta[k] *
              (du[static_cast<std::size_t>(i)] - dv[static_cast<std::size_t>(i)] / Jm1);
      }
      g_alpha[static_cast<std::size_t>(h * W + r)] += weight * dA * cfg.gamma * a * (1.0 - a);
    }
  }
  const double inv = 1.0 / (T - 1.0);
  if (grad) {
    detail::softmax_pullback(alpha, beta, g_alpha, g_beta, H, W, inv, grad);
    for (std::int64_t h : cfg.mean_heads)  // untrained heads
      for (std::int64_t i = 0; i < W; ++i)
        grad->key[static_cast<std::size_t>(h * W + i)] =
            grad->value[static_cast<std::size_t>(h * W + i)] = 0.0;
  }
  return total * inv;
}

}  // namespace eval
PHASEKV_NAMESPACE_END
