// The mitigation study at equal memory (issue 28): every design of
// phasekv/eval/mitigations.hpp measured on R1 and R2 through the compressed cache and the CPU
// decode kernel with the best hand-set gates, and on R2 with the gates the idealized induction
// model learns by gradient flow over several seeds; plus memory and decode work relative to
// uniform pooling. Runs the study with 4 heads (the paper's idealized model) and with 8 heads
// (as many heads as phases) and writes the tables (mitigations.md) and the combined plot
// (mitigations.svg).
//
// Usage: example_mitigations [--quick] [--seeds N] [--out DIR]
//   default   5 seeds x 4000 steps, 100 contexts x 3 targets per residue: the figures of
//             docs/mitigations.md (about a minute on 2 cores)
//   --quick   a smoke run of a few seconds (2 seeds x 400 steps, 10 contexts): not the
//             study's figures
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "phasekv/eval/mitigations.hpp"

namespace {

bool write(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  return static_cast<bool>(f);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace phasekv::eval;
  StudyConfig s;
  std::string out = ".";
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--seeds") && i + 1 < argc) {
      s.seeds = std::strtoll(argv[++i], nullptr, 10);
    } else if (!std::strcmp(argv[i], "--out") && i + 1 < argc) {
      out = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--seeds N] [--out DIR]\n", argv[0]);
      return 2;
    }
  }
  if (s.seeds < 1 || s.seeds > 100) {
    std::fprintf(stderr, "--seeds must be in [1, 100]\n");
    return 2;
  }
  if (quick) {
    s.seeds = 2;
    s.train_steps = 400;
    s.contexts = 10;
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<StudyResult> studies;
  std::string md = "# Mitigations at equal memory" +
                   std::string(quick ? " (--quick: a smoke run, not the study's figures)" : "") +
                   "\n\nRegenerate with `example_mitigations" + (quick ? " --quick" : "") +
                   "` (phasekv/eval/mitigations.hpp).\n";
  for (std::int64_t heads : {4, 8}) {
    s.heads = heads;
    std::printf("%lld heads\n", static_cast<long long>(heads));
    studies.push_back(run_study(s, [&](const DesignResult& r) {
      const double sec =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("  %-26s hand-set R2 %s\n  %-26s trained R2  %s  (%.1f s)\n",
                  r.design.name.c_str(), summary_line(r.r2).c_str(), "",
                  summary_line(r.trained).c_str(), sec);
    }));
    md += "\n" + to_markdown(studies.back());
  }
  if (!write(out + "/mitigations.md", md) || !write(out + "/mitigations.svg", to_svg(studies))) {
    std::fprintf(stderr, "cannot write the results into '%s'\n", out.c_str());
    return 1;
  }
  std::printf("\n%s\nWritten: %s/mitigations.{md,svg}\n", md.c_str(), out.c_str());
  return 0;
}
