// phasekv-sweep: runs the idealized retrieval tasks (R1 stored records, R2 induction) through a
// compressor policy, the compressed cache and an attention backend, and prints the per-residue
// report (Wilson intervals, mean/worst/best/gap, homogeneity test, period). --knockout removes
// heads' compressed entries; --specialization-map knocks out each head in turn and prints the
// heads x residues map of accuracy drops; --policy trained trains the idealized induction model's
// gates first (gradient flow, as examples/induction_training.cpp). --policy dsv4-csa / dsv4-hca
// run the tasks through a DeepSeek-V4 layer (the dsv4 compressor with idealized scores, an
// idealized indexer and dsv4::sparse_attention; phasekv/eval/dsv4_retrieval.hpp).
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#if defined(_WIN32)
#include <io.h>
#define PHASEKV_ISATTY(fd) _isatty(fd)
#else
#include <unistd.h>
#define PHASEKV_ISATTY(fd) isatty(fd)
#endif

#include "eval_common.hpp"
#include "phasekv/compress/compressed_cache.hpp"
#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/compress/max_pool.hpp"
#include "phasekv/compress/offset_select.hpp"
#include "phasekv/compress/uniform_mean.hpp"
#include "phasekv/compress/fixed_gates.hpp"
#include "phasekv/eval/dsv4_retrieval.hpp"
#include "phasekv/eval/induction_model.hpp"
#include "phasekv/eval/retrieval.hpp"
#include "phasekv/eval/specialization.hpp"

namespace {

using phasekv_tools::UsageError;

struct Options {
  std::string task = "R2", policy = "uniform", attention = "kernel";
  std::int64_t window = 8, stride = 8, origin = 0, local = 0, heads = 1, trials = 320;
  std::int64_t per_context = 4, dim = 128, vocab = 1024, context = 512, modulus = 0;
  std::int64_t cycle = 0;
  double gamma = 64.0, sharpness = 30.0, content_scale = 0.0;
  std::vector<std::int64_t> offsets, knockout, origins;
  std::uint64_t seed = 1, train_seed = 11;
  std::int64_t train_steps = 4000;
  bool quiet = false, specialization_map = false;
  double alpha = phasekv::eval::kDefaultPeriodAlpha;  // --alpha, for the map's summaries
  double max_memory = 0.0;
  // dsv4-csa / dsv4-hca
  std::string indexer = "lightning";
  std::int64_t raw_window = 128, top_k = 16, index_offset = 0, min_depth = 0, max_depth = 0;
  double index_sharpness = 0.0, index_noise = 0.0;
};

bool is_dsv4(const Options& o) { return o.policy == "dsv4-csa" || o.policy == "dsv4-hca"; }

// Progress bar on stderr: only on a terminal, and only once the run has taken over a second.
class Progress {
 public:
  Progress() : enabled_(PHASEKV_ISATTY(2) != 0), start_(std::chrono::steady_clock::now()) {}
  void operator()(std::int64_t done, std::int64_t total) {
    if (!enabled_) return;
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (secs < 1.0 && done < total) return;
    if (secs < 1.0 && !shown_) return;
    const int width = 40;
    const int fill = static_cast<int>(width * done / total);
    std::fprintf(stderr, "\r[%s%s] %3d%% (%lld/%lld contexts)", std::string(fill, '#').c_str(),
                 std::string(width - fill, ' ').c_str(), static_cast<int>(100 * done / total),
                 static_cast<long long>(done), static_cast<long long>(total));
    shown_ = true;
    if (done == total) std::fputs("\n", stderr);
    std::fflush(stderr);
  }

 private:
  bool enabled_, shown_ = false;
  std::chrono::steady_clock::time_point start_;
};

// What one run gives: the tally of a retrieval run, or (--specialization-map) the map.
struct Outcome {
  phasekv::eval::RetrievalResult result;
  phasekv::eval::SpecializationMap map;
  std::string trained;  // --policy trained: the trained heads, for the header
  std::string footer;   // --policy dsv4-*: the selection's hit rate, printed after the report
};

template <class KP, class VP, class Attend>
Outcome run_with(const phasekv::eval::RetrievalConfig& cfg, const KP& kp, const VP& vp,
                 const Options& o, Attend attend) {
  Progress progress;
  auto cb = [&](std::int64_t d, std::int64_t t) { progress(d, t); };
  Outcome out;
  if constexpr (std::is_same<KP, phasekv::eval::NoCompression>::value) {
    out.result = phasekv::eval::run_retrieval(cfg, kp, vp, attend, cb);  // never a map
  } else if (o.specialization_map) {
    out.map = phasekv::eval::specialization_map(cfg, kp, vp, attend, o.alpha, cb);
  } else {
    out.result = phasekv::eval::run_retrieval(cfg, kp, vp, attend, cb);
  }
  return out;
}

template <class KP, class VP>
Outcome run(const phasekv::eval::RetrievalConfig& cfg, const KP& kp, const VP& vp,
            const Options& o) {
  if (o.attention == "reference")
    return run_with(cfg, kp, vp, o, phasekv::eval::ReferenceAttention{});
  return run_with(cfg, kp, vp, o, phasekv::eval::KernelAttention{});
}

// The layer of a dsv4 run, from the options.
phasekv::eval::Dsv4Config dsv4_config(const Options& o) {
  phasekv::eval::Dsv4Config c;
  c.layer = o.policy == "dsv4-csa" ? phasekv::eval::Dsv4Layer::csa : phasekv::eval::Dsv4Layer::hca;
  c.ratio = o.stride;
  c.window = o.raw_window;
  c.offsets = o.offsets;
  c.sharpness = o.sharpness;
  c.content_scale = o.content_scale;
  c.indexer = o.indexer == "all"      ? phasekv::eval::Dsv4Indexer::all
              : o.indexer == "exact"  ? phasekv::eval::Dsv4Indexer::exact
              : o.indexer == "oracle" ? phasekv::eval::Dsv4Indexer::oracle
                                      : phasekv::eval::Dsv4Indexer::lightning;
  c.top_k = o.top_k;
  c.index_sharpness = o.index_sharpness;
  c.index_offset = o.index_offset;
  c.index_noise = o.index_noise;
  c.min_depth = o.min_depth;
  c.max_depth = o.max_depth;
  return c;
}

std::string describe_dsv4(const Options& o) {
  const phasekv::eval::Dsv4Config c = dsv4_config(o);
  const auto num = [](double v) { return std::to_string(v).substr(0, 5); };
  std::string s = "task " + o.task + ", policy " + o.policy + ", S=" + std::to_string(c.stride()) +
                  " W=" + std::to_string(c.coff() * c.stride()) + ", window " +
                  std::to_string(c.window) + ", pooling ";
  if (c.offsets.empty()) {
    s += "uniform";
  } else {
    s += "key offsets";
    for (std::int64_t r : c.offsets) s += " " + std::to_string(r);
    s += " (ape " + num(c.sharpness) + ")";
  }
  if (c.content_scale > 0.0) s += ", score noise " + num(c.content_scale);
  if (c.layer == phasekv::eval::Dsv4Layer::csa) {
    s += ", indexer " + o.indexer;
    if (o.indexer != "all") s += " top-" + std::to_string(c.top_k);
    if (o.indexer == "lightning" && c.index_sharpness != 0.0)
      s += " (ape " + num(c.index_sharpness) + " at " + std::to_string(c.index_offset) + ")";
    if (o.indexer != "all" && c.index_noise > 0.0) s += " noise " + num(c.index_noise);
  }
  s += ", depths " + std::to_string(c.first_depth()) + ".." +
       (c.max_depth > 0 ? std::to_string(c.max_depth) : std::string("max")) +
       ", d=" + std::to_string(o.dim) + " N=" + std::to_string(o.vocab) +
       " T=" + std::to_string(o.context) + " gamma=" + num(o.gamma) + ", seed " +
       std::to_string(o.seed);
  return s;
}

std::string describe(const Options& o) {
  if (is_dsv4(o)) return describe_dsv4(o);
  std::string s = "task " + o.task + ", policy " + o.policy;
  if (o.policy != "full") s += ", W=" + std::to_string(o.window) + " S=" + std::to_string(o.stride);
  if (o.policy != "full" && o.origins.empty()) s += " O=" + std::to_string(o.origin);
  if (!o.origins.empty()) {
    s += " origins";
    for (std::int64_t v : o.origins) s += " " + std::to_string(v);
  }
  s += ", L=" + std::to_string(o.local) + ", heads " + std::to_string(o.heads);
  if (o.policy == "gated" || o.policy == "select") {
    s += ", key offsets";
    for (std::int64_t r : o.offsets) s += " " + std::to_string(r);
  }
  if (o.cycle != 0) s += ", gates cycled by " + std::to_string(o.cycle);
  if (o.policy == "trained")
    s += ", gates trained " + std::to_string(o.train_steps) + " steps (train seed " +
         std::to_string(o.train_seed) + ")";
  if (!o.knockout.empty()) {
    s += ", heads knocked out:";
    for (std::int64_t h : o.knockout) s += " " + std::to_string(h);
  }
  s += ", d=" + std::to_string(o.dim) + " N=" + std::to_string(o.vocab) +
       " T=" + std::to_string(o.context) + " gamma=" + std::to_string(o.gamma).substr(0, 5) +
       ", seed " + std::to_string(o.seed);
  return s;
}

// Memory the run takes, term by term (from the allocations of phasekv::eval::run_retrieval,
// the compressed cache and the report), for the refusal of runs that cannot fit.
std::vector<phasekv_tools::MemoryItem> memory_estimate(const Options& o, const phasekv::Geometry& g,
                                                       bool full, std::int64_t modulus) {
  const double f = sizeof(float), T = static_cast<double>(o.context),
               H = static_cast<double>(o.heads), d = static_cast<double>(o.dim),
               N = static_cast<double>(o.vocab);
  const double tables = o.task == "R1" ? 2.0 : 1.0;
  const auto s = [](std::int64_t v) { return std::to_string(v); };
  std::vector<phasekv_tools::MemoryItem> items = {
      {"embeddings of --vocab " + s(o.vocab) + " x --dim " + s(o.dim),
       tables * N * d * f + 2.0 * N * sizeof(std::int64_t)},
      {"raw keys and values of --context " + s(o.context) + " x --heads " + s(o.heads) +
           " x --dim " + s(o.dim),
       2.0 * T * H * d * f},
      {"per-trial records of --trials " + s(o.trials) + " x " + s(modulus) + " residues",
       2.0 * 17.0 * static_cast<double>(o.trials) * static_cast<double>(modulus)},
      phasekv_tools::report_memory(modulus),
      {"the program", 16.0 * 1024 * 1024},
  };
  if (is_dsv4(o)) {
    const phasekv::eval::Dsv4Config c = dsv4_config(o);
    // raw latent rows, the compressor's kv and score rows, entries, the indexer's rows
    const double rows = T * 2.0 * d * (1.0 + 2.0 * static_cast<double>(c.coff())) +
                        T / static_cast<double>(c.stride()) * (2.0 * d + 2.0 * (d + 1.0)) +
                        4.0 * T * d;
    items.push_back({"latent rows, compressor and indexer inputs of --context " + s(o.context) +
                         " x --dim " + s(o.dim),
                     rows * f});
  } else if (!full) {
    const phasekv::CacheExtents e = phasekv::cache_extents(g, o.local, o.context);
    const double entries = static_cast<double>(e.entries > 0 ? e.entries : 1);
    const double cached = static_cast<double>(e.prefix_tokens + e.entries + e.ring_tokens);
    items.push_back({"compressed entries and cache of --context " + s(o.context) + " / --stride " +
                         s(o.stride) + " x --heads " + s(o.heads) + " x --dim " + s(o.dim),
                     2.0 * (entries + cached) * H * d * f});
  }
  if (o.policy == "gated" && o.content_scale > 0.0)
    items.push_back({"gate weights of --heads " + s(o.heads) + " x --window " + s(o.window) +
                         " x --dim " + s(o.dim),
                     H * static_cast<double>(o.window) * d * f});
  return items;
}

// --- policies: one factory per --policy name ------------------------------------------------

using phasekv::eval::RetrievalConfig;
using phasekv::eval::RetrievalResult;

// The key and value policies of a run are built from the options and the geometry, then run.
using PolicyRun = Outcome (*)(const RetrievalConfig&, const phasekv::Geometry&, const Options&);

Outcome run_full(const RetrievalConfig& cfg, const phasekv::Geometry&, const Options& o) {
  return run(cfg, phasekv::eval::NoCompression{}, phasekv::eval::NoCompression{}, o);
}

Outcome run_uniform(const RetrievalConfig& cfg, const phasekv::Geometry& g, const Options& o) {
  const phasekv::UniformMean p(g, o.dim);
  return run(cfg, p, p, o);
}

Outcome run_max(const RetrievalConfig& cfg, const phasekv::Geometry& g, const Options& o) {
  const phasekv::MaxPool p(g, o.dim);
  return run(cfg, p, p, o);
}

// Value offset of a one-hot head whose key offset is r (R2 reads the successor).
std::int64_t value_shift(const Options& o) { return o.task == "R2" ? 1 : 0; }

Outcome run_select(const RetrievalConfig& cfg, const phasekv::Geometry& g, const Options& o) {
  const phasekv::OffsetSelect k(g, o.dim, o.offsets[0]), v(g, o.dim, o.offsets[0] + value_shift(o));
  return run(cfg, k, v, o);
}

// GatedPool heads with one-hot-like biases (--sharpness at each head's offset), optional
// random content weights (--content-scale), cycled by --cycle.
Outcome run_gated(const RetrievalConfig& cfg, const phasekv::Geometry& g, const Options& o) {
  const std::int64_t w = o.window, shift = value_shift(o);
  std::vector<float> kb(static_cast<std::size_t>(o.heads * w), 0.0f), vb(kb.size(), 0.0f);
  for (std::int64_t h = 0; h < o.heads; ++h) {
    const std::int64_t r = o.offsets[static_cast<std::size_t>(h)];
    kb[static_cast<std::size_t>(h * w + r)] = static_cast<float>(o.sharpness);
    vb[static_cast<std::size_t>(h * w + r + shift)] = static_cast<float>(o.sharpness);
  }
  std::vector<float> z;
  phasekv::ParamView zv;
  if (o.content_scale > 0.0) {
    phasekv::eval::Rng rng(o.seed ^ 0x5a5a5a5aULL);
    z.resize(static_cast<std::size_t>(o.heads * w * o.dim));
    for (float& x : z) x = static_cast<float>(o.content_scale * rng.normal());
    zv = phasekv::param_view(z.data(), {o.heads, w, 1, o.dim});
  }
  const auto gated = [&](std::vector<float>& biases) {
    return phasekv::GatedPool(g, o.heads, o.dim, o.dim, phasekv::GateKind::scalar, zv,
                              phasekv::param_view(biases.data(), {o.heads, w, 1}))
        .cycled(o.cycle);
  };
  return run(cfg, gated(kb), gated(vb), o);
}

// The gates of the paper's idealized induction model (phasekv::eval::InductionModel: W = S =
// --window, --heads heads, 8 windows, vocabulary 64, gamma = tau = 4, step 2, as
// examples/induction_training.cpp) after --train-steps steps of gradient descent on the exact
// orthonormal-limit loss from the initialization of --train-seed, run as FixedGates.
Outcome run_trained(const RetrievalConfig& cfg, const phasekv::Geometry& g, const Options& o) {
  phasekv::eval::InductionConfig ic;
  ic.window = o.window;
  ic.heads = o.heads;
  ic.windows = 8;
  ic.vocab = 8 * o.window;
  ic.dim = 1;  // the limit loss uses no embeddings
  ic.gamma = ic.tau = 4.0;
  ic.learning_rate = 2.0;
  ic.seed = o.train_seed;
  phasekv::eval::InductionModel model(ic);
  for (std::int64_t k = 0; k < o.train_steps; ++k) model.step(true);
  const std::vector<double> a = model.key_weights(), b = model.value_weights();
  const std::vector<float> wk(a.begin(), a.end()), wv(b.begin(), b.end());
  const phasekv::FixedGates kp(g, o.dim, o.heads, wk.data()), vp(g, o.dim, o.heads, wv.data());
  Outcome out = run(cfg, kp, vp, o);
  out.trained = "trained heads (key offset -> value offset, exp(entropy) of the key gate):";
  for (std::int64_t h = 0; h < o.heads; ++h) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " h%lld %lld->%lld (%.2f)", static_cast<long long>(h),
                  static_cast<long long>(model.key_offset(h)),
                  static_cast<long long>(model.value_offset(h)),
                  phasekv::eval::perplexity(&a[static_cast<std::size_t>(h * o.window)], o.window));
    out.trained += buf;
  }
  return out;
}

// A DeepSeek-V4 layer (phasekv::eval::run_dsv4_retrieval); the footer gives, per residue, how
// often an attended entry's window held the target.
Outcome run_dsv4(const RetrievalConfig& cfg, const phasekv::Geometry&, const Options& o) {
  Progress progress;
  Outcome out;
  const phasekv::eval::Dsv4RetrievalResult r = phasekv::eval::run_dsv4_retrieval(
      cfg, dsv4_config(o), [&](std::int64_t d, std::int64_t t) { progress(d, t); });
  out.result = r.retrieval;
  out.footer = "\nattended entries hold the target (% of trials per residue):";
  for (const auto& c : r.selected.counts()) {
    char buf[32];
    std::snprintf(
        buf, sizeof buf, " %.1f",
        c.n > 0 ? 100.0 * static_cast<double>(c.correct) / static_cast<double>(c.n) : 0.0);
    out.footer += buf;
  }
  out.footer += "\n";
  return out;
}

struct Policy {
  const char* name;  // the --policy value
  const char* help;  // what it runs, for --help
  PolicyRun run;
};

const Policy kPolicies[] = {
    {"uniform", "UniformMean", run_uniform},
    {"gated", "GatedPool, one-hot-like biases at --offsets", run_gated},
    {"select", "OffsetSelect", run_select},
    {"max", "MaxPool", run_max},
    {"trained",
     "FixedGates trained by gradient flow on the idealized induction model (needs W = S >= 2)",
     run_trained},
    {"full", "no compression", run_full},
    {"dsv4-csa",
     "DeepSeek-V4 CSA layer: dsv4 compressor (S = 4, W = 8), idealized --indexer, sparse "
     "attention over the --raw-window and the selected entries",
     run_dsv4},
    {"dsv4-hca",
     "DeepSeek-V4 HCA layer: dsv4 compressor (S = 128), every entry plus the --raw-window",
     run_dsv4},
};

const Policy& find_policy(const std::string& name) {
  for (const Policy& p : kPolicies)
    if (name == p.name) return p;
  throw UsageError("--policy " + name + " is unknown");  // CLI11 refuses it first
}

// Writes the map's files (--json, --csv, --markdown, --plot as a heat map), then prints the
// header and the map (or only the findings when `quiet`).
void emit_map(const phasekv::eval::SpecializationMap& m, const phasekv_tools::ReportOutputs& o,
              const phasekv_tools::ReportFiles& r, phasekv_tools::OutputFiles& files,
              const std::string& description, const std::string& header, bool quiet) {
  const std::string title = o.title.empty() ? "Phase specialization map: " + description : o.title;
  if (r.json) *r.json << phasekv::eval::to_json(m);
  if (r.csv) *r.csv << phasekv::eval::to_csv(m);
  if (r.plot) *r.plot << phasekv::eval::to_svg(m, title);
  if (r.markdown) *r.markdown << "# " + title + "\n\n" + phasekv::eval::to_markdown(m);
  files.commit();
  if (quiet) {
    std::fputs(phasekv::eval::specialization_findings(m).c_str(), stdout);
    return;
  }
  std::fputs(header.c_str(), stdout);
  std::fputs(phasekv::eval::to_markdown(m).c_str(), stdout);
}

// --- command line ----------------------------------------------------------------------------

void add_options(CLI::App& app, Options& o, phasekv_tools::ReportOutputs& out) {
  using phasekv_tools::int_range;
  using phasekv_tools::real_range;
  const std::int64_t k20 = std::int64_t{1} << 20, k24 = std::int64_t{1} << 24;
  app.add_option("--task", o.task, "R1 (stored records) or R2 (induction)")
      ->check(CLI::IsMember({"R1", "R2"}));
  std::string policy_help;
  std::vector<std::string> policy_names;
  for (const Policy& p : kPolicies) {
    policy_help += (policy_help.empty() ? "" : ", ") + std::string(p.name) + " (" + p.help + ")";
    policy_names.push_back(p.name);
  }
  app.add_option("--policy", o.policy, policy_help)->check(CLI::IsMember(policy_names));
  int_range<std::int64_t>(app.add_option("--window,-W", o.window, "Window W"), 1, k20);
  int_range<std::int64_t>(app.add_option("--stride,-S", o.stride,
                                         "Stride S (dsv4-*: the ratio, default 4 for CSA, 128 "
                                         "for HCA)"),
                          1, k20);
  int_range<std::int64_t>(app.add_option("--origin,-O", o.origin, "Origin O (raw prefix length)"),
                          0, k24);
  int_range<std::int64_t>(app.add_option("--local,-L", o.local, "Local window L of raw tokens"), 0,
                          k24);
  int_range<std::int64_t>(app.add_option("--heads", o.heads, "Heads (outputs summed)"), 1, 64);
  int_range<std::int64_t>(app.add_option("--trials", o.trials, "Trials per residue group"), 1, k20);
  int_range<std::int64_t>(app.add_option("--targets-per-context", o.per_context,
                                         "Targets per residue group drawn from each context "
                                         "(--trials must be a multiple)"),
                          1, k20);
  int_range<std::uint64_t>(
      app.add_option("--seed", o.seed, "Seed of embeddings, contexts and targets"), 0,
      std::numeric_limits<std::uint64_t>::max());
  int_range<std::int64_t>(app.add_option("--dim", o.dim, "Embedding dimension d"), 1,
                          std::int64_t{1} << 16);
  int_range<std::int64_t>(app.add_option("--vocab", o.vocab, "Vocabulary size N (>= --context)"), 2,
                          k24);
  int_range<std::int64_t>(
      app.add_option("--context", o.context, "Tokens per context; the query is the last"), 2, k24);
  real_range(app.add_option("--gamma", o.gamma, "Query scale"), 1e-6, 1e6);
  int_range<std::int64_t>(
      app.add_option("--modulus,-m", o.modulus, "Residue modulus of the report (default: S)"), 1,
      k20);
  int_range<std::int64_t>(
      app.add_option("--offsets", o.offsets,
                     "gated/select: key offset per head, each < W (values at offset + 1 for R2, "
                     "the same offset for R1); default: gated spreads the heads evenly over the "
                     "window, select uses offset 0; dsv4-*: offsets in the compressor's window "
                     "of 2S (CSA) or S (HCA) that the ape favours, default none (uniform)")
          ->delimiter(','),
      0, k20 - 1);
  real_range(
      app.add_option("--sharpness", o.sharpness,
                     "gated: gate bias of the selected offset (others 0); dsv4-*: the ape bias at "
                     "--offsets"),
      0.0, 1e4);
  real_range(app.add_option("--content-scale", o.content_scale,
                            "gated: std of the random content gate weights Z (0: gates from "
                            "biases only); dsv4-*: std of the random per-token scores"),
             0.0, 1e4);
  int_range<std::int64_t>(
      app.add_option("--cycle", o.cycle, "gated: gate cycling by delta offsets"), -k20, k20);
  app.add_option("--attention", o.attention, "kernel (CPU decode kernel) or reference")
      ->check(CLI::IsMember({"kernel", "reference"}));
  int_range<std::int64_t>(
      app.add_option("--knockout", o.knockout,
                     "Heads H[,H...] to knock out: their compressed entries are excluded from "
                     "their softmax exactly (entry bias -inf), their raw tokens (prefix, raw "
                     "tail, --local window) still count. A head is a KV head of the compressed "
                     "cache (0 .. --heads - 1); each has its own query head here, and the "
                     "outputs of all heads are summed")
          ->delimiter(','),
      0, 63);
  int_range<std::int64_t>(
      app.add_option("--origins", o.origins,
                     "Per-head origins O0,O1,... (staggered windows), one per head (--heads of "
                     "them): head h's windows start at O_h + j*S; targets start at the largest "
                     "O_h, residues stay relative to position 0. Replaces --origin")
          ->delimiter(','),
      0, k24);
  app.add_flag("--specialization-map", o.specialization_map,
               "Print the phase specialization map: for each head, the per-residue accuracy "
               "drop when that head alone is knocked out and the accuracy of that head alone "
               "(heads x residues), the residues each head serves and collisions (two heads "
               "serving one residue); --json, --csv, --markdown and --plot write the map, "
               "--plot as a heat map");
  int_range<std::uint64_t>(
      app.add_option("--train-seed", o.train_seed, "trained: seed of the gates' initialization"), 0,
      std::numeric_limits<std::uint64_t>::max());
  int_range<std::int64_t>(
      app.add_option("--train-steps", o.train_steps, "trained: gradient-descent steps"), 0,
      1000000);
  int_range<std::int64_t>(
      app.add_option("--raw-window", o.raw_window,
                     "dsv4-*: sliding window of raw latent rows (the model's 128; 0: none)"),
      0, k24);
  app.add_option("--indexer", o.indexer,
                 "dsv4-csa: all (no selection), exact (top-k of the attention's own logits plus "
                 "noise), oracle (top-k of 1 for the windows holding the target, 0 else, plus "
                 "noise) or lightning (top-k of <query, the indexer's own compressed keys> plus "
                 "noise)")
      ->check(CLI::IsMember({"all", "exact", "oracle", "lightning"}));
  int_range<std::int64_t>(app.add_option("--top-k", o.top_k, "dsv4-csa: entries selected"), 1,
                          std::int64_t{1} << 30);
  real_range(app.add_option("--index-noise", o.index_noise,
                            "dsv4-csa: std of the Gaussian noise added to each index score"),
             0.0, 1e4);
  real_range(app.add_option("--index-sharpness", o.index_sharpness,
                            "dsv4-csa lightning: ape bias of the indexer's compressor at "
                            "--index-offset (0: uniform pooling)"),
             0.0, 1e4);
  int_range<std::int64_t>(
      app.add_option("--index-offset", o.index_offset,
                     "dsv4-csa lightning: window offset the indexer's compressor favours (< 2S)"),
      0, k20);
  int_range<std::int64_t>(
      app.add_option("--min-depth", o.min_depth,
                     "dsv4-*: targets at least this far before the query (default: --raw-window "
                     "+ 2 W, beyond the window)"),
      2, k24);
  int_range<std::int64_t>(app.add_option("--max-depth", o.max_depth,
                                         "dsv4-*: targets at most this far before the query "
                                         "(default: as deep as the context)"),
                          2, k24);
  app.add_flag("--quiet,-q", o.quiet, "Print only the summary line");
  phasekv_tools::add_report_flags(app, out);
  phasekv_tools::add_max_memory_flag(app, o.max_memory);
}

// The dsv4 policies' flags: theirs only, and the other policies' geometry, heads and attention
// flags refused for them.
void check_dsv4_flags(const CLI::App& app, const Options& o) {
  const char* own[] = {"--raw-window", "--min-depth", "--max-depth"};
  const char* csa_only[] = {"--indexer", "--top-k", "--index-noise", "--index-sharpness",
                            "--index-offset"};
  if (!is_dsv4(o)) {
    for (const char* f : own)
      if (app.count(f))
        throw UsageError(std::string(f) + " is only used by --policy dsv4-csa or dsv4-hca");
  }
  if (o.policy != "dsv4-csa")
    for (const char* f : csa_only)
      if (app.count(f)) throw UsageError(std::string(f) + " is only used by --policy dsv4-csa");
  if (!is_dsv4(o)) return;
  const char* refused[] = {"--window", "--origin",    "--origins",  "--local",
                           "--heads",  "--attention", "--knockout", "--specialization-map"};
  for (const char* f : refused)
    if (app.count(f))
      throw UsageError(std::string(f) + " is not used by --policy " + o.policy +
                       " (the layer has W = 2S (CSA) or S (HCA), one latent and one query, the "
                       "--raw-window and dsv4::sparse_attention)");
  if ((app.count("--index-sharpness") || app.count("--index-offset")) && o.indexer != "lightning")
    throw UsageError("--index-sharpness and --index-offset are only used by --indexer lightning");
  if ((app.count("--top-k") || app.count("--index-noise")) && o.indexer == "all")
    throw UsageError("--top-k and --index-noise are not used by --indexer all (no selection)");
  if (app.count("--sharpness") && o.offsets.empty())
    throw UsageError("--sharpness needs --offsets (without offsets the pooling is uniform)");
}

// Flags that the chosen policy does not use, and counts that do not fit together.
void check_flag_combinations(const CLI::App& app, const Options& o) {
  const bool full = o.policy == "full";
  const bool onehot_policy = o.policy == "gated" || o.policy == "select" || is_dsv4(o);
  if (!onehot_policy && !o.offsets.empty())
    throw UsageError("--offsets is only used by --policy gated, select, dsv4-csa or dsv4-hca");
  if (o.policy != "gated" && app.count("--cycle"))
    throw UsageError("--cycle is only used by --policy gated");
  if (o.policy != "gated" && !is_dsv4(o) &&
      (app.count("--sharpness") || app.count("--content-scale")))
    throw UsageError(
        "--sharpness and --content-scale are only used by --policy gated, dsv4-csa or "
        "dsv4-hca");
  check_dsv4_flags(app, o);
  if (o.policy != "trained" && (app.count("--train-seed") || app.count("--train-steps")))
    throw UsageError("--train-seed and --train-steps are only used by --policy trained");
  if (o.policy == "trained" && (o.window != o.stride || o.window < 2))
    throw UsageError(
        "--policy trained needs --window = --stride >= 2 (the idealized model "
        "tiles); got --window " +
        std::to_string(o.window) + " --stride " + std::to_string(o.stride));
  if (full && (!o.knockout.empty() || o.specialization_map))
    throw UsageError(std::string(o.knockout.empty() ? "--specialization-map" : "--knockout") +
                     " needs a compressor: --policy full has no compressed entries");
  if (o.specialization_map && app.count("--bars"))
    throw UsageError("--bars is not used by --specialization-map (the map is a table)");
  if (o.specialization_map && !o.knockout.empty())
    throw UsageError("--specialization-map knocks out each head in turn; drop --knockout");
  for (std::size_t i = 0; i < o.knockout.size(); ++i) {
    const std::int64_t h = o.knockout[i];
    if (h >= o.heads)
      throw UsageError("--knockout " + std::to_string(h) + " is not a head: heads are 0 .. " +
                       std::to_string(o.heads - 1) + " (--heads " + std::to_string(o.heads) + ")");
    for (std::size_t k = 0; k < i; ++k)
      if (o.knockout[k] == h)
        throw UsageError("--knockout lists head " + std::to_string(h) + " twice");
  }
  if (!o.origins.empty()) {
    if (full) throw UsageError("--origins needs a compressor: --policy full has no windows");
    if (app.count("--origin"))
      throw UsageError(
          "--origin and --origins exclude each other (--origins gives every head's "
          "origin)");
    if (static_cast<std::int64_t>(o.origins.size()) != o.heads)
      throw UsageError("--origins has " + std::to_string(o.origins.size()) +
                       " entries, --heads is " + std::to_string(o.heads));
  }
  if (full && (app.count("--window") || app.count("--stride") || app.count("--origin")))
    throw UsageError("--policy full has no geometry (--window/--stride/--origin)");
  if (o.trials % o.per_context != 0)
    throw UsageError(
        "--trials = " + std::to_string(o.trials) +
        " must be a multiple of --targets-per-context = " + std::to_string(o.per_context));
  if (o.vocab < o.context)
    throw UsageError("--vocab = " + std::to_string(o.vocab) + " must be >= --context = " +
                     std::to_string(o.context) + " (the tokens of a context are distinct)");
}

// Room for targets, as phasekv::eval::run_retrieval places them: positions in
// [O, T - 1 - (L + W + S)] holding at least one block of M consecutive positions.
void check_room_for_targets(const Options& o, std::int64_t modulus) {
  const bool full = o.policy == "full";
  const std::int64_t w = full ? 1 : o.window, st = full ? 1 : o.stride;
  std::int64_t org = full ? 0 : o.origin;
  for (std::int64_t v : o.origins) org = std::max(org, v);
  const std::int64_t hi = o.context - 1 - (o.local + w + st);
  if (hi - org + 1 >= modulus) return;
  const std::string depths = full ? "--local + 2" : "--local + --window + --stride";
  throw UsageError(
      "no room for targets: they lie in [" +
      std::string(full ? "0" : (o.origins.empty() ? "--origin" : "the largest --origins")) +
      ", --context - 1 - (" + depths + ")] = [" + std::to_string(org) + ", " + std::to_string(hi) +
      "], which must hold at least --modulus = " + std::to_string(modulus) + " positions" +
      (o.modulus > 0 ? "" : " (the default modulus is --stride)") + "; raise --context (" +
      std::to_string(o.context) + ") or lower " +
      (full ? "--local (" + std::to_string(o.local) + ")"
            : (o.origins.empty() ? "--origin (" : "--origins (largest ") + std::to_string(org) +
                  "), --local (" + std::to_string(o.local) + "), --window (" +
                  std::to_string(o.window) + ") or --stride (" + std::to_string(o.stride) + ")") +
      (o.modulus > 0 ? " or --modulus" : ""));
}

// The key offsets of gated/select: the defaults (select: 0; gated: spread evenly), then one
// per head, each with its value offset inside the window, and one shared offset for select.
void resolve_offsets(Options& o) {
  if (o.policy != "gated" && o.policy != "select") return;
  if (o.offsets.empty())
    for (std::int64_t h = 0; h < o.heads; ++h)
      o.offsets.push_back(o.policy == "select" ? 0 : h * o.window / o.heads);
  if (static_cast<std::int64_t>(o.offsets.size()) != o.heads)
    throw UsageError("--offsets has " + std::to_string(o.offsets.size()) + " entries, --heads is " +
                     std::to_string(o.heads));
  const bool r2 = o.task == "R2";
  for (std::int64_t r : o.offsets)
    if (r + value_shift(o) >= o.window)
      throw UsageError(
          "--offsets entry " + std::to_string(r) + " is invalid (key offset r" +
          std::string(r2 ? " and value offset r + 1" : "") + " must lie in [0, W) = [0, " +
          std::to_string(o.window) + ")" +
          (r2 && r + 1 == o.window ? "; the boundary phase cannot be covered when W = S" : "") +
          ")");
  if (o.policy == "select")
    for (std::int64_t r : o.offsets)
      if (r != o.offsets[0])
        throw UsageError(
            "--policy select uses one offset for all heads; use --policy gated "
            "for per-head offsets");
}

// The dsv4 layer's settings, checked by the harness before anything runs; a refusal names the
// flag (--offsets, --index-offset, --min-depth / --max-depth / --context).
void check_dsv4_setup(const Options& o, const RetrievalConfig& cfg) {
  const phasekv::eval::Dsv4Config c = dsv4_config(o);
  const std::int64_t w = c.coff() * c.stride(), shift = o.task == "R2" ? 1 : 0;
  for (std::int64_t r : o.offsets)
    if (r + shift >= w)
      throw UsageError("--offsets entry " + std::to_string(r) + " is invalid (key offset r" +
                       (shift ? " and value offset r + 1" : "") + " must lie in [0, " +
                       std::to_string(w) + "), the compressor's window of " + std::to_string(w) +
                       " tokens)");
  if (o.index_offset >= 2 * c.stride())
    throw UsageError("--index-offset " + std::to_string(o.index_offset) +
                     " must be < 2S = " + std::to_string(2 * c.stride()));
  if (o.max_depth > 0 && o.max_depth < c.first_depth())
    throw UsageError("--max-depth " + std::to_string(o.max_depth) + " is below the minimum depth " +
                     std::to_string(c.first_depth()) +
                     (o.min_depth > 0 ? " (--min-depth)" : " (the default: --raw-window + 2W)"));
  try {
    phasekv::eval::dsv4_targets(cfg, c);
  } catch (const phasekv::invalid_argument&) {
    throw UsageError("no room for targets: depths " + std::to_string(c.first_depth()) + ".." +
                     (o.max_depth > 0 ? std::to_string(o.max_depth) : std::string("max")) +
                     " in --context " + std::to_string(o.context) +
                     " must hold at least --modulus positions; raise --context or lower "
                     "--min-depth / --raw-window");
  }
}

RetrievalConfig make_config(const Options& o, std::int64_t modulus) {
  RetrievalConfig cfg;
  cfg.task = o.task == "R2" ? phasekv::eval::Task::R2 : phasekv::eval::Task::R1;
  cfg.dim = o.dim;
  cfg.vocab = o.vocab;
  cfg.context = o.context;
  cfg.heads = o.heads;
  cfg.gamma = o.gamma;
  cfg.local = o.local;
  cfg.modulus = modulus;
  cfg.targets_per_group = o.per_context;
  cfg.contexts = o.trials / o.per_context;
  cfg.seed = o.seed;
  cfg.knockout = o.knockout;
  cfg.origins = o.origins;
  return cfg;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "phasekv-sweep: per-phase retrieval accuracy of the idealized tasks R1/R2 "
      "through a compressor policy, the compressed cache and attention"};
  Options o;
  phasekv_tools::ReportOutputs out;
  add_options(app, o, out);
  if (const int rc = phasekv_tools::parse_args(app, argc, argv, "phasekv-sweep"); rc >= 0)
    return rc;

  return phasekv_tools::run_main("phasekv-sweep", [&]() -> int {
    check_flag_combinations(app, o);
    o.alpha = out.alpha;
    const bool dsv4 = is_dsv4(o);
    if (dsv4 && !app.count("--stride")) o.stride = o.policy == "dsv4-csa" ? 4 : 128;
    if (dsv4) o.window = (o.policy == "dsv4-csa" ? 2 : 1) * o.stride;
    const std::int64_t modulus =
        o.modulus > 0 ? o.modulus : (o.policy == "dsv4-csa" ? 8 : o.stride);
    if (dsv4) {
      check_dsv4_setup(o, make_config(o, modulus));
    } else {
      check_room_for_targets(o, modulus);
    }
    const bool full = o.policy == "full";
    const phasekv::Geometry g =
        full ? phasekv::Geometry(1, 1, 0) : phasekv::Geometry(o.window, o.stride, o.origin);
    resolve_offsets(o);
    phasekv_tools::check_memory(memory_estimate(o, g, full, modulus), o.max_memory);
    phasekv_tools::OutputFiles files;
    const phasekv_tools::ReportFiles report_files = phasekv_tools::open_report_files(files, out);

    const Outcome res = find_policy(o.policy).run(make_config(o, modulus), g, o);
    if (o.specialization_map) {
      emit_map(res.map, out, report_files, files, describe(o),
               "phasekv-sweep: " + describe(o) + "; " + std::to_string(o.trials) +
                   " trials per residue mod " + std::to_string(res.map.modulus) +
                   ", each head knocked out in turn" +
                   (res.trained.empty() ? "" : "\n" + res.trained) + "\n\n",
               o.quiet);
      return 0;
    }
    const phasekv::eval::Summary s = phasekv::eval::summarize(res.result.tally, out.alpha);
    const std::string header =
        o.quiet ? std::string()
                : "phasekv-sweep: " + describe(o) + "; " + std::to_string(o.trials) +
                      " trials per residue mod " + std::to_string(s.modulus) +
                      (res.trained.empty() ? "" : "\n" + res.trained) + "\n\n";
    phasekv_tools::emit_report(s, out, report_files, files, describe(o), header, o.quiet);
    if (!o.quiet) std::fputs(res.footer.c_str(), stdout);
    return 0;
  });
}
