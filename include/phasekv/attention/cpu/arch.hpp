/// @file
/// @brief Forwarding header: the architecture tags moved to phasekv/cpu/arch.hpp, shared by
/// the attention and the compression kernels. Include that instead.
#pragma once

#include "phasekv/cpu/arch.hpp"

/// The name the attention kernels used for PHASEKV_UNROLL (config.hpp); new code writes
/// PHASEKV_UNROLL. Kept while kernels that still spell it exist.
#define PHASEKV_CPU_UNROLL PHASEKV_UNROLL
