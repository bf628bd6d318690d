/// @file
/// @brief row_kernels<GatedPool>: the CPU fast paths of GatedPool with scalar gates and no
/// payload maps (a window, two windows at once, a run of windows for bf16 rows with W = 2 S),
/// over the row kernels of compress/cpu/rows.hpp.
#pragma once

#include <cstdint>
#include <type_traits>

#include "phasekv/compress/cpu/row_kernels.hpp"
#include "phasekv/compress/cpu/rows.hpp"
#include "phasekv/compress/float_ops.hpp"
#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"

PHASEKV_NAMESPACE_BEGIN

/// The CPU fast paths of GatedPool (see row_kernels for the contract), any `Arch`: the
/// kernels choose the instruction set at run time. They cover scalar gates without payload
/// maps; vector gates and payload maps take GatedPool::compress.
template <class Arch>
struct row_kernels<GatedPool, Arch> {
  /// True: GatedPool has fast paths (for scalar gates without payload maps).
  static constexpr bool fast = true;

  /// One window: the gate logits of all offsets at once, then the online softmax over the
  /// offsets with one vectorized channel pass per chunk of offsets.
  template <class T>
  static bool window(const GatedPool& p, std::int64_t kv_head, const T* rows,
                     std::int64_t token_stride, float* out) {
    if (!covered(p)) return false;
    namespace rk = detail::rows;
    const std::int64_t w = p.geometry().window(), d = p.output_dim();
    rk::GatedState st = rk::gated_begin(d, out);
    for (std::int64_t i0 = 0; i0 < w; i0 += rk::kGatedChunk) {
      const std::int64_t count = w - i0 < rk::kGatedChunk ? w - i0 : rk::kGatedChunk;
      float s[rk::kGatedChunk];
      logits(p, kv_head, i0, count, rows, token_stride, s);
      rk::gated_chunk(st, s, rows + i0 * token_stride, token_stride, count, d, out);
    }
    rk::gated_end(st, d, out);
    return true;
  }

  /// Two windows (of heads `kv_head` and `kv_head2`) at once, their dependency chains
  /// interleaved: windows of at most 8 tokens where an AVX-512 build runs.
  template <class T>
  static bool window_pair(const GatedPool& p, std::int64_t kv_head, const T* rows, float* out,
                          std::int64_t kv_head2, const T* rows2, float* out2,
                          std::int64_t token_stride) {
    namespace rk = detail::rows;
    const std::int64_t w = p.geometry().window();
    if (!covered(p) || !rk::gated_pair_available() || w > rk::kGatedPairMaxWindow) return false;
    float s[rk::kGatedPairMaxWindow] = {}, s2[rk::kGatedPairMaxWindow] = {};
    logits(p, kv_head, 0, w, rows, token_stride, s);
    logits(p, kv_head2, 0, w, rows2, token_stride, s2);
    rk::gated_pair(s, rows, out, s2, rows2, out2, token_stride, w, p.output_dim());
    return true;
  }

  /// A run of windows of one head: each token is in two windows, and its row is widened once
  /// for both. bf16 rows with W = 2 S <= 8 and d_out a multiple of 32 where an AVX-512 build
  /// runs.
  template <class T>
  static bool run(const GatedPool& p, std::int64_t kv_head, const T* rows,
                  std::int64_t token_stride, std::int64_t count, T* entries,
                  std::int64_t entry_stride, bool stream, std::int64_t prefetch_tokens) {
    namespace rk = detail::rows;
    const std::int64_t w = p.geometry().window(), s = p.geometry().stride();
    const std::int64_t d = p.output_dim();
    if constexpr (std::is_same<T, bf16_t>::value) {
      if (!covered(p) || !rk::gated_run_available() || w != 2 * s || w > 8 || d % 32 != 0)
        return false;
      const float* z[8] = {};
      float b[8] = {};
      for (std::int64_t i = 0; i < w; ++i) {  // the rows GatedPool::compress uses at offset i
        const std::int64_t row = param_row(p, kv_head, i);
        b[i] = p.gate_bias() != nullptr ? p.gate_bias()[row] : 0.0f;
        z[i] = p.gate_weight() != nullptr ? p.gate_weight() + row * p.input_dim() : nullptr;
      }
      for (std::int64_t r = 0; r < count; r += rk::kGatedRunMax) {
        const std::int64_t n = count - r < rk::kGatedRunMax ? count - r : rk::kGatedRunMax;
        const T* x = rows + r * s * token_stride;
        T* e = entries + r * entry_stride;
        const std::int64_t pf = prefetch_tokens > r * s ? prefetch_tokens - r * s : 0;
        switch (s) {
          case 1:
            rk::gated_run_bf16<1>(z, b, x, token_stride, n, d, e, entry_stride, stream, pf);
            break;
          case 2:
            rk::gated_run_bf16<2>(z, b, x, token_stride, n, d, e, entry_stride, stream, pf);
            break;
          case 3:
            rk::gated_run_bf16<3>(z, b, x, token_stride, n, d, e, entry_stride, stream, pf);
            break;
          default:
            rk::gated_run_bf16<4>(z, b, x, token_stride, n, d, e, entry_stride, stream, pf);
            break;
        }
      }
      return true;
    } else {
      (void)kv_head, (void)rows, (void)token_stride, (void)count, (void)entries;
      (void)entry_stride, (void)stream, (void)prefetch_tokens, (void)w, (void)s, (void)d;
      return false;
    }
  }

 private:
  // Scalar gates without payload maps: what the kernels compute.
  static bool covered(const GatedPool& p) {
    return p.gate_kind() == GateKind::scalar && p.payload() == nullptr;
  }

  // Row of head h's gate parameters acting at offset i ((h * W + src) * G + g, G = 1, g = 0).
  static std::int64_t param_row(const GatedPool& p, std::int64_t h, std::int64_t i) {
    const std::int64_t w = p.geometry().window();
    std::int64_t src = i - p.gate_shift();
    if (src < 0) src += w;
    return h * w + src;
  }

  // Scalar gate logits of offsets [i0, i0 + count) (count <= kGatedChunk) of the window of
  // head `h` at `rows`: the operations of GatedPool::compress (fp_add(fp_dot(z, x), b), or b
  // alone without weights), the dot products of all offsets at once.
  template <class T>
  static void logits(const GatedPool& p, std::int64_t h, std::int64_t i0, std::int64_t count,
                     const T* rows, std::int64_t token_stride, float* s) {
    namespace rk = detail::rows;
    float dot[rk::kGatedChunk];
    const float* z[rk::kGatedChunk] = {};  // only [0, count) is read (GCC cannot tell)
    const T* x[rk::kGatedChunk] = {};
    for (std::int64_t k = 0; k < count; ++k) {
      const std::int64_t row = param_row(p, h, i0 + k);
      s[k] = p.gate_bias() != nullptr ? p.gate_bias()[row] : 0.0f;
      z[k] = p.gate_weight() != nullptr ? p.gate_weight() + row * p.input_dim() : nullptr;
      x[k] = rows + (i0 + k) * token_stride;
    }
    if (p.gate_weight() != nullptr) {
      rk::dots(z, x, count, p.input_dim(), dot);
      for (std::int64_t k = 0; k < count; ++k) s[k] = fp_add(dot[k], s[k]);
    }
  }
};

PHASEKV_NAMESPACE_END
