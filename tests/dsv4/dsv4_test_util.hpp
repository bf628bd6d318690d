// Helpers shared by the DeepSeek-V4 tests: random rows stored as T, float64 references written
// from the formulas of docs/deepseek_v4.md (never by calling the kernels).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "phasekv/core/element.hpp"
#include "phasekv/dsv4/fp8.hpp"

namespace dsv4t {

// One query's list of `k` index slots into `visible` entries: a fifth of the slots stay -1, the
// rest take distinct visible entries in random order (`slots` is filled with -1 first).
inline void random_index_list(std::mt19937& rng, std::int64_t visible, std::int64_t k,
                              std::int32_t* slots) {
  std::vector<std::int32_t> perm(static_cast<std::size_t>(visible));
  for (std::int64_t j = 0; j < visible; ++j)
    perm[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(j);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (std::int64_t s = 0; s < k; ++s) slots[s] = -1;
  std::int64_t used = 0;
  for (std::int64_t s = 0; s < k && used < visible; ++s)
    if (rng() % 5 != 0) slots[s] = perm[static_cast<std::size_t>(used++)];
}

template <class T>
std::vector<T> random_values(std::size_t count, std::uint32_t seed, float sd = 1.0f,
                             float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(mean, sd);
  std::vector<T> v(count);
  for (auto& x : v) x = phasekv::from_float<T>(dist(rng));
  return v;
}

template <class T>
double val(const T& x) {
  return static_cast<double>(phasekv::to_float(x));
}

// Float64 reference of the DeepSeek-V4 compressor: entry j, channel c pools the tokens of
// blocks j - coff + 1 .. j (half h = block - (j - coff + 1)) through channel h*d + c:
// z = score + ape[p mod S], softmax over the window per channel, weighted sum of kv.
template <class T>
std::vector<double> reference_compress(std::int64_t S, std::int64_t coff, std::int64_t d,
                                       const std::vector<float>& ape, const std::vector<T>& kv,
                                       const std::vector<T>& score, std::int64_t n) {
  const std::int64_t J = n / S, rw = coff * d;
  std::vector<double> out(static_cast<std::size_t>(J * d));
  for (std::int64_t j = 0; j < J; ++j) {
    for (std::int64_t c = 0; c < d; ++c) {
      std::vector<double> z, v;
      for (std::int64_t h = 0; h < coff; ++h) {
        const std::int64_t b = j - coff + 1 + h;
        if (b < 0) continue;
        for (std::int64_t p = b * S; p < (b + 1) * S; ++p) {
          const std::size_t idx = static_cast<std::size_t>(p * rw + h * d + c);
          z.push_back(val(score[idx]) +
                      static_cast<double>(ape[static_cast<std::size_t>((p % S) * rw + h * d + c)]));
          v.push_back(val(kv[idx]));
        }
      }
      const double m = *std::max_element(z.begin(), z.end());
      double den = 0.0, acc = 0.0;
      for (std::size_t i = 0; i < z.size(); ++i) {
        const double w = std::exp(z[i] - m);
        den += w;
        acc += w * v[i];
      }
      out[static_cast<std::size_t>(j * d + c)] = acc / den;
    }
  }
  return out;
}

}  // namespace dsv4t
