/// @file
/// @brief Host-side row kernels behind the `compress_rows` fast paths of the built-in
/// policies (UniformMean, GatedPool with scalar gates and no payload maps) and the vectorized
/// entry store of compress_batch.
///
/// These kernels read the W token vectors of one window straight from strided memory (channel
/// c of the token at offset i is `base[i * token_stride + c]`) and vectorize **across
/// channels**: every SIMD lane is one channel and runs exactly the scalar policy code's
/// sequence of IEEE float operations (same operations, same operands, same order), so the
/// results are bit-identical to `Policy::compress` through a loader. Dot products keep
/// phasekv::detail::fp_dot's eight partial sums in the eight lanes of one 256-bit register,
/// the same chains in the same order. Nothing here is reassociated or contracted: every sum
/// of a product is an explicit fused multiply-add, as in the scalar code.
///
/// SIMD paths: AVX-512 (F + BW) and AVX2 + FMA when the translation unit is compiled for them
/// (e.g. `-march=native`), else plain scalar loops. CUDA translation units (`__CUDACC__`)
/// always take the scalar loops; the device code never calls these.
#pragma once

#include <cstdint>

#include "phasekv/compress/float_ops.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"

/// @def PHASEKV_DETAIL_ROWS_SIMD
/// Internal: the vector width in bits (512, 256, or 0 for scalar loops) of the host row kernels
/// behind `compress_rows`, from the translation unit's flags. Not a configuration option.
#if !defined(__CUDACC__) && !defined(PHASEKV_DOXYGEN) && defined(__AVX512F__) && \
    defined(__AVX512BW__)
#define PHASEKV_DETAIL_ROWS_SIMD 512
#elif !defined(__CUDACC__) && !defined(PHASEKV_DOXYGEN) && defined(__AVX2__) && defined(__FMA__)
#define PHASEKV_DETAIL_ROWS_SIMD 256
#else
#define PHASEKV_DETAIL_ROWS_SIMD 0
#endif

#if PHASEKV_DETAIL_ROWS_SIMD
#include "phasekv/core/x86_intrinsics.hpp"
#endif

namespace phasekv {
namespace detail {
namespace rows {

/// Width in bits of the SIMD registers the row kernels of this translation unit use (512, 256,
/// or 0 for scalar loops); for tests and benchmarks, the results are the same either way.
constexpr int simd_width_bits() { return PHASEKV_DETAIL_ROWS_SIMD; }

// ---------------------------------------------------------------------------------------------
// Lane packs: one channel per lane. Each op is the vector form of the scalar fp_* helper.
// ---------------------------------------------------------------------------------------------

// One lane (the scalar policy code itself).
struct Lanes1 {
  using reg = float;
  static constexpr std::int64_t lanes = 1;
  static float load(const float* p) { return *p; }
  static float load(const bf16_t* p) { return bf16_to_float(*p); }
  static float load(const f16_t* p) { return f16_to_float(*p); }
  static float set1(float x) { return x; }
  static float add(float a, float b) { return fp_add(a, b); }
  static float div(float a, float b) { return fp_div(a, b); }
  static float fma(float a, float b, float c) { return fp_fma(a, b, c); }
  static void store(float* p, float v) { *p = v; }
};

#if PHASEKV_DETAIL_ROWS_SIMD
// f16 -> f32 through the exact software conversion (F16C would quiet signaling NaNs).
template <int N>
inline void f16_block(const f16_t* p, float* dst) {
  for (int k = 0; k < N; ++k) dst[k] = f16_to_float(p[k]);
}

struct Lanes8 {
  using reg = __m256;
  static constexpr std::int64_t lanes = 8;
  static __m256 load(const float* p) { return _mm256_loadu_ps(p); }
  static __m256 load(const bf16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static __m256 load(const f16_t* p) {
    alignas(32) float t[8];
    f16_block<8>(p, t);
    return _mm256_load_ps(t);
  }
  static __m256 set1(float x) { return _mm256_set1_ps(x); }
  static __m256 add(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
  static __m256 div(__m256 a, __m256 b) { return _mm256_div_ps(a, b); }
  static __m256 fma(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
  static void store(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
};
#endif

#if PHASEKV_DETAIL_ROWS_SIMD >= 512
struct Lanes16 {
  using reg = __m512;
  static constexpr std::int64_t lanes = 16;
  static __m512 load(const float* p) { return _mm512_loadu_ps(p); }
  static __m512 load(const bf16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static __m512 load(const f16_t* p) {
    alignas(64) float t[16];
    f16_block<16>(p, t);
    return _mm512_load_ps(t);
  }
  static __m512 set1(float x) { return _mm512_set1_ps(x); }
  static __m512 add(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
  static __m512 div(__m512 a, __m512 b) { return _mm512_div_ps(a, b); }
  static __m512 fma(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
  static void store(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
};
#endif

// Runs `body.template run<Lanes>(c)` over the channels [0, d): the widest lane pack first,
// then narrower ones for the rest, one channel at a time at the end. `run` returns the first
// channel it did not process.
template <class Body>
PHASEKV_FORCEINLINE void for_channels(std::int64_t d, const Body& body) {
  std::int64_t c = 0;
#if PHASEKV_DETAIL_ROWS_SIMD >= 512
  c = body.template run<Lanes16>(c, d);
#endif
#if PHASEKV_DETAIL_ROWS_SIMD
  c = body.template run<Lanes8>(c, d);
#endif
  body.template run<Lanes1>(c, d);
}

// ---------------------------------------------------------------------------------------------
// UniformMean: out[c] = (((x_0[c] + x_1[c]) + ...) + x_{W-1}[c]) / W
// ---------------------------------------------------------------------------------------------
template <class T>
struct MeanBody {
  const T* base;
  std::int64_t token_stride;
  std::int64_t w;
  float* out;
  template <class V>
  PHASEKV_FORCEINLINE std::int64_t run(std::int64_t c, std::int64_t d) const {
    const typename V::reg wf = V::set1(static_cast<float>(w));
    for (; c + V::lanes <= d; c += V::lanes) {
      typename V::reg acc = V::load(base + c);
      const T* p = base + c;
      for (std::int64_t i = 1; i < w; ++i) {
        p += token_stride;
        acc = V::add(acc, V::load(p));
      }
      V::store(out + c, V::div(acc, wf));
    }
    return c;
  }
};

/// UniformMean of one window: `w` rows of `d` channels at `base + i * token_stride`.
template <class T>
inline void mean(const T* base, std::int64_t token_stride, std::int64_t w, std::int64_t d,
                 float* out) {
  for_channels(d, MeanBody<T>{base, token_stride, w, out});
}

// ---------------------------------------------------------------------------------------------
// GatedPool, scalar gates, identity payload
// ---------------------------------------------------------------------------------------------
// Dot products of `count` (w row, x row) pairs at once, each exactly fp_dot's eight chains;
// the pairs are independent, so their fused multiply-add chains overlap in the pipeline.
template <int K, class T>
PHASEKV_FORCEINLINE void dots_k(const float* const* w, const T* const* x, std::int64_t n,
                                float* res) {
  float a[K][8];
  std::int64_t k = 0;
#if PHASEKV_DETAIL_ROWS_SIMD
  __m256 acc[K];
  for (int q = 0; q < K; ++q) acc[q] = _mm256_setzero_ps();
  for (; k + 8 <= n; k += 8)  // lane l of pair q: a_l = fma(w[k + l], x[k + l], a_l)
    for (int q = 0; q < K; ++q)
      acc[q] = _mm256_fmadd_ps(_mm256_loadu_ps(w[q] + k), Lanes8::load(x[q] + k), acc[q]);
  for (int q = 0; q < K; ++q) _mm256_storeu_ps(a[q], acc[q]);
#else
  for (int q = 0; q < K; ++q)
    for (int l = 0; l < 8; ++l) a[q][l] = 0.0f;
  for (; k + 8 <= n; k += 8)
    for (int q = 0; q < K; ++q)
      for (int l = 0; l < 8; ++l) a[q][l] = fp_fma(w[q][k + l], Lanes1::load(x[q] + k + l), a[q][l]);
#endif
  for (int q = 0; q < K; ++q) {
    for (std::int64_t l = 0; k + l < n; ++l)
      a[q][l] = fp_fma(w[q][k + l], Lanes1::load(x[q] + k + l), a[q][l]);
    res[q] = fp_add(fp_add(fp_add(a[q][0], a[q][1]), fp_add(a[q][2], a[q][3])),
                    fp_add(fp_add(a[q][4], a[q][5]), fp_add(a[q][6], a[q][7])));
  }
}

/// `res[q] = fp_dot(w[q], x[q], n)` for q < count (rows of floats and of T).
template <class T>
inline void dots(const float* const* w, const T* const* x, std::int64_t count, std::int64_t n,
                 float* res) {
  std::int64_t q = 0;
  for (; q + 4 <= count; q += 4) dots_k<4>(w + q, x + q, n, res + q);
  for (; q < count; ++q) dots_k<1>(w + q, x + q, n, res + q);
}

/// Online softmax state of GatedPool's scalar gates (running maximum and denominator).
struct GatedState {
  float m;  ///< running maximum logit (-inf before the first offset that is on)
  float l;  ///< running denominator
};

/// Starts a window: the state of no offsets and `out[0, d)` = 0.
inline GatedState gated_begin(std::int64_t d, float* out) {
  for (std::int64_t c = 0; c < d; ++c) out[c] = 0.0f;
  return GatedState{-fp_from_bits(0x7f800000u), 0.0f};
}

// Channel pass over a chunk of offsets: op[k] 0 skips offset k, 1 rescales
// (acc = fma(acc, f, x)), 2 accumulates (acc = fma(f, x, acc)); the accumulator stays in a
// register over the chunk.
template <class T>
struct GatedChunkBody {
  const T* base;
  std::int64_t token_stride;
  std::int64_t count;
  const unsigned char* op;
  const float* f;
  float* out;
  template <class V>
  PHASEKV_FORCEINLINE std::int64_t run(std::int64_t c, std::int64_t d) const {
    for (; c + V::lanes <= d; c += V::lanes) {
      typename V::reg acc = V::load(out + c);
      const T* x = base + c;
      for (std::int64_t k = 0; k < count; ++k, x += token_stride) {
        if (op[k] == 1)
          acc = V::fma(acc, V::set1(f[k]), V::load(x));
        else if (op[k] == 2)
          acc = V::fma(V::set1(f[k]), V::load(x), acc);
      }
      V::store(out + c, acc);
    }
    return c;
  }
};

/// Feeds offsets with logits `s[0, count)` (token k at `base + k * token_stride`) to the
/// online softmax, exactly as GatedPool::compress does offset by offset: the scalar recurrence
/// first, then one pass over the channels. `count` <= kGatedChunk.
constexpr std::int64_t kGatedChunk = 32;
template <class T>
inline void gated_chunk(GatedState& st, const float* s, const T* base, std::int64_t token_stride,
                        std::int64_t count, std::int64_t d, float* out) {
  const float neg_inf = -fp_from_bits(0x7f800000u);
  unsigned char op[kGatedChunk];
  float f[kGatedChunk];
  float m = st.m, l = st.l;
  for (std::int64_t k = 0; k < count; ++k) {
    op[k] = 0;
    f[k] = 0.0f;
    if (s[k] == neg_inf) continue;
    if (s[k] > m) {  // new maximum: rescale by exp(m - s); this offset's weight is 1
      const float r = fp_exp(fp_sub(m, s[k]));
      l = fp_fma(l, r, 1.0f);
      op[k] = 1;
      f[k] = r;
      m = s[k];
    } else {
      const float p = fp_exp(fp_sub(s[k], m));
      l = fp_add(l, p);
      op[k] = 2;
      f[k] = p;
    }
  }
  st.m = m;
  st.l = l;
  for_channels(d, GatedChunkBody<T>{base, token_stride, count, op, f, out});
}

// out[c] = out[c] / l
struct DivideBody {
  float l;
  float* out;
  template <class V>
  PHASEKV_FORCEINLINE std::int64_t run(std::int64_t c, std::int64_t d) const {
    const typename V::reg lv = V::set1(l);
    for (; c + V::lanes <= d; c += V::lanes) V::store(out + c, V::div(V::load(out + c), lv));
    return c;
  }
};

/// Ends a window: `out[c] / l`, or 0 when every offset was off (l == 0).
inline void gated_end(const GatedState& st, std::int64_t d, float* out) {
  if (st.l > 0.0f || st.l != st.l)
    for_channels(d, DivideBody{st.l, out});
  else
    for (std::int64_t c = 0; c < d; ++c) out[c] = 0.0f;
}

// ---------------------------------------------------------------------------------------------
// Entry store: dst[c] = from_float<T>(src[c]), bit for bit.
// ---------------------------------------------------------------------------------------------
inline void store_row(float* dst, const float* src, std::int64_t n) {
  for (std::int64_t c = 0; c < n; ++c) dst[c] = src[c];
}

inline void store_row(f16_t* dst, const float* src, std::int64_t n) {
  for (std::int64_t c = 0; c < n; ++c) dst[c] = float_to_f16(src[c]);
}

inline void store_row(bf16_t* dst, const float* src, std::int64_t n) {
  std::int64_t c = 0;
#if PHASEKV_DETAIL_ROWS_SIMD >= 512
  {
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1),
                  quiet = _mm512_set1_epi32(0x40);
    for (; c + 16 <= n; c += 16) {
      const __m512i x = _mm512_castps_si512(_mm512_loadu_ps(src + c));
      const __m512i hi = _mm512_srli_epi32(x, 16);
      // (x + 0x7fff + ((x >> 16) & 1)) >> 16, or (x >> 16) | 0x40 for NaN (float_to_bf16)
      const __m512i rounded = _mm512_srli_epi32(
          _mm512_add_epi32(_mm512_add_epi32(x, bias), _mm512_and_si512(hi, one)), 16);
      const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, abs_mask), inf);
      const __m512i r = _mm512_mask_or_epi32(rounded, nan, hi, quiet);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + c), _mm512_cvtepi32_epi16(r));
    }
  }
#elif PHASEKV_DETAIL_ROWS_SIMD
  {
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1),
                  quiet = _mm256_set1_epi32(0x40);
    for (; c + 8 <= n; c += 8) {
      const __m256i x = _mm256_castps_si256(_mm256_loadu_ps(src + c));
      const __m256i hi = _mm256_srli_epi32(x, 16);
      const __m256i rounded = _mm256_srli_epi32(
          _mm256_add_epi32(_mm256_add_epi32(x, bias), _mm256_and_si256(hi, one)), 16);
      // abs(x) > 0x7f800000 as signed compare is fine: both sides are non-negative int32
      const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
      const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, quiet), nan);
      // every lane is <= 0xffff, so the unsigned saturating pack is exact
      const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r),
                                              _mm256_extracti128_si256(r, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + c), packed);
    }
  }
#endif
  for (; c < n; ++c) dst[c] = float_to_bf16(src[c]);
}

}  // namespace rows
}  // namespace detail
}  // namespace phasekv
