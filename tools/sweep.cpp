// phasekv-sweep: runs the idealized retrieval tasks (R1 stored records, R2 induction) through a
// compressor policy, the compressed cache and an attention backend, and prints the per-residue
// report (Wilson intervals, mean/worst/best/gap, homogeneity test, period).
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#if defined(_WIN32)
#include <io.h>
#define PHASEKV_ISATTY(fd) _isatty(fd)
#else
#include <unistd.h>
#define PHASEKV_ISATTY(fd) isatty(fd)
#endif

#include "eval_common.hpp"
#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/compress/max_pool.hpp"
#include "phasekv/compress/offset_select.hpp"
#include "phasekv/compress/uniform_mean.hpp"
#include "phasekv/eval/retrieval.hpp"

namespace {

struct Options {
  std::string task = "R2", policy = "uniform", attention = "kernel";
  std::int64_t window = 8, stride = 8, origin = 0, local = 0, heads = 1, trials = 320;
  std::int64_t per_context = 4, dim = 128, vocab = 1024, context = 512, modulus = 0;
  std::int64_t cycle = 0;
  double gamma = 64.0, sharpness = 30.0, content_scale = 0.0;
  std::vector<std::int64_t> offsets;
  std::uint64_t seed = 1;
  bool quiet = false;
};

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

template <class KP, class VP>
phasekv::eval::RetrievalResult run(const phasekv::eval::RetrievalConfig& cfg, const KP& kp,
                                   const VP& vp, const Options& o) {
  Progress progress;
  auto cb = [&](std::int64_t d, std::int64_t t) { progress(d, t); };
  if (o.attention == "reference")
    return phasekv::eval::run_retrieval(cfg, kp, vp, phasekv::eval::ReferenceAttention{}, cb);
  return phasekv::eval::run_retrieval(cfg, kp, vp, phasekv::eval::KernelAttention{}, cb);
}

std::string describe(const Options& o) {
  std::string s = "task " + o.task + ", policy " + o.policy;
  if (o.policy != "full")
    s += ", W=" + std::to_string(o.window) + " S=" + std::to_string(o.stride) +
         " O=" + std::to_string(o.origin);
  s += ", L=" + std::to_string(o.local) + ", heads " + std::to_string(o.heads);
  if (o.policy == "gated" || o.policy == "select") {
    s += ", key offsets";
    for (std::int64_t r : o.offsets) s += " " + std::to_string(r);
  }
  if (o.cycle != 0) s += ", gates cycled by " + std::to_string(o.cycle);
  s += ", d=" + std::to_string(o.dim) + " N=" + std::to_string(o.vocab) +
       " T=" + std::to_string(o.context) + " gamma=" + std::to_string(o.gamma).substr(0, 5) +
       ", seed " + std::to_string(o.seed);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"phasekv-sweep: per-phase retrieval accuracy of the idealized tasks R1/R2 "
               "through a compressor policy, the compressed cache and attention"};
  Options o;
  phasekv_tools::ReportOutputs out;
  app.add_option("--task", o.task, "R1 (stored records) or R2 (induction)")
      ->check(CLI::IsMember({"R1", "R2"}));
  app.add_option("--policy", o.policy,
                 "uniform (UniformMean), gated (GatedPool, one-hot-like biases at --offsets), "
                 "select (OffsetSelect), max (MaxPool), full (no compression)")
      ->check(CLI::IsMember({"uniform", "gated", "select", "max", "full"}));
  app.add_option("--window,-W", o.window, "Window W")->check(CLI::Range(1, 1 << 20));
  app.add_option("--stride,-S", o.stride, "Stride S")->check(CLI::Range(1, 1 << 20));
  app.add_option("--origin,-O", o.origin, "Origin O (raw prefix length)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--local,-L", o.local, "Local window L of raw tokens")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--heads", o.heads, "Heads (outputs summed)")->check(CLI::Range(1, 64));
  app.add_option("--trials", o.trials, "Trials per residue group")->check(CLI::PositiveNumber);
  app.add_option("--targets-per-context", o.per_context,
                 "Targets per residue group drawn from each context")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", o.seed, "Seed of embeddings, contexts and targets");
  app.add_option("--dim", o.dim, "Embedding dimension d")->check(CLI::Range(1, 1 << 16));
  app.add_option("--vocab", o.vocab, "Vocabulary size N (>= --context)")
      ->check(CLI::Range(2, 1 << 24));
  app.add_option("--context", o.context, "Tokens per context; the query is the last")
      ->check(CLI::Range(2, 1 << 24));
  app.add_option("--gamma", o.gamma, "Query scale")->check(CLI::Range(1e-6, 1e6));
  app.add_option("--modulus,-m", o.modulus, "Residue modulus of the report (default: S)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--offsets", o.offsets,
                 "gated/select: key offset per head (values at offset + 1 for R2, the same "
                 "offset for R1); default: gated spreads the heads evenly over the window, "
                 "select uses offset 0")
      ->delimiter(',');
  app.add_option("--sharpness", o.sharpness,
                 "gated: gate bias of the selected offset (others 0)")
      ->check(CLI::Range(0.0, 1e4));
  app.add_option("--content-scale", o.content_scale,
                 "gated: std of the random content gate weights Z (0: gates from biases only)")
      ->check(CLI::Range(0.0, 1e4));
  app.add_option("--cycle", o.cycle, "gated: gate cycling by delta offsets");
  app.add_option("--attention", o.attention, "kernel (CPU decode kernel) or reference")
      ->check(CLI::IsMember({"kernel", "reference"}));
  app.add_flag("--quiet,-q", o.quiet, "Print only the summary line");
  phasekv_tools::add_report_flags(app, out);
  CLI11_PARSE(app, argc, argv);

  try {
    const bool r2 = o.task == "R2";
    const bool onehot_policy = o.policy == "gated" || o.policy == "select";
    if (!onehot_policy && !o.offsets.empty())
      throw phasekv::invalid_argument("phasekv-sweep: --offsets is only used by --policy "
                                      "gated or select");
    if (o.policy != "gated" && (o.cycle != 0 || app.count("--sharpness") ||
                                app.count("--content-scale")))
      throw phasekv::invalid_argument("phasekv-sweep: --cycle, --sharpness and "
                                      "--content-scale are only used by --policy gated");
    if (o.policy == "full" && (app.count("--window") || app.count("--stride") ||
                               app.count("--origin")))
      throw phasekv::invalid_argument("phasekv-sweep: --policy full has no geometry "
                                      "(--window/--stride/--origin)");
    phasekv::eval::RetrievalConfig cfg;
    cfg.task = r2 ? phasekv::eval::Task::R2 : phasekv::eval::Task::R1;
    cfg.dim = o.dim;
    cfg.vocab = o.vocab;
    cfg.context = o.context;
    cfg.heads = o.heads;
    cfg.gamma = o.gamma;
    cfg.local = o.local;
    cfg.modulus = o.modulus > 0 ? o.modulus : (o.policy == "full" ? o.stride : 0);
    cfg.targets_per_group = o.per_context;
    cfg.contexts = (o.trials + o.per_context - 1) / o.per_context;
    cfg.seed = o.seed;
    if (cfg.contexts * o.per_context != o.trials)
      throw phasekv::invalid_argument("phasekv-sweep: --trials = " + std::to_string(o.trials) +
                                      " must be a multiple of --targets-per-context = " +
                                      std::to_string(o.per_context));
    phasekv::eval::RetrievalResult res;
    if (o.policy == "full") {
      res = run(cfg, phasekv::eval::NoCompression{}, phasekv::eval::NoCompression{}, o);
    } else {
      const phasekv::Geometry g(o.window, o.stride, o.origin);
      if (onehot_policy && o.offsets.empty())  // select: one offset; gated: spread evenly
        for (std::int64_t h = 0; h < o.heads; ++h)
          o.offsets.push_back(o.policy == "select" ? 0 : h * o.window / o.heads);
      if (onehot_policy && static_cast<std::int64_t>(o.offsets.size()) != o.heads)
        throw phasekv::invalid_argument("phasekv-sweep: --offsets has " +
                                        std::to_string(o.offsets.size()) +
                                        " entries, --heads is " + std::to_string(o.heads));
      const std::int64_t shift = r2 ? 1 : 0;
      for (std::int64_t r : o.offsets)
        if (r < 0 || r + shift >= o.window)
          throw phasekv::invalid_argument(
              "phasekv-sweep: --offsets entry " + std::to_string(r) +
              " is invalid (key offset r" + std::string(r2 ? " and value offset r + 1" : "") +
              " must lie in [0, W) = [0, " + std::to_string(o.window) + ")" +
              (r2 && r + 1 == o.window ? "; the boundary phase cannot be covered when W = S"
                                       : "") +
              ")");
      if (o.policy == "uniform") {
        const phasekv::UniformMean p(g, o.dim);
        res = run(cfg, p, p, o);
      } else if (o.policy == "max") {
        const phasekv::MaxPool p(g, o.dim);
        res = run(cfg, p, p, o);
      } else if (o.policy == "select") {
        for (std::int64_t r : o.offsets)
          if (r != o.offsets[0])
            throw phasekv::invalid_argument("phasekv-sweep: --policy select uses one offset for "
                                            "all heads; use --policy gated for per-head offsets");
        const phasekv::OffsetSelect k(g, o.dim, o.offsets[0]), v(g, o.dim, o.offsets[0] + shift);
        res = run(cfg, k, v, o);
      } else {  // gated
        const std::int64_t w = o.window;
        std::vector<float> kb(static_cast<std::size_t>(o.heads * w), 0.0f), vb(kb.size(), 0.0f);
        for (std::int64_t h = 0; h < o.heads; ++h) {
          kb[static_cast<std::size_t>(h * w + o.offsets[static_cast<std::size_t>(h)])] =
              static_cast<float>(o.sharpness);
          vb[static_cast<std::size_t>(h * w + o.offsets[static_cast<std::size_t>(h)] + shift)] =
              static_cast<float>(o.sharpness);
        }
        std::vector<float> z;
        phasekv::ParamView zv;
        if (o.content_scale > 0.0) {
          phasekv::eval::Rng rng(o.seed ^ 0x5a5a5a5aULL);
          z.resize(static_cast<std::size_t>(o.heads * w * o.dim));
          for (float& x : z) x = static_cast<float>(o.content_scale * rng.normal());
          zv = phasekv::param_view(z.data(), {o.heads, w, 1, o.dim});
        }
        const phasekv::GatedPool k =
            phasekv::GatedPool(g, o.heads, o.dim, o.dim, phasekv::GateKind::scalar, zv,
                               phasekv::param_view(kb.data(), {o.heads, w, 1}))
                .cycled(o.cycle);
        const phasekv::GatedPool v =
            phasekv::GatedPool(g, o.heads, o.dim, o.dim, phasekv::GateKind::scalar, zv,
                               phasekv::param_view(vb.data(), {o.heads, w, 1}))
                .cycled(o.cycle);
        res = run(cfg, k, v, o);
      }
    }
    const phasekv::eval::Summary s = phasekv::eval::summarize(res.tally, out.alpha);
    if (!o.quiet)
      std::printf("phasekv-sweep: %s; %lld trials per residue mod %lld\n\n", describe(o).c_str(),
                  static_cast<long long>(o.trials), static_cast<long long>(s.modulus));
    phasekv_tools::emit_report(s, out, describe(o), o.quiet);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
