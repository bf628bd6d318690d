// bench_attention_cpu: BM_BatchDecode, batch decode over paged storage, and BM_PagedAppend,
// batched streaming compression into pages (below);
// counters as in bench_common.hpp, plus:
//   contiguous_bytes_per_second  a single-sequence cpu::decode_parallel over contiguous HND
//                                buffers with the same visible items (the same bytes),
//                                stepped alternately with the paged batch in the same loop.
//                                Those buffers are the first bytes of the paged pool's own K and
//                                V memory (the pool holds at least as many slots as are
//                                visible), so both sides read the same physical memory: on this
//                                shared VM, separately allocated buffers of 1 GiB read up to
//                                10 % faster or slower than each other from one process to the
//                                next, which would swamp the kernels' difference
//   paged_over_contiguous        bytes_per_second / contiguous_bytes_per_second (target >= 0.9)
//   skew_over_balanced           (skewed rows) step seconds of the skewed batch over those of a
//                                batch of 32 equal sequences with the same visible items, also
//                                stepped alternately (target <= 1.15)
// Shapes: Hq 32, Hkv 8, d 128, bf16, pages of 64 slots (HND inside a page, shuffled), one plan
// per step reused by every iteration (as by every layer). W8/S4 L128 keeps raw tokens in a ring
// of 128 slots; uncompressed keeps every raw token (its batches of 32 would need 4 GiB, so
// they are left out).
#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "bench_common.hpp"
#include "phasekv/attention/cpu/decode.hpp"
#include "phasekv/attention/cpu/thread_driver.hpp"
#include "phasekv/compress/compressed_cache.hpp"
#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/compress/uniform_mean.hpp"
#include "phasekv/serving/batch_decode.hpp"
#include "phasekv/serving/append_run.hpp"
#include "phasekv/serving/paged_append.hpp"

#include <sys/mman.h>

namespace pkv_bench {
namespace {

constexpr std::int64_t kPage = 64;

// A batch of sequences in one paged pool, its plan and workspace.
struct PagedBatch {
  PagedBatch(int geo, const std::vector<std::int64_t>& lens, int threads) : lengths(lens) {
    const cpu::VisibilityRule rule = rule_of(geo);
    const std::int64_t B = static_cast<std::int64_t>(lengths.size());
    const std::int64_t ring = geo == kRaw ? 0 : 128;
    std::int64_t raw_pages = 0, ent_pages = 0;
    std::vector<std::int64_t> rp(B), ep(B);
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t n = lengths[b];
      const phasekv::Visibility v = rule.at(n);
      visible += v.total();
      rp[b] = ((ring > 0 ? std::min(n, ring) : n) + kPage - 1) / kPage;
      ep[b] = (v.entries + kPage - 1) / kPage;
      raw_pages += rp[b];
      ent_pages += ep[b];
    }
    const std::int64_t pages = raw_pages + ent_pages;
    const std::size_t per_page = static_cast<std::size_t>(kPage * kHkv * kD);
    kbuf = alloc<bf16_t>(per_page * pages);
    vbuf = alloc<bf16_t>(per_page * pages);
    fill(kbuf.get(), per_page * pages, 21);
    fill(vbuf.get(), per_page * pages, 22);
    std::vector<std::int32_t> perm(static_cast<std::size_t>(pages));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(5));
    std::size_t next = 0;
    rptr.push_back(0);
    eptr.push_back(0);
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t i = 0; i < rp[b]; ++i) rind.push_back(perm[next++]);
      for (std::int64_t i = 0; i < ep[b]; ++i) eind.push_back(perm[next++]);
      rptr.push_back(static_cast<std::int32_t>(rind.size()));
      eptr.push_back(static_cast<std::int32_t>(eind.size()));
    }
    eind.push_back(0);
    q.resize(static_cast<std::size_t>(B * kHq * kD));
    fill(q.data(), q.size(), 23);
    out.resize(static_cast<std::size_t>(B * kHq * kD));
    lse.resize(static_cast<std::size_t>(B * kHq));
    const auto pool = phasekv::make_page_pool<const bf16_t>(kbuf.get(), vbuf.get(), pages, kPage,
                                                            kHkv, kD, kD, phasekv::Layout::HND);
    args.q = q.data();
    args.q_heads = kHq;
    args.kv_heads = kHkv;
    args.d_k = kD;
    args.d_v = kD;
    args.kv.raw_pool = pool;
    args.kv.entry_pool = pool;
    args.kv.raw_table = phasekv::csr_block_table(rptr.data(), rind.data(), B);
    args.kv.entry_table = phasekv::csr_block_table(eptr.data(), eind.data(), B);
    args.kv.lengths = lengths.data();
    args.kv.batch = B;
    args.kv.rule = rule;
    args.kv.ring_slots = ring;
    args.variant.scale = phasekv::default_scale(kD);
    args.out = out.data();
    args.lse = lse.data();
    plan.plan(args, threads);
    ws.resize(plan.workspace_bytes() / sizeof(float) + 1);
    step_bytes = static_cast<std::size_t>(visible * kHkv * kD * 2) * sizeof(bf16_t);
    pool_elements = per_page * pages;
    regions = {{kbuf.get(), per_page * pages * sizeof(bf16_t)},
               {vbuf.get(), per_page * pages * sizeof(bf16_t)}};
  }
  double step(cpu::ThreadPool& tp) {
    const auto t0 = Clock::now();
    phasekv::batch_decode_parallel<Arch>(plan, args, tp, ws.data(), ws.size() * sizeof(float));
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    benchmark::DoNotOptimize(out.data());
    return sec;
  }

  std::vector<std::int64_t> lengths;
  std::int64_t visible = 0;
  std::size_t step_bytes = 0;
  std::size_t pool_elements = 0;  // of K (and of V)
  Buffer<bf16_t> kbuf, vbuf;
  std::vector<std::int32_t> rptr, rind, eptr, eind;
  std::vector<float> q, out, lse, ws;
  phasekv::BatchDecodeArgs<bf16_t> args;
  phasekv::DecodePlan plan;
  Regions regions;
};

// One sequence in contiguous HND buffers with `visible` items (entries then raw, as a
// compressed cache; all raw when uncompressed), over the caller's memory `keys` / `values`
// (at least visible * kHkv * kD elements each: the paged batch's pool).
struct ContiguousOne {
  ContiguousOne(int geo, std::int64_t visible, int threads, const bf16_t* keys,
                const bf16_t* values)
      : q(static_cast<std::size_t>(kHq * kD)), out(q.size()), lse(static_cast<std::size_t>(kHq)) {
    const std::size_t count = static_cast<std::size_t>(visible * kHkv * kD);
    kbuf = keys;
    vbuf = values;
    fill(q.data(), q.size(), 33);
    const std::int64_t raw = geo == kRaw ? visible : std::min<std::int64_t>(visible, 128);
    const std::int64_t ent = visible - raw;
    args.q = q.data();
    args.q_heads = kHq;
    args.kv_heads = kHkv;
    args.d_k = kD;
    args.d_v = kD;
    args.variant.scale = phasekv::default_scale(kD);
    args.out = out.data();
    args.lse = lse.data();
    const std::int64_t row = kHkv * kD;
    args.kv.push({phasekv::make_view<const bf16_t>(kbuf, ent, kHkv, kD, phasekv::Layout::HND),
                  phasekv::make_view<const bf16_t>(vbuf, ent, kHkv, kD, phasekv::Layout::HND), 0,
                  phasekv::SegmentKind::compressed});
    args.kv.push(
        {phasekv::make_view<const bf16_t>(kbuf + ent * row, raw, kHkv, kD, phasekv::Layout::HND),
         phasekv::make_view<const bf16_t>(vbuf + ent * row, raw, kHkv, kD, phasekv::Layout::HND), 0,
         phasekv::SegmentKind::raw});
    ws.resize(cpu::decode_workspace_size(args, threads) / sizeof(float) + 1);
    step_bytes = count * 2 * sizeof(bf16_t);
  }
  double step(cpu::ThreadPool& tp) {
    const auto t0 = Clock::now();
    cpu::decode_parallel<Arch>(args, tp, ws.data(), ws.size() * sizeof(float));
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    benchmark::DoNotOptimize(out.data());
    return sec;
  }
  std::vector<float> q, out, lse, ws;
  const bf16_t* kbuf = nullptr;
  const bf16_t* vbuf = nullptr;
  cpu::DecodeArgs<bf16_t> args;
  std::size_t step_bytes = 0;
};

// batch kinds: 0, 1, 2 = B 1, 8, 32 with lengths uniform in [1k, 64k] (seed 7); 3 = skewed
// (one 512k sequence and 31 of 2k) against 32 equal sequences of the same visible items.
std::vector<std::int64_t> batch_lengths(int kind) {
  if (kind == 3) {
    std::vector<std::int64_t> v(32, 2048);
    v[0] = 524288;
    return v;
  }
  const int B = kind == 0 ? 1 : kind == 1 ? 8 : 32;
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<std::int64_t> d(1024, 65536);
  std::vector<std::int64_t> v(static_cast<std::size_t>(B));
  for (auto& x : v) x = d(rng);
  return v;
}

void BM_BatchDecode(benchmark::State& state) {
  const int geo = static_cast<int>(state.range(0));
  const int kind = static_cast<int>(state.range(1));
  const int threads = static_cast<int>(state.range(2));
  PagedBatch batch(geo, batch_lengths(kind), threads);
  if (static_cast<std::size_t>(batch.visible * kHkv * kD) > batch.pool_elements) {
    state.SkipWithError("the pool holds fewer slots than are visible");
    return;
  }
  ContiguousOne one(geo, batch.visible, threads, batch.kbuf.get(), batch.vbuf.get());
  std::unique_ptr<PagedBatch> balanced;
  if (kind == 3) {  // 32 equal sequences with the same visible items
    const phasekv::Visibility v = rule_of(geo).at(524288 + 31 * 2048);
    (void)v;
    std::int64_t lo = 1, hi = 1 << 20;  // length whose 32 copies see `batch.visible` items
    while (lo < hi) {
      const std::int64_t mid = (lo + hi) / 2;
      if (32 * rule_of(geo).at(mid).total() < batch.visible)
        lo = mid + 1;
      else
        hi = mid;
    }
    balanced = std::make_unique<PagedBatch>(geo, std::vector<std::int64_t>(32, lo), threads);
  }
  cpu::ThreadPool& tp = pool(threads);
  StreamNow now(threads);
  now.passes(2);
  batch.step(tp), one.step(tp);
  if (balanced) balanced->step(tp);
  double sec = 0.0, sec_one = 0.0, sec_bal = 0.0;
  bool first = true;
  for (auto _ : state) {
    if (first) {
      sec += batch.step(tp);
      sec_one += one.step(tp);
      if (balanced) sec_bal += balanced->step(tp);
    } else {
      if (balanced) sec_bal += balanced->step(tp);
      sec_one += one.step(tp);
      sec += batch.step(tp);
    }
    first = !first;
  }
  now.passes(2);
  const double iters = static_cast<double>(state.iterations());
  const double bps = static_cast<double>(batch.step_bytes) * iters / sec;
  const double bps_one = static_cast<double>(one.step_bytes) * iters / sec_one;
  now.report(state, bps);
  state.counters["bytes_per_second"] = bps;
  state.counters["frac_of_stream"] = bps / stream_ceiling(threads);
  state.counters["contiguous_bytes_per_second"] = bps_one;
  state.counters["paged_over_contiguous"] = bps / bps_one;
  if (balanced) state.counters["skew_over_balanced"] = sec / sec_bal;
  state.counters["visible"] = static_cast<double>(batch.visible);
  state.counters["work_items"] = static_cast<double>(batch.plan.items().size());
  state.counters["huge_frac"] = huge_frac(batch.regions);
  state.SetLabel(std::string(geometry_name(geo)) + (kind == 3 ? "_skewed" : "_uniform") + "_B" +
                 std::to_string(batch.lengths.size()) + "_P64_HND_" + path_name<Arch>());
}

void batch_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"geometry", "batch", "threads"});
  for (int t : {1, 2}) {
    for (int k : {0, 1, 2, 3}) b->Args({kCsa, k, t});
    for (int k : {0, 1}) b->Args({kRaw, k, t});
  }
}
BENCHMARK(BM_BatchDecode)->Apply(batch_args)->UseRealTime()->Unit(benchmark::kMicrosecond);

// Batched prefill into pages: B = 8 sequences of 8192 bf16 tokens (Hkv 8, d 128, W8/S4, local
// 128), appended in rounds of `chunk` tokens per sequence by one paged_append call per round
// (pages of 16 slots, HND, shuffled; a raw ring of 128 slots), side by side with B
// CompressedCaches appending the same rows (one thread). Each iteration times one pass of each
// over the whole prefill; `of_cache` is the ratio of their raw K+V bytes/s (bytes_per_second /
// cache_bytes_per_second). The new rows of a round are contiguous (16 MiB per round at chunk
// 512), as an engine's projections are.
void BM_PagedAppend(benchmark::State& state) {
  const int policy_id = static_cast<int>(state.range(0));  // 0 UniformMean, 1 GatedPool
  const std::int64_t chunk = state.range(1);
  constexpr std::int64_t B = 8, n = 8192, page = 16, local = 128;
  const phasekv::Geometry g(8, 4);
  const std::int64_t rounds = n / chunk, J = g.complete_windows(n);
  const std::int64_t ring = g.ring_capacity(local);
  // new rows: round r, sequence b, token t at row (r * B + b) * chunk + t
  const std::size_t rows = static_cast<std::size_t>(B * n);
  const std::size_t elems = rows * static_cast<std::size_t>(kHkv * kD);
  Buffer<bf16_t> nk = alloc<bf16_t>(elems), nv = alloc<bf16_t>(elems);
  fill(nk.get(), elems, 41);
  fill(nv.get(), elems, 42);
  // pages: per sequence ring / page raw pages and J / page entry pages, shuffled
  const std::int64_t rp = (ring + page - 1) / page, ep = (J + page - 1) / page;
  const std::int64_t pages = B * (rp + ep);
  const std::size_t per_page = static_cast<std::size_t>(page * kHkv * kD);
  Buffer<bf16_t> pk = alloc<bf16_t>(per_page * pages), pv = alloc<bf16_t>(per_page * pages);
  std::vector<std::int32_t> perm(static_cast<std::size_t>(pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
  std::vector<std::int32_t> rptr{0}, rind, eptr{0}, eind;
  std::size_t next = 0;
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t i = 0; i < rp; ++i) rind.push_back(perm[next++]);
    for (std::int64_t i = 0; i < ep; ++i) eind.push_back(perm[next++]);
    rptr.push_back(static_cast<std::int32_t>(rind.size()));
    eptr.push_back(static_cast<std::int32_t>(eind.size()));
  }
  const auto pool = phasekv::make_page_pool<bf16_t>(pk.get(), pv.get(), pages, page, kHkv, kD, kD,
                                                    phasekv::Layout::HND);
  std::vector<std::int64_t> lengths(B, 0);
  std::vector<std::int32_t> indptr(B + 1);
  for (std::int64_t b = 0; b <= B; ++b) indptr[b] = static_cast<std::int32_t>(b * chunk);
  phasekv::PagedAppendArgs<bf16_t> a;
  a.raw_pool = pool;
  a.entry_pool = pool;
  a.raw_table = phasekv::csr_block_table(rptr.data(), rind.data(), B);
  a.entry_table = phasekv::csr_block_table(eptr.data(), eind.data(), B);
  a.lengths = lengths.data();
  a.batch = B;
  a.ring_slots = ring;
  a.new_indptr = indptr.data();
  const auto round_rows = [&](const Buffer<bf16_t>& buf, std::int64_t r) {
    return phasekv::make_view<const bf16_t>(buf.get() + r * B * chunk * kHkv * kD, B * chunk, kHkv,
                                            kD);
  };
  double sec = 0.0, sec_cache = 0.0;
  const auto run = [&](const auto& kp, const auto& vp) {
    using KP = std::decay_t<decltype(kp)>;
    using VP = std::decay_t<decltype(vp)>;
    std::vector<phasekv::CompressedCache<bf16_t, KP, VP>> caches;
    for (std::int64_t b = 0; b < B; ++b)
      caches.emplace_back(kp, vp, kHkv, kD, kD, local, n, phasekv::Layout::HND);
    const auto paged = [&] {
      std::fill(lengths.begin(), lengths.end(), 0);
      for (std::int64_t r = 0; r < rounds; ++r) {
        a.keys = round_rows(nk, r);
        a.values = round_rows(nv, r);
        phasekv::paged_append(kp, vp, local, a);
        for (auto& len : lengths) len += chunk;
      }
    };
    const auto cached = [&] {
      for (auto& c : caches) c.clear();
      for (std::int64_t r = 0; r < rounds; ++r) {
        const auto k = round_rows(nk, r), v = round_rows(nv, r);
        for (std::int64_t b = 0; b < B; ++b)
          caches[static_cast<std::size_t>(b)].append(k.slice(b * chunk, chunk),
                                                     v.slice(b * chunk, chunk));
      }
    };
    paged();  // warm
    cached();
    for (auto _ : state) {
      sec += seconds_of(paged);
      sec_cache += seconds_of(cached);
      benchmark::DoNotOptimize(pk.get());
    }
  };
  if (policy_id == 0) {
    const phasekv::UniformMean mean(g, kD);
    run(mean, mean);
  } else {
    std::vector<float> z(static_cast<std::size_t>(kHkv * 8 * kD)), bias(kHkv * 8);
    fill(z.data(), z.size(), 43);
    fill(bias.data(), bias.size(), 44);
    const phasekv::GatedPool gate(g, kHkv, kD, kD, phasekv::GateKind::scalar,
                                  phasekv::param_view(z.data(), {kHkv, 8, 1, kD}),
                                  phasekv::param_view(bias.data(), {kHkv, 8, 1}));
    run(gate, gate);
  }
  const double iters = static_cast<double>(state.iterations());
  const double bytes = static_cast<double>(elems * 2 * sizeof(bf16_t)) * iters;
  state.counters["bytes_per_second"] = bytes / sec;
  state.counters["cache_bytes_per_second"] = bytes / sec_cache;
  state.counters["of_cache"] = sec_cache / sec;
  state.SetLabel(std::string(policy_id == 0 ? "UniformMean_" : "GatedPool_scalar_") + "chunk" +
                 std::to_string(chunk) + "_B8_P16_HND_" + path_name<Arch>());
}
BENCHMARK(BM_PagedAppend)
    ->ArgNames({"policy", "chunk"})
    ->Args({0, 16})
    ->Args({0, 512})
    ->Args({1, 512})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// One decode step's append (B = 8 sequences, 1 new bf16 token each, which completes a window
// in every sequence: 8 windows pooled through the raw pages; Hkv 1, d 64, W8/S4 L128,
// pages of 16 slots, every raw token kept) over pools of `pages` pages that the sequences'
// tables fill (lengths ~1.6 * pages / 8 tokens each): the per-call cost of AppendPlan::plan +
// paged_append_run (plan_run_us), of paged_append_run alone with the step's plan (run_us), and
// of paged_append, which walks every used table entry (paged_append_us, timed on 3 calls).
// Every iteration also times the same step over a pool of 1k pages, alternately in the same
// loop: plan_run_over_1k and run_over_1k are the ratios (target <= 2). The pool is a
// MAP_NORESERVE mapping: only the pages the step touches become resident.
struct AppendStep {
  explicit AppendStep(std::int64_t pages) {
    const phasekv::Geometry g(8, 4);
    const std::int64_t per_seq = pages / kB;
    n = per_seq * 64 / 5 - 64;               // raw n/16 + entries J/16 pages: about 5n/64
    n -= (n + 1 - g.window()) % g.stride();  // the new token completes a window (every row)
    std::int64_t next = 0;
    rptr.push_back(0), eptr.push_back(0);
    for (std::int64_t b = 0; b < kB; ++b) {
      const phasekv::PageNeeds need = phasekv::page_needs(
          phasekv::cpu::VisibilityRule::compressed(g, kLocal), 0, n + 1, kP, kP);
      for (std::int64_t i = 0; i < need.raw_pages; ++i) rind.push_back(static_cast<int>(next++));
      for (std::int64_t i = 0; i < need.entry_pages; ++i) eind.push_back(static_cast<int>(next++));
      rptr.push_back(static_cast<std::int32_t>(rind.size()));
      eptr.push_back(static_cast<std::int32_t>(eind.size()));
    }
    bytes = static_cast<std::size_t>(pages * kP * kDim) * sizeof(bf16_t);
    void* k = mmap(nullptr, 2 * bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    mem = k == MAP_FAILED ? nullptr : static_cast<bf16_t*>(k);
    lengths.assign(kB, n);
    for (std::int64_t b = 0; b <= kB; ++b) indptr.push_back(static_cast<std::int32_t>(b));
    nk.assign(static_cast<std::size_t>(kB * kDim), bf16_t{});
    fill(nk.data(), nk.size(), 51);
    const auto pool = phasekv::make_page_pool<bf16_t>(mem, mem + bytes / sizeof(bf16_t), pages, kP,
                                                      1, kDim, kDim, phasekv::Layout::HND);
    a.raw_pool = pool, a.entry_pool = pool;
    a.raw_table = phasekv::csr_block_table(rptr.data(), rind.data(), kB);
    a.entry_table = phasekv::csr_block_table(eptr.data(), eind.data(), kB);
    a.lengths = lengths.data(), a.batch = kB, a.new_indptr = indptr.data();
    a.keys = phasekv::make_view<const bf16_t>(nk.data(), kB, 1, kDim);
    a.values = a.keys;
    ok = mem != nullptr && next <= pages;
    if (!ok) return;
    plan.plan(policy, policy, kLocal, a, 1);
    ws.resize(plan.workspace_bytes());
  }
  ~AppendStep() {
    if (mem != nullptr) munmap(mem, 2 * bytes);
  }
  double plan_run() {
    return seconds_of([&] {
      phasekv::AppendPlan p;
      p.plan(policy, policy, kLocal, a, 1);
      phasekv::paged_append_run(p, policy, policy, kLocal, a, ws.data(), ws.size());
    });
  }
  double run() {
    return seconds_of(
        [&] { phasekv::paged_append_run(plan, policy, policy, kLocal, a, ws.data(), ws.size()); });
  }
  double unplanned() {
    return seconds_of([&] { phasekv::paged_append(policy, policy, kLocal, a); });
  }

  static constexpr std::int64_t kB = 8, kP = 16, kDim = 64, kLocal = 128;
  phasekv::UniformMean policy{phasekv::Geometry(8, 4), kDim};
  std::int64_t n = 0;
  std::size_t bytes = 0;
  bf16_t* mem = nullptr;
  bool ok = false;
  std::vector<std::int32_t> rptr, rind, eptr, eind, indptr;
  std::vector<std::int64_t> lengths;
  std::vector<bf16_t> nk;
  phasekv::PagedAppendArgs<bf16_t> a;
  phasekv::AppendPlan plan;
  std::vector<char> ws;
};

void BM_PagedAppendPoolSize(benchmark::State& state) {
  AppendStep big(state.range(0)), small(1024);
  if (!big.ok || !small.ok) {
    state.SkipWithError("could not map the pool");
    return;
  }
  // medians over the iterations: on a shared VM a preempted call would move a mean by more than
  // the calls' own cost
  std::vector<double> pr, r, pr1, r1;
  double old = 0, old1 = 0;
  int olds = 0;
  big.plan_run(), small.plan_run();
  for (auto _ : state) {
    pr.push_back(big.plan_run());
    pr1.push_back(small.plan_run());
    r1.push_back(small.run());
    r.push_back(big.run());
    if (olds < 3) {
      old += big.unplanned();
      old1 += small.unplanned();
      ++olds;
    }
  }
  const auto median = [](std::vector<double>& v) {
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  const double mpr = median(pr), mr = median(r), mpr1 = median(pr1), mr1 = median(r1);
  state.counters["plan_run_us"] = mpr * 1e6;
  state.counters["run_us"] = mr * 1e6;
  state.counters["plan_run_1k_us"] = mpr1 * 1e6;
  state.counters["run_1k_us"] = mr1 * 1e6;
  state.counters["plan_run_over_1k"] = mpr / mpr1;
  state.counters["run_over_1k"] = mr / mr1;
  state.counters["paged_append_us"] = old / olds * 1e6;
  state.counters["paged_append_1k_us"] = old1 / olds * 1e6;
  state.counters["tokens_per_sequence"] = static_cast<double>(big.n);
  state.SetLabel("W8S4_L128_B8_t1_P16_Hkv1_d64_bf16_" + std::to_string(state.range(0)) + "pages");
}
BENCHMARK(BM_PagedAppendPoolSize)
    ->ArgNames({"pool_pages"})
    ->Arg(1 << 10)
    ->Arg(1 << 14)
    ->Arg(1 << 17)
    ->Arg(1 << 20)
    ->Arg(1 << 22)
    ->Iterations(2000)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pkv_bench
