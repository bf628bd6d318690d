// A minimal continuous-batching loop over phasekv's paged, compressed KV cache: the file an
// engine developer reads first (docs/serving.md explains the pieces).
//
// Requests with different prompt lengths arrive over time. Each step, every running request
// contributes its next rows: a chunk of up to 512 prompt tokens while it is prefilling, one
// token once it decodes, so prefill chunks and decode rows share one batch. Per step:
//   1. pages for the new tokens come from a free list (raw ring pages once, entry pages as the
//      entries grow; page_needs says how many) and go back to it when no request lists them;
//   2. an AppendPlan is made for the step and its run writes the new keys/values and
//      compresses every window that completes into the request's entry pages (W8/S4, mean
//      pooling, local window 128), its items split over both threads;
//   3. one PrefillPlan is made for the step and runs the attention of every row (a decode row
//      is a prefill of one query); steps with decode rows only use a DecodePlan instead;
//      a model with many layers reuses the step's plans for each layer.
// Requests 0 and 1 start with the same 1024-token system prompt: request 1 is admitted when
// request 0 has cached it and reads its complete entry pages (prefix sharing; reference
// counts keep them until neither lists them), copying only the pages it will write (its ring
// and the partial entry page: copy-on-write is the engine's). Queries and outputs are bf16.
// The keys, values and queries are random stand-ins for a model's. At the end the loop prints
// steps/s and checks the last outputs of a few requests against the double reference.
//
// Usage: example_serving_loop [--small]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "phasekv/attention/reference.hpp"
#include "phasekv/compress/compress_batch.hpp"
#include "phasekv/compress/uniform_mean.hpp"
#include "phasekv/serving/append_run.hpp"
#include "phasekv/serving/batch_decode.hpp"
#include "phasekv/serving/batch_prefill.hpp"
#include "phasekv/serving/sharing.hpp"

namespace {

using T = phasekv::bf16_t;
constexpr std::int64_t kHkv = 2, kG = 4, kHq = kHkv * kG, kD = 64;
constexpr std::int64_t kPage = 64, kChunk = 512, kLocal = 128;
const phasekv::Geometry kGeometry(8, 4, 0);
// the ring must hold a whole chunk plus the local window (docs/serving.md)
constexpr std::int64_t kRing = kChunk + kLocal;
constexpr std::int64_t kSystem = 1024;  // the system prompt of requests 0 and 1
constexpr std::uint64_t kSystemStream = 1000;

struct Request {
  std::int64_t id = 0, prompt = 0, decode = 0;  // prompt tokens, tokens to generate
  std::int64_t n = 0;                           // tokens in the cache
  std::vector<std::int32_t> raw_pages, entry_pages;
  std::vector<T> k, v;  // every token's keys and values (only for the reference check)
  std::vector<float> last_q, last_out, last_lse;  // (widened from bf16)
  bool done() const { return n >= prompt + decode; }
};

// Deterministic stand-in for the model's K/V/Q of token `p` of request `id`.
void make_token(std::uint64_t id, std::int64_t p, T* k, T* v) {
  if (id < 2 && p < kSystem) id = kSystemStream;  // the shared system prompt
  std::mt19937 rng(static_cast<std::uint32_t>(id * 1000003 + static_cast<std::uint64_t>(p)));
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (std::int64_t i = 0; i < kHkv * kD; ++i) k[i] = phasekv::from_float<T>(d(rng));
  for (std::int64_t i = 0; i < kHkv * kD; ++i) v[i] = phasekv::from_float<T>(0.5f * d(rng));
}

}  // namespace

int main(int argc, char** argv) {
  const bool small = argc > 1 && std::strcmp(argv[1], "--small") == 0;
  const int total_requests = small ? 6 : 24;
  const std::int64_t pages = small ? 512 : 4096;
  // one pool of [K|V] pages, HND inside a page, shared by raw and entry tables
  std::vector<T> pool(static_cast<std::size_t>(pages * kPage * kHkv * 2 * kD));
  const auto P =
      phasekv::make_kv_page_pool(pool.data(), pages, kPage, kHkv, kD, kD, phasekv::Layout::HND);
  std::vector<std::int32_t> free_pages(static_cast<std::size_t>(pages));
  for (std::int64_t i = 0; i < pages; ++i)
    free_pages[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(pages - 1 - i);
  std::vector<int> refs(static_cast<std::size_t>(pages), 0);  // requests listing each page
  const auto take_page = [&]() -> std::int32_t {
    if (free_pages.empty()) {
      std::fprintf(stderr, "out of pages\n");
      std::exit(1);
    }
    const std::int32_t pg = free_pages.back();
    free_pages.pop_back();
    refs[static_cast<std::size_t>(pg)] = 1;
    return pg;
  };
  const auto drop_page = [&](std::int32_t pg) {
    if (--refs[static_cast<std::size_t>(pg)] == 0) free_pages.push_back(pg);
  };
  const phasekv::UniformMean policy(kGeometry, kD);
  const auto rule = phasekv::cpu::VisibilityRule::compressed(kGeometry, kLocal);
  phasekv::cpu::ThreadPool threads(2);

  std::mt19937 arrivals(42);
  std::vector<Request> running, finished;
  int next_id = 2;  // requests 0 and 1 are the system-prompt pair
  bool forked = false;
  std::int64_t steps = 0, rows_done = 0;
  const auto t0 = std::chrono::steady_clock::now();
  {
    Request r0;
    r0.id = 0;
    r0.prompt = kSystem + 300;
    r0.decode = 12;
    running.push_back(std::move(r0));
  }
  while (next_id < total_requests || !running.empty()) {
    // request 1 shares request 0's system prompt once it is cached (n = kSystem): the complete
    // entry pages are shared, the pages request 1 will write are copied
    if (!forked && !running.empty() && running.front().id == 0 && running.front().n == kSystem) {
      const Request& a = running.front();
      Request r;
      r.id = 1;
      r.prompt = kSystem + 200;
      r.decode = 16;
      r.n = kSystem;
      r.k = a.k, r.v = a.v;
      const std::int64_t full = kGeometry.complete_windows(kSystem) / kPage;  // whole pages
      const std::size_t page_elems = static_cast<std::size_t>(P.key_page_stride);
      for (std::size_t i = 0; i < a.entry_pages.size(); ++i) {
        if (static_cast<std::int64_t>(i) < full) {
          r.entry_pages.push_back(a.entry_pages[i]);
          ++refs[static_cast<std::size_t>(a.entry_pages[i])];
        } else {
          r.entry_pages.push_back(take_page());
          std::copy_n(pool.begin() + a.entry_pages[i] * page_elems, page_elems,
                      pool.begin() + r.entry_pages.back() * page_elems);
        }
      }
      for (const std::int32_t pg : a.raw_pages) {  // the ring is rewritten: copied
        r.raw_pages.push_back(take_page());
        std::copy_n(pool.begin() + pg * page_elems, page_elems,
                    pool.begin() + r.raw_pages.back() * page_elems);
      }
      running.push_back(std::move(r));
      forked = true;
    }
    // arrivals: up to two new requests per step while there are pages for them
    for (int a = 0; a < 2 && next_id < total_requests && arrivals() % 3 == 0; ++a) {
      Request r;
      r.id = next_id++;
      r.prompt = std::uniform_int_distribution<std::int64_t>(1, small ? 1200 : 5000)(arrivals);
      r.decode = std::uniform_int_distribution<std::int64_t>(1, small ? 20 : 64)(arrivals);
      running.push_back(std::move(r));
    }
    if (running.empty()) continue;
    const std::int64_t B = static_cast<std::int64_t>(running.size());
    // 1. the rows of this step and their pages
    std::vector<std::int32_t> new_indptr{0};
    std::vector<std::int64_t> before(static_cast<std::size_t>(B)), after(before.size());
    bool decode_only = true;
    for (std::int64_t b = 0; b < B; ++b) {
      Request& r = running[static_cast<std::size_t>(b)];
      std::int64_t rows = r.n < r.prompt ? std::min(kChunk, r.prompt - r.n) : 1;
      if (r.id == 0 && r.n < kSystem) rows = std::min(rows, kSystem - r.n);  // stop at the fork
      decode_only = decode_only && r.n >= r.prompt;
      new_indptr.push_back(new_indptr.back() + static_cast<std::int32_t>(rows));
      before[static_cast<std::size_t>(b)] = r.n;
      after[static_cast<std::size_t>(b)] = r.n + rows;
      const phasekv::PageNeeds need = phasekv::page_needs(rule, kRing, r.n + rows, kPage, kPage);
      while (static_cast<std::int64_t>(r.raw_pages.size()) < need.raw_pages)
        r.raw_pages.push_back(take_page());
      while (static_cast<std::int64_t>(r.entry_pages.size()) < need.entry_pages)
        r.entry_pages.push_back(take_page());
    }
    // block tables (CSR) of this step
    std::vector<std::int32_t> rptr{0}, rind, eptr{0}, eind;
    for (const Request& r : running) {
      rind.insert(rind.end(), r.raw_pages.begin(), r.raw_pages.end());
      eind.insert(eind.end(), r.entry_pages.begin(), r.entry_pages.end());
      rptr.push_back(static_cast<std::int32_t>(rind.size()));
      eptr.push_back(static_cast<std::int32_t>(eind.size()));
    }
    eind.push_back(0);  // (never read: keeps the pointer valid when no request has entries)
    // the model's new keys, values and queries
    const std::int64_t rows = new_indptr.back();
    std::vector<T> nk(static_cast<std::size_t>(rows * kHkv * kD)), nv(nk.size());
    std::vector<T> q(static_cast<std::size_t>(rows * kHq * kD));  // bf16 queries
    std::mt19937 qrng(static_cast<std::uint32_t>(steps));
    std::normal_distribution<float> qd(0.0f, 1.0f);
    for (auto& x : q) x = phasekv::from_float<T>(qd(qrng));
    for (std::int64_t b = 0; b < B; ++b) {
      Request& r = running[static_cast<std::size_t>(b)];
      for (std::int64_t i = new_indptr[b]; i < new_indptr[b + 1]; ++i) {
        const std::int64_t p = r.n + i - new_indptr[b];
        make_token(static_cast<std::uint64_t>(r.id), p,
                   &nk[static_cast<std::size_t>(i * kHkv * kD)],
                   &nv[static_cast<std::size_t>(i * kHkv * kD)]);
        if (r.id < 3) {  // kept for the reference check
          r.k.insert(r.k.end(), nk.begin() + i * kHkv * kD, nk.begin() + (i + 1) * kHkv * kD);
          r.v.insert(r.v.end(), nv.begin() + i * kHkv * kD, nv.begin() + (i + 1) * kHkv * kD);
        }
      }
    }
    // 2. append + compress into the pages (two workers)
    phasekv::PagedAppendArgs<T> app;
    app.raw_pool = P;
    app.entry_pool = P;
    app.raw_table = phasekv::csr_block_table(rptr.data(), rind.data(), B);
    app.entry_table = phasekv::csr_block_table(eptr.data(), eind.data(), B);
    app.lengths = before.data();
    app.batch = B;
    app.ring_slots = kRing;
    app.new_indptr = new_indptr.data();
    app.keys = phasekv::make_view<const T>(nk.data(), rows, kHkv, kD);
    app.values = phasekv::make_view<const T>(nv.data(), rows, kHkv, kD);
    phasekv::PagedKV<T> live;  // every running request, before the append: who reads what
    live.raw_pool = P;
    live.entry_pool = P;
    live.raw_table = app.raw_table;
    live.entry_table = app.entry_table;
    live.lengths = before.data();
    live.batch = B;
    live.rule = rule;
    live.ring_slots = kRing;
    std::vector<std::int32_t> readers(static_cast<std::size_t>(pages));
    phasekv::count_page_readers(live, readers.data(), readers.data());
    phasekv::AppendPlan append;
    append.plan(policy, policy, kLocal, app, threads.size(),
                phasekv::PageReaders{readers.data(), readers.data()});
    std::vector<char> append_ws(append.workspace_bytes());
    phasekv::paged_append_run_parallel(append, policy, policy, kLocal, app, threads,
                                       append_ws.data(), append_ws.size());
    // 3. attention of every row: one plan for the step
    std::vector<T> out(static_cast<std::size_t>(rows * kHq * kD));  // bf16 outputs
    std::vector<float> lse(static_cast<std::size_t>(rows * kHq));
    phasekv::PagedKV<T> kv;
    kv.raw_pool = P;
    kv.entry_pool = P;
    kv.raw_table = app.raw_table;
    kv.entry_table = app.entry_table;
    kv.lengths = after.data();
    kv.batch = B;
    kv.rule = rule;
    kv.ring_slots = kRing;
    phasekv::StandardVariant var;
    var.scale = phasekv::default_scale(kD);
    if (decode_only) {
      phasekv::BatchDecodeArgs<T, phasekv::StandardVariant, T> d;
      d.q = q.data();
      d.q_heads = kHq;
      d.kv_heads = kHkv;
      d.d_k = kD;
      d.d_v = kD;
      d.kv = kv;
      d.variant = var;
      d.out = out.data();
      d.lse = lse.data();
      phasekv::DecodePlan plan;
      plan.plan(d, threads.size());
      std::vector<float> ws(plan.workspace_bytes() / sizeof(float) + 1);
      phasekv::batch_decode_parallel(plan, d, threads, ws.data(), ws.size() * sizeof(float));
    } else {
      phasekv::BatchPrefillArgs<T, phasekv::StandardVariant, T> p;
      p.q = q.data();
      p.qo_indptr = new_indptr.data();
      p.q_heads = kHq;
      p.kv_heads = kHkv;
      p.d_k = kD;
      p.d_v = kD;
      p.kv = kv;
      p.variant = var;
      p.out = out.data();
      p.lse = lse.data();
      phasekv::PrefillPlan plan;
      plan.plan(p, threads.size());
      std::vector<float> ws(plan.workspace_bytes() / sizeof(float) + 1);
      phasekv::batch_prefill_parallel(plan, p, threads, ws.data(), ws.size() * sizeof(float));
    }
    // bookkeeping: lengths, the last row of each request, finished requests free their pages
    for (std::int64_t b = 0; b < B; ++b) {
      Request& r = running[static_cast<std::size_t>(b)];
      r.n = after[static_cast<std::size_t>(b)];
      const std::int64_t last = new_indptr[b + 1] - 1;
      r.last_q.resize(static_cast<std::size_t>(kHq * kD));
      r.last_out.resize(r.last_q.size());
      for (std::int64_t i = 0; i < kHq * kD; ++i) {
        r.last_q[static_cast<std::size_t>(i)] =
            phasekv::to_float(q[static_cast<std::size_t>(last * kHq * kD + i)]);
        r.last_out[static_cast<std::size_t>(i)] =
            phasekv::to_float(out[static_cast<std::size_t>(last * kHq * kD + i)]);
      }
      r.last_lse.assign(lse.begin() + last * kHq, lse.begin() + (last + 1) * kHq);
    }
    rows_done += rows;
    for (auto it = running.begin(); it != running.end();) {
      if (it->done()) {
        for (const std::int32_t pg : it->raw_pages) drop_page(pg);
        for (const std::int32_t pg : it->entry_pages) drop_page(pg);
        it->raw_pages.clear();
        it->entry_pages.clear();
        if (it->id < 3) finished.push_back(std::move(*it));
        it = running.erase(it);
      } else {
        ++it;
      }
    }
    ++steps;
  }
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "%d requests (0 and 1 share a %lld-token system prompt), %lld steps in %.3f s: %.1f steps/s, "
      "%.0f rows/s\n",
      total_requests, static_cast<long long>(kSystem), static_cast<long long>(steps), sec,
      static_cast<double>(steps) / sec, static_cast<double>(rows_done) / sec);
  if (free_pages.size() != static_cast<std::size_t>(pages)) {
    std::fprintf(stderr, "pages leaked\n");
    return 1;
  }
  // the last decode output of requests 0..2 against the double reference
  double worst = 0.0;
  for (const Request& r : finished) {
    const std::int64_t J = kGeometry.complete_windows(r.n);
    std::vector<T> ek(static_cast<std::size_t>(std::max<std::int64_t>(J, 1) * kHkv * kD)),
        ev(ek.size());
    const auto rk = phasekv::make_view<const T>(r.k.data(), r.n, kHkv, kD);
    const auto rv = phasekv::make_view<const T>(r.v.data(), r.n, kHkv, kD);
    phasekv::compress_batch<T>(policy, rk, phasekv::make_view(ek.data(), J, kHkv, kD));
    phasekv::compress_batch<T>(policy, rv, phasekv::make_view(ev.data(), J, kHkv, kD));
    std::vector<double> ro(static_cast<std::size_t>(kHq * kD)), rl(static_cast<std::size_t>(kHq));
    phasekv::StandardVariant var;
    var.scale = phasekv::default_scale(kD);
    const auto vis =
        rule.visible_kv<T>(r.n, rk, rv, phasekv::make_view<const T>(ek.data(), J, kHkv, kD),
                           phasekv::make_view<const T>(ev.data(), J, kHkv, kD));
    phasekv::reference_decode<T>(r.last_q.data(), kHq, vis, var, ro.data(), rl.data());
    double mag = 0.0;
    for (double x : ro) mag = std::max(mag, std::abs(x));
    for (std::int64_t i = 0; i < kHq * kD; ++i) {
      worst = std::max(worst, std::abs(r.last_out[static_cast<std::size_t>(i)] -
                                       ro[static_cast<std::size_t>(i)]) /
                                  mag);
    }
    for (std::int64_t h = 0; h < kHq; ++h)
      worst = std::max(worst, std::abs(r.last_lse[static_cast<std::size_t>(h)] -
                                       rl[static_cast<std::size_t>(h)]) /
                                  std::max(1.0, std::abs(rl[static_cast<std::size_t>(h)])));
  }
  std::printf("checked %zu requests against the double reference: worst relative error %.2e\n",
              finished.size(), worst);
  return worst < 1e-2 && !finished.empty() ? 0 : 1;
}
