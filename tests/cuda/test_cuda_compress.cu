// CUDA batch and streaming compression: bit-identical to the CPU compress_batch and to each
// other, for UniformMean (fast path) and a gated policy (generic kernel); plus validation.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "phasekv/compress/compress_batch.hpp"
#include "phasekv/compress/cuda/compress_batch.cuh"
#include "phasekv/compress/cuda/compress_step.cuh"
#include "phasekv/compress/float_ops.hpp"
#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/compress/uniform_mean.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/view.hpp"
#include "phasekv/phase/geometry.hpp"

// Not in the anonymous namespace: nvcc warns (#177) about the unevaluated instantiation the
// policy trait performs on an internal-linkage type.
namespace pkv_cuda_test {

using phasekv::Geometry;

// A softmax-gated pool with one gate vector per (KV head, offset): logit_i = <z_{h,i}, x_i>,
// alpha = softmax_i, entry = sum_i alpha_i x_i. Written to the policy rules (fp_fma, fp_exp),
// so it must give the same bits on host and device. `z` is host or device memory.
struct TestGatedPolicy {
  Geometry geo{8, 8, 0};
  std::int64_t dim = 1;
  std::int64_t heads = 1;
  const float* z = nullptr;  // [heads, W, dim]

  PHASEKV_HOST_DEVICE Geometry geometry() const { return geo; }
  PHASEKV_HOST_DEVICE std::int64_t input_dim() const { return dim; }
  PHASEKV_HOST_DEVICE std::int64_t output_dim() const { return dim; }
  std::int64_t kv_heads() const { return heads; }

  template <class Load>
  PHASEKV_HOST_DEVICE void compress(std::int64_t h, const Load& x, float* out) const {
    using namespace phasekv::detail;
    const std::int64_t w = geo.window();
    float m = 0.0f, denom = 0.0f;
    // Pass 1: max logit (first offset initializes).
    for (std::int64_t i = 0; i < w; ++i) {
      float s = 0.0f;
      const float* zi = z + (h * w + i) * dim;
      for (std::int64_t c = 0; c < dim; ++c) s = fp_fma(zi[c], x(i, c), s);
      m = i == 0 ? s : fp_max(m, s);
    }
    for (std::int64_t c = 0; c < dim; ++c) out[c] = 0.0f;
    // Pass 2: weights and weighted sum (unnormalized), then one division per channel.
    for (std::int64_t i = 0; i < w; ++i) {
      float s = 0.0f;
      const float* zi = z + (h * w + i) * dim;
      for (std::int64_t c = 0; c < dim; ++c) s = fp_fma(zi[c], x(i, c), s);
      const float a = fp_exp(fp_sub(s, m));
      denom = fp_add(denom, a);
      for (std::int64_t c = 0; c < dim; ++c) out[c] = fp_fma(a, x(i, c), out[c]);
    }
    for (std::int64_t c = 0; c < dim; ++c) out[c] = fp_div(out[c], denom);
  }
};

static_assert(phasekv::is_compressor_policy_v<TestGatedPolicy>, "test policy");

}  // namespace pkv_cuda_test

namespace {

using namespace pkv_cuda_test;
using phasekv::bf16_t;
using phasekv::f16_t;

struct CompressShape {
  Geometry geo;
  std::int64_t n;
  std::int64_t heads;
  std::int64_t dim;
  std::int64_t local;
};

std::vector<CompressShape> compress_shapes() {
  return {
      {Geometry(8, 8, 0), 97, 2, 64, 0},    {Geometry(8, 4, 2), 100, 3, 56, 16},
      {Geometry(2, 5, 3), 41, 1, 96, 4},    {Geometry(1, 3, 0), 7, 2, 128, 0},
      {Geometry(16, 16, 4), 300, 2, 33, 0}, {Geometry(32, 16, 0), 1000, 1, 64, 128},
      {Geometry(4, 4, 0), 3, 2, 16, 0},  // no complete window
  };
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Batch on the device vs the CPU compress_batch, then streaming on the device (batch of 3
// sequences, one token per step) vs device batch, all bit for bit.
template <class T, class Policy>
void check_compress(const CompressShape& cs, const Policy& host_policy, const Policy& dev_policy,
                    std::uint64_t seed) {
  SCOPED_TRACE("W=" + std::to_string(cs.geo.window()) + " S=" + std::to_string(cs.geo.stride()) +
               " O=" + std::to_string(cs.geo.origin()) + " n=" + std::to_string(cs.n) +
               " heads=" + std::to_string(cs.heads) + " dim=" + std::to_string(cs.dim) +
               " T=" + phasekv::element_traits<T>::name);
  std::mt19937_64 rng(seed);
  const std::int64_t batch = 3;
  const std::int64_t J = cs.geo.complete_windows(cs.n);
  const std::int64_t rows = J > 0 ? J : 1;
  // Raw tokens of each sequence: [batch][n, heads, dim].
  const std::size_t seq_elems = static_cast<std::size_t>(cs.n * cs.heads * cs.dim);
  const std::vector<T> raw = random_elems<T>(rng, batch * seq_elems);
  DeviceBuffer<T> draw = to_device(raw);
  const std::int64_t dout = host_policy.output_dim();
  const std::size_t ent_elems = static_cast<std::size_t>(rows * cs.heads * dout);

  std::vector<std::vector<T>> batch_dev(batch);
  for (std::int64_t b = 0; b < batch; ++b) {
    const auto hraw =
        phasekv::make_view<const T>(raw.data() + b * seq_elems, cs.n, cs.heads, cs.dim);
    std::vector<T> cpu(ent_elems);
    std::memset(static_cast<void*>(cpu.data()), 0xff, cpu.size() * sizeof(T));
    ASSERT_EQ(phasekv::compress_batch<T>(host_policy, hraw,
                                         phasekv::make_view(cpu.data(), rows, cs.heads, dout)),
              J);

    DeviceBuffer<T> dent(ent_elems);
    PKV_CUDA_OK(dent.poison());
    const auto draw_v =
        phasekv::make_view<const T>(draw.get() + b * seq_elems, cs.n, cs.heads, cs.dim);
    std::int64_t written = -1;
    const cudaError_t e = phasekv::cuda::compress_batch<T>(
        dev_policy, draw_v, phasekv::make_view(dent.get(), rows, cs.heads, dout), &written);
    ASSERT_EQ(e, cudaSuccess) << phasekv::cuda::last_error_message();
    EXPECT_EQ(written, J);
    PKV_CUDA_OK(cudaDeviceSynchronize());
    PKV_CUDA_OK(dent.download(batch_dev[b]));
    if (J > 0) {
      EXPECT_TRUE(same_bits(batch_dev[b], cpu)) << "device batch != CPU batch, sequence " << b;
    }
  }

  // Streaming: ring of max(W, L) slots, one compress_step per token for all sequences.
  const std::int64_t cap = cs.geo.ring_capacity(cs.local);
  DeviceBuffer<T> ring(static_cast<std::size_t>(batch * cap * cs.heads * cs.dim));
  DeviceBuffer<T> ents(static_cast<std::size_t>(batch) * ent_elems);
  DeviceBuffer<std::int64_t> lengths(batch), emitted(batch);
  PKV_CUDA_OK(ring.poison());
  PKV_CUDA_OK(ents.poison());
  // Tokens of step t: [batch, heads, dim] with token stride seq_elems (a strided view).
  phasekv::StridedView<const T> tok{
      nullptr, batch, cs.heads, cs.dim, static_cast<std::int64_t>(seq_elems), cs.dim};
  std::vector<std::int64_t> em;
  std::int64_t entries_seen = 0;
  for (std::int64_t t = 0; t < cs.n; ++t) {
    PKV_CUDA_OK(lengths.upload(std::vector<std::int64_t>(batch, t)));
    phasekv::cuda::CompressStepArgs<T, Policy> a;
    a.policy = dev_policy;
    a.batch = batch;
    a.kv_heads = cs.heads;
    a.lengths = lengths.get();
    tok.data = draw.get() + t * cs.heads * cs.dim;
    a.tokens = tok;
    a.ring = ring.get();
    a.ring_capacity = cap;
    a.entries = ents.get();
    a.max_entries = rows;
    a.emitted = emitted.get();
    const cudaError_t e = phasekv::cuda::compress_step(a);
    ASSERT_EQ(e, cudaSuccess) << phasekv::cuda::last_error_message();
    PKV_CUDA_OK(emitted.download(em));
    const std::int64_t want = cs.geo.complete_windows(t + 1) > entries_seen ? entries_seen : -1;
    for (std::int64_t b = 0; b < batch; ++b) EXPECT_EQ(em[b], want) << "t=" << t;
    if (want >= 0) ++entries_seen;
  }
  EXPECT_EQ(entries_seen, J);
  std::vector<T> stream;
  PKV_CUDA_OK(ents.download(stream));
  for (std::int64_t b = 0; b < batch && J > 0; ++b) {
    const std::vector<T> mine(stream.begin() + static_cast<std::ptrdiff_t>(b * ent_elems),
                              stream.begin() + static_cast<std::ptrdiff_t>((b + 1) * ent_elems));
    EXPECT_TRUE(same_bits(mine, batch_dev[b])) << "streaming != batch, sequence " << b;
  }
}

class CudaCompress : public DeviceTest {};

template <class T>
void run_uniform_mean() {
  std::uint64_t seed = 1000;
  for (const auto& cs : compress_shapes()) {
    const phasekv::UniformMean p(cs.geo, cs.dim);
    check_compress<T>(cs, p, p, seed++);
  }
}

template <class T>
void run_gated() {
  std::uint64_t seed = 2000;
  for (const auto& cs : compress_shapes()) {
    std::mt19937_64 rng(seed);
    const std::vector<float> z =
        random_elems<float>(rng, static_cast<std::size_t>(cs.heads * cs.geo.window() * cs.dim));
    DeviceBuffer<float> dz = to_device(z);
    TestGatedPolicy hp{cs.geo, cs.dim, cs.heads, z.data()};
    TestGatedPolicy dp = hp;
    dp.z = dz.get();
    check_compress<T>(cs, hp, dp, seed++);
  }
}

// GatedPool through its fast path (scalar gates with Z and b; vector gates with payload maps
// and d_out != d_in; gate cycling) and through the generic kernel (W x d_out > 8192 logits).
template <class T>
void run_gated_pool() {
  std::uint64_t seed = 3000;
  struct Cfg {
    phasekv::GateKind kind;
    bool payload;
    std::int64_t d_out;  // 0: = dim
    std::int64_t cycle;
  };
  const Cfg cfgs[] = {{phasekv::GateKind::scalar, false, 0, 0},
                      {phasekv::GateKind::vector, true, 24, 0},
                      {phasekv::GateKind::scalar, true, 40, 3},
                      {phasekv::GateKind::vector, false, 0, 1}};
  int k = 0;
  for (const auto& cs : compress_shapes()) {
    const Cfg& cfg = cfgs[k++ % 4];
    std::mt19937_64 rng(seed);
    const std::int64_t w = cs.geo.window(), h = cs.heads, din = cs.dim;
    const std::int64_t dout = cfg.d_out > 0 ? cfg.d_out : din;
    const std::int64_t gd = cfg.kind == phasekv::GateKind::scalar ? 1 : dout;
    const std::vector<float> z =
        random_elems<float>(rng, static_cast<std::size_t>(h * w * gd * din));
    const std::vector<float> b = random_elems<float>(rng, static_cast<std::size_t>(h * w * gd));
    const std::vector<float> c =
        random_elems<float>(rng, cfg.payload ? static_cast<std::size_t>(h * w * dout * din) : 0);
    DeviceBuffer<float> dz = to_device(z), db = to_device(b), dc = to_device(c);
    auto make = [&](const float* zp, const float* bp, const float* cp) {
      return phasekv::GatedPool(
                 cs.geo, h, din, dout, cfg.kind, phasekv::param_view(zp, {h, w, gd, din}),
                 phasekv::param_view(bp, {h, w, gd}),
                 cfg.payload ? phasekv::param_view(cp, {h, w, dout, din}) : phasekv::ParamView{})
          .cycled(cfg.cycle);
    };
    check_compress<T>(cs, make(z.data(), b.data(), c.data()), make(dz.get(), db.get(), dc.get()),
                      seed++);
  }
  // Too many vector-gate logits for the fast path: the generic kernel runs GatedPool.
  const CompressShape big{Geometry(32, 16, 0), 100, 1, 300, 0};
  std::mt19937_64 rng(seed);
  const std::int64_t n_z = 32 * 300 * 300;
  const std::vector<float> z =
      random_elems<float>(rng, static_cast<std::size_t>(n_z), -0.05f, 0.05f);
  const std::vector<float> b = random_elems<float>(rng, 32 * 300);
  DeviceBuffer<float> dz = to_device(z), db = to_device(b);
  auto make = [&](const float* zp, const float* bp) {
    return phasekv::GatedPool(big.geo, 1, 300, 300, phasekv::GateKind::vector,
                              phasekv::param_view(zp, {1, 32, 300, 300}),
                              phasekv::param_view(bp, {1, 32, 300}));
  };
  ASSERT_FALSE(phasekv::cuda::detail::gated_pool_fast(make(z.data(), b.data())));
  check_compress<T>(big, make(z.data(), b.data()), make(dz.get(), db.get()), seed);
}

TEST_F(CudaCompress, GatedPoolF32BitExact) { run_gated_pool<float>(); }
TEST_F(CudaCompress, GatedPoolBf16BitExact) { run_gated_pool<bf16_t>(); }
TEST_F(CudaCompress, GatedPoolF16BitExact) { run_gated_pool<f16_t>(); }

TEST_F(CudaCompress, UniformMeanF32BitExact) { run_uniform_mean<float>(); }
TEST_F(CudaCompress, UniformMeanBf16BitExact) { run_uniform_mean<bf16_t>(); }
TEST_F(CudaCompress, UniformMeanF16BitExact) { run_uniform_mean<f16_t>(); }
TEST_F(CudaCompress, GatedGenericF32BitExact) { run_gated<float>(); }
TEST_F(CudaCompress, GatedGenericBf16BitExact) { run_gated<bf16_t>(); }

// ---------------------------------------------------------------------------------------------
// Validation (host only, no device needed).
// ---------------------------------------------------------------------------------------------

TEST(CudaCompressValidation, BatchRejectsShortEntries) {
  const phasekv::UniformMean p(Geometry(8, 4, 0), 64);
  const auto raw =
      phasekv::make_view(reinterpret_cast<const float*>(std::uintptr_t{1} << 20), 40, 2, 64);
  auto ent =
      phasekv::make_view(reinterpret_cast<float*>(std::uintptr_t{1} << 22), 8, 2, 64);  // J = 9
  EXPECT_EQ(phasekv::cuda::compress_batch<float>(p, raw, ent), cudaErrorInvalidValue);
  EXPECT_NE(std::string(phasekv::cuda::last_error_message()).find("entries.tokens"),
            std::string::npos);
  ent.dim = 32;
  EXPECT_EQ(phasekv::cuda::compress_batch<float>(p, raw, ent), cudaErrorInvalidValue);
  EXPECT_NE(std::string(phasekv::cuda::last_error_message()).find("entries.dim"),
            std::string::npos);
}

TEST(CudaCompressValidation, StepRejectsBadArguments) {
  phasekv::cuda::CompressStepArgs<float, phasekv::UniformMean> a;
  a.policy = phasekv::UniformMean(Geometry(8, 4, 0), 64);
  a.batch = 2;
  a.kv_heads = 2;
  a.lengths = reinterpret_cast<const std::int64_t*>(std::uintptr_t{1} << 20);
  a.tokens = phasekv::make_view(reinterpret_cast<const float*>(std::uintptr_t{1} << 21), 2, 2, 64);
  a.ring = reinterpret_cast<float*>(std::uintptr_t{1} << 22);
  a.ring_capacity = 8;
  a.entries = reinterpret_cast<float*>(std::uintptr_t{1} << 23);
  a.max_entries = 10;
  EXPECT_NO_THROW(phasekv::cuda::check_compress_step_args(a));
  auto b = a;
  b.ring_capacity = 7;
  EXPECT_EQ(phasekv::cuda::compress_step(b), cudaErrorInvalidValue);
  EXPECT_NE(std::string(phasekv::cuda::last_error_message()).find("ring_capacity"),
            std::string::npos);
  b = a;
  b.tokens.tokens = 3;
  EXPECT_THROW(phasekv::cuda::check_compress_step_args(b), phasekv::shape_error);
  b = a;
  b.tokens.dim = 63;
  EXPECT_EQ(phasekv::cuda::compress_step(b), cudaErrorInvalidValue);
  EXPECT_NE(std::string(phasekv::cuda::last_error_message()).find("tokens.dim"), std::string::npos);
  b = a;
  b.lengths = nullptr;
  EXPECT_EQ(phasekv::cuda::compress_step(b), cudaErrorInvalidValue);
  EXPECT_NE(std::string(phasekv::cuda::last_error_message()).find("lengths"), std::string::npos);
  b = a;
  b.batch = 0;  // nothing to do: succeeds without touching the device
  b.tokens.tokens = 0;
  EXPECT_EQ(phasekv::cuda::compress_step(b), cudaSuccess) << phasekv::cuda::last_error_message();
}

}  // namespace
