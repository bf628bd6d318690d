// The reference suite of issue 6: phase-dependent retrieval through the library's compressor
// policies, visible-set construction and attention, asserted statistically. Every assertion
// uses Wilson intervals, chi-square homogeneity or two-proportion tests on the observed
// counts, at the significance levels written next to it; seeds are fixed.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/compress/offset_select.hpp"
#include "phasekv/compress/uniform_mean.hpp"
#include "suite_util.hpp"

namespace {

using namespace phasekv;
using namespace phasekv::eval;

// Settings of the compressed-cache cases: d = 128, N = 1024, T = 512, no local window (raw
// keys have norm 1 while pooled keys have norm ~1/sqrt(W), so a local window only adds
// distractors that outscore pooled entries; targets are deep in any case), gamma = 64.
RetrievalConfig compressed_config(Task task, std::uint64_t seed) {
  RetrievalConfig c;
  c.task = task;
  c.dim = 128;
  c.vocab = 1024;
  c.context = 512;
  c.local = 0;
  c.gamma = 64.0;
  // Trials of one context share its cache, so they are not independent; many contexts with
  // few targets each keep the over-dispersion small (the Wilson intervals assume independence).
  c.contexts = 80;
  c.targets_per_group = 4;  // 320 trials per phase
  c.seed = seed;
  return c;
}

// 1. Uncompressed attention on R1: >= 99 % at every phase, homogeneous.
TEST(ReferenceSuite, R1FullAttentionNearPerfectAndHomogeneous) {
  RetrievalConfig c;  // d = 64, N = 1024, T = 512, L = 16, gamma = 16
  c.modulus = 8;
  c.contexts = 16;
  c.targets_per_group = 32;  // 512 per phase
  c.seed = 101;
  const RetrievalResult r =
      run_retrieval(c, NoCompression{}, NoCompression{}, ReferenceAttention{});
  const Summary s = suite::report("R1 full attention, M=8, seed 101", r);
  for (const GroupStats& g : s.groups) {
    EXPECT_EQ(g.n, 512);
    EXPECT_GE(g.accuracy, 0.99) << "residue " << g.residue;
  }
  EXPECT_GT(s.homogeneity_p, 0.01);
  EXPECT_EQ(s.period, 1);
}

// 2. R1 with UniformMean, W = S: homogeneous across phases. Theory: the target's entry holds
// 8 values with weight 1/8 each, so accuracy <= 1/8 (ties broken by noise) at every phase.
TEST(ReferenceSuite, R1UniformMeanIsHomogeneous) {
  const Geometry g(8, 8);
  const UniformMean um(g, 128);
  const RetrievalResult r =
      run_retrieval(compressed_config(Task::R1, 202), um, um, ReferenceAttention{});
  const Summary s = suite::report("R1 UniformMean W=S=8, seed 202", r);
  EXPECT_GT(s.homogeneity_p, 0.01);
  EXPECT_EQ(s.period, 1);
  // Not vacuous: clearly above chance (1/N) and consistent with the 1/8 ceiling.
  const Interval all = wilson_interval(suite::pooled(r.tally, {0, 1, 2, 3, 4, 5, 6, 7}).correct,
                                       suite::pooled(r.tally, {0, 1, 2, 3, 4, 5, 6, 7}).n);
  EXPECT_GT(all.low, 0.05);
  EXPECT_LT(all.low, 0.125);
}

// 4. R1 with gaps (W < S): phases >= W belong to no window and fail.
TEST(ReferenceSuite, R1GapPhasesFail) {
  for (const Geometry g : {Geometry(4, 8), Geometry(1, 4)}) {
    const UniformMean um(g, 128);
    const RetrievalResult r =
        run_retrieval(compressed_config(Task::R1, 404), um, um, ReferenceAttention{});
    const Summary s = suite::report("R1 UniformMean W=" + std::to_string(g.window()) +
                                        " S=" + std::to_string(g.stride()) + ", seed 404",
                                    r);
    for (std::int64_t gap = g.window(); gap < g.stride(); ++gap) {
      // At most chance: the Wilson upper bound stays below 2 %.
      EXPECT_LT(s.groups[static_cast<std::size_t>(gap)].ci_high, 0.02) << "phase " << gap;
      for (std::int64_t in = 0; in < g.window(); ++in)
        EXPECT_LT(proportion_less_p(r.tally[gap], r.tally[in]), 1e-3)
            << "gap phase " << gap << " vs covered phase " << in;
    }
    EXPECT_GT(s.homogeneity_p < 1e-6 ? 1 : 0, 0);
    EXPECT_EQ(s.period, g.stride());
  }
}

// 5. R2 with UniformMean, W = S: the boundary phase S-1 is significantly worse than every
// other phase (its successor lies in the next window), and phases 0..S-2 are homogeneous.
TEST(ReferenceSuite, R2UniformMeanBoundaryPhaseIsWeak) {
  const Geometry g(8, 8);
  const UniformMean um(g, 128);
  const RetrievalResult r =
      run_retrieval(compressed_config(Task::R2, 505), um, um, ReferenceAttention{});
  const Summary s = suite::report("R2 UniformMean W=S=8, seed 505", r);
  for (std::int64_t p = 0; p < 7; ++p)  // Bonferroni: 7 comparisons at family-wise 1 %.
    EXPECT_LT(proportion_less_p(r.tally[7], r.tally[p]), 0.01 / 7) << "phase " << p;
  EXPECT_GT(homogeneity_test(suite::select(r.tally, {0, 1, 2, 3, 4, 5, 6})).p_value, 0.01);
  EXPECT_EQ(s.worst_residue, 7);
}

// 6. R2 with one-hot gates (key on offset r, value on r + 1, W = S): phase r near 100 %, the
// others near chance. Also with two heads on different offsets (outputs summed).
TEST(ReferenceSuite, R2OneHotGatesCoverOnePhase) {
  const Geometry g(8, 8);
  for (std::int64_t r0 : {0, 3, 6}) {
    std::vector<float> wk(8, 0.0f), wv(8, 0.0f);
    wk[static_cast<std::size_t>(r0)] = 1.0f;
    wv[static_cast<std::size_t>(r0 + 1)] = 1.0f;
    const FixedGates kp(g, 128, 1, wk.data()), vp(g, 128, 1, wv.data());
    RetrievalConfig c = compressed_config(Task::R2, 606);
    c.contexts = 40;  // 160 trials per phase: Wilson bounds 0.977 (160/160) and 0.023 (0/160)
    const RetrievalResult r = run_retrieval(c, kp, vp, KernelAttention{});
    const Summary s = suite::report("R2 one-hot key " + std::to_string(r0) + " value " +
                                        std::to_string(r0 + 1) + ", W=S=8, seed 606",
                                    r);
    for (const GroupStats& gs : s.groups) {
      if (gs.residue == r0)
        EXPECT_GT(gs.ci_low, 0.95) << "covered phase " << r0;
      else
        EXPECT_LT(gs.ci_high, 0.03) << "phase " << gs.residue;
    }
  }
  // Two heads: offsets 1 and 4 covered, outputs summed.
  std::vector<float> wk(16, 0.0f), wv(16, 0.0f);
  wk[1] = wv[2] = 1.0f;
  wk[8 + 4] = wv[8 + 5] = 1.0f;
  const FixedGates kp(g, 128, 2, wk.data()), vp(g, 128, 2, wv.data());
  RetrievalConfig c = compressed_config(Task::R2, 616);
  c.heads = 2;
  c.contexts = 40;
  const RetrievalResult r = run_retrieval(c, kp, vp, KernelAttention{});
  const Summary s = suite::report("R2 two one-hot heads (1->2, 4->5), seed 616", r);
  for (const GroupStats& gs : s.groups) {
    if (gs.residue == 1 || gs.residue == 4)
      EXPECT_GT(gs.ci_low, 0.9) << "covered phase " << gs.residue;
    else
      EXPECT_LT(gs.ci_high, 0.03) << "phase " << gs.residue;
  }
}

// 3. R1 with GatedPool and fixed gate biases: per-phase accuracy ordered like the gate
// weights (Spearman >= 0.9); gate cycling by delta rotates the curve by delta.
//
// Settings (fixed before running): scalar gates, biases b = 3.5/7 * (3, 0, 6, 1, 5, 2, 4, 7)
// (all offsets distinct, not monotone in the offset), content weights Z_i with N(0, 1)
// entries (so Z_i x ~ N(0, 1) for unit x), keys and values through the same policy (tied).
// With Z = 0 (pure biases) the top-weighted offset wins the argmax of every window it is
// retrieved from and all other phases sit near chance (a step, not an ordering); that case is
// checked separately below.
struct GatedSetup {
  static constexpr std::int64_t d = 128;
  std::vector<float> b, z;
  GatedSetup() {
    const float raw[8] = {3, 0, 6, 1, 5, 2, 4, 7};
    for (float x : raw) b.push_back(x * 0.5f);
    Rng rng(5);
    z.resize(8 * d);
    for (float& x : z) x = static_cast<float>(rng.normal());
  }
  GatedPool pool(bool content) const {
    return GatedPool(Geometry(8, 8), 1, d, d, GateKind::scalar,
                     content ? param_view(z.data(), {1, 8, 1, d}) : ParamView{},
                     param_view(b.data(), {1, 8, 1}));
  }
};

TEST(ReferenceSuite, R1GatedPoolOrderedLikeGatesAndCyclingRotates) {
  const GatedSetup setup;
  RetrievalConfig c = compressed_config(Task::R1, 303);
  c.contexts = 160;  // 640 trials per phase
  const GatedPool gp = setup.pool(true);
  Summary curve[2];
  PhaseTally tally[2] = {PhaseTally(8), PhaseTally(8)};
  const std::int64_t delta = 3;
  for (int k = 0; k < 2; ++k) {
    const GatedPool p = gp.cycled(k == 0 ? 0 : delta);
    const RetrievalResult r = run_retrieval(c, p, p, KernelAttention{});
    tally[k] = r.tally;
    curve[k] = suite::report(
        k == 0 ? "R1 GatedPool fixed biases, seed 303" : "R1 GatedPool cycled by 3, seed 303", r);
    std::vector<double> acc, bias;
    for (std::int64_t i = 0; i < 8; ++i) {
      acc.push_back(curve[k].groups[static_cast<std::size_t>(i)].accuracy);
      // The gate acting at offset i is the stored gate of offset i - shift.
      bias.push_back(setup.b[static_cast<std::size_t>(residue(i - (k ? delta : 0), 8))]);
    }
    const double rho = spearman(acc, bias);
    std::printf("Spearman(accuracy, gate bias) = %.3f\n", rho);
    EXPECT_GE(rho, 0.9);
  }
  // Rotation: phase r of the cycled run matches phase r - delta of the original (two-group
  // homogeneity, Bonferroni over 8 phases at family-wise 1 %), and the best phase moves.
  for (std::int64_t r = 0; r < 8; ++r)
    EXPECT_GT(homogeneity_test({tally[1][r], tally[0][residue(r - delta, 8)]}).p_value, 0.01 / 8)
        << "phase " << r;
  EXPECT_EQ(curve[1].best_residue, residue(curve[0].best_residue + delta, 8));
}

TEST(ReferenceSuite, R1GatedPoolPureBiasesGiveAStep) {
  const GatedSetup setup;
  RetrievalConfig c = compressed_config(Task::R1, 313);
  const GatedPool gp = setup.pool(false);
  const RetrievalResult r = run_retrieval(c, gp, gp, ReferenceAttention{});
  const Summary s = suite::report("R1 GatedPool pure biases (Z = 0), seed 313", r);
  // The largest bias is at offset 7: that phase wins, all others stay near chance.
  EXPECT_EQ(s.best_residue, 7);
  EXPECT_GT(s.groups[7].ci_low, 0.5);
  for (std::int64_t i = 0; i < 7; ++i)
    EXPECT_LT(s.groups[static_cast<std::size_t>(i)].ci_high, 0.05) << "phase " << i;
}

// 7. Kernel-backed and reference-attention-backed runs give the same per-phase counts (and
// the same prediction in every trial); the cache path and the batch path agree as well.
TEST(ReferenceSuite, KernelAndReferenceAgree) {
  const GatedSetup setup;
  const GatedPool gp = setup.pool(true);
  const UniformMean um(Geometry(8, 8), 128);
  for (Task task : {Task::R1, Task::R2}) {
    RetrievalConfig c = compressed_config(task, 707);
    c.contexts = 12;
    c.local = 16;
    const RetrievalResult ref = run_retrieval(c, gp, gp, ReferenceAttention{});
    const RetrievalResult ker = run_retrieval(c, gp, gp, KernelAttention{});
    EXPECT_EQ(ref.predictions, ker.predictions);
    for (std::int64_t r = 0; r < 8; ++r) {
      EXPECT_EQ(ref.tally[r].correct, ker.tally[r].correct);
      EXPECT_EQ(ref.tally[r].n, ker.tally[r].n);
    }
    c.use_cache = false;
    EXPECT_EQ(run_retrieval(c, gp, gp, KernelAttention{}).predictions, ker.predictions);
    const RetrievalResult a = run_retrieval(c, um, um, ReferenceAttention{});
    const RetrievalResult b = run_retrieval(c, um, um, KernelAttention{});
    EXPECT_EQ(a.predictions, b.predictions);
  }
  RetrievalConfig c;
  c.contexts = 4;
  EXPECT_EQ(run_retrieval(c, NoCompression{}, NoCompression{}, ReferenceAttention{}).predictions,
            run_retrieval(c, NoCompression{}, NoCompression{}, KernelAttention{}).predictions);
}

// Beyond the list: overlapping windows (W > S, DeepSeek-V4's W = 8, S = 4) let a
// one-hot compressor serve the phase S - 1 that tiling windows cannot: keys at offset 3 and
// values at offset 4 of the same window cover phase 3 (residues 3 and 7 mod 8).
TEST(ReferenceSuite, R2OverlapServesTheBoundaryPhase) {
  const Geometry g(8, 4);
  const OffsetSelect kp(g, 128, 3), vp(g, 128, 4);
  RetrievalConfig c = compressed_config(Task::R2, 626);
  c.modulus = 8;
  c.contexts = 40;
  const RetrievalResult r = run_retrieval(c, kp, vp, KernelAttention{});
  const Summary s = suite::report("R2 OffsetSelect key 3 / value 4, W=8 S=4, mod 8, seed 626", r);
  for (const GroupStats& gs : s.groups) {
    if (gs.residue % 4 == 3)
      EXPECT_GT(gs.ci_low, 0.95) << "phase " << gs.residue;
    else
      EXPECT_LT(gs.ci_high, 0.03) << "phase " << gs.residue;
  }
  EXPECT_EQ(s.period, 4);
}

TEST(Retrieval, RejectsBadConfigs) {
  RetrievalConfig c;
  c.vocab = 100;  // < context
  EXPECT_THROW(run_retrieval(c, NoCompression{}, NoCompression{}, ReferenceAttention{}),
               phasekv::invalid_argument);
  c = RetrievalConfig{};
  c.context = 30;  // no room for deep targets (min depth L + W + S = 32)
  const UniformMean um(Geometry(8, 8), 64);
  EXPECT_THROW(run_retrieval(c, um, um, ReferenceAttention{}), phasekv::invalid_argument);
  c = RetrievalConfig{};
  const UniformMean wrong_dim(Geometry(8, 8), 32);
  EXPECT_THROW(run_retrieval(c, wrong_dim, wrong_dim, ReferenceAttention{}), phasekv::shape_error);
  const UniformMean other(Geometry(8, 4), 64);
  EXPECT_THROW(run_retrieval(c, um, other, ReferenceAttention{}), phasekv::invalid_argument);
}

TEST(Retrieval, FixedSeedsAreReproducible) {
  RetrievalConfig c = compressed_config(Task::R2, 7);
  c.contexts = 3;
  const UniformMean um(Geometry(8, 8), 128);
  const RetrievalResult a = run_retrieval(c, um, um, ReferenceAttention{});
  const RetrievalResult b = run_retrieval(c, um, um, ReferenceAttention{});
  EXPECT_EQ(a.predictions, b.predictions);
  EXPECT_EQ(a.positions, b.positions);
  c.seed = 8;
  EXPECT_NE(run_retrieval(c, um, um, ReferenceAttention{}).positions, a.positions);
}

}  // namespace
