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
#include "phasekv/compress/policy.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/core/view.hpp"
#include "phasekv/eval/stats.hpp"
#include "phasekv/phase/geometry.hpp"
#include "phasekv/phase/residue.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace eval {

/// The retrieval task.
enum class Task : std::uint8_t {
  R1,  ///< stored records: retrieve the value bound to the queried key.
  R2,  ///< induction: retrieve the successor of the queried token.
};

/// "R1" or "R2".
inline const char* to_string(Task t) { return t == Task::R1 ? "R1" : "R2"; }

/// Small deterministic random generator (splitmix64) with portable uniform and normal draws,
/// so that fixed seeds give the same experiments with every standard library.
class Rng {
 public:
  /// Seeds the generator.
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  /// Next 64 random bits.
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Uniform double in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Uniform integer in `[0, n)` (n >= 1; rejection sampling, unbiased).
  std::int64_t below(std::int64_t n) {
    const std::uint64_t un = static_cast<std::uint64_t>(n);
    const std::uint64_t limit = (~std::uint64_t{0}) - (~std::uint64_t{0}) % un;
    std::uint64_t x = next();
    while (x >= limit) x = next();
    return static_cast<std::int64_t>(x % un);
  }
  /// Standard normal draw (Box-Muller).
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u = uniform();
    while (u <= 0.0) u = uniform();
    const double v = uniform();
    const double r = std::sqrt(-2.0 * std::log(u));
    const double two_pi = 6.283185307179586;
    spare_ = r * std::sin(two_pi * v);
    has_spare_ = true;
    return r * std::cos(two_pi * v);
  }

 private:
  std::uint64_t state_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

/// A table of `vocab` random unit vectors in R^dim (Gaussian directions, so nearly
/// equiangular: pairwise cosines are about N(0, 1/dim)).
class Embeddings {
 public:
  /// Draws the table; throws phasekv::invalid_argument for `vocab < 2` or `dim < 1`.
  Embeddings(std::int64_t vocab, std::int64_t dim, std::uint64_t seed) : vocab_(vocab), dim_(dim) {
    ::phasekv::detail::check_arg(vocab >= 2, "phasekv::eval::Embeddings", "vocab", vocab,
                                 "must be >= 2");
    ::phasekv::detail::check_arg(dim >= 1, "phasekv::eval::Embeddings", "dim", dim,
                                 "must be >= 1");
    Rng rng(seed);
    table_.resize(static_cast<std::size_t>(vocab * dim));
    for (std::int64_t t = 0; t < vocab; ++t) {
      double norm = 0.0;
      std::vector<double> v(static_cast<std::size_t>(dim));
      for (double& x : v) {
        x = rng.normal();
        norm += x * x;
      }
      norm = std::sqrt(norm);
      for (std::int64_t i = 0; i < dim; ++i)
        table_[static_cast<std::size_t>(t * dim + i)] =
            static_cast<float>(v[static_cast<std::size_t>(i)] / norm);
    }
  }
  /// Vocabulary size N.
  std::int64_t vocab() const { return vocab_; }
  /// Dimension d.
  std::int64_t dim() const { return dim_; }
  /// The unit vector of `token`.
  const float* operator[](std::int64_t token) const {
    return table_.data() + static_cast<std::size_t>(token * dim_);
  }
  /// The token y maximizing `<o, E(y)>` (the smallest on ties); `o` has dim() entries.
  std::int64_t argmax(const double* o) const {
    std::int64_t best = 0;
    double best_s = -std::numeric_limits<double>::infinity();
    for (std::int64_t y = 0; y < vocab_; ++y) {
      const float* e = (*this)[y];
      double s = 0.0;
      for (std::int64_t i = 0; i < dim_; ++i) s += o[i] * static_cast<double>(e[i]);
      if (s > best_s) {
        best_s = s;
        best = y;
      }
    }
    return best;
  }

 private:
  std::int64_t vocab_, dim_;
  std::vector<float> table_;
};

/// A compressor policy with fixed, query-independent weights per head and in-window offset:
/// entry `e = sum_i w[h][i] x_i`. The weights live in caller memory (`[heads, W]`,
/// row-major; null means uniform 1/W). This is the idealized compressor of the paper's
/// theory (a one-hot row selects one offset); the library's GatedPool with zero content
/// weights and biases `log w` computes the same entries up to float rounding.
class FixedGates {
 public:
  /// Default: W = S = 1, one channel, uniform.
  constexpr FixedGates() = default;
  /// Weights `weights[h * W + i]` for `heads` heads over windows of `geometry` on vectors of
  /// `dim` channels. Throws phasekv::shape_error for `dim < 1` or `heads < 1`.
  FixedGates(const Geometry& geometry, std::int64_t dim, std::int64_t heads,
             const float* weights)
      : geometry_(geometry), dim_(dim), heads_(heads), weights_(weights) {
    ::phasekv::detail::check_arg<shape_error>(dim >= 1, "phasekv::eval::FixedGates", "dim", dim,
                                              "must be >= 1");
    ::phasekv::detail::check_arg<shape_error>(heads >= 1, "phasekv::eval::FixedGates", "heads",
                                              heads, "must be >= 1");
  }
  /// The chunk geometry.
  PHASEKV_HOST_DEVICE constexpr Geometry geometry() const { return geometry_; }
  /// Channels in.
  PHASEKV_HOST_DEVICE constexpr std::int64_t input_dim() const { return dim_; }
  /// Channels out (= input_dim()).
  PHASEKV_HOST_DEVICE constexpr std::int64_t output_dim() const { return dim_; }
  /// Heads the weights cover.
  PHASEKV_HOST_DEVICE constexpr std::int64_t kv_heads() const { return heads_; }
  /// Writes `sum_i w[h][i] x(i, :)` (offset order, fused multiply-adds).
  template <class Load>
  PHASEKV_HOST_DEVICE void compress(std::int64_t kv_head, const Load& x, float* out) const {
    const std::int64_t w = geometry_.window();
    const float uniform = 1.0f / static_cast<float>(w);
    for (std::int64_t c = 0; c < dim_; ++c) out[c] = 0.0f;
    for (std::int64_t i = 0; i < w; ++i) {
      const float a = weights_ ? weights_[kv_head * w + i] : uniform;
      for (std::int64_t c = 0; c < dim_; ++c) out[c] = ::phasekv::detail::fp_fma(a, x(i, c), out[c]);
    }
  }

 private:
  Geometry geometry_{};
  std::int64_t dim_ = 1;
  std::int64_t heads_ = 1;
  const float* weights_ = nullptr;
};

/// Marker "policy" for uncompressed attention: every position of the context stays raw.
struct NoCompression {};

/// Parameters of a retrieval experiment.
struct RetrievalConfig {
  Task task = Task::R1;           ///< R1 or R2.
  std::int64_t dim = 64;          ///< Embedding dimension d.
  std::int64_t vocab = 1024;      ///< Vocabulary size N (>= context).
  std::int64_t context = 512;     ///< Tokens per context T; the query sits at position T-1.
  std::int64_t heads = 1;         ///< Heads (outputs summed); policies must cover them.
  double gamma = 16.0;            ///< Query scale (the attention scale is 1).
  std::int64_t local = 16;        ///< Local window L of raw tokens.
  std::int64_t modulus = 0;       ///< Residue modulus M of the report; 0 = the stride S.
  std::int64_t contexts = 32;     ///< Number of random contexts.
  std::int64_t targets_per_group = 8;  ///< Targets per residue group and context.
  std::int64_t min_depth = 0;     ///< Targets at positions <= T-1-min_depth; 0 = L + W + S.
  std::int64_t max_depth = 0;     ///< Targets at positions >= T-1-max_depth; 0 = as deep as
                                  ///< the origin allows.
  std::uint64_t seed = 1;         ///< Seed of embeddings, contexts and targets.
  /// True: stream each context into a phasekv::CompressedCache and attend over its
  /// visible(); false: phasekv::compress_batch plus phasekv::reference_visible. Both give
  /// bit-identical visible sets.
  bool use_cache = true;
};

/// Outcome of a retrieval experiment.
struct RetrievalResult {
  PhaseTally tally{1};              ///< Per-residue counts.
  std::vector<std::int64_t> positions;  ///< Target position of every trial, in order.
  std::vector<std::int64_t> predictions;  ///< Predicted token of every trial.
  std::vector<char> correct;        ///< 1 when the trial was correct.
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
    ::phasekv::detail::check_arg(kv.count > 0, "phasekv::eval::KernelAttention", "kv.count",
                                 kv.count, "must be > 0 (nothing visible)");
    std::vector<float> lse(static_cast<std::size_t>(q_heads));
    a.out = out;
    a.lse = lse.data();
    cpu::decode(a);
  }
};

namespace detail {

template <class KP>
Geometry retrieval_geometry(const KP& kp, std::true_type) {
  (void)kp;
  return Geometry(1, 1, 0);
}
template <class KP>
Geometry retrieval_geometry(const KP& kp, std::false_type) {
  return kp.geometry();
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
RetrievalResult run_retrieval(const RetrievalConfig& cfg, const KeyPolicy& key_policy,
                              const ValuePolicy& value_policy, Attend&& attend,
                              const std::function<void(std::int64_t, std::int64_t)>& progress =
                                  {}) {
  const char* where = "phasekv::eval::run_retrieval";
  using ::phasekv::detail::check_arg;
  constexpr bool full = std::is_same<KeyPolicy, NoCompression>::value;
  static_assert(full == std::is_same<ValuePolicy, NoCompression>::value,
                "phasekv::eval::run_retrieval: NoCompression must be used for both branches");
  check_arg(cfg.dim >= 1, where, "dim", cfg.dim, "must be >= 1");
  check_arg(cfg.heads >= 1, where, "heads", cfg.heads, "must be >= 1");
  check_arg(cfg.context >= 2, where, "context", cfg.context, "must be >= 2");
  check_arg(cfg.vocab >= cfg.context, where, "vocab", cfg.vocab,
            "must be >= context (tokens of a context are distinct)");
  check_arg(cfg.contexts >= 1, where, "contexts", cfg.contexts, "must be >= 1");
  check_arg(cfg.targets_per_group >= 1, where, "targets_per_group", cfg.targets_per_group,
            "must be >= 1");
  check_arg(std::isfinite(cfg.gamma) && cfg.gamma > 0.0, where, "gamma", cfg.gamma,
            "must be finite and > 0");
  Geometry::check_local(where, "local", cfg.local);
  const Geometry g = detail::retrieval_geometry(key_policy, std::integral_constant<bool, full>{});
  if constexpr (!full) {
    check_policy<KeyPolicy>();
    check_policy<ValuePolicy>();
    check_arg(value_policy.geometry() == g, where, "value_policy.geometry().stride()",
              value_policy.geometry().stride(), "must equal the key policy's geometry");
    check_policy_dims(key_policy, cfg.heads, where, "key_policy");
    check_policy_dims(value_policy, cfg.heads, where, "value_policy");
    check_arg<shape_error>(key_policy.input_dim() == cfg.dim && key_policy.output_dim() == cfg.dim,
                           where, "key_policy.output_dim()", key_policy.output_dim(),
                           "input and output dims must equal dim");
    check_arg<shape_error>(value_policy.input_dim() == cfg.dim &&
                               value_policy.output_dim() == cfg.dim,
                           where, "value_policy.output_dim()", value_policy.output_dim(),
                           "input and output dims must equal dim");
  } else {
    (void)value_policy;
  }
  const std::int64_t m = cfg.modulus > 0 ? cfg.modulus : (full ? 1 : g.stride());
  check_arg(m <= (std::int64_t{1} << 20), where, "modulus", m, "must be <= 2^20");
  const std::int64_t t_query = cfg.context - 1;
  const std::int64_t min_depth =
      cfg.min_depth > 0 ? cfg.min_depth : cfg.local + g.window() + g.stride();
  const std::int64_t hi = t_query - min_depth;
  const std::int64_t lo_default = g.origin();
  const std::int64_t lo =
      cfg.max_depth > 0 ? std::max(lo_default, t_query - cfg.max_depth) : lo_default;
  const std::int64_t blocks = (hi - lo + 1) / m;  // whole residue blocks in [lo, hi]
  check_arg(blocks >= 1, where, "min_depth", min_depth,
            "leaves no room for targets (context too short for the depths and modulus)");

  Rng rng(cfg.seed);
  const Embeddings keys_table(cfg.vocab, cfg.dim, rng.next());
  // R2 reads its values from the key table (not a copy: the table is vocab * dim floats).
  std::optional<Embeddings> r1_values;
  if (cfg.task == Task::R1) r1_values.emplace(cfg.vocab, cfg.dim, rng.next());
  const Embeddings& values_table = r1_values ? *r1_values : keys_table;
  const Embeddings& out_table = cfg.task == Task::R1 ? values_table : keys_table;

  const std::int64_t T = cfg.context, H = cfg.heads, d = cfg.dim;
  std::vector<float> raw_k(static_cast<std::size_t>(T * H * d)), raw_v(raw_k.size());
  const std::int64_t J = full ? 0 : g.complete_windows(T);
  std::vector<float> ent_k(static_cast<std::size_t>((J > 0 ? J : 1) * H * d)), ent_v(ent_k.size());
  std::vector<std::int64_t> perm_x(static_cast<std::size_t>(cfg.vocab)), perm_y(perm_x.size());
  for (std::int64_t i = 0; i < cfg.vocab; ++i)
    perm_x[static_cast<std::size_t>(i)] = perm_y[static_cast<std::size_t>(i)] = i;
  std::vector<float> q(static_cast<std::size_t>(H * d)), out(static_cast<std::size_t>(H * d));
  std::vector<double> o(static_cast<std::size_t>(d));
  StandardVariant variant;
  variant.scale = 1.0f;

  RetrievalResult res;
  res.tally = PhaseTally(m);
  // Holds the live cache of the current context (the visible set points into it).
  using Cache = std::conditional_t<full, int, CompressedCache<float, KeyPolicy, ValuePolicy>>;
  std::vector<Cache> caches;
  for (std::int64_t c = 0; c < cfg.contexts; ++c) {
    // Distinct tokens x (and values y for R1): partial Fisher-Yates over the vocabulary.
    for (std::int64_t t = 0; t < T; ++t) {
      std::swap(perm_x[static_cast<std::size_t>(t)],
                perm_x[static_cast<std::size_t>(t + rng.below(cfg.vocab - t))]);
      if (cfg.task == Task::R1)
        std::swap(perm_y[static_cast<std::size_t>(t)],
                  perm_y[static_cast<std::size_t>(t + rng.below(cfg.vocab - t))]);
    }
    for (std::int64_t t = 0; t < T; ++t) {
      const float* ek = keys_table[perm_x[static_cast<std::size_t>(t)]];
      const float* ev = cfg.task == Task::R1 ? values_table[perm_y[static_cast<std::size_t>(t)]]
                                             : ek;
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < d; ++i) {
          raw_k[static_cast<std::size_t>((t * H + h) * d + i)] = ek[i];
          raw_v[static_cast<std::size_t>((t * H + h) * d + i)] = ev[i];
        }
    }
    const StridedView<const float> rk = make_view<const float>(raw_k.data(), T, H, d);
    const StridedView<const float> rv = make_view<const float>(raw_v.data(), T, H, d);
    VisibleKV<float> kv;
    if constexpr (!full) {
      if (cfg.use_cache) {
        // Stream the context through a compressed cache (one append), then ask what the
        // query at position T-1 sees.
        Cache cache(key_policy, value_policy, H, d, d, cfg.local, T);
        cache.append(rk, rv);
        caches.push_back(std::move(cache));
        kv = caches.back().visible(cfg.local);
      } else {
      compress_batch<float>(key_policy, rk, make_view(ent_k.data(), J, H, d));
      compress_batch<float>(value_policy, rv, make_view(ent_v.data(), J, H, d));
      kv = reference_visible<float>(g, cfg.local, t_query, rk, rv,
                                    make_view<const float>(ent_k.data(), J, H, d),
                                    make_view<const float>(ent_v.data(), J, H, d));
      }
    } else {
      kv.push({rk.slice(0, T), rv.slice(0, T), 0, SegmentKind::raw});
    }
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t k = 0; k < cfg.targets_per_group; ++k) {
        // Position lo + m*b + ((r - lo) mod m) with b uniform over the whole blocks.
        const std::int64_t p = lo + m * rng.below(blocks) + residue(g.origin() + r - lo, m);
        const std::int64_t xp = perm_x[static_cast<std::size_t>(p)];
        const float* e = keys_table[xp];
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t i = 0; i < d; ++i)
            q[static_cast<std::size_t>(h * d + i)] = static_cast<float>(cfg.gamma * e[i]);
        attend(q.data(), H, kv, variant, out.data());
        for (std::int64_t i = 0; i < d; ++i) {
          double s = 0.0;
          for (std::int64_t h = 0; h < H; ++h) s += out[static_cast<std::size_t>(h * d + i)];
          o[static_cast<std::size_t>(i)] = s;
        }
        const std::int64_t pred = out_table.argmax(o.data());
        const std::int64_t want = cfg.task == Task::R1 ? perm_y[static_cast<std::size_t>(p)]
                                                       : perm_x[static_cast<std::size_t>(p + 1)];
        const bool ok = pred == want;
        res.tally.add_position(p, ok, g.origin());
        res.positions.push_back(p);
        res.predictions.push_back(pred);
        res.correct.push_back(ok ? 1 : 0);
      }
    if (progress) progress(c + 1, cfg.contexts);
    if constexpr (!full) caches.clear();
  }
  return res;
}

}  // namespace eval
PHASEKV_NAMESPACE_END
