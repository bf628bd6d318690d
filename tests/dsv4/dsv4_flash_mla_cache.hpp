// A FlashMLA-shaped cache of random rows for the tests of flash_mla_with_kvcache (CPU and
// CUDA): bf16 (or any element type) or MODEL1 bytes, with each token's real (dequantized) values.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "dsv4_format_ref.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/dsv4/flash_mla.hpp"

namespace dsv4t {

// A cache of `blocks` blocks of P tokens in T, filled with random rows; `rows` holds each
// token's real values (dequantized), token j = block * P + offset.
template <class T>
struct Cache {
  std::int64_t blocks, P, d;
  std::vector<T> bytes;
  std::vector<float> rows;
  phasekv::dsv4::FlashMlaKvCache<T> view;
  Cache(std::int64_t blocks_, std::int64_t P_, std::int64_t d_, std::uint32_t seed)
      : blocks(blocks_), P(P_), d(d_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    rows.resize(static_cast<std::size_t>(blocks * P * d));
    for (auto& x : rows) x = nd(rng);
    if constexpr (std::is_same<T, phasekv::model1_fp8_t>::value) {
      const std::int64_t bb = phasekv::dsv4::model1_block_bytes(P);
      bytes.assign(static_cast<std::size_t>(blocks * bb), T{0});
      auto* base = reinterpret_cast<std::uint8_t*>(bytes.data());
      for (std::int64_t j = 0; j < blocks * P; ++j) {
        dsv4t::quantize_token(dsv4t::kModel1, rows.data() + j * d, base + (j / P) * bb, P, j % P,
                              0);
        const auto x = dsv4t::dequantize_token(dsv4t::kModel1, base + (j / P) * bb, P, j % P, 0);
        std::copy(x.begin(), x.end(), rows.begin() + j * d);
      }
    } else {
      bytes.resize(rows.size());
      for (std::size_t i = 0; i < rows.size(); ++i) {
        bytes[i] = phasekv::from_float<T>(rows[i]);
        rows[i] = phasekv::to_float(bytes[i]);
      }
    }
    view = phasekv::dsv4::flash_mla_kv_cache<T>(bytes.data(), blocks, P, d);
  }
};

inline std::vector<std::int32_t> random_indices(std::mt19937& rng, std::int64_t n,
                                                std::int64_t count, std::int64_t rows) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = rng() % 4 == 0 ? -1 : static_cast<std::int32_t>(rng() % rows);
  (void)count;
  return v;
}

}  // namespace dsv4t
