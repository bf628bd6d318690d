/// @file
/// @brief The paper's idealized induction model (task R2) with query-independent log-linear
/// gates: its gradient-flow trainer (InductionModel), over the losses and gradients of
/// phasekv/eval/induction_loss.hpp.
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

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/eval/embeddings.hpp"
#include "phasekv/eval/induction_loss.hpp"
#include "phasekv/phase/geometry.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace eval {

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
    const auto at = [](std::int64_t i) { return static_cast<std::size_t>(i); };
    for (std::int64_t h = 0; h < static_cast<std::int64_t>(cfg.init_offsets.size()); ++h) {
      const std::int64_t r = cfg.init_offsets[at(h)];
      params_.key[at(h * cfg.window + r)] += cfg.init_bias;
      params_.value[at(h * cfg.window + r + 1)] += cfg.init_bias;
    }
    for (std::int64_t h : cfg.mean_heads)
      for (std::int64_t i = 0; i < cfg.window; ++i)
        params_.key[at(h * cfg.window + i)] = params_.value[at(h * cfg.window + i)] = 0.0;
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
  /// Throws phasekv::invalid_argument when the config is beyond the tiling model
  /// (is_tiling_model() false): those designs have the orthonormal-limit loss only.
  double loss(const GateLogits& params, const std::vector<std::vector<std::int64_t>>& contexts,
              GateLogits* grad) const {
    phasekv::detail::check_arg(is_tiling_model(cfg_), "phasekv::eval::InductionModel::loss",
                               "config().stride", stride_of(cfg_),
                               "the random-embedding loss supports the W = S tiling model only "
                               "(no stride, origins, local window, phase dropout, mean heads or "
                               "initial offsets); use step(true) / design_limit_loss");
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
  /// before the step. With phase dropout the step's loss and gradient are those of the gates
  /// rotated by a fresh random delta (design_limit_loss with that gate_shift); last_shift()
  /// tells which. A design beyond the tiling model needs `limit` true (loss() throws otherwise).
  double step(bool limit = false) {
    GateLogits g;
    double l = 0.0;
    if (limit) {
      if (cfg_.phase_dropout) {
        last_shift_ = dropout_rng_.below(cfg_.window);
        if (has_tiling_loss(cfg_)) {
          // The tiling loss of the rotated logits, its gradient rotated back: the same as
          // design_limit_loss with this gate_shift (to rounding), at the tiling loss's cost.
          const std::int64_t W = cfg_.window;
          GateLogits rotated = params_;
          for (std::size_t h = 0; h < params_.key.size(); h += static_cast<std::size_t>(W))
            for (std::int64_t k = 0; k < W; ++k) {
              const std::size_t from = h + static_cast<std::size_t>((k - last_shift_ + W) % W);
              rotated.key[h + static_cast<std::size_t>(k)] = params_.key[from];
              rotated.value[h + static_cast<std::size_t>(k)] = params_.value[from];
            }
          GateLogits gr;
          l = limit_loss(cfg_, rotated, &gr);
          g = gr;
          for (std::size_t h = 0; h < params_.key.size(); h += static_cast<std::size_t>(W))
            for (std::int64_t k = 0; k < W; ++k) {
              const std::size_t to = h + static_cast<std::size_t>((k - last_shift_ + W) % W);
              g.key[to] = gr.key[h + static_cast<std::size_t>(k)];
              g.value[to] = gr.value[h + static_cast<std::size_t>(k)];
            }
        } else {
          l = design_limit_loss(cfg_, params_, &g, last_shift_);
        }
      } else {
        l = limit_loss(cfg_, params_, &g);
      }
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

  /// Gate rotation of the last phase-dropout step (0 without phase dropout).
  std::int64_t last_shift() const { return last_shift_; }

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
    phasekv::detail::check_arg(c.gamma > 0.0 && c.tau > 0.0, where, "gamma", c.gamma,
                               "gamma and tau must be > 0");
    phasekv::detail::check_arg(c.batch >= 1, where, "batch", c.batch, "must be >= 1");
    phasekv::detail::check_arg(!c.orthonormal || c.dim >= c.vocab, where, "dim", c.dim,
                               "must be >= vocab for orthonormal embeddings");
    phasekv::detail::check_arg(c.learning_rate > 0.0, where, "learning_rate", c.learning_rate,
                               "must be > 0");
    phasekv::detail::check_arg(c.stride >= 0 && c.stride <= c.window * c.windows, where, "stride",
                               c.stride, "must be in [0, window * windows] (0: = window)");
    const std::int64_t t = context_of(c);
    phasekv::detail::check_arg(t >= c.window + 1, where, "windows", c.windows,
                               "must give a context of more than window tokens (windows * stride)");
    phasekv::detail::check_arg(c.vocab >= t, where, "vocab", c.vocab,
                               "must be >= windows * stride (distinct tokens per context; "
                               "stride = window by default)");
    phasekv::detail::check_arg(
        c.origins.empty() || static_cast<std::int64_t>(c.origins.size()) == c.heads, where,
        "origins.size()", c.origins.size(), "must be 0 or heads (one origin per head)");
    for (std::int64_t o : c.origins)
      phasekv::detail::check_arg(o >= 0 && o <= t - c.window, where, "origins[]", o,
                                 "must be in [0, T - window] (T = windows * stride)");
    phasekv::detail::check_arg(c.local >= 0 && c.local <= t, where, "local", c.local,
                               "must be in [0, T]");
    for (std::size_t i = 0; i < c.mean_heads.size(); ++i) {
      const std::int64_t h = c.mean_heads[i];
      phasekv::detail::check_arg(h >= 0 && h < c.heads, where, "mean_heads[]", h,
                                 "must be a head in [0, heads)");
      for (std::size_t k = 0; k < i; ++k)
        phasekv::detail::check_arg(c.mean_heads[k] != h, where, "mean_heads[]", h,
                                   "is listed twice");
    }
    phasekv::detail::check_arg(
        c.init_offsets.empty() || static_cast<std::int64_t>(c.init_offsets.size()) == c.heads,
        where, "init_offsets.size()", c.init_offsets.size(), "must be 0 or heads");
    for (std::int64_t r : c.init_offsets)
      phasekv::detail::check_arg(r >= 0 && r + 1 < c.window, where, "init_offsets[]", r,
                                 "must be in [0, window - 1) (the value bias goes to offset + 1)");
    phasekv::detail::check_arg(std::isfinite(c.init_bias), where, "init_bias", c.init_bias,
                               "must be finite");
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
  Rng dropout_rng_{cfg_.seed ^ 0x70686173652d6470ULL};  // phase dropout draws only
  std::int64_t last_shift_ = 0;
  Embeddings emb_;
  GateLogits params_;
  std::vector<double> table_;
  std::vector<std::int64_t> perm_;
};

}  // namespace eval
PHASEKV_NAMESPACE_END
