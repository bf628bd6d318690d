// A user-written compressor used end to end: norm-weighted pooling.
//
// Each window of W tokens becomes one entry e = sum_i w_i x_i / sum_i w_i with w_i = |x_i|^2:
// tokens with large norm (often the informative ones) dominate the entry instead of being
// diluted by 1/W as in mean pooling. The policy is ~30 lines: geometry, dimensions and a
// compress() written once as PHASEKV_HOST_DEVICE code.
//
// The program hides a "needle" (a key with a large norm and a distinctive value) in a sequence
// of random tokens, compresses the sequence through phasekv::CompressedCache with the custom
// policy and with UniformMean, and runs the reference attention over cache.visible() for a
// query aimed at the needle. It prints how much of the needle's value each cache recovers.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "phasekv/phasekv.hpp"

// ---- The custom compressor -------------------------------------------------------------
struct NormWeightedPool {
  phasekv::Geometry geom;  // the windows (W, S, O)
  std::int64_t dim = 1;    // channels in and out

  PHASEKV_HOST_DEVICE phasekv::Geometry geometry() const { return geom; }
  PHASEKV_HOST_DEVICE std::int64_t input_dim() const { return dim; }
  PHASEKV_HOST_DEVICE std::int64_t output_dim() const { return dim; }

  // x(i, c): channel c of the token at in-window offset i, as float. All arithmetic goes
  // through phasekv::detail::fp_* so the bits are the same on every compiler and on CUDA.
  template <class Load>
  PHASEKV_HOST_DEVICE void compress(std::int64_t /*kv_head*/, const Load& x, float* out) const {
    namespace d = phasekv::detail;
    float total = 0.0f;
    for (std::int64_t c = 0; c < dim; ++c) out[c] = 0.0f;
    for (std::int64_t i = 0; i < geom.window(); ++i) {
      float w = 0.0f;  // |x_i|^2
      for (std::int64_t c = 0; c < dim; ++c) w = d::fp_fma(x(i, c), x(i, c), w);
      total = d::fp_add(total, w);
      for (std::int64_t c = 0; c < dim; ++c) out[c] = d::fp_fma(w, x(i, c), out[c]);
    }
    for (std::int64_t c = 0; c < dim; ++c) out[c] = total > 0.0f ? d::fp_div(out[c], total) : 0.0f;
  }
};
static_assert(phasekv::check_policy<NormWeightedPool>(), "NormWeightedPool is a policy");

// ---- Helpers for the demonstration -----------------------------------------------------
using T = phasekv::bf16_t;  // cache storage type; compression runs in f32

double cosine(const double* a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    ab += a[i] * b[i];
    aa += a[i] * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

// Attention output of query head 0 over `kv`, and its cosine with the needle value.
double needle_recall(const phasekv::VisibleKV<T>& kv, const std::vector<float>& q,
                     std::int64_t q_heads, const std::vector<float>& needle_value, std::int64_t d) {
  phasekv::StandardVariant variant;
  variant.scale = phasekv::default_scale(d);
  std::vector<double> out(static_cast<std::size_t>(q_heads * d)),
      lse(static_cast<std::size_t>(q_heads));
  phasekv::reference_decode<T>(q.data(), q_heads, kv, variant, out.data(), lse.data());
  return cosine(out.data(), needle_value);
}

int main() {
  const std::int64_t n = 1024, kv_heads = 2, q_heads = 4, d = 64, local = 16;
  const std::int64_t needle = 437;        // position of the needle token
  const phasekv::Geometry geom(8, 8, 4);  // W = S = 8, 4 prefix tokens kept raw (sinks)

  // Random keys and values in [-1, 1); the needle key is 3x longer than a typical key.
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<T> keys(static_cast<std::size_t>(n * kv_heads * d)), values(keys.size());
  std::vector<float> needle_key(static_cast<std::size_t>(d)),
      needle_value(static_cast<std::size_t>(d));
  for (auto& v : needle_key) v = 3.0f * u(rng);
  for (auto& v : needle_value) v = u(rng);
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t h = 0; h < kv_heads; ++h)
      for (std::int64_t c = 0; c < d; ++c) {
        const std::size_t at = static_cast<std::size_t>((t * kv_heads + h) * d + c);
        const bool is_needle = t == needle && h == 0;
        keys[at] =
            phasekv::from_float<T>(is_needle ? needle_key[static_cast<std::size_t>(c)] : u(rng));
        values[at] =
            phasekv::from_float<T>(is_needle ? needle_value[static_cast<std::size_t>(c)] : u(rng));
      }
  const auto k_view = phasekv::make_view<const T>(keys.data(), n, kv_heads, d);
  const auto v_view = phasekv::make_view<const T>(values.data(), n, kv_heads, d);

  // The query (head 0 reads KV head 0) points at the needle key.
  std::vector<float> q(static_cast<std::size_t>(q_heads * d));
  for (std::int64_t c = 0; c < d; ++c)
    q[static_cast<std::size_t>(c)] = 0.5f * needle_key[static_cast<std::size_t>(c)];

  // Full attention over every raw token, for comparison.
  phasekv::VisibleKV<T> full;
  full.push({k_view, v_view, 0, phasekv::SegmentKind::raw});

  // The same sequence through two compressed caches, streamed in chunks of 100 tokens.
  const NormWeightedPool norm_pool{geom, d};
  phasekv::CompressedCache<T, NormWeightedPool> norm_cache(norm_pool, norm_pool, kv_heads, d, d,
                                                           local, n);
  const phasekv::UniformMean mean_pool(geom, d);
  phasekv::CompressedCache<T, phasekv::UniformMean> mean_cache(mean_pool, mean_pool, kv_heads, d, d,
                                                               local, n);
  for (std::int64_t p = 0; p < n; p += 100) {
    const std::int64_t count = p + 100 <= n ? 100 : n - p;
    norm_cache.append(k_view.slice(p, count), v_view.slice(p, count));
    mean_cache.append(k_view.slice(p, count), v_view.slice(p, count));
  }

  const double r_full = needle_recall(full, q, q_heads, needle_value, d);
  const double r_norm = needle_recall(norm_cache.visible(), q, q_heads, needle_value, d);
  const double r_mean = needle_recall(mean_cache.visible(), q, q_heads, needle_value, d);
  std::printf("n = %lld tokens, W = S = %lld, O = %lld, L = %lld, %lld KV heads, d = %lld, bf16\n",
              static_cast<long long>(n), static_cast<long long>(geom.window()),
              static_cast<long long>(geom.origin()), static_cast<long long>(local),
              static_cast<long long>(kv_heads), static_cast<long long>(d));
  std::printf("attended items: full %lld, compressed %lld (memory ratio %.3f)\n",
              static_cast<long long>(full.total()),
              static_cast<long long>(norm_cache.visible().total()), norm_cache.memory_ratio());
  std::printf("cosine(attention output, needle value), needle at position %lld (phase %lld):\n",
              static_cast<long long>(needle), static_cast<long long>(geom.phase(needle)));
  std::printf("  full attention          %.3f\n", r_full);
  std::printf("  norm-weighted pooling   %.3f\n", r_norm);
  std::printf("  uniform mean pooling    %.3f\n", r_mean);
  const bool ok = std::isfinite(r_full) && std::isfinite(r_norm) && std::isfinite(r_mean);
  return ok ? 0 : 1;
}
