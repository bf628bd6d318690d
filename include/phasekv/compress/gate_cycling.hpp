/// @file
/// @brief Forwarding header: phasekv::cycle_gates (gate cycling, the paper's causal
/// intervention) lives with GatedPool in phasekv/compress/gated_pool.hpp. Include that instead.
#pragma once

#include "phasekv/compress/gated_pool.hpp"
