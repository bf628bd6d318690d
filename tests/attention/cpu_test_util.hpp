// Helpers shared by the CPU attention tests: random K/V buffers, the error metric.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "phasekv/attention/reference.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/view.hpp"

namespace pkt {

// True when this translation unit's phasekv::isa_namespace() holds the extension `piece`
// (e.g. "_avx2"; pieces are whole words between underscores, so "_avx" does not match
// "_avx2"). Internal linkage: an inline function would be merged across translation units,
// and the answer belongs to the one that calls it.
static inline bool isa_namespace_has(const char* piece) {
  const std::string ns = std::string(phasekv::isa_namespace()) + "_";
  return ns.find(std::string(piece) + "_") != std::string::npos;
}

// Relative tolerance of the kernels per storage type (the bounds).
template <class T>
constexpr double tolerance() {
  return std::is_same<T, float>::value ? 1e-5 : 1e-2;
}

// Random values stored as T. mean/sd of a normal distribution.
template <class T>
std::vector<T> random_values(std::size_t count, std::uint32_t seed, float mean = 0.0f,
                             float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(mean, sd);
  std::vector<T> v(count);
  for (auto& x : v) x = phasekv::from_float<T>(dist(rng));
  return v;
}

inline std::vector<float> random_floats(std::size_t count, std::uint32_t seed, float sd = 1.0f) {
  return random_values<float>(count, seed, 0.0f, sd);
}

// Error of an output [rows, d] against a double reference:
// per row, max_i |out - ref| / max_i |ref| (max_i |out - ref| when the reference row is all 0).
struct ErrorStats {
  double max_rel = 0.0;   // worst row
  double mean_rel = 0.0;  // mean over rows
  double max_lse = 0.0;   // max |lse - ref| / max(1, |ref|)
  bool finite = true;     // every output finite
};

inline ErrorStats compare(const float* out, const float* lse, const double* ref,
                          const double* ref_lse, std::int64_t rows, std::int64_t d) {
  ErrorStats e;
  for (std::int64_t r = 0; r < rows; ++r) {
    double err = 0.0, mag = 0.0;
    for (std::int64_t i = 0; i < d; ++i) {
      const double o = out[r * d + i];
      if (!std::isfinite(o)) e.finite = false;
      err = std::max(err, std::abs(o - ref[r * d + i]));
      mag = std::max(mag, std::abs(ref[r * d + i]));
    }
    const double rel = mag > 0.0 ? err / mag : err;
    e.max_rel = std::max(e.max_rel, rel);
    e.mean_rel += rel / static_cast<double>(rows);
    if (std::isinf(ref_lse[r]) || std::isinf(lse[r])) {
      if (!(std::isinf(lse[r]) && std::isinf(ref_lse[r]) && (lse[r] < 0) == (ref_lse[r] < 0)))
        e.max_lse = INFINITY;
    } else {
      if (!std::isfinite(lse[r])) e.finite = false;
      e.max_lse =
          std::max(e.max_lse, std::abs(lse[r] - ref_lse[r]) / std::max(1.0, std::abs(ref_lse[r])));
    }
  }
  return e;
}

}  // namespace pkt
