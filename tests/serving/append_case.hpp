// The append case of the paged serving tests: B sequences, each at its own length, appended in
// rounds of ragged chunks through paged_append or AppendPlan, against one CompressedCache per
// sequence (same bits per head), with per-KV-head origins or without.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "compress/compress_test_util.hpp"
#include "phasekv/compress/compressed_cache.hpp"
#include "phasekv/phase/origins.hpp"
#include "phasekv/serving/append_run.hpp"
#include "phasekv/serving/paged_append.hpp"

namespace pac {

using i64 = std::int64_t;

template <class T>
bool same(const T* a, const T* b, i64 n) {
  return std::memcmp(a, b, static_cast<std::size_t>(n) * sizeof(T)) == 0;
}

inline i64 max_of(const std::vector<i64>& v) { return *std::max_element(v.begin(), v.end()); }

// How the rounds append: paged_append in two parts (as two workers would), an AppendPlan of
// 3 workers with items of at most 5 tokens or entries (each worker's phase run on its own, in
// reverse worker order), or the two alternately (even rounds paged_append).
enum class AppendBy { parts, plan, alternate };

// Appends random chunks to B sequences of H KV heads (with per-head `origins`, or none) by
// `by` and through one CompressedCache (with the same origins) each; after each round compares
// every entry of every head and every raw token the storage must hold.
template <class T, class KP, class VP>
void append_equals_cache(const KP& kp, const VP& vp, i64 H, const std::vector<i64>& origins,
                         i64 local, i64 page, bool ring, std::mt19937_64& rng,
                         const std::string& what, i64 max_chunk, AppendBy by) {
  const phasekv::Geometry g = kp.geometry();
  const auto head = [&](i64 h) {
    return origins.empty()
               ? g
               : phasekv::Geometry(g.window(), g.stride(), origins[static_cast<std::size_t>(h)]);
  };
  const i64 dk = kp.input_dim(), dv = vp.input_dim(), B = 5, rounds = 5, W = g.window();
  const i64 ro = origins.empty() ? g.origin() : max_of(origins);
  if (max_chunk < 0) max_chunk = 3 * W + 5;
  std::vector<std::vector<i64>> chunk(static_cast<std::size_t>(rounds), std::vector<i64>(B));
  std::vector<i64> total(B, 0);
  for (auto& r : chunk)
    for (i64 b = 0; b < B; ++b) {
      r[b] = pkv_test::rand_int(rng, 0, max_chunk);
      total[b] += r[b];
    }
  std::vector<pkv_test::Tensor<T>> K, V;
  for (i64 b = 0; b < B; ++b) {
    K.emplace_back(total[b], H, dk);
    V.emplace_back(total[b], H, dv);
    K.back().randomize(rng);
    V.back().randomize(rng);
  }
  const i64 ring_slots = ring ? g.ring_capacity(local) + 2 : 0;
  std::vector<i64> rp(B), ep(B);
  i64 pages = 0;
  for (i64 b = 0; b < B; ++b) {
    i64 slots = total[b];
    if (ring && slots > ro + ring_slots) slots = ro + ring_slots;
    rp[b] = (slots + page - 1) / page;
    ep[b] = (phasekv::max_complete_windows(g, origins, total[b]) + page - 1) / page;
    pages += rp[b] + ep[b];
  }
  std::vector<std::int32_t> perm(static_cast<std::size_t>(pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<std::int32_t> rind, eind, rptr{0}, eptr{0};
  std::size_t next = 0;
  for (i64 b = 0; b < B; ++b) {
    for (i64 i = 0; i < rp[b]; ++i) rind.push_back(perm[next++]);
    for (i64 i = 0; i < ep[b]; ++i) eind.push_back(perm[next++]);
    rptr.push_back(static_cast<std::int32_t>(rind.size()));
    eptr.push_back(static_cast<std::int32_t>(eind.size()));
  }
  rind.push_back(0), eind.push_back(0);  // never empty
  std::vector<T> pool(static_cast<std::size_t>((pages + 1) * page * H * (dk + dv)));
  auto P =
      phasekv::make_kv_page_pool(pool.data(), pages + 1, page, H, dk, dv, phasekv::Layout::HND);
  phasekv::PagedAppendArgs<T> a;
  a.raw_pool = P;
  a.entry_pool = P;
  a.raw_table = phasekv::csr_block_table(rptr.data(), rind.data(), B);
  a.entry_table = phasekv::csr_block_table(eptr.data(), eind.data(), B);
  a.batch = B;
  a.ring_slots = ring_slots;
  std::vector<i64> len(B, 0);
  a.lengths = len.data();
  a.origins = origins.empty() ? nullptr : origins.data();
  std::vector<phasekv::CompressedCache<T, KP, VP>> caches;
  for (i64 b = 0; b < B; ++b)
    caches.emplace_back(kp, vp, H, dk, dv, local, total[b], phasekv::Layout::NHD, origins);
  for (i64 r = 0; r < rounds; ++r) {
    std::vector<std::int32_t> indptr{0};
    for (i64 b = 0; b < B; ++b)
      indptr.push_back(indptr.back() + static_cast<std::int32_t>(chunk[r][b]));
    pkv_test::Tensor<T> nk(indptr.back(), H, dk), nv(indptr.back(), H, dv);
    for (i64 b = 0; b < B; ++b)
      for (i64 t = 0; t < chunk[r][b]; ++t)
        for (i64 h = 0; h < H; ++h) {
          std::memcpy(nk.view().ptr(indptr[b] + t, h), K[b].cview().ptr(len[b] + t, h),
                      dk * sizeof(T));
          std::memcpy(nv.view().ptr(indptr[b] + t, h), V[b].cview().ptr(len[b] + t, h),
                      dv * sizeof(T));
        }
    a.new_indptr = indptr.data();
    a.keys = nk.cview();
    a.values = nv.cview();
    if (by == AppendBy::parts || (by == AppendBy::alternate && r % 2 == 0)) {
      phasekv::paged_append(kp, vp, local, a, 1, 2);
      phasekv::paged_append(kp, vp, local, a, 0, 2);
    } else {
      phasekv::AppendPlan plan;
      plan.plan(kp, vp, local, a, 3, {}, 5);
      std::vector<unsigned char> ws(plan.workspace_bytes());
      for (int w = 2; w >= 0; --w)
        phasekv::paged_append_entries_run(plan, kp, vp, local, a, ws.data(), ws.size(), w);
      for (int w = 2; w >= 0; --w) phasekv::paged_append_raw_run(plan, a, w);
      EXPECT_EQ(plan.lengths_after()[0], len[0] + chunk[r][0]);
    }
    for (i64 b = 0; b < B; ++b) {
      caches[b].append(K[b].cview().slice(len[b], chunk[r][b]),
                       V[b].cview().slice(len[b], chunk[r][b]));
      len[b] += chunk[r][b];
      for (i64 h = 0; h < H; ++h) {
        const i64 J = caches[b].num_entries(h);
        ASSERT_EQ(J, head(h).complete_windows(len[b]));
        for (i64 j = 0; j < J; ++j) {
          const i64 pg = a.entry_table.page(b, j / page);
          ASSERT_TRUE(same(P.key(pg, j % page, h), caches[b].entry_keys(h).ptr(j, 0), dk))
              << what << " round " << r << " sequence " << b << " entry " << j << " head " << h;
          ASSERT_TRUE(same(P.value(pg, j % page, h), caches[b].entry_values(h).ptr(j, 0), dv))
              << what << " round " << r << " sequence " << b << " entry " << j << " head " << h;
        }
      }
      for (i64 p = 0; p < len[b]; ++p) {
        // a ring holds the positions below O_max and the last ring_slots
        if (ring && p >= ro && p < len[b] - ring_slots) continue;
        const i64 s = phasekv::PagedKV<T>::raw_slot(p, ro, ring_slots);
        const i64 pg = a.raw_table.page(b, s / page);
        for (i64 h = 0; h < H; ++h) {
          ASSERT_TRUE(same(P.key(pg, s % page, h), K[b].cview().ptr(p, h), dk))
              << what << " raw " << p << " sequence " << b;
          ASSERT_TRUE(same(P.value(pg, s % page, h), V[b].cview().ptr(p, h), dv))
              << what << " raw " << p << " sequence " << b;
        }
      }
      // every raw token head h still sees is among those: its prefix lies below O_max, its
      // raw tail within the last ring_slots (or below O_max)
      for (i64 h = 0; h < H && ring; ++h) {
        const phasekv::Visibility vis = head(h).visible(len[b], local);
        EXPECT_LE(vis.prefix_end, ro);
        const i64 lo = vis.raw_begin > ro ? vis.raw_begin : ro;
        EXPECT_TRUE(vis.raw_count() == 0 || lo >= len[b] - ring_slots) << what << " head " << h;
      }
    }
  }
}

}  // namespace pac
