// Compiled with baseline x86-64 flags only (tests/dispatch/CMakeLists.txt) and never run:
// check_targets.cmake disassembles this object to check that run-time dispatch compiled the
// wide kernels (AVX-512 registers in the tgt_avx512* passes) and that no other function, the
// standard library's inline code included, picked up instructions beyond the flags.
#include <cstdint>

#include "phasekv/attention/cpu/decode.hpp"
#include "phasekv/attention/cpu/prefill.hpp"
#include "phasekv/compress/compress_batch.hpp"
#include "phasekv/compress/gated_pool.hpp"
#include "phasekv/compress/uniform_mean.hpp"

void pkv_dispatch_decode(const phasekv::cpu::DecodeArgs<phasekv::bf16_t>& a) {
  phasekv::cpu::decode(a);
}
void pkv_dispatch_decode_f(const phasekv::cpu::DecodeArgs<float>& a) { phasekv::cpu::decode(a); }
void pkv_dispatch_prefill(const phasekv::cpu::PrefillArgs<phasekv::bf16_t>& a) {
  phasekv::cpu::prefill(a);
}
std::int64_t pkv_dispatch_mean(const phasekv::UniformMean& p,
                               phasekv::StridedView<const phasekv::bf16_t> raw,
                               phasekv::StridedView<phasekv::bf16_t> entries) {
  return phasekv::compress_batch(p, raw, entries);
}
std::int64_t pkv_dispatch_gated(const phasekv::GatedPool& p,
                                phasekv::StridedView<const phasekv::bf16_t> raw,
                                phasekv::StridedView<phasekv::bf16_t> entries) {
  return phasekv::compress_batch(p, raw, entries);
}
