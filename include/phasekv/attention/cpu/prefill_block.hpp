/// @file
/// @brief The prefill inner kernels, written once over `Vec<Arch>`: packing of a key block
/// (transposed) and a value block to f32, a register-tiled Q.K^T micro-kernel (query rows x
/// keys, broadcast-query form) and a register-tiled P.V micro-kernel (query rows x value
/// columns) with the online-softmax rescale fused in. The kernels are in
/// kernels/prefill_block.inl, compiled once per target pass (core/foreach_target.inc).
#pragma once

#include <cstdint>
#include <type_traits>

#include "phasekv/attention/cpu/arch.hpp"
#include "phasekv/attention/cpu/vec.hpp"
#include "phasekv/attention/softmax_state.hpp"
#include "phasekv/core/config.hpp"
#include "phasekv/core/element.hpp"

#if !defined(PHASEKV_DOXYGEN)  // the kernel bodies, once per target pass
#define PHASEKV_TARGET_BODY "phasekv/attention/cpu/kernels/prefill_block.inl"
#include "phasekv/core/foreach_target.inc"
#endif
