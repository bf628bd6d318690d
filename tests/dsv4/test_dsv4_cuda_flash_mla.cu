// The CUDA twins of FlashMLA's call (dsv4/cuda/flash_mla.cuh) and of the compressor's
// post-processing hook (dsv4/cuda/compressor.cuh with dsv4::EntryPostprocess).
//
// Always run (no device needed): the merged-list arithmetic the list kernel runs (host model),
// the workspace size, the host checks of both calls (bad arguments named, nothing launched).
// With a device: cuda::flash_mla_with_kvcache against the CPU call (bf16 and MODEL1 caches, two
// caches with lengths and -1, sinks, a query with no row: out 0, lse +inf; a bad index: that
// row NaN only), outputs poisoned first; cuda::compress and cuda::compress_append_paged (into
// MODEL1 pages) with EntryPostprocess as the hook against the CPU calls with the same hook.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.hpp"
#include "dsv4_flash_mla_cache.hpp"
#include "dsv4_format_ref.hpp"
#include "dsv4_test_util.hpp"
#include "phasekv/dsv4/compressor.hpp"
#include "phasekv/dsv4/cuda/compressor.cuh"
#include "phasekv/dsv4/cuda/flash_mla.cuh"
#include "phasekv/dsv4/flash_mla.hpp"
#include "phasekv/dsv4/postprocess.hpp"

namespace {

namespace dsv4 = phasekv::dsv4;
using phasekv::bf16_t;
using phasekv::model1_fp8_t;
using pkv_cuda_test::DeviceBuffer;
using pkv_cuda_test::has_device;
using pkv_cuda_test::to_device;
using i64 = std::int64_t;

// ---- host: the list arithmetic, the workspace, the checks ------------------------------------

TEST(Dsv4CudaFlashMla, MergedListsMapBothCachesIntoOneIndexSpace) {
  // batch 2, s_q 1; first cache 10 rows, extra cache 6 rows; topk 3, extra_topk 2
  const std::vector<std::int32_t> idx = {4, -1, 9, 0, 12, 1}, eidx = {5, 0, -1, 3};
  const std::vector<std::int32_t> len = {3, 1}, elen = {1, 7};  // elen[1] > extra_topk: bad
  dsv4::cuda::detail::FlashMlaLists l;
  l.rows = 2;
  l.s_q = 1;
  l.indices = idx.data();
  l.topk = 3;
  l.topk_length = len.data();
  l.n0 = 10;
  l.extra = eidx.data();
  l.extra_topk = 2;
  l.extra_length = elen.data();
  l.n1 = 6;
  const auto slot = [&](i64 r, i64 k) {
    return dsv4::cuda::detail::flash_mla_merged_slot(l, r, k);
  };
  EXPECT_EQ(slot(0, 0), 4);
  EXPECT_EQ(slot(0, 1), -1);
  EXPECT_EQ(slot(0, 2), 9);
  EXPECT_EQ(slot(0, 3), 15);  // n0 + 5
  EXPECT_EQ(slot(0, 4), -1);  // past extra_topk_length[0] = 1
  EXPECT_EQ(slot(1, 0), 0);
  EXPECT_EQ(slot(1, 1), -1);  // past topk_length[1] = 1 (12 is never read)
  EXPECT_EQ(slot(1, 3), 16);  // bad length: n0 + n1, out of range, the row becomes NaN
  const std::vector<std::int32_t> bad = {10, -2, 3};
  l.indices = bad.data();
  l.rows = 1;
  l.topk_length = nullptr;
  l.extra = nullptr;
  l.extra_topk = 0;
  EXPECT_EQ(slot(0, 0), 16);  // 10 is outside the first cache
  EXPECT_EQ(slot(0, 1), 16);
  EXPECT_EQ(slot(0, 2), 3);
}

dsv4::FlashMlaArgs<bf16_t> small_args(const dsv4t::Cache<bf16_t>& c, const float* q,
                                      const std::int32_t* idx, float* out, float* lse) {
  dsv4::FlashMlaArgs<bf16_t> a;
  a.q = q;
  a.batch = 2;
  a.s_q = 3;
  a.h_q = 4;
  a.head_dim = a.head_dim_v = 16;
  a.k_cache = c.view;
  a.indices = idx;
  a.topk = 5;
  a.out = out;
  a.lse = lse;
  return a;
}

TEST(Dsv4CudaFlashMla, WorkspaceAndHostChecks) {
  dsv4t::Cache<bf16_t> c(2, 4, 16, 71);
  float dummy = 0.0f;
  const std::int32_t idx = 0;
  auto a = small_args(c, &dummy, &idx, &dummy, &dummy);
  // lists 6 rows x 5 slots x 4 bytes = 120, aligned to 128, then 6 x 4 lse floats
  EXPECT_EQ(dsv4::cuda::flash_mla_workspace_bytes(a), std::size_t{128 + 96});
  const auto message = [&](const dsv4::FlashMlaArgs<bf16_t>& x, std::size_t ws) {
    const cudaError_t e = dsv4::cuda::flash_mla_with_kvcache(x, &dummy, ws);
    EXPECT_EQ(e, cudaErrorInvalidValue);
    return std::string(phasekv::cuda::last_error_message());
  };
  std::string m = message(a, 100);
  EXPECT_NE(m.find("phasekv::dsv4::cuda::flash_mla_with_kvcache"), std::string::npos) << m;
  EXPECT_NE(m.find("workspace_bytes = 100"), std::string::npos) << m;
  auto b = a;
  b.head_dim = b.head_dim_v = 1100;
  EXPECT_NE(message(b, 4096).find("head_dim"), std::string::npos);
  b = a;
  b.extra_topk = 3;
  EXPECT_NE(message(b, 4096).find("extra_topk = 3"), std::string::npos);
  b = a;
  b.k_cache.block_stride = 3;
  EXPECT_NE(message(b, 4096).find("k_cache.block_stride = 3"), std::string::npos);
  b = a;
  b.batch = 0;  // nothing to do, nothing launched
  EXPECT_EQ(dsv4::cuda::flash_mla_with_kvcache(b, nullptr, 0), cudaSuccess);
}

TEST(Dsv4CudaCompressorHook, HostChecksTheHookAndTheStagedWidth) {
  const std::vector<float> ape(4 * 2 * 96, 0.0f);
  dsv4::CompressorParams cp{4, 2, 96, ape.data()};
  dsv4::EntryPostprocess hook;
  hook.dim = 96;
  hook.rope.dim = 64;
  hook.rotate = true;  // 96 is not a power of two
  float dummy = 0.0f;
  cudaError_t e = dsv4::cuda::compress<float>(cp, &dummy, &dummy, 8, &dummy, nullptr, 0, -1, hook);
  EXPECT_EQ(e, cudaErrorInvalidValue);
  std::string m = phasekv::cuda::last_error_message();
  EXPECT_NE(m.find("dim = 96"), std::string::npos) << m;
  cp.dim = 20000;
  hook.dim = 20000;
  hook.rotate = false;
  e = dsv4::cuda::compress<float>(cp, &dummy, &dummy, 8, &dummy, nullptr, 0, -1, hook);
  EXPECT_EQ(e, cudaErrorInvalidValue);
  m = phasekv::cuda::last_error_message();
  EXPECT_NE(m.find("params.dim = 20000"), std::string::npos) << m;
}

// ---- device: FlashMLA's call against the CPU's ------------------------------------------------

template <class T>
void expect_flash_mla_matches_cpu(i64 d) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  const i64 B = 3, s_q = 2, H = 10, dv = d > 448 ? 448 : d - 16, topk = 37, etopk = 19;
  dsv4t::Cache<T> c0(6, 7, d, 81), c1(5, 4, d, 82);
  std::mt19937 rng(83);
  auto idx = dsv4t::random_indices(rng, B * s_q * topk, topk, 6 * 7);
  auto eidx = dsv4t::random_indices(rng, B * s_q * etopk, etopk, 5 * 4);
  const std::vector<std::int32_t> tl = {37, 0, 21}, etl = {19, 0, 3};  // sequence 1: no row
  const auto q = dsv4t::random_values<float>(static_cast<std::size_t>(B * s_q * H * d), 84, 0.3f);
  const auto sink = dsv4t::random_values<float>(static_cast<std::size_t>(H), 85);
  dsv4::FlashMlaArgs<T> a;
  a.batch = B;
  a.s_q = s_q;
  a.h_q = H;
  a.head_dim = d;
  a.head_dim_v = dv;
  a.topk = topk;
  a.extra_topk = etopk;
  // the CPU call on host memory
  std::vector<float> out(static_cast<std::size_t>(B * s_q * H * dv)), lse(B * H * s_q);
  a.k_cache = c0.view;
  a.extra_k_cache = c1.view;
  // the call's pointers: host memory for the CPU call, device memory for the CUDA one
  const auto bind = [](dsv4::FlashMlaArgs<T>& x, const float* q_, const T* k0, const T* k1,
                       const std::int32_t* const* lists, const float* s, float* o, float* l) {
    x.q = q_;
    x.k_cache.data = k0;
    x.extra_k_cache.data = k1;
    x.indices = lists[0];
    x.extra_indices_in_kvcache = lists[1];
    x.topk_length = lists[2];
    x.extra_topk_length = lists[3];
    x.attn_sink = s;
    x.out = o;
    x.lse = l;
  };
  const std::int32_t* host_lists[4] = {idx.data(), eidx.data(), tl.data(), etl.data()};
  bind(a, q.data(), c0.bytes.data(), c1.bytes.data(), host_lists, sink.data(), out.data(),
       lse.data());
  dsv4::flash_mla_with_kvcache(a);
  // the device call, outputs poisoned
  auto dq = to_device(q);
  auto d0 = to_device(c0.bytes);
  auto d1 = to_device(c1.bytes);
  auto didx = to_device(idx);
  auto deidx = to_device(eidx);
  auto dtl = to_device(tl);
  auto detl = to_device(etl);
  auto dsink = to_device(sink);
  DeviceBuffer<float> dout(out.size()), dlse(lse.size());
  PKV_CUDA_OK(cudaMemset(dout.get(), 0xff, out.size() * sizeof(float)));
  PKV_CUDA_OK(cudaMemset(dlse.get(), 0xff, lse.size() * sizeof(float)));
  auto g = a;
  const std::int32_t* dev_lists[4] = {didx.get(), deidx.get(), dtl.get(), detl.get()};
  bind(g, dq.get(), d0.get(), d1.get(), dev_lists, dsink.get(), dout.get(), dlse.get());
  DeviceBuffer<unsigned char> ws(dsv4::cuda::flash_mla_workspace_bytes(g));
  PKV_CUDA_OK(dsv4::cuda::flash_mla_with_kvcache(g, ws.get(), ws.size()));
  PKV_CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> gout(out.size()), glse(lse.size());
  PKV_CUDA_OK(cudaMemcpy(gout.data(), dout.get(), gout.size() * 4, cudaMemcpyDeviceToHost));
  PKV_CUDA_OK(cudaMemcpy(glse.data(), dlse.get(), glse.size() * 4, cudaMemcpyDeviceToHost));
  for (i64 r = 0; r < B * s_q; ++r)
    for (i64 h = 0; h < H; ++h) {
      const i64 b = r / s_q, i = r % s_q;
      const float want = lse[static_cast<std::size_t>((b * H + h) * s_q + i)];
      const float got = glse[static_cast<std::size_t>((b * H + h) * s_q + i)];
      if (std::isinf(want))
        EXPECT_EQ(got, want) << "row " << r << " head " << h;  // +inf: no row
      else
        EXPECT_NEAR(got, want, 2e-5 * std::max(1.0f, std::abs(want))) << "row " << r;
      double err = 0, mag = 1e-3;
      for (i64 x = 0; x < dv; ++x) {
        const std::size_t at = static_cast<std::size_t>((r * H + h) * dv + x);
        ASSERT_TRUE(std::isfinite(gout[at])) << "row " << r << " head " << h;
        err = std::max(err, double(std::abs(gout[at] - out[at])));
        mag = std::max(mag, double(std::abs(out[at])));
      }
      EXPECT_LE(err, 2e-5 * mag) << "row " << r << " head " << h;
    }
  // a bad index (outside the extra cache) makes its row NaN and leaves the others
  eidx[static_cast<std::size_t>(0 * etopk + 1)] = 5 * 4;
  PKV_CUDA_OK(deidx.upload(eidx));
  PKV_CUDA_OK(dsv4::cuda::flash_mla_with_kvcache(g, ws.get(), ws.size()));
  PKV_CUDA_OK(cudaMemcpy(gout.data(), dout.get(), gout.size() * 4, cudaMemcpyDeviceToHost));
  EXPECT_TRUE(std::isnan(gout[0]));
  EXPECT_FALSE(std::isnan(gout[static_cast<std::size_t>(H * dv)]));  // row 1
}

TEST(Dsv4CudaFlashMla, Bf16CacheMatchesTheCpuCall) { expect_flash_mla_matches_cpu<bf16_t>(96); }
TEST(Dsv4CudaFlashMla, Model1CacheMatchesTheCpuCall) {
  expect_flash_mla_matches_cpu<model1_fp8_t>(512);
}

// ---- device: the compressor's hook against the CPU's -------------------------------------------

dsv4::RopeParams yarn() { return dsv4::RopeParams{64, 160000.0f, 65536, 16.0f, 32.0f, 1.0f}; }

// cuda::compress with EntryPostprocess (norm + YaRN RoPE; no quantization, so the comparison is
// of f32 values) and with `rotate` (Hadamard + FP4: equal except where the pooled values round
// differently), against the CPU compress with the same hook.
TEST(Dsv4CudaCompressorHook, BatchWithEntryPostprocessMatchesTheCpu) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  for (const bool rotate : {false, true}) {
    const i64 S = 4, d = rotate ? 128 : 512, n = 45, J = n / S;
    const auto ape = dsv4t::random_values<float>(static_cast<std::size_t>(S * 2 * d), 91, 0.5f);
    const auto kv = dsv4t::random_values<float>(static_cast<std::size_t>(n * 2 * d), 92);
    const auto sc = dsv4t::random_values<float>(static_cast<std::size_t>(n * 2 * d), 93);
    const auto w = dsv4t::random_values<float>(static_cast<std::size_t>(d), 94, 0.2f, 1.0f);
    dsv4::EntryPostprocess hook;
    hook.dim = d;
    hook.rope = yarn();
    hook.fake_quant = false;
    hook.rotate = rotate;
    hook.weight = w.data();
    std::vector<float> want(static_cast<std::size_t>(J * d));
    dsv4::compress<float>({S, 2, d, ape.data()}, kv.data(), sc.data(), n, want.data(), hook);
    auto dape = to_device(ape);
    auto dkv = to_device(kv);
    auto dsc = to_device(sc);
    auto dw = to_device(w);
    DeviceBuffer<float> dout(want.size());
    PKV_CUDA_OK(cudaMemset(dout.get(), 0xff, want.size() * sizeof(float)));
    hook.weight = dw.get();
    PKV_CUDA_OK(dsv4::cuda::compress<float>({S, 2, d, dape.get()}, dkv.get(), dsc.get(), n,
                                            dout.get(), nullptr, 0, -1, hook));
    std::vector<float> got(want.size());
    PKV_CUDA_OK(cudaMemcpy(got.data(), dout.get(), got.size() * 4, cudaMemcpyDeviceToHost));
    i64 flips = 0;
    for (i64 j = 0; j < J; ++j)
      for (i64 i = 0; i < d; ++i) {
        const float g = got[static_cast<std::size_t>(j * d + i)];
        const float e = want[static_cast<std::size_t>(j * d + i)];
        if (!rotate) {
          ASSERT_NEAR(g, e, 2e-5f * (1.0f + std::abs(e))) << "entry " << j << " channel " << i;
        } else if (g != e) {
          ++flips;  // neighbours on the FP4 grid: never further apart than the larger one
          ASSERT_LE(std::abs(g - e), std::max(std::abs(g), std::abs(e))) << j << " " << i;
        }
      }
    EXPECT_LE(flips, J * d / 100) << "FP4 values rounding differently";
  }
}

// cuda::compress_append_paged into MODEL1 pages with the model's entry hook (norm, RoPE, FP8
// tiles): the bytes decode to the CPU call's values within one E4M3 step.
TEST(Dsv4CudaCompressorHook, PagedIntoModel1MatchesTheCpu) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device";
  const i64 S = 4, d = 512, n = 29, P = 3, J = n / S, pages = (J + P - 1) / P;
  const i64 bb = dsv4::model1_block_bytes(P);
  const auto ape = dsv4t::random_values<float>(static_cast<std::size_t>(S * 2 * d), 101, 0.5f);
  const auto kv = dsv4t::random_values<float>(static_cast<std::size_t>(n * 2 * d), 102);
  const auto sc = dsv4t::random_values<float>(static_cast<std::size_t>(n * 2 * d), 103);
  const auto w = dsv4t::random_values<float>(static_cast<std::size_t>(d), 104, 0.2f, 1.0f);
  const dsv4::CompressorParams cp{S, 2, d, ape.data()};
  dsv4::EntryPostprocess hook;
  hook.weight = w.data();
  hook.rope = yarn();
  std::vector<std::int32_t> table(static_cast<std::size_t>(pages));
  for (i64 i = 0; i < pages; ++i)
    table[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(pages - 1 - i);
  const std::vector<std::int32_t> indptr = {0, static_cast<std::int32_t>(n)};
  const auto pool_of = [&](model1_fp8_t* bytes) {  // MODEL1 blocks of P tokens, padded
    auto pool = phasekv::make_page_pool(bytes, bytes, pages, P, 1, 584, 584);
    pool.key_page_stride = bb;
    return pool;
  };
  // CPU
  std::vector<model1_fp8_t> want(static_cast<std::size_t>(pages * bb), model1_fp8_t{0});
  std::vector<float> state(static_cast<std::size_t>(dsv4::compressor_state_elements(cp)));
  std::vector<std::int64_t> tokens = {0};
  dsv4::PagedCompressArgs<float, model1_fp8_t> h;
  h.batch = 1;
  h.kv = kv.data();
  h.score = sc.data();
  h.chunk_indptr = indptr.data();
  h.tokens = tokens.data();
  h.state = state.data();
  h.entry_pool = pool_of(want.data());
  h.entry_table = phasekv::dense_block_table(table.data(), 1, pages);
  dsv4::compress_append_paged(cp, h, hook);
  // device
  tokens[0] = 0;
  auto dape = to_device(ape);
  auto dkv = to_device(kv);
  auto dsc = to_device(sc);
  auto dw = to_device(w);
  auto dindptr = to_device(indptr);
  auto dtokens = to_device(tokens);
  auto dtable = to_device(table);
  DeviceBuffer<float> dstate(state.size());
  DeviceBuffer<model1_fp8_t> dbytes(want.size());
  PKV_CUDA_OK(cudaMemset(dbytes.get(), 0, want.size()));
  dsv4::PagedCompressArgs<float, model1_fp8_t> g = h;
  g.kv = dkv.get();
  g.score = dsc.get();
  g.chunk_indptr = dindptr.get();
  g.tokens = dtokens.get();
  g.state = dstate.get();
  g.entry_pool = pool_of(dbytes.get());
  g.entry_table = phasekv::dense_block_table(dtable.get(), 1, pages);
  hook.weight = dw.get();
  dsv4::CompressorParams dcp = cp;
  dcp.ape = dape.get();
  PKV_CUDA_OK(dsv4::cuda::compress_append_paged(dcp, h, g, nullptr, hook));
  std::vector<model1_fp8_t> got(want.size());
  PKV_CUDA_OK(cudaMemcpy(got.data(), dbytes.get(), got.size(), cudaMemcpyDeviceToHost));
  for (i64 j = 0; j < J; ++j) {
    const i64 page = table[static_cast<std::size_t>(j / P)];
    const auto* wb = reinterpret_cast<const std::uint8_t*>(want.data()) + page * bb;
    const auto* gb = reinterpret_cast<const std::uint8_t*>(got.data()) + page * bb;
    const auto x = dsv4t::dequantize_token(dsv4t::kModel1, wb, P, j % P, 0);
    const auto y = dsv4t::dequantize_token(dsv4t::kModel1, gb, P, j % P, 0);
    for (i64 i = 0; i < d; ++i) {
      const float e = x[static_cast<std::size_t>(i)], v = y[static_cast<std::size_t>(i)];
      ASSERT_LE(std::abs(v - e), std::abs(e) * 0.125f + 1e-3f) << "entry " << j << " channel " << i;
    }
  }
}

}  // namespace
