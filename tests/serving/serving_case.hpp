// A batch of sequences stored in shuffled pages, with the same keys kept contiguous per
// sequence for the single-sequence path and the double reference; optionally with per-KV-head
// origins (PagedKV::origins).
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
#include "phasekv/attention/cpu/visibility_rule.hpp"
#include "phasekv/attention/reference.hpp"
#include "phasekv/serving/batch_decode.hpp"
#include "phasekv/serving/paged.hpp"
#include "phasekv/phase/origins.hpp"

namespace pst {

struct BatchShape {
  std::vector<std::int64_t> lengths;
  std::int64_t kv_heads = 2;
  std::int64_t group = 3;
  std::int64_t d_k = 64;
  std::int64_t d_v = 64;
  std::int64_t W = 8, S = 4, O = 2;  // W == 0: uncompressed (causal, or sliding window L)
  std::int64_t L = 16;
  std::int64_t page_size = 16;
  phasekv::Layout layout = phasekv::Layout::NHD;
  bool ring = false;                  // raw tokens kept in a ring of max(W, L) (+ 3) slots
  bool one_pool = false;              // raw and entry pages from one [K|V] pool
  bool dense_table = false;           // vLLM dense block tables instead of CSR
  std::vector<std::int64_t> origins;  // per-KV-head origins (O must then be 0), or none

  // W, S and O (origin 0 with per-head origins); head h's geometry.
  phasekv::Geometry geometry() const { return {W, S, O}; }
  phasekv::Geometry head(std::int64_t h) const {
    return {W, S, origins.empty() ? O : origins[static_cast<std::size_t>(h)]};
  }
  // First position of the raw ring: O, O_max with per-head origins, 0 uncompressed.
  std::int64_t ring_origin() const {
    if (W == 0) return 0;
    return origins.empty() ? O : *std::max_element(origins.begin(), origins.end());
  }
  phasekv::cpu::VisibilityRule rule() const {
    if (W == 0)
      return L == 0 ? phasekv::cpu::VisibilityRule::causal()
                    : phasekv::cpu::VisibilityRule::sliding_window(L);
    return phasekv::cpu::VisibilityRule::compressed(phasekv::Geometry(W, S, O), L);
  }
  std::string name() const {
    std::string s = "B" + std::to_string(lengths.size()) + "_hkv" + std::to_string(kv_heads) +
                    "_g" + std::to_string(group) + "_dk" + std::to_string(d_k) + "_dv" +
                    std::to_string(d_v) + "_P" + std::to_string(page_size);
    s += W ? "_W" + std::to_string(W) + "S" + std::to_string(S) + "O" + std::to_string(O)
           : std::string("_raw");
    s += "_L" + std::to_string(L);
    if (layout == phasekv::Layout::HND) s += "_hnd";
    if (ring) s += "_ring";
    if (one_pool) s += "_onepool";
    if (dense_table) s += "_dense";
    if (!origins.empty()) s += "_origins";
    for (std::int64_t o : origins) s += "," + std::to_string(o);
    return s;
  }
};

// Owns the per-sequence contiguous data (the truth) and one paged copy of it.
template <class T>
struct BatchCase {
  BatchShape shape;
  std::int64_t B = 0, hq = 0, ring_slots = 0;
  std::vector<std::vector<T>> raw_k, raw_v, ent_k, ent_v;  // per sequence, NHD contiguous
  std::vector<std::int64_t> jmax;                          // entry rows per sequence (max_h J_h(n))
  std::vector<float> q, out, lse;
  // paged storage
  std::vector<T> pool_k, pool_v, pool_kv, epool_k, epool_v;
  std::vector<std::int32_t> raw_indptr, raw_indices, ent_indptr, ent_indices;
  phasekv::BatchDecodeArgs<T> args;

  // `seed` draws the data, `layout_seed` (default: seed) the page order.
  BatchCase(const BatchShape& s, std::uint32_t seed, phasekv::StandardVariant var = {},
            std::uint32_t layout_seed = 0)
      : shape(s) {
    B = static_cast<std::int64_t>(s.lengths.size());
    hq = s.kv_heads * s.group;
    const phasekv::cpu::VisibilityRule rule = s.rule();
    if (s.ring) {
      ring_slots = (s.W ? phasekv::Geometry(s.W, s.S, s.O).ring_capacity(s.L) : s.L) + 3;
    }
    const std::int64_t ring_origin = s.ring_origin();
    raw_k.resize(B), raw_v.resize(B), ent_k.resize(B), ent_v.resize(B), jmax.resize(B);
    std::int64_t raw_pages = 0, ent_pages = 0;
    std::vector<std::int64_t> rp(B), ep(B);
    std::vector<std::int64_t>& J = jmax;
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t n = s.lengths[b];
      J[b] = s.W ? phasekv::max_complete_windows(s.geometry(), s.origins, n) : 0;
      const auto u = static_cast<std::uint32_t>(seed + 101 * b);
      raw_k[b] = pkt::random_values<T>(static_cast<std::size_t>(n * s.kv_heads * s.d_k), u + 1);
      raw_v[b] =
          pkt::random_values<T>(static_cast<std::size_t>(n * s.kv_heads * s.d_v), u + 2, 0.25f);
      ent_k[b] = pkt::random_values<T>(static_cast<std::size_t>(J[b] * s.kv_heads * s.d_k), u + 3);
      ent_v[b] =
          pkt::random_values<T>(static_cast<std::size_t>(J[b] * s.kv_heads * s.d_v), u + 4, 0.25f);
      // with per-head origins, rows at and above J_h(n) of head h are NaN: nothing may read them
      for (std::int64_t h = 0; h < s.kv_heads && !s.origins.empty(); ++h)
        for (std::int64_t j = s.head(h).complete_windows(n); j < J[b]; ++j) {
          std::fill_n(&ent_k[b][static_cast<std::size_t>((j * s.kv_heads + h) * s.d_k)], s.d_k,
                      phasekv::from_float<T>(NAN));
          std::fill_n(&ent_v[b][static_cast<std::size_t>((j * s.kv_heads + h) * s.d_v)], s.d_v,
                      phasekv::from_float<T>(NAN));
        }
      std::int64_t slots = n;
      if (ring_slots > 0 && n > ring_origin + ring_slots) slots = ring_origin + ring_slots;
      rp[b] = (slots + s.page_size - 1) / s.page_size;
      ep[b] = (J[b] + s.page_size - 1) / s.page_size;
      raw_pages += rp[b];
      ent_pages += ep[b];
    }
    q = pkt::random_floats(static_cast<std::size_t>(B * hq * s.d_k), seed + 7);
    // pages: raw and entries from one shuffled pool (one_pool) or two; 3 spare pages each
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
    const std::int64_t P = s.page_size, H = s.kv_heads;
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
    // tables (CSR, or dense with rows of max pages + 2)
    std::int64_t max_rp = 0, max_ep = 0;
    for (std::int64_t b = 0; b < B; ++b)
      max_rp = std::max(max_rp, rp[b]), max_ep = std::max(max_ep, ep[b]);
    const std::int64_t rrow = max_rp + 2, erow = max_ep + 2;
    raw_indptr.assign(1, 0);
    ent_indptr.assign(1, 0);
    if (s.dense_table) {
      raw_indices.assign(static_cast<std::size_t>(B * rrow), -1);
      ent_indices.assign(static_cast<std::size_t>(B * erow), -1);
    }
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t i = 0; i < rp[b]; ++i) {
        const std::int32_t pg = perm_raw[next_raw++];
        if (s.dense_table)
          raw_indices[static_cast<std::size_t>(b * rrow + i)] = pg;
        else
          raw_indices.push_back(pg);
      }
      for (std::int64_t i = 0; i < ep[b]; ++i) {
        const std::int32_t pg = ent_perm[(*ent_cursor)++];
        if (s.dense_table)
          ent_indices[static_cast<std::size_t>(b * erow + i)] = pg;
        else
          ent_indices.push_back(pg);
      }
      raw_indptr.push_back(static_cast<std::int32_t>(s.dense_table ? 0 : raw_indices.size()));
      ent_indptr.push_back(static_cast<std::int32_t>(s.dense_table ? 0 : ent_indices.size()));
    }
    phasekv::PagedKV<T> kv;
    kv.raw_pool = rpool;
    kv.entry_pool = epool;
    kv.raw_table = s.dense_table
                       ? phasekv::dense_block_table(raw_indices.data(), B, rrow)
                       : phasekv::csr_block_table(raw_indptr.data(), raw_indices.data(), B);
    kv.entry_table = s.dense_table
                         ? phasekv::dense_block_table(ent_indices.data(), B, erow)
                         : phasekv::csr_block_table(ent_indptr.data(), ent_indices.data(), B);
    kv.lengths = shape.lengths.data();
    kv.batch = B;
    kv.rule = rule;
    kv.ring_slots = ring_slots;
    kv.origins = shape.origins.empty() ? nullptr : shape.origins.data();
    // copy the data in: every raw position in order (a ring keeps the last ones), every entry
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t p = 0; p < s.lengths[b]; ++p) {
        const std::int64_t slot = phasekv::PagedKV<T>::raw_slot(p, ring_origin, ring_slots);
        const std::int64_t pg = kv.raw_table.page(b, slot / P);
        for (std::int64_t h = 0; h < H; ++h) {
          std::copy_n(&raw_k[b][static_cast<std::size_t>((p * H + h) * s.d_k)], s.d_k,
                      rpool.key(pg, slot % P, h));
          std::copy_n(&raw_v[b][static_cast<std::size_t>((p * H + h) * s.d_v)], s.d_v,
                      rpool.value(pg, slot % P, h));
        }
      }
      for (std::int64_t h = 0; h < H; ++h)  // head h's entries j < J_h(n)
        for (std::int64_t j = 0; j < (s.W ? s.head(h).complete_windows(s.lengths[b]) : 0); ++j) {
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

  // The contiguous buffers of sequence b (NHD): raw keys / values, entry keys / values.
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

  // The visible set of sequence b from its contiguous buffers (every head; no origins).
  phasekv::VisibleKV<T> visible(std::int64_t b) const {
    return shape.rule().template visible_kv<T>(shape.lengths[b], rk(b), rv(b), ek(b), ev(b));
  }
  // What KV head h of sequence b sees (its own origin).
  phasekv::VisibleKV<T> visible(std::int64_t b, std::int64_t h) const {
    return args.kv.head_rule(h).template visible_kv<T>(
        shape.lengths[b], phasekv::head_view(rk(b), h), phasekv::head_view(rv(b), h),
        phasekv::head_view(ek(b), h), phasekv::head_view(ev(b), h));
  }

  // cpu::decode of sequence b alone (one partition; per-head visible sets with origins).
  void single(std::int64_t b, std::vector<float>& o, std::vector<float>& l) const {
    std::vector<phasekv::VisibleKV<T>> sets;
    for (std::int64_t h = 0; h < shape.kv_heads && !shape.origins.empty(); ++h)
      sets.push_back(visible(b, h));
    phasekv::cpu::DecodeArgs<T> d;
    d.q = q.data() + b * hq * shape.d_k;
    d.q_heads = hq;
    d.kv_heads = shape.kv_heads;
    d.d_k = shape.d_k;
    d.d_v = shape.d_v;
    if (sets.empty())
      d.kv = visible(b);
    else
      d.head_kv = sets.data();
    d.variant = args.variant;
    o.assign(static_cast<std::size_t>(hq * shape.d_v), std::nanf(""));
    l.assign(static_cast<std::size_t>(hq), std::nanf(""));
    d.out = o.data();
    d.lse = l.data();
    phasekv::cpu::decode(d);
  }

  // Double reference of sequence b (KV head by KV head with per-head origins).
  void reference(std::int64_t b, std::vector<double>& o, std::vector<double>& l) const {
    o.resize(static_cast<std::size_t>(hq * shape.d_v));
    l.resize(static_cast<std::size_t>(hq));
    if (shape.origins.empty()) {
      phasekv::reference_decode<T>(q.data() + b * hq * shape.d_k, hq, visible(b), args.variant,
                                   o.data(), l.data());
      return;
    }
    const std::int64_t G = shape.group;
    for (std::int64_t h = 0; h < shape.kv_heads; ++h)
      phasekv::reference_decode<T>(q.data() + (b * hq + h * G) * shape.d_k, G, visible(b, h),
                                   phasekv::cpu::slice_variant(args.variant, h * G),
                                   o.data() + h * G * shape.d_v, l.data() + h * G);
  }

  // Plans and runs the batch on `threads` workers (engine-style calls, one per worker, then a
  // merge split in two) with chunks of `chunk`.
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

}  // namespace pst
