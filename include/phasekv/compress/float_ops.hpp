/// @file
/// @brief Deterministic float arithmetic for compressor policies (phasekv::fp_add, fp_sub,
/// fp_mul, fp_div, fp_fma, fp_max, fp_floor, fp_exp, fp_dot): the same inputs give the same
/// bits on every host compiler and on CUDA devices.
///
/// Two things can make the "same" float expression round differently across platforms:
/// fused multiply-add contraction (nvcc fuses by default, GCC with `-ffp-contract=fast` and
/// FMA hardware fuses across statements) and the math library (`expf` differs between glibc
/// and CUDA). Policy code therefore follows two rules, which these helpers make easy:
///
/// - every product that feeds a sum is written as an explicit fused multiply-add
///   (phasekv::fp_fma), so there is nothing left for a compiler to contract;
/// - the exponential is phasekv::fp_exp, written here with fused multiply-adds and integer
///   exponent arithmetic only (no library call, no contractible product).
///
/// A policy's compress() written with these functions gives the same bits on the CPU and on
/// CUDA, in compress_batch and in a streaming CompressedCache; a CPU fast path
/// (phasekv::row_kernels) must give the same bits as that code. The bit casts fp_bits and
/// fp_from_bits are in core/element.hpp. The names under phasekv::detail are kept for older
/// code.
///
/// On the device, additions, multiplications and divisions use the `__f*_rn` intrinsics,
/// which nvcc never contracts or approximates (even under `--use_fast_math`).
#pragma once

#include <cmath>
#include <cstdint>

#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"

PHASEKV_NAMESPACE_BEGIN

/// a + b, correctly rounded, never contracted.
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE float fp_add(float a, float b) {
#if PHASEKV_IS_DEVICE_CODE
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

/// a - b, correctly rounded, never contracted.
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE float fp_sub(float a, float b) {
#if PHASEKV_IS_DEVICE_CODE
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

/// a * b, correctly rounded. Only use where the product does not feed an addition.
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE float fp_mul(float a, float b) {
#if PHASEKV_IS_DEVICE_CODE
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

/// a / b, correctly rounded (IEEE division on host and device).
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE float fp_div(float a, float b) {
#if PHASEKV_IS_DEVICE_CODE
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

/// a * b + c with a single rounding (IEEE fused multiply-add).
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE float fp_fma(float a, float b, float c) {
#if PHASEKV_IS_DEVICE_CODE
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

/// Largest of a and b; a NaN in either argument gives NaN (NaN propagates through a max).
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE float fp_max(float a, float b) {
  if (a != a) return a;
  if (b != b) return b;
  return b > a ? b : a;
}

/// floor(x), exact.
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE float fp_floor(float x) {
#if PHASEKV_IS_DEVICE_CODE
  return floorf(x);
#else
  return std::floor(x);
#endif
}

namespace detail {
/// The constants of fp_exp (and of its vector twin exp16 in compress/cpu/gated_rows.inl,
/// which must use the same).
namespace exp_consts {
constexpr float kOverflow = 88.72283935546875f;   ///< above: +inf
constexpr float kUnderflow = -87.3365478515625f;  ///< below: 0 (flushed)
constexpr float kLog2e = 1.44269502162933349609375f;
constexpr float kLn2Hi = -0.693145751953125f;         ///< -ln2, high part (exact products)
constexpr float kLn2Lo = -1.428606765330187045e-06f;  ///< -ln2, low part
/// Taylor coefficients of e^r: kC7 = 1/5040 down to kC0 = 1 (kC1 = 1 too).
constexpr float kC7 = 1.98412698412698413e-04f, kC6 = 1.38888888888888889e-03f,
                kC5 = 8.33333333333333333e-03f, kC4 = 4.16666666666666667e-02f,
                kC3 = 1.66666666666666667e-01f, kC2 = 0.5f, kC1 = 1.0f, kC0 = 1.0f;
}  // namespace exp_consts
}  // namespace detail

/// exp(x) in float, bit-identical on every platform (about 1 ulp accurate for normal
/// results). exp(-inf) = 0, exp(+inf) = +inf, NaN stays NaN. Results below the smallest
/// normal float (x < about -87.34) are flushed to zero, so no step needs a subnormal multiply.
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE float fp_exp(float x) {
  namespace ec = detail::exp_consts;
  if (x != x) return x;
  if (x > ec::kOverflow) return fp_from_bits(0x7f800000u);  // overflow to +inf
  if (x < ec::kUnderflow) return 0.0f;                      // below FLT_MIN: flush
  // x = k ln2 + r, |r| <= ln2/2 (plus rounding); Cody-Waite split of ln2 with fma.
  const float k = fp_floor(fp_fma(x, ec::kLog2e, 0.5f));
  float r = fp_fma(k, ec::kLn2Hi, x);  // ln2 high part (exact product)
  r = fp_fma(k, ec::kLn2Lo, r);        // ln2 low part
  // Taylor polynomial of e^r to degree 7 in Horner form (truncation < 6e-9 on |r| <= 0.35).
  float p = ec::kC7;
  p = fp_fma(p, r, ec::kC6);
  p = fp_fma(p, r, ec::kC5);
  p = fp_fma(p, r, ec::kC4);
  p = fp_fma(p, r, ec::kC3);
  p = fp_fma(p, r, ec::kC2);
  p = fp_fma(p, r, ec::kC1);
  p = fp_fma(p, r, ec::kC0);
  // Scale by 2^k through the exponent bits (exact; the result is normal by the range check,
  // except at the very edges where the exponent field would leave [1, 254]).
  const std::int32_t ki = static_cast<std::int32_t>(k);
  const std::int32_t e = static_cast<std::int32_t>((fp_bits(p) >> 23) & 0xffu) + ki;
  if (e <= 0) return 0.0f;
  if (e >= 255) return fp_from_bits(0x7f800000u);
  return fp_from_bits(fp_bits(p) + (static_cast<std::uint32_t>(ki) << 23));
}

/// Dot product `sum_k w[k] * x(i, k)` for k in `[0, n)` in a fixed, platform-independent
/// order that still vectorizes: eight partial sums (lane l takes k = l mod 8, each a chain of
/// fused multiply-adds in ascending k), combined as ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)).
/// `w` is a float row, `x` a policy loader, `i` the in-window offset.
template <class Load>
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE float fp_dot(const float* w, const Load& x, std::int64_t i,
                                                     std::int64_t n) {
  float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f, a4 = 0.0f, a5 = 0.0f, a6 = 0.0f, a7 = 0.0f;
  std::int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    a0 = fp_fma(w[k + 0], x(i, k + 0), a0);
    a1 = fp_fma(w[k + 1], x(i, k + 1), a1);
    a2 = fp_fma(w[k + 2], x(i, k + 2), a2);
    a3 = fp_fma(w[k + 3], x(i, k + 3), a3);
    a4 = fp_fma(w[k + 4], x(i, k + 4), a4);
    a5 = fp_fma(w[k + 5], x(i, k + 5), a5);
    a6 = fp_fma(w[k + 6], x(i, k + 6), a6);
    a7 = fp_fma(w[k + 7], x(i, k + 7), a7);
  }
  const std::int64_t r = n - k;
  if (r > 0) a0 = fp_fma(w[k + 0], x(i, k + 0), a0);
  if (r > 1) a1 = fp_fma(w[k + 1], x(i, k + 1), a1);
  if (r > 2) a2 = fp_fma(w[k + 2], x(i, k + 2), a2);
  if (r > 3) a3 = fp_fma(w[k + 3], x(i, k + 3), a3);
  if (r > 4) a4 = fp_fma(w[k + 4], x(i, k + 4), a4);
  if (r > 5) a5 = fp_fma(w[k + 5], x(i, k + 5), a5);
  if (r > 6) a6 = fp_fma(w[k + 6], x(i, k + 6), a6);
  return fp_add(fp_add(fp_add(a0, a1), fp_add(a2, a3)), fp_add(fp_add(a4, a5), fp_add(a6, a7)));
}

namespace detail {
// The names policies used before the functions became public.
using phasekv::fp_add;
using phasekv::fp_div;
using phasekv::fp_dot;
using phasekv::fp_exp;
using phasekv::fp_floor;
using phasekv::fp_fma;
using phasekv::fp_max;
using phasekv::fp_mul;
using phasekv::fp_sub;
}  // namespace detail
PHASEKV_NAMESPACE_END
