/// @file
/// @brief The GatedPool fast path on CUDA: one block computes one entry, gate logits for all
/// offsets in parallel, then one thread per output channel runs GatedPool's online softmax over
/// the offsets in order. Every thread performs exactly the operations GatedPool::compress
/// performs for its channel, in the same order, so the bits are the same as on the CPU.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "phasekv/compress/float_ops.hpp"
#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cuda::detail {

/// Largest number of gate logits (W x gate channels) the fast path keeps in shared memory.
inline constexpr std::int64_t kGatedPoolMaxLogits = 8192;

/// Gate channels of a GatedPool: 1 for scalar gates, d_out for vector gates.
PHASEKV_HOST_DEVICE inline std::int64_t gate_channels(const GatedPool& p) {
  return p.gate_kind() == GateKind::scalar ? 1 : p.output_dim();
}

/// True when the fast path's logits fit in shared memory.
PHASEKV_HOST_DEVICE inline bool gated_pool_fast(const GatedPool& p) {
  return p.geometry().window() * gate_channels(p) <= kGatedPoolMaxLogits;
}

/// Computes the entry of the window that `x` loads for KV head `h` into `out` (converted to
/// T). `logits` is shared memory for `W x gate_channels(p)` floats. All threads of the block
/// must call it.
template <class T, class Load>
__device__ void gated_pool_block(const GatedPool& p, std::int64_t h, const Load& x, T* out,
                                 float* logits) {
  using namespace phasekv::detail;
  const std::int64_t w = p.geometry().window();
  const std::int64_t gd = gate_channels(p);
  const std::int64_t din = p.input_dim(), dout = p.output_dim();
  const float* zw = p.gate_weight();
  const float* zb = p.gate_bias();
  const float* cp = p.payload();
  const std::int64_t shift = p.gate_shift();
  const float ninf = -fp_from_bits(0x7f800000u);
  for (std::int64_t idx = threadIdx.x; idx < w * gd; idx += blockDim.x) {
    const std::int64_t i = idx / gd, g = idx - i * gd;
    std::int64_t src = i - shift;
    if (src < 0) src += w;
    const std::int64_t row = (h * w + src) * gd + g;
    float s = zb != nullptr ? zb[row] : 0.0f;
    if (zw != nullptr) {
      const float* z = zw + row * din;
      for (std::int64_t k = 0; k < din; ++k) s = fp_fma(z[k], x(i, k), s);
    }
    logits[idx] = s;
  }
  __syncthreads();
  for (std::int64_t c = threadIdx.x; c < dout; c += blockDim.x) {
    const std::int64_t g = gd == 1 ? 0 : c;
    float m = ninf, l = 0.0f, acc = 0.0f;
    for (std::int64_t i = 0; i < w; ++i) {
      const float s = logits[i * gd + g];
      if (s == ninf) continue;
      float v;
      if (cp == nullptr) {
        v = x(i, c);
      } else {
        const float* crow = cp + ((h * w + i) * dout + c) * din;
        v = 0.0f;
        for (std::int64_t k = 0; k < din; ++k) v = fp_fma(crow[k], x(i, k), v);
      }
      if (s > m) {
        const float r = fp_exp(fp_sub(m, s));
        l = fp_fma(l, r, 1.0f);
        acc = fp_fma(acc, r, v);
        m = s;
      } else {
        const float e = fp_exp(fp_sub(s, m));
        l = fp_add(l, e);
        acc = fp_fma(e, v, acc);
      }
    }
    out[c] = from_float<T>(l > 0.0f || l != l ? fp_div(acc, l) : 0.0f);
  }
}

}  // namespace cuda::detail
PHASEKV_NAMESPACE_END
