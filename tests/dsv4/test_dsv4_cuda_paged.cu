// The CUDA twin of the DeepSeek-V4 paged sparse attention (dsv4::cuda::paged_sparse_attention,
// the same kernel body as the contiguous one with a paged row source) and the host/device
// arithmetic it shares (dsv4::paged_sparse_query, sequence_of_row, chunk_rows in
// dsv4/kernel_math.hpp; detail::PagedLatentRows in dsv4/paged_latent.hpp).
//
// Always run (no device needed): the shared arithmetic; the device's row source run on the host
// over shuffled pages (rings, ragged batches, sequences of 0 queries, lengths 1) finds exactly
// the rows the formulas name; the CPU paged kernel over the same data lies within the float64
// reference (so the data the device cases use is right); the host checks. With a device: the
// kernel against the float64 reference (outputs poisoned first; bf16, FP8 with scales, f16, f32;
// decode, ragged prefill, HCA, window-only, rings, sinks, nothing visible), the same bits on a
// second run and as the contiguous CUDA call over the same rows.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/cuda_test_util.hpp"
#include "dsv4_attention_ref.hpp"
#include "phasekv/dsv4/cuda/sparse_attention.cuh"
#include "phasekv/dsv4/kernel_math.hpp"
#include "phasekv/dsv4/sparse_attention.hpp"

namespace {

namespace dsv4 = phasekv::dsv4;
using phasekv::bf16_t;
using phasekv::f16_t;
using phasekv::fp8_e4m3_t;
using pkv_cuda_test::DeviceBuffer;
using pkv_cuda_test::has_device;
using pkv_cuda_test::to_device;
using i64 = std::int64_t;

// ---- the shared arithmetic ----------------------------------------------------------------

TEST(Dsv4KernelMathPaged, RowsSequencesAndQueries) {
  const std::int32_t qo[] = {0, 0, 3, 3, 7, 8};  // sequences 0 and 2 have no queries
  EXPECT_EQ(dsv4::chunk_rows(1, qo).row, 0);
  EXPECT_EQ(dsv4::chunk_rows(1, qo).count, 3);
  EXPECT_EQ(dsv4::chunk_rows(2, qo).count, 0);
  EXPECT_EQ(dsv4::chunk_rows(5, nullptr).row, 5);
  EXPECT_EQ(dsv4::chunk_rows(5, nullptr).count, 1);
  const i64 want_seq[] = {1, 1, 1, 3, 3, 3, 3, 4};
  for (i64 r = 0; r < 8; ++r) EXPECT_EQ(dsv4::sequence_of_row(r, qo, 5), want_seq[r]) << r;
  EXPECT_EQ(dsv4::sequence_of_row(0, qo, 1), 0);
  const i64 lengths[] = {9, 10, 4, 33, 1};
  // row 5 is query 2 of sequence 3 (4 queries over 33 tokens): t = 33 - 4 + 2 = 31
  dsv4::PagedSparseQuery q = dsv4::paged_sparse_query(5, qo, 5, lengths, 4, false, 0);
  EXPECT_EQ(q.seq, 3);
  EXPECT_EQ(q.t, 31);
  EXPECT_EQ(q.entries, 8);
  EXPECT_EQ(q.index_count, 8);  // HCA: floor(32 / 4)
  q = dsv4::paged_sparse_query(3, qo, 5, lengths, 4, false, 0);
  EXPECT_EQ(q.t, 29);
  EXPECT_EQ(q.index_count, 7);
  q = dsv4::paged_sparse_query(7, qo, 5, lengths, 4, true, 64);  // a list: its length
  EXPECT_EQ(q.seq, 4);
  EXPECT_EQ(q.t, 0);
  EXPECT_EQ(q.index_count, 64);
  EXPECT_EQ(q.entries, 0);
  q = dsv4::paged_sparse_query(2, nullptr, 5, lengths, 0, false, 0);  // decode, no entries
  EXPECT_EQ(q.seq, 2);
  EXPECT_EQ(q.t, 3);
  EXPECT_EQ(q.index_count, 0);
  EXPECT_EQ(q.entries, 0);
}

// ---- cases, data, reference ---------------------------------------------------------------

struct Case {
  std::string name;
  i64 heads = 3, dim = 64, dim_v = 64, window = 16;
  std::vector<i64> lengths;  // n_b
  std::vector<i64> queries;  // q_b; empty: decode (one each, qo_indptr null)
  i64 ratio = 4;             // 0: window only
  i64 k = 9;                 // list length; 0 with hca
  bool hca = false;          // indices null
  bool sinks = false;
  i64 page_size = 16, ring = 0;
  float raw_scale = 1.0f, entry_scale = 1.0f;
  std::uint32_t seed = 1;
};

template <class T>
T make_elem(float x, float scale) {
  if constexpr (std::is_same_v<T, fp8_e4m3_t>)
    return phasekv::float_to_fp8_e4m3(x / scale);
  else
    return phasekv::from_float<T>(x);
}

// Shuffled pages of one pool for per-sequence row counts, rows `row` elements wide.
struct PageMap {
  i64 P = 1, pages = 0;
  std::vector<std::int32_t> indptr{0}, indices;
  PageMap(const std::vector<i64>& slots, i64 page_size, std::mt19937& rng) : P(page_size) {
    for (i64 s : slots) pages += (s + P - 1) / P;
    std::vector<std::int32_t> order(static_cast<std::size_t>(pages));
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int32_t>(i);
    std::shuffle(order.begin(), order.end(), rng);
    std::size_t next = 0;
    for (i64 s : slots) {
      for (i64 i = 0; i < (s + P - 1) / P; ++i) indices.push_back(order[next++]);
      indptr.push_back(static_cast<std::int32_t>(indices.size()));
    }
  }
  i64 offset(i64 b, i64 slot, i64 row) const {
    const i64 page =
        indices[static_cast<std::size_t>(indptr[static_cast<std::size_t>(b)] + slot / P)];
    return (page * P + slot % P) * row;
  }
};

template <class T>
struct Data {
  Case c;
  i64 B = 0, rows = 0, row = 0, index_count = 0;
  std::vector<std::vector<T>> raw, ent;  // contiguous per sequence, [n_b, row] / [J_b, row]
  std::vector<T> raw_pool, ent_pool;
  PageMap raw_map, ent_map;
  std::vector<std::int32_t> qo, idx;
  std::vector<float> q, sinks;
  dsv4::SparseAttentionParams params;
  dsv4::PagedSparseArgs<T> args;  // host pointers

  static std::vector<i64> raw_slots(const Case& c) {
    std::vector<i64> s;
    for (i64 n : c.lengths) s.push_back(c.ring > 0 ? std::min(n, c.ring) : n);
    return s;
  }
  static std::vector<i64> ent_slots(const Case& c) {
    std::vector<i64> s;
    for (i64 n : c.lengths) s.push_back(c.ratio > 0 ? n / c.ratio : 0);
    return s;
  }
  Data(const Case& cc, std::mt19937 rng = std::mt19937(7))
      : c(cc),
        raw_map(raw_slots(cc), cc.page_size, rng),
        ent_map(ent_slots(cc), cc.page_size, rng) {
    rng.seed(c.seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    B = static_cast<i64>(c.lengths.size());
    row = c.dim + 3;  // rows wider than dim: d_k is honoured
    const bool decode = c.queries.empty();
    qo.push_back(0);
    for (i64 b = 0; b < B; ++b)
      qo.push_back(qo.back() +
                   static_cast<std::int32_t>(decode ? 1 : c.queries[static_cast<std::size_t>(b)]));
    rows = qo.back();
    raw_pool.assign(static_cast<std::size_t>(std::max<i64>(raw_map.pages, 1) * c.page_size * row),
                    make_elem<T>(NAN, 1.0f));
    ent_pool.assign(static_cast<std::size_t>(std::max<i64>(ent_map.pages, 1) * c.page_size * row),
                    make_elem<T>(NAN, 1.0f));
    for (i64 b = 0; b < B; ++b) {
      const i64 n = c.lengths[static_cast<std::size_t>(b)], J = c.ratio > 0 ? n / c.ratio : 0;
      std::vector<T> r(static_cast<std::size_t>(std::max<i64>(n, 1) * row));
      std::vector<T> e(static_cast<std::size_t>(std::max<i64>(J, 1) * row));
      for (auto& x : r) x = make_elem<T>(nd(rng), c.raw_scale);
      for (auto& x : e) x = make_elem<T>(nd(rng), c.entry_scale);
      for (i64 p = 0; p < n; ++p) {  // with a ring only the last R positions are in the pages
        if (c.ring > 0 && p < n - c.ring) continue;
        const i64 slot = c.ring > 0 ? p % c.ring : p;
        std::copy_n(r.begin() + p * row, row, raw_pool.begin() + raw_map.offset(b, slot, row));
      }
      for (i64 j = 0; j < J; ++j)
        std::copy_n(e.begin() + j * row, row, ent_pool.begin() + ent_map.offset(b, j, row));
      raw.push_back(std::move(r));
      ent.push_back(std::move(e));
    }
    q.resize(static_cast<std::size_t>(rows * c.heads * c.dim));
    for (auto& x : q) x = nd(rng);
    if (c.sinks) {
      sinks.resize(static_cast<std::size_t>(c.heads));
      for (auto& x : sinks) x = nd(rng);
    }
    index_count = c.hca ? 0 : c.k;
    if (!c.hca && c.k > 0) {
      idx.assign(static_cast<std::size_t>(rows * c.k), -1);
      for (i64 r = 0; r < rows; ++r) {
        const auto pq = query(r);
        const i64 vis = c.ratio > 0 ? (pq.t + 1) / c.ratio : 0;
        dsv4t::random_index_list(rng, vis, c.k, idx.data() + r * c.k);
      }
    }
    params.heads = c.heads;
    params.dim = c.dim;
    params.dim_v = c.dim_v;
    params.window = c.window;
    params.scale = 1.0f / std::sqrt(static_cast<float>(c.dim));
    params.sinks = sinks.empty() ? nullptr : sinks.data();
    args.q = q.data();
    args.qo_indptr = decode ? nullptr : qo.data();
    args.batch = B;
    args.lengths = c.lengths.data();
    args.raw_pool = phasekv::make_page_pool<const T>(raw_pool.data(), raw_pool.data(),
                                                     raw_map.pages, c.page_size, 1, row, row);
    args.raw_table = phasekv::csr_block_table(raw_map.indptr.data(), raw_map.indices.data(), B);
    args.raw_scale = c.raw_scale;
    args.raw_ring = c.ring;
    args.entry_pool = phasekv::make_page_pool<const T>(ent_pool.data(), ent_pool.data(),
                                                       ent_map.pages, c.page_size, 1, row, row);
    args.entry_table = phasekv::csr_block_table(ent_map.indptr.data(), ent_map.indices.data(), B);
    args.entry_scale = c.entry_scale;
    args.ratio = c.ratio;
    args.indices = idx.empty() ? nullptr : idx.data();
    args.index_count = index_count;
  }

  dsv4::PagedSparseQuery query(i64 r) const {
    return dsv4::paged_sparse_query(r, c.queries.empty() ? nullptr : qo.data(), B, c.lengths.data(),
                                    c.ratio, !idx.empty(), index_count);
  }
  const std::int32_t* list(i64 r) const { return idx.empty() ? nullptr : idx.data() + r * c.k; }
  dsv4::LatentRows<T> raw_rows(i64 b) const {
    const auto sb = static_cast<std::size_t>(b);
    return dsv4::LatentRows<T>{raw[sb].data(), 0, c.lengths[sb], row, c.raw_scale};
  }
  dsv4::LatentRows<T> ent_rows(i64 b) const {
    const auto sb = static_cast<std::size_t>(b);
    return dsv4::LatentRows<T>{ent[sb].data(), 0, c.ratio > 0 ? c.lengths[sb] / c.ratio : 0, row,
                               c.entry_scale};
  }

  // Per head: max |o - ref| <= 2e-5 * max(max |ref|, 1e-3), lse within 2e-5 * max(1, |lse|)
  // (the inputs are exact in T, only the f32 arithmetic errs; the contiguous test's bound).
  void expect_close(const std::vector<float>& out, const std::vector<float>& lse,
                    const std::string& what) const {
    const i64 H = c.heads, dv = c.dim_v;
    std::vector<double> ro(static_cast<std::size_t>(H * dv)), rl(static_cast<std::size_t>(H));
    for (i64 r = 0; r < rows; ++r) {
      const auto pq = query(r);
      const i64 k = list(r) ? c.k : pq.index_count;
      dsv4t::reference<T>(params, q.data() + r * H * c.dim, raw_rows(pq.seq), ent_rows(pq.seq),
                          list(r), k, pq.t, ro.data(), rl.data());
      for (i64 h = 0; h < H; ++h) {
        double err = 0.0, mag = 0.0;
        for (i64 x = 0; x < dv; ++x) {
          const double o = out[static_cast<std::size_t>((r * H + h) * dv + x)];
          ASSERT_TRUE(std::isfinite(o)) << what << " row " << r << " head " << h << " ch " << x;
          const double w = ro[static_cast<std::size_t>(h * dv + x)];
          err = std::max(err, std::abs(o - w));
          mag = std::max(mag, std::abs(w));
        }
        EXPECT_LE(err, 2e-5 * std::max(mag, 1e-3)) << what << " row " << r << " head " << h;
        const double l = lse[static_cast<std::size_t>(r * H + h)];
        const double w = rl[static_cast<std::size_t>(h)];
        if (w == -HUGE_VAL)
          EXPECT_EQ(l, -HUGE_VAL) << what << " row " << r << " head " << h;
        else
          EXPECT_NEAR(l, w, 2e-5 * std::max(1.0, std::abs(w)))
              << what << " row " << r << " head " << h;
      }
    }
  }
};

Case make(const std::string& name, std::vector<i64> lengths, std::vector<i64> queries,
          std::uint32_t seed) {
  Case c;
  c.name = name;
  c.lengths = std::move(lengths);
  c.queries = std::move(queries);
  c.seed = seed;
  return c;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  Case c = make("decode lists sinks", {1, 7, 130, 37, 64}, {}, 11);
  c.sinks = true;
  v.push_back(c);
  c = make("ragged HCA", {5, 40, 1, 97, 0}, {2, 0, 1, 7, 0}, 12);
  c.hca = true, c.k = 0, c.ratio = 8, c.heads = 9, c.dim = 56, c.dim_v = 40, c.page_size = 1;
  v.push_back(c);
  c = make("ring lists", {50, 200, 3}, {3, 1, 3}, 13);
  c.window = 8, c.ring = 16, c.k = 5, c.page_size = 4, c.sinks = true;
  v.push_back(c);
  c = make("window only", {9, 1, 300}, {}, 14);
  c.ratio = 0, c.k = 0, c.heads = 5, c.page_size = 7, c.window = 128;
  v.push_back(c);
  c = make("V4 shape", {1000, 129}, {1, 2}, 15);
  c.heads = 64, c.dim = 576, c.dim_v = 512, c.window = 128, c.k = 64, c.sinks = true;
  v.push_back(c);
  return v;
}

// The paged row source, run on the host: each query row's items are the rows the formulas name.
template <class T>
void check_source(const Case& cc) {
  const Data<T> h(cc);
  dsv4::cuda::detail::PagedSource<T> src;
  src.qo_indptr = h.args.qo_indptr;
  src.batch = h.B;
  src.lengths = h.args.lengths;
  src.raw_pool = h.args.raw_pool;
  src.raw_table = h.args.raw_table;
  src.raw_scale = h.args.raw_scale;
  src.raw_ring = h.args.raw_ring;
  src.entry_pool = h.args.entry_pool;
  src.entry_table = h.args.entry_table;
  src.entry_scale = h.args.entry_scale;
  src.ratio = h.args.ratio;
  src.indices = h.args.indices;
  src.index_count = h.args.index_count;
  for (i64 r = 0; r < h.rows; ++r) {
    const auto qr = src.query(r);
    const auto pq = h.query(r);
    ASSERT_EQ(qr.t, pq.t);
    const auto sb = static_cast<std::size_t>(pq.seq);
    // position: the sequence's n_b - q_b + i
    const i64 first = h.qo[sb], qb = h.qo[sb + 1] - h.qo[sb];
    ASSERT_EQ(qr.t, cc.lengths[sb] - qb + (r - first));
    const dsv4::SparseWindow win = dsv4::sparse_window(qr.t, cc.window);
    for (i64 k = 0; k < qr.index_count + win.count; ++k) {
      const dsv4::SparseItem it =
          dsv4::sparse_item(k, qr.list, qr.index_count, qr.entries_first, qr.entries_count, win);
      ASSERT_NE(it.kind, dsv4::SparseItem::invalid) << cc.name << " row " << r << " item " << k;
      if (it.kind == dsv4::SparseItem::skip) continue;
      const T* got =
          it.kind == dsv4::SparseItem::entry ? qr.entries.row(it.row) : qr.raw.row(it.row);
      const T* want = it.kind == dsv4::SparseItem::entry ? h.ent[sb].data() + it.row * h.row
                                                         : h.raw[sb].data() + it.row * h.row;
      ASSERT_EQ(0, std::memcmp(got, want, static_cast<std::size_t>(h.row) * sizeof(T)))
          << cc.name << " row " << r << " item " << k;
    }
  }
  // the CPU paged kernel over the same data lies within the reference
  std::vector<float> out(static_cast<std::size_t>(h.rows * cc.heads * cc.dim_v), NAN);
  std::vector<float> lse(static_cast<std::size_t>(h.rows * cc.heads), NAN);
  dsv4::PagedSparseArgs<T> a = h.args;
  a.out = out.data();
  a.lse = lse.data();
  dsv4::paged_sparse_attention<T>(h.params, a);
  h.expect_close(out, lse, cc.name + " (CPU)");
}

TEST(PagedSparseCudaHostModel, SourceFindsTheFormulasRows) {
  const auto cs = cases();
  check_source<bf16_t>(cs[0]);
  Case c = cs[1];
  c.raw_scale = 0.03f, c.entry_scale = 0.07f;
  check_source<fp8_e4m3_t>(c);
  check_source<float>(cs[2]);
  check_source<f16_t>(cs[3]);
  check_source<bf16_t>(cs[4]);
}

// ---- device cases ---------------------------------------------------------------------------

template <class T>
struct DeviceData {
  DeviceBuffer<T> raw_pool, ent_pool;
  DeviceBuffer<std::int32_t> raw_indptr, raw_indices, ent_indptr, ent_indices, qo, idx;
  DeviceBuffer<std::int64_t> lengths;
  DeviceBuffer<float> q, sinks, out, lse;
  dsv4::PagedSparseArgs<T> args;
  dsv4::SparseAttentionParams params;

  explicit DeviceData(const Data<T>& h)
      : raw_pool(to_device(h.raw_pool)),
        ent_pool(to_device(h.ent_pool)),
        raw_indptr(to_device(h.raw_map.indptr)),
        raw_indices(to_device(h.raw_map.indices)),
        ent_indptr(to_device(h.ent_map.indptr)),
        ent_indices(to_device(h.ent_map.indices)),
        qo(to_device(h.qo)),
        idx(to_device(h.idx)),
        lengths(to_device(h.c.lengths)),
        q(to_device(h.q)),
        sinks(to_device(h.sinks)),
        out(static_cast<std::size_t>(h.rows * h.c.heads * h.c.dim_v)),
        lse(static_cast<std::size_t>(h.rows * h.c.heads)) {
    args = h.args;
    args.q = q.get();
    args.qo_indptr = h.args.qo_indptr ? qo.get() : nullptr;
    args.lengths = lengths.get();
    args.raw_pool.keys = args.raw_pool.values = raw_pool.get();
    args.entry_pool.keys = args.entry_pool.values = ent_pool.get();
    args.raw_table = phasekv::csr_block_table(raw_indptr.get(), raw_indices.get(), h.B);
    args.entry_table = phasekv::csr_block_table(ent_indptr.get(), ent_indices.get(), h.B);
    args.indices = h.args.indices ? idx.get() : nullptr;
    args.out = out.get();
    args.lse = lse.get();
    params = h.params;
    params.sinks = h.sinks.empty() ? nullptr : sinks.get();
  }
};

template <class T>
void run_device(const Data<T>& h, DeviceData<T>& d, std::vector<float>& out,
                std::vector<float>& lse) {
  PKV_CUDA_OK(d.out.poison());
  PKV_CUDA_OK(d.lse.poison());
  PKV_CUDA_OK(dsv4::cuda::paged_sparse_attention<T>(d.params, h.args, d.args));
  PKV_CUDA_OK(cudaDeviceSynchronize());
  PKV_CUDA_OK(d.out.download(out));
  PKV_CUDA_OK(d.lse.download(lse));
}

template <class T>
void check_device(const Case& c) {
  const Data<T> h(c);
  if (!has_device()) GTEST_SKIP() << "no CUDA device visible (cudaGetDeviceCount)";
  DeviceData<T> d(h);
  std::vector<float> o1, l1, o2, l2;
  run_device(h, d, o1, l1);
  h.expect_close(o1, l1, c.name + " (device)");
  run_device(h, d, o2, l2);
  EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float))) << c.name;
  EXPECT_EQ(0, std::memcmp(l1.data(), l2.data(), l1.size() * sizeof(float))) << c.name;
  // the contiguous CUDA call over each sequence's rows gives the same bits (same kernel body);
  // without lists only where one index_count serves every query of the sequence (one query)
  const i64 H = c.heads, dv = c.dim_v;
  for (i64 b = 0; b < h.B; ++b) {
    const auto sb = static_cast<std::size_t>(b);
    const i64 r0 = h.qo[sb], qb = h.qo[sb + 1] - h.qo[sb];
    if (qb == 0 || (h.idx.empty() && qb != 1)) continue;
    const auto pq = h.query(r0);
    auto raw = to_device(h.raw[sb]), ent = to_device(h.ent[sb]);
    dsv4::LatentRows<T> rr = h.raw_rows(b), er = h.ent_rows(b);
    rr.data = raw.get();
    er.data = ent.get();
    DeviceBuffer<float> o(static_cast<std::size_t>(qb * H * dv)),
        l(static_cast<std::size_t>(qb * H));
    PKV_CUDA_OK(o.poison());
    PKV_CUDA_OK(l.poison());
    const std::int32_t* list = h.idx.empty() ? nullptr : d.idx.get() + r0 * c.k;
    const i64 k = h.idx.empty() ? pq.index_count : c.k;
    PKV_CUDA_OK(dsv4::cuda::sparse_attention<T>(d.params, d.q.get() + r0 * H * c.dim, rr, er, list,
                                                k, pq.t, qb, o.get(), l.get()));
    PKV_CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> co, cl;
    PKV_CUDA_OK(o.download(co));
    PKV_CUDA_OK(l.download(cl));
    EXPECT_EQ(0, std::memcmp(co.data(), o1.data() + r0 * H * dv, co.size() * sizeof(float)))
        << c.name << " sequence " << b;
    EXPECT_EQ(0, std::memcmp(cl.data(), l1.data() + r0 * H, cl.size() * sizeof(float)))
        << c.name << " sequence " << b;
  }
}

TEST(PagedSparseCuda, Bf16DecodeListsSinks) { check_device<bf16_t>(cases()[0]); }

TEST(PagedSparseCuda, Fp8RaggedHcaScaled) {
  Case c = cases()[1];
  c.raw_scale = 0.03f, c.entry_scale = 0.07f;
  check_device<fp8_e4m3_t>(c);
}

TEST(PagedSparseCuda, F32RingRaggedLists) { check_device<float>(cases()[2]); }

TEST(PagedSparseCuda, F16WindowOnlyDecode) { check_device<f16_t>(cases()[3]); }

TEST(PagedSparseCuda, Bf16V4Shape64Heads576) { check_device<bf16_t>(cases()[4]); }

TEST(PagedSparseCuda, Fp8V4ShapeScaled) {
  Case c = cases()[4];
  c.raw_scale = 0.05f, c.entry_scale = 0.02f;
  check_device<fp8_e4m3_t>(c);
}

// Nothing visible (no window, lists of -1 only): zeros and -inf; with a sink, zeros and the sink.
TEST(PagedSparseCuda, NothingVisible) {
  Case c = make("nothing", {3, 1}, {2, 1}, 16);
  c.window = 0, c.ratio = 1000, c.k = 4;
  check_device<float>(c);
  c.name = "nothing + sink";
  c.sinks = true;
  check_device<float>(c);
}

// ---- host checks (no device needed) ---------------------------------------------------------

TEST(PagedSparseCudaChecks, RejectedBeforeAnyCudaCall) {
  const char* where = "phasekv::dsv4::cuda::paged_sparse_attention";
  Case c = make("checks", {5, 40, 1}, {2, 0, 1}, 21);
  const Data<float> h(c);
  // device arguments: fake non-null pointers (never dereferenced: the checks come first)
  dsv4::PagedSparseArgs<float> dev = h.args;
  dev.q = reinterpret_cast<const float*>(0x1000);
  dev.qo_indptr = reinterpret_cast<const std::int32_t*>(0x1100);
  dev.lengths = reinterpret_cast<const i64*>(0x1200);
  dev.raw_pool.keys = dev.raw_pool.values = reinterpret_cast<const float*>(0x2000);
  dev.entry_pool.keys = dev.entry_pool.values = reinterpret_cast<const float*>(0x3000);
  dev.raw_table = phasekv::csr_block_table(reinterpret_cast<const std::int32_t*>(0x4000),
                                           reinterpret_cast<const std::int32_t*>(0x4100), h.B);
  dev.entry_table = phasekv::csr_block_table(reinterpret_cast<const std::int32_t*>(0x5000),
                                             reinterpret_cast<const std::int32_t*>(0x5100), h.B);
  dev.indices = reinterpret_cast<const std::int32_t*>(0x6000);
  dev.out = reinterpret_cast<float*>(0x7000);
  dev.lse = reinterpret_cast<float*>(0x7100);
  EXPECT_NO_THROW(dsv4::cuda::check_paged_sparse_attention_args<float>(h.params, h.args, dev));
  const auto run = [&](const dsv4::SparseAttentionParams& p,
                       const dsv4::PagedSparseArgs<float>& host,
                       const dsv4::PagedSparseArgs<float>& device) -> std::string {
    const cudaError_t e = dsv4::cuda::paged_sparse_attention<float>(p, host, device);
    if (e != cudaErrorInvalidValue) return "status " + std::to_string(static_cast<int>(e));
    return phasekv::cuda::last_error_message();
  };
  const auto expect_names = [&](const std::string& m, const std::string& arg) {
    EXPECT_NE(m.find(": " + arg + " = "), std::string::npos) << "message: " << m;
    EXPECT_EQ(m.rfind(where, 0), 0u) << m;
  };
  dsv4::SparseAttentionParams p = h.params;
  p.dim = 1025, p.dim_v = 64;
  expect_names(run(p, h.args, dev), "params.dim");
  p = h.params, p.heads = 0;
  expect_names(run(p, h.args, dev), "params.heads");
  auto d = dev;
  d.batch = 2;
  expect_names(run(h.params, h.args, d), "device.batch");
  d = dev, d.qo_indptr = nullptr;
  expect_names(run(h.params, h.args, d), "device.qo_indptr");
  d = dev, d.lengths = nullptr;
  expect_names(run(h.params, h.args, d), "device.lengths");
  d = dev, d.ratio = 0;
  expect_names(run(h.params, h.args, d), "args.index_count");
  d = dev, d.entry_scale = -1.0f;
  expect_names(run(h.params, h.args, d), "args.entry_scale");
  d = dev, d.raw_ring = 2;  // sequence 0 reads 16 + 2 - 1 rows
  expect_names(run(h.params, h.args, d), "args.raw_ring");
  d = dev, d.raw_pool.d_k = 10;
  expect_names(run(h.params, h.args, d), "args.raw_pool.d_k");
  d = dev, d.q = nullptr;
  expect_names(run(h.params, h.args, d), "args.q");
  d = dev, d.raw_table.indptr = nullptr;
  expect_names(run(h.params, h.args, d), "device.raw_table.batch");
  // host metadata: a length below the sequence's queries; a page outside the pool; too few pages
  std::vector<i64> lens = c.lengths;
  auto host = h.args;
  host.lengths = lens.data();
  lens[0] = 1;
  expect_names(run(h.params, host, dev), "args.qo_indptr[1]");
  lens[0] = 5;
  std::vector<std::int32_t> ind = h.ent_map.indices;
  host.entry_table = phasekv::csr_block_table(h.ent_map.indptr.data(), ind.data(), h.B);
  ind[0] = static_cast<std::int32_t>(h.ent_map.pages);
  expect_names(run(h.params, host, dev), "args.entry_table sequence 0 index 0");
  ind[0] = h.ent_map.indices[0];
  lens[2] = 400;  // sequence 2 would need more raw pages than it lists
  {
    const std::string m = run(h.params, host, dev);
    EXPECT_NE(m.find("args.raw_table pages of sequence 2"), std::string::npos) << m;
    EXPECT_EQ(m.rfind(where, 0), 0u) << m;
    EXPECT_THROW(dsv4::cuda::check_paged_sparse_attention_args<float>(h.params, host, dev),
                 phasekv::capacity_error);
  }
  // nothing to do: accepted without a launch
  d = dev;
  d.batch = 0;
  auto none = h.args;
  none.batch = 0;
  EXPECT_EQ(dsv4::cuda::paged_sparse_attention<float>(h.params, none, d), cudaSuccess);
  std::vector<std::int32_t> zero = {0, 0, 0, 0};
  none = h.args;
  none.qo_indptr = zero.data();
  EXPECT_EQ(dsv4::cuda::paged_sparse_attention<float>(h.params, none, dev), cudaSuccess);
  EXPECT_STREQ(phasekv::cuda::last_error_message(), "");
}

}  // namespace
