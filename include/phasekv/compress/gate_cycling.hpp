/// @file
/// @brief Gate cycling, the phase sensitivity paper's causal intervention: a GatedPool whose
/// gate parameters (Z_i, b_i) are circularly shifted by delta offsets while the payload maps
/// C_i stay in place. If a head's retrieval weakness follows its gate, cycling the gate moves
/// the weak phase by delta.
#pragma once

#include <cstdint>

#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/core/config.hpp"

PHASEKV_NAMESPACE_BEGIN

/// Returns `policy` with its gates cycled by `delta` offsets: the gate parameters that acted
/// at offset i act at offset `(i + delta) mod W`. Shifts compose (cycling by a then b equals
/// cycling by a + b), negative delta shifts the other way, and any multiple of W (delta = W in
/// particular) is the identity. No parameter memory is touched: only the policy's
/// gate_shift() changes, so this is free and works for device-resident parameters.
PHASEKV_HOST_DEVICE constexpr GatedPool cycle_gates(const GatedPool& policy, std::int64_t delta) {
  return policy.cycled(delta);
}

PHASEKV_NAMESPACE_END
