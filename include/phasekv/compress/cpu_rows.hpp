/// @file
/// @brief Forwarding header: the CPU row kernels of the compression fast paths moved to
/// phasekv/compress/cpu/rows.hpp. Include that instead.
#pragma once

#include "phasekv/compress/cpu/rows.hpp"
