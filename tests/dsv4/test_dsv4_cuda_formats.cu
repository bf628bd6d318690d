// The CUDA sparse attention over FlashMLA's FP8 cache formats (MODEL1, V3.2) and per-query
// causal HCA over a chunk. Always run: the host checks (bad layouts, a chunk without lists and
// ratio refused by name, nothing launched). With a device: the kernel against the float64
// reference over the dequantized rows (contiguous blocks and shuffled pages), and HCA per query.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.hpp"
#include "dsv4_attention_ref.hpp"
#include "dsv4_format_ref.hpp"
#include "dsv4_test_util.hpp"
#include "phasekv/dsv4/cuda/sparse_attention.cuh"

namespace {

namespace dsv4 = phasekv::dsv4;
using phasekv::model1_fp8_t;
using phasekv::v32_fp8_t;
using pkv_cuda_test::DeviceBuffer;
using pkv_cuda_test::has_device;
using pkv_cuda_test::to_device;
using i64 = std::int64_t;

// `rows` random rows of format E in blocks of P (MODEL1 padded as FlashMLA pads, V3.2 656-byte
// tokens) and their dequantized values.
template <class E>
struct Rows {
  i64 n, P, block;
  std::vector<E> bytes;
  std::vector<float> real;
  Rows(i64 n_, i64 P_, std::uint32_t seed) : n(n_), P(P_) {
    const auto& f = std::is_same<E, model1_fp8_t>::value ? dsv4t::kModel1 : dsv4t::kV32;
    block = std::is_same<E, model1_fp8_t>::value ? dsv4::model1_block_bytes(P) : P * 656;
    const i64 blocks = (n + P - 1) / P;
    bytes.assign(static_cast<std::size_t>(blocks * block), E{0});
    const auto x = dsv4t::random_values<float>(static_cast<std::size_t>(n * f.dim), seed);
    real.resize(x.size());
    auto* base = reinterpret_cast<std::uint8_t*>(bytes.data());
    for (i64 r = 0; r < n; ++r) {
      dsv4t::quantize_token(f, x.data() + r * f.dim, base + (r / P) * block, P, r % P, 656);
      const auto y = dsv4t::dequantize_token(f, base + (r / P) * block, P, r % P, 656);
      std::copy(y.begin(), y.end(), real.begin() + r * f.dim);
    }
  }
  dsv4::LatentRows<E> view(const E* data) const {
    return {data, 0, n, 656, 1.0f, std::is_same<E, model1_fp8_t>::value ? P : 0, block};
  }
};

template <class E>
void expect_device_matches_reference() {
  const i64 d = dsv4::CacheFormat<E>::dim, dv = 512, H = 11, n = 37, J = 21, Q = 3, k = 9;
  const Rows<E> raw(n, 4, 61), ent(J, 4, 62);
  const auto q = dsv4t::random_values<float>(static_cast<std::size_t>(Q * H * d), 63, 0.3f);
  const auto sinks = dsv4t::random_values<float>(static_cast<std::size_t>(H), 64);
  std::mt19937 rng(65);
  std::vector<std::int32_t> idx(static_cast<std::size_t>(Q * k));
  for (i64 i = 0; i < Q; ++i) dsv4t::random_index_list(rng, J, k, idx.data() + i * k);
  dsv4::SparseAttentionParams p;
  p.heads = H;
  p.dim = d;
  p.dim_v = dv;
  p.window = 6;
  p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  auto draw = to_device(raw.bytes), dent = to_device(ent.bytes);
  auto dq = to_device(q), dsinks = to_device(sinks);
  auto didx = to_device(idx);
  p.sinks = dsinks.get();
  DeviceBuffer<float> dout(static_cast<std::size_t>(Q * H * dv)),
      dlse(static_cast<std::size_t>(Q * H));
  ASSERT_EQ(dout.poison(), cudaSuccess);
  ASSERT_EQ(dlse.poison(), cudaSuccess);
  ASSERT_EQ(dsv4::cuda::sparse_attention<E>(p, dq.get(), raw.view(draw.get()), ent.view(dent.get()),
                                            didx.get(), k, n - Q, Q, dout.get(), dlse.get()),
            cudaSuccess)
      << phasekv::cuda::last_error_message();
  std::vector<float> out, lse;
  ASSERT_EQ(dout.download(out), cudaSuccess);
  ASSERT_EQ(dlse.download(lse), cudaSuccess);
  p.sinks = sinks.data();
  const dsv4::LatentRows<float> fr{raw.real.data(), 0, n, d, 1.0f},
      fe{ent.real.data(), 0, J, d, 1.0f};
  for (i64 i = 0; i < Q; ++i) {
    std::vector<double> ro(static_cast<std::size_t>(H * dv)), rl(static_cast<std::size_t>(H));
    dsv4t::reference<float>(p, q.data() + i * H * d, fr, fe, idx.data() + i * k, k, n - Q + i,
                            ro.data(), rl.data());
    dsv4t::expect_query_matches(out.data() + i * H * dv, lse.data() + i * H, ro.data(), rl.data(),
                                H, dv, "query " + std::to_string(i));
  }
}

TEST(Dsv4CudaFormats, Model1MatchesReference) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device visible (cudaGetDeviceCount)";
  expect_device_matches_reference<model1_fp8_t>();
}
TEST(Dsv4CudaFormats, V32MatchesReference) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device visible (cudaGetDeviceCount)";
  expect_device_matches_reference<v32_fp8_t>();
}

// HCA over a chunk without lists: query t sees the entries below (t + 1) / ratio.
TEST(Dsv4CudaFormats, HcaChunkIsCausalPerQuery) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device visible (cudaGetDeviceCount)";
  const i64 H = 3, d = 40, S = 4, p0 = 13, Q = 9, n = p0 + Q, J = n / S;
  const auto raw = dsv4t::random_values<float>(static_cast<std::size_t>(n * d), 71);
  const auto ent = dsv4t::random_values<float>(static_cast<std::size_t>(J * d), 72);
  const auto q = dsv4t::random_values<float>(static_cast<std::size_t>(Q * H * d), 73);
  dsv4::SparseAttentionParams p;
  p.heads = H;
  p.dim = p.dim_v = d;
  p.window = 5;
  auto draw = to_device(raw), dent = to_device(ent), dq = to_device(q);
  DeviceBuffer<float> dout(static_cast<std::size_t>(Q * H * d)),
      dlse(static_cast<std::size_t>(Q * H));
  ASSERT_EQ(dout.poison(), cudaSuccess);
  ASSERT_EQ(dsv4::cuda::sparse_attention<float>(p, dq.get(), {draw.get(), 0, n, d, 1.0f},
                                                {dent.get(), 0, J, d, 1.0f}, nullptr, J, p0, Q,
                                                dout.get(), dlse.get(), nullptr, S),
            cudaSuccess);
  std::vector<float> out;
  ASSERT_EQ(dout.download(out), cudaSuccess);
  const dsv4::LatentRows<float> rr{raw.data(), 0, n, d, 1.0f}, er{ent.data(), 0, J, d, 1.0f};
  for (i64 i = 0; i < Q; ++i) {
    std::vector<double> ro(static_cast<std::size_t>(H * d)), rl(static_cast<std::size_t>(H));
    dsv4t::reference<float>(p, q.data() + i * H * d, rr, er, nullptr, (p0 + i + 1) / S, p0 + i,
                            ro.data(), rl.data());
    for (i64 x = 0; x < H * d; ++x)
      ASSERT_NEAR(out[static_cast<std::size_t>(i * H * d + x)], ro[static_cast<std::size_t>(x)],
                  2e-5)
          << "query " << p0 + i;
  }
}

// Host checks: no device needed, nothing launched.
TEST(Dsv4CudaFormats, RefusesBadLayoutsAndChunksWithoutRatio) {
  const Rows<model1_fp8_t> raw(8, 4, 81);
  dsv4::SparseAttentionParams p;
  p.heads = 2;
  p.dim = 512;
  p.dim_v = 512;
  p.window = 4;
  const std::vector<float> q(2 * 512, 1.0f);
  float out[2 * 512], lse[2];
  auto bad = raw.view(raw.bytes.data());
  bad.page_size = 0;
  EXPECT_EQ(
      dsv4::cuda::sparse_attention<model1_fp8_t>(p, q.data(), bad, {}, nullptr, 0, 7, 1, out, lse),
      cudaErrorInvalidValue);
  EXPECT_NE(std::string(phasekv::cuda::last_error_message()).find("raw.page_size = 0"),
            std::string::npos)
      << phasekv::cuda::last_error_message();
  const auto good = raw.view(raw.bytes.data());
  EXPECT_EQ(dsv4::cuda::sparse_attention<model1_fp8_t>(p, q.data(), good, good, nullptr, 2, 6, 2,
                                                       out, lse),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(phasekv::cuda::last_error_message()).find("num_queries = 2"),
            std::string::npos)
      << phasekv::cuda::last_error_message();
}

}  // namespace
