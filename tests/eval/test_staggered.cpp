// Per-head origins in the retrieval harness (RetrievalConfig::origins): all-zero origins give
// exactly the shared-geometry result, and staggered origins cover the phases that colliding
// heads leave uncovered.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "phasekv/compress/fixed_gates.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/phase/origins.hpp"
#include "suite_util.hpp"

namespace {

using namespace phasekv;
using namespace phasekv::eval;

// R2, W = S = 8, no local window; 60 contexts x 4 targets = 240 trials per phase.
RetrievalConfig config(std::uint64_t seed, std::int64_t heads) {
  RetrievalConfig c;
  c.task = Task::R2;
  c.dim = 128;
  c.vocab = 1024;
  c.context = 256;
  c.local = 0;
  c.gamma = 16.0;
  c.heads = heads;
  c.contexts = 60;
  c.targets_per_group = 4;
  c.seed = seed;
  return c;
}

// Every head one-hot on the same offset: keys offset r, values offset r + 1 (R2's successor).
struct SameOffsetHeads {
  std::vector<float> wk, wv;
  FixedGates keys, values;
  SameOffsetHeads(std::int64_t heads, std::int64_t r)
      : wk(static_cast<std::size_t>(heads * 8), 0.0f), wv(wk.size(), 0.0f) {
    for (std::int64_t h = 0; h < heads; ++h) {
      wk[static_cast<std::size_t>(h * 8 + r)] = 1.0f;
      wv[static_cast<std::size_t>(h * 8 + r + 1)] = 1.0f;
    }
    keys = FixedGates(Geometry(8, 8), 128, heads, wk.data());
    values = FixedGates(Geometry(8, 8), 128, heads, wv.data());
  }
};

void expect_same(const RetrievalResult& a, const RetrievalResult& b) {
  EXPECT_EQ(a.positions, b.positions);
  EXPECT_EQ(a.predictions, b.predictions);
  EXPECT_EQ(a.correct, b.correct);
  ASSERT_EQ(a.tally.modulus(), b.tally.modulus());
  for (std::int64_t r = 0; r < a.tally.modulus(); ++r) {
    EXPECT_EQ(a.tally[r].n, b.tally[r].n);
    EXPECT_EQ(a.tally[r].correct, b.tally[r].correct);
  }
}

// O_h = 0 for every head takes the per-head path (CompressedCache or compress_batch with origins,
// one attention call per head) and must give today's trials exactly: through the cache and
// batch compression, the kernel and the reference, with and without knockout, R1 and R2.
TEST(StaggeredRetrieval, ZeroOriginsGiveTheSharedGeometryResultExactly) {
  const SameOffsetHeads m(3, 2);
  for (const bool use_cache : {true, false})
    for (const Task task : {Task::R1, Task::R2})
      for (const bool ko : {false, true}) {
        RetrievalConfig c = config(2811, 3);
        c.task = task;
        c.contexts = 6;
        c.local = 8;
        c.use_cache = use_cache;
        if (ko) c.knockout = {1};
        RetrievalConfig s = c;
        s.origins = {0, 0, 0};
        SCOPED_TRACE(std::string(to_string(task)) + (use_cache ? " cache" : " batch") +
                     (ko ? " knockout 1" : ""));
        const RetrievalResult base = run_retrieval(c, m.keys, m.values, KernelAttention{});
        expect_same(base, run_retrieval(s, m.keys, m.values, KernelAttention{}));
        if (use_cache && !ko)
          expect_same(run_retrieval(c, m.keys, m.values, ReferenceAttention{}),
                      run_retrieval(s, m.keys, m.values, ReferenceAttention{}));
      }
}

// Eight heads one-hot on offset 0 collide: with one shared origin they all serve phase 0 and
// leave phases 1..7 at chance. Staggered by O_h = h (= h*S/H), head h's offset 0 falls on
// phase h, so every phase is served at the same memory (the same entries per token).
TEST(StaggeredRetrieval, StaggeredOriginsCoverThePhasesCollidingHeadsLeave) {
  const SameOffsetHeads m(8, 0);
  const RetrievalConfig c = config(2812, 8);
  const Summary uniform = suite::report("R2 8 heads on offset 0, shared origin, seed 2812",
                                        run_retrieval(c, m.keys, m.values, KernelAttention{}));
  RetrievalConfig s = c;
  s.origins = even_origins(8, 8);
  const Summary staggered = suite::report("R2 8 heads on offset 0, origins 0..7, seed 2812",
                                          run_retrieval(s, m.keys, m.values, KernelAttention{}));
  // Shared origin: phase 0 served, the others not.
  EXPECT_GT(uniform.groups[0].ci_low, 0.95);
  for (std::int64_t r = 1; r < 8; ++r) EXPECT_LT(uniform.groups[r].ci_high, 0.05) << r;
  // Staggered: every phase served (seed 2812: 81 % to 93 %; each phase now has one serving
  // head and seven that add noise to the summed output, so none reaches 100 %). The worst
  // phase's Wilson interval lies far above the shared origin's worst, and the gap shrinks
  // from 100 pp to about 11 pp (240 trials per phase: intervals about +-5 pp).
  for (std::int64_t r = 0; r < 8; ++r) EXPECT_GT(staggered.groups[r].ci_low, 0.7) << r;
  const GroupStats& uw = uniform.groups[static_cast<std::size_t>(uniform.worst_residue)];
  const GroupStats& sw = staggered.groups[static_cast<std::size_t>(staggered.worst_residue)];
  EXPECT_GT(sw.ci_low, uw.ci_high);
  EXPECT_GT(staggered.mean, uniform.mean + 0.5);
  EXPECT_LT(staggered.gap_pp, 25.0);
  EXPECT_GT(uniform.gap_pp, 95.0);
  // Knocking out head 3 (origin 3) drops phase 3 to chance. The other phases stay far above
  // chance but lose 10 to 20 points: the knocked-out head attends to its few raw tail tokens
  // only, and that concentrated output adds more noise to the sum than an intact head's
  // attention spread over its entries.
  s.knockout = {3};
  const Summary ko = suite::report("R2 origins 0..7, head 3 knocked out",
                                   run_retrieval(s, m.keys, m.values, KernelAttention{}));
  EXPECT_LT(ko.groups[3].ci_high, 0.05);
  for (std::int64_t r = 0; r < 8; ++r)
    if (r != 3) {
      EXPECT_GT(ko.groups[r].ci_low, 0.5) << r;
      EXPECT_LT(ko.groups[r].accuracy, staggered.groups[r].accuracy) << r;
    }
}

TEST(StaggeredRetrieval, BadOriginsAreRefused) {
  const SameOffsetHeads m(3, 2);
  RetrievalConfig c = config(1, 3);
  c.origins = {0, 1};
  try {
    (void)run_retrieval(c, m.keys, m.values, KernelAttention{});
    ADD_FAILURE() << "no error";
  } catch (const phasekv::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("origins.size() = 2"), std::string::npos) << e.what();
  }
  c.origins = {0, -2, 1};
  try {
    (void)run_retrieval(c, m.keys, m.values, KernelAttention{});
    ADD_FAILURE() << "no error";
  } catch (const phasekv::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("origins[1] = -2"), std::string::npos) << e.what();
  }
  c.origins = {0, 0, 0};
  EXPECT_THROW((void)run_retrieval(c, NoCompression{}, NoCompression{}, KernelAttention{}),
               phasekv::invalid_argument);
}

}  // namespace
