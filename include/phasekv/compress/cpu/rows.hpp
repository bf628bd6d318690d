/// @file
/// @brief The CPU row kernels of the compression fast paths (UniformMean, GatedPool with
/// scalar gates and no payload maps, the built-in specializations of phasekv::row_kernels) and
/// the vectorized entry store of compress_batch, behind one set of functions that run the
/// instruction-set build of the CPU (`detail::rows`).
///
/// The kernels read the W token vectors of one window straight from strided memory (channel
/// c of the token at offset i is `base[i * token_stride + c]`) and vectorize **across
/// channels**: every SIMD lane is one channel and runs exactly the scalar policy code's
/// sequence of IEEE float operations (same operations, same operands, same order), so the
/// results are bit-identical to `Policy::compress` through a loader. Dot products keep
/// phasekv::fp_dot's eight partial sums in eight lanes, the same chains in the same order.
/// Nothing here is reassociated or contracted: every sum of a product is an explicit fused
/// multiply-add, as in the scalar code.
///
/// Files, one concept each, compiled once per target pass (core/foreach_target.inc) through
/// rows_pass.inl: lanes.inl (lane packs over cpu::Vec<Arch>, phasekv/cpu/vec.hpp),
/// row_store.inl (entry stores, bf16 rounding, prefetches), mean_rows.inl (UniformMean),
/// gated_rows.inl (GatedPool). The base pass vectorizes as the translation unit's flags allow
/// (AVX-512 F/BW/VL, AVX2 + FMA + F16C, NEON on AArch64, or scalar loops), and with run-time
/// dispatch (PHASEKV_DISPATCH) the AVX2, AVX-512 and AVX-512 + BF16 passes exist whatever the
/// flags. The functions of `detail::rows` below run the pass of the CPU (active_arch() of
/// attention/cpu/dispatch.hpp; the BF16 pass on CPUs with AVX512-BF16). CUDA translation units
/// (`__CUDACC__`) always take the scalar loops; the device code never calls these.
#pragma once

#include <cstdint>
#include <type_traits>

#include "phasekv/attention/cpu/dispatch.hpp"
#include "phasekv/compress/float_ops.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/prefetch.hpp"
#include "phasekv/core/target.hpp"
#include "phasekv/cpu/vec.hpp"

// The lanes the translation unit's flags allow the base pass (core/target.hpp's PHASEKV_FLAGS_*).
#if !defined(__CUDACC__) && !defined(PHASEKV_DOXYGEN) && PHASEKV_FLAGS_AVX512
#define PHASEKV_DETAIL_ROWS_SIMD_FLAGS 512
#elif !defined(__CUDACC__) && !defined(PHASEKV_DOXYGEN) && PHASEKV_FLAGS_AVX2
#define PHASEKV_DETAIL_ROWS_SIMD_FLAGS 256
#else
/// Internal: the x86 vector width (bits) the translation unit's flags allow the base pass.
#define PHASEKV_DETAIL_ROWS_SIMD_FLAGS 0
#endif
#if PHASEKV_DETAIL_ROWS_SIMD_FLAGS >= 512 && PHASEKV_FLAGS_AVX512BF16
#define PHASEKV_DETAIL_ROWS_BF16CVT_FLAGS 1
#else
/// Internal: 1 when the flags let the base pass store bf16 with VCVTNE2PS2BF16.
#define PHASEKV_DETAIL_ROWS_BF16CVT_FLAGS 0
#endif
#if !defined(__CUDACC__) && !defined(PHASEKV_DOXYGEN) && PHASEKV_FLAGS_NEON
#define PHASEKV_DETAIL_ROWS_NEON_FLAGS 1
#else
/// Internal: 1 when the base pass runs on NEON registers (AArch64).
#define PHASEKV_DETAIL_ROWS_NEON_FLAGS 0
#endif

PHASEKV_NAMESPACE_BEGIN
namespace detail {
namespace rows_shared {
/// Online softmax state of GatedPool's scalar gates (running maximum and denominator), shared
/// by every pass.
struct GatedState {
  float m;  ///< running maximum logit (-inf before the first offset that is on)
  float l;  ///< running denominator
};
}  // namespace rows_shared
}  // namespace detail
PHASEKV_NAMESPACE_END

#if !defined(PHASEKV_DOXYGEN)  // the kernel bodies, once per target pass
#define PHASEKV_TARGET_BODY "phasekv/compress/cpu/rows_pass.inl"
#include "phasekv/core/foreach_target.inc"
#endif

/// @def PHASEKV_DETAIL_ROWS_SIMD
/// Internal: the vector width in bits (512, 256, or 0 for scalar loops) of the base pass of
/// the row kernels (the translation unit's flags). Not a configuration option.
#define PHASEKV_DETAIL_ROWS_SIMD PHASEKV_DETAIL_ROWS_SIMD_FLAGS
/// Internal: 1 when the base pass stores bf16 with VCVTNE2PS2BF16.
#define PHASEKV_DETAIL_ROWS_BF16CVT PHASEKV_DETAIL_ROWS_BF16CVT_FLAGS

PHASEKV_NAMESPACE_BEGIN
namespace detail {
namespace rows {

/// The pass the row kernels run in this process: 0 base, 1 AVX2, 2 AVX-512, 3 AVX-512 + BF16
/// (decided once from cpu::active_arch(); always 0 without run-time dispatch).
inline int pass_index() {
#if PHASEKV_DISPATCH
  static const int p = [] {
    switch (cpu::active_arch()) {
      case cpu::ArchId::avx512: return cpu::cpu_supports<cpu::arch::Avx512Bf16>() ? 3 : 2;
      case cpu::ArchId::avx2: return 1;
      default: return 0;
    }
  }();
  return p;
#else
  return 0;
#endif
}

#if PHASEKV_DISPATCH
#define PHASEKV_DETAIL_ROWS_CALL(call)         \
  switch (pass_index()) {                      \
    case 3: return tgt_avx512bf16::rows::call; \
    case 2: return tgt_avx512::rows::call;     \
    case 1: return tgt_avx2::rows::call;       \
    default: return tgt_base::rows::call;      \
  }
// Kernels that exist only in the AVX-512 passes (callers check the *_available() first).
#define PHASEKV_DETAIL_ROWS_CALL512(call)                   \
  if (pass_index() == 3) return tgt_avx512bf16::rows::call; \
  return tgt_avx512::rows::call;
#else
/// Internal: returns `call` run in the pass of this process.
#define PHASEKV_DETAIL_ROWS_CALL(call) return tgt_base::rows::call;
/// Internal: returns `call` run in the AVX-512 pass of this process.
#define PHASEKV_DETAIL_ROWS_CALL512(call) return tgt_base::rows::call;
#endif

/// Width in bits of the SIMD registers of the pass that runs (512, 256, or 0 for scalar
/// loops); for tests and benchmarks, the results are the same either way.
inline int simd_width_bits() { PHASEKV_DETAIL_ROWS_CALL(simd_width_bits()) }

using rows_shared::GatedState;
/// Offsets per gated_chunk call.
constexpr std::int64_t kGatedChunk = tgt_base::rows::kGatedChunk;
/// Longest window of gated_pair.
constexpr std::int64_t kGatedPairMaxWindow = tgt_base::rows::kGatedPairMaxWindow;
/// Most windows per gated_run_bf16 call.
constexpr std::int64_t kGatedRunMax = tgt_base::rows::kGatedRunMax;

/// UniformMean of one window (see mean_rows.inl).
template <class T>
void mean(const T* base, std::int64_t token_stride, std::int64_t w, std::int64_t d, float* out) {
  PHASEKV_DETAIL_ROWS_CALL(mean(base, token_stride, w, d, out))
}
/// `res[q] = fp_dot(w[q], x[q], n)` for q < count.
template <class T>
void dots(const float* const* w, const T* const* x, std::int64_t count, std::int64_t n,
          float* res) {
  PHASEKV_DETAIL_ROWS_CALL(dots(w, x, count, n, res))
}
/// Starts a gated window.
inline GatedState gated_begin(std::int64_t d, float* out) {
  PHASEKV_DETAIL_ROWS_CALL(gated_begin(d, out))
}
/// Adds `count` offsets of a gated window.
template <class T>
void gated_chunk(GatedState& st, const float* s, const T* base, std::int64_t token_stride,
                 std::int64_t count, std::int64_t d, float* out) {
  PHASEKV_DETAIL_ROWS_CALL(gated_chunk(st, s, base, token_stride, count, d, out))
}
/// Finishes a gated window.
inline void gated_end(const GatedState& st, std::int64_t d, float* out) {
  PHASEKV_DETAIL_ROWS_CALL(gated_end(st, d, out))
}
/// Whether gated_pair runs in this process (an AVX-512 pass).
inline bool gated_pair_available() {
#if PHASEKV_DISPATCH
  return pass_index() >= 2;
#else
  return tgt_base::rows::gated_pair_available();
#endif
}
/// Whether gated_run_bf16 runs in this process.
inline bool gated_run_available() {
#if PHASEKV_DISPATCH
  return pass_index() >= 2;
#else
  return tgt_base::rows::gated_run_available();
#endif
}
/// Whether mean_run_bf16 runs in this process.
inline bool mean_run_available() {
#if PHASEKV_DISPATCH
  return pass_index() >= 2;
#else
  return tgt_base::rows::mean_run_available();
#endif
}
/// Whether compress_batch should write entries with non-temporal stores.
inline bool streaming_stores() {
#if PHASEKV_DISPATCH
  return pass_index() >= 2;
#else
  return tgt_base::rows::streaming_stores();
#endif
}
/// Entry stores, bit for bit from_float.
inline void store_row(float* dst, const float* src, std::int64_t n) {
  PHASEKV_DETAIL_ROWS_CALL(store_row(dst, src, n))
}
/// Entry stores, bit for bit from_float.
inline void store_row(f16_t* dst, const float* src, std::int64_t n) {
  PHASEKV_DETAIL_ROWS_CALL(store_row(dst, src, n))
}
/// Entry stores, bit for bit from_float.
inline void store_row(bf16_t* dst, const float* src, std::int64_t n) {
  PHASEKV_DETAIL_ROWS_CALL(store_row(dst, src, n))
}
/// Entry stores with non-temporal stores where the pass has them.
template <class T>
void store_row_stream(T* dst, const float* src, std::int64_t n) {
  PHASEKV_DETAIL_ROWS_CALL(store_row_stream<T>(dst, src, n))
}
/// Orders non-temporal stores.
inline void store_fence() { PHASEKV_DETAIL_ROWS_CALL(store_fence()) }

// The kernels below exist only in the AVX-512 passes; without one in this translation unit
// their *_available() is false and the wrappers do nothing (callers check first).
#if PHASEKV_DISPATCH || PHASEKV_DETAIL_ROWS_SIMD_FLAGS >= 512
#define PHASEKV_DETAIL_ROWS_HAS512 1
#else
/// Internal: 1 when the translation unit has an AVX-512 pass of the row kernels.
#define PHASEKV_DETAIL_ROWS_HAS512 0
#endif

/// Two gated windows at once (only when gated_pair_available()).
template <class T>
void gated_pair(const float* sa, const T* xa, float* outa, const float* sb, const T* xb,
                float* outb, std::int64_t token_stride, std::int64_t w, std::int64_t d) {
#if PHASEKV_DETAIL_ROWS_HAS512
  PHASEKV_DETAIL_ROWS_CALL512(gated_pair(sa, xa, outa, sb, xb, outb, token_stride, w, d))
#else
  (void)sa, (void)xa, (void)outa, (void)sb, (void)xb, (void)outb, (void)token_stride, (void)w;
  (void)d;
#endif
}
/// A run of gated windows, bf16 (only when gated_run_available()).
template <int S>
void gated_run_bf16(const float* const* w, const float* bias, const bf16_t* x,
                    std::int64_t token_stride, std::int64_t count, std::int64_t d, bf16_t* entries,
                    std::int64_t entry_stride, bool stream, std::int64_t prefetch = 0) {
#if PHASEKV_DETAIL_ROWS_HAS512
  PHASEKV_DETAIL_ROWS_CALL512(gated_run_bf16<S>(w, bias, x, token_stride, count, d, entries,
                                                entry_stride, stream, prefetch))
#else
  (void)w, (void)bias, (void)x, (void)token_stride, (void)count, (void)d, (void)entries;
  (void)entry_stride, (void)stream, (void)prefetch;
#endif
}
/// A run of mean windows, bf16 (only when mean_run_available()).
inline void mean_run_bf16(const bf16_t* x, std::int64_t token_stride, std::int64_t s,
                          std::int64_t count, std::int64_t d, bf16_t* entries,
                          std::int64_t entry_stride, bool stream, std::int64_t prefetch = 0) {
#if PHASEKV_DETAIL_ROWS_HAS512
  PHASEKV_DETAIL_ROWS_CALL512(
      mean_run_bf16(x, token_stride, s, count, d, entries, entry_stride, stream, prefetch))
#else
  (void)x, (void)token_stride, (void)s, (void)count, (void)d, (void)entries, (void)entry_stride;
  (void)stream, (void)prefetch;
#endif
}

#undef PHASEKV_DETAIL_ROWS_HAS512
#undef PHASEKV_DETAIL_ROWS_CALL
#undef PHASEKV_DETAIL_ROWS_CALL512

}  // namespace rows
}  // namespace detail
PHASEKV_NAMESPACE_END
