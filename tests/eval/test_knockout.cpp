// Head knockout (RetrievalConfig::knockout) and the phase specialization map, on one-hot heads
// whose head -> phase assignment is known by construction.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#include "phasekv/compress/fixed_gates.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/eval/specialization.hpp"
#include "suite_util.hpp"

namespace {

using namespace phasekv;
using namespace phasekv::eval;

// R2, W = S = 8, no local window; 60 contexts x 4 targets = 240 trials per phase. With 240/240
// correct the Wilson 95 % lower bound is 0.984, with 0/240 the upper bound is 0.016.
RetrievalConfig config(std::uint64_t seed, std::int64_t heads) {
  RetrievalConfig c;
  c.task = Task::R2;
  c.dim = 128;
  c.vocab = 1024;
  c.context = 256;
  c.local = 0;
  // gamma 16: a matching entry gets logit 16, a random one about N(0, 2): the heads that do
  // not serve a phase spread their attention and add little to the summed output.
  c.gamma = 16.0;
  c.heads = heads;
  c.contexts = 60;
  c.targets_per_group = 4;
  c.seed = seed;
  return c;
}

// One-hot gates: head h keys on offset offsets[h], values on offsets[h] + shift (1 for R2's
// successor, 0 for R1).
struct OneHotHeads {
  std::vector<float> wk, wv;
  FixedGates keys, values;
  explicit OneHotHeads(const std::vector<std::int64_t>& offsets, std::size_t shift = 1)
      : wk(offsets.size() * 8, 0.0f), wv(wk.size(), 0.0f) {
    for (std::size_t h = 0; h < offsets.size(); ++h) {
      wk[h * 8 + static_cast<std::size_t>(offsets[h])] = 1.0f;
      wv[h * 8 + static_cast<std::size_t>(offsets[h]) + shift] = 1.0f;
    }
    const Geometry g(8, 8);
    const auto n = static_cast<std::int64_t>(offsets.size());
    keys = FixedGates(g, 128, n, wk.data());
    values = FixedGates(g, 128, n, wv.data());
  }
};

const std::vector<std::int64_t> kOffsets = {1, 4, 6};  // head h serves phase kOffsets[h]

bool is_served(std::int64_t r) { return r == 1 || r == 4 || r == 6; }

TEST(Knockout, HeadThatServesPhaseRDropsOnlyPhaseR) {
  const OneHotHeads m(kOffsets);
  const RetrievalConfig c = config(2801, 3);
  const Summary base = suite::report("R2 one-hot heads 1, 4, 6 intact, seed 2801",
                                     run_retrieval(c, m.keys, m.values, KernelAttention{}));
  for (const GroupStats& g : base.groups) {
    if (is_served(g.residue))
      EXPECT_GT(g.ci_low, 0.95) << "served phase " << g.residue;
    else
      EXPECT_LT(g.ci_high, 0.05) << "unserved phase " << g.residue;
  }
  for (std::size_t h = 0; h < kOffsets.size(); ++h) {
    RetrievalConfig k = c;
    k.knockout = {static_cast<std::int64_t>(h)};
    const Summary s = suite::report("R2 head " + std::to_string(h) + " knocked out",
                                    run_retrieval(k, m.keys, m.values, KernelAttention{}));
    for (const GroupStats& g : s.groups) {
      const GroupStats& b = base.groups[static_cast<std::size_t>(g.residue)];
      if (g.residue == kOffsets[h]) {
        // Phase r falls to chance: the knockout's interval lies wholly below the intact one.
        EXPECT_LT(g.ci_high, b.ci_low) << "head " << h << " phase " << g.residue;
        EXPECT_LT(g.ci_high, 0.05) << "head " << h << " phase " << g.residue;
      } else {
        // Every other phase stays inside the intact phase's Wilson interval.
        EXPECT_GE(g.accuracy, b.ci_low) << "head " << h << " phase " << g.residue;
        EXPECT_LE(g.accuracy, b.ci_high) << "head " << h << " phase " << g.residue;
      }
    }
  }
}

TEST(Knockout, SpecializationMapFindsTheAssignment) {
  const OneHotHeads m(kOffsets);
  const SpecializationMap map =
      specialization_map(config(2802, 3), m.keys, m.values, KernelAttention{});
  std::printf("%s", to_markdown(map).c_str());
  ASSERT_EQ(map.heads, 3);
  ASSERT_EQ(map.modulus, 8);
  for (std::int64_t h = 0; h < 3; ++h)
    EXPECT_EQ(map.served_by(h), std::vector<std::int64_t>{kOffsets[static_cast<std::size_t>(h)]});
  for (std::int64_t r = 0; r < 8; ++r) {
    EXPECT_LE(map.servers(r).size(), 1u) << "residue " << r;
    for (std::int64_t h = 0; h < 3; ++h) {
      if (r == kOffsets[static_cast<std::size_t>(h)]) {
        EXPECT_GT(map.drop(h, r), 0.9);
      }
    }
  }
  // The reports carry the same facts.
  const std::string md = to_markdown(map), csv = to_csv(map), json = to_json(map),
                    svg = to_svg(map, "map <test>");
  EXPECT_NE(md.find("head 1 serves residue(s): 4"), std::string::npos) << md;
  EXPECT_NE(md.find("collisions: none"), std::string::npos) << md;
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 3 * 8);
  EXPECT_NE(csv.find("\n2,6,240,"), std::string::npos) << csv;
  EXPECT_NE(json.find("\"serves\": [6]"), std::string::npos) << json;
  EXPECT_NE(json.find("\"unserved\": [0, 2, 3, 5, 7]"), std::string::npos) << json;
  EXPECT_NE(svg.find("map &lt;test&gt;"), std::string::npos);
  std::size_t cells = 0;
  for (std::size_t p = svg.find("class=\"cell\""); p != std::string::npos;
       p = svg.find("class=\"cell\"", p + 1))
    ++cells;
  EXPECT_EQ(cells, 3u * 8u);
}

// Two heads on the same offset (a collision): each covers for the other, so neither single
// knockout drops the phase (knocking out both does); each head alone retrieves it, so the map
// names both as its servers and reports the collision.
TEST(Knockout, CollisionIsFoundThoughHeadsMaskEachOther) {
  const OneHotHeads m({3, 3, 5});
  const RetrievalConfig c = config(2803, 3);
  const SpecializationMap map = specialization_map(c, m.keys, m.values, KernelAttention{});
  std::printf("%s", to_markdown(map).c_str());
  EXPECT_GT(map.baseline.groups[3].ci_low, 0.95);
  EXPECT_FALSE(map.needed(0, 3));
  EXPECT_FALSE(map.needed(1, 3));
  EXPECT_TRUE(map.suffices(0, 3));
  EXPECT_TRUE(map.suffices(1, 3));
  EXPECT_EQ(map.servers(3), (std::vector<std::int64_t>{0, 1}));
  EXPECT_EQ(map.servers(5), (std::vector<std::int64_t>{2}));
  EXPECT_TRUE(map.needed(2, 5));
  EXPECT_NE(to_markdown(map).find("collisions: r=3 by heads 0, 1"), std::string::npos);
  EXPECT_NE(to_json(map).find("\"collisions\": [{\"residue\": 3, \"heads\": [0, 1]}]"),
            std::string::npos)
      << to_json(map);
  RetrievalConfig both = c;
  both.knockout = {0, 1};
  const Summary s = summarize(run_retrieval(both, m.keys, m.values, KernelAttention{}).tally);
  EXPECT_LT(s.groups[3].ci_high, map.baseline.groups[3].ci_low);
}

// Every head knocked out: the compressed entries are gone but the raw window still answers.
// R1 (a raw token holds its own record; R2 needs the compressed key -> successor shift), targets
// in the local window (depth 1..24 below the query, L = 32).
TEST(Knockout, EveryHeadOutLeavesRawWindowRetrievalIntact) {
  const OneHotHeads m(kOffsets, 0);
  RetrievalConfig c = config(2804, 3);
  c.task = Task::R1;
  c.local = 32;
  c.min_depth = 1;
  c.max_depth = 24;
  const Summary base = suite::report("R1 targets in the raw window, intact",
                                     run_retrieval(c, m.keys, m.values, KernelAttention{}));
  c.knockout = {0, 1, 2};
  const Summary s = suite::report("R1 targets in the raw window, every head out",
                                  run_retrieval(c, m.keys, m.values, KernelAttention{}));
  for (const GroupStats& g : s.groups) {
    EXPECT_GT(g.ci_low, 0.95) << "phase " << g.residue;
    const GroupStats& b = base.groups[static_cast<std::size_t>(g.residue)];
    EXPECT_GE(g.accuracy, b.ci_low) << "phase " << g.residue;
  }
  // Deep targets (only compressed entries hold them) fall to chance with every head out,
  // though the intact heads retrieve their phases.
  RetrievalConfig deep = config(2804, 3);
  deep.task = Task::R1;
  const Summary intact = summarize(run_retrieval(deep, m.keys, m.values, KernelAttention{}).tally);
  deep.knockout = {0, 1, 2};
  const Summary d = summarize(run_retrieval(deep, m.keys, m.values, KernelAttention{}).tally);
  for (std::int64_t r : kOffsets)
    EXPECT_GT(intact.groups[static_cast<std::size_t>(r)].ci_low, 0.95);
  for (const GroupStats& g : d.groups) EXPECT_LT(g.ci_high, 0.05) << "phase " << g.residue;
}

// The kernel and the double-precision reference agree trial by trial under knockout.
TEST(Knockout, KernelMatchesReference) {
  const OneHotHeads m(kOffsets);
  RetrievalConfig c = config(2805, 3);
  c.contexts = 10;
  c.knockout = {2, 0};
  const RetrievalResult a = run_retrieval(c, m.keys, m.values, KernelAttention{});
  const RetrievalResult b = run_retrieval(c, m.keys, m.values, ReferenceAttention{});
  EXPECT_EQ(a.positions, b.positions);
  EXPECT_EQ(a.predictions, b.predictions);
}

TEST(Knockout, RejectsBadHeads) {
  const OneHotHeads m(kOffsets);
  RetrievalConfig c = config(2806, 3);
  c.contexts = 1;
  const auto message = [&](std::vector<std::int64_t> ko) {
    RetrievalConfig k = c;
    k.knockout = std::move(ko);
    try {
      run_retrieval(k, m.keys, m.values, KernelAttention{});
    } catch (const phasekv::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({3}).find("knockout[]"), std::string::npos) << message({3});
  EXPECT_NE(message({3}).find("3"), std::string::npos);
  EXPECT_NE(message({-1}).find("knockout[]"), std::string::npos);
  EXPECT_NE(message({1, 1}).find("twice"), std::string::npos) << message({1, 1});
  RetrievalConfig full = c;
  full.knockout = {0};
  EXPECT_THROW(run_retrieval(full, NoCompression{}, NoCompression{}, KernelAttention{}),
               phasekv::invalid_argument);
  RetrievalConfig mapped = c;
  mapped.knockout = {0};
  EXPECT_THROW(specialization_map(mapped, m.keys, m.values, KernelAttention{}),
               phasekv::invalid_argument);
}

}  // namespace
