// A batch of sequences whose KV heads have their own origins (PagedKV::origins), stored in
// shuffled pages, with the same keys kept contiguous per sequence for cpu::decode with per-head
// visible sets and the double reference.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention/cpu_test_util.hpp"
#include "phasekv/attention/cpu/decode.hpp"
#include "phasekv/attention/reference.hpp"
#include "phasekv/serving/batch_decode.hpp"
#include "phasekv/serving/batch_prefill.hpp"
#include "phasekv/serving/paged_append.hpp"

namespace sst {

struct Shape {
  std::vector<std::int64_t> lengths;
  std::int64_t kv_heads = 3, group = 2, d_k = 64, d_v = 64;
  std::int64_t W = 8, S = 4, L = 16;
  std::vector<std::int64_t> origins{0, 3, 9};
  std::int64_t page_size = 16;
  phasekv::Layout layout = phasekv::Layout::NHD;
  bool ring = false;      // raw tokens in a ring of max(W, L) + 3 slots after O_max
  bool one_pool = false;  // raw and entry pages from one [K|V] pool

  phasekv::Geometry geometry() const { return {W, S}; }
  phasekv::Geometry head(std::int64_t h) const {
    return {W, S, origins[static_cast<std::size_t>(h)]};
  }
  std::int64_t omax() const { return *std::max_element(origins.begin(), origins.end()); }
  std::string name() const {
    std::string s = "B" + std::to_string(lengths.size()) + "_hkv" + std::to_string(kv_heads) +
                    "_g" + std::to_string(group) + "_dk" + std::to_string(d_k) + "_dv" +
                    std::to_string(d_v) + "_W" + std::to_string(W) + "S" + std::to_string(S) + "L" +
                    std::to_string(L) + "_P" + std::to_string(page_size) + "_O";
    for (std::int64_t o : origins) s += "," + std::to_string(o);
    if (layout == phasekv::Layout::HND) s += "_hnd";
    if (ring) s += "_ring";
    if (one_pool) s += "_onepool";
    return s;
  }
};

template <class T>
struct Batch {
  Shape shape;
  std::int64_t B = 0, hq = 0, ring_slots = 0;
  std::vector<std::vector<T>> raw_k, raw_v, ent_k, ent_v;  // per sequence, NHD contiguous
  std::vector<std::int64_t> jmax;
  std::vector<float> q, out, lse;
  std::vector<T> pool_k, pool_v, pool_kv, epool_k, epool_v;
  std::vector<std::int32_t> raw_indptr{0}, raw_indices, ent_indptr{0}, ent_indices;
  phasekv::BatchDecodeArgs<T> args;

  // `seed` draws the data, `layout_seed` (default: seed) the page order.
  Batch(const Shape& s, std::uint32_t seed, phasekv::StandardVariant var = {},
        std::uint32_t layout_seed = 0)
      : shape(s) {
    B = static_cast<std::int64_t>(s.lengths.size());
    hq = s.kv_heads * s.group;
    const std::int64_t H = s.kv_heads, P = s.page_size, ro = s.omax();
    if (s.ring) ring_slots = phasekv::Geometry(s.W, s.S, 0).ring_capacity(s.L) + 3;
    raw_k.resize(B), raw_v.resize(B), ent_k.resize(B), ent_v.resize(B), jmax.resize(B);
    std::vector<std::int64_t> rp(B), ep(B);
    std::int64_t raw_pages = 0, ent_pages = 0;
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t n = s.lengths[b];
      jmax[b] = phasekv::max_complete_windows(s.geometry(), s.origins, n);
      const auto u = static_cast<std::uint32_t>(seed + 101 * b);
      raw_k[b] = pkt::random_values<T>(static_cast<std::size_t>(n * H * s.d_k), u + 1);
      raw_v[b] = pkt::random_values<T>(static_cast<std::size_t>(n * H * s.d_v), u + 2, 0.25f);
      ent_k[b] = pkt::random_values<T>(static_cast<std::size_t>(jmax[b] * H * s.d_k), u + 3);
      ent_v[b] = pkt::random_values<T>(static_cast<std::size_t>(jmax[b] * H * s.d_v), u + 4, 0.25f);
      // rows at and above J_h(n) of head h are NaN: nothing may read them
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t j = s.head(h).complete_windows(n); j < jmax[b]; ++j) {
          std::fill_n(&ent_k[b][static_cast<std::size_t>((j * H + h) * s.d_k)], s.d_k,
                      phasekv::from_float<T>(NAN));
          std::fill_n(&ent_v[b][static_cast<std::size_t>((j * H + h) * s.d_v)], s.d_v,
                      phasekv::from_float<T>(NAN));
        }
      std::int64_t slots = n;
      if (ring_slots > 0 && n > ro + ring_slots) slots = ro + ring_slots;
      rp[b] = (slots + P - 1) / P;
      ep[b] = (jmax[b] + P - 1) / P;
      raw_pages += rp[b];
      ent_pages += ep[b];
    }
    q = pkt::random_floats(static_cast<std::size_t>(B * hq * s.d_k), seed + 7);
    const std::int64_t pages_raw = s.one_pool ? raw_pages + ent_pages + 3 : raw_pages + 3;
    const std::int64_t pages_ent = s.one_pool ? pages_raw : ent_pages + 3;
    std::mt19937 rng((layout_seed != 0 ? layout_seed : seed) + 11);
    std::vector<std::int32_t> perm_raw(static_cast<std::size_t>(pages_raw));
    std::iota(perm_raw.begin(), perm_raw.end(), 0);
    std::shuffle(perm_raw.begin(), perm_raw.end(), rng);
    std::vector<std::int32_t> perm_ent(static_cast<std::size_t>(pages_ent));
    std::iota(perm_ent.begin(), perm_ent.end(), 0);
    std::shuffle(perm_ent.begin(), perm_ent.end(), rng);
    std::size_t next_raw = 0, next_ent = 0;
    std::size_t* ent_cursor = s.one_pool ? &next_raw : &next_ent;
    const std::vector<std::int32_t>& ent_perm = s.one_pool ? perm_raw : perm_ent;
    const std::int64_t page_k = P * H * s.d_k, page_v = P * H * s.d_v;
    phasekv::PagePool<T> rpool, epool;
    const T poison = phasekv::from_float<T>(1e4f);  // unused slots would spoil the result
    if (s.one_pool) {
      pool_kv.assign(static_cast<std::size_t>(pages_raw * (page_k + page_v)), poison);
      rpool = phasekv::make_kv_page_pool(pool_kv.data(), pages_raw, P, H, s.d_k, s.d_v, s.layout);
      epool = rpool;
    } else {
      pool_k.assign(static_cast<std::size_t>(pages_raw * page_k), poison);
      pool_v.assign(static_cast<std::size_t>(pages_raw * page_v), poison);
      epool_k.assign(static_cast<std::size_t>(pages_ent * page_k), poison);
      epool_v.assign(static_cast<std::size_t>(pages_ent * page_v), poison);
      rpool = phasekv::make_page_pool(pool_k.data(), pool_v.data(), pages_raw, P, H, s.d_k, s.d_v,
                                      s.layout);
      epool = phasekv::make_page_pool(epool_k.data(), epool_v.data(), pages_ent, P, H, s.d_k, s.d_v,
                                      s.layout);
    }
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t i = 0; i < rp[b]; ++i) raw_indices.push_back(perm_raw[next_raw++]);
      for (std::int64_t i = 0; i < ep[b]; ++i) ent_indices.push_back(ent_perm[(*ent_cursor)++]);
      raw_indptr.push_back(static_cast<std::int32_t>(raw_indices.size()));
      ent_indptr.push_back(static_cast<std::int32_t>(ent_indices.size()));
    }
    raw_indices.push_back(0), ent_indices.push_back(0);  // never empty
    phasekv::PagedKV<T> kv;
    kv.raw_pool = rpool;
    kv.entry_pool = epool;
    kv.raw_table = phasekv::csr_block_table(raw_indptr.data(), raw_indices.data(), B);
    kv.entry_table = phasekv::csr_block_table(ent_indptr.data(), ent_indices.data(), B);
    kv.lengths = shape.lengths.data();
    kv.batch = B;
    kv.rule = phasekv::cpu::VisibilityRule::compressed(s.geometry(), s.L);
    kv.origins = shape.origins.data();
    kv.ring_slots = ring_slots;
    // every raw position in order (a ring keeps the last ones), head h's entries j < J_h
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t p = 0; p < s.lengths[b]; ++p) {
        const std::int64_t slot = phasekv::PagedKV<T>::raw_slot(p, ro, ring_slots);
        const std::int64_t pg = kv.raw_table.page(b, slot / P);
        for (std::int64_t h = 0; h < H; ++h) {
          std::copy_n(&raw_k[b][static_cast<std::size_t>((p * H + h) * s.d_k)], s.d_k,
                      rpool.key(pg, slot % P, h));
          std::copy_n(&raw_v[b][static_cast<std::size_t>((p * H + h) * s.d_v)], s.d_v,
                      rpool.value(pg, slot % P, h));
        }
      }
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t j = 0; j < s.head(h).complete_windows(s.lengths[b]); ++j) {
          const std::int64_t pg = kv.entry_table.page(b, j / P);
          std::copy_n(&ent_k[b][static_cast<std::size_t>((j * H + h) * s.d_k)], s.d_k,
                      epool.key(pg, j % P, h));
          std::copy_n(&ent_v[b][static_cast<std::size_t>((j * H + h) * s.d_v)], s.d_v,
                      epool.value(pg, j % P, h));
        }
    }
    args.q = q.data();
    args.q_heads = hq;
    args.kv_heads = H;
    args.d_k = s.d_k;
    args.d_v = s.d_v;
    args.kv = kv;
    if (var.scale == 1.0f) var.scale = phasekv::default_scale(s.d_k);
    args.variant = var;
    out.assign(static_cast<std::size_t>(B * hq * s.d_v), std::nanf(""));
    lse.assign(static_cast<std::size_t>(B * hq), std::nanf(""));
    args.out = out.data();
    args.lse = lse.data();
  }

  void poison() {
    std::fill(out.begin(), out.end(), std::nanf(""));
    std::fill(lse.begin(), lse.end(), std::nanf(""));
  }

  using CV = phasekv::StridedView<const T>;
  CV rk(std::int64_t b) const {
    return phasekv::make_view<const T>(raw_k[b].data(), shape.lengths[b], shape.kv_heads,
                                       shape.d_k);
  }
  CV rv(std::int64_t b) const {
    return phasekv::make_view<const T>(raw_v[b].data(), shape.lengths[b], shape.kv_heads,
                                       shape.d_v);
  }
  CV ek(std::int64_t b) const {
    return phasekv::make_view<const T>(ent_k[b].data(), jmax[b], shape.kv_heads, shape.d_k);
  }
  CV ev(std::int64_t b) const {
    return phasekv::make_view<const T>(ent_v[b].data(), jmax[b], shape.kv_heads, shape.d_v);
  }

  // What KV head h of sequence b sees at its last position, from the contiguous buffers.
  phasekv::VisibleKV<T> visible(std::int64_t b, std::int64_t h) const {
    return args.kv.head_rule(h).template visible_kv<T>(
        shape.lengths[b], phasekv::head_view(rk(b), h), phasekv::head_view(rv(b), h),
        phasekv::head_view(ek(b), h), phasekv::head_view(ev(b), h));
  }

  // cpu::decode with per-head visible sets (head_kv) of sequence b alone.
  void single(std::int64_t b, std::vector<float>& o, std::vector<float>& l) const {
    std::vector<phasekv::VisibleKV<T>> kv;
    for (std::int64_t h = 0; h < shape.kv_heads; ++h) kv.push_back(visible(b, h));
    phasekv::cpu::DecodeArgs<T> d;
    d.q = q.data() + b * hq * shape.d_k;
    d.q_heads = hq;
    d.kv_heads = shape.kv_heads;
    d.d_k = shape.d_k;
    d.d_v = shape.d_v;
    d.head_kv = kv.data();
    d.variant = args.variant;
    o.assign(static_cast<std::size_t>(hq * shape.d_v), std::nanf(""));
    l.assign(static_cast<std::size_t>(hq), std::nanf(""));
    d.out = o.data();
    d.lse = l.data();
    phasekv::cpu::decode(d);
  }

  // Double reference of sequence b, KV head by KV head with that head's geometry.
  void reference(std::int64_t b, std::vector<double>& o, std::vector<double>& l) const {
    o.resize(static_cast<std::size_t>(hq * shape.d_v));
    l.resize(static_cast<std::size_t>(hq));
    const std::int64_t G = shape.group;
    for (std::int64_t h = 0; h < shape.kv_heads; ++h)
      phasekv::reference_decode<T>(q.data() + (b * hq + h * G) * shape.d_k, G, visible(b, h),
                                   phasekv::cpu::slice_variant(args.variant, h * G),
                                   o.data() + h * G * shape.d_v, l.data() + h * G);
  }

  // Plans and runs the batch on `threads` workers (one call per worker, then a merge split
  // in two) with chunks of `chunk`.
  phasekv::DecodePlan run(int threads, std::int64_t chunk) {
    phasekv::DecodePlan plan;
    plan.plan(args, threads, chunk);
    std::vector<unsigned char> ws(plan.workspace_bytes());
    for (int w = threads - 1; w >= 0; --w)
      phasekv::batch_decode_partition(plan, args, ws.data(), ws.size(), w, threads);
    phasekv::batch_decode_merge(plan, args, ws.data(), ws.size(), 1, 2);
    phasekv::batch_decode_merge(plan, args, ws.data(), ws.size(), 0, 2);
    return plan;
  }
};

}  // namespace sst
