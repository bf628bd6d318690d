// phasekv: one target pass of core/foreach_target.hpp (no include guard on purpose): compiles
// PHASEKV_TARGET_BODY with the pass macros the caller defined, then undefines them (all but
// PHASEKV_TGT_NEON, which foreach_target.hpp manages).
#include PHASEKV_TARGET_BODY
#undef PHASEKV_TGT_NS
#undef PHASEKV_TGT_SIMD
#undef PHASEKV_TGT_AVX2
#undef PHASEKV_TGT_AVX512
#undef PHASEKV_TGT_AVX512BF16
