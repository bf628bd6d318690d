// Shared helpers for the compress tests: random data, element conversion, poisoning and
// random geometries.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <limits>
#include <random>
#include <vector>

#include "phasekv/core/element.hpp"
#include "phasekv/core/view.hpp"
#include "phasekv/phase/geometry.hpp"

namespace pkv_test {

using i64 = std::int64_t;

// Random float in [lo, hi).
inline float uniform(std::mt19937_64& rng, float lo = -1.0f, float hi = 1.0f) {
  return std::uniform_real_distribution<float>(lo, hi)(rng);
}

inline i64 rand_int(std::mt19937_64& rng, i64 lo, i64 hi) {  // inclusive
  return std::uniform_int_distribution<i64>(lo, hi)(rng);
}

// A dense [tokens, heads, dim] tensor of element type T with random values in [-1, 1)
// (rounded to T), in NHD or HND layout.
template <class T>
struct Tensor {
  std::vector<T> data;
  i64 tokens = 0, heads = 0, dim = 0;
  phasekv::Layout layout = phasekv::Layout::NHD;

  Tensor() = default;
  Tensor(i64 t, i64 h, i64 d, phasekv::Layout l = phasekv::Layout::NHD)
      : data(static_cast<std::size_t>(t * h * d)), tokens(t), heads(h), dim(d), layout(l) {}

  void randomize(std::mt19937_64& rng, float lo = -1.0f, float hi = 1.0f) {
    for (auto& x : data) x = phasekv::from_float<T>(uniform(rng, lo, hi));
  }
  void poison() {  // 0xFF bytes: NaN in every element type
    if (data.empty()) return;
    std::memset(static_cast<void*>(data.data()), 0xff, data.size() * sizeof(T));
  }
  phasekv::StridedView<T> view() {
    return phasekv::make_view(data.data(), tokens, heads, dim, layout);
  }
  phasekv::StridedView<const T> cview() const {
    return phasekv::make_view<const T>(data.data(), tokens, heads, dim, layout);
  }
  double at(i64 t, i64 h, i64 c) const {
    return static_cast<double>(phasekv::to_float(cview()(t, h, c)));
  }
};

inline bool is_poison_bytes(const void* p, std::size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i)
    if (b[i] != 0xff) return false;
  return true;
}

// A random geometry with W, S in [1, max_ws] and O in [0, max_o]; cycles through gap,
// tiling and overlapping shapes by `kind` (0: W < S, 1: W == S, 2: W > S, else any).
inline phasekv::Geometry random_geometry(std::mt19937_64& rng, int kind, i64 max_ws = 12,
                                         i64 max_o = 6) {
  const i64 o = rand_int(rng, 0, max_o);
  for (;;) {
    const i64 w = rand_int(rng, 1, max_ws), s = rand_int(rng, 1, max_ws);
    if ((kind == 0 && w < s) || (kind == 1 && w == s) || (kind == 2 && w > s) || kind > 2)
      return phasekv::Geometry(w, s, o);
  }
}

}  // namespace pkv_test

namespace pkv_test {
inline std::string fmt_g(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", x);
  return buf;
}
}  // namespace pkv_test
