// Phase through a DeepSeek-V4 layer (phasekv/eval/dsv4_retrieval.hpp): R1/R2 through the dsv4
// compressor with one-hot ape, an idealized indexer and dsv4::sparse_attention. Each case
// asserts with the 95 % Wilson interval of its residue (160 trials per residue, fixed seeds):
// "served" means the lower bound is above 95 %, "not served" that the upper bound is below
// 5 % (0 of 160 gives [0, 2.3] %).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "phasekv/eval/dsv4_retrieval.hpp"
#include "phasekv/eval/report.hpp"
#include "phasekv/eval/stats.hpp"
#include "suite_util.hpp"

namespace {

using phasekv::eval::Dsv4Config;
using phasekv::eval::Dsv4Indexer;
using phasekv::eval::Dsv4Layer;
using phasekv::eval::Dsv4RetrievalResult;
using phasekv::eval::RetrievalConfig;
using phasekv::eval::Summary;
using phasekv::eval::Task;

RetrievalConfig base(Task task, std::uint64_t seed) {
  RetrievalConfig cfg;
  cfg.task = task;
  cfg.dim = 64;
  cfg.vocab = 512;
  cfg.context = 512;
  cfg.heads = 1;
  cfg.gamma = 64.0;
  cfg.contexts = 40;
  cfg.targets_per_group = 4;  // 160 trials per residue
  cfg.seed = seed;
  return cfg;
}

Dsv4Config csa(std::vector<std::int64_t> offsets, Dsv4Indexer indexer, std::int64_t top_k) {
  Dsv4Config c;
  c.layer = Dsv4Layer::csa;
  c.offsets = std::move(offsets);
  c.indexer = indexer;
  c.top_k = top_k;
  return c;
}

Summary run(const char* name, const RetrievalConfig& cfg, const Dsv4Config& c,
            Dsv4RetrievalResult* keep = nullptr) {
  Dsv4RetrievalResult r = phasekv::eval::run_dsv4_retrieval(cfg, c);
  const Summary s = suite::report(name, r.retrieval);
  if (keep != nullptr) *keep = std::move(r);
  return s;
}

// Residues in `served` have Wilson lower bound > 95 %, the others upper bound < 5 %.
void expect_served(const Summary& s, const std::vector<std::int64_t>& served) {
  for (std::int64_t r = 0; r < s.modulus; ++r) {
    const auto& g = s.groups[static_cast<std::size_t>(r)];
    const bool want = std::find(served.begin(), served.end(), r) != served.end();
    if (want)
      EXPECT_GT(g.ci_low, 0.95) << "residue " << r;
    else
      EXPECT_LT(g.ci_high, 0.05) << "residue " << r;
  }
}

// A one-hot compressor gate at window offset 3 (key and value: R1) serves phase 3 of S = 4,
// i.e. residues 3 and 7 mod 8 (period 4), with every entry attended and with a perfect indexer
// (the attention's own logits) keeping a single entry: the selection leaves the curve as it is.
TEST(Dsv4Phase, PerfectIndexerKeepsTheCompressorsPeriod4) {
  const RetrievalConfig cfg = base(Task::R1, 2701);
  const Summary all = run("CSA R1, offset 3, every entry", cfg, csa({3}, Dsv4Indexer::all, 1));
  expect_served(all, {3, 7});
  EXPECT_EQ(all.period, 4);
  Dsv4RetrievalResult r;
  const Summary exact =
      run("CSA R1, offset 3, exact indexer top-1", cfg, csa({3}, Dsv4Indexer::exact, 1), &r);
  expect_served(exact, {3, 7});
  EXPECT_EQ(exact.period, 4);
  // the selection keeps the target's window exactly where the compressor kept the target
  EXPECT_EQ(r.selected[3].correct, r.selected[3].n);
  EXPECT_EQ(r.selected[7].correct, r.selected[7].n);
}

// An indexer that knows where the target is but not how it was pooled ties the two
// overlapping windows that hold it; top-1 keeps the lower one, where the target sits at
// offset S + 3 = 7 (no gate weight), and phase 3 is lost although every selection holds the
// target. Top-2 keeps both windows and the curve comes back.
TEST(Dsv4Phase, OverlapTieLosesThePhaseAtTop1) {
  const RetrievalConfig cfg = base(Task::R1, 2702);
  Dsv4RetrievalResult r;
  const Summary top1 =
      run("CSA R1, offset 3, oracle indexer top-1", cfg, csa({3}, Dsv4Indexer::oracle, 1), &r);
  expect_served(top1, {});
  for (std::int64_t g = 0; g < 8; ++g) EXPECT_EQ(r.selected[g].correct, r.selected[g].n);
  const Summary top2 =
      run("CSA R1, offset 3, oracle indexer top-2", cfg, csa({3}, Dsv4Indexer::oracle, 2));
  expect_served(top2, {3, 7});
}

// A lightning indexer whose own compressor favours another offset selects by its own phase:
// favouring offset 7 (phase 3 in the other half) it picks the window that has no gate weight
// on the target, favouring offset 3 it picks the right one. The layer serves the
// intersection of the two patterns.
TEST(Dsv4Phase, IndexerPhasePreferenceIntersects) {
  const RetrievalConfig cfg = base(Task::R1, 2703);
  Dsv4Config c = csa({3}, Dsv4Indexer::lightning, 2);
  c.index_sharpness = 30.0;
  c.index_offset = 3;
  expect_served(run("CSA R1, offset 3, lightning favouring 3, top-2", cfg, c), {3, 7});
  c.index_offset = 7;
  const Summary other = run("CSA R1, offset 3, lightning favouring 7, top-2", cfg, c);
  for (const auto& g : other.groups) EXPECT_LT(g.ci_high, 0.2);
}

// Noise on the index scores drops the target's window at random, the same at every phase:
// the served residues fall (here to about half) and the others stay at 0, so the period is
// still 4 and residues 3 and 7 stay alike (two-group homogeneity).
TEST(Dsv4Phase, NoisyIndexerScalesTheCurveDown) {
  const RetrievalConfig cfg = base(Task::R1, 2704);
  Dsv4Config c = csa({3}, Dsv4Indexer::lightning, 16);
  c.index_noise = 0.1;
  const Summary s = run("CSA R1, offset 3, lightning top-16, noise 0.1", cfg, c);
  for (std::int64_t r : {3, 7}) {
    EXPECT_LT(s.groups[static_cast<std::size_t>(r)].ci_high, 0.9) << r;
    EXPECT_GT(s.groups[static_cast<std::size_t>(r)].ci_low, 0.2) << r;
  }
  for (std::int64_t r : {0, 1, 2, 4, 5, 6})
    EXPECT_LT(s.groups[static_cast<std::size_t>(r)].ci_high, 0.05) << r;
  phasekv::eval::PhaseTally pair(2);
  for (std::int64_t r : {3, 7})
    for (std::int64_t i = 0; i < s.groups[static_cast<std::size_t>(r)].n; ++i)
      pair.add_residue(r == 3 ? 0 : 1, i < s.groups[static_cast<std::size_t>(r)].correct);
  EXPECT_GT(phasekv::eval::summarize(pair).homogeneity_p, 0.01);
  EXPECT_EQ(s.period, 4);
}

// R2 with the key at offset 3 and the value at offset 4 (the next half of the window): CSA's
// overlap serves the block boundary phase 3, residues 3 and 7.
TEST(Dsv4Phase, R2OverlapServesTheBoundaryPhase) {
  const RetrievalConfig cfg = base(Task::R2, 2705);
  expect_served(run("CSA R2, key 3 value 4, exact top-2", cfg, csa({3}, Dsv4Indexer::exact, 2)),
                {3, 7});
}

// HCA (coff = 1, every entry attended) with a one-hot gate at offset 5 serves residue 5 mod S
// only: measured modulo 2S the period is S (here S = 16 to keep the test small).
TEST(Dsv4Phase, HcaPeriodIsTheRatio) {
  RetrievalConfig cfg = base(Task::R1, 2706);
  cfg.modulus = 32;
  Dsv4Config c;
  c.layer = Dsv4Layer::hca;
  c.ratio = 16;
  c.offsets = {5};
  const Summary s = run("HCA S=16 R1, offset 5", cfg, c);
  expect_served(s, {5, 21});
  EXPECT_EQ(s.period, 16);
}

// Targets inside the sliding window are found from the raw rows at every phase, whatever the
// compressor does (uniform pooling here): flat, period 1. Beyond the window the same uniform
// layer stays below 1/8 + noise at every residue.
TEST(Dsv4Phase, WindowFlattensTheCurve) {
  const RetrievalConfig cfg = base(Task::R1, 2707);
  Dsv4Config c = csa({}, Dsv4Indexer::lightning, 16);
  c.min_depth = 2;
  c.max_depth = 127;
  const Summary in = run("CSA R1, uniform, depths 2..127", cfg, c);
  for (const auto& g : in.groups) EXPECT_GT(g.ci_low, 0.95);
  EXPECT_EQ(in.period, 1);
  c.min_depth = 0;
  c.max_depth = 0;
  const Summary out = run("CSA R1, uniform, beyond the window", cfg, c);
  for (const auto& g : out.groups) EXPECT_LT(g.ci_high, 0.25);
}

// Entry 0 of CSA pools only its current half (tokens [0, S)): with S = 2 and the gate at offset 1
// (the previous half) entry 0 has no gate weight, pools tokens 0 and 1 evenly, and position 0 is
// retrieved about half the time (the value is the mean of two), while positions 2, 4, 6 of the
// same phase are not retrieved at all. Targets at positions 0..7 (residue = position).
TEST(Dsv4Phase, FirstEntryIsAHalfWindow) {
  const RetrievalConfig cfg = base(Task::R1, 2710);
  Dsv4Config c = csa({1}, Dsv4Indexer::all, 1);
  c.ratio = 2;
  c.min_depth = cfg.context - 1 - 7;
  c.max_depth = cfg.context - 1;
  const Summary s = run("CSA S=2 R1, offset 1, positions 0..7", cfg, c);
  EXPECT_GT(s.groups[0].ci_low, 0.3);
  EXPECT_LT(s.groups[0].ci_high, 0.7);
  for (std::size_t r : {2u, 4u, 6u}) EXPECT_LT(s.groups[r].ci_high, 0.05) << r;
  for (std::size_t r : {1u, 3u, 5u, 7u}) EXPECT_GT(s.groups[r].ci_low, 0.95) << r;
}

TEST(Dsv4Phase, SameSeedSameTrials) {
  const RetrievalConfig cfg = base(Task::R2, 2708);
  Dsv4Config c = csa({2}, Dsv4Indexer::lightning, 4);
  c.index_noise = 0.05;
  c.content_scale = 0.5;
  const auto a = phasekv::eval::run_dsv4_retrieval(cfg, c);
  const auto b = phasekv::eval::run_dsv4_retrieval(cfg, c);
  EXPECT_EQ(a.retrieval.positions, b.retrieval.positions);
  EXPECT_EQ(a.retrieval.predictions, b.retrieval.predictions);
  for (std::size_t i = 0; i < a.retrieval.positions.size(); ++i)
    EXPECT_EQ(a.retrieval.positions[i] % 8, static_cast<std::int64_t>(i / 4 % 8)) << i;
}

TEST(Dsv4Phase, RefusesBadSettings) {
  const RetrievalConfig cfg = base(Task::R2, 2709);
  const auto refuses = [](const RetrievalConfig& rc, const Dsv4Config& c, const char* name) {
    try {
      phasekv::eval::run_dsv4_retrieval(rc, c);
      ADD_FAILURE() << "accepted a bad " << name;
    } catch (const phasekv::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  refuses(cfg, csa({7}, Dsv4Indexer::all, 1), "dsv4.offsets[]");  // value offset 8
  RetrievalConfig two = cfg;
  two.heads = 2;
  refuses(two, csa({}, Dsv4Indexer::all, 1), "heads");
  Dsv4Config c = csa({}, Dsv4Indexer::lightning, 1);
  c.index_offset = 8;
  refuses(cfg, c, "dsv4.index_offset");
  c = csa({}, Dsv4Indexer::lightning, 0);
  refuses(cfg, c, "dsv4.top_k");
  c = csa({}, Dsv4Indexer::lightning, 1);
  c.min_depth = 1;
  refuses(cfg, c, "dsv4.min_depth");
  c.min_depth = 600;  // beyond the context
  refuses(cfg, c, "dsv4.min_depth");
  c.min_depth = 100;
  c.max_depth = 50;
  refuses(cfg, c, "dsv4.max_depth");
  c = csa({}, Dsv4Indexer::lightning, 1);
  c.index_noise = -1.0;
  refuses(cfg, c, "dsv4.index_noise");
}

}  // namespace
