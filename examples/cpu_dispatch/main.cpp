// Runtime dispatch between builds of the decode kernel compiled for different instruction
// sets, the way an engine ships one binary for every x86 server: kernel.cpp is compiled once
// for the baseline and once each for AVX2 and AVX-512 (where the compiler takes the flags);
// this file, compiled for the baseline, asks the CPU what it supports
// (phasekv::cpu::cpu_supports) and calls the widest build. Every build the CPU can run is
// also checked against the double-precision reference, and the builds must report distinct
// phasekv instruction-set namespaces (so the linker cannot have mixed their inline code).
//
// Usage: example_cpu_dispatch   (exit status 0 when every runnable build matches)
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "dispatch.hpp"
#include "phasekv/attention/cpu/cpu_features.hpp"
#include "phasekv/attention/reference.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/phase/geometry.hpp"

namespace {

struct Candidate {
  engine::KernelBuild build;
  bool runs;  // the running CPU supports the build's instruction set
};

std::vector<Candidate> candidates() {
  namespace cpu = phasekv::cpu;
  std::vector<Candidate> c;
  c.push_back({engine::kernel_build_base(), true});
#if defined(PHASEKV_EXAMPLE_HAVE_AVX2)
  c.push_back({engine::kernel_build_avx2(), cpu::cpu_supports<cpu::arch::Avx2>()});
#endif
#if defined(PHASEKV_EXAMPLE_HAVE_AVX512)
  c.push_back({engine::kernel_build_avx512(), cpu::cpu_supports<cpu::arch::Avx512>()});
#endif
  return c;
}

}  // namespace

int main() {
  // A DeepSeek-V4 CSA-like cache: W8/S4 entries, a 128-token local window, GQA group 4, d 128.
  const std::int64_t q_heads = 8, kv_heads = 2, d = 128, window = 8, stride = 4, local = 128;
  const std::int64_t n = 1000;
  const phasekv::Geometry g(window, stride);
  const std::int64_t entries = g.visible(n, local).entries;

  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto bf16_bits = [&](std::int64_t count, float mean) {
    std::vector<std::uint16_t> v(static_cast<std::size_t>(count));
    for (auto& x : v) x = phasekv::float_to_bf16(normal(rng) + mean).bits;
    return v;
  };
  // The entries would come from a compressor (phasekv::compress_batch); random vectors are
  // enough to show the dispatch.
  const std::vector<std::uint16_t> raw_k = bf16_bits(n * kv_heads * d, 0.0f),
                                   raw_v = bf16_bits(n * kv_heads * d, 0.25f),
                                   entry_k = bf16_bits(entries * kv_heads * d, 0.0f),
                                   entry_v = bf16_bits(entries * kv_heads * d, 0.25f);
  std::vector<float> q(static_cast<std::size_t>(q_heads * d));
  for (auto& x : q) x = 0.3f * normal(rng);

  // Reference, in this (baseline) translation unit's own phasekv namespace.
  using T = phasekv::bf16_t;
  auto view = [&](const std::vector<std::uint16_t>& p, std::int64_t tokens) {
    return phasekv::make_view(reinterpret_cast<const T*>(p.data()), tokens, kv_heads, d);
  };
  const phasekv::VisibleKV<T> kv =
      phasekv::reference_visible<T>(g, local, n - 1, view(raw_k, n), view(raw_v, n),
                                    view(entry_k, entries), view(entry_v, entries));
  std::vector<double> ref(static_cast<std::size_t>(q_heads * d)),
      ref_lse(static_cast<std::size_t>(q_heads));
  phasekv::reference_decode<T>(q.data(), q_heads, kv, phasekv::StandardVariant{}, ref.data(),
                               ref_lse.data());

  const phasekv::cpu::CpuFeatures& f = phasekv::cpu::cpu_features();
  std::printf("cpu: avx2 %d fma %d f16c %d avx512 f/bw/vl/dq %d/%d/%d/%d bf16 %d neon %d\n", f.avx2,
              f.fma, f.f16c, f.avx512f, f.avx512bw, f.avx512vl, f.avx512dq, f.avx512bf16, f.neon);
  std::printf("main.cpp compiled into phasekv::%s\n\n", phasekv::isa_namespace());
  std::printf("%-8s %-8s %-11s %-52s %s\n", "build", "runs", "arch", "phasekv namespace",
              "max rel error");

  // The step every build runs; each fills in its own workspace and (poisoned) outputs.
  engine::DecodeStep step;
  step.q = q.data();
  step.q_heads = q_heads;
  step.kv_heads = kv_heads;
  step.d = d;
  step.window = window;
  step.stride = stride;
  step.local = local;
  step.n = n;
  step.raw_k = raw_k.data();
  step.raw_v = raw_v.data();
  step.entry_k = entry_k.data();
  step.entry_v = entry_v.data();
  step.entries = entries;

  const std::vector<Candidate> cands = candidates();
  int failures = 0;
  const Candidate* chosen = nullptr;
  for (std::size_t i = 0; i < cands.size(); ++i) {
    const Candidate& c = cands[i];
    for (std::size_t j = 0; j < i; ++j)
      if (std::strcmp(cands[j].build.isa_namespace, c.build.isa_namespace) == 0) {
        std::printf("builds %s and %s share phasekv::%s\n", cands[j].build.name, c.build.name,
                    c.build.isa_namespace);
        ++failures;
      }
    if (!c.runs) {
      std::printf("%-8s %-8s %-11s %-52s -\n", c.build.name, "no", c.build.arch,
                  c.build.isa_namespace);
      continue;
    }
    chosen = &c;  // candidates are ordered narrowest first
    engine::DecodeStep s = step;
    std::vector<unsigned char> ws(c.build.workspace_bytes(s));
    std::vector<float> out(static_cast<std::size_t>(q_heads * d), std::nanf("")),
        lse(static_cast<std::size_t>(q_heads), std::nanf(""));  // poisoned
    s.workspace = ws.data();
    s.workspace_bytes = ws.size();
    s.out = out.data();
    s.lse = lse.data();
    c.build.decode(s);
    double worst = 0;  // per head: max |out - ref| / max |ref| (and lse), worst head
    for (std::int64_t h = 0; h < q_heads; ++h) {
      double err = 0, mag = 0;
      for (std::int64_t k = h * d; k < (h + 1) * d; ++k) {
        const double e =
            std::fabs(out[static_cast<std::size_t>(k)] - ref[static_cast<std::size_t>(k)]);
        if (!(e <= err)) err = e;  // keeps a NaN
        mag = std::fmax(mag, std::fabs(ref[static_cast<std::size_t>(k)]));
      }
      const double r = ref_lse[static_cast<std::size_t>(h)];
      const double lse_err =
          std::fabs(lse[static_cast<std::size_t>(h)] - r) / std::fmax(1.0, std::fabs(r));
      for (double x : {err / mag, lse_err})
        if (!(x <= worst)) worst = x;
    }
    std::printf("%-8s %-8s %-11s %-52s %.2e\n", c.build.name, "yes", c.build.arch,
                c.build.isa_namespace, worst);
    if (!(worst <= 1e-2)) ++failures;  // the bf16 K/V bound of the kernel tests
  }
  std::printf("\ndispatch picks: %s\n", chosen ? chosen->build.name : "(none)");
  if (failures) std::printf("%d failure(s)\n", failures);
  return failures ? 1 : 0;
}
