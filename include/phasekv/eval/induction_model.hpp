/// @file
/// @brief The paper's idealized induction model (task R2) with query-independent log-linear
/// gates, and its gradient-flow trainer with analytic gradients.
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
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/eval/retrieval.hpp"

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
};

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
  if (grad) detail::softmax_pullback(alpha, beta, g_alpha, g_beta, H, W, inv, grad);
  return total * inv;
}

/// The idealized induction model with its trainer.
class InductionModel {
 public:
  /// Draws the embeddings and the initial logits. Throws phasekv::invalid_argument for
  /// inconsistent settings (W < 2, J < 2, vocab < T, non-positive scales, ...).
  explicit InductionModel(const InductionConfig& cfg)
      : cfg_(cfg), rng_(cfg.seed), emb_(checked(cfg).vocab, cfg.dim, rng_.next()) {
    const std::size_t n = static_cast<std::size_t>(cfg.heads * cfg.window);
    params_.key.resize(n);
    params_.value.resize(n);
    for (double& x : params_.key) x = cfg.init_scale * rng_.normal();
    for (double& x : params_.value) x = cfg.init_scale * rng_.normal();
    table_.resize(static_cast<std::size_t>(cfg.vocab * cfg.dim));
    for (std::int64_t y = 0; y < cfg.vocab; ++y)
      for (std::int64_t k = 0; k < cfg.dim; ++k)
        table_[static_cast<std::size_t>(y * cfg.dim + k)] =
            cfg.orthonormal ? (y == k ? 1.0 : 0.0) : static_cast<double>(emb_[y][k]);
    perm_.resize(static_cast<std::size_t>(cfg.vocab));
    for (std::int64_t i = 0; i < cfg.vocab; ++i) perm_[static_cast<std::size_t>(i)] = i;
  }

  /// The settings.
  const InductionConfig& config() const { return cfg_; }
  /// Current logits (read/write: tests set them directly).
  GateLogits& logits() { return params_; }
  /// Current logits.
  const GateLogits& logits() const { return params_; }
  /// Key gate weights alpha, `[heads, W]`.
  std::vector<double> key_weights() const { return softmax_rows(params_.key, cfg_.window); }
  /// Value gate weights beta, `[heads, W]`.
  std::vector<double> value_weights() const { return softmax_rows(params_.value, cfg_.window); }
  /// The embedding table (float, as the retrieval harness uses it).
  const Embeddings& embeddings() const { return emb_; }

  /// A batch of `count` fresh contexts (each T distinct tokens) from the model's generator.
  std::vector<std::vector<std::int64_t>> sample_contexts(std::int64_t count) {
    const std::int64_t t = cfg_.window * cfg_.windows;
    std::vector<std::vector<std::int64_t>> out;
    for (std::int64_t c = 0; c < count; ++c) {
      for (std::int64_t i = 0; i < t; ++i)
        std::swap(perm_[static_cast<std::size_t>(i)],
                  perm_[static_cast<std::size_t>(i + rng_.below(cfg_.vocab - i))]);
      out.emplace_back(perm_.begin(), perm_.begin() + t);
    }
    return out;
  }

  /// Mean cross-entropy over all targets p < T-1 of `contexts` under `params`, and its
  /// analytic gradient (when `grad` is not null, same shapes as `params`).
  double loss(const GateLogits& params, const std::vector<std::vector<std::int64_t>>& contexts,
              GateLogits* grad) const {
    const std::int64_t W = cfg_.window, J = cfg_.windows, T = W * J, H = cfg_.heads, d = cfg_.dim,
                       N = cfg_.vocab;
    const std::vector<double> alpha = softmax_rows(params.key, W);
    const std::vector<double> beta = softmax_rows(params.value, W);
    std::vector<double> g_alpha(alpha.size(), 0.0), g_beta(beta.size(), 0.0);
    std::vector<double> gram(static_cast<std::size_t>(T * T));  // <E(x_t), E(x_u)>
    std::vector<double> ctx_emb(static_cast<std::size_t>(T * d));
    std::vector<double> s(static_cast<std::size_t>(H * J)), w(s.size()), r(s.size());
    std::vector<double> o(static_cast<std::size_t>(d)), u(o.size()), z(static_cast<std::size_t>(N));
    std::vector<double> ue(static_cast<std::size_t>(T));
    double total = 0.0;
    std::int64_t count = 0;
    for (const auto& x : contexts) {
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t k = 0; k < d; ++k)
          ctx_emb[static_cast<std::size_t>(t * d + k)] =
              table_[static_cast<std::size_t>(x[static_cast<std::size_t>(t)] * d + k)];
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t v = 0; v < T; ++v) {
          double acc = 0.0;
          for (std::int64_t k = 0; k < d; ++k)
            acc += ctx_emb[static_cast<std::size_t>(t * d + k)] *
                   ctx_emb[static_cast<std::size_t>(v * d + k)];
          gram[static_cast<std::size_t>(t * T + v)] = acc;
        }
      for (std::int64_t p = 0; p + 1 < T; ++p) {
        const double* qe = &gram[static_cast<std::size_t>(p * T)];
        // Scores and attention per head.
        for (std::int64_t h = 0; h < H; ++h) {
          double mx = -1e300;
          for (std::int64_t j = 0; j < J; ++j) {
            double acc = 0.0;
            for (std::int64_t i = 0; i < W; ++i)
              acc += alpha[static_cast<std::size_t>(h * W + i)] * qe[j * W + i];
            s[static_cast<std::size_t>(h * J + j)] = cfg_.gamma * acc;
            mx = std::max(mx, cfg_.gamma * acc);
          }
          double den = 0.0;
          for (std::int64_t j = 0; j < J; ++j) {
            w[static_cast<std::size_t>(h * J + j)] =
                std::exp(s[static_cast<std::size_t>(h * J + j)] - mx);
            den += w[static_cast<std::size_t>(h * J + j)];
          }
          for (std::int64_t j = 0; j < J; ++j) w[static_cast<std::size_t>(h * J + j)] /= den;
        }
        // Output o = sum_t coef_t E(x_t), coef_t = sum_h w_{h, t/W} beta_{h, t%W}.
        std::fill(o.begin(), o.end(), 0.0);
        for (std::int64_t t = 0; t < T; ++t) {
          double coef = 0.0;
          for (std::int64_t h = 0; h < H; ++h)
            coef += w[static_cast<std::size_t>(h * J + t / W)] *
                    beta[static_cast<std::size_t>(h * W + t % W)];
          for (std::int64_t k = 0; k < d; ++k)
            o[static_cast<std::size_t>(k)] += coef * ctx_emb[static_cast<std::size_t>(t * d + k)];
        }
        // Logits over the vocabulary and the cross-entropy of the successor.
        double mz = -1e300;
        for (std::int64_t y = 0; y < N; ++y) {
          double acc = 0.0;
          for (std::int64_t k = 0; k < d; ++k)
            acc += o[static_cast<std::size_t>(k)] * table_[static_cast<std::size_t>(y * d + k)];
          z[static_cast<std::size_t>(y)] = cfg_.tau * acc;
          mz = std::max(mz, z[static_cast<std::size_t>(y)]);
        }
        double zs = 0.0;
        for (std::int64_t y = 0; y < N; ++y) zs += std::exp(z[static_cast<std::size_t>(y)] - mz);
        const std::int64_t target = x[static_cast<std::size_t>(p + 1)];
        total += -(z[static_cast<std::size_t>(target)] - mz - std::log(zs));
        ++count;
        if (!grad) continue;
        // dL/do = tau sum_y (softmax_y - [y = target]) E(y).
        std::fill(u.begin(), u.end(), 0.0);
        for (std::int64_t y = 0; y < N; ++y) {
          const double gy =
              std::exp(z[static_cast<std::size_t>(y)] - mz) / zs - (y == target ? 1.0 : 0.0);
          for (std::int64_t k = 0; k < d; ++k)
            u[static_cast<std::size_t>(k)] +=
                cfg_.tau * gy * table_[static_cast<std::size_t>(y * d + k)];
        }
        for (std::int64_t t = 0; t < T; ++t) {
          double acc = 0.0;
          for (std::int64_t k = 0; k < d; ++k)
            acc += u[static_cast<std::size_t>(k)] * ctx_emb[static_cast<std::size_t>(t * d + k)];
          ue[static_cast<std::size_t>(t)] = acc;
        }
        for (std::int64_t h = 0; h < H; ++h) {
          // dL/dbeta_hi = sum_j w_hj <u, E(x_{jW+i})>; dL/dw_hj = <u, V_hj>.
          double rbar = 0.0;
          for (std::int64_t j = 0; j < J; ++j) {
            double acc = 0.0;
            for (std::int64_t i = 0; i < W; ++i) {
              g_beta[static_cast<std::size_t>(h * W + i)] +=
                  w[static_cast<std::size_t>(h * J + j)] * ue[static_cast<std::size_t>(j * W + i)];
              acc += beta[static_cast<std::size_t>(h * W + i)] *
                     ue[static_cast<std::size_t>(j * W + i)];
            }
            r[static_cast<std::size_t>(h * J + j)] = acc;
            rbar += w[static_cast<std::size_t>(h * J + j)] * acc;
          }
          // dL/ds_hj = w_hj (r_hj - rbar); dL/dalpha_hi = sum_j dL/ds_hj gamma <E(x_p),
          // E(x_{jW+i})>.
          for (std::int64_t j = 0; j < J; ++j) {
            const double ds = w[static_cast<std::size_t>(h * J + j)] *
                              (r[static_cast<std::size_t>(h * J + j)] - rbar);
            for (std::int64_t i = 0; i < W; ++i)
              g_alpha[static_cast<std::size_t>(h * W + i)] += ds * cfg_.gamma * qe[j * W + i];
          }
        }
      }
    }
    const double inv = 1.0 / static_cast<double>(count);
    // Through the softmaxes.
    if (grad) detail::softmax_pullback(alpha, beta, g_alpha, g_beta, H, W, inv, grad);
    return total * inv;
  }

  /// One gradient-descent step on `config().batch` fresh contexts (or, with `limit` true, on
  /// the exact orthonormal-limit loss limit_loss(), which needs no data); returns the loss
  /// before the step.
  double step(bool limit = false) {
    GateLogits g;
    double l = 0.0;
    if (limit) {
      l = limit_loss(cfg_, params_, &g);
    } else {
      const auto batch = sample_contexts(cfg_.batch);
      l = loss(params_, batch, &g);
    }
    for (std::size_t k = 0; k < params_.key.size(); ++k) {
      params_.key[k] -= cfg_.learning_rate * g.key[k];
      params_.value[k] -= cfg_.learning_rate * g.value[k];
    }
    return l;
  }

  /// Offset of the largest key weight of head h.
  std::int64_t key_offset(std::int64_t h) const { return argmax_row(key_weights(), h); }
  /// Offset of the largest value weight of head h.
  std::int64_t value_offset(std::int64_t h) const { return argmax_row(value_weights(), h); }

 private:
  static const InductionConfig& checked(const InductionConfig& c) {
    const char* where = "phasekv::eval::InductionModel";
    phasekv::detail::check_arg(c.window >= 2, where, "window", c.window, "must be >= 2");
    phasekv::detail::check_arg(c.windows >= 2, where, "windows", c.windows, "must be >= 2");
    phasekv::detail::check_arg(c.heads >= 1, where, "heads", c.heads, "must be >= 1");
    phasekv::detail::check_arg(c.dim >= 1, where, "dim", c.dim, "must be >= 1");
    phasekv::detail::check_arg(c.vocab >= c.window * c.windows, where, "vocab", c.vocab,
                               "must be >= window * windows (distinct tokens per context)");
    phasekv::detail::check_arg(c.gamma > 0.0 && c.tau > 0.0, where, "gamma", c.gamma,
                               "gamma and tau must be > 0");
    phasekv::detail::check_arg(c.batch >= 1, where, "batch", c.batch, "must be >= 1");
    phasekv::detail::check_arg(!c.orthonormal || c.dim >= c.vocab, where, "dim", c.dim,
                               "must be >= vocab for orthonormal embeddings");
    phasekv::detail::check_arg(c.learning_rate > 0.0, where, "learning_rate", c.learning_rate,
                               "must be > 0");
    return c;
  }
  std::int64_t argmax_row(const std::vector<double>& m, std::int64_t h) const {
    std::int64_t best = 0;
    for (std::int64_t i = 1; i < cfg_.window; ++i)
      if (m[static_cast<std::size_t>(h * cfg_.window + i)] >
          m[static_cast<std::size_t>(h * cfg_.window + best)])
        best = i;
    return best;
  }

  InductionConfig cfg_;
  Rng rng_;
  Embeddings emb_;
  GateLogits params_;
  std::vector<double> table_;
  std::vector<std::int64_t> perm_;
};

}  // namespace eval
PHASEKV_NAMESPACE_END
