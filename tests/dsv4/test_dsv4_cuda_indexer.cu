// The CUDA twin of the DeepSeek-V4 lightning indexer (dsv4/cuda/indexer.cuh) and the
// host/device math it shares (dsv4::index_score, dsv4::topk_key).
//
// Always run (no device needed): the sort key orders as the CPU's top-k rule (ties to the lower
// index, -0 == +0), a host model of the kernel (index_score + key sort) against a float64
// reference and against the CPU indexer, and the host checks of the launcher. With a device:
// every score equals the host's index_score bits, the selection equals the CPU rule applied to
// those scores (ties, fewer than k visible, -1 padding), the selection is right against the
// reference where score gaps exceed the derived f32 bound, the same bits on a second run; J up
// to 2^20, k up to 2048, f32/bf16/f16 keys.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.hpp"
#include "phasekv/dsv4/cuda/indexer.cuh"
#include "phasekv/dsv4/indexer.hpp"
#include "phasekv/dsv4/kernel_math.hpp"

namespace {

namespace dsv4 = phasekv::dsv4;
using phasekv::bf16_t;
using phasekv::f16_t;
using pkv_cuda_test::DeviceBuffer;
using pkv_cuda_test::has_device;
using pkv_cuda_test::to_device;
using i64 = std::int64_t;

// The top-k order of sorted keys (descending) is the CPU's select_top_k order, ties and signed
// zeros included, and the keys give back index and score.
TEST(Dsv4KernelMath, TopkKeyOrderIsTheCpuRule) {
  std::mt19937 rng(5);
  for (int round = 0; round < 20; ++round) {
    const i64 count = 1 + static_cast<i64>(rng() % 3000);
    std::vector<float> s(static_cast<std::size_t>(count));
    for (auto& x : s) {
      const auto r = static_cast<unsigned>(rng() % 10);
      x = r == 0   ? 0.0f
          : r == 1 ? -0.0f
          : r == 2 ? -HUGE_VALF
          : r < 6  ? static_cast<float>(static_cast<int>(rng() % 9) - 4)  // many ties
                   : std::ldexp(static_cast<float>(static_cast<int>(rng() % 2001) - 1000),
                                static_cast<int>(rng() % 40) - 20);
    }
    std::vector<std::uint64_t> keys(s.size());
    for (i64 j = 0; j < count; ++j) {
      const std::uint64_t key =
          dsv4::topk_key(s[static_cast<std::size_t>(j)], static_cast<std::int32_t>(j));
      keys[static_cast<std::size_t>(j)] = key;
      ASSERT_EQ(dsv4::topk_key_index(key), j);
      const float back = dsv4::topk_key_score(key);
      ASSERT_TRUE(back == s[static_cast<std::size_t>(j)]);  // -0 comes back as +0: equal
    }
    std::sort(keys.begin(), keys.end(), [](std::uint64_t a, std::uint64_t b) { return a > b; });
    const i64 k = 1 + static_cast<i64>(rng() % 4000);
    std::vector<std::int32_t> want(static_cast<std::size_t>(k)), order;
    std::vector<float> want_s(static_cast<std::size_t>(k));
    dsv4::detail::select_top_k(s.data(), count, k, order, want.data(), want_s.data());
    for (i64 i = 0; i < k; ++i) {
      const std::int32_t got =
          i < count ? dsv4::topk_key_index(keys[static_cast<std::size_t>(i)]) : -1;
      ASSERT_EQ(got, want[static_cast<std::size_t>(i)]) << "round " << round << " slot " << i;
    }
  }
  // the extreme index and the largest finite scores
  EXPECT_EQ(dsv4::topk_key_index(dsv4::topk_key(1.0f, 0x7fffffff)), 0x7fffffff);
  EXPECT_GT(dsv4::topk_key(3.4e38f, 5), dsv4::topk_key(3.3e38f, 0));
  EXPECT_GT(dsv4::topk_key(-3.3e38f, 5), dsv4::topk_key(-3.4e38f, 0));
  EXPECT_GT(dsv4::topk_key(2.0f, 4), dsv4::topk_key(2.0f, 7));
}

struct ICase {
  std::string name;
  i64 heads = 1, dim = 16, k = 8, ratio = 4, first = 0, queries = 1;
  bool integers = false;  // small integer values: exact scores, many exact ties
  std::uint32_t seed = 1;
};

template <class T>
struct IData {
  ICase c;
  dsv4::IndexerParams params;
  i64 j_max = 0, stride = 0;
  std::vector<float> q, w;
  std::vector<T> keys;

  explicit IData(const ICase& cc) : c(cc) {
    params.heads = c.heads;
    params.dim = c.dim;
    params.top_k = c.k;
    params.geometry = phasekv::Geometry(c.ratio, c.ratio);
    j_max = params.geometry.complete_windows(c.first + c.queries);
    stride = c.dim + 1;
    std::mt19937 rng(c.seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const auto draw = [&]() {
      return c.integers ? static_cast<float>(static_cast<int>(rng() % 5) - 2) : nd(rng);
    };
    q.resize(static_cast<std::size_t>(c.queries * c.heads * c.dim));
    for (auto& x : q) x = draw();
    w.resize(static_cast<std::size_t>(c.queries * c.heads));
    for (auto& x : w) x = c.integers ? static_cast<float>(rng() % 3) : nd(rng);
    keys.resize(static_cast<std::size_t>(std::max<i64>(j_max, 1) * stride));
    for (auto& x : keys) x = phasekv::from_float<T>(draw());
  }

  i64 visible(i64 i) const { return params.geometry.complete_windows(c.first + i + 1); }
  const float* qi(i64 i) const { return q.data() + i * c.heads * c.dim; }
  const float* wi(i64 i) const { return w.data() + i * c.heads; }

  // Host index_score of every visible entry of query i.
  std::vector<float> host_scores(i64 i) const {
    std::vector<float> s(static_cast<std::size_t>(visible(i)));
    for (i64 j = 0; j < visible(i); ++j)
      s[static_cast<std::size_t>(j)] =
          dsv4::index_score<T>(qi(i), wi(i), keys.data() + j * stride, c.heads, c.dim);
    return s;
  }

  // float64 scores and the f32 error bound of each: the 16 partial sums of ceil(dim/16) fmas
  // and the 4-level tree, then the fma head sum (gamma_n = n u, u = 2^-24, 1% slack).
  void reference(i64 i, std::vector<double>& ref, std::vector<double>& bound) const {
    const i64 J = visible(i);
    ref.assign(static_cast<std::size_t>(J), 0.0);
    bound.assign(static_cast<std::size_t>(J), 0.0);
    const double u = std::ldexp(1.0, -24) * 1.01;
    const double terms = static_cast<double>((c.dim + 15) / 16 + 4);
    for (i64 j = 0; j < J; ++j) {
      const T* k = keys.data() + j * stride;
      double s = 0.0, dot_err = 0.0, head_abs = 0.0;
      for (i64 h = 0; h < c.heads; ++h) {
        double dot = 0.0, mag = 0.0;
        for (i64 x = 0; x < c.dim; ++x) {
          const double p = double{qi(i)[h * c.dim + x]} * phasekv::to_float(k[x]);
          dot += p;
          mag += std::abs(p);
        }
        const double wh = wi(i)[h];
        s += wh * std::max(dot, 0.0);
        dot_err += std::abs(wh) * terms * u * mag;
        head_abs += std::abs(wh * std::max(dot, 0.0));
      }
      ref[static_cast<std::size_t>(j)] = s;
      bound[static_cast<std::size_t>(j)] =
          dot_err + static_cast<double>(c.heads + 1) * u * head_abs + 1e-38;
    }
  }

  // A selection `sel` ([k], -1 padded) of query i is right against the reference: the first
  // min(J, k) slots hold distinct visible entries, the rest -1; consecutive slots descend up to
  // the bounds; nothing left out beats something kept by more than the bounds.
  void expect_selection(i64 i, const std::int32_t* sel, const std::string& what) const {
    std::vector<double> ref, b;
    reference(i, ref, b);
    const i64 J = visible(i), m = std::min(J, c.k);
    std::vector<char> kept(static_cast<std::size_t>(J), 0);
    double floor_kept = HUGE_VAL;
    for (i64 s = 0; s < c.k; ++s) {
      const std::int32_t j = sel[s];
      if (s >= m) {
        ASSERT_EQ(j, -1) << what << " query " << i << " slot " << s;
        continue;
      }
      ASSERT_TRUE(j >= 0 && j < J) << what << " query " << i << " slot " << s << " = " << j;
      ASSERT_FALSE(kept[static_cast<std::size_t>(j)]) << what << " duplicate " << j;
      kept[static_cast<std::size_t>(j)] = 1;
      floor_kept =
          std::min(floor_kept, ref[static_cast<std::size_t>(j)] + b[static_cast<std::size_t>(j)]);
      if (s > 0) {
        const std::int32_t a = sel[s - 1];
        EXPECT_GE(ref[static_cast<std::size_t>(a)] + b[static_cast<std::size_t>(a)],
                  ref[static_cast<std::size_t>(j)] - b[static_cast<std::size_t>(j)])
            << what << " query " << i << " slots " << s - 1 << ", " << s;
      }
    }
    for (i64 j = 0; j < J; ++j)
      if (!kept[static_cast<std::size_t>(j)])
        EXPECT_LE(ref[static_cast<std::size_t>(j)] - b[static_cast<std::size_t>(j)], floor_kept)
            << what << " query " << i << ": entry " << j << " left out";
  }
};

// The host model (index_score + the key order) and the CPU indexer against the reference; the
// CPU's scores and the model's within twice the bound.
template <class T>
void host_side(const IData<T>& d) {
  const i64 Q = d.c.queries, k = d.c.k;
  std::vector<std::int32_t> cpu(static_cast<std::size_t>(Q * k));
  std::vector<float> cpu_s(static_cast<std::size_t>(Q * k));
  dsv4::indexer_top_k<T>(d.params, d.q.data(), d.w.data(), d.keys.data(), d.j_max, d.stride,
                         d.c.first, Q, cpu.data(), cpu_s.data());
  for (i64 i = 0; i < Q; ++i) {
    const std::vector<float> s = d.host_scores(i);
    std::vector<std::uint64_t> keys(s.size());
    for (std::size_t j = 0; j < s.size(); ++j)
      keys[j] = dsv4::topk_key(s[j], static_cast<std::int32_t>(j));
    std::sort(keys.begin(), keys.end(), [](std::uint64_t a, std::uint64_t b) { return a > b; });
    std::vector<std::int32_t> model(static_cast<std::size_t>(k), -1);
    for (i64 x = 0; x < std::min<i64>(k, static_cast<i64>(keys.size())); ++x)
      model[static_cast<std::size_t>(x)] = dsv4::topk_key_index(keys[static_cast<std::size_t>(x)]);
    d.expect_selection(i, model.data(), d.c.name + " host model");
    d.expect_selection(i, cpu.data() + i * k, d.c.name + " cpu");
    std::vector<double> ref, b;
    d.reference(i, ref, b);
    for (std::size_t j = 0; j < s.size(); ++j)
      ASSERT_LE(std::abs(s[j] - ref[j]), b[j]) << d.c.name << " query " << i << " entry " << j;
    for (i64 x = 0; x < k; ++x) {
      const std::int32_t j = cpu[static_cast<std::size_t>(i * k + x)];
      if (j >= 0)
        EXPECT_LE(std::abs(double{cpu_s[static_cast<std::size_t>(i * k + x)]} -
                           s[static_cast<std::size_t>(j)]),
                  2 * b[static_cast<std::size_t>(j)]);
    }
  }
}

// Device run into poisoned outputs; returns indices, scores and every (query, entry) score
// from the workspace's unsorted keys.
template <class T>
void run_device(const IData<T>& d, std::vector<std::int32_t>& idx, std::vector<float>& sc,
                std::vector<std::vector<float>>& all, bool decode = false) {
  const i64 Q = d.c.queries, k = d.c.k;
  auto q = to_device(d.q), w = to_device(d.w);
  auto keys = to_device(d.keys);
  DeviceBuffer<std::int32_t> di(static_cast<std::size_t>(Q * k));
  DeviceBuffer<float> ds(static_cast<std::size_t>(Q * k));
  ASSERT_TRUE(q.ok(d.q.size()) && keys.ok(d.keys.size()) && di.ok(di.size()) && ds.ok(ds.size()));
  std::size_t bytes = 0;
  PKV_CUDA_OK(dsv4::cuda::indexer_top_k<T>(d.params, q.get(), w.get(), keys.get(), d.j_max,
                                           d.stride, d.c.first, Q, di.get(), ds.get(), nullptr,
                                           bytes));
  DeviceBuffer<unsigned char> ws(bytes);
  ASSERT_TRUE(ws.ok(bytes));
  PKV_CUDA_OK(di.poison());
  PKV_CUDA_OK(ds.poison());
  if (decode)
    PKV_CUDA_OK(dsv4::cuda::indexer_decode<T>(d.params, q.get(), w.get(), keys.get(), d.j_max,
                                              d.stride, d.c.first + 1, di.get(), ds.get(), ws.get(),
                                              bytes));
  else
    PKV_CUDA_OK(dsv4::cuda::indexer_top_k<T>(d.params, q.get(), w.get(), keys.get(), d.j_max,
                                             d.stride, d.c.first, Q, di.get(), ds.get(), ws.get(),
                                             bytes));
  PKV_CUDA_OK(cudaDeviceSynchronize());
  PKV_CUDA_OK(di.download(idx));
  PKV_CUDA_OK(ds.download(sc));
  const auto lay = dsv4::cuda::detail::IndexerLayout::make(Q, d.j_max);
  std::vector<std::uint64_t> raw(static_cast<std::size_t>(Q * d.j_max));
  if (!raw.empty())
    PKV_CUDA_OK(cudaMemcpy(raw.data(), ws.get() + lay.off_keys, raw.size() * sizeof(std::uint64_t),
                           cudaMemcpyDeviceToHost));
  all.assign(static_cast<std::size_t>(Q), {});
  for (i64 i = 0; i < Q; ++i) {
    const i64 J = d.visible(i);
    for (i64 j = 0; j < J; ++j) {
      const std::uint64_t key = raw[static_cast<std::size_t>(i * d.j_max + j)];
      ASSERT_EQ(dsv4::topk_key_index(key), j) << d.c.name << " query " << i;
      all[static_cast<std::size_t>(i)].push_back(dsv4::topk_key_score(key));
    }
  }
}

template <class T>
void check_case(const ICase& c, bool decode = false) {
  const IData<T> d(c);
  host_side(d);
  if (!has_device()) GTEST_SKIP() << "no CUDA device visible (cudaGetDeviceCount)";
  std::vector<std::int32_t> idx, idx2;
  std::vector<float> sc, sc2;
  std::vector<std::vector<float>> all, all2;
  run_device(d, idx, sc, all, decode);
  const i64 k = c.k;
  for (i64 i = 0; i < c.queries; ++i) {
    const std::vector<float> host = d.host_scores(i);
    const std::vector<float>& dev = all[static_cast<std::size_t>(i)];
    ASSERT_EQ(dev.size(), host.size());
    EXPECT_EQ(0, std::memcmp(dev.data(), host.data(), host.size() * sizeof(float)))
        << c.name << " query " << i << ": device scores differ from the host's index_score";
    std::vector<std::int32_t> want(static_cast<std::size_t>(k)), order;
    std::vector<float> want_s(static_cast<std::size_t>(k));
    dsv4::detail::select_top_k(dev.data(), static_cast<i64>(dev.size()), k, order, want.data(),
                               want_s.data());
    for (i64 x = 0; x < k; ++x) {
      ASSERT_EQ(idx[static_cast<std::size_t>(i * k + x)], want[static_cast<std::size_t>(x)])
          << c.name << " query " << i << " slot " << x;
      ASSERT_EQ(sc[static_cast<std::size_t>(i * k + x)], want_s[static_cast<std::size_t>(x)])
          << c.name << " query " << i << " slot " << x;
    }
    d.expect_selection(i, idx.data() + i * k, c.name + " device");
  }
  run_device(d, idx2, sc2, all2, decode);
  EXPECT_EQ(idx, idx2) << c.name;
  EXPECT_EQ(0, std::memcmp(sc.data(), sc2.data(), sc.size() * sizeof(float))) << c.name;
}

ICase make(const std::string& name, i64 heads, i64 dim, i64 k, i64 ratio, i64 first, i64 queries,
           bool integers, std::uint32_t seed) {
  ICase c;
  c.name = name;
  c.heads = heads, c.dim = dim, c.k = k, c.ratio = ratio, c.first = first, c.queries = queries;
  c.integers = integers, c.seed = seed;
  return c;
}

// 7 tokens at ratio 4: queries see 0 or 1 entries of a top-5 (-1 padding), dim 7.
TEST(IndexerCuda, F32SevenTokensPadding) {
  check_case<float>(make("f32 n7", 1, 7, 5, 4, 0, 7, false, 21));
}

// The V4 shape: 64 heads x 128, top-512 of about 250 visible entries (1000 tokens, ratio 4).
TEST(IndexerCuda, Bf16ThousandTokensV4Shape) {
  check_case<bf16_t>(make("bf16 n1000 H64", 64, 128, 512, 4, 990, 10, false, 22));
}

// 97 queries at ratio 1 (J = 1 .. 97) with small integer values: exact scores, many ties.
TEST(IndexerCuda, F16NinetySevenQueriesWithTies) {
  check_case<f16_t>(make("f16 n97 ties", 3, 56, 16, 1, 0, 97, true, 23));
}

// J = 2^20 entries, top-2048, integer values (ties at the top), through indexer_decode.
TEST(IndexerCuda, Bf16MillionEntriesTop2048Decode) {
  check_case<bf16_t>(make("bf16 J2^20 ties", 1, 16, 2048, 1, (i64{1} << 20) - 1, 1, true, 24),
                     true);
}

// Top-2048 of 5000 entries, 64 heads, three queries.
TEST(IndexerCuda, F32FiveThousandEntriesTop2048) {
  check_case<float>(make("f32 J5000 H64", 64, 128, 2048, 4, 19997, 3, false, 25));
}

// ---- host checks (no device needed) ------------------------------------------------------

struct BadIdx {
  dsv4::IndexerParams p;
  const float* q = reinterpret_cast<const float*>(0x1000);
  const float* w = reinterpret_cast<const float*>(0x2000);
  const float* keys = reinterpret_cast<const float*>(0x3000);
  std::int32_t* idx = reinterpret_cast<std::int32_t*>(0x4000);
  i64 num_keys = 250, stride = 128, first = 990, queries = 10;
  void* ws = reinterpret_cast<void*>(0x10000);
  std::size_t bytes = std::size_t{1} << 40;
  BadIdx() { p.heads = 64, p.dim = 128, p.top_k = 512, p.geometry = phasekv::Geometry(4, 4); }
  std::string run() {
    const cudaError_t e = dsv4::cuda::indexer_top_k<float>(p, q, w, keys, num_keys, stride, first,
                                                           queries, idx, nullptr, ws, bytes);
    if (e != cudaErrorInvalidValue) return "status " + std::to_string(static_cast<int>(e));
    return phasekv::cuda::last_error_message();
  }
};

TEST(IndexerCudaChecks, RejectedBeforeAnyCudaCall) {
  const auto expect_msg = [](BadIdx b, const char* arg) {
    const std::string m = b.run();
    EXPECT_NE(m.find(std::string(": ") + arg + " = "), std::string::npos) << "message: " << m;
    EXPECT_NE(m.find("phasekv::dsv4::cuda::indexer_top_k"), std::string::npos) << m;
  };
  BadIdx b;
  b.p.heads = 0;
  expect_msg(b, "params.heads");
  b = BadIdx(), b.p.top_k = 0;
  expect_msg(b, "params.top_k");
  b = BadIdx(), b.num_keys = 249;  // J(1000) = 250
  expect_msg(b, "num_keys");
  b = BadIdx(), b.stride = 127;
  expect_msg(b, "key_stride");
  b = BadIdx(), b.q = nullptr;
  expect_msg(b, "q");
  b = BadIdx(), b.idx = nullptr;
  expect_msg(b, "indices");
  b = BadIdx(), b.queries = -1;
  expect_msg(b, "num_queries");
  b = BadIdx(), b.first = -1;
  expect_msg(b, "first_position");
  // num_queries * J beyond one CUB segmented sort
  b = BadIdx(), b.p.geometry = phasekv::Geometry(1, 1), b.first = i64{1} << 30, b.queries = 3;
  b.num_keys = (i64{1} << 31) - 1;
  expect_msg(b, "num_queries");
  // workspace smaller than the layout, or misaligned: rejected before asking CUB
  b = BadIdx(), b.bytes = 1;
  expect_msg(b, "workspace_bytes");
  b = BadIdx(), b.ws = reinterpret_cast<void*>(0x10010);
  expect_msg(b, "workspace");
  b = BadIdx();
  b.num_keys = 249;
  EXPECT_THROW(dsv4::cuda::check_indexer_args(b.p, b.q, b.w, b.keys, b.num_keys, b.stride, b.first,
                                              b.queries, b.idx),
               phasekv::capacity_error);
  std::size_t bytes = 0;
  EXPECT_EQ(dsv4::cuda::indexer_decode<float>(b.p, b.q, b.w, b.keys, 250, 128, 0, b.idx, nullptr,
                                              nullptr, bytes),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(phasekv::cuda::last_error_message()).find(": n = 0"), std::string::npos);
  // no queries: nothing to sort, the workspace query needs no device
  bytes = 7;
  EXPECT_EQ(dsv4::cuda::indexer_top_k<float>(b.p, b.q, b.w, b.keys, 0, 128, 0, 0, b.idx, nullptr,
                                             nullptr, bytes),
            cudaSuccess);
  EXPECT_EQ(bytes, 0u);
  EXPECT_STREQ(phasekv::cuda::last_error_message(), "");
}

}  // namespace
