/// @file
/// @brief The idealized retrieval tasks of the reference suite, run through the library's
/// compressor policies (compress_batch), visible-set construction and an attention backend
/// (the double-precision reference or a kernel):
///
/// - **R1, stored records**: position t holds key `E_K(x_t)` and value `E_V(y_t)`; the query
///   is `gamma * E_K(x_p)`; the prediction is `argmax_y <o, E_V(y)>` over the vocabulary and
///   is correct iff it is `y_p`.
/// - **R2, induction**: keys and values are both `E(x_t)`; the query is `gamma * E(x_p)`;
///   correct iff the prediction `argmax_y <o, E(y)>` is the successor `x_{p+1}`.
///
/// `o` is the sum of the outputs of all heads. Embeddings are random unit vectors in R^d;
/// the tokens of one context are distinct (and so are the values y of one context).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "phasekv/attention/cpu/decode.hpp"
#include "phasekv/attention/params.hpp"
#include "phasekv/attention/reference.hpp"
#include "phasekv/compress/compress_batch.hpp"
#include "phasekv/compress/compressed_cache.hpp"
#include "phasekv/compress/fixed_gates.hpp"
#include "phasekv/compress/policy.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/view.hpp"
#include "phasekv/eval/embeddings.hpp"
#include "phasekv/eval/stats.hpp"
#include "phasekv/phase/geometry.hpp"
#include "phasekv/phase/residue.hpp"
#include "phasekv/phase/origins.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace eval {

/// The retrieval task.
enum class Task : std::uint8_t {
  R1,  ///< stored records: retrieve the value bound to the queried key.
  R2,  ///< induction: retrieve the successor of the queried token.
};

/// "R1" or "R2".
inline const char* to_string(Task t) { return t == Task::R1 ? "R1" : "R2"; }

/// FixedGates is a compressor like the others (phasekv/compress/fixed_gates.hpp); the harness
/// keeps its old name.
using phasekv::FixedGates;

/// Marker "policy" for uncompressed attention: every position of the context stays raw.
struct NoCompression {};

/// Parameters of a retrieval experiment.
struct RetrievalConfig {
  Task task = Task::R1;                ///< R1 or R2.
  std::int64_t dim = 64;               ///< Embedding dimension d.
  std::int64_t vocab = 1024;           ///< Vocabulary size N (>= context).
  std::int64_t context = 512;          ///< Tokens per context T; the query sits at position T-1.
  std::int64_t heads = 1;              ///< Heads (outputs summed); policies must cover them.
  double gamma = 16.0;                 ///< Query scale (the attention scale is 1).
  std::int64_t local = 16;             ///< Local window L of raw tokens.
  std::int64_t modulus = 0;            ///< Residue modulus M of the report; 0 = the stride S.
  std::int64_t contexts = 32;          ///< Number of random contexts.
  std::int64_t targets_per_group = 8;  ///< Targets per residue group and context.
  std::int64_t min_depth = 0;          ///< Targets at positions <= T-1-min_depth; 0 = L + W + S.
  std::int64_t max_depth = 0;          ///< Targets at positions >= T-1-max_depth; 0 = as deep as
                                       ///< the origin allows.
  std::uint64_t seed = 1;              ///< Seed of embeddings, contexts and targets.
  /// True: stream each context into a phasekv::CompressedCache and attend over its
  /// visible(); false: phasekv::compress_batch plus phasekv::reference_visible. Both give
  /// bit-identical visible sets.
  bool use_cache = true;
  /// Knocked-out heads (each in `[0, heads)`, no duplicates): the compressed entries of these
  /// heads are excluded from their softmax exactly (entry bias -inf); their raw tokens (prefix,
  /// raw tail, local window) are still attended. A head here is a KV head of the compressed
  /// cache, which in this harness is also the query head that reads it (one query head per KV
  /// head). Requires a compressor (not NoCompression).
  std::vector<std::int64_t> knockout;
  /// Per-head origins (staggered windows): empty (the default) for one geometry shared by
  /// every head; else one origin O_h >= 0 per head (`heads` of them), and head h compresses
  /// windows `[O_h + j*S, O_h + j*S + W)` with the policies' W and S (their origin must then be
  /// 0) through a phasekv::CompressedCache (use_cache) or phasekv::compress_batch with these
  /// origins, and its query sees what `Geometry(W, S, O_h)` makes visible. Residues are still
  /// reported relative to position 0, and targets start at the largest O_h (every target lies in
  /// every head's compressed range, none in a raw prefix). Requires a compressor. Knockout works as
  /// without origins.
  std::vector<std::int64_t> origins;
};

/// Outcome of a retrieval experiment.
struct RetrievalResult {
  PhaseTally tally{1};                    ///< Per-residue counts.
  std::vector<std::int64_t> positions;    ///< Target position of every trial, in order.
  std::vector<std::int64_t> predictions;  ///< Predicted token of every trial.
  std::vector<char> correct;              ///< 1 when the trial was correct.
};

/// Attention backend over the double-precision reference (phasekv::reference_decode).
struct ReferenceAttention {
  /// `out[h * d_v + i]` for each query head h.
  void operator()(const float* q, std::int64_t q_heads, const VisibleKV<float>& kv,
                  const StandardVariant& variant, float* out) const {
    std::int64_t dv = 0;
    for (int s = 0; s < kv.count; ++s) dv = kv.segments[s].values.dim;
    std::vector<double> o(static_cast<std::size_t>(q_heads * (dv > 0 ? dv : 1)));
    std::vector<double> lse(static_cast<std::size_t>(q_heads));
    reference_decode<float>(q, q_heads, kv, variant, o.data(), lse.data());
    for (std::size_t i = 0; i < static_cast<std::size_t>(q_heads * dv); ++i)
      out[i] = static_cast<float>(o[i]);
  }
};

/// Attention backend over the CPU decode kernel (phasekv::cpu::decode, single thread, the
/// widest instruction set the translation unit was built for).
struct KernelAttention {
  /// `out[h * d_v + i]` for each query head h.
  void operator()(const float* q, std::int64_t q_heads, const VisibleKV<float>& kv,
                  const StandardVariant& variant, float* out) const {
    cpu::DecodeArgs<float> a;
    a.q = q;
    a.q_heads = q_heads;
    a.kv = kv;
    a.variant = variant;
    for (int s = 0; s < kv.count; ++s) {
      a.kv_heads = kv.segments[s].keys.heads;
      a.d_k = kv.segments[s].keys.dim;
      a.d_v = kv.segments[s].values.dim;
    }
    phasekv::detail::check_arg(kv.count > 0, "phasekv::eval::KernelAttention", "kv.count", kv.count,
                               "must be > 0 (nothing visible)");
    std::vector<float> lse(static_cast<std::size_t>(q_heads));
    a.out = out;
    a.lse = lse.data();
    cpu::decode(a);
  }
};

namespace detail {

/// Where the targets of a retrieval run lie: positions `lo + m * b + phase` for whole residue
/// blocks `b < blocks` of modulus `m`.
struct TargetRange {
  std::int64_t modulus = 1;  ///< Residue modulus M of the report.
  std::int64_t lo = 0;       ///< First position of block 0.
  std::int64_t blocks = 0;   ///< Whole blocks of M positions in the allowed depths.
};

/// Checks cfg.knockout: heads in `[0, heads)`, no duplicates, and a compressor to knock out.
inline void check_knockout(const char* where, const RetrievalConfig& cfg, bool full) {
  phasekv::detail::check_arg(cfg.knockout.empty() || !full, where, "knockout.size()",
                             static_cast<std::int64_t>(cfg.knockout.size()),
                             "must be 0 without compression (no compressed entries to exclude)");
  for (std::size_t i = 0; i < cfg.knockout.size(); ++i) {
    const std::int64_t h = cfg.knockout[i];
    phasekv::detail::check_arg(h >= 0 && h < cfg.heads, where, "knockout[]", h,
                               "must be a head in [0, heads)");
    for (std::size_t k = 0; k < i; ++k)
      phasekv::detail::check_arg(cfg.knockout[k] != h, where, "knockout[]", h, "is listed twice");
  }
}

/// Checks the configuration and the policies (both NoCompression or both compressors of one
/// geometry and dims) and returns the geometry the run uses (W = S = 1 uncompressed).
template <bool Full, class KeyPolicy, class ValuePolicy>
Geometry check_retrieval(const char* where, const RetrievalConfig& cfg, const KeyPolicy& key_policy,
                         const ValuePolicy& value_policy) {
  phasekv::detail::check_arg(cfg.dim >= 1, where, "dim", cfg.dim, "must be >= 1");
  phasekv::detail::check_arg(cfg.heads >= 1, where, "heads", cfg.heads, "must be >= 1");
  phasekv::detail::check_arg(cfg.context >= 2, where, "context", cfg.context, "must be >= 2");
  phasekv::detail::check_arg(cfg.vocab >= cfg.context, where, "vocab", cfg.vocab,
                             "must be >= context (tokens of a context are distinct)");
  phasekv::detail::check_arg(cfg.contexts >= 1, where, "contexts", cfg.contexts, "must be >= 1");
  phasekv::detail::check_arg(cfg.targets_per_group >= 1, where, "targets_per_group",
                             cfg.targets_per_group, "must be >= 1");
  phasekv::detail::check_arg(std::isfinite(cfg.gamma) && cfg.gamma > 0.0, where, "gamma", cfg.gamma,
                             "must be finite and > 0");
  Geometry::check_local(where, "local", cfg.local);
  check_knockout(where, cfg, Full);
  if (!cfg.origins.empty()) {
    phasekv::detail::check_arg(!Full, where, "origins.size()",
                               static_cast<std::int64_t>(cfg.origins.size()),
                               "must be 0 without compression (no windows to stagger)");
    check_origins(where, cfg.origins, cfg.heads);
  }
  if constexpr (Full) {
    (void)key_policy;
    (void)value_policy;
    return Geometry(1, 1, 0);
  } else {
    check_policy<KeyPolicy>();
    check_policy<ValuePolicy>();
    const Geometry g = key_policy.geometry();
    phasekv::detail::check_arg(value_policy.geometry() == g, where,
                               "value_policy.geometry().stride()", value_policy.geometry().stride(),
                               "must equal the key policy's geometry");
    check_policy_dims(key_policy, cfg.heads, where, "key_policy");
    check_policy_dims(value_policy, cfg.heads, where, "value_policy");
    if (!cfg.origins.empty()) {
      resolve_origins(where, key_policy.geometry(), cfg.origins, cfg.heads, "key_policy");
      resolve_origins(where, value_policy.geometry(), cfg.origins, cfg.heads, "value_policy");
    }
    phasekv::detail::check_arg<shape_error>(
        key_policy.input_dim() == cfg.dim && key_policy.output_dim() == cfg.dim, where,
        "key_policy.output_dim()", key_policy.output_dim(), "input and output dims must equal dim");
    phasekv::detail::check_arg<shape_error>(
        value_policy.input_dim() == cfg.dim && value_policy.output_dim() == cfg.dim, where,
        "value_policy.output_dim()", value_policy.output_dim(),
        "input and output dims must equal dim");
    return g;
  }
}

/// The target positions: residues modulo M (cfg.modulus, default S, 1 uncompressed) at
/// depths between cfg.min_depth (default L + W + S) and cfg.max_depth below the query.
inline TargetRange retrieval_targets(const char* where, const RetrievalConfig& cfg,
                                     const Geometry& g, bool full) {
  TargetRange r;
  r.modulus = cfg.modulus > 0 ? cfg.modulus : (full ? 1 : g.stride());
  phasekv::detail::check_arg(r.modulus <= (std::int64_t{1} << 20), where, "modulus", r.modulus,
                             "must be <= 2^20");
  const std::int64_t t_query = cfg.context - 1;
  const std::int64_t min_depth =
      cfg.min_depth > 0 ? cfg.min_depth : cfg.local + g.window() + g.stride();
  const std::int64_t hi = t_query - min_depth;
  std::int64_t origin = g.origin();
  for (std::int64_t o : cfg.origins) origin = std::max(origin, o);
  r.lo = cfg.max_depth > 0 ? std::max(origin, t_query - cfg.max_depth) : origin;
  r.blocks = (hi - r.lo + 1) / r.modulus;  // whole residue blocks in [lo, hi]
  phasekv::detail::check_arg(r.blocks >= 1, where, "min_depth", min_depth,
                             "leaves no room for targets (context too short for the depths and "
                             "modulus)");
  return r;
}

/// The random contexts of a run: the embedding tables, and per context distinct tokens x
/// (and, for R1, distinct values y) and the raw keys and values `[T, heads, dim]` they give.
class RetrievalContexts {
 public:
  /// Draws the tables from `rng` (keys, then R1's values).
  RetrievalContexts(const RetrievalConfig& cfg, Rng& rng)
      : cfg_(cfg), keys_(cfg.vocab, cfg.dim, rng.next()) {
    // R2 reads its values from the key table (not a copy: the table is vocab * dim floats).
    if (cfg.task == Task::R1) r1_values_.emplace(cfg.vocab, cfg.dim, rng.next());
    const std::size_t raw = static_cast<std::size_t>(cfg.context * cfg.heads * cfg.dim);
    raw_k_.resize(raw);
    raw_v_.resize(raw);
    perm_x_.resize(static_cast<std::size_t>(cfg.vocab));
    for (std::int64_t i = 0; i < cfg.vocab; ++i) perm_x_[static_cast<std::size_t>(i)] = i;
    perm_y_ = perm_x_;
  }

  /// Draws the next context: distinct tokens by a partial Fisher-Yates shuffle over the
  /// vocabulary, then their embeddings as raw keys and values (every head the same).
  void draw(Rng& rng) {
    const std::int64_t T = cfg_.context, H = cfg_.heads, d = cfg_.dim;
    for (std::int64_t t = 0; t < T; ++t) {
      std::swap(perm_x_[static_cast<std::size_t>(t)],
                perm_x_[static_cast<std::size_t>(t + rng.below(cfg_.vocab - t))]);
      if (cfg_.task == Task::R1)
        std::swap(perm_y_[static_cast<std::size_t>(t)],
                  perm_y_[static_cast<std::size_t>(t + rng.below(cfg_.vocab - t))]);
    }
    for (std::int64_t t = 0; t < T; ++t) {
      const float* ek = keys_[token(t)];
      const float* ev = cfg_.task == Task::R1 ? values()[value_token(t)] : ek;
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < d; ++i) {
          raw_k_[static_cast<std::size_t>((t * H + h) * d + i)] = ek[i];
          raw_v_[static_cast<std::size_t>((t * H + h) * d + i)] = ev[i];
        }
    }
  }

  /// The key embedding table.
  const Embeddings& keys() const { return keys_; }
  /// The value embedding table (R1's own, R2's the key table).
  const Embeddings& values() const { return r1_values_ ? *r1_values_ : keys_; }
  /// Token at position t of the current context.
  std::int64_t token(std::int64_t t) const { return perm_x_[static_cast<std::size_t>(t)]; }
  /// R1's value token at position t of the current context.
  std::int64_t value_token(std::int64_t t) const { return perm_y_[static_cast<std::size_t>(t)]; }
  /// Raw keys of the current context by position.
  StridedView<const float> raw_k() const {
    return make_view<const float>(raw_k_.data(), cfg_.context, cfg_.heads, cfg_.dim);
  }
  /// Raw values of the current context by position.
  StridedView<const float> raw_v() const {
    return make_view<const float>(raw_v_.data(), cfg_.context, cfg_.heads, cfg_.dim);
  }

 private:
  RetrievalConfig cfg_;
  Embeddings keys_;
  std::optional<Embeddings> r1_values_;
  std::vector<float> raw_k_, raw_v_;
  std::vector<std::int64_t> perm_x_, perm_y_;
};

/// What the query of the current context sees, and the storage it points into: the context
/// streamed into a CompressedCache (cfg.use_cache), or compress_batch + reference_visible, or
/// every raw token (uncompressed). With per-head origins (cfg.origins) the cache and
/// compress_batch take them, and heads() gives each head's visible set.
template <bool Full, class KeyPolicy, class ValuePolicy>
class RetrievalVisible {
 public:
  /// Storage for runs of `cfg` with these policies.
  RetrievalVisible(const RetrievalConfig& cfg, const Geometry& g, const KeyPolicy& key_policy,
                   const ValuePolicy& value_policy)
      : cfg_(cfg), g_(g), kp_(key_policy), vp_(value_policy) {
    if constexpr (!Full) {
      j_ = max_complete_windows(g, cfg.origins, cfg.context);
      const std::size_t n = static_cast<std::size_t>((j_ > 0 ? j_ : 1) * cfg.heads * cfg.dim);
      ent_k_.resize(n);
      ent_v_.resize(n);
    }
  }

  /// The visible set of the query at position T - 1 of the context `rk`/`rv` (valid until the
  /// next call).
  VisibleKV<float> operator()(StridedView<const float> rk, StridedView<const float> rv) {
    const std::int64_t T = cfg_.context, H = cfg_.heads, d = cfg_.dim;
    VisibleKV<float> kv;
    if constexpr (Full) {
      kv.push({rk.slice(0, T), rv.slice(0, T), 0, SegmentKind::raw});
    } else {
      fill(rk, rv);
      if (cfg_.use_cache) {
        kv = cache_->visible(cfg_.local);
      } else {
        kv = reference_visible<float>(g_, cfg_.local, T - 1, rk, rv,
                                      make_view<const float>(ent_k_.data(), j_, H, d),
                                      make_view<const float>(ent_v_.data(), j_, H, d));
      }
    }
    return kv;
  }

  /// The visible set of every KV head (one-head views, each with its origin) of the query at
  /// position T - 1 of the context `rk`/`rv` (valid until the next call; compressed only).
  const std::vector<VisibleKV<float>>& heads(StridedView<const float> rk,
                                             StridedView<const float> rv) {
    const std::int64_t T = cfg_.context, H = cfg_.heads, d = cfg_.dim;
    fill(rk, rv);
    if (cfg_.use_cache) {
      kv_ = cache_->visible_per_head(cfg_.local);
      return kv_;
    }
    const auto ek = make_view<const float>(ent_k_.data(), j_, H, d);
    const auto ev = make_view<const float>(ent_v_.data(), j_, H, d);
    kv_.assign(static_cast<std::size_t>(H), VisibleKV<float>{});
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t o = cfg_.origins.empty() ? g_.origin() : cfg_.origins[h];
      kv_[static_cast<std::size_t>(h)] = reference_visible<float>(
          Geometry(g_.window(), g_.stride(), o), cfg_.local, T - 1, head_view(rk, h),
          head_view(rv, h), head_view(ek, h), head_view(ev, h));
    }
    return kv_;
  }

 private:
  using Cache = std::conditional_t<Full, int, CompressedCache<float, KeyPolicy, ValuePolicy>>;
  RetrievalConfig cfg_;
  Geometry g_;
  const KeyPolicy& kp_;
  const ValuePolicy& vp_;
  std::int64_t j_ = 0;
  std::vector<float> ent_k_, ent_v_;
  std::optional<Cache> cache_;
  std::vector<VisibleKV<float>> kv_;

  // Streams the context through a compressed cache (one append; cfg.use_cache), or
  // compresses it with compress_batch, with cfg.origins either way.
  void fill(StridedView<const float> rk, StridedView<const float> rv) {
    const std::int64_t T = cfg_.context, H = cfg_.heads, d = cfg_.dim;
    if (cfg_.use_cache) {
      cache_.reset();
      cache_.emplace(kp_, vp_, H, d, d, cfg_.local, T, Layout::NHD, cfg_.origins);
      cache_->append(rk, rv);
    } else {
      compress_batch<float>(kp_, cfg_.origins, rk, make_view(ent_k_.data(), j_, H, d));
      compress_batch<float>(vp_, cfg_.origins, rv, make_view(ent_v_.data(), j_, H, d));
    }
  }
};

/// The head outputs of one query over one visible set shared by all heads: `attend` over
/// `kv`, and for knocked-out heads a second call with every compressed entry excluded (entry
/// bias -inf) whose outputs replace theirs (heads are independent in attention).
template <class Attend>
struct SharedHeads {
  const RetrievalConfig& cfg;  ///< The run.
  const VisibleKV<float>& kv;  ///< What every head sees.
  Attend& attend;              ///< The backend.
  std::vector<float> out_ko;   ///< Outputs with every entry excluded.

  /// `out[h * d + i]` for every head h.
  void operator()(const float* q, const StandardVariant& variant, float* out) {
    const std::int64_t H = cfg.heads, d = cfg.dim;
    attend(q, H, kv, variant, out);
    if (!cfg.knockout.empty()) {
      StandardVariant knocked = variant;
      knocked.entry_bias = -HUGE_VALF;
      out_ko.resize(static_cast<std::size_t>(H * d));
      attend(q, H, kv, knocked, out_ko.data());
      for (std::int64_t h : cfg.knockout)
        std::copy(out_ko.begin() + h * d, out_ko.begin() + (h + 1) * d, out + h * d);
    }
  }
};

/// The head outputs of one query with per-head visible sets: `attend` once per head over its
/// own set (a knocked-out head with entry bias -inf).
template <class Attend>
struct PerHeadSets {
  const RetrievalConfig& cfg;               ///< The run.
  const std::vector<VisibleKV<float>>& kv;  ///< What each head sees.
  Attend& attend;                           ///< The backend.

  /// `out[h * d + i]` for every head h.
  void operator()(const float* q, const StandardVariant& variant, float* out) {
    const std::int64_t d = cfg.dim;
    StandardVariant knocked = variant;
    knocked.entry_bias = -HUGE_VALF;
    for (std::int64_t h = 0; h < cfg.heads; ++h) {
      const bool ko = std::find(cfg.knockout.begin(), cfg.knockout.end(), h) != cfg.knockout.end();
      attend(q + h * d, 1, kv[static_cast<std::size_t>(h)], ko ? knocked : variant, out + h * d);
    }
  }
};

/// The trials of one context: for each residue r and each of cfg.targets_per_group targets, a
/// position p of residue r drawn uniformly over the target blocks, the query gamma * x_p,
/// the head outputs `heads(q, variant, out)` (SharedHeads or PerHeadSets) summed and
/// decoded to the nearest token; recorded in `res`.
template <class Heads>
void run_context_trials(const RetrievalConfig& cfg, const Geometry& g, const TargetRange& tr,
                        const RetrievalContexts& ctx, Rng& rng, Heads&& heads,
                        RetrievalResult& res) {
  const std::int64_t H = cfg.heads, d = cfg.dim, m = tr.modulus;
  std::vector<float> q(static_cast<std::size_t>(H * d)), out(q.size());
  std::vector<double> o(static_cast<std::size_t>(d));
  StandardVariant variant;
  variant.scale = 1.0f;
  const Embeddings& out_table = cfg.task == Task::R1 ? ctx.values() : ctx.keys();
  for (std::int64_t r = 0; r < m; ++r)
    for (std::int64_t k = 0; k < cfg.targets_per_group; ++k) {
      // Position lo + m*b + ((r - lo) mod m) with b uniform over the whole blocks.
      const std::int64_t p = tr.lo + m * rng.below(tr.blocks) + residue(g.origin() + r - tr.lo, m);
      const float* e = ctx.keys()[ctx.token(p)];
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < d; ++i)
          q[static_cast<std::size_t>(h * d + i)] = static_cast<float>(cfg.gamma * e[i]);
      heads(q.data(), variant, out.data());
      for (std::int64_t i = 0; i < d; ++i) {
        double s = 0.0;
        for (std::int64_t h = 0; h < H; ++h) s += out[static_cast<std::size_t>(h * d + i)];
        o[static_cast<std::size_t>(i)] = s;
      }
      const std::int64_t pred = out_table.argmax(o.data());
      const std::int64_t want = cfg.task == Task::R1 ? ctx.value_token(p) : ctx.token(p + 1);
      const bool ok = pred == want;
      res.tally.add_position(p, ok, g.origin());
      res.positions.push_back(p);
      res.predictions.push_back(pred);
      res.correct.push_back(ok ? 1 : 0);
    }
}

}  // namespace detail

/// Runs a retrieval experiment: `contexts` random contexts; in each, `targets_per_group`
/// targets per residue r modulo M (position `lo + M k + r'` with k uniform, so every group
/// has the same distribution of depths); keys compressed with `key_policy`, values with
/// `value_policy` (same geometry, both covering `heads` heads, d_out = d) via
/// phasekv::compress_batch; the query at position T-1 sees what phasekv::reference_visible
/// gives (prefix, entries, raw tail and local window); `attend(q, heads, kv, variant, out)`
/// computes the per-head outputs (variant: scale 1, no cap/bias/sink). Pass NoCompression
/// for both policies for uncompressed attention. `progress(done, total)` is called after each
/// context when set.
///
/// Throws phasekv::invalid_argument for inconsistent settings (vocab < context, policies of
/// different geometries or dims, no room for targets, ...).
template <class KeyPolicy, class ValuePolicy, class Attend>
RetrievalResult run_retrieval(
    const RetrievalConfig& cfg, const KeyPolicy& key_policy, const ValuePolicy& value_policy,
    Attend&& attend, const std::function<void(std::int64_t, std::int64_t)>& progress = {}) {
  const char* where = "phasekv::eval::run_retrieval";
  constexpr bool full = std::is_same<KeyPolicy, NoCompression>::value;
  static_assert(full == std::is_same<ValuePolicy, NoCompression>::value,
                "phasekv::eval::run_retrieval: NoCompression must be used for both branches");
  const Geometry g = detail::check_retrieval<full>(where, cfg, key_policy, value_policy);
  const detail::TargetRange targets = detail::retrieval_targets(where, cfg, g, full);

  Rng rng(cfg.seed);
  detail::RetrievalContexts contexts(cfg, rng);
  RetrievalResult res;
  res.tally = PhaseTally(targets.modulus);
  if constexpr (!full) {
    if (!cfg.origins.empty()) {
      detail::RetrievalVisible<false, KeyPolicy, ValuePolicy> visible(cfg, g, key_policy,
                                                                      value_policy);
      for (std::int64_t c = 0; c < cfg.contexts; ++c) {
        contexts.draw(rng);
        const std::vector<VisibleKV<float>>& kv = visible.heads(contexts.raw_k(), contexts.raw_v());
        detail::run_context_trials(
            cfg, g, targets, contexts, rng,
            detail::PerHeadSets<std::remove_reference_t<Attend>>{cfg, kv, attend}, res);
        if (progress) progress(c + 1, cfg.contexts);
      }
      return res;
    }
  }
  detail::RetrievalVisible<full, KeyPolicy, ValuePolicy> visible(cfg, g, key_policy, value_policy);
  for (std::int64_t c = 0; c < cfg.contexts; ++c) {
    contexts.draw(rng);
    const VisibleKV<float> kv = visible(contexts.raw_k(), contexts.raw_v());
    detail::run_context_trials(
        cfg, g, targets, contexts, rng,
        detail::SharedHeads<std::remove_reference_t<Attend>>{cfg, kv, attend, {}}, res);
    if (progress) progress(c + 1, cfg.contexts);
  }
  return res;
}

}  // namespace eval
PHASEKV_NAMESPACE_END
