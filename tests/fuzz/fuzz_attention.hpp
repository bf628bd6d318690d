// Shared declarations of the fuzz_attention target: the drawn case and the per-type runner
// (fuzz_attention_{f32,bf16,f16}.cpp instantiate it; fuzz_attention.cpp draws the case).
#pragma once

#include <cstdint>
#include <vector>

#include "fuzz_input.hpp"
#include "phasekv/attention/cpu/visibility_rule.hpp"
#include "phasekv/attention/params.hpp"
#include "phasekv/core/view.hpp"

namespace pkv_fuzz {

struct Case {
  std::int64_t kv_heads = 1, group = 1, dk = 1, dv = 1, n = 0, first = 0;
  phasekv::cpu::VisibilityRule rule = phasekv::cpu::VisibilityRule::causal();
  phasekv::Layout layout = phasekv::Layout::NHD;
  phasekv::StandardVariant variant;
  std::vector<float> sinks;
  int threads = 1;
};

// Draws the data of `c` from `in`, runs decode (or prefill) with a drawn instruction set and
// checks it against the reference; aborts on a mismatch.
template <class T>
void run_case(FuzzInput& in, Case& c, bool prefill);

}  // namespace pkv_fuzz
