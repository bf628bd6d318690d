// Differential fuzz target: cpu::decode and cpu::prefill against reference.hpp (see
// fuzz_attention_impl.hpp for what is drawn and the bounds). This file draws the case.
#include <algorithm>
#include <cstdint>
#include <random>

#include "fuzz_attention.hpp"
#include "fuzz_input.hpp"
#include "phasekv/core/element.hpp"

namespace {
using i64 = std::int64_t;
namespace cpu = phasekv::cpu;
using pkv_fuzz::Case;
using pkv_fuzz::FuzzInput;
constexpr i64 kDims[] = {1,  2,  3,  4,  5,  7,  8,  9,   15,  16,  17,  24,  31, 32,
                         33, 48, 63, 64, 65, 80, 96, 100, 127, 128, 129, 192, 256};
i64 draw_dim(FuzzInput& in) {
  return kDims[in.range(0, static_cast<i64>(sizeof kDims / sizeof kDims[0]) - 1)];
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzInput in(data, size);
  Case c;
  const bool prefill = in.flag();
  c.kv_heads = in.range(1, 3);
  c.group = in.range(1, 7);
  c.dk = draw_dim(in);
  c.dv = in.flag() ? c.dk : draw_dim(in);
  c.n = prefill ? in.range(1, 120) : in.range(0, 300);
  c.first = prefill ? c.n - in.range(1, std::min<i64>(c.n, 24)) : 0;
  switch (in.range(0, 3)) {
    case 0: c.rule = cpu::VisibilityRule::causal(); break;
    case 1: c.rule = cpu::VisibilityRule::sliding_window(in.range(1, 40)); break;
    default:
      c.rule = cpu::VisibilityRule::compressed(
          phasekv::Geometry(in.range(1, 16), in.range(1, 16), in.range(0, 9)), in.range(0, 40));
      break;
  }
  c.layout = in.flag() ? phasekv::Layout::HND : phasekv::Layout::NHD;
  c.variant.scale = phasekv::default_scale(c.dk) * static_cast<float>(in.range(1, 16)) / 4.0f;
  if (in.flag()) c.variant.softcap = static_cast<float>(in.range(1, 60));
  if (in.flag()) c.variant.entry_bias = static_cast<float>(in.range(-40, 40)) / 8.0f;
  if (in.flag()) {
    std::mt19937 rng(in.seed());
    std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
    c.sinks.resize(static_cast<std::size_t>(c.kv_heads * c.group));
    for (auto& s : c.sinks) s = dist(rng);
    c.variant.sinks = c.sinks.data();
  }
  c.threads = static_cast<int>(in.range(1, 6));
  switch (in.range(0, 2)) {
    case 1: pkv_fuzz::run_case<phasekv::bf16_t>(in, c, prefill); break;
    case 2: pkv_fuzz::run_case<phasekv::f16_t>(in, c, prefill); break;
    default: pkv_fuzz::run_case<float>(in, c, prefill); break;
  }
  return 0;
}
