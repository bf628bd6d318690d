/// @file
/// @brief Includes `<immintrin.h>` for the host SIMD code of phasekv. GCC 12's own AVX-512
/// intrinsic headers self-initialize their "undefined" vectors (`__m512i __Y = __Y;`, GCC PR
/// 105593), which -Wuninitialized reports at the header's own lines once inlined, breaking
/// `-Werror -march=native` builds; this silences exactly those lines (diagnostic state is looked
/// up by location, so it covers the intrinsic headers when this is their first inclusion in the
/// translation unit). Include only under the matching `__AVX2__` / `__AVX512F__` checks.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
