/// @file
/// @brief Deterministic random draws for the evaluation harness: Rng (splitmix64 with portable
/// uniform and normal draws) and Embeddings (a table of random unit vectors with nearest-vector
/// decoding), so that fixed seeds give the same experiments with every standard library.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace eval {

/// Small deterministic random generator (splitmix64) with portable uniform and normal draws,
/// so that fixed seeds give the same experiments with every standard library.
class Rng {
 public:
  /// Seeds the generator.
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  /// Next 64 random bits.
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Uniform double in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Uniform integer in `[0, n)` (n >= 1; rejection sampling, unbiased).
  std::int64_t below(std::int64_t n) {
    const std::uint64_t un = static_cast<std::uint64_t>(n);
    const std::uint64_t limit = (~std::uint64_t{0}) - (~std::uint64_t{0}) % un;
    std::uint64_t x = next();
    while (x >= limit) x = next();
    return static_cast<std::int64_t>(x % un);
  }
  /// Standard normal draw (Box-Muller).
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u = uniform();
    while (u <= 0.0) u = uniform();
    const double v = uniform();
    const double r = std::sqrt(-2.0 * std::log(u));
    const double two_pi = 6.283185307179586;
    spare_ = r * std::sin(two_pi * v);
    has_spare_ = true;
    return r * std::cos(two_pi * v);
  }

 private:
  std::uint64_t state_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

/// A table of `vocab` random unit vectors in R^dim (Gaussian directions, so nearly
/// equiangular: pairwise cosines are about N(0, 1/dim)).
class Embeddings {
 public:
  /// Draws the table; throws phasekv::invalid_argument for `vocab < 2` or `dim < 1`.
  Embeddings(std::int64_t vocab, std::int64_t dim, std::uint64_t seed) : vocab_(vocab), dim_(dim) {
    phasekv::detail::check_arg(vocab >= 2, "phasekv::eval::Embeddings", "vocab", vocab,
                               "must be >= 2");
    phasekv::detail::check_arg(dim >= 1, "phasekv::eval::Embeddings", "dim", dim, "must be >= 1");
    Rng rng(seed);
    table_.resize(static_cast<std::size_t>(vocab * dim));
    for (std::int64_t t = 0; t < vocab; ++t) {
      double norm = 0.0;
      std::vector<double> v(static_cast<std::size_t>(dim));
      for (double& x : v) {
        x = rng.normal();
        norm += x * x;
      }
      norm = std::sqrt(norm);
      for (std::int64_t i = 0; i < dim; ++i)
        table_[static_cast<std::size_t>(t * dim + i)] =
            static_cast<float>(v[static_cast<std::size_t>(i)] / norm);
    }
  }
  /// Vocabulary size N.
  std::int64_t vocab() const { return vocab_; }
  /// Dimension d.
  std::int64_t dim() const { return dim_; }
  /// The unit vector of `token`.
  const float* operator[](std::int64_t token) const {
    return table_.data() + static_cast<std::size_t>(token * dim_);
  }
  /// The token y maximizing `<o, E(y)>` (the smallest on ties); `o` has dim() entries.
  std::int64_t argmax(const double* o) const {
    std::int64_t best = 0;
    double best_s = -std::numeric_limits<double>::infinity();
    for (std::int64_t y = 0; y < vocab_; ++y) {
      const float* e = (*this)[y];
      double s = 0.0;
      for (std::int64_t i = 0; i < dim_; ++i) s += o[i] * static_cast<double>(e[i]);
      if (s > best_s) {
        best_s = s;
        best = y;
      }
    }
    return best;
  }

 private:
  std::int64_t vocab_, dim_;
  std::vector<float> table_;
};

}  // namespace eval
PHASEKV_NAMESPACE_END
