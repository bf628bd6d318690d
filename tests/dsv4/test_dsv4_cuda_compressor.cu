// The CUDA twin of the DeepSeek-V4 compressor (dsv4/cuda/compressor.cuh) and the host/device
// arithmetic it shares (dsv4/kernel_math.hpp: CompressorRows, compressor_pool_channel, the
// state's rows).
//
// Always run (no device needed): the shared arithmetic; a host model of the two device kernels
// (entries from CompressorRows, then the state update) built from that arithmetic, against the
// float64 reference of the formulas, bit-equal between batch and streaming over random
// chunkings (lengths 0 and 1 included), storing into shuffled pages in every entry type, and
// continuing from a state the CPU's compress_append_paged left; the host checks of both calls.
// With a device: cuda::compress and cuda::compress_append_paged against the same reference and
// the CPU's compress (outputs poisoned first), device streaming bit-equal to device batch, the
// device state and token counts equal to the host model's.
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
#include <utility>
#include <vector>

#include "cuda/cuda_test_util.hpp"
#include "dsv4_test_util.hpp"
#include "phasekv/dsv4/compressor.hpp"
#include "phasekv/dsv4/cuda/compressor.cuh"
#include "phasekv/dsv4/kernel_math.hpp"

namespace {

namespace dsv4 = phasekv::dsv4;
using phasekv::bf16_t;
using phasekv::f16_t;
using phasekv::fp8_e4m3_t;
using pkv_cuda_test::DeviceBuffer;
using pkv_cuda_test::has_device;
using pkv_cuda_test::to_device;
using i64 = std::int64_t;

template <class E>
bool same_bits(const E& a, const E& b) {
  return std::memcmp(&a, &b, sizeof(E)) == 0;
}

// ---- the shared arithmetic ----------------------------------------------------------------

TEST(Dsv4KernelMathCompressor, BlocksAndStateRows) {
  // coff 2, S 4: entry 0 sees block -1 (absent) and 0; entry 5 sees blocks 4 and 5
  EXPECT_EQ(dsv4::compressor_block(0, 0, 2), -1);
  EXPECT_EQ(dsv4::compressor_block(0, 1, 2), 0);
  EXPECT_EQ(dsv4::compressor_block(5, 0, 2), 4);
  EXPECT_EQ(dsv4::compressor_block(5, 0, 1), 5);
  // block k in slot k mod coff, rows in order
  EXPECT_EQ(dsv4::compressor_state_row(0, 4, 2), 0);
  EXPECT_EQ(dsv4::compressor_state_row(5, 4, 2), 5);
  EXPECT_EQ(dsv4::compressor_state_row(9, 4, 2), 1);
  EXPECT_EQ(dsv4::compressor_state_row(14, 4, 2), 6);
  EXPECT_EQ(dsv4::compressor_state_row(300, 128, 1), 44);
  // the state holds [begin(n), n): the block in progress and, with coff 2, the last complete one
  EXPECT_EQ(dsv4::compressor_state_begin(0, 4, 2), 0);
  EXPECT_EQ(dsv4::compressor_state_begin(3, 4, 2), 0);
  EXPECT_EQ(dsv4::compressor_state_begin(6, 4, 2), 0);
  EXPECT_EQ(dsv4::compressor_state_begin(8, 4, 2), 4);
  EXPECT_EQ(dsv4::compressor_state_begin(11, 4, 2), 4);
  EXPECT_EQ(dsv4::compressor_state_begin(11, 4, 1), 8);
  EXPECT_EQ(dsv4::compressor_state_begin(127, 128, 1), 0);
  EXPECT_EQ(dsv4::compressor_state_begin(256, 128, 1), 256);
  // storage conversion
  EXPECT_EQ(dsv4::store_element<fp8_e4m3_t>(1000.0f).bits, 0x7e);  // saturates at 448
  EXPECT_EQ(dsv4::store_element<fp8_e4m3_t>(-1.0f).bits, 0xb8);
  EXPECT_EQ(dsv4::store_element<float>(0.1f), 0.1f);
  EXPECT_EQ(dsv4::store_element<bf16_t>(1.0f).bits, phasekv::float_to_bf16(1.0f).bits);
}

// ---- data, reference, host model ------------------------------------------------------------

struct Shape {
  i64 ratio, coff, dim;
};

// Per-sequence kv / score rows for a batch, the ape, and the float64 reference entries.
template <class T>
struct Seqs {
  Shape sh;
  std::vector<i64> lengths;
  std::vector<float> ape;
  std::vector<std::vector<T>> kv, score;
  dsv4::CompressorParams cp;
  double zmax = 0.0, vmax = 0.0;

  Seqs(const Shape& s, std::vector<i64> lens, std::uint32_t seed)
      : sh(s), lengths(std::move(lens)) {
    const i64 rw = sh.coff * sh.dim;
    ape = dsv4t::random_values<float>(static_cast<std::size_t>(sh.ratio * rw), seed, 0.5f);
    for (std::size_t b = 0; b < lengths.size(); ++b) {
      const auto n = static_cast<std::size_t>(lengths[b] * rw);
      kv.push_back(dsv4t::random_values<T>(n, seed + 10 + static_cast<std::uint32_t>(b)));
      score.push_back(dsv4t::random_values<T>(n, seed + 20 + static_cast<std::uint32_t>(b), 1.5f));
      for (const T& x : kv.back()) vmax = std::max(vmax, std::abs(dsv4t::val(x)));
      for (const T& x : score.back()) zmax = std::max(zmax, std::abs(dsv4t::val(x)));
    }
    double amax = 0.0;
    for (float a : ape) amax = std::max(amax, std::abs(double{a}));
    zmax += amax;
    cp = dsv4::CompressorParams{sh.ratio, sh.coff, sh.dim, ape.data()};
  }
  i64 batch() const { return static_cast<i64>(lengths.size()); }
  std::vector<double> reference(i64 b) const {
    const auto sb = static_cast<std::size_t>(b);
    return dsv4t::reference_compress<T>(sh.ratio, sh.coff, sh.dim, ape, kv[sb], score[sb],
                                        lengths[sb]);
  }
  // Bound of the f32 arithmetic against the float64 formulas: each weight exp(z - m) errs by
  // the rounding of z and z - m (|z| <= zmax) and the exp's 2 ulp, the sums by one rounding per
  // window row; the entry is a convex combination of values up to vmax.
  double f32_bound() const {
    const double W = static_cast<double>(sh.coff * sh.ratio), eps = std::ldexp(1.0, -24);
    return eps * (16.0 + 4.0 * W + 8.0 * zmax) * std::max(vmax, 1.0);
  }
};

// Relative half-ulp and absolute subnormal rounding of storing into E.
template <class E>
double storage_rel() {
  if (std::is_same<E, bf16_t>::value) return std::ldexp(1.0, -8);
  if (std::is_same<E, f16_t>::value) return std::ldexp(1.0, -11);
  if (std::is_same<E, fp8_e4m3_t>::value) return std::ldexp(1.0, -4);
  return 0.0;
}
template <class E>
double storage_abs() {
  if (std::is_same<E, f16_t>::value) return std::ldexp(1.0, -25);
  if (std::is_same<E, fp8_e4m3_t>::value) return std::ldexp(1.0, -10);
  if (std::is_same<E, bf16_t>::value) return std::ldexp(1.0, -134);
  return 0.0;
}

// Host run of cuda::compress: the device's per-channel function over rows with n = 0.
template <class T>
std::vector<float> model_batch(const dsv4::CompressorParams& cp, const T* kv, const T* score,
                               i64 n) {
  const i64 J = n / cp.ratio;
  std::vector<float> out(static_cast<std::size_t>(J * cp.dim));
  dsv4::CompressorRows<T> rows;
  rows.kv = kv;
  rows.score = score;
  rows.ratio = cp.ratio;
  rows.coff = cp.coff;
  rows.row_width = cp.row_width();
  for (i64 j = 0; j < J; ++j)
    for (i64 c = 0; c < cp.dim; ++c)
      out[static_cast<std::size_t>(j * cp.dim + c)] =
          dsv4::compressor_pool_channel(rows, cp.ape, j, c, cp.dim);
  return out;
}

// Host run of cuda::compress_append_paged: the entries kernel for every (sequence, entry),
// then the state kernel, from the same shared functions.
template <class T, class E>
void model_append(const dsv4::CompressorParams& cp, const dsv4::PagedCompressArgs<T, E>& a) {
  const i64 rw = cp.row_width(), half = cp.coff * cp.ratio * rw, d = cp.dim;
  const auto rows_of = [&](i64 b, i64 n) {
    const dsv4::ChunkRows ch = dsv4::chunk_rows(b, a.chunk_indptr);
    dsv4::CompressorRows<T> r;
    r.kv = a.kv + ch.row * rw;
    r.score = a.score + ch.row * rw;
    r.state_kv = a.state + b * 2 * half;
    r.state_score = r.state_kv + half;
    r.n = n;
    r.ratio = cp.ratio;
    r.coff = cp.coff;
    r.row_width = rw;
    return r;
  };
  for (i64 b = 0; b < a.batch; ++b) {
    const i64 n = a.tokens[b], c = dsv4::chunk_rows(b, a.chunk_indptr).count;
    const auto rows = rows_of(b, n);
    for (i64 j = n / cp.ratio; j < (n + c) / cp.ratio; ++j) {
      const i64 P = a.entry_pool.page_size;
      E* dst = a.entry_pool.key(a.entry_table.page(b, j / P), j % P, 0);
      for (i64 ch = 0; ch < d; ++ch)
        dst[ch] = dsv4::store_element<E>(dsv4::compressor_pool_channel(rows, cp.ape, j, ch, d) /
                                         a.entry_scale);
    }
  }
  for (i64 b = 0; b < a.batch; ++b) {
    const i64 n = a.tokens[b], c = dsv4::chunk_rows(b, a.chunk_indptr).count;
    if (c == 0) continue;
    const auto rows = rows_of(b, n);
    const i64 lo = std::max(n, dsv4::compressor_state_begin(n + c, cp.ratio, cp.coff));
    for (i64 p = lo; p < n + c; ++p) {
      const i64 at = dsv4::compressor_state_row(p, cp.ratio, cp.coff) * rw;
      std::memcpy(a.state + b * 2 * half + at, rows.kv_row(p),
                  static_cast<std::size_t>(rw) * sizeof(T));
      std::memcpy(a.state + b * 2 * half + half + at, rows.score_row(p),
                  static_cast<std::size_t>(rw) * sizeof(T));
    }
    a.tokens[b] = n + c;
  }
}

// Shuffled entry pages for a batch (rows `row` elements wide, poisoned), CSR table.
template <class E>
struct Pages {
  i64 page_size = 1, row = 1, pages = 0;
  std::vector<std::int32_t> indptr{0}, indices;
  std::vector<E> pool;
  Pages(const std::vector<i64>& entries, i64 P, i64 row_width, std::uint32_t seed)
      : page_size(P), row(row_width) {
    for (i64 e : entries) pages += (e + P - 1) / P;
    std::vector<std::int32_t> order(static_cast<std::size_t>(pages));
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int32_t>(i);
    std::mt19937 rng(seed);
    std::shuffle(order.begin(), order.end(), rng);
    std::size_t next = 0;
    for (i64 e : entries) {
      for (i64 i = 0; i < (e + P - 1) / P; ++i) indices.push_back(order[next++]);
      indptr.push_back(static_cast<std::int32_t>(indices.size()));
    }
    pool.assign(static_cast<std::size_t>(std::max<i64>(pages, 1) * P * row),
                dsv4::store_element<E>(std::numeric_limits<float>::quiet_NaN()));
  }
  const E* entry(i64 b, i64 j) const {
    const i64 page =
        indices[static_cast<std::size_t>(indptr[static_cast<std::size_t>(b)] + j / page_size)];
    return pool.data() + (page * page_size + j % page_size) * row;
  }
};

// One chunked schedule: per step, each sequence appends 0, 1, 3 or 13 tokens (never past its
// length) until all are in.
struct Step {
  std::vector<std::int32_t> indptr;  // [batch + 1]
};
inline std::vector<Step> schedule(const std::vector<i64>& lengths, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pick(0, 9);
  std::vector<i64> done(lengths.size(), 0);
  std::vector<Step> steps;
  for (int guard = 0; guard < 10000; ++guard) {
    bool more = false;
    Step s;
    s.indptr.push_back(0);
    for (std::size_t b = 0; b < lengths.size(); ++b) {
      const int r = pick(rng);
      i64 c = r < 3 ? 0 : r < 7 ? 1 : r < 9 ? 3 : 13;
      c = std::min(c, lengths[b] - done[b]);
      done[b] += c;
      more = more || done[b] < lengths[b];
      s.indptr.push_back(s.indptr.back() + static_cast<std::int32_t>(c));
    }
    steps.push_back(s);
    if (!more) break;
  }
  return steps;
}

// The chunk rows of one step, concatenated.
template <class T>
void gather_step(const Seqs<T>& s, const Step& st, const std::vector<i64>& tokens,
                 std::vector<T>& kv, std::vector<T>& score) {
  const i64 rw = s.cp.row_width();
  kv.clear();
  score.clear();
  for (std::size_t b = 0; b < s.lengths.size(); ++b) {
    const i64 c = st.indptr[b + 1] - st.indptr[b];
    kv.insert(kv.end(), s.kv[b].begin() + tokens[b] * rw, s.kv[b].begin() + (tokens[b] + c) * rw);
    score.insert(score.end(), s.score[b].begin() + tokens[b] * rw,
                 s.score[b].begin() + (tokens[b] + c) * rw);
  }
}

const std::vector<Shape> kShapes = {{4, 2, 56}, {3, 2, 17}, {5, 1, 40}, {1, 1, 8}, {128, 1, 24}};
const std::vector<i64> kLengths = {0, 1, 7, 61, 33, 300};

template <class T>
void host_batch_within_reference(std::uint32_t seed) {
  for (const Shape& sh : kShapes) {
    const Seqs<T> s(sh, kLengths, seed);
    for (i64 b = 0; b < s.batch(); ++b) {
      const auto sb = static_cast<std::size_t>(b);
      const auto got = model_batch<T>(s.cp, s.kv[sb].data(), s.score[sb].data(), s.lengths[sb]);
      const auto want = s.reference(b);
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], s.f32_bound())
            << "S " << sh.ratio << " coff " << sh.coff << " d " << sh.dim << " seq " << b << " i "
            << i;
      // and near the CPU kernel (its own exp): twice the bound
      std::vector<float> cpu(got.size());
      if (!cpu.empty())
        dsv4::compress<T>(s.cp, s.kv[sb].data(), s.score[sb].data(), s.lengths[sb], cpu.data());
      for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], cpu[i], 2.0 * s.f32_bound()) << "seq " << b << " i " << i;
    }
  }
}

TEST(CompressorCudaHostModel, BatchWithinReference) {
  host_batch_within_reference<float>(101);
  host_batch_within_reference<bf16_t>(102);
  host_batch_within_reference<f16_t>(103);
}

// Streaming over random chunkings stores exactly E(batch / scale) in the right page slots.
template <class T, class E>
void host_streaming_same_bits(std::uint32_t seed) {
  const float scale = std::is_same<E, fp8_e4m3_t>::value ? 0.02f : 1.0f;
  for (const Shape& sh : kShapes) {
    for (i64 P : {1, 16}) {
      const Seqs<T> s(sh, kLengths, seed);
      std::vector<i64> ents;
      for (i64 n : s.lengths) ents.push_back(n / sh.ratio);
      Pages<E> pg(ents, P, sh.dim + 3, seed + 1);
      dsv4::PagedCompressArgs<T, E> a;
      a.batch = s.batch();
      a.entry_pool = phasekv::make_page_pool<E>(pg.pool.data(), pg.pool.data(), pg.pages, P, 1,
                                                pg.row, pg.row);
      a.entry_table = phasekv::csr_block_table(pg.indptr.data(), pg.indices.data(), a.batch);
      a.entry_scale = scale;
      std::vector<i64> tokens(s.lengths.size(), 0);
      std::vector<T> state(
          static_cast<std::size_t>(a.batch * dsv4::compressor_state_elements(s.cp)),
          phasekv::from_float<T>(std::numeric_limits<float>::quiet_NaN()));
      a.tokens = tokens.data();
      a.state = state.data();
      std::vector<T> ckv, cscore;
      for (const Step& st : schedule(s.lengths, seed + 2)) {
        gather_step(s, st, tokens, ckv, cscore);
        a.kv = ckv.data();
        a.score = cscore.data();
        a.chunk_indptr = st.indptr.data();
        model_append<T, E>(s.cp, a);
      }
      for (i64 b = 0; b < a.batch; ++b) {
        const auto sb = static_cast<std::size_t>(b);
        ASSERT_EQ(tokens[sb], s.lengths[sb]);
        const auto want = model_batch<T>(s.cp, s.kv[sb].data(), s.score[sb].data(), s.lengths[sb]);
        for (i64 j = 0; j < s.lengths[sb] / sh.ratio; ++j)
          for (i64 c = 0; c < sh.dim; ++c)
            ASSERT_TRUE(same_bits(
                pg.entry(b, j)[c],
                dsv4::store_element<E>(want[static_cast<std::size_t>(j * sh.dim + c)] / scale)))
                << "S " << sh.ratio << " coff " << sh.coff << " P " << P << " seq " << b
                << " entry " << j << " ch " << c;
      }
    }
  }
}

TEST(CompressorCudaHostModel, StreamingSameBitsAsBatchInPages) {
  host_streaming_same_bits<float, float>(201);
  host_streaming_same_bits<bf16_t, bf16_t>(202);
  host_streaming_same_bits<f16_t, fp8_e4m3_t>(203);
  host_streaming_same_bits<float, f16_t>(204);
}

// The state the CPU's compress_append_paged leaves is the state the device reads: the CPU
// appends the first part, the device model the rest, and the model's entries equal its batch.
TEST(CompressorCudaHostModel, ContinuesFromTheCpuState) {
  for (const Shape& sh : kShapes) {
    const Seqs<float> s(sh, kLengths, 301);
    std::vector<i64> ents;
    for (i64 n : s.lengths) ents.push_back(n / sh.ratio);
    Pages<float> pg(ents, 4, sh.dim, 302);
    dsv4::PagedCompressArgs<float, float> a;
    a.batch = s.batch();
    a.entry_pool = dsv4::latent_page_pool<float>(pg.pool.data(), pg.pages, 4, sh.dim);
    a.entry_table = phasekv::csr_block_table(pg.indptr.data(), pg.indices.data(), a.batch);
    std::vector<i64> tokens(s.lengths.size(), 0);
    std::vector<float> state(
        static_cast<std::size_t>(a.batch * dsv4::compressor_state_elements(s.cp)));
    a.tokens = tokens.data();
    a.state = state.data();
    std::vector<float> ckv, cscore;
    int k = 0;
    for (const Step& st : schedule(s.lengths, 303)) {
      gather_step(s, st, tokens, ckv, cscore);
      a.kv = ckv.data();
      a.score = cscore.data();
      a.chunk_indptr = st.indptr.data();
      if (k++ % 2 == 0)
        dsv4::compress_append_paged<float, float>(s.cp, a);
      else
        model_append<float, float>(s.cp, a);
    }
    for (i64 b = 0; b < a.batch; ++b) {
      const auto sb = static_cast<std::size_t>(b);
      const auto model =
          model_batch<float>(s.cp, s.kv[sb].data(), s.score[sb].data(), s.lengths[sb]);
      std::vector<float> cpu(model.size());
      if (!cpu.empty())
        dsv4::compress<float>(s.cp, s.kv[sb].data(), s.score[sb].data(), s.lengths[sb], cpu.data());
      for (i64 j = 0; j < s.lengths[sb] / sh.ratio; ++j)
        for (i64 c = 0; c < sh.dim; ++c) {
          const float got = pg.entry(b, j)[c];
          const auto i = static_cast<std::size_t>(j * sh.dim + c);
          ASSERT_TRUE(got == model[i] || got == cpu[i])
              << "S " << sh.ratio << " seq " << b << " entry " << j << " ch " << c;
        }
    }
  }
}

// ---- device cases ---------------------------------------------------------------------------

template <class T>
void device_batch(std::uint32_t seed) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device visible (cudaGetDeviceCount)";
  for (const Shape& sh : kShapes) {
    const Seqs<T> s(sh, kLengths, seed);
    auto ape = to_device(s.ape);
    dsv4::CompressorParams cp = s.cp;
    cp.ape = ape.get();
    for (i64 b = 0; b < s.batch(); ++b) {
      const auto sb = static_cast<std::size_t>(b);
      const i64 n = s.lengths[sb], J = n / sh.ratio;
      auto kv = to_device(s.kv[sb]), score = to_device(s.score[sb]);
      DeviceBuffer<float> out(static_cast<std::size_t>(std::max<i64>(J, 1) * sh.dim));
      PKV_CUDA_OK(out.poison());
      PKV_CUDA_OK(dsv4::cuda::compress<T>(cp, kv.get(), score.get(), n, out.get()));
      PKV_CUDA_OK(cudaDeviceSynchronize());
      std::vector<float> got;
      PKV_CUDA_OK(out.download(got));
      const auto want = s.reference(b);
      for (std::size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(got[i], want[i], s.f32_bound())
            << "S " << sh.ratio << " seq " << b << " i " << i;
      // near the CPU kernel (its own exp): both within the bound of the reference
      std::vector<float> cpu(want.size());
      if (!cpu.empty()) dsv4::compress<T>(s.cp, s.kv[sb].data(), s.score[sb].data(), n, cpu.data());
      for (std::size_t i = 0; i < cpu.size(); ++i)
        ASSERT_NEAR(got[i], cpu[i], 2.0 * s.f32_bound()) << "CPU, seq " << b << " i " << i;
      if (J >= 3) {  // a range: only rows [1, J - 1) are written
        PKV_CUDA_OK(out.poison());
        PKV_CUDA_OK(
            dsv4::cuda::compress<T>(cp, kv.get(), score.get(), n, out.get(), nullptr, 1, J - 1));
        PKV_CUDA_OK(cudaDeviceSynchronize());
        std::vector<float> part;
        PKV_CUDA_OK(out.download(part));
        for (i64 i = 0; i < J * sh.dim; ++i) {
          const auto si = static_cast<std::size_t>(i);
          if (i / sh.dim >= 1 && i / sh.dim < J - 1)
            ASSERT_TRUE(same_bits(part[si], got[si])) << i;
          else
            ASSERT_TRUE(std::isnan(part[si])) << i;
        }
      }
    }
  }
}

TEST(CompressorCuda, BatchF32WithinReference) { device_batch<float>(401); }
TEST(CompressorCuda, BatchBf16WithinReference) { device_batch<bf16_t>(402); }
TEST(CompressorCuda, BatchF16WithinReference) { device_batch<f16_t>(403); }

// Device streaming over random chunkings into shuffled pages: stored E(batch / scale) bit for
// bit against the device batch, within the storage bound of the reference, the device state
// and token counts equal the host model's.
template <class T, class E>
void device_paged(std::uint32_t seed) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device visible (cudaGetDeviceCount)";
  const float scale = std::is_same<E, fp8_e4m3_t>::value ? 0.02f : 1.0f;
  for (const Shape& sh : kShapes) {
    for (i64 P : {1, 16}) {
      const Seqs<T> s(sh, kLengths, seed);
      const i64 B = s.batch();
      std::vector<i64> ents;
      for (i64 n : s.lengths) ents.push_back(n / sh.ratio);
      Pages<E> pg(ents, P, sh.dim + 3, seed + 1);
      auto ape = to_device(s.ape);
      dsv4::CompressorParams cp = s.cp;
      cp.ape = ape.get();
      auto dpool = to_device(pg.pool);
      auto dindptr = to_device(pg.indptr), dindices = to_device(pg.indices);
      const i64 selems = B * dsv4::compressor_state_elements(s.cp);
      std::vector<T> hstate(static_cast<std::size_t>(selems),
                            phasekv::from_float<T>(std::numeric_limits<float>::quiet_NaN()));
      auto dstate = to_device(hstate);
      std::vector<i64> tokens(static_cast<std::size_t>(B), 0), mtokens = tokens;
      auto dtokens = to_device(tokens);
      Pages<E> mpg = pg;  // the host model's pages and state
      std::vector<T> mstate = hstate;
      dsv4::PagedCompressArgs<T, E> host, dev, model;
      host.batch = dev.batch = model.batch = B;
      host.entry_table = phasekv::csr_block_table(pg.indptr.data(), pg.indices.data(), B);
      host.entry_scale = dev.entry_scale = model.entry_scale = scale;
      host.tokens = tokens.data();
      dev.entry_pool =
          phasekv::make_page_pool<E>(dpool.get(), dpool.get(), pg.pages, P, 1, pg.row, pg.row);
      dev.entry_table = phasekv::csr_block_table(dindptr.get(), dindices.get(), B);
      dev.tokens = dtokens.get();
      dev.state = dstate.get();
      model.entry_pool = phasekv::make_page_pool<E>(mpg.pool.data(), mpg.pool.data(), pg.pages, P,
                                                    1, pg.row, pg.row);
      model.entry_table = host.entry_table;
      model.tokens = mtokens.data();
      model.state = mstate.data();
      std::vector<T> ckv, cscore;
      for (const Step& st : schedule(s.lengths, seed + 2)) {
        gather_step(s, st, tokens, ckv, cscore);
        auto dkv = to_device(ckv), dscore = to_device(cscore);
        auto dci = to_device(st.indptr);
        host.chunk_indptr = st.indptr.data();
        dev.chunk_indptr = dci.get();
        dev.kv = dkv.get();
        dev.score = dscore.get();
        PKV_CUDA_OK((dsv4::cuda::compress_append_paged<T, E>(cp, host, dev)));
        model.kv = ckv.data();
        model.score = cscore.data();
        model.chunk_indptr = st.indptr.data();
        model_append<T, E>(s.cp, model);
        PKV_CUDA_OK(cudaDeviceSynchronize());
        for (std::size_t b = 0; b < tokens.size(); ++b)
          tokens[b] += st.indptr[b + 1] - st.indptr[b];
      }
      std::vector<i64> got_tokens;
      PKV_CUDA_OK(dtokens.download(got_tokens));
      EXPECT_EQ(got_tokens, s.lengths);
      EXPECT_EQ(mtokens, s.lengths);
      PKV_CUDA_OK(dpool.download(pg.pool));
      // the state rows the next call would read, equal to the model's
      std::vector<T> got_state;
      PKV_CUDA_OK(dstate.download(got_state));
      const i64 rw = s.cp.row_width(), half = sh.coff * sh.ratio * rw;
      for (i64 b = 0; b < B; ++b) {
        const i64 n = s.lengths[static_cast<std::size_t>(b)];
        for (i64 p = dsv4::compressor_state_begin(n, sh.ratio, sh.coff); p < n; ++p)
          for (i64 part = 0; part < 2; ++part) {
            const i64 at =
                b * 2 * half + part * half + dsv4::compressor_state_row(p, sh.ratio, sh.coff) * rw;
            ASSERT_EQ(0, std::memcmp(got_state.data() + at, mstate.data() + at,
                                     static_cast<std::size_t>(rw) * sizeof(T)))
                << "seq " << b << " token " << p;
          }
      }
      // entries: bits of the device batch, and near the reference
      for (i64 b = 0; b < B; ++b) {
        const auto sb = static_cast<std::size_t>(b);
        const i64 n = s.lengths[sb], J = n / sh.ratio;
        if (J == 0) continue;
        auto kv = to_device(s.kv[sb]), score = to_device(s.score[sb]);
        DeviceBuffer<float> out(static_cast<std::size_t>(J * sh.dim));
        PKV_CUDA_OK(out.poison());
        PKV_CUDA_OK(dsv4::cuda::compress<T>(cp, kv.get(), score.get(), n, out.get()));
        PKV_CUDA_OK(cudaDeviceSynchronize());
        std::vector<float> batch;
        PKV_CUDA_OK(out.download(batch));
        const auto want = s.reference(b);
        for (i64 j = 0; j < J; ++j)
          for (i64 c = 0; c < sh.dim; ++c) {
            const auto i = static_cast<std::size_t>(j * sh.dim + c);
            const E got = pg.entry(b, j)[c];
            ASSERT_TRUE(same_bits(got, dsv4::store_element<E>(batch[i] / scale)))
                << "S " << sh.ratio << " P " << P << " seq " << b << " entry " << j << " ch " << c;
            const double real = static_cast<double>(phasekv::to_float(got)) * scale;
            const double bound = storage_rel<E>() * (std::abs(want[i]) + s.f32_bound()) +
                                 storage_abs<E>() * scale + s.f32_bound();
            ASSERT_NEAR(real, want[i], bound) << "seq " << b << " entry " << j << " ch " << c;
          }
        // slots past dim stay poisoned
        for (i64 j = 0; j < J; ++j)
          for (i64 c = sh.dim; c < pg.row; ++c)
            ASSERT_TRUE(std::isnan(phasekv::to_float(pg.entry(b, j)[c]))) << "padding";
      }
    }
  }
}

TEST(CompressorCuda, PagedF32SameBitsAsBatch) { device_paged<float, float>(501); }
TEST(CompressorCuda, PagedBf16IntoBf16Pages) { device_paged<bf16_t, bf16_t>(502); }
TEST(CompressorCuda, PagedBf16IntoFp8PagesScaled) { device_paged<bf16_t, fp8_e4m3_t>(503); }
TEST(CompressorCuda, PagedF16IntoF16Pages) { device_paged<f16_t, f16_t>(504); }

// ---- host checks (no device needed) ---------------------------------------------------------

std::string expect_rejected(cudaError_t e) {
  if (e != cudaErrorInvalidValue) return "status " + std::to_string(static_cast<int>(e));
  return phasekv::cuda::last_error_message();
}

void expect_names(const std::string& m, const char* where, const char* arg) {
  EXPECT_NE(m.find(std::string(": ") + arg + " = "), std::string::npos) << "message: " << m;
  EXPECT_NE(m.find(where), std::string::npos) << m;
}

TEST(CompressorCudaChecks, CompressRejectedBeforeAnyCudaCall) {
  const float* fake = reinterpret_cast<const float*>(0x1000);
  float* out = reinterpret_cast<float*>(0x2000);
  const char* where = "phasekv::dsv4::cuda::compress";
  dsv4::CompressorParams cp{4, 2, 64, fake};
  const auto run = [&](const dsv4::CompressorParams& p, const float* kv, i64 n, float* o,
                       i64 e0 = 0, i64 e1 = -1) {
    return expect_rejected(dsv4::cuda::compress<float>(p, kv, fake, n, o, nullptr, e0, e1));
  };
  dsv4::CompressorParams bad = cp;
  bad.coff = 3;
  expect_names(run(bad, fake, 40, out), where, "params.coff");
  bad = cp, bad.ratio = 0;
  expect_names(run(bad, fake, 40, out), where, "params.ratio");
  bad = cp, bad.ape = nullptr;
  expect_names(run(bad, fake, 40, out), where, "params.ape");
  expect_names(run(cp, fake, -1, out), where, "n");
  expect_names(run(cp, fake, 40, out, 11), where, "entry_begin");
  expect_names(run(cp, fake, 40, out, 2, 11), where, "entry_end");
  expect_names(run(cp, fake, 40, out, 3, 2), where, "entry_end");
  expect_names(run(cp, nullptr, 40, out), where, "kv");
  expect_names(run(cp, fake, 40, nullptr), where, "out");
  // nothing to compute: accepted without a launch, null pointers included
  EXPECT_EQ(dsv4::cuda::compress<float>(cp, nullptr, nullptr, 3, nullptr), cudaSuccess);
  EXPECT_EQ(dsv4::cuda::compress<float>(cp, nullptr, nullptr, 40, nullptr, nullptr, 4, 4),
            cudaSuccess);
  EXPECT_STREQ(phasekv::cuda::last_error_message(), "");
}

TEST(CompressorCudaChecks, PagedAppendRejectedBeforeAnyCudaCall) {
  const char* where = "phasekv::dsv4::cuda::compress_append_paged";
  const float* fake = reinterpret_cast<const float*>(0x1000);
  dsv4::CompressorParams cp{4, 2, 64, fake};
  // host metadata: 3 sequences at 3, 7, 0 tokens appending 1, 2, 5 (entries 1, 1, 1)
  std::vector<i64> tokens = {3, 7, 0};
  std::vector<std::int32_t> cind = {0, 1, 3, 8};
  std::vector<std::int32_t> indptr = {0, 1, 2, 3}, indices = {2, 0, 1};
  struct Args {
    dsv4::PagedCompressArgs<float, bf16_t> host, dev;
  };
  const auto make = [&] {
    Args a;
    a.host.batch = a.dev.batch = 3;
    a.host.tokens = tokens.data();
    a.host.chunk_indptr = cind.data();
    a.host.entry_table = phasekv::csr_block_table(indptr.data(), indices.data(), 3);
    a.dev.tokens = reinterpret_cast<i64*>(0x3000);
    a.dev.chunk_indptr = reinterpret_cast<const std::int32_t*>(0x3100);
    a.dev.kv = fake;
    a.dev.score = fake;
    a.dev.state = reinterpret_cast<float*>(0x4000);
    auto* pages = reinterpret_cast<bf16_t*>(0x5000);
    a.dev.entry_pool = phasekv::make_page_pool<bf16_t>(pages, pages, 3, 2, 1, 64, 64);
    a.dev.entry_table = phasekv::csr_block_table(reinterpret_cast<const std::int32_t*>(0x6000),
                                                 reinterpret_cast<const std::int32_t*>(0x6100), 3);
    return a;
  };
  const auto run = [&](const Args& a, const dsv4::CompressorParams& p) {
    return expect_rejected(dsv4::cuda::compress_append_paged<float, bf16_t>(p, a.host, a.dev));
  };
  // the arguments are good (checked without a launch: the throwing form)
  {
    const Args a = make();
    EXPECT_NO_THROW(
        (dsv4::cuda::check_compress_append_paged_args<float, bf16_t>(cp, a.host, a.dev)));
  }
  dsv4::CompressorParams bp = cp;
  bp.dim = 0;
  expect_names(run(make(), bp), where, "params.dim");
  Args a = make();
  a.dev.batch = 2;
  expect_names(run(a, cp), where, "device.batch");
  a = make(), a.dev.entry_scale = 0.0f;
  expect_names(run(a, cp), where, "args.entry_scale");
  a = make(), tokens[1] = -4;
  expect_names(run(a, cp), where, "args.tokens[1]");
  tokens[1] = 7;
  a = make(), cind[2] = 0;  // sequence 1 appends -1 tokens
  expect_names(run(a, cp), where, "args.chunk_indptr[2]");
  cind[2] = 3;
  a = make(), a.dev.chunk_indptr = nullptr;
  expect_names(run(a, cp), where, "device.chunk_indptr");
  a = make(), a.dev.state = nullptr;
  expect_names(run(a, cp), where, "args.state");
  a = make(), a.dev.kv = nullptr;
  expect_names(run(a, cp), where, "args.kv");
  a = make(), a.dev.tokens = nullptr;
  expect_names(run(a, cp), where, "device.tokens");
  a = make(), indices[1] = 3;  // sequence 1's page is not a page of the pool
  expect_names(run(a, cp), where, "args.entry_table sequence 1 index 0");
  indices[1] = 0;
  a = make(), indptr[2] = 1;  // sequence 1 lists no page
  {
    const std::string m = run(a, cp);
    EXPECT_NE(m.find("args.entry_table pages of sequence 1"), std::string::npos) << m;
    EXPECT_THROW((dsv4::cuda::check_compress_append_paged_args<float, bf16_t>(cp, a.host, a.dev)),
                 phasekv::capacity_error);
  }
  indptr[2] = 2;
  a = make(), a.dev.entry_pool.d_k = 63;
  expect_names(run(a, cp), where, "args.entry_pool.d_k");
  a = make(), a.dev.entry_pool.keys = nullptr;
  expect_names(run(a, cp), where, "args.entry_pool.keys");
  a = make(), a.dev.entry_table.indptr = nullptr;
  expect_names(run(a, cp), where, "device.entry_table.batch");
  // nothing written: the host copy of tokens is never advanced
  EXPECT_EQ(tokens, (std::vector<i64>{3, 7, 0}));
  // no rows at all: accepted without a launch
  a = make();
  std::vector<std::int32_t> none = {0, 0, 0, 0};
  a.host.chunk_indptr = none.data();
  EXPECT_EQ((dsv4::cuda::compress_append_paged<float, bf16_t>(cp, a.host, a.dev)), cudaSuccess);
  a.host.batch = a.dev.batch = 0;
  EXPECT_EQ((dsv4::cuda::compress_append_paged<float, bf16_t>(cp, a.host, a.dev)), cudaSuccess);
  EXPECT_STREQ(phasekv::cuda::last_error_message(), "");
}

}  // namespace
