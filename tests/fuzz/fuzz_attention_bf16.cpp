// fuzz_attention, bf16 storage.
#include "fuzz_attention_impl.hpp"

PKV_FUZZ_INSTANTIATE(phasekv::bf16_t)
