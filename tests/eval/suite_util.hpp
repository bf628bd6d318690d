// Helpers of the reference suite: run an experiment, print its per-phase report (so the
// figures appear in the test log), and statistical assertions with tolerances from counts.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "phasekv/eval/report.hpp"
#include "phasekv/eval/retrieval.hpp"
#include "phasekv/eval/stats.hpp"

namespace suite {

inline phasekv::eval::Summary report(const std::string& name,
                                     const phasekv::eval::RetrievalResult& r) {
  const phasekv::eval::Summary s = phasekv::eval::summarize(r.tally);
  std::printf("[%s]\n%s%s\n", name.c_str(), phasekv::eval::to_bars(s, 30).c_str(),
              phasekv::eval::summary_line(s).c_str());
  return s;
}

// Counts of the residues in `rs`, pooled.
inline phasekv::eval::Count pooled(const phasekv::eval::PhaseTally& t,
                                   const std::vector<std::int64_t>& rs) {
  phasekv::eval::Count c;
  for (std::int64_t r : rs) {
    c.n += t[r].n;
    c.correct += t[r].correct;
  }
  return c;
}

inline std::vector<phasekv::eval::Count> select(const phasekv::eval::PhaseTally& t,
                                                const std::vector<std::int64_t>& rs) {
  std::vector<phasekv::eval::Count> out;
  for (std::int64_t r : rs) out.push_back(t[r]);
  return out;
}

}  // namespace suite
