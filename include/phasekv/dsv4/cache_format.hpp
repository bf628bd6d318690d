/// @file
/// @brief The byte layouts of FlashMLA's FP8 latent caches as storage types of the DeepSeek-V4
/// sparse attention and of the writers (compress_append_paged, append_latent_paged): MODEL1
/// (DeepSeek-V4, 584 bytes a token) and V3.2 (656 bytes a token), beside the plain element
/// types (f32, bf16, f16, FP8 E4M3 with a per-tensor scale).
///
/// A quantized row has a "NoPE" part in FP8 E4M3 with one power-of-two scale per tile and a
/// 64-channel RoPE part kept in bf16. Row layouts, bytes little-endian:
///
/// - phasekv::model1_fp8_t (FlashMLA `MODEL1_FP8Sparse`): `dim` 512 = 448 NoPE + 64 RoPE, tiles
///   of 64 (7 scales). A block (page) of P tokens holds first the data part, P x 576 bytes
///   (token s at `s * 576`: 448 E4M3 codes, then 64 bf16), then the scale part, P x 8 bytes
///   (token s at `P * 576 + s * 8`: 7 UE8M0 scales, one per tile, then one pad byte); engines
///   pad the block to a multiple of 576 bytes (model1_block_bytes()). 584 bytes a token.
/// - phasekv::v32_fp8_t (FlashMLA `V32_FP8Sparse`, DeepSeek-V3.2): `dim` 576 = 512 NoPE + 64
///   RoPE, tiles of 128. Each token is 656 contiguous bytes: 512 E4M3 codes, 4 f32 scales (one
///   per tile), 64 bf16.
///
/// Value of a NoPE channel: `e4m3(code) * scale(tile)`; a RoPE channel is its bf16 value. A UE8M0
/// scale byte e is `2^(e - 127)` (255 is NaN). The writers quantize as FlashMLA's reference
/// (`tests/quant.py`) does: per tile `scale = 2^ceil(log2(max(amax / 448, 1e-4)))` (the smallest
/// power of two at least that), codes `e4m3(x / scale)` rounded to nearest even, RoPE channels
/// rounded to bf16; for rows already in bf16 this gives FlashMLA's bytes.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/dsv4/fp8.hpp"
#include "phasekv/dsv4/kernel_math.hpp"

PHASEKV_NAMESPACE_BEGIN

/// One byte of a FlashMLA MODEL1 FP8 latent cache (DeepSeek-V4; see dsv4/cache_format.hpp).
struct model1_fp8_t {
  std::uint8_t bits;  ///< Raw byte.
};

/// One byte of a FlashMLA V3.2 FP8 latent cache (DeepSeek-V3.2; see dsv4/cache_format.hpp).
struct v32_fp8_t {
  std::uint8_t bits;  ///< Raw byte.
};

/// Decodes a UE8M0 scale byte: `2^(e - 127)`; 255 is NaN.
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE float ue8m0_to_float(std::uint8_t e) {
  if (e == 255u) return fp_from_bits(0x7fc00000u);
  if (e == 0u) return fp_from_bits(0x00400000u);  // 2^-127, a subnormal
  return fp_from_bits(static_cast<std::uint32_t>(e) << 23);
}

/// The tile scale FlashMLA's quantizer picks for a tile of largest magnitude `amax`: the
/// smallest power of two >= `max(amax / 448, 1e-4)` (finite `amax`).
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE float fp8_tile_scale(float amax) {
  float s = amax / kFp8E4M3Max;
  if (!(s >= 1e-4f)) s = 1e-4f;
  const std::uint32_t b = fp_bits(s);
  if ((b & 0x7fffffu) == 0u) return s;
  return fp_from_bits(((b >> 23) + 1u) << 23);
}

namespace dsv4 {

/// Row handle of a quantized format: the token's data bytes and its scale bytes. `B` is
/// `const std::uint8_t` (reading) or `std::uint8_t` (writing).
template <class B>
struct QuantRow {
  B* data = nullptr;    ///< NoPE codes, then (V3.2: the scales, then) the RoPE bf16.
  B* scales = nullptr;  ///< The token's tile scales.
};

/// How storage type T lays rows out. Plain element types (f32, bf16, f16, FP8 E4M3): a row is
/// `dim` elements, rows `stride` elements apart; `Row` is a pointer to the first.
template <class T>
struct CacheFormat {
  static constexpr bool quantized = false;  ///< Per-tile scales inside the rows.
  /// Row `slot` of a block at `block` (rows `stride` elements apart; `P` unused).
  template <class U>
  PHASEKV_HOST_DEVICE static U* row(U* block, std::int64_t, std::int64_t slot,
                                    std::int64_t stride) {
    return block + slot * stride;
  }
};

/// MODEL1: see the file description.
template <>
struct CacheFormat<model1_fp8_t> {
  static constexpr bool quantized = true;            ///< Per-tile scales.
  static constexpr std::int64_t dim = 512;           ///< Channels of a row.
  static constexpr std::int64_t nope = 448;          ///< FP8 channels.
  static constexpr std::int64_t tile = 64;           ///< Channels per scale.
  static constexpr std::int64_t tiles = 7;           ///< Scales per row.
  static constexpr std::int64_t rope_offset = 448;   ///< Byte of the first RoPE bf16.
  static constexpr std::int64_t data_bytes = 576;    ///< Data part of a token.
  static constexpr std::int64_t token_bytes = 584;   ///< Data and scale bytes of a token.
  static constexpr const char* name = "MODEL1 FP8";  ///< Name in messages.
  /// Row `slot` of the block of `P` tokens at `block` (`stride` unused: fixed by the layout).
  template <class U>
  PHASEKV_HOST_DEVICE static auto row(U* block, std::int64_t P, std::int64_t slot, std::int64_t) {
    using B = std::conditional_t<std::is_const<U>::value, const std::uint8_t, std::uint8_t>;
    B* b = reinterpret_cast<B*>(block);
    return QuantRow<B>{b + slot * data_bytes, b + P * data_bytes + slot * 8};
  }
  /// Scale of tile `t`.
  PHASEKV_HOST_DEVICE static float scale(const std::uint8_t* s, int t) {
    return ue8m0_to_float(s[t]);
  }
  /// Stores the power-of-two scale `v` of tile `t` (the 8th byte, a pad, is written 0).
  PHASEKV_HOST_DEVICE static void set_scale(std::uint8_t* s, int t, float v) {
    s[t] = static_cast<std::uint8_t>(fp_bits(v) >> 23);
    if (t == tiles - 1) s[tiles] = 0;
  }
};

/// V3.2: see the file description.
template <>
struct CacheFormat<v32_fp8_t> {
  static constexpr bool quantized = true;           ///< Per-tile scales.
  static constexpr std::int64_t dim = 576;          ///< Channels of a row.
  static constexpr std::int64_t nope = 512;         ///< FP8 channels.
  static constexpr std::int64_t tile = 128;         ///< Channels per scale.
  static constexpr std::int64_t tiles = 4;          ///< Scales per row.
  static constexpr std::int64_t rope_offset = 528;  ///< Byte of the first RoPE bf16.
  static constexpr std::int64_t data_bytes = 656;   ///< Bytes of a token.
  static constexpr std::int64_t token_bytes = 656;  ///< Bytes of a token.
  static constexpr const char* name = "V3.2 FP8";   ///< Name in messages.
  /// Row `slot` of a block at `block`, tokens `stride` bytes apart (`P` unused).
  template <class U>
  PHASEKV_HOST_DEVICE static auto row(U* block, std::int64_t, std::int64_t slot,
                                      std::int64_t stride) {
    using B = std::conditional_t<std::is_const<U>::value, const std::uint8_t, std::uint8_t>;
    B* d = reinterpret_cast<B*>(block) + slot * stride;
    return QuantRow<B>{d, d + nope};
  }
  /// Scale of tile `t` (an f32, little-endian).
  PHASEKV_HOST_DEVICE static float scale(const std::uint8_t* s, int t) {
    const std::uint8_t* p = s + 4 * t;
    return fp_from_bits(std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 |
                        std::uint32_t{p[3]} << 24);
  }
  /// Stores the scale `v` of tile `t`.
  PHASEKV_HOST_DEVICE static void set_scale(std::uint8_t* s, int t, float v) {
    const std::uint32_t b = fp_bits(v);
    for (int i = 0; i < 4; ++i) s[4 * t + i] = static_cast<std::uint8_t>(b >> (8 * i));
  }
};

/// Bytes of a MODEL1 block of `page_size` tokens as FlashMLA pads it: `page_size * 584`
/// rounded up to a multiple of 576.
PHASEKV_HOST_DEVICE constexpr std::int64_t model1_block_bytes(std::int64_t page_size) {
  return (page_size * 584 + 575) / 576 * 576;
}

namespace detail {

// The row handle of storage type T (reading).
template <class T>
using row_t = decltype(CacheFormat<T>::row(std::declval<const T*>(), 0, 0, 0));

// Address of a row's first byte (for prefetching).
template <class U>
PHASEKV_HOST_DEVICE const void* row_address(U* p) {
  return p;
}
template <class B>
PHASEKV_HOST_DEVICE const void* row_address(QuantRow<B> r) {
  return r.data;
}

// bf16 channel i of a quantized row (little-endian bytes).
PHASEKV_HOST_DEVICE PHASEKV_FORCEINLINE float rope_channel(const std::uint8_t* rope,
                                                           std::int64_t i) {
  return bf16_to_float(
      bf16_t{static_cast<std::uint16_t>(rope[2 * i] | (std::uint16_t{rope[2 * i + 1]} << 8))});
}

// Row of storage type E at `dst`: `x[0, dim)` divided by `scale`, rounded to E (nearest even;
// FP8 saturates at 448). Quantized formats (dim = CacheFormat<E>::dim) per tile as FlashMLA's
// quantizer: the power-of-two tile scale of fp8_tile_scale(), codes e4m3(x / tile scale), RoPE
// channels in bf16.
template <class E, class Row>
PHASEKV_HOST_DEVICE void store_row(const float* x, std::int64_t dim, float scale, Row dst) {
  if constexpr (CacheFormat<E>::quantized) {
    using F = CacheFormat<E>;
    (void)dim;
    for (int t = 0; t < F::tiles; ++t) {
      float amax = 0.0f;
      for (std::int64_t i = t * F::tile; i < (t + 1) * F::tile; ++i) {
        const float a = x[i] / scale;
        amax = a > amax ? a : (-a > amax ? -a : amax);
      }
      const float s = fp8_tile_scale(amax);
      F::set_scale(dst.scales, t, s);
      for (std::int64_t i = t * F::tile; i < (t + 1) * F::tile; ++i)
        dst.data[i] = float_to_fp8_e4m3(x[i] / scale / s).bits;
    }
    for (std::int64_t i = 0; i < F::dim - F::nope; ++i) {
      const std::uint16_t b = float_to_bf16(x[F::nope + i] / scale).bits;
      dst.data[F::rope_offset + 2 * i] = static_cast<std::uint8_t>(b & 0xffu);
      dst.data[F::rope_offset + 2 * i + 1] = static_cast<std::uint8_t>(b >> 8);
    }
  } else {
    for (std::int64_t i = 0; i < dim; ++i) dst[i] = store_element<E>(x[i] / scale);
  }
}

// Real value of channel i of a row handle of storage type T (scalar; the kernels convert by
// vectors).
template <class T, class Row>
PHASEKV_HOST_DEVICE float load_channel(Row r, std::int64_t i) {
  if constexpr (CacheFormat<T>::quantized) {
    using F = CacheFormat<T>;
    if (i >= F::nope) return rope_channel(r.data + F::rope_offset, i - F::nope);
    return fp8_e4m3_to_float(fp8_e4m3_t{r.data[i]}) *
           F::scale(r.scales, static_cast<int>(i / F::tile));
  } else {
    return to_float(r[i]);
  }
}

// Checks the rows of a quantized storage type against its layout (the row width `dim`, the
// rows per block, the byte stride between tokens and between blocks); names the argument
// `name`. No-op for plain types.
template <class T>
void check_format_rows(std::int64_t dim, std::int64_t page_size, std::int64_t slot_stride,
                       std::int64_t page_stride, const char* where, const std::string& name,
                       const char* stride_field = ".stride",
                       const char* page_stride_field = ".page_stride") {
  if constexpr (CacheFormat<T>::quantized) {
    using F = CacheFormat<T>;
    using phasekv::detail::check_arg;
    const std::string fmt = std::string(" (") + F::name + ")";
    check_arg<shape_error>(dim == F::dim, where, "params.dim", dim,
                           ("must be " + std::to_string(F::dim) + fmt).c_str());
    if (F::data_bytes != F::token_bytes) {  // MODEL1: blocks of data, then scales
      check_arg<shape_error>(page_size >= 1, where, (name + ".page_size").c_str(), page_size,
                             ("must be >= 1: the layout is per block" + fmt).c_str());
      check_arg<shape_error>(
          page_stride >= page_size * F::token_bytes && page_stride % 2 == 0, where,
          (name + page_stride_field).c_str(), page_stride,
          ("must be even and >= page_size * " + std::to_string(F::token_bytes) + " bytes" + fmt)
              .c_str());
    } else {
      check_arg<shape_error>(
          slot_stride >= F::token_bytes && slot_stride % 4 == 0, where,
          (name + stride_field).c_str(), slot_stride,
          ("must be a multiple of 4 and >= " + std::to_string(F::token_bytes) + " bytes" + fmt)
              .c_str());
      if (page_size >= 1)
        check_arg<shape_error>(
            page_stride >= page_size * slot_stride && page_stride % 4 == 0, where,
            (name + page_stride_field).c_str(), page_stride,
            ("must be a multiple of 4 and >= page_size * stride bytes" + fmt).c_str());
    }
  } else {
    (void)dim, (void)page_size, (void)slot_stride, (void)page_stride, (void)where, (void)name;
    (void)stride_field, (void)page_stride_field;
  }
}

}  // namespace detail
}  // namespace dsv4
PHASEKV_NAMESPACE_END
