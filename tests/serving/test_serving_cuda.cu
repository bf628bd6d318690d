// The CUDA twin of the serving path (serving/cuda/*.cuh): batch decode from the host
// DecodePlan over device pages, against the double reference (the test bounds of the CPU batch
// path), the same bits for page sizes 1, 16 and 64 in shuffled order and for any planned worker
// count, a length-0 sequence, B = 64, f32 and bf16. Device cases GTEST_SKIP without a device;
// the argument checks (host only) always run.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "compress/compress_test_util.hpp"
#include "compress/gated_reference.hpp"
#include "cuda/cuda_test_util.hpp"
#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/compress/max_pool.hpp"
#include "phasekv/compress/uniform_mean.hpp"
#include "phasekv/serving/cuda/batch_decode.cuh"
#include "phasekv/serving/cuda/batch_prefill.cuh"
#include "phasekv/serving/cuda/paged_append.cuh"
#include "serving_case.hpp"

namespace {

using phasekv::bf16_t;
using pkv_cuda_test::DeviceBuffer;
using pkv_cuda_test::has_device;
using pkv_cuda_test::to_device;

std::vector<std::int64_t> draw_lengths(std::int64_t B, std::int64_t W, std::uint32_t seed,
                                       int big) {
  const std::int64_t pool[] = {0, 1, 7, W - 1, W, W + 1, 1000, 5000};
  std::mt19937 rng(seed);
  std::vector<std::int64_t> v(static_cast<std::size_t>(B));
  for (auto& x : v) {
    x = pool[rng() % 8];
    if (x == 5000 && big-- <= 0) x = 1000;
  }
  v[0] = 0;  // always a sequence of length 0
  return v;
}

template <class T>
phasekv::PagePool<const T> rebase_pool(const phasekv::PagePool<const T>& p, const T* host_k,
                                       const T* dev_k, const T* host_v, const T* dev_v) {
  phasekv::PagePool<const T> r = p;
  r.keys = p.keys == nullptr ? nullptr : dev_k + (p.keys - host_k);
  r.values = p.values == nullptr ? nullptr : dev_v + (p.values - host_v);
  return r;
}

phasekv::BlockTable rebase_table(const phasekv::BlockTable& t, const std::int32_t* indptr,
                                 const std::int32_t* indices) {
  phasekv::BlockTable r = t;
  r.indptr = t.indptr == nullptr ? nullptr : indptr;
  r.indices = indices;
  return r;
}

// A device copy of a pst::BatchCase (pools, tables, lengths, queries, sinks) and its runs.
template <class T>
struct DeviceCase {
  const pst::BatchCase<T>& c;
  DeviceBuffer<T> pool_k, pool_v, pool_kv, epool_k, epool_v;
  DeviceBuffer<std::int32_t> raw_indptr, raw_indices, ent_indptr, ent_indices;
  DeviceBuffer<std::int64_t> lengths;
  DeviceBuffer<float> q, out, lse, sinks;
  phasekv::BatchDecodeArgs<T> args;
  bool ok = true;

  DeviceCase(const pst::BatchCase<T>& host, const std::vector<float>& host_sinks = {}) : c(host) {
    pool_k = to_device(c.pool_k), pool_v = to_device(c.pool_v), pool_kv = to_device(c.pool_kv);
    epool_k = to_device(c.epool_k), epool_v = to_device(c.epool_v);
    raw_indptr = to_device(c.raw_indptr), raw_indices = to_device(c.raw_indices);
    ent_indptr = to_device(c.ent_indptr), ent_indices = to_device(c.ent_indices);
    lengths = to_device(c.shape.lengths);
    q = to_device(c.q);
    sinks = to_device(host_sinks);
    out = DeviceBuffer<float>(c.out.size());
    lse = DeviceBuffer<float>(c.lse.size());
    args = c.args;
    const phasekv::PagedKV<T>& h = c.args.kv;
    if (c.shape.one_pool) {
      args.kv.raw_pool =
          rebase_pool(h.raw_pool, c.pool_kv.data(), pool_kv.get(), c.pool_kv.data(), pool_kv.get());
      args.kv.entry_pool = args.kv.raw_pool;
    } else {
      args.kv.raw_pool =
          rebase_pool(h.raw_pool, c.pool_k.data(), pool_k.get(), c.pool_v.data(), pool_v.get());
      args.kv.entry_pool = rebase_pool(h.entry_pool, c.epool_k.data(), epool_k.get(),
                                       c.epool_v.data(), epool_v.get());
    }
    args.kv.raw_table = rebase_table(h.raw_table, raw_indptr.get(), raw_indices.get());
    args.kv.entry_table = rebase_table(h.entry_table, ent_indptr.get(), ent_indices.get());
    args.kv.lengths = lengths.get();
    args.q = q.get();
    args.out = out.get();
    args.lse = lse.get();
    if (!host_sinks.empty()) args.variant.sinks = sinks.get();
    ok = out.ok(c.out.size()) && lse.ok(c.lse.size()) && pool_k.ok(c.pool_k.size()) &&
         pool_kv.ok(c.pool_kv.size()) && epool_k.ok(c.epool_k.size()) &&
         raw_indices.ok(c.raw_indices.size()) && ent_indices.ok(c.ent_indices.size());
  }

  // Plans on the host (host tables, `workers` workers, chunks of `chunk`), runs on the device
  // into poisoned outputs, downloads them.
  void run(int workers, std::int64_t chunk, std::vector<float>& o, std::vector<float>& l) {
    ASSERT_TRUE(ok) << "device allocation failed";
    phasekv::DecodePlan plan;
    plan.plan(c.args, workers, chunk);
    std::size_t bytes = 0;
    PKV_CUDA_OK(phasekv::cuda::batch_decode(plan, args, nullptr, bytes));
    DeviceBuffer<unsigned char> ws(bytes);
    ASSERT_TRUE(ws.ok(bytes));
    PKV_CUDA_OK(out.poison());
    PKV_CUDA_OK(lse.poison());
    PKV_CUDA_OK(phasekv::cuda::batch_decode(plan, args, ws.get(), bytes));
    PKV_CUDA_OK(cudaDeviceSynchronize());
    PKV_CUDA_OK(out.download(o));
    PKV_CUDA_OK(lse.download(l));
  }
};

// The bound of the CUDA attention tests (tests/cuda): inputs are stored as T, the reference
// reads the same stored values, accumulation and output are f32, so 1e-5 for every T.
constexpr double kCudaBound = 1e-5;

template <class T>
void expect_close_to_reference(const pst::BatchCase<T>& c, const std::vector<float>& o,
                               const std::vector<float>& l, const std::string& what,
                               double bound = kCudaBound) {
  for (std::int64_t b = 0; b < c.B; ++b) {
    std::vector<double> ro, rl;
    c.reference(b, ro, rl);
    const pkt::ErrorStats e = pkt::compare(o.data() + b * c.hq * c.shape.d_v, l.data() + b * c.hq,
                                           ro.data(), rl.data(), c.hq, c.shape.d_v);
    ASSERT_TRUE(e.finite) << what << " sequence " << b;
    EXPECT_LE(e.max_rel, bound) << what << " sequence " << b;
    EXPECT_LE(e.max_lse, bound) << what << " sequence " << b;
  }
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// B = 64 with lengths from {0, 1, 7, W-1, W, W+1, 1000, 5000}; chunks of 1024 split the long
// sequences into several items. Page sizes 1, 16, 64 (shuffled pages) and 1 or 3 planned
// workers give the same bits, within the reference bounds.
template <class T>
void page_size_and_reference() {
  pst::BatchShape s;
  s.W = 8, s.S = 4, s.O = 2, s.L = 16;
  s.kv_heads = 2, s.group = 3, s.d_k = 64, s.d_v = 64;
  s.lengths = draw_lengths(64, s.W, 29, 3);
  s.lengths[5] = 5000;
  std::vector<float> first_o, first_l;
  for (std::int64_t P : {16, 1, 64}) {
    s.page_size = P;
    pst::BatchCase<T> c(s, 41);
    if (P == 16) {  // the harness, on the CPU batch path (without a device too)
      c.run(1, 1024);
      expect_close_to_reference(c, c.out, c.lse, s.name() + " cpu");
    }
    if (!has_device()) GTEST_SKIP() << "no CUDA device visible (cudaGetDeviceCount)";
    DeviceCase<T> d(c);
    for (int workers : {1, 3}) {
      std::vector<float> o, l;
      d.run(workers, 1024, o, l);
      if (P == 16 && workers == 1) {
        expect_close_to_reference(c, o, l, s.name());
        first_o = o, first_l = l;
      } else {
        EXPECT_TRUE(same_bits(o, first_o) && same_bits(l, first_l))
            << s.name() << " workers " << workers << ": bits differ from page size 16";
      }
    }
  }
}

TEST(BatchDecodeCuda, F32SameBitsForEveryPageSizeAndWithinReference) {
  page_size_and_reference<float>();
}
TEST(BatchDecodeCuda, Bf16SameBitsForEveryPageSizeAndWithinReference) {
  page_size_and_reference<bf16_t>();
}

// The other storage forms and rules, f32: HND pages, one [K|V] pool, dense tables, a ring of
// raw slots, GQA 5 with d_k != d_v (odd d_v), soft cap, entry bias and sinks; and uncompressed
// sliding-window attention.
TEST(BatchDecodeCuda, LayoutsRingsVariantsAndUncompressedWithinReference) {
  pst::BatchShape s;
  s.W = 8, s.S = 4, s.O = 3, s.L = 20;
  s.kv_heads = 2, s.group = 5, s.d_k = 48, s.d_v = 33;
  s.lengths = draw_lengths(9, s.W, 3, 1);
  s.page_size = 16;
  s.layout = phasekv::Layout::HND;
  s.ring = true, s.one_pool = true, s.dense_table = true;
  phasekv::StandardVariant var;
  var.softcap = 30.0f;
  var.entry_bias = std::log(8.0f);
  std::vector<float> sinks(10);
  for (std::size_t h = 0; h < sinks.size(); ++h) sinks[h] = -1.0f + 0.3f * static_cast<float>(h);
  var.sinks = sinks.data();
  {
    pst::BatchCase<float> c(s, 7, var);
    c.run(2, 128);  // the harness, on the CPU batch path
    expect_close_to_reference(c, c.out, c.lse, s.name() + " variants cpu");
    if (has_device()) {
      DeviceCase<float> d(c, sinks);
      std::vector<float> o, l;
      d.run(2, 128, o, l);
      expect_close_to_reference(c, o, l, s.name() + " variants");
    }
  }
  s.W = 0, s.L = 300, s.ring = false, s.one_pool = false;  // sliding window of 300
  pst::BatchCase<float> c(s, 8);
  c.run(1, 256);
  expect_close_to_reference(c, c.out, c.lse, s.name() + " cpu");
  if (!has_device()) GTEST_SKIP() << "no CUDA device visible (cudaGetDeviceCount)";
  DeviceCase<float> d(c);
  std::vector<float> o, l;
  d.run(1, 256, o, l);
  expect_close_to_reference(c, o, l, s.name());
}

// bf16 queries and outputs (f32 accumulation, f32 lse): the device decode and prefill equal
// the CPU bf16 path within one bf16 rounding (another reduction order, then the rounding).
TEST(BatchDecodeCuda, Bf16QueriesAndOutputsWithinTheCpuPath) {
  pst::BatchShape s;
  s.lengths = {0, 1, 9, 300, 77};
  s.kv_heads = 2, s.group = 3, s.d_k = 64, s.d_v = 40;
  pst::BatchCase<bf16_t> c(s, 13);
  std::vector<bf16_t> q(c.q.size());
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = phasekv::from_float<bf16_t>(c.q[i]);
  phasekv::BatchDecodeArgs<bf16_t, phasekv::StandardVariant, bf16_t> a;
  a.q = q.data(), a.q_heads = c.hq, a.kv_heads = s.kv_heads, a.d_k = s.d_k, a.d_v = s.d_v;
  a.kv = c.args.kv, a.variant = c.args.variant;
  std::vector<bf16_t> out(c.out.size());
  std::vector<float> lse(c.lse.size());
  a.out = out.data(), a.lse = lse.data();
  phasekv::DecodePlan plan;
  plan.plan(a, 1, 128);
  std::vector<unsigned char> ws(plan.workspace_bytes());
  phasekv::batch_decode(plan, a, ws.data(), ws.size());  // the CPU path: the harness
  const std::vector<std::int32_t> qo = {0, 0, 1, 5, 45, 46};
  std::vector<bf16_t> pq(static_cast<std::size_t>(qo.back() * c.hq * s.d_k));
  for (std::size_t i = 0; i < pq.size(); ++i)
    pq[i] = phasekv::from_float<bf16_t>(0.01f * static_cast<float>(i % 97) - 0.4f);
  phasekv::BatchPrefillArgs<bf16_t, phasekv::StandardVariant, bf16_t> pa;
  pa.q = pq.data(), pa.qo_indptr = qo.data(), pa.q_heads = c.hq, pa.kv_heads = s.kv_heads;
  pa.d_k = s.d_k, pa.d_v = s.d_v, pa.kv = c.args.kv, pa.variant = c.args.variant;
  std::vector<bf16_t> pout(static_cast<std::size_t>(qo.back() * c.hq * s.d_v));
  std::vector<float> plse(static_cast<std::size_t>(qo.back() * c.hq));
  pa.out = pout.data(), pa.lse = plse.data();
  phasekv::PrefillPlan pplan;
  pplan.plan(pa, 1);
  phasekv::batch_prefill(pplan, pa);
  if (!has_device()) GTEST_SKIP() << "no CUDA device visible (cudaGetDeviceCount)";
  DeviceCase<bf16_t> d(c);
  ASSERT_TRUE(d.ok) << "device allocation failed";
  DeviceBuffer<bf16_t> dq = to_device(q), dout(out.size()), dpq = to_device(pq), dpout(pout.size());
  DeviceBuffer<float> dlse(lse.size()), dplse(plse.size());
  DeviceBuffer<std::int32_t> dqo = to_device(qo);
  phasekv::BatchDecodeArgs<bf16_t, phasekv::StandardVariant, bf16_t> da = a;
  da.kv = d.args.kv, da.q = dq.get(), da.out = dout.get(), da.lse = dlse.get();
  std::size_t bytes = 0;
  PKV_CUDA_OK(phasekv::cuda::batch_decode(plan, da, nullptr, bytes));
  DeviceBuffer<unsigned char> dws(bytes);
  PKV_CUDA_OK(dout.poison());
  PKV_CUDA_OK(phasekv::cuda::batch_decode(plan, da, dws.get(), bytes));
  phasekv::BatchPrefillArgs<bf16_t, phasekv::StandardVariant, bf16_t> dpa = pa;
  dpa.kv = d.args.kv, dpa.q = dpq.get(), dpa.qo_indptr = dqo.get();
  dpa.out = dpout.get(), dpa.lse = dplse.get();
  PKV_CUDA_OK(dpout.poison());
  PKV_CUDA_OK(phasekv::cuda::batch_prefill(pplan, dpa));
  PKV_CUDA_OK(cudaDeviceSynchronize());
  const auto expect_near = [](const std::vector<bf16_t>& cpu, const DeviceBuffer<bf16_t>& dev,
                              const char* what) {
    std::vector<bf16_t> got;
    ASSERT_EQ(dev.download(got), cudaSuccess);
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      const float x = phasekv::to_float(cpu[i]), y = phasekv::to_float(got[i]);
      ASSERT_LE(std::fabs(x - y), 1e-5f + std::fabs(x) / 128) << what << " element " << i;
    }
  };
  expect_near(out, dout, "decode");
  expect_near(pout, dpout, "prefill");
}

// Device lengths that give another number of work items than the plan's are detected on the
// device: every output and lse is NaN (no out-of-range read).
TEST(BatchDecodeCuda, StaleLengthsGiveNan) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device visible (cudaGetDeviceCount)";
  pst::BatchShape s;
  s.lengths = {0, 5000, 7, 1000};
  pst::BatchCase<float> c(s, 3);
  DeviceCase<float> d(c);
  ASSERT_TRUE(d.ok);
  phasekv::DecodePlan plan;
  plan.plan(c.args, 1, 1024);
  const std::vector<std::int64_t> stale = {0, 9, 7, 1000};
  PKV_CUDA_OK(d.lengths.upload(stale));
  std::size_t bytes = 0;
  PKV_CUDA_OK(phasekv::cuda::batch_decode(plan, d.args, nullptr, bytes));
  DeviceBuffer<unsigned char> ws(bytes);
  PKV_CUDA_OK(phasekv::cuda::batch_decode(plan, d.args, ws.get(), bytes));
  PKV_CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> o, l;
  PKV_CUDA_OK(d.out.download(o));
  PKV_CUDA_OK(d.lse.download(l));
  for (float x : o) ASSERT_TRUE(std::isnan(x));
  for (float x : l) ASSERT_TRUE(std::isnan(x));
}

// The kernels' row lookup (host/device code) finds the rows the CPU batch path reads, item by
// item, for every head: NHD and HND, one pool or two, CSR or dense tables, rings, uncompressed.
// Runs on the host, without a device.
template <class T>
void expect_rows_match_cpu(const pst::BatchShape& s) {
  pst::BatchCase<T> c(s, 5);
  const phasekv::PagedKV<T>& kv = c.args.kv;
  for (std::int64_t b = 0; b < c.B; ++b) {
    const phasekv::detail::PagedSequenceRows<T> cpu(kv, b);
    const auto dev = phasekv::cuda::detail::paged_sequence(kv, b, kv.lengths[b]);
    ASSERT_EQ(dev.vis.total(), cpu.total()) << s.name() << " sequence " << b;
    std::int64_t item = 0;
    for (int si = 0; si < cpu.segments(); ++si) {
      for (std::int64_t t = 0; t < cpu.size(si); ++t, ++item) {
        const T* kr = nullptr;
        const T* vr = nullptr;
        cpu.rows(si, t, 1, &kr, &vr);
        for (std::int64_t kh = 0; kh < s.kv_heads; ++kh) {
          const T* k = nullptr;
          const T* v = nullptr;
          phasekv::SegmentKind kind = phasekv::SegmentKind::raw;
          phasekv::cuda::detail::locate_item(dev, item, kh, k, v, kind);
          ASSERT_TRUE(k == kr + kh * cpu.key_head_stride(si) &&
                      v == vr + kh * cpu.value_head_stride(si) && kind == cpu.kind(si))
              << s.name() << " sequence " << b << " item " << item << " kv head " << kh;
        }
      }
    }
  }
}

TEST(BatchDecodeCudaRows, SameRowsAsTheCpuBatchPath) {
  pst::BatchShape s;
  s.W = 8, s.S = 4, s.O = 2, s.L = 16;
  s.lengths = draw_lengths(24, s.W, 13, 2);
  for (std::int64_t P : {1, 16, 64}) {
    s.page_size = P;
    s.layout = P == 16 ? phasekv::Layout::HND : phasekv::Layout::NHD;
    s.ring = P == 1, s.one_pool = P == 64, s.dense_table = P == 16;
    expect_rows_match_cpu<float>(s);
  }
  s.W = 0, s.L = 100, s.ring = true, s.page_size = 16;  // sliding window in a ring
  expect_rows_match_cpu<bf16_t>(s);
}

// Ragged batch prefill: q_b new queries per sequence (the last q_b of its n_b tokens), run on
// the device from a host PrefillPlan; returns the outputs.
template <class T>
void cpu_prefill(const pst::BatchCase<T>& c, const std::vector<std::int32_t>& qo,
                 const std::vector<float>& q, std::vector<float>& o, std::vector<float>& l) {
  phasekv::BatchPrefillArgs<T> a;
  a.q = q.data();
  a.qo_indptr = qo.data();
  a.q_heads = c.hq;
  a.kv_heads = c.shape.kv_heads;
  a.d_k = c.shape.d_k;
  a.d_v = c.shape.d_v;
  a.kv = c.args.kv;
  a.variant = c.args.variant;
  o.assign(static_cast<std::size_t>(qo.back() * c.hq * c.shape.d_v), std::nanf(""));
  l.assign(static_cast<std::size_t>(qo.back() * c.hq), std::nanf(""));
  a.out = o.data();
  a.lse = l.data();
  phasekv::PrefillPlan plan;
  plan.plan(a, 1);
  phasekv::batch_prefill(plan, a);
}

template <class T>
void run_prefill(const pst::BatchCase<T>& c, DeviceCase<T>& d, const std::vector<std::int32_t>& qo,
                 const std::vector<float>& q, std::vector<float>& o, std::vector<float>& l) {
  ASSERT_TRUE(d.ok) << "device allocation failed";
  const std::int64_t rows = qo.back();
  phasekv::BatchPrefillArgs<T> host;
  host.q = q.data();
  host.qo_indptr = qo.data();
  host.q_heads = c.hq;
  host.kv_heads = c.shape.kv_heads;
  host.d_k = c.shape.d_k;
  host.d_v = c.shape.d_v;
  host.kv = c.args.kv;
  host.variant = c.args.variant;
  phasekv::PrefillPlan plan;
  plan.plan(host, 2);
  ASSERT_EQ(phasekv::cuda::prefill_rows(plan), rows);
  DeviceBuffer<std::int32_t> dqo = to_device(qo);
  DeviceBuffer<float> dq = to_device(q);
  DeviceBuffer<float> dout(static_cast<std::size_t>(rows * c.hq * c.shape.d_v));
  DeviceBuffer<float> dlse(static_cast<std::size_t>(rows * c.hq));
  PKV_CUDA_OK(dout.poison());
  PKV_CUDA_OK(dlse.poison());
  phasekv::BatchPrefillArgs<T> dev = host;
  dev.q = dq.get();
  dev.qo_indptr = dqo.get();
  dev.kv = d.args.kv;
  dev.variant = d.args.variant;
  dev.out = dout.get();
  dev.lse = dlse.get();
  PKV_CUDA_OK(phasekv::cuda::batch_prefill(plan, dev));
  PKV_CUDA_OK(cudaDeviceSynchronize());
  PKV_CUDA_OK(dout.download(o));
  PKV_CUDA_OK(dlse.download(l));
}

// Row by row against the double reference of the row's own position.
template <class T>
void expect_prefill_close(const pst::BatchCase<T>& c, const std::vector<std::int32_t>& qo,
                          const std::vector<float>& q, const std::vector<float>& o,
                          const std::vector<float>& l, const std::string& what,
                          double bound = kCudaBound) {
  const pst::BatchShape& s = c.shape;
  using CV = phasekv::StridedView<const T>;
  for (std::int64_t b = 0; b < c.B; ++b) {
    const std::int64_t n = s.lengths[b], J = s.rule().at(n).entries;
    const CV rk = phasekv::make_view<const T>(c.raw_k[b].data(), n, s.kv_heads, s.d_k);
    const CV rv = phasekv::make_view<const T>(c.raw_v[b].data(), n, s.kv_heads, s.d_v);
    const CV ek = phasekv::make_view<const T>(c.ent_k[b].data(), J, s.kv_heads, s.d_k);
    const CV ev = phasekv::make_view<const T>(c.ent_v[b].data(), J, s.kv_heads, s.d_v);
    for (std::int64_t r = qo[b]; r < qo[b + 1]; ++r) {
      const std::int64_t t = n - (qo[b + 1] - r);
      std::vector<double> ro(static_cast<std::size_t>(c.hq * s.d_v)), rl(c.hq);
      phasekv::reference_decode<T>(q.data() + r * c.hq * s.d_k, c.hq,
                                   s.rule().template visible_kv<T>(t + 1, rk, rv, ek, ev),
                                   c.args.variant, ro.data(), rl.data());
      const pkt::ErrorStats e = pkt::compare(o.data() + r * c.hq * s.d_v, l.data() + r * c.hq,
                                             ro.data(), rl.data(), c.hq, s.d_v);
      ASSERT_TRUE(e.finite) << what << " sequence " << b << " position " << t;
      EXPECT_LE(e.max_rel, bound) << what << " sequence " << b << " position " << t;
      EXPECT_LE(e.max_lse, bound) << what << " sequence " << b << " position " << t;
    }
  }
}

// Decode rows (q = 1), chunks starting mid-window, chunks longer than a window, a whole
// prefill, idle (q = 0) and empty sequences; page sizes 1, 16, 64 give the same bits.
template <class T>
void prefill_page_sizes_and_reference() {
  pst::BatchShape s;
  s.W = 8, s.S = 4, s.O = 2, s.L = 16;
  s.kv_heads = 2, s.group = 3, s.d_k = 64, s.d_v = 40;
  s.lengths = {0, 1, 7, 300, 333, 40, 1000, 9, 700};
  const std::vector<std::int64_t> qb = {0, 1, 7, 1, 45, 0, 130, 9, 1};
  std::vector<std::int32_t> qo{0};
  for (std::int64_t x : qb) qo.push_back(qo.back() + static_cast<std::int32_t>(x));
  std::vector<float> first_o, first_l;
  for (std::int64_t P : {16, 1, 64}) {
    s.page_size = P;
    pst::BatchCase<T> c(s, 23);
    const std::vector<float> q =
        pkt::random_floats(static_cast<std::size_t>(qo.back() * c.hq * s.d_k), 77);
    if (P == 16) {  // the harness, on the CPU batch path (without a device too)
      std::vector<float> o, l;
      cpu_prefill(c, qo, q, o, l);
      expect_prefill_close(c, qo, q, o, l, s.name() + " cpu");
    }
    if (!has_device()) GTEST_SKIP() << "no CUDA device visible (cudaGetDeviceCount)";
    DeviceCase<T> d(c);
    std::vector<float> o, l;
    run_prefill(c, d, qo, q, o, l);
    if (P == 16) {
      expect_prefill_close(c, qo, q, o, l, s.name());
      first_o = o, first_l = l;
    } else {
      EXPECT_TRUE(same_bits(o, first_o) && same_bits(l, first_l))
          << s.name() << ": bits differ from page size 16";
    }
  }
}

TEST(BatchPrefillCuda, F32SameBitsForEveryPageSizeAndWithinReference) {
  prefill_page_sizes_and_reference<float>();
}
TEST(BatchPrefillCuda, Bf16SameBitsForEveryPageSizeAndWithinReference) {
  prefill_page_sizes_and_reference<bf16_t>();
}

// A ring of raw slots, HND, dense tables, GQA 5, odd d_v and every variant hook, f32.
TEST(BatchPrefillCuda, RingLayoutsAndVariantsWithinReference) {
  pst::BatchShape s;
  s.W = 8, s.S = 4, s.O = 3, s.L = 20;
  s.kv_heads = 2, s.group = 5, s.d_k = 48, s.d_v = 33;
  s.lengths = {500, 0, 29, 64};
  s.page_size = 16;
  s.layout = phasekv::Layout::HND;
  s.ring = true, s.dense_table = true;
  const std::vector<std::int64_t> qb = {3, 0, 2, 1};  // the ring holds max(W, L) + 3 slots
  std::vector<std::int32_t> qo{0};
  for (std::int64_t x : qb) qo.push_back(qo.back() + static_cast<std::int32_t>(x));
  phasekv::StandardVariant var;
  var.softcap = 30.0f;
  var.entry_bias = std::log(8.0f);
  std::vector<float> sinks(10);
  for (std::size_t h = 0; h < sinks.size(); ++h) sinks[h] = 0.5f - 0.2f * static_cast<float>(h);
  var.sinks = sinks.data();
  pst::BatchCase<float> c(s, 9, var);
  const std::vector<float> q =
      pkt::random_floats(static_cast<std::size_t>(qo.back() * c.hq * s.d_k), 78);
  std::vector<float> o, l;
  cpu_prefill(c, qo, q, o, l);  // the harness, on the CPU batch path
  expect_prefill_close(c, qo, q, o, l, s.name() + " cpu");
  if (!has_device()) GTEST_SKIP() << "no CUDA device visible (cudaGetDeviceCount)";
  DeviceCase<float> d(c, sinks);
  run_prefill(c, d, qo, q, o, l);
  expect_prefill_close(c, qo, q, o, l, s.name());
}

TEST(BatchPrefillCudaRows, SequenceOfRow) {
  const std::int32_t qo[] = {0, 0, 3, 3, 4, 9};
  const std::int64_t want[] = {1, 1, 1, 3, 4, 4, 4, 4, 4, -1, -1};
  for (std::int64_t r = 0; r < 11; ++r)
    EXPECT_EQ(phasekv::cuda::detail::sequence_of_row(qo, 5, r), want[r]) << "row " << r;
  EXPECT_EQ(phasekv::cuda::detail::sequence_of_row(qo, 0, 0), -1);
}

// Batched streaming compression into pages: rounds of ragged chunks (a length-0 sequence, chunks
// starting mid-window, chunks longer than a window) appended by the CPU paged_append into a host
// pool and by cuda::paged_append into a device copy; after every round the two pools hold the
// same bytes (entries, raw tokens and the untouched poison). The CPU path equals
// CompressedCache bit for bit (test_paged_append), so the CUDA one does too.
template <class T, class KP, class VP>
void append_matches_cpu(const KP& kp, const VP& vp, const KP& kp_dev, const VP& vp_dev,
                        std::int64_t H, std::int64_t local, std::int64_t page, bool ring,
                        std::uint32_t seed, const std::string& what) {
  using i64 = std::int64_t;
  const phasekv::Geometry g = kp.geometry();
  const i64 dk = kp.input_dim(), dv = vp.input_dim(), B = 6, rounds = 4, W = g.window();
  std::mt19937_64 rng(seed);
  std::vector<std::vector<i64>> chunk(static_cast<std::size_t>(rounds), std::vector<i64>(B));
  std::vector<i64> total(B, 0);
  for (i64 r = 0; r < rounds; ++r)
    for (i64 b = 0; b < B; ++b) {
      chunk[r][b] = b == 0 ? 0 : pkv_test::rand_int(rng, 0, 3 * W + 5);
      if (r == 1 && b == 2) chunk[r][b] = 300;  // a long prefill chunk
      total[b] += chunk[r][b];
    }
  const i64 ring_slots = ring ? g.ring_capacity(local) + 2 : 0;
  std::vector<i64> rp(B), ep(B);
  i64 raw_pages = 0, ent_pages = 0;
  for (i64 b = 0; b < B; ++b) {
    i64 slots = total[b];
    if (ring && slots > g.origin() + ring_slots) slots = g.origin() + ring_slots;
    rp[b] = (slots + page - 1) / page;
    ep[b] = (g.complete_windows(total[b]) + page - 1) / page;
    raw_pages += rp[b], ent_pages += ep[b];
  }
  // raw pages NHD in separate K and V pools, entry pages HND in one [K|V] pool, both shuffled
  std::vector<std::int32_t> rperm(static_cast<std::size_t>(raw_pages + 1)),
      eperm(static_cast<std::size_t>(ent_pages + 1));
  std::iota(rperm.begin(), rperm.end(), 0);
  std::iota(eperm.begin(), eperm.end(), 0);
  std::shuffle(rperm.begin(), rperm.end(), rng);
  std::shuffle(eperm.begin(), eperm.end(), rng);
  std::vector<std::int32_t> rind, eind, rptr{0}, eptr{0};
  std::size_t nr = 0, ne = 0;
  for (i64 b = 0; b < B; ++b) {
    for (i64 i = 0; i < rp[b]; ++i) rind.push_back(rperm[nr++]);
    for (i64 i = 0; i < ep[b]; ++i) eind.push_back(eperm[ne++]);
    rptr.push_back(static_cast<std::int32_t>(rind.size()));
    eptr.push_back(static_cast<std::int32_t>(eind.size()));
  }
  rind.push_back(0), eind.push_back(0);  // never empty
  const T poison = phasekv::from_float<T>(-7.0f);
  std::vector<T> rk(static_cast<std::size_t>((raw_pages + 1) * page * H * dk), poison);
  std::vector<T> rv(static_cast<std::size_t>((raw_pages + 1) * page * H * dv), poison);
  std::vector<T> ekv(static_cast<std::size_t>((ent_pages + 1) * page * H * (dk + dv)), poison);
  DeviceBuffer<T> drk = to_device(rk), drv = to_device(rv), dekv = to_device(ekv);
  DeviceBuffer<std::int32_t> drind = to_device(rind), deind = to_device(eind);
  DeviceBuffer<std::int32_t> drptr = to_device(rptr), deptr = to_device(eptr);
  phasekv::PagedAppendArgs<T> a, d;
  a.raw_pool = phasekv::make_page_pool(rk.data(), rv.data(), raw_pages + 1, page, H, dk, dv);
  a.entry_pool =
      phasekv::make_kv_page_pool(ekv.data(), ent_pages + 1, page, H, dk, dv, phasekv::Layout::HND);
  a.raw_table = phasekv::csr_block_table(rptr.data(), rind.data(), B);
  a.entry_table = phasekv::csr_block_table(eptr.data(), eind.data(), B);
  a.batch = B;
  a.ring_slots = ring_slots;
  std::vector<i64> len(B, 0);
  a.lengths = len.data();
  d = a;
  d.raw_pool = phasekv::make_page_pool(drk.get(), drv.get(), raw_pages + 1, page, H, dk, dv);
  d.entry_pool =
      phasekv::make_kv_page_pool(dekv.get(), ent_pages + 1, page, H, dk, dv, phasekv::Layout::HND);
  d.raw_table = phasekv::csr_block_table(drptr.get(), drind.get(), B);
  d.entry_table = phasekv::csr_block_table(deptr.get(), deind.get(), B);
  const bool dev = has_device();
  for (i64 r = 0; r < rounds; ++r) {
    std::vector<std::int32_t> indptr{0};
    for (i64 b = 0; b < B; ++b)
      indptr.push_back(indptr.back() + static_cast<std::int32_t>(chunk[r][b]));
    pkv_test::Tensor<T> nk(indptr.back(), H, dk), nv(indptr.back(), H, dv);
    nk.randomize(rng);
    nv.randomize(rng);
    a.new_indptr = indptr.data();
    a.keys = nk.cview();
    a.values = nv.cview();
    phasekv::paged_append(kp, vp, local, a);
    if (!dev) {  // the CPU side only (it keeps the rounds' random draws the same)
      for (i64 b = 0; b < B; ++b) len[b] += chunk[r][b];
      continue;
    }
    DeviceBuffer<i64> dlen = to_device(len);
    DeviceBuffer<std::int32_t> dind = to_device(indptr);
    DeviceBuffer<T> dnk = to_device(nk.data), dnv = to_device(nv.data);
    d.lengths = dlen.get();
    d.new_indptr = dind.get();
    d.keys = pkv_cuda_test::rebase(nk.cview(), static_cast<const T*>(dnk.get()), nk.data.data());
    d.values = pkv_cuda_test::rebase(nv.cview(), static_cast<const T*>(dnv.get()), nv.data.data());
    PKV_CUDA_OK(phasekv::cuda::paged_append(kp_dev, vp_dev, local, a, d));
    PKV_CUDA_OK(cudaDeviceSynchronize());
    std::vector<T> grk, grv, gekv;
    PKV_CUDA_OK(drk.download(grk));
    PKV_CUDA_OK(drv.download(grv));
    PKV_CUDA_OK(dekv.download(gekv));
    ASSERT_TRUE(std::memcmp(gekv.data(), ekv.data(), ekv.size() * sizeof(T)) == 0)
        << what << " round " << r << ": entry pages differ";
    ASSERT_TRUE(std::memcmp(grk.data(), rk.data(), rk.size() * sizeof(T)) == 0 &&
                std::memcmp(grv.data(), rv.data(), rv.size() * sizeof(T)) == 0)
        << what << " round " << r << ": raw pages differ";
    for (i64 b = 0; b < B; ++b) len[b] += chunk[r][b];
  }
  if (!dev) GTEST_SKIP() << "no CUDA device visible (cudaGetDeviceCount)";
}

// MaxPool keys (the generic path: one thread runs compress) and UniformMean values (its
// compress_kernels fast path); W8/S4/O2 with a ring and page 16, W3/S5/O1 (gaps) all raw with
// page 1, W4/S4 page 64.
template <class T>
void append_pool_policies() {
  const phasekv::Geometry geos[] = {phasekv::Geometry(8, 4, 2), phasekv::Geometry(3, 5, 1),
                                    phasekv::Geometry(4, 4, 0)};
  const std::int64_t pages[] = {16, 1, 64};
  for (int k = 0; k < 3; ++k) {
    const phasekv::Geometry& g = geos[k];
    const phasekv::MaxPool kp(g, 8);
    const phasekv::UniformMean vp(g, 6);
    append_matches_cpu<T>(
        kp, vp, kp, vp, 2, 6, pages[k], k == 0, 100 + k,
        "MaxPool/UniformMean W" + std::to_string(g.window()) + " P" + std::to_string(pages[k]));
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(PagedAppendCuda, F32SameBitsAsCpu) { append_pool_policies<float>(); }
TEST(PagedAppendCuda, Bf16SameBitsAsCpu) { append_pool_policies<bf16_t>(); }

// GatedPool (scalar gates with Z, b and a payload map for keys, vector gates for values) through
// its fast path, parameters in device memory, f32.
TEST(PagedAppendCuda, GatedPoolSameBitsAsCpu) {
  std::mt19937_64 rng(5);
  const phasekv::Geometry g(8, 4, 2);
  const auto pk =
      pkv_test::GatedParams::random(rng, g, 2, 8, 8, phasekv::GateKind::scalar, true, true, true);
  const auto pv =
      pkv_test::GatedParams::random(rng, g, 2, 6, 6, phasekv::GateKind::vector, true, true, false);
  if (!has_device()) {  // the CPU side only; device parameters cannot be made
    append_matches_cpu<float>(pk.policy(), pv.policy(), pk.policy(), pv.policy(), 2, 16, 16, true,
                              7, "GatedPool");
    return;
  }
  DeviceBuffer<float> kz = to_device(pk.z), kb = to_device(pk.b), kc = to_device(pk.c);
  DeviceBuffer<float> vz = to_device(pv.z), vb = to_device(pv.b);
  const phasekv::GatedPool dk(
      g, 2, 8, 8, phasekv::GateKind::scalar, phasekv::param_view(kz.get(), {2, 8, 1, 8}),
      phasekv::param_view(kb.get(), {2, 8, 1}), phasekv::param_view(kc.get(), {2, 8, 8, 8}));
  const phasekv::GatedPool dv(g, 2, 6, 6, phasekv::GateKind::vector,
                              phasekv::param_view(vz.get(), {2, 8, 6, 6}),
                              phasekv::param_view(vb.get(), {2, 8, 6}));
  append_matches_cpu<float>(pk.policy(), pv.policy(), dk, dv, 2, 16, 16, true, 7, "GatedPool");
}

// Host-side validation: no device needed, nothing launched.
TEST(BatchDecodeCudaArgs, RejectedWithANamedArgument) {
  pst::BatchShape s;
  s.lengths = {0, 30, 7};
  pst::BatchCase<float> c(s, 3);
  std::size_t bytes = 0;
  phasekv::DecodePlan empty;
  EXPECT_EQ(phasekv::cuda::batch_decode(empty, c.args, nullptr, bytes), cudaErrorInvalidValue);
  EXPECT_NE(std::string(phasekv::cuda::last_error_message()).find("plan"), std::string::npos);
  phasekv::DecodePlan plan;
  plan.plan(c.args, 2, 64);
  ASSERT_EQ(phasekv::cuda::batch_decode(plan, c.args, nullptr, bytes), cudaSuccess);
  EXPECT_GT(bytes, 0u);
  EXPECT_STREQ(phasekv::cuda::last_error_message(), "");
  phasekv::BatchDecodeArgs<float> a = c.args;
  a.kv.batch = 2;
  EXPECT_EQ(phasekv::cuda::batch_decode(plan, a, nullptr, bytes), cudaErrorInvalidValue);
  EXPECT_NE(std::string(phasekv::cuda::last_error_message()).find("kv.batch"), std::string::npos);
  a = c.args;
  a.kv.raw_pool.d_k = 32;
  EXPECT_EQ(phasekv::cuda::batch_decode(plan, a, nullptr, bytes), cudaErrorInvalidValue);
  EXPECT_NE(std::string(phasekv::cuda::last_error_message()).find("kv.raw_pool"),
            std::string::npos);
  a = c.args;
  a.out = nullptr;
  EXPECT_EQ(phasekv::cuda::batch_decode(plan, a, nullptr, bytes), cudaErrorInvalidValue);
  std::size_t small = bytes - 1;
  alignas(256) static unsigned char fake[256];
  EXPECT_EQ(phasekv::cuda::batch_decode(plan, c.args, fake, small), cudaErrorInvalidValue);
  EXPECT_NE(std::string(phasekv::cuda::last_error_message()).find("workspace_bytes"),
            std::string::npos);
  // batch prefill
  phasekv::PrefillPlan none;
  phasekv::BatchPrefillArgs<float> pa;
  EXPECT_EQ(phasekv::cuda::batch_prefill(none, pa), cudaErrorInvalidValue);
  EXPECT_NE(std::string(phasekv::cuda::last_error_message()).find("plan"), std::string::npos);
  const std::vector<std::int32_t> qo = {0, 0, 4, 5};
  const std::vector<float> q(static_cast<std::size_t>(5 * c.hq * s.d_k), 0.5f);
  pa.q = q.data();
  pa.qo_indptr = qo.data();
  pa.q_heads = c.hq;
  pa.kv_heads = s.kv_heads;
  pa.d_k = s.d_k;
  pa.d_v = s.d_v;
  pa.kv = c.args.kv;
  phasekv::PrefillPlan pp;
  pp.plan(pa, 1);
  EXPECT_EQ(phasekv::cuda::prefill_rows(pp), 5);
  pa.kv.batch = 1;
  EXPECT_EQ(phasekv::cuda::batch_prefill(pp, pa), cudaErrorInvalidValue);
  EXPECT_NE(std::string(phasekv::cuda::last_error_message()).find("kv.batch"), std::string::npos);
  pa.kv.batch = 3;
  pa.out = nullptr;
  EXPECT_EQ(phasekv::cuda::batch_prefill(pp, pa), cudaErrorInvalidValue);
  EXPECT_NE(std::string(phasekv::cuda::last_error_message()).find("device memory"),
            std::string::npos);
  // paged append: sequence 1 appends 9 tokens, its entry table lists no page for J(9) = 3
  const phasekv::Geometry g(4, 2, 0);
  const phasekv::UniformMean um(g, 4);
  std::vector<float> pool(8 * 4 * 1 * 8, 0.5f);
  const auto P = phasekv::make_kv_page_pool(pool.data(), 8, 4, 1, 4, 4);
  const std::int32_t rptr[] = {0, 1, 4}, rind[] = {0, 1, 2, 3};
  const std::int32_t eptr[] = {0, 0, 0}, eind[] = {7};
  const std::int64_t len[] = {2, 0};
  const std::int32_t indptr[] = {0, 1, 10};
  std::vector<float> k(10 * 4, 1.0f), v(10 * 4, 2.0f);
  phasekv::PagedAppendArgs<float> h;
  h.raw_pool = P;
  h.entry_pool = P;
  h.raw_table = phasekv::csr_block_table(rptr, rind, 2);
  h.entry_table = phasekv::csr_block_table(eptr, eind, 2);
  h.lengths = len;
  h.batch = 2;
  h.new_indptr = indptr;
  h.keys = phasekv::make_view<const float>(k.data(), 10, 1, 4);
  h.values = phasekv::make_view<const float>(v.data(), 10, 1, 4);
  EXPECT_EQ(phasekv::cuda::paged_append(um, um, 0, h, h), cudaErrorInvalidValue);
  EXPECT_NE(
      std::string(phasekv::cuda::last_error_message()).find("entry_table pages of sequence 1"),
      std::string::npos)
      << phasekv::cuda::last_error_message();
  const std::int32_t eptr2[] = {0, 0, 1};
  h.entry_table = phasekv::csr_block_table(eptr2, eind, 2);
  phasekv::PagedAppendArgs<float> d = h;
  d.ring_slots = 5;
  EXPECT_EQ(phasekv::cuda::paged_append(um, um, 0, h, d), cudaErrorInvalidValue);
  EXPECT_NE(std::string(phasekv::cuda::last_error_message()).find("device.ring_slots"),
            std::string::npos);
  d = h;
  d.raw_pool.page_size = 8;
  EXPECT_EQ(phasekv::cuda::paged_append(um, um, 0, h, d), cudaErrorInvalidValue);
  EXPECT_NE(std::string(phasekv::cuda::last_error_message()).find("device.raw_pool"),
            std::string::npos);
  EXPECT_EQ(pool, std::vector<float>(8 * 4 * 1 * 8, 0.5f));  // nothing written
}

}  // namespace
