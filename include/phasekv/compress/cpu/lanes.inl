// phasekv: the lane packs of the compression row kernels, one target pass (see
// compress/cpu/rows_pass.inl). No include guard, no includes.
//
// The row kernels vectorize across channels: every lane is one channel and runs exactly the
// scalar policy code's sequence of IEEE float operations. A lane pack is cpu::Vec<Arch>
// (phasekv/cpu/vec.hpp, shared with the attention kernels) plus what the policies' arithmetic
// needs beyond it.

PHASEKV_NAMESPACE_BEGIN
namespace detail {
namespace PHASEKV_TGT_NS {
namespace rows {

/// Width in bits of the SIMD registers the row kernels of this pass use (512, 256, 128 for
/// NEON, or 0 for scalar loops); for tests and benchmarks, the results are the same either way.
constexpr int simd_width_bits() {
  return PHASEKV_DETAIL_ROWS_NEON ? 128 : PHASEKV_DETAIL_ROWS_SIMD;
}

/// One channel per lane: `cpu::Vec<Arch>` with the lane count as `lanes`, its register as
/// `reg`, and f16 loads through the exact software conversion (F16C and NEON's conversion
/// quiet signaling NaNs; the scalar policy code keeps them).
template <class Arch>
struct Lanes : cpu::Vec<Arch> {
  using base = cpu::Vec<Arch>;                    ///< The shared vector operations.
  using reg = typename base::V;                   ///< One register of `lanes` floats.
  static constexpr std::int64_t lanes = base::W;  ///< Lanes (channels) per register.
  using base::load;
  /// Loads `lanes` f16 values as floats, bit for bit f16_to_float.
  static PHASEKV_FORCEINLINE reg load(const f16_t* p) {
    alignas(64) float t[lanes];
    for (std::int64_t k = 0; k < lanes; ++k) t[k] = f16_to_float(p[k]);
    return base::load(t);
  }
};

/// The scalar policy code itself: one lane.
using Lanes1 = Lanes<cpu::arch::Scalar>;
#if PHASEKV_DETAIL_ROWS_SIMD >= 256
/// Eight lanes (AVX2), also the eight chains of fp_dot in the wider passes.
using Lanes8 = Lanes<cpu::arch::Avx2>;
#endif
#if PHASEKV_DETAIL_ROWS_SIMD >= 512
/// Sixteen lanes (AVX-512).
using Lanes16 = Lanes<cpu::arch::Avx512>;
#endif
#if PHASEKV_DETAIL_ROWS_NEON
/// Four lanes (NEON).
using Lanes4 = Lanes<cpu::arch::Neon>;
#endif

/// The lane pack that holds fp_dot's eight partial sums: one register of 8 lanes, two of 4
/// (NEON) or eight scalars.
#if PHASEKV_DETAIL_ROWS_SIMD >= 256
using DotLanes = Lanes8;
#elif PHASEKV_DETAIL_ROWS_NEON
using DotLanes = Lanes4;
#else
using DotLanes = Lanes1;
#endif

// Runs `body.template run<Lanes>(c, d)` over the channels [0, d): the widest lane pack first,
// then narrower ones for the rest, one channel at a time at the end. `run` returns the first
// channel it did not process.
template <class Body>
PHASEKV_FORCEINLINE void for_channels(std::int64_t d, const Body& body) {
  std::int64_t c = 0;
#if PHASEKV_DETAIL_ROWS_SIMD >= 512
  c = body.template run<Lanes16>(c, d);
#endif
#if PHASEKV_DETAIL_ROWS_SIMD >= 256
  c = body.template run<Lanes8>(c, d);
#endif
#if PHASEKV_DETAIL_ROWS_NEON
  c = body.template run<Lanes4>(c, d);
#endif
  body.template run<Lanes1>(c, d);
}

}  // namespace rows
}  // namespace PHASEKV_TGT_NS
}  // namespace detail
PHASEKV_NAMESPACE_END
