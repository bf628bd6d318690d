// bench_attention_cpu: decode rows (BM_Decode, BM_DecodeNHD, BM_DecodeSpeedup, BM_DecodeCached,
// BM_DecodeDispatch, BM_DecodeBf16Dot); counters as in bench_common.hpp.
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "phasekv/attention/cpu/decode.hpp"
#include "phasekv/attention/cpu/thread_driver.hpp"

namespace pkv_bench {
namespace {

// A decode cache of one geometry at raw length n: bf16 K/V segments (prefix, entries, raw
// band) in `copies` copies, so that rotating over them keeps a step's reads out of the LLC
// (working set over twice the LLC; one copy when `resident`), and the DecodeArgs of each copy.
struct DecodeCache {
  DecodeCache(int geo, std::int64_t n, phasekv::Layout layout, bool resident)
      : q(static_cast<std::size_t>(kHq * kD)),
        out(static_cast<std::size_t>(kHq * kD)),
        lse(static_cast<std::size_t>(kHq)) {
    const phasekv::Visibility vis = rule_of(geo).at(n);
    const std::int64_t row = kHkv * kD;  // elements per token (NHD)
    tokens = vis.entries + vis.prefix_end + vis.raw_count();
    step_bytes = static_cast<std::size_t>(tokens * row * 2) * sizeof(bf16_t);
    copies = resident ? 1
                      : std::max<std::size_t>(
                            1, std::min<std::size_t>(64, (2 * llc_bytes()) / step_bytes + 1));
    per_copy = static_cast<std::size_t>(tokens * row);
    kbuf = alloc<bf16_t>(per_copy * copies);
    vbuf = alloc<bf16_t>(per_copy * copies);
    fill(kbuf.get(), per_copy * copies, 11);
    fill(vbuf.get(), per_copy * copies, 12);
    fill(q.data(), q.size(), 13);
    args.resize(copies);
    for (std::size_t c = 0; c < copies; ++c) {
      const bf16_t* kb = kbuf.get() + c * per_copy;
      const bf16_t* vb = vbuf.get() + c * per_copy;
      cpu::DecodeArgs<bf16_t>& a = args[c];
      a.q = q.data();
      a.q_heads = kHq;
      a.kv_heads = kHkv;
      a.d_k = kD;
      a.d_v = kD;
      a.variant.scale = phasekv::default_scale(kD);
      a.out = out.data();
      a.lse = lse.data();
      std::int64_t off = 0;
      const auto seg = [&](std::int64_t count, std::int64_t first, phasekv::SegmentKind kind) {
        a.kv.push({phasekv::make_view<const bf16_t>(kb + off * row, count, kHkv, kD, layout),
                   phasekv::make_view<const bf16_t>(vb + off * row, count, kHkv, kD, layout), first,
                   kind});
        off += count;
      };
      seg(vis.prefix_end, 0, phasekv::SegmentKind::prefix);
      seg(vis.entries, 0, phasekv::SegmentKind::compressed);
      seg(vis.raw_count(), vis.raw_begin, phasekv::SegmentKind::raw);
    }
  }
  // One step over the next copy with `tp`; returns its seconds.
  template <class DecodeArch>
  double step(cpu::ThreadPool& tp, std::vector<float>& ws) {
    const auto t0 = Clock::now();
    cpu::decode_parallel<DecodeArch>(args[next++ % copies], tp, ws.data(),
                                     ws.size() * sizeof(float));
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    benchmark::DoNotOptimize(out.data());
    return sec;
  }
  // The same step as step<A> without the entry point: the kernel of explicit tag A called
  // directly on the pool (no argument or CPU check), for the cost of the checks.
  template <class A>
  double step_kernel(cpu::ThreadPool& tp, std::vector<float>& ws) {
    const auto t0 = Clock::now();
    const cpu::DecodeArgs<bf16_t>& a = args[next++ % copies];
    tp.run([&](int i, int count) {
      kernel_decode_partition(cpu::detail::target_t<A>{}, A{}, a, ws.data(), i, count);
    });
    cpu::detail::decode_merge_unchecked(a, ws.data(), tp.size(), 0, 1);
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    benchmark::DoNotOptimize(out.data());
    return sec;
  }
  // One step over every copy, untimed: pages in the buffers and warms the pool.
  template <class DecodeArch>
  void warm(cpu::ThreadPool& tp, std::vector<float>& ws) {
    for (std::size_t c = 0; c < copies; ++c) step<DecodeArch>(tp, ws);
  }
  // Workspace for `threads` partitions (all copies have the same shape).
  std::vector<float> workspace(int threads) const {
    return std::vector<float>(cpu::decode_workspace_size(args[0], threads) / sizeof(float));
  }
  // The K and V buffers (all copies).
  Regions regions() const {
    const std::size_t bytes = per_copy * copies * sizeof(bf16_t);
    return {{kbuf.get(), bytes}, {vbuf.get(), bytes}};
  }

  std::int64_t tokens = 0;     // visible rows per KV head and step
  std::size_t step_bytes = 0;  // K+V bytes a step reads
  std::size_t copies = 1, per_copy = 0, next = 0;
  Buffer<bf16_t> kbuf, vbuf;
  std::vector<float> q, out, lse;
  std::vector<cpu::DecodeArgs<bf16_t>> args;
};

// One decode step per iteration; the cache is head-major (HND: [Hkv, tokens, d] per segment),
// the layout a CPU engine should use (every (block, head) step then reads contiguous memory).
// BM_DecodeNHD runs the same with token-major segments for comparison. With `resident` the
// same cache is used by every step (no rotation), so a cache small enough stays in the
// cores' L2/L3 and the step runs at the speed of its arithmetic (BM_DecodeCached).
template <class DecodeArch = Arch>
void run_decode(benchmark::State& state, int geo, std::int64_t n, int threads,
                phasekv::Layout layout, bool resident = false) {
  DecodeCache cache(geo, n, layout, resident);
  const double ceiling = stream_ceiling(threads);
  const double fma_peak = fma_ceiling(threads);
  cpu::ThreadPool& tp = pool(threads);
  std::vector<float> ws = cache.workspace(threads);
  StreamNow now(threads);
  if (!resident) now.passes(2);  // (a resident cache is not a DRAM row)
  cache.warm<DecodeArch>(tp, ws);
  double seconds = 0.0;
  for (auto _ : state) seconds += cache.step<DecodeArch>(tp, ws);
  if (!resident) now.passes(2);
  const double iters = static_cast<double>(state.iterations());
  const double bps = static_cast<double>(cache.step_bytes) * iters / seconds;
  now.report(state, bps);
  // useful FLOP per step: 2 (d_k + d_v) per (query head, visible token): q.k and p.v
  const double fps = static_cast<double>(cache.tokens) * kHq * 2.0 * (2 * kD) * iters / seconds;
  state.counters["bytes_per_second"] = bps;
  state.counters["frac_of_stream"] = bps / ceiling;
  state.counters["stream_ceiling"] = ceiling;
  state.counters["flops"] = fps;
  state.counters["frac_of_fma_peak"] = fps / fma_peak;
  state.counters["fma_ceiling"] = fma_peak;
  state.counters["visible"] = static_cast<double>(cache.tokens);
  state.counters["step_bytes"] = static_cast<double>(cache.step_bytes);
  state.counters["copies"] = static_cast<double>(cache.copies);
  state.counters["huge_frac"] = huge_frac(cache.regions());
  state.SetLabel(std::string(geometry_name(geo)) +
                 (layout == phasekv::Layout::HND ? "_HND_" : "_NHD_") + path_name<DecodeArch>());
}

void BM_Decode(benchmark::State& state) {
  run_decode(state, static_cast<int>(state.range(0)), state.range(1),
             static_cast<int>(state.range(2)), phasekv::Layout::HND);
}

void BM_DecodeNHD(benchmark::State& state) {
  run_decode(state, static_cast<int>(state.range(0)), state.range(1),
             static_cast<int>(state.range(2)), phasekv::Layout::NHD);
}

void decode_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"geometry", "n", "threads"});
  for (int g : {kCsa, kHca, kRaw})
    for (std::int64_t n : {4096, 65536, 524288})
      for (int t : {1, 2}) b->Args({g, n, t});
}
BENCHMARK(BM_Decode)->Apply(decode_args)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeNHD)
    ->ArgNames({"geometry", "n", "threads"})
    ->Args({kCsa, 524288, 2})
    ->Args({kRaw, 524288, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// W8/S4 against uncompressed, side by side: every iteration runs one step of each over its own
// cache (order alternating between iterations), so both see the same moments of a machine
// whose bandwidth drifts (separate BM_Decode rows can run a minute apart, in different
// moments). Counters:
//   speedup            uncompressed seconds / W8/S4 seconds, summed over the iterations
//   speedup_ideal      uncompressed step bytes / W8/S4 step bytes (the rate if both read at the
//                      same bytes per second)
//   frac_of_ideal      speedup / speedup_ideal
//   csa_bytes_per_second, raw_bytes_per_second   each geometry's rate within this row
// The issue-4 target (W8/S4 at least 3.2x faster at n = 524288, 2 threads) is judged here as
// well as from the two BM_Decode rows.
void BM_DecodeSpeedup(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  DecodeCache csa(kCsa, n, phasekv::Layout::HND, false);
  DecodeCache raw(kRaw, n, phasekv::Layout::HND, false);
  cpu::ThreadPool& tp = pool(threads);
  std::vector<float> ws_csa = csa.workspace(threads), ws_raw = raw.workspace(threads);
  csa.warm<Arch>(tp, ws_csa);
  raw.warm<Arch>(tp, ws_raw);
  double sec_csa = 0.0, sec_raw = 0.0;
  bool csa_first = true;
  for (auto _ : state) {
    if (csa_first) {
      sec_csa += csa.step<Arch>(tp, ws_csa);
      sec_raw += raw.step<Arch>(tp, ws_raw);
    } else {
      sec_raw += raw.step<Arch>(tp, ws_raw);
      sec_csa += csa.step<Arch>(tp, ws_csa);
    }
    csa_first = !csa_first;
  }
  const double iters = static_cast<double>(state.iterations());
  const double ideal = static_cast<double>(raw.step_bytes) / static_cast<double>(csa.step_bytes);
  state.counters["speedup"] = sec_raw / sec_csa;
  state.counters["speedup_ideal"] = ideal;
  state.counters["frac_of_ideal"] = sec_raw / sec_csa / ideal;
  state.counters["csa_bytes_per_second"] = static_cast<double>(csa.step_bytes) * iters / sec_csa;
  state.counters["raw_bytes_per_second"] = static_cast<double>(raw.step_bytes) * iters / sec_raw;
  Regions both = csa.regions();
  for (const auto& r : raw.regions()) both.push_back(r);
  state.counters["huge_frac"] = huge_frac(both);
  state.SetLabel(std::string("W8S4_L128_vs_uncompressed_HND_") + path_name<Arch>());
}
BENCHMARK(BM_DecodeSpeedup)
    ->ArgNames({"n", "threads"})
    ->Args({65536, 1})
    ->Args({65536, 2})
    ->Args({524288, 1})
    ->Args({524288, 2})
    ->MinTime(1.0)  // at least ~8 pairs of steps at n = 524288
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// The same step over one uncompressed cache of n = 1024 tokens (4 MiB of bf16 K+V, half of it
// per thread with 2 threads) that every iteration reuses, so it stays in the caches (L2 or
// L3): the rate of the kernel's arithmetic and cache traffic without DRAM. Next to BM_Decode
// it tells whether a machine's decode is bound by memory (BM_Decode well below this) or by
// compute (about equal).
void BM_DecodeCached(benchmark::State& state) {
  run_decode(state, kRaw, state.range(0), static_cast<int>(state.range(1)), phasekv::Layout::HND,
             true);
}
BENCHMARK(BM_DecodeCached)
    ->ArgNames({"n", "threads"})
    ->Args({1024, 1})
    ->Args({1024, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// The cost of run-time dispatch: decode with the default arch::Auto against the same step with
// the explicit tag of the active build, side by side (one step of each per iteration, order
// alternating) on one resident W8/S4 cache of n tokens (the cache stays in L2/L3, so the step
// is short and a per-call cost would show). auto_over_explicit = Auto seconds / explicit
// seconds (1 = no cost). explicit_over_kernel = the explicit tag's public call (argument checks
// and the check that the CPU runs the tag) over its kernel called directly on the pool.
template <class Explicit>
void decode_dispatch_pair(benchmark::State& state, std::int64_t n) {
  DecodeCache cache(kCsa, n, phasekv::Layout::HND, true);
  cpu::ThreadPool& tp = pool(1);
  std::vector<float> ws = cache.workspace(1);
  cache.warm<cpu::arch::Auto>(tp, ws);
  cache.warm<Explicit>(tp, ws);
  double sec_auto = 0.0, sec_explicit = 0.0, sec_kernel = 0.0;
  bool flip = false;
  for (auto _ : state) {
    if (flip) {
      sec_auto += cache.step<cpu::arch::Auto>(tp, ws);
      sec_explicit += cache.step<Explicit>(tp, ws);
      sec_kernel += cache.step_kernel<Explicit>(tp, ws);
    } else {
      sec_kernel += cache.step_kernel<Explicit>(tp, ws);
      sec_explicit += cache.step<Explicit>(tp, ws);
      sec_auto += cache.step<cpu::arch::Auto>(tp, ws);
    }
    flip = !flip;
  }
  state.counters["auto_over_explicit"] = sec_auto / sec_explicit;
  state.counters["explicit_over_kernel"] = sec_explicit / sec_kernel;
  state.counters["auto_us"] = 1e6 * sec_auto / static_cast<double>(state.iterations());
  state.counters["explicit_us"] = 1e6 * sec_explicit / static_cast<double>(state.iterations());
  state.SetLabel(std::string("W8S4_L128_HND_auto_vs_") + Explicit::name);
}

void BM_DecodeDispatch(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  switch (cpu::active_arch()) {
#if PHASEKV_HAS_AVX512
    case cpu::ArchId::avx512: decode_dispatch_pair<cpu::arch::Avx512>(state, n); break;
#endif
#if PHASEKV_HAS_AVX2
    case cpu::ArchId::avx2: decode_dispatch_pair<cpu::arch::Avx2>(state, n); break;
#endif
    default: decode_dispatch_pair<cpu::NativeArch>(state, n); break;
  }
}
BENCHMARK(BM_DecodeDispatch)->ArgName("n")->Arg(4096)->UseRealTime()->Unit(benchmark::kMicrosecond);

#if PHASEKV_HAS_AVX512BF16
// The AVX512-BF16 split-query dot path (arch::Avx512Bf16), side by side with BM_Decode's
// widen-and-FMA path on the same shapes.
void BM_DecodeBf16Dot(benchmark::State& state) {
  if (!cpu::cpu_supports<cpu::arch::Avx512Bf16>()) {
    state.SkipWithError("this CPU lacks AVX512-BF16");
    return;
  }
  run_decode<cpu::arch::Avx512Bf16>(state, static_cast<int>(state.range(0)), state.range(1),
                                    static_cast<int>(state.range(2)), phasekv::Layout::HND);
}
BENCHMARK(BM_DecodeBf16Dot)
    ->ArgNames({"geometry", "n", "threads"})
    ->Args({kRaw, 65536, 1})
    ->Args({kRaw, 524288, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
#endif

}  // namespace
}  // namespace pkv_bench
