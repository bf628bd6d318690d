// phasekv::row_kernels is a specialization point: a policy author's specialization is what
// compress_batch and CompressedCache::append call (window by window, with the bits of the
// generic path), the primary template says "generic" (fast = false), and the built-in
// policies are found through the same trait.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "compress_test_util.hpp"
#include "phasekv/compress/compress_batch.hpp"
#include "phasekv/compress/compressed_cache.hpp"
#include "phasekv/compress/float_ops.hpp"
#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/compress/uniform_mean.hpp"

namespace {

using pkv_test::i64;

// docs/writing_a_compressor.md's example: e = sum_i |x_i|^2 x_i / sum_i |x_i|^2.
struct NormWeightedPool {
  phasekv::Geometry geom;
  i64 dim = 1;
  phasekv::Geometry geometry() const { return geom; }
  i64 input_dim() const { return dim; }
  i64 output_dim() const { return dim; }
  template <class Load>
  void compress(i64, const Load& x, float* out) const {
    float total = 0.0f;
    for (i64 c = 0; c < dim; ++c) out[c] = 0.0f;
    for (i64 i = 0; i < geom.window(); ++i) {
      float w = 0.0f;
      for (i64 c = 0; c < dim; ++c) w = phasekv::fp_fma(x(i, c), x(i, c), w);
      total = phasekv::fp_add(total, w);
      for (i64 c = 0; c < dim; ++c) out[c] = phasekv::fp_fma(w, x(i, c), out[c]);
    }
    for (i64 c = 0; c < dim; ++c) out[c] = total > 0.0f ? phasekv::fp_div(out[c], total) : 0.0f;
  }
};

// The same policy under another name, without a specialization: the generic path.
struct NormWeightedGeneric : NormWeightedPool {};

int g_window_calls = 0;  // windows the specialization below computed

}  // namespace

// The documentation's specialization (plus a call counter), at namespace scope.
template <class Arch>
struct phasekv::row_kernels<NormWeightedPool, Arch> {
  static constexpr bool fast = true;
  template <class T>
  static bool window(const NormWeightedPool& p, std::int64_t, const T* rows,
                     std::int64_t token_stride, float* out) {
    ++g_window_calls;
    float total = 0.0f;
    for (std::int64_t c = 0; c < p.dim; ++c) out[c] = 0.0f;
    for (std::int64_t i = 0; i < p.geom.window(); ++i) {
      const T* x = rows + i * token_stride;
      float w = 0.0f;
      for (std::int64_t c = 0; c < p.dim; ++c)
        w = phasekv::fp_fma(phasekv::to_float(x[c]), phasekv::to_float(x[c]), w);
      total = phasekv::fp_add(total, w);
      for (std::int64_t c = 0; c < p.dim; ++c)
        out[c] = phasekv::fp_fma(w, phasekv::to_float(x[c]), out[c]);
    }
    for (std::int64_t c = 0; c < p.dim; ++c)
      out[c] = total > 0.0f ? phasekv::fp_div(out[c], total) : 0.0f;
    return true;
  }
};

namespace {

static_assert(!phasekv::row_kernels<NormWeightedGeneric>::fast, "the primary template is generic");
static_assert(phasekv::row_kernels<NormWeightedPool>::fast, "the user's specialization");
static_assert(phasekv::row_kernels<phasekv::UniformMean>::fast &&
                  phasekv::row_kernels<phasekv::GatedPool>::fast,
              "the built-in policies specialize the trait");
static_assert(
    phasekv::detail::has_compress_rows<NormWeightedPool, phasekv::bf16_t>::value &&
        !phasekv::detail::has_compress_rows<NormWeightedGeneric, phasekv::bf16_t>::value &&
        !phasekv::detail::has_compress_rows2<NormWeightedPool, float>::value &&
        !phasekv::detail::has_compress_rows_run<NormWeightedPool, float>::value,
    "only the members a specialization has are used");

// compress_batch and a streaming cache (chunks of random sizes) call the specialization for
// every window, and give the bits of the generic path.
template <class T>
void check_user_fast_path(const phasekv::Geometry& g, i64 heads, i64 dim, i64 n, unsigned seed) {
  std::mt19937_64 rng(seed);
  pkv_test::Tensor<T> raw(n, heads, dim);
  raw.randomize(rng);
  const NormWeightedPool fast{g, dim};
  const NormWeightedGeneric generic{{g, dim}};
  const i64 j = g.complete_windows(n);
  std::vector<T> a(static_cast<std::size_t>(j * heads * dim)), b(a.size());
  std::memset(a.data(), 0xA5, a.size() * sizeof(T));
  std::memset(b.data(), 0x5A, b.size() * sizeof(T));
  g_window_calls = 0;
  phasekv::compress_batch<T>(fast, raw.cview(), phasekv::make_view<T>(a.data(), j, heads, dim));
  EXPECT_EQ(g_window_calls, j * heads);
  phasekv::compress_batch<T>(generic, raw.cview(), phasekv::make_view<T>(b.data(), j, heads, dim));
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(T)), 0);

  phasekv::CompressedCache<T, NormWeightedPool> cache(fast, fast, heads, dim, dim, 4, n);
  g_window_calls = 0;
  for (i64 p = 0; p < n;) {
    const i64 t = std::min<i64>(n - p, pkv_test::rand_int(rng, 1, 3 * g.window()));
    cache.append(raw.cview().slice(p, t), raw.cview().slice(p, t));
    p += t;
  }
  // every window of keys and of values (windows of up to 2^16 elements that begin before a
  // chunk are gathered and take the fast path too)
  EXPECT_EQ(g_window_calls, 2 * j * heads);
  const auto keys = cache.entry_keys();
  for (i64 e = 0; e < j; ++e)
    for (i64 h = 0; h < heads; ++h)
      EXPECT_EQ(std::memcmp(keys.ptr(e, h), b.data() + (e * heads + h) * dim, dim * sizeof(T)), 0)
          << "entry " << e << " head " << h;
}

TEST(RowKernels, UserSpecializationIsCalledWithTheGenericBits) {
  check_user_fast_path<float>(phasekv::Geometry(8, 4), 3, 37, 203, 1);
  check_user_fast_path<phasekv::bf16_t>(phasekv::Geometry(4, 2, 3), 2, 64, 150, 2);
  check_user_fast_path<phasekv::f16_t>(phasekv::Geometry(5, 7, 1), 1, 19, 99, 3);
}

// Windows that begin before a chunk are gathered into one buffer of W * max(d_k, d_v) elements
// when that is at most 2^16, and read in place otherwise: with d_k != d_v and a window between
// the two limits (W = 600: keys 600 x 64 fit, values 600 x 128 do not) the keys must still
// take the in-place path (the buffer is not allocated), and both must equal compress_batch.
TEST(RowKernels, StreamingWithLargeWindowsAndUnequalDimsEqualsBatch) {
  const phasekv::Geometry g(600, 500, 5);
  const i64 n = 2300, dk = 64, dv = 128;
  std::mt19937_64 rng(7);
  pkv_test::Tensor<float> k(n, 1, dk), v(n, 1, dv);
  k.randomize(rng);
  v.randomize(rng);
  const phasekv::UniformMean mk(g, dk), mv(g, dv);
  const i64 j = g.complete_windows(n);
  ASSERT_EQ(j, 4);
  std::vector<float> ek(static_cast<std::size_t>(j * dk)), ev(static_cast<std::size_t>(j * dv));
  phasekv::compress_batch<float>(mk, k.cview(), phasekv::make_view<float>(ek.data(), j, 1, dk));
  phasekv::compress_batch<float>(mv, v.cview(), phasekv::make_view<float>(ev.data(), j, 1, dv));
  phasekv::CompressedCache<float, phasekv::UniformMean> cache(mk, mv, 1, dk, dv, 0, n);
  for (i64 p = 0; p < n; p += 7) {
    const i64 t = std::min<i64>(7, n - p);
    cache.append(k.cview().slice(p, t), v.cview().slice(p, t));
  }
  EXPECT_EQ(std::memcmp(cache.entry_keys().ptr(0, 0), ek.data(), ek.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(cache.entry_values().ptr(0, 0), ev.data(), ev.size() * sizeof(float)), 0);
}

}  // namespace
