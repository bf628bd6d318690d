/// @file
/// @brief Forwarding header: `Vec<Arch>` moved to phasekv/cpu/vec.hpp, shared by the
/// attention and the compression kernels. Include that instead.
#pragma once

#include "phasekv/attention/cpu/arch.hpp"
#include "phasekv/cpu/vec.hpp"
