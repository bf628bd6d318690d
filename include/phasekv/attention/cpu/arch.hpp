/// @file
/// @brief Forwarding header: the architecture tags moved to phasekv/cpu/arch.hpp, shared by
/// the attention and the compression kernels. Include that instead.
#pragma once

#include "phasekv/cpu/arch.hpp"
