// AppendPlan's checks (plan time and run time), the raw-only append, page_needs, and
// read-only page sharing: a prefix-sharing batch and a beam batch give the bits of unshared
// copies in batch decode and batch prefill, and a step that would write a shared page is
// refused (issue 39, points 2, 4 and 5).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "phasekv/compress/max_pool.hpp"
#include "phasekv/compress/uniform_mean.hpp"
#include "phasekv/serving/append_run.hpp"
#include "phasekv/serving/batch_decode.hpp"
#include "phasekv/serving/batch_prefill.hpp"
#include "phasekv/serving/sharing.hpp"

// Counts the allocations of this binary, for the check that runs never allocate. (GCC's
// -Wmismatched-new-delete takes the replaced operators' malloc/free for a mismatch once they
// are inlined; they are kept out of line.)
static std::atomic<long> g_allocations{0};
#if defined(__GNUC__)
#define PKV_TEST_NOINLINE __attribute__((noinline))
#else
#define PKV_TEST_NOINLINE
#endif
PKV_TEST_NOINLINE void* operator new(std::size_t n) {
  ++g_allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
PKV_TEST_NOINLINE void operator delete(void* p) noexcept { std::free(p); }
PKV_TEST_NOINLINE void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

using i64 = std::int64_t;
constexpr i64 kH = 2, kD = 16, kP = 4, kPages = 512;
const phasekv::Geometry kG(8, 4, 2);
constexpr i64 kLocal = 6;

// Token row (position p, head h, channel c) of a stream `seed`: equal seeds, equal rows.
float token(int seed, i64 p, i64 h, i64 c, bool key) {
  const unsigned x = static_cast<unsigned>(seed * 7919 + p * 131 + h * 17 + c * 3 + (key ? 1 : 2));
  return static_cast<float>((x * 2654435761u) >> 20) / 4096.0f - 0.5f;
}

// Paged storage of a batch in one [K|V] pool, per-sequence tables grown by page_needs.
struct Store {
  std::vector<float> mem = std::vector<float>(static_cast<std::size_t>(kPages * kP * kH * 2 * kD));
  phasekv::PagePool<float> pool =
      phasekv::make_kv_page_pool(mem.data(), kPages, kP, kH, kD, kD, phasekv::Layout::HND);
  std::vector<std::vector<std::int32_t>> rt, et;
  std::vector<i64> len;
  std::vector<std::int32_t> rptr, rind, eptr, eind;
  std::int32_t next = 0;

  std::vector<i64> origins;  // per-KV-head origins (the policies' origin is then 0), or none

  explicit Store(i64 B, std::vector<i64> o = {}) : rt(B), et(B), len(B, 0), origins(std::move(o)) {}
  i64 batch() const { return static_cast<i64>(len.size()); }
  phasekv::Geometry geometry() const {
    return origins.empty() ? kG : phasekv::Geometry(kG.window(), kG.stride());
  }
  phasekv::cpu::VisibilityRule rule() const {
    return phasekv::cpu::VisibilityRule::compressed(geometry(), kLocal);
  }
  const std::int64_t* origin_ptr() const { return origins.empty() ? nullptr : origins.data(); }
  // Entries every head has completed after n tokens (the smallest J_h(n)).
  i64 common_entries(i64 n) const {
    i64 J = geometry().complete_windows(n);
    for (i64 o : origins)
      J = std::min(J, phasekv::Geometry(kG.window(), kG.stride(), o).complete_windows(n));
    return J;
  }
  void flatten() {
    rptr = {0}, eptr = {0}, rind.clear(), eind.clear();
    for (i64 b = 0; b < batch(); ++b) {
      rind.insert(rind.end(), rt[b].begin(), rt[b].end());
      eind.insert(eind.end(), et[b].begin(), et[b].end());
      rptr.push_back(static_cast<std::int32_t>(rind.size()));
      eptr.push_back(static_cast<std::int32_t>(eind.size()));
    }
    rind.push_back(0), eind.push_back(0);
  }
  phasekv::PagedKV<float> kv() {
    flatten();
    phasekv::PagedKV<float> k;
    k.raw_pool = pool, k.entry_pool = pool;
    k.raw_table = phasekv::csr_block_table(rptr.data(), rind.data(), batch());
    k.entry_table = phasekv::csr_block_table(eptr.data(), eind.data(), batch());
    k.lengths = len.data(), k.batch = batch(), k.rule = rule(), k.origins = origin_ptr();
    return k;
  }
  // Appends `t[b]` tokens of stream `seed[b]` to every sequence through an AppendPlan of 2
  // workers (new pages from page_needs), with the reader counts of the live batch.
  void append(const std::vector<i64>& t, const std::vector<int>& seed) {
    for (i64 b = 0; b < batch(); ++b) {
      const phasekv::PageNeeds need =
          phasekv::page_needs(rule(), 0, len[b] + t[b], kP, kP, origins);
      while (static_cast<i64>(rt[b].size()) < need.raw_pages) rt[b].push_back(next++);
      while (static_cast<i64>(et[b].size()) < need.entry_pages) et[b].push_back(next++);
    }
    const phasekv::PagedKV<float> live = kv();
    std::vector<std::int32_t> readers(kPages);
    phasekv::count_page_readers(live, readers.data(), readers.data());
    std::vector<std::int32_t> indptr{0};
    for (i64 b = 0; b < batch(); ++b) indptr.push_back(indptr.back() + static_cast<int>(t[b]));
    std::vector<float> k(static_cast<std::size_t>(indptr.back() * kH * kD)), v(k.size());
    for (i64 b = 0; b < batch(); ++b)
      for (i64 i = 0; i < t[b]; ++i)
        for (i64 h = 0; h < kH; ++h)
          for (i64 c = 0; c < kD; ++c) {
            const std::size_t at = static_cast<std::size_t>(((indptr[b] + i) * kH + h) * kD + c);
            k[at] = token(seed[b], len[b] + i, h, c, true);
            v[at] = token(seed[b], len[b] + i, h, c, false);
          }
    phasekv::PagedAppendArgs<float> a;
    a.raw_pool = pool, a.entry_pool = pool;
    a.raw_table = live.raw_table, a.entry_table = live.entry_table;
    a.lengths = len.data(), a.batch = batch(), a.new_indptr = indptr.data();
    a.keys = phasekv::make_view<const float>(k.data(), indptr.back(), kH, kD);
    a.values = phasekv::make_view<const float>(v.data(), indptr.back(), kH, kD);
    a.origins = origin_ptr();
    const phasekv::UniformMean p(geometry(), kD);
    phasekv::AppendPlan plan;
    plan.plan(p, p, kLocal, a, 2, phasekv::PageReaders{readers.data(), readers.data()}, 3);
    std::vector<char> ws(plan.workspace_bytes());
    phasekv::paged_append_run(plan, p, p, kLocal, a, ws.data(), ws.size());
    len = plan.lengths_after();
  }
  // Sequence `to` reads the pages of `from` that hold only its first `n` tokens (raw pages
  // wholly below n, entry pages wholly below every head's J_h(n)); the partial pages are
  // copied.
  void share_prefix(i64 from, i64 to, i64 n) {
    const i64 J = common_entries(n);
    const auto adopt = [&](const std::vector<std::int32_t>& src, std::vector<std::int32_t>& dst,
                           i64 slots) {
      for (i64 i = 0; i < phasekv::pages_for(slots, kP); ++i) {
        if ((i + 1) * kP <= slots) {
          dst.push_back(src[static_cast<std::size_t>(i)]);  // shared
          continue;
        }
        const std::int32_t page = next++;  // copy on write, the engine's
        std::memcpy(pool.keys + page * pool.key_page_stride,
                    pool.keys + src[static_cast<std::size_t>(i)] * pool.key_page_stride,
                    static_cast<std::size_t>(pool.key_page_stride) * sizeof(float));
        dst.push_back(page);
      }
    };
    adopt(rt[from], rt[to], n);
    adopt(et[from], et[to], J);
    len[to] = n;
  }
};

// Batch decode and batch prefill (the last `q` tokens of each sequence) over `s`.
std::vector<float> attend(Store& s, i64 q) {
  const i64 B = s.batch(), hq = 2 * kH;
  std::vector<float> out;
  {
    std::vector<float> qs(static_cast<std::size_t>(B * hq * kD)), o(qs.size()), lse(B * hq);
    for (std::size_t i = 0; i < qs.size(); ++i) qs[i] = token(99, static_cast<i64>(i), 0, 0, true);
    phasekv::BatchDecodeArgs<float> a;
    a.q = qs.data(), a.q_heads = hq, a.kv_heads = kH, a.d_k = kD, a.d_v = kD;
    a.kv = s.kv();
    a.variant.scale = phasekv::default_scale(kD);
    a.out = o.data(), a.lse = lse.data();
    phasekv::DecodePlan plan;
    plan.plan(a, 2, 64);
    std::vector<float> ws(plan.workspace_bytes() / sizeof(float) + 1);
    phasekv::batch_decode(plan, a, ws.data(), ws.size() * sizeof(float));
    out.insert(out.end(), o.begin(), o.end());
  }
  std::vector<std::int32_t> qo{0};
  for (i64 b = 0; b < B; ++b) qo.push_back(qo.back() + static_cast<std::int32_t>(q));
  std::vector<float> qs(static_cast<std::size_t>(qo.back() * hq * kD)), o(qs.size()),
      lse(qo.back() * hq);
  for (std::size_t i = 0; i < qs.size(); ++i) qs[i] = token(98, static_cast<i64>(i), 0, 0, true);
  phasekv::BatchPrefillArgs<float> a;
  a.q = qs.data(), a.qo_indptr = qo.data(), a.q_heads = hq, a.kv_heads = kH, a.d_k = kD;
  a.d_v = kD, a.kv = s.kv(), a.variant.scale = phasekv::default_scale(kD);
  a.out = o.data(), a.lse = lse.data();
  phasekv::PrefillPlan plan;
  plan.plan(a, 2);
  std::vector<char> ws(plan.workspace_bytes() + 1);
  phasekv::batch_prefill(plan, a, ws.data(), ws.size());
  out.insert(out.end(), o.begin(), o.end());
  return out;
}

// B sequences: a common prefix of `n` tokens (stream 1), then `t` tokens of their own.
// Unshared: each sequence appends everything into its own pages. Shared: sequence 0 appends
// the prefix, the others read its pages (partial pages copied), then all append their own
// tokens (reader counts checked). Decode and prefill give the same bits.
void shared_equals_unshared(i64 B, i64 n, i64 t, const std::vector<i64>& origins = {}) {
  std::vector<int> own(B), prefix(B, 1);
  for (i64 b = 0; b < B; ++b) own[b] = 10 + static_cast<int>(b);
  Store u(B, origins), s(B, origins);
  u.append(std::vector<i64>(B, n), prefix);
  u.append(std::vector<i64>(B, t), own);
  std::vector<i64> first(B, 0);
  first[0] = n;
  s.append(first, prefix);
  for (i64 b = 1; b < B; ++b) s.share_prefix(0, b, n);
  const phasekv::PagedKV<float> live = s.kv();
  for (i64 b = 1; b < B; ++b) {  // the shared pages are below writable_from
    const phasekv::WritableFrom w = phasekv::writable_from(live, b);
    EXPECT_EQ(w.raw, n / kP) << b;
    EXPECT_EQ(w.entries, s.common_entries(n) / kP) << b;
  }
  s.append(std::vector<i64>(B, t), own);
  EXPECT_EQ(attend(s, 3), attend(u, 3)) << "B " << B << " prefix " << n << " own " << t;
}

TEST(PageSharing, PrefixSharingBatchGivesTheBitsOfUnsharedCopies) {
  shared_equals_unshared(3, 37, 9);
  shared_equals_unshared(2, 64, 21);
}

TEST(PageSharing, BeamBatchGivesTheBitsOfUnsharedCopies) { shared_equals_unshared(4, 45, 1); }

// Per-KV-head origins: the entry pages below every head's J_h(n) are shared, the one a head
// still completes is copied; the same bits as unshared copies.
TEST(PageSharing, PerHeadOriginsGiveTheBitsOfUnsharedCopies) {
  shared_equals_unshared(3, 37, 9, {3, 0});
  shared_equals_unshared(4, 45, 1, {0, 2});
}

TEST(PageSharing, AppendIntoAPageAnotherSequenceReadsIsRefused) {
  Store s(2);
  s.append({22, 0}, {1, 1});
  s.rt[1] = s.rt[0];  // shares every raw page, the partial last one included
  s.et[1] = s.et[0];
  s.len[1] = 22;
  const std::vector<float> before = s.mem;
  try {
    s.append({0, 1}, {1, 2});
    ADD_FAILURE() << "accepted";
  } catch (const phasekv::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("raw_table sequence 1 index 5"), std::string::npos) << m;
    EXPECT_NE(m.find("listed by 2 live sequences"), std::string::npos) << m;
  }
  EXPECT_EQ(s.mem, before);
  // both append in the same step: two writers of one page, named
  try {
    s.append({1, 1}, {1, 2});
    ADD_FAILURE() << "accepted";
  } catch (const phasekv::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("overlaps"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.mem, before);
  // reader counts are read again by the run: a page another sequence began to read after the
  // plan is not written
  {
    Store t(1);
    t.append({22}, {1});
    const phasekv::PagedKV<float> live = t.kv();
    std::vector<std::int32_t> readers(kPages);
    phasekv::count_page_readers(live, readers.data(), readers.data());
    const std::int32_t indptr[] = {0, 1};
    std::vector<float> k(kH * kD, 1.0f);
    phasekv::PagedAppendArgs<float> a;
    a.raw_pool = t.pool, a.entry_pool = t.pool;
    a.raw_table = live.raw_table, a.entry_table = live.entry_table;
    a.lengths = t.len.data(), a.batch = 1, a.new_indptr = indptr;
    a.keys = a.values = phasekv::make_view<const float>(k.data(), 1, kH, kD);
    const phasekv::UniformMean p(t.geometry(), kD);
    phasekv::AppendPlan plan;
    plan.plan(p, p, kLocal, a, 1, phasekv::PageReaders{readers.data(), readers.data()});
    std::vector<char> ws(plan.workspace_bytes());
    readers[static_cast<std::size_t>(t.rt[0][5])] = 2;  // raw page 5 (positions 20..23) shared
    const std::vector<float> mem = t.mem;
    try {
      phasekv::paged_append_run(plan, p, p, kLocal, a, ws.data(), ws.size());
      ADD_FAILURE() << "accepted";
    } catch (const phasekv::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("raw_table sequence 0 index 5"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(t.mem, mem);
    readers[static_cast<std::size_t>(t.rt[0][5])] = 1;
    EXPECT_NO_THROW(phasekv::paged_append_run(plan, p, p, kLocal, a, ws.data(), ws.size()));
  }
  // a page listed at another index by another sequence stays refused for reads as well
  s.rt[1] = {s.rt[0][1], s.rt[0][0], s.rt[0][2], s.rt[0][3], s.rt[0][4], s.rt[0][5]};
  phasekv::DecodePlan plan;
  phasekv::BatchDecodeArgs<float> a;
  std::vector<float> q(2 * 4 * kD), o(q.size()), lse(8);
  a.q = q.data(), a.q_heads = 4, a.kv_heads = kH, a.d_k = kD, a.d_v = kD, a.kv = s.kv();
  a.out = o.data(), a.lse = lse.data();
  EXPECT_THROW(plan.plan(a, 1), phasekv::invalid_argument);
}

// page_needs: min(n, O + R) raw slots with a ring, n without, J(n) entries; raw-only rules.
TEST(PageNeeds, FollowTheSlotMapping) {
  const auto rule = phasekv::cpu::VisibilityRule::compressed(kG, kLocal);
  for (i64 n : {0, 1, 2, 9, 10, 11, 50, 1000}) {
    const phasekv::PageNeeds all = phasekv::page_needs(rule, 0, n, 4, 3);
    EXPECT_EQ(all.raw_pages, (n + 3) / 4) << n;
    EXPECT_EQ(all.entry_pages, (kG.complete_windows(n) + 2) / 3) << n;
    const phasekv::PageNeeds ring = phasekv::page_needs(rule, 10, n, 4, 3);
    EXPECT_EQ(ring.raw_pages, (std::min<i64>(n, 2 + 10) + 3) / 4) << n;
    const phasekv::PageNeeds sw =
        phasekv::page_needs(phasekv::cpu::VisibilityRule::sliding_window(5), 7, n, 4, 3);
    EXPECT_EQ(sw.raw_pages, (std::min<i64>(n, 7) + 3) / 4) << n;
    EXPECT_EQ(sw.entry_pages, 0) << n;
  }
  EXPECT_THROW(phasekv::page_needs(rule, 0, -1, 4, 4), phasekv::invalid_argument);
  EXPECT_THROW(phasekv::page_needs(rule, 0, 5, 0, 4), phasekv::invalid_argument);
  // per-KV-head origins: entries of the smallest origin, the ring from the largest
  const auto rule0 = phasekv::cpu::VisibilityRule::compressed(phasekv::Geometry(8, 4), kLocal);
  const std::vector<i64> o{5, 1, 9};
  for (i64 n : {0, 1, 8, 9, 17, 50, 1000}) {
    const phasekv::PageNeeds ph = phasekv::page_needs(rule0, 10, n, 4, 3, o);
    EXPECT_EQ(ph.entry_pages, (phasekv::Geometry(8, 4, 1).complete_windows(n) + 2) / 3) << n;
    EXPECT_EQ(ph.raw_pages, (std::min<i64>(n, 9 + 10) + 3) / 4) << n;
  }
  EXPECT_THROW(phasekv::page_needs(rule, 0, 5, 4, 4, o), phasekv::invalid_argument);  // O = 2
  EXPECT_THROW(phasekv::page_needs(rule0, 0, 5, 4, 4, {0, -1}), phasekv::invalid_argument);
}

// The raw-only append of uncompressed layers: causal (every token) and a sliding-window ring.
TEST(RawOnlyAppend, WritesTheRawSlots) {
  for (const i64 ring : {i64{0}, i64{7}}) {
    const auto rule = ring ? phasekv::cpu::VisibilityRule::sliding_window(5)
                           : phasekv::cpu::VisibilityRule::causal();
    Store s(2);
    std::vector<std::int32_t> indptr = {0, 13, 13 + 3};
    const i64 rows = indptr.back();
    std::vector<float> k(static_cast<std::size_t>(rows * kH * kD)), v(k.size());
    for (std::size_t i = 0; i < k.size(); ++i) k[i] = static_cast<float>(i), v[i] = -k[i];
    std::vector<i64> len = {0, 4};
    for (i64 b = 0; b < 2; ++b) {
      const phasekv::PageNeeds need =
          phasekv::page_needs(rule, ring, len[b] + indptr[b + 1] - indptr[b], kP, kP);
      for (i64 i = 0; i < need.raw_pages; ++i) s.rt[b].push_back(s.next++);
    }
    s.flatten();
    phasekv::PagedAppendArgs<float> a;
    a.raw_pool = s.pool;
    a.raw_table = phasekv::csr_block_table(s.rptr.data(), s.rind.data(), 2);
    a.lengths = len.data(), a.batch = 2, a.ring_slots = ring, a.new_indptr = indptr.data();
    a.keys = phasekv::make_view<const float>(k.data(), rows, kH, kD);
    a.values = phasekv::make_view<const float>(v.data(), rows, kH, kD);
    phasekv::AppendPlan plan;
    plan.plan_raw(rule, a, 2, {}, 4);
    EXPECT_EQ(plan.workspace_bytes(), 0u);
    phasekv::paged_append_raw_run(plan, a, 1);
    phasekv::paged_append_raw_run(plan, a, 0);
    for (i64 b = 0; b < 2; ++b)
      for (i64 p = len[b]; p < plan.lengths_after()[b]; ++p) {
        if (ring && p < plan.lengths_after()[b] - ring) continue;
        const i64 slot = phasekv::PagedKV<float>::raw_slot(p, 0, ring);
        const i64 row = indptr[b] + p - len[b];
        for (i64 h = 0; h < kH; ++h) {
          EXPECT_EQ(
              0, std::memcmp(s.pool.key(s.rt[b][slot / kP], slot % kP, h),
                             &k[static_cast<std::size_t>((row * kH + h) * kD)], kD * sizeof(float)))
              << "ring " << ring << " b " << b << " p " << p;
          EXPECT_EQ(0, std::memcmp(s.pool.value(s.rt[b][slot / kP], slot % kP, h),
                                   &v[static_cast<std::size_t>((row * kH + h) * kD)],
                                   kD * sizeof(float)));
        }
      }
    const phasekv::UniformMean p(kG, kD);
    std::vector<char> ws(64);
    EXPECT_THROW(phasekv::paged_append_entries_run(plan, p, p, kLocal, a, ws.data(), ws.size(), 0),
                 phasekv::invalid_argument);
    EXPECT_THROW(plan.plan_raw(phasekv::cpu::VisibilityRule::compressed(kG, 0), a, 1),
                 phasekv::invalid_argument);
  }
}

// A run whose arguments differ from the plan is refused, naming the field, before writing.
TEST(AppendPlanChecks, RunsThatDifferFromThePlanAreRefused) {
  Store s(2);
  s.append({17, 5}, {1, 2});
  for (i64 b = 0; b < 2; ++b) {
    const phasekv::PageNeeds need = phasekv::page_needs(s.rule(), 0, s.len[b] + 6, kP, kP);
    while (static_cast<i64>(s.rt[b].size()) < need.raw_pages) s.rt[b].push_back(s.next++);
    while (static_cast<i64>(s.et[b].size()) < need.entry_pages) s.et[b].push_back(s.next++);
  }
  s.flatten();
  std::vector<std::int32_t> indptr = {0, 6, 12};
  std::vector<float> k(12 * kH * kD, 1.0f), v(k.size(), 2.0f);
  phasekv::PagedAppendArgs<float> a;
  a.raw_pool = s.pool, a.entry_pool = s.pool;
  a.raw_table = phasekv::csr_block_table(s.rptr.data(), s.rind.data(), 2);
  a.entry_table = phasekv::csr_block_table(s.eptr.data(), s.eind.data(), 2);
  a.lengths = s.len.data(), a.batch = 2, a.new_indptr = indptr.data();
  a.keys = phasekv::make_view<const float>(k.data(), 12, kH, kD);
  a.values = phasekv::make_view<const float>(v.data(), 12, kH, kD);
  const phasekv::UniformMean p(kG, kD);
  phasekv::AppendPlan plan;
  plan.plan(p, p, kLocal, a, 1);
  std::vector<char> ws(plan.workspace_bytes());
  const std::vector<float> before = s.mem;
  const auto refused = [&](const phasekv::PagedAppendArgs<float>& x, const char* field) {
    try {
      phasekv::paged_append_run(plan, p, p, kLocal, x, ws.data(), ws.size());
      ADD_FAILURE() << "accepted " << field;
    } catch (const phasekv::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
    EXPECT_EQ(s.mem, before) << field;
  };
  auto x = a;
  std::vector<i64> len2 = s.len;
  len2[1] += 1;
  x.lengths = len2.data();
  refused(x, "lengths[1]");
  x = a;
  std::vector<std::int32_t> ip2 = {0, 5, 12};
  x.new_indptr = ip2.data();
  refused(x, "new_indptr[1]");
  x = a;
  x.ring_slots = 12;
  refused(x, "ring_slots");
  x = a;
  x.raw_pool.pages -= 1;
  x.entry_pool.pages -= 1;
  refused(x, "raw_pool.pages");
  x = a;
  x.values.dim = 8;
  refused(x, "values.dim");
  std::vector<std::int32_t> rind2 = s.rind;
  const i64 last = s.rptr[1] - 1;  // sequence 0's last raw page: written by the step
  rind2[static_cast<std::size_t>(last)] = s.next + 1;
  x = a;
  x.raw_table = phasekv::csr_block_table(s.rptr.data(), rind2.data(), 2);
  refused(x, "raw_table sequence 0 index");
  const phasekv::UniformMean other(phasekv::Geometry(8, 4, 1), kD);
  try {
    phasekv::paged_append_run(plan, other, other, kLocal, a, ws.data(), ws.size());
    ADD_FAILURE() << "accepted another geometry";
  } catch (const phasekv::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("key_policy.geometry()"), std::string::npos);
  }
  EXPECT_THROW(phasekv::paged_append_run(plan, p, p, kLocal + 1, a, ws.data(), ws.size()),
               phasekv::invalid_argument);
  // another compressor of the same geometry and dims
  const phasekv::MaxPool mp(kG, kD);
  try {
    phasekv::paged_append_run(plan, p, mp, kLocal, a, ws.data(), ws.size());
    ADD_FAILURE() << "accepted another value policy type";
  } catch (const phasekv::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("value_policy"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.mem, before);
  // the plan itself: a touched page out of the pool, named
  x = a;
  rind2 = s.rind;
  rind2[static_cast<std::size_t>(last)] = kPages + 3;
  x.raw_table = phasekv::csr_block_table(s.rptr.data(), rind2.data(), 2);
  try {
    phasekv::AppendPlan bad;
    bad.plan(p, p, kLocal, x, 1);
    ADD_FAILURE() << "planned";
  } catch (const phasekv::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("raw_table sequence 0 index"), std::string::npos)
        << e.what();
  }
  const long allocations = g_allocations.load();
  phasekv::paged_append_run(plan, p, p, kLocal, a, ws.data(), ws.size());
  phasekv::paged_append_entries_run(plan, p, p, kLocal, a, ws.data(), ws.size(), 0);
  phasekv::paged_append_raw_run(plan, a, 0);
  const long after_runs = g_allocations.load();
  EXPECT_EQ(after_runs, allocations) << "the single-thread runs allocated";
  phasekv::cpu::ThreadPool threads(2);
  phasekv::AppendPlan two;
  two.plan(p, p, kLocal, a, 2, {}, 2);
  std::vector<char> ws2(two.workspace_bytes());
  const long before_parallel = g_allocations.load();
  phasekv::paged_append_run_parallel(two, p, p, kLocal, a, threads, ws2.data(), ws2.size());
  EXPECT_EQ(g_allocations.load(), before_parallel) << "paged_append_run_parallel allocated";
}

}  // namespace
