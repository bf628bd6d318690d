// DeepSeek-V4 benchmarks (part of bench_attention_cpu), one thread, V4-Flash shapes:
//   BM_Dsv4Compress       the compressor's prefill path (d = 512, CSA ratio 4 with overlap,
//                         HCA ratio 128)
//   BM_Dsv4Decode         sparse attention decode at n = 1,048,576 (64 heads, d 512, K = V,
//                         sinks, window 128): HCA attends 8192 entries + 128 raw rows; CSA a
//                         top-512 list into 262144 entries + 128 raw rows; bf16, FP8 with
//                         a per-tensor scale, or FlashMLA's MODEL1 bytes (584 B a row, in
//                         blocks of 64, written by the library's quantizer);
//                         batch 1 or 32 sequences (each with its own rows; CSA sequences share
//                         one entry pool, 256 MiB in bf16, with their own random lists)
//   BM_Dsv4IndexerScore   lightning indexer over 262144 bf16 keys (64 heads x 128), top-512
//   BM_Dsv4DenseMqa       the cost the model avoids: dense MQA decode over all 1,048,576 raw
//                         rows (bf16) through the same kernel (window = n)
//
// Counters:
//   bytes_per_second    compress: kv + score bytes consumed per second (each input byte is
//                       read once); decode / indexer: row bytes read per second (each row once)
//   rows_per_second     decode: attended (gathered) rows per second over the batch
//   stream_now          read bandwidth of the same moment, one thread (bench_common.hpp's
//                       StreamNow: passes right before and right after the timed loop)
//   frac_of_stream_now  bytes_per_second / stream_now (compress target: >= 0.5)
// Decode and indexer rows also (each row's bytes feed heads * (dim + dim_v) multiply-adds, so
// on a CPU core these rows are bound by FMA throughput, not by memory):
//   flops               decode: 2 * heads * (dim + dim_v) per row; indexer: 2 * heads * dim
//                       per key
//   fma_ceiling         the best f32 FMA rate of one thread in this process (BM_FmaPeak's kernel)
//   frac_of_fma         flops / fma_ceiling
//   frac_of_roofline    bytes_per_second / min(stream_now, fma_ceiling / (flops per byte)): the
//                       fraction of what the binding ceiling allows
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <type_traits>
#include <cstdint>
#include <cstring>
#include <vector>

#include "bench_common.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/dsv4/cache_format.hpp"
#include "phasekv/dsv4/compressor.hpp"
#include "phasekv/dsv4/fp8.hpp"
#include "phasekv/dsv4/indexer.hpp"
#include "phasekv/dsv4/sparse_attention.hpp"

namespace {

namespace dsv4 = phasekv::dsv4;
using Clock = std::chrono::steady_clock;

// The counters of a row bound by memory or by FMA throughput, whichever binds: `flops_per_byte`
// is the row's arithmetic intensity (FLOP per byte read).
void report_roofline(benchmark::State& state, const pkv_bench::StreamNow& now, double bps,
                     double flops_per_byte) {
  now.report(state, bps);
  const double peak = pkv_bench::fma_ceiling(1);
  const double flops = bps * flops_per_byte;
  const double stream = state.counters["stream_now"];
  state.counters["flops"] = flops;
  state.counters["fma_ceiling"] = peak;
  state.counters["frac_of_fma"] = flops / peak;
  // the bytes/s the better of the two ceilings allows: min(stream, fma peak / intensity)
  const double bound = std::min(stream, peak / flops_per_byte);
  state.counters["frac_of_roofline"] = bps / bound;
}

template <class T>
std::vector<T> fill_values(std::size_t count, std::uint32_t seed, float scale) {
  std::vector<T> v(count);
  std::uint32_t x = seed;
  for (auto& e : v) {
    x = x * 1664525u + 1013904223u;
    const float f = (static_cast<float>(x >> 8) * (1.0f / 16777216.0f) - 0.5f) * scale;
    e = phasekv::from_float<T>(f);
  }
  return v;
}

// Batch compression of a prefill of n tokens: bf16 kv + score of twice the last-level cache
// (at least 64 MiB), so that every pass reads them from memory, as the stream passes do.
// range(0): 0 = CSA (ratio 4, coff 2), 1 = HCA (ratio 128, coff 1).
void BM_Dsv4Compress(benchmark::State& state) {
  using T = phasekv::bf16_t;
  const bool hca = state.range(0) == 1;
  const std::int64_t S = hca ? 128 : 4, coff = hca ? 1 : 2, d = 512;
  const std::int64_t bytes_in = std::max<std::int64_t>(
      std::int64_t{64} << 20, 2 * static_cast<std::int64_t>(pkv_bench::llc_bytes()));
  const std::int64_t n = bytes_in / (2 * coff * d * 2 * S) * S;
  const std::size_t elems = static_cast<std::size_t>(n * coff * d);
  const auto kv = fill_values<T>(elems, 1, 2.0f);
  const auto score = fill_values<T>(elems, 2, 6.0f);
  const auto ape = fill_values<float>(static_cast<std::size_t>(S * coff * d), 3, 1.0f);
  std::vector<float> out(static_cast<std::size_t>(n / S * d));
  const dsv4::CompressorParams p{S, coff, d, ape.data()};
  pkv_bench::StreamNow now(1);
  now.passes(2);
  const auto t0 = Clock::now();
  for (auto _ : state) {
    dsv4::compress<T>(p, kv.data(), score.data(), n, out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  now.passes(2);
  const double bytes = 2.0 * static_cast<double>(elems * sizeof(T));
  const double bps = bytes * static_cast<double>(state.iterations()) / sec;
  state.counters["bytes_per_second"] = bps;
  state.counters["tokens"] = static_cast<double>(n);
  now.report(state, bps);
  state.SetLabel(hca ? "HCA_S128_d512_bf16" : "CSA_S4_W8_d512_bf16");
}
BENCHMARK(BM_Dsv4Compress)
    ->ArgName("hca")
    ->Arg(0)
    ->Arg(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

constexpr std::int64_t kN = std::int64_t{1} << 20;  // context of the decode rows
constexpr std::int64_t kHeads = 64, kDim = 512, kWindow = 128, kTopK = 512;

template <class T>
T store_elem(float x) {
  return phasekv::from_float<T>(x);
}
template <>
phasekv::fp8_e4m3_t store_elem<phasekv::fp8_e4m3_t>(float x) {
  return phasekv::float_to_fp8_e4m3(x * 16.0f);
}

template <class T>
std::vector<T> fill_rows(std::size_t count, std::uint32_t seed) {
  std::vector<T> v(count);
  std::uint32_t x = seed;
  for (auto& e : v) {
    x = x * 1664525u + 1013904223u;
    e = store_elem<T>((static_cast<float>(x >> 8) * (1.0f / 16777216.0f) - 0.5f) * 0.2f);
  }
  return v;
}

constexpr std::int64_t kModel1Block = 64;  // MODEL1 rows per block (FlashMLA's page)

// `count` MODEL1 rows (blocks of 64) of the values fill_rows<float> gives.
template <>
std::vector<phasekv::model1_fp8_t> fill_rows<phasekv::model1_fp8_t>(std::size_t count,
                                                                    std::uint32_t seed) {
  const std::int64_t rows = static_cast<std::int64_t>(count) / kDim;
  const std::int64_t bb = dsv4::model1_block_bytes(kModel1Block);
  std::vector<phasekv::model1_fp8_t> v(
      static_cast<std::size_t>((rows + kModel1Block - 1) / kModel1Block * bb));
  std::uint32_t x = seed;
  std::vector<float> row(static_cast<std::size_t>(kDim));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (auto& e : row) {
      x = x * 1664525u + 1013904223u;
      e = (static_cast<float>(x >> 8) * (1.0f / 16777216.0f) - 0.5f) * 0.2f;
    }
    dsv4::detail::store_row<phasekv::model1_fp8_t>(
        row.data(), kDim, 1.0f,
        dsv4::CacheFormat<phasekv::model1_fp8_t>::row(v.data() + r / kModel1Block * bb,
                                                      kModel1Block, r % kModel1Block, 0));
  }
  return v;
}

// Rows [first, first + count) at `data`: `kDim` elements each, or MODEL1 blocks.
template <class T>
dsv4::LatentRows<T> rows_at(const std::vector<T>& v, std::int64_t row0, std::int64_t first,
                            std::int64_t count, float scale) {
  if constexpr (std::is_same<T, phasekv::model1_fp8_t>::value) {  // row0: a block boundary
    const std::int64_t bb = dsv4::model1_block_bytes(kModel1Block);
    return {v.data() + row0 / kModel1Block * bb, first, count, 584, 1.0f, kModel1Block, bb};
  } else {
    return {v.data() + row0 * kDim, first, count, kDim, scale};
  }
}

// Bytes a row takes.
template <class T>
constexpr double row_bytes() {
  if constexpr (std::is_same<T, phasekv::model1_fp8_t>::value)
    return 584.0;
  else
    return static_cast<double>(kDim * sizeof(T));
}

// Sparse decode. range(0): 0 = HCA, 1 = CSA; range(1): 0 = bf16, 1 = FP8, 2 = MODEL1;
// range(2): batch.
template <class T>
void dsv4_decode(benchmark::State& state, bool csa, std::int64_t batch) {
  const std::int64_t entries = csa ? kN / 4 : kN / 128;
  const std::int64_t list = csa ? kTopK : entries;  // rows from the entry tensor per query
  const float scale = std::is_same<T, phasekv::fp8_e4m3_t>::value ? 1.0f / 16.0f : 1.0f;
  // rows: CSA shares one pool; HCA gives each sequence its own entries
  const std::int64_t pool = csa ? entries : entries * batch;
  const auto ent = fill_rows<T>(static_cast<std::size_t>(pool * kDim), 5);
  const auto raw = fill_rows<T>(static_cast<std::size_t>(batch * kWindow * kDim), 6);
  const auto q = fill_values<float>(static_cast<std::size_t>(batch * kHeads * kDim), 7, 1.0f);
  const auto sinks = fill_values<float>(static_cast<std::size_t>(kHeads), 8, 1.0f);
  std::vector<std::int32_t> idx(static_cast<std::size_t>(batch * kTopK));
  std::uint32_t x = 9;
  for (auto& i : idx) {
    x = x * 1664525u + 1013904223u;
    i = static_cast<std::int32_t>((x >> 4) % static_cast<std::uint32_t>(entries));
  }
  std::vector<float> out(static_cast<std::size_t>(batch * kHeads * kDim)),
      lse(static_cast<std::size_t>(batch * kHeads));
  dsv4::SparseAttentionParams p;
  p.heads = kHeads;
  p.dim = p.dim_v = kDim;
  p.window = kWindow;
  p.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  p.sinks = sinks.data();
  auto step = [&] {
    for (std::int64_t b = 0; b < batch; ++b) {
      // the sequence's raw rows hold positions [kN - kWindow, kN)
      const auto rr = rows_at<T>(raw, b * kWindow, kN - kWindow, kWindow, scale);
      const auto er = rows_at<T>(ent, csa ? 0 : b * entries, 0, entries, scale);
      dsv4::sparse_attention<T>(p, q.data() + b * kHeads * kDim, rr, er,
                                csa ? idx.data() + b * kTopK : nullptr, list, kN - 1, 1,
                                out.data() + b * kHeads * kDim, lse.data() + b * kHeads);
    }
  };
  step();  // warm
  pkv_bench::StreamNow now(1);
  now.passes(2);
  const auto t0 = Clock::now();
  for (auto _ : state) {
    step();
    benchmark::DoNotOptimize(out.data());
  }
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  now.passes(2);
  const double rows =
      static_cast<double>(batch * (list + kWindow)) * static_cast<double>(state.iterations());
  const double bps = rows * row_bytes<T>() / sec;
  state.counters["bytes_per_second"] = bps;
  state.counters["rows_per_second"] = rows / sec;
  report_roofline(state, now, bps, 2.0 * kHeads * (kDim + kDim) / row_bytes<T>());
  const char* fmt = std::is_same<T, phasekv::fp8_e4m3_t>::value     ? "fp8"
                    : std::is_same<T, phasekv::model1_fp8_t>::value ? "model1"
                                                                    : "bf16";
  state.SetLabel(std::string(csa ? "CSA_top512" : "HCA_8192") + "_w128_h64_d512_" + fmt + "_batch" +
                 std::to_string(batch));
}

void BM_Dsv4Decode(benchmark::State& state) {
  const bool csa = state.range(0) == 1;
  const std::int64_t batch = state.range(2);
  if (state.range(1) == 1)
    dsv4_decode<phasekv::fp8_e4m3_t>(state, csa, batch);
  else if (state.range(1) == 2)
    dsv4_decode<phasekv::model1_fp8_t>(state, csa, batch);
  else
    dsv4_decode<phasekv::bf16_t>(state, csa, batch);
}
BENCHMARK(BM_Dsv4Decode)
    ->ArgNames({"csa", "fmt", "batch"})
    ->ArgsProduct({{0, 1}, {0, 1, 2}, {1, 32}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// The lightning indexer's scoring and top-512 over 262144 bf16 keys for one query.
void BM_Dsv4IndexerScore(benchmark::State& state) {
  using T = phasekv::bf16_t;
  const std::int64_t keys = kN / 4, H = 64, D = 128;
  const auto k = fill_rows<T>(static_cast<std::size_t>(keys * D), 11);
  const auto q = fill_values<float>(static_cast<std::size_t>(H * D), 12, 1.0f);
  const auto w = fill_values<float>(static_cast<std::size_t>(H), 13, 1.0f);
  std::vector<std::int32_t> idx(static_cast<std::size_t>(kTopK));
  const dsv4::IndexerParams p{H, D, kTopK, phasekv::Geometry(4, 4)};
  pkv_bench::StreamNow now(1);
  now.passes(2);
  const auto t0 = Clock::now();
  for (auto _ : state) {
    dsv4::indexer_decode<T>(p, q.data(), w.data(), k.data(), keys, D, kN, idx.data());
    benchmark::DoNotOptimize(idx.data());
  }
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  now.passes(2);
  const double it = static_cast<double>(state.iterations());
  const double bps = it * static_cast<double>(keys * D) * sizeof(T) / sec;
  state.counters["bytes_per_second"] = bps;
  report_roofline(state, now, bps, 2.0 * H * D / (D * sizeof(T)));
  state.SetLabel("keys262144_h64_d128_top512_bf16");
}
BENCHMARK(BM_Dsv4IndexerScore)->UseRealTime()->Unit(benchmark::kMillisecond);

// Dense MQA decode over every raw row of n = 1,048,576 (bf16, 1 GiB): window = n.
void BM_Dsv4DenseMqa(benchmark::State& state) {
  using T = phasekv::bf16_t;
  const auto raw = fill_rows<T>(static_cast<std::size_t>(kN * kDim), 21);
  const auto q = fill_values<float>(static_cast<std::size_t>(kHeads * kDim), 22, 1.0f);
  const auto sinks = fill_values<float>(static_cast<std::size_t>(kHeads), 23, 1.0f);
  std::vector<float> out(static_cast<std::size_t>(kHeads * kDim)),
      lse(static_cast<std::size_t>(kHeads));
  dsv4::SparseAttentionParams p;
  p.heads = kHeads;
  p.dim = p.dim_v = kDim;
  p.window = kN;
  p.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  p.sinks = sinks.data();
  const dsv4::LatentRows<T> rr{raw.data(), 0, kN, kDim, 1.0f};
  const dsv4::LatentRows<T> none{};
  pkv_bench::StreamNow now(1);
  now.passes(2);
  const auto t0 = Clock::now();
  for (auto _ : state) {
    dsv4::sparse_attention<T>(p, q.data(), rr, none, nullptr, 0, kN - 1, 1, out.data(), lse.data());
    benchmark::DoNotOptimize(out.data());
  }
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  now.passes(2);
  const double rows = static_cast<double>(kN) * static_cast<double>(state.iterations());
  const double bps = rows * kDim * sizeof(T) / sec;
  state.counters["bytes_per_second"] = bps;
  state.counters["rows_per_second"] = rows / sec;
  report_roofline(state, now, bps, 2.0 * kHeads * (kDim + kDim) / (kDim * sizeof(T)));
  state.SetLabel("n1048576_h64_d512_bf16_batch1");
}
BENCHMARK(BM_Dsv4DenseMqa)->UseRealTime()->Unit(benchmark::kMillisecond)->Iterations(1);

}  // namespace
