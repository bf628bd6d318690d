// fuzz_attention, f16 storage.
#include "fuzz_attention_impl.hpp"

PKV_FUZZ_INSTANTIATE(phasekv::f16_t)
