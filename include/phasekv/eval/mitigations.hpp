/// @file
/// @brief The mitigation study at equal memory (issue 28): designs of the chunked compressor
/// that might remove the periodic weak spots, each measured the same way:
///
/// - R1 and R2 through the library (compressed cache, CPU decode kernel) with the best
///   hand-set one-hot gates (run_hand_set);
/// - R2 through the library with the gates the idealized induction model learns by gradient
///   flow (InductionModel, orthonormal limit) over several seeds (run_trained), pooled and per
///   seed;
/// - memory and work per decode step relative to uniform pooling (design_cost).
///
/// Every design keeps the same entries per token (1/S per head) and, except the local-window
/// row, the same raw window (L = 0). examples/mitigations.cpp runs the whole study and writes
/// the table (to_markdown) and the combined plot (to_svg); docs/mitigations.md has the results.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "phasekv/compress/compressed_cache.hpp"
#include "phasekv/compress/fixed_gates.hpp"
#include "phasekv/compress/policy.hpp"
#include "phasekv/compress/uniform_mean.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/eval/induction_model.hpp"
#include "phasekv/eval/report.hpp"
#include "phasekv/eval/retrieval.hpp"
#include "phasekv/eval/stats.hpp"
#include "phasekv/phase/geometry.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace eval {

/// A compressor policy that runs policy A on KV heads `[0, split)` and policy B on heads
/// `[split, heads)` (B sees head `h - split`): different policies across the heads of one
/// cache. A and B must have the same geometry and dims (checked on construction).
template <class A, class B>
class SplitHeads {
 public:
  /// Default: an unusable placeholder.
  constexpr SplitHeads() = default;
  /// Heads `[0, split)` from `a`, `[split, heads)` from `b`. Throws phasekv::invalid_argument
  /// naming the argument when the geometries or dims differ, `split < 1` or `split >= heads`.
  SplitHeads(const A& a, const B& b, std::int64_t split, std::int64_t heads)
      : a_(a), b_(b), split_(split), heads_(heads) {
    check_policy<A>();
    check_policy<B>();
    const char* where = "phasekv::eval::SplitHeads";
    phasekv::detail::check_arg(b.geometry() == a.geometry(), where, "b.geometry().window()",
                               b.geometry().window(), "must equal a's geometry");
    phasekv::detail::check_arg(b.input_dim() == a.input_dim() && b.output_dim() == a.output_dim(),
                               where, "b.output_dim()", b.output_dim(), "dims must equal a's");
    phasekv::detail::check_arg(split >= 1 && split < heads, where, "split", split,
                               "must be in [1, heads)");
  }
  /// The shared geometry.
  PHASEKV_HOST_DEVICE constexpr Geometry geometry() const { return a_.geometry(); }
  /// Channels in.
  PHASEKV_HOST_DEVICE constexpr std::int64_t input_dim() const { return a_.input_dim(); }
  /// Channels out.
  PHASEKV_HOST_DEVICE constexpr std::int64_t output_dim() const { return a_.output_dim(); }
  /// Heads covered.
  PHASEKV_HOST_DEVICE constexpr std::int64_t kv_heads() const { return heads_; }
  /// A's entry for heads below split, B's (head - split) above.
  template <class Load>
  PHASEKV_HOST_DEVICE void compress(std::int64_t kv_head, const Load& x, float* out) const {
    if (kv_head < split_)
      a_.compress(kv_head, x, out);
    else
      b_.compress(kv_head - split_, x, out);
  }

 private:
  A a_{};
  B b_{};
  std::int64_t split_ = 1;
  std::int64_t heads_ = 2;
};

/// One row of the study: a compressor design at equal memory.
struct MitigationDesign {
  std::string name;            ///< Short label, e.g. "overlap W16/S8".
  std::string what;            ///< One sentence for the table.
  std::int64_t window = 8;     ///< W.
  std::int64_t stride = 8;     ///< S.
  bool staggered = false;      ///< Per-head origins `O_h = h * S / H`.
  std::int64_t local = 0;      ///< Local raw window L.
  bool phase_dropout = false;  ///< Gates rotated by a random delta per training step.
  bool mean_head = false;      ///< The last head is uniform mean pooling (untrained).
  bool spread_init = false;    ///< Heads start biased toward distinct phases.
  bool training_only = false;  ///< The design changes training only (hand-set = uniform's).
};

/// The study's rows for stride S: uniform W = S; overlap W = 2S; staggered origins; mixed
/// policies (last head mean pooling); local window L = S; phase dropout; and three designs of
/// our own: a one-token overlap W = S + 1 (the cheapest geometry in which the boundary phase
/// can be served), a phase-spread initialization, and staggered origins with the phase-spread
/// initialization.
inline std::vector<MitigationDesign> mitigation_designs(std::int64_t S = 8) {
  const std::string s = std::to_string(S);
  std::vector<MitigationDesign> d;
  MitigationDesign u;
  u.window = u.stride = S;
  u.name = "uniform W" + s + "/S" + s;
  u.what = "windows tile (W = S), one origin, no raw window";
  d.push_back(u);
  MitigationDesign o = u;
  o.window = 2 * S;
  o.name = "overlap W" + std::to_string(2 * S) + "/S" + s;
  o.what = "windows of 2S every S tokens (learned gates over 2S offsets)";
  d.push_back(o);
  MitigationDesign st = u;
  st.staggered = true;
  st.name = "staggered O_h = hS/H";
  st.what = "head h's windows start at h*S/H (per-head origin)";
  d.push_back(st);
  MitigationDesign mx = u;
  mx.mean_head = true;
  mx.name = "mixed (last head mean)";
  mx.what = "heads 0..H-2 learned gates, head H-1 UniformMean";
  d.push_back(mx);
  MitigationDesign l = u;
  l.local = S;
  l.name = "local L = " + s;
  l.what = "uniform plus the last S tokens raw (L = S vs L = 0)";
  d.push_back(l);
  MitigationDesign pd = u;
  pd.phase_dropout = true;
  pd.training_only = true;
  pd.name = "phase dropout";
  pd.what = "uniform; each training step rotates every gate by a random delta";
  d.push_back(pd);
  MitigationDesign o1 = u;
  o1.window = S + 1;
  o1.name = "overlap W" + std::to_string(S + 1) + "/S" + s + " (ours)";
  o1.what = "one shared token per window: the boundary key sees its successor";
  d.push_back(o1);
  MitigationDesign sp = u;
  sp.spread_init = true;
  sp.training_only = true;
  sp.name = "spread init (ours)";
  sp.what = "uniform; head h starts with a +0.5 logit bias at phase h*S/H (key) and +1 (value)";
  d.push_back(sp);
  MitigationDesign ss = st;
  ss.spread_init = true;
  ss.name = "staggered + spread init (ours)";
  ss.what = "staggered origins; head h starts biased toward phase h*S/H";
  d.push_back(ss);
  return d;
}

/// Per-head origins of a design for `heads` heads (empty when it is not staggered).
inline std::vector<std::int64_t> design_origins(const MitigationDesign& d, std::int64_t heads) {
  std::vector<std::int64_t> o;
  if (d.staggered)
    for (std::int64_t h = 0; h < heads; ++h) o.push_back(h * d.stride / heads);
  return o;
}

/// The in-window key offset by which head h of `d` serves the absolute phase `h * S / H`
/// (positions `p` with `p mod S` equal to it), or the nearest offset below it that the task
/// allows: R2 reads the value at offset + 1, which must lie in the window.
inline std::int64_t design_key_offset(const MitigationDesign& d, std::int64_t heads, std::int64_t h,
                                      Task task) {
  const std::vector<std::int64_t> o = design_origins(d, heads);
  const std::int64_t phase = h * d.stride / heads;
  const std::int64_t origin = o.empty() ? 0 : o[static_cast<std::size_t>(h)];
  std::int64_t r = ((phase - origin) % d.stride + d.stride) % d.stride;
  if (task == Task::R2 && r + 1 >= d.window) r = d.window - 2;
  return r;
}

/// Settings shared by every row of the study.
struct StudyConfig {
  std::int64_t heads = 4;              ///< H (the paper's idealized model has 4).
  std::int64_t seeds = 5;              ///< Training seeds per design (1, 2, ...).
  std::int64_t train_steps = 4000;     ///< Gradient-descent steps per seed.
  std::int64_t train_windows = 8;      ///< Training context T = train_windows * S.
  double gain = 4.0;                   ///< gamma = tau in training; gamma of the retrieval runs.
  double learning_rate = 2.0;          ///< Training step.
  std::int64_t dim = 64;               ///< Embedding dimension of the retrieval runs.
  std::int64_t context = 128;          ///< Tokens per retrieval context (vocabulary the same).
  std::int64_t contexts = 100;         ///< Retrieval contexts per run.
  std::int64_t targets_per_group = 3;  ///< Targets per residue and context.
  std::int64_t min_depth = 32;         ///< Targets at depths [min_depth, max_depth] below the
  std::int64_t max_depth = 95;         ///< query for every design (8 whole residue blocks).
  std::uint64_t eval_seed = 1000;      ///< Seed of the retrieval runs (same for every design).
};

/// Key and value weights `[heads, W]` of FixedGates.
struct DesignGates {
  std::vector<float> key;    ///< Key weights.
  std::vector<float> value;  ///< Value weights.
};

/// The best hand-set gates of a design: head h one-hot at design_key_offset (value at the
/// same offset for R1, the next for R2); with mean_head the last head is uniform.
inline DesignGates hand_set_gates(const MitigationDesign& d, std::int64_t heads, Task task) {
  const std::int64_t W = d.window;
  DesignGates g;
  g.key.assign(static_cast<std::size_t>(heads * W), 0.0f);
  g.value = g.key;
  for (std::int64_t h = 0; h < heads; ++h) {
    if (d.mean_head && h == heads - 1) {
      for (std::int64_t i = 0; i < W; ++i)
        g.key[static_cast<std::size_t>(h * W + i)] = g.value[static_cast<std::size_t>(h * W + i)] =
            1.0f / static_cast<float>(W);
      continue;
    }
    const std::int64_t r = design_key_offset(d, heads, h, task);
    g.key[static_cast<std::size_t>(h * W + r)] = 1.0f;
    g.value[static_cast<std::size_t>(h * W + r + (task == Task::R2 ? 1 : 0))] = 1.0f;
  }
  return g;
}

/// The training settings of design `d` for `seed` (orthonormal limit, T = train_windows * S).
inline InductionConfig training_config(const MitigationDesign& d, const StudyConfig& s,
                                       std::uint64_t seed) {
  InductionConfig c;
  c.window = d.window;
  c.stride = d.stride == d.window ? 0 : d.stride;
  c.windows = s.train_windows;
  c.heads = s.heads;
  c.vocab = s.train_windows * d.stride;
  c.dim = 1;  // the limit loss uses no embeddings
  c.gamma = c.tau = s.gain;
  c.learning_rate = s.learning_rate;
  c.seed = seed;
  c.origins = design_origins(d, s.heads);
  c.local = d.local;
  c.phase_dropout = d.phase_dropout;
  if (d.mean_head) c.mean_heads = {s.heads - 1};
  if (d.spread_init) {
    for (std::int64_t h = 0; h < s.heads; ++h)
      c.init_offsets.push_back(design_key_offset(d, s.heads, h, Task::R2));
    c.init_bias = 0.5;
  }
  return c;
}

/// Runs `task` through the library (CompressedCache, phasekv::cpu::decode) with gates `g` of
/// design `d`: FixedGates over geometry (W, S), SplitHeads with UniformMean for a mean head,
/// per-head origins (RetrievalConfig::origins) for a staggered design, L = d.local. Every
/// design sees the same contexts and target positions (StudyConfig's depths, seed
/// `eval_seed + seed_offset`).
inline RetrievalResult run_design(const MitigationDesign& d, const StudyConfig& s, Task task,
                                  const DesignGates& g, std::uint64_t seed_offset) {
  RetrievalConfig rc;
  rc.task = task;
  rc.dim = s.dim;
  rc.vocab = s.context;
  rc.context = s.context;
  rc.heads = s.heads;
  rc.local = d.local;
  rc.gamma = s.gain;
  rc.contexts = s.contexts;
  rc.targets_per_group = s.targets_per_group;
  rc.min_depth = s.min_depth;
  rc.max_depth = s.max_depth;
  rc.seed = s.eval_seed + seed_offset;
  rc.origins = design_origins(d, s.heads);
  const Geometry geo(d.window, d.stride);
  if (d.mean_head) {
    const FixedGates kp(geo, s.dim, s.heads - 1, g.key.data()),
        vp(geo, s.dim, s.heads - 1, g.value.data());
    const UniformMean mean(geo, s.dim);
    const SplitHeads<FixedGates, UniformMean> k(kp, mean, s.heads - 1, s.heads),
        v(vp, mean, s.heads - 1, s.heads);
    return run_retrieval(rc, k, v, KernelAttention{});
  }
  const FixedGates kp(geo, s.dim, s.heads, g.key.data()), vp(geo, s.dim, s.heads, g.value.data());
  return run_retrieval(rc, kp, vp, KernelAttention{});
}

/// Trains design `d` from `seed` (StudyConfig's steps and gain) and returns the trained
/// weights as FixedGates rows (the model's softmaxes).
inline DesignGates train_design(const MitigationDesign& d, const StudyConfig& s, std::uint64_t seed,
                                std::vector<std::int64_t>* key_offsets = nullptr) {
  InductionModel m(training_config(d, s, seed));
  for (std::int64_t k = 0; k < s.train_steps; ++k) m.step(true);
  const std::vector<double> a = m.key_weights(), b = m.value_weights();
  if (key_offsets) {
    key_offsets->clear();
    for (std::int64_t h = 0; h < s.heads; ++h) key_offsets->push_back(m.key_offset(h));
  }
  return {std::vector<float>(a.begin(), a.end()), std::vector<float>(b.begin(), b.end())};
}

/// Mean, sample standard deviation, min and max of values over seeds.
struct Spread {
  double mean = 0.0;  ///< Mean.
  double sd = 0.0;    ///< Sample standard deviation (0 for one value).
  double min = 0.0;   ///< Smallest.
  double max = 0.0;   ///< Largest.
};

/// Spread of `v` (at least one value).
inline Spread spread_of(const std::vector<double>& v) {
  phasekv::detail::check_arg(!v.empty(), "phasekv::eval::spread_of", "v.size()", v.size(),
                             "must be >= 1");
  Spread s;
  s.min = s.max = v[0];
  for (double x : v) {
    s.mean += x;
    s.min = std::min(s.min, x);
    s.max = std::max(s.max, x);
  }
  s.mean /= static_cast<double>(v.size());
  if (v.size() > 1) {
    double ss = 0.0;
    for (double x : v) ss += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(ss / static_cast<double>(v.size() - 1));
  }
  return s;
}

/// Memory and work of a design relative to uniform pooling (W = S, one origin, L = 0) with
/// the same heads and head dims, averaged over the S context lengths `n in [n0, n0 + S)`.
struct DesignCost {
  double memory = 1.0;    ///< Stored rows (raw prefix + entries + ring of max(W, L)).
  double attend = 1.0;    ///< Rows a decode step attends (prefix + entries + raw), the
                          ///< step's q.k and p.v FLOPs.
  double compress = 1.0;  ///< Compression multiply-adds per token, W / S.
};

/// design_cost's rows of one design at length n, summed over heads: {stored, attended}.
inline std::pair<double, double> design_rows(const MitigationDesign& d, std::int64_t heads,
                                             std::int64_t n) {
  const std::vector<std::int64_t> o = design_origins(d, heads);
  double stored = 0.0, attended = 0.0;
  for (std::int64_t h = 0; h < heads; ++h) {
    const Geometry g(d.window, d.stride, o.empty() ? 0 : o[static_cast<std::size_t>(h)]);
    const CacheExtents e = cache_extents(g, d.local, n);
    stored += static_cast<double>(e.prefix_tokens + e.entries + e.ring_tokens);
    attended += static_cast<double>(g.visible(n, d.local).total());
  }
  return {stored, attended};
}

/// Cost of `d` relative to uniform W = S (same stride and heads) at context lengths
/// `[n0, n0 + S)` (averaged).
inline DesignCost design_cost(const MitigationDesign& d, std::int64_t heads, std::int64_t n0) {
  MitigationDesign u;
  u.window = u.stride = d.stride;
  double ds = 0, da = 0, us = 0, ua = 0;
  for (std::int64_t n = n0; n < n0 + d.stride; ++n) {
    const auto a = design_rows(d, heads, n), b = design_rows(u, heads, n);
    ds += a.first;
    da += a.second;
    us += b.first;
    ua += b.second;
  }
  DesignCost c;
  c.memory = ds / us;
  c.attend = da / ua;
  c.compress = static_cast<double>(d.window) / static_cast<double>(d.stride);
  return c;
}

/// The measurements of one design.
struct DesignResult {
  MitigationDesign design;        ///< The row.
  Summary r1;                     ///< R1, best hand-set gates.
  Summary r2;                     ///< R2, best hand-set gates.
  Summary trained;                ///< R2 with trained gates, counts pooled over seeds.
  std::vector<Summary> per_seed;  ///< R2 with the gates of each seed.
  std::vector<std::vector<std::int64_t>> key_offsets;  ///< Trained key offset per head, seed.
  Spread seed_mean;      ///< Per-seed mean accuracy over seeds (fractions).
  Spread seed_worst;     ///< Per-seed worst-residue accuracy over seeds (fractions).
  Spread seed_gap;       ///< Per-seed gap over seeds (percentage points).
  double covered = 0.0;  ///< Mean distinct absolute phases the heads key on.
  DesignCost cost;       ///< Relative to uniform.
};

/// Distinct absolute phases `(O_h + key offset) mod S` that the heads key on.
inline std::int64_t covered_phases(const MitigationDesign& d, std::int64_t heads,
                                   const std::vector<std::int64_t>& key_offsets) {
  const std::vector<std::int64_t> o = design_origins(d, heads);
  std::set<std::int64_t> p;
  for (std::int64_t h = 0; h < heads; ++h) {
    if (d.mean_head && h == heads - 1) continue;
    p.insert(((o.empty() ? 0 : o[static_cast<std::size_t>(h)]) +
              key_offsets[static_cast<std::size_t>(h)]) %
             d.stride);
  }
  return static_cast<std::int64_t>(p.size());
}

/// Measures one design: hand-set R1 and R2, then `s.seeds` trained models (seeds 1, 2, ...)
/// on R2 (each with its own retrieval seed, eval_seed + seed), pooled and per seed, and the
/// cost at n0 = 4096. `progress(text)` is called after each piece when set.
inline DesignResult measure_design(const MitigationDesign& d, const StudyConfig& s,
                                   const std::function<void(const std::string&)>& progress = {}) {
  DesignResult res;
  res.design = d;
  res.cost = design_cost(d, s.heads, 4096);
  res.r1 = summarize(run_design(d, s, Task::R1, hand_set_gates(d, s.heads, Task::R1), 0).tally);
  res.r2 = summarize(run_design(d, s, Task::R2, hand_set_gates(d, s.heads, Task::R2), 0).tally);
  if (progress) progress(d.name + ": hand-set done");
  PhaseTally pooled(d.stride);
  std::vector<double> means, worsts, gaps;
  double covered = 0.0;
  for (std::int64_t k = 1; k <= s.seeds; ++k) {
    std::vector<std::int64_t> offsets;
    const DesignGates g = train_design(d, s, static_cast<std::uint64_t>(k), &offsets);
    const RetrievalResult rr = run_design(d, s, Task::R2, g, static_cast<std::uint64_t>(k));
    pooled.merge(rr.tally);
    res.per_seed.push_back(summarize(rr.tally));
    res.key_offsets.push_back(offsets);
    means.push_back(res.per_seed.back().mean);
    worsts.push_back(res.per_seed.back().worst);
    gaps.push_back(res.per_seed.back().gap_pp);
    covered += static_cast<double>(covered_phases(d, s.heads, offsets));
    if (progress) progress(d.name + ": seed " + std::to_string(k) + " done");
  }
  res.trained = summarize(pooled);
  res.seed_mean = spread_of(means);
  res.seed_worst = spread_of(worsts);
  res.seed_gap = spread_of(gaps);
  res.covered = covered / static_cast<double>(s.seeds);
  return res;
}

namespace detail {

inline std::string fixed(double x, int digits) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

// "52.6 [48.1, 57.0]": a fraction with the Wilson interval of its group.
inline std::string with_ci(const GroupStats& g) {
  return pct(g.accuracy) + " [" + pct(g.ci_low) + ", " + pct(g.ci_high) + "]";
}

// Mean, worst (with its interval), gap, p and period of one summary, as table cells.
inline std::string summary_cells(const Summary& s) {
  return pct(s.mean) + " | " + with_ci(s.groups[static_cast<std::size_t>(s.worst_residue)]) +
         " | " + fixed(s.gap_pp, 1) + " | " + p_text(s.homogeneity_p) + " / " +
         std::to_string(s.period) + " |";
}

}  // namespace detail

/// The whole study for one StudyConfig: every design of mitigation_designs(8).
struct StudyResult {
  StudyConfig config;              ///< Its settings.
  std::vector<DesignResult> rows;  ///< One per design.
};

/// Runs measure_design for every design of mitigation_designs(8) under `s`.
inline StudyResult run_study(const StudyConfig& s,
                             const std::function<void(const DesignResult&)>& done = {}) {
  StudyResult r;
  r.config = s;
  for (const MitigationDesign& d : mitigation_designs(8)) {
    r.rows.push_back(measure_design(d, s));
    if (done) done(r.rows.back());
  }
  return r;
}

/// The study's tables in Markdown: hand-set R1 and R2; trained R2 (pooled over seeds, with the
/// spread over seeds and the phases the heads key on); cost relative to uniform.
inline std::string to_markdown(const StudyResult& study) {
  const StudyConfig& s = study.config;
  std::ostringstream os;
  os << "**" << s.heads << " heads, hand-set gates** (one-hot at the best offsets), through the "
     << "kernels: " << s.contexts * s.targets_per_group << " trials per residue.\n\n"
     << "| design | R1 mean % | R1 worst % [95 % CI] | R1 gap pp | R1 p / period "
        "| R2 mean % | R2 worst % [95 % CI] | R2 gap pp | R2 p / period |\n"
     << "|:--|--:|--:|--:|--:|--:|--:|--:|--:|\n";
  for (const DesignResult& r : study.rows)
    os << "| " << r.design.name << (r.design.training_only ? " (= uniform at inference)" : "")
       << " | " << detail::summary_cells(r.r1) << ' ' << detail::summary_cells(r.r2) << '\n';
  os << "\n**" << s.heads << " heads, trained gates** (gradient flow, " << s.seeds << " seeds x "
     << s.train_steps << " steps, gain " << detail::fixed(s.gain, 0)
     << "), R2 through the kernels, counts pooled over seeds ("
     << s.seeds * s.contexts * s.targets_per_group
     << " trials per residue); spread over seeds as mean +- sd [min, max]; phases keyed: "
        "distinct absolute phases the trained heads key on (mean over seeds).\n\n"
     << "| design | mean % | worst % [95 % CI] | gap pp | p / period | seed mean % | seed worst % "
        "| seed gap pp | phases keyed |\n"
     << "|:--|--:|--:|--:|--:|--:|--:|--:|--:|\n";
  const auto sp = [](const Spread& x, double k) {
    return detail::fixed(k * x.mean, 1) + " +- " + detail::fixed(k * x.sd, 1) + " [" +
           detail::fixed(k * x.min, 1) + ", " + detail::fixed(k * x.max, 1) + "]";
  };
  for (const DesignResult& r : study.rows)
    os << "| " << r.design.name << " | " << detail::summary_cells(r.trained) << ' '
       << sp(r.seed_mean, 100) << " | " << sp(r.seed_worst, 100) << " | " << sp(r.seed_gap, 1)
       << " | " << detail::fixed(r.covered, 1) << " of " << r.design.stride << " |\n";
  os << "\n**Cost** relative to uniform W = S (same heads, dims and stride), averaged over "
        "n in [4096, 4096 + S):\n\n"
     << "| design | memory (stored rows) | decode FLOPs (attended rows) | compression work per "
        "token (W/S) |\n|:--|--:|--:|--:|\n";
  for (const DesignResult& r : study.rows)
    os << "| " << r.design.name << " | " << detail::fixed(r.cost.memory, 4) << " | "
       << detail::fixed(r.cost.attend, 4) << " | " << detail::fixed(r.cost.compress, 3) << " |\n";
  return os.str();
}

/// The combined plot: one row of panels per design; for each study two columns, R2 with the
/// best hand-set gates and R2 with trained gates pooled over seeds. Each panel is report.hpp's
/// accuracy-vs-residue plot (to_svg(Summary)) scaled into its cell. Studies must have the same
/// designs.
inline std::string to_svg(const std::vector<StudyResult>& studies) {
  const double pw = 430, ph = 210, top = 34;
  std::size_t rows = 0;
  for (const StudyResult& s : studies) rows = std::max(rows, s.rows.size());
  const double w = 2 * pw * static_cast<double>(studies.size()),
               h = top + ph * static_cast<double>(rows);
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\"" << h
     << "\" viewBox=\"0 0 " << w << " " << h << "\" font-family=\"sans-serif\">\n"
     << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
     << "<text x=\"" << w / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">"
     << "Mitigations at equal memory: R2 accuracy by residue (hand-set gates | trained gates, "
        "pooled over seeds)</text>\n";
  // A panel is report.hpp's plot with its outer size replaced by the cell's (viewBox kept, so
  // it scales) and placed by x/y.
  const auto panel = [&](const Summary& s, const std::string& title, double x, double y) {
    const std::string svg = to_svg(s, title);
    const std::size_t open_end = svg.find('>');
    const std::string open = svg.substr(0, open_end);
    const std::size_t vb = open.find("viewBox=\"");
    const std::size_t vb_end = open.find('"', vb + 9);
    os << "<svg class=\"panel\" x=\"" << x << "\" y=\"" << y << "\" width=\"" << pw
       << "\" height=\"" << ph << "\" " << open.substr(vb, vb_end + 1 - vb)
       << " font-family=\"sans-serif\" font-size=\"12\">" << svg.substr(open_end + 1);
  };
  for (std::size_t k = 0; k < studies.size(); ++k) {
    const std::string heads = std::to_string(studies[k].config.heads) + " heads";
    for (std::size_t i = 0; i < studies[k].rows.size(); ++i) {
      const DesignResult& r = studies[k].rows[i];
      const double x = 2 * pw * static_cast<double>(k), y = top + ph * static_cast<double>(i);
      panel(r.r2, r.design.name + ", " + heads + ", hand-set", x, y);
      panel(r.trained, r.design.name + ", " + heads + ", trained", x + pw, y);
    }
  }
  os << "</svg>\n";
  return os.str();
}

}  // namespace eval
PHASEKV_NAMESPACE_END
