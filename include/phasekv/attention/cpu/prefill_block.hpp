/// @file
/// @brief The prefill inner kernels, written once over `Vec<Arch>`: packing of a key/value
/// block to f32, a register-tiled Q.K^T micro-kernel over packed rows, and a register-tiled
/// P.V micro-kernel (rows x value columns) with the online-softmax rescale fused in.
#pragma once

#include <cstdint>
#include <type_traits>

#include "phasekv/attention/cpu/arch.hpp"
#include "phasekv/attention/cpu/vec.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"

namespace phasekv {
namespace cpu {
namespace detail {

/// Keys per prefill block.
constexpr int kPrefillKeys = 64;
/// Query rows per P.V register tile.
constexpr int kPvRows = 6;
/// Query rows per Q.K register tile.
constexpr int kQkRows = 4;

/// Rounds `x` up to a multiple of `m`.
inline std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

/// Converts `n` elements to float into `dst` and zero-fills up to `padded`.
template <class Arch, class T>
PHASEKV_FORCEINLINE void pack_row(const T* src, std::int64_t n, std::int64_t padded, float* dst) {
  using O = Vec<Arch>;
  constexpr int W = O::W;
  std::int64_t i = 0;
  for (; i + W <= n; i += W) O::store(dst + i, O::load(src + i));
  for (; i < n; ++i) dst[i] = to_float(src[i]);
  for (; i < padded; ++i) dst[i] = 0.0f;
}

/// s[r * ld + k] = <q_r, k_k> for MR packed query rows (stride `dkp`) and NT packed key rows.
template <class Arch, int MR, int NT, int D>
PHASEKV_FORCEINLINE void qk_micro(const float* q, const float* k, std::int64_t dkp, float* s,
                                  std::int64_t ld) {
  using O = Vec<Arch>;
  using V = typename O::V;
  constexpr int W = O::W;
  const std::int64_t dd = D > 0 ? D : dkp;
  V acc[MR * NT];
  PHASEKV_CPU_UNROLL
  for (int a = 0; a < MR * NT; ++a) acc[a] = O::zero();
  for (std::int64_t i = 0; i < dd; i += W) {
    V kv[NT];
    PHASEKV_CPU_UNROLL
    for (int t = 0; t < NT; ++t) kv[t] = O::load(k + t * dkp + i);
    PHASEKV_CPU_UNROLL
    for (int r = 0; r < MR; ++r) {
      const V qv = O::load(q + r * dkp + i);
      PHASEKV_CPU_UNROLL
      for (int t = 0; t < NT; ++t) acc[r * NT + t] = O::fma(qv, kv[t], acc[r * NT + t]);
    }
  }
  float out[MR * NT];
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  if constexpr (std::is_same<Arch, arch::Avx2>::value && MR * NT == 8) {
    O::store(out, O::hsum8(acc));
  } else
#endif
  {
    PHASEKV_CPU_UNROLL
    for (int a = 0; a < MR * NT; ++a) out[a] = O::hsum(acc[a]);
  }
  PHASEKV_CPU_UNROLL
  for (int r = 0; r < MR; ++r)
    PHASEKV_CPU_UNROLL
    for (int t = 0; t < NT; ++t) s[r * ld + t] = out[r * NT + t];
}

/// S = Qp . Kp^T for `rows` packed query rows and `keys` (even, <= ld) packed key rows.
template <class Arch, int D>
void qk_block(const float* qp, std::int64_t rows, const float* kp, std::int64_t keys,
              std::int64_t dkp, float* s, std::int64_t ld) {
  constexpr int NT = 2;
  std::int64_t r = 0;
  for (; r + kQkRows <= rows; r += kQkRows)
    for (std::int64_t k = 0; k < keys; k += NT)
      qk_micro<Arch, kQkRows, NT, D>(qp + r * dkp, kp + k * dkp, dkp, s + r * ld + k, ld);
  for (; r < rows; ++r)
    for (std::int64_t k = 0; k < keys; k += NT)
      qk_micro<Arch, 1, NT, D>(qp + r * dkp, kp + k * dkp, dkp, s + r * ld + k, ld);
}

/// Dispatches qk_block on the padded key dim (fast paths 64, 128, 256).
template <class Arch>
void qk_block_d(const float* qp, std::int64_t rows, const float* kp, std::int64_t keys,
                std::int64_t dkp, float* s, std::int64_t ld) {
  switch (dkp) {
    case 64: qk_block<Arch, 64>(qp, rows, kp, keys, dkp, s, ld); break;
    case 128: qk_block<Arch, 128>(qp, rows, kp, keys, dkp, s, ld); break;
    case 256: qk_block<Arch, 256>(qp, rows, kp, keys, dkp, s, ld); break;
    default: qk_block<Arch, 0>(qp, rows, kp, keys, dkp, s, ld); break;
  }
}

/// o[r] = corr[r] * o[r] + sum_k p[r * ld + k] * v[k] for MR rows over `keys` packed value
/// rows (stride `dvp`), all `dvp` columns (a multiple of 2 * W).
template <class Arch, int MR>
PHASEKV_FORCEINLINE void pv_micro(const float* p, std::int64_t ld, const float* v,
                                  std::int64_t keys, std::int64_t dvp, float* o,
                                  const float* corr) {
  using O = Vec<Arch>;
  using V = typename O::V;
  constexpr int W = O::W;
  constexpr int C = 2;
  V cr[MR];
  PHASEKV_CPU_UNROLL
  for (int r = 0; r < MR; ++r) cr[r] = O::set1(corr[r]);
  for (std::int64_t c0 = 0; c0 < dvp; c0 += C * W) {
    V a[MR * C];
    PHASEKV_CPU_UNROLL
    for (int r = 0; r < MR; ++r)
      PHASEKV_CPU_UNROLL
      for (int c = 0; c < C; ++c) a[r * C + c] = O::mul(O::load(o + r * dvp + c0 + c * W), cr[r]);
    for (std::int64_t k = 0; k < keys; ++k) {
      V x[C];
      PHASEKV_CPU_UNROLL
      for (int c = 0; c < C; ++c) x[c] = O::load(v + k * dvp + c0 + c * W);
      PHASEKV_CPU_UNROLL
      for (int r = 0; r < MR; ++r) {
        const V w = O::set1(p[r * ld + k]);
        PHASEKV_CPU_UNROLL
        for (int c = 0; c < C; ++c) a[r * C + c] = O::fma(w, x[c], a[r * C + c]);
      }
    }
    PHASEKV_CPU_UNROLL
    for (int r = 0; r < MR; ++r)
      PHASEKV_CPU_UNROLL
      for (int c = 0; c < C; ++c) O::store(o + r * dvp + c0 + c * W, a[r * C + c]);
  }
}

/// P.V for `rows` rows (tiles of kPvRows, then the remainder).
template <class Arch>
void pv_block(const float* p, std::int64_t rows, std::int64_t ld, const float* v,
              std::int64_t keys, std::int64_t dvp, float* o, const float* corr) {
  std::int64_t r = 0;
  for (; r + kPvRows <= rows; r += kPvRows)
    pv_micro<Arch, kPvRows>(p + r * ld, ld, v, keys, dvp, o + r * dvp, corr + r);
  switch (rows - r) {
    case 5: pv_micro<Arch, 5>(p + r * ld, ld, v, keys, dvp, o + r * dvp, corr + r); break;
    case 4: pv_micro<Arch, 4>(p + r * ld, ld, v, keys, dvp, o + r * dvp, corr + r); break;
    case 3: pv_micro<Arch, 3>(p + r * ld, ld, v, keys, dvp, o + r * dvp, corr + r); break;
    case 2: pv_micro<Arch, 2>(p + r * ld, ld, v, keys, dvp, o + r * dvp, corr + r); break;
    case 1: pv_micro<Arch, 1>(p + r * ld, ld, v, keys, dvp, o + r * dvp, corr + r); break;
    default: break;
  }
}

}  // namespace detail
}  // namespace cpu
}  // namespace phasekv
