// fuzz_attention, f32 storage.
#include "fuzz_attention_impl.hpp"

PKV_FUZZ_INSTANTIATE(float)
