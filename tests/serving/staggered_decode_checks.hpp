// The element-type checks of paged batch decode with per-KV-head origins, shared by one
// translation unit per element type (test_staggered_decode*.cpp) to keep each cheap to compile.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "staggered_case.hpp"

namespace sstd {

// Lengths drawn (fixed seed) from {0, 1, 7, W-1, W, W+1, 97, 1000}; sequence 0 has length 0.
inline std::vector<std::int64_t> draw_lengths(std::int64_t B, std::int64_t W, std::uint32_t seed) {
  const std::int64_t pool[] = {0, 1, 7, W - 1, W, W + 1, 97, 1000};
  std::mt19937 rng(seed);
  std::vector<std::int64_t> v(static_cast<std::size_t>(B));
  for (auto& x : v) x = pool[rng() % 8];
  v[0] = 0;
  return v;
}

inline bool same_bits(const float* a, const float* b, std::size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

template <class T>
void expect_close_to_reference(const sst::Batch<T>& c, const std::string& what) {
  for (std::int64_t b = 0; b < c.B; ++b) {
    std::vector<double> ro, rl;
    c.reference(b, ro, rl);
    const pkt::ErrorStats e =
        pkt::compare(c.out.data() + b * c.hq * c.shape.d_v, c.lse.data() + b * c.hq, ro.data(),
                     rl.data(), c.hq, c.shape.d_v);
    ASSERT_TRUE(e.finite) << what << " sequence " << b;
    EXPECT_LE(e.max_rel, pkt::tolerance<T>()) << what << " sequence " << b;
    EXPECT_LE(e.max_lse, pkt::tolerance<T>()) << what << " sequence " << b;
  }
}

// One chunk per (sequence, head): each sequence gives the bits of cpu::decode with head_kv, for
// page sizes 1, 16, 64, threads 1, 2, 3, several origin sets (even, above S, above n) and GQA
// groups; and matches the double reference per head.
template <class T>
void same_bits_as_per_head_decode() {
  struct Geo {
    std::int64_t H, G, dk, dv, W, S, L;
    std::vector<std::int64_t> origins;
  };
  const Geo geos[] = {{3, 2, 64, 64, 8, 4, 16, {0, 3, 9}},
                      {4, 5, 56, 96, 8, 8, 0, {0, 2, 4, 6}},
                      {2, 8, 96, 64, 6, 4, 5, {1200, 1}},
                      {5, 1, 64, 56, 16, 8, 8, {0, 7, 3, 13, 1}}};
  std::uint32_t seed = 31;
  for (const Geo& g : geos) {
    sst::Shape s;
    s.kv_heads = g.H, s.group = g.G, s.d_k = g.dk, s.d_v = g.dv;
    s.W = g.W, s.S = g.S, s.L = g.L, s.origins = g.origins;
    s.lengths = draw_lengths(9, s.W, seed);
    s.lengths[2] = 1000;
    for (std::int64_t P : {1, 16, 64}) {
      s.page_size = P;
      sst::Batch<T> c(s, seed);
      std::vector<std::vector<float>> so(static_cast<std::size_t>(c.B)), sl(so.size());
      for (std::int64_t b = 0; b < c.B; ++b) c.single(b, so[b], sl[b]);
      for (int threads : {1, 2, 3}) {
        c.poison();
        const phasekv::DecodePlan plan = c.run(threads, 4096);
        ASSERT_GT(plan.runs().size(), 1u);
        for (std::int64_t b = 0; b < c.B; ++b) {
          EXPECT_TRUE(
              same_bits(c.out.data() + b * c.hq * s.d_v, so[b].data(),
                        static_cast<std::size_t>(c.hq * s.d_v)) &&
              same_bits(c.lse.data() + b * c.hq, sl[b].data(), static_cast<std::size_t>(c.hq)))
              << s.name() << " threads " << threads << " sequence " << b << " n " << s.lengths[b];
        }
        if (threads == 2) expect_close_to_reference(c, s.name());
      }
    }
    ++seed;
  }
}

// Chunks of 64 visible items (many per head): the bits do not depend on the page size, the
// layout inside a page, one or two pools, a ring, or the thread count; and they match the
// double reference per head.
template <class T>
void chunked_bits_independent_of_pages_and_threads() {
  sst::Shape s;
  s.kv_heads = 3, s.group = 3, s.d_k = 96, s.d_v = 40;
  s.W = 8, s.S = 4, s.L = 20, s.origins = {5, 0, 2};
  s.lengths = draw_lengths(8, s.W, 9);
  s.lengths[4] = 1000;
  s.page_size = 16;
  sst::Batch<T> base(s, 23);
  base.run(1, 64);
  expect_close_to_reference(base, s.name());
  for (int variant = 0; variant < 6; ++variant) {
    sst::Shape v = s;
    int threads = 1 + variant % 3;
    switch (variant) {
      case 0: v.page_size = 1; break;
      case 1: v.page_size = 64; break;
      case 2: v.layout = phasekv::Layout::HND; break;
      case 3: v.ring = true, v.page_size = 7; break;
      case 4: v.one_pool = true; break;
      default:
        v.ring = true, v.one_pool = true, v.layout = phasekv::Layout::HND, threads = 3;
        break;
    }
    sst::Batch<T> c(v, 23, {}, 57 + static_cast<std::uint32_t>(variant));
    c.run(threads, 64);
    EXPECT_TRUE(same_bits(c.out.data(), base.out.data(), c.out.size()) &&
                same_bits(c.lse.data(), base.lse.data(), c.lse.size()))
        << v.name() << " threads " << threads;
  }
}

}  // namespace sstd
