// Uses the umbrella headers (engine API and research harness) and checks a few facts, so that a
// broken install fails loudly.
#include <phasekv/eval.hpp>
#include <phasekv/phasekv.hpp>

#include <cstdio>

int main() {
  const phasekv::Geometry g(8, 4);
  const phasekv::Visibility v = g.visible(300, 128);
  const bool ok = g.complete_windows(300) == 74 && v.raw_begin == 172 && v.entries == 74 &&
                  phasekv::stride_lcm({4, 128}) == 128 &&
                  phasekv::eval::wilson_interval(5, 10).low < 0.5;
  std::printf("phasekv %d.%d.%d consumer: %s\n", PHASEKV_VERSION_MAJOR, PHASEKV_VERSION_MINOR,
              PHASEKV_VERSION_PATCH, ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
