// The engine's side of runtime dispatch between builds of the phasekv decode kernel: one
// translation unit (kernel.cpp) is compiled once per instruction set, and main.cpp, compiled
// for the baseline, picks the widest build the CPU supports.
//
// Nothing in this interface is a phasekv type. phasekv puts everything into an inline
// namespace named after the translation unit's instruction-set flags (PHASEKV_ISA_NAMESPACE),
// so a phasekv type in a signature shared by translation units built with different flags
// would name a different type on each side and not link. That is deliberate: it is what keeps
// the linker from handing a baseline caller an inline function compiled for AVX-512.
#pragma once

#include <cstddef>
#include <cstdint>

namespace engine {

/// One decode step as the engine describes it: plain pointers and sizes. K/V are bf16 bit
/// patterns (the upper half of an IEEE binary32), token-major `[tokens, kv_heads, d]`.
struct DecodeStep {
  const float* q = nullptr;  // [q_heads, d]
  std::int64_t q_heads = 0, kv_heads = 0, d = 0;
  std::int64_t window = 0, stride = 0;     // compression geometry W / S
  std::int64_t local = 0;                  // raw local window L
  std::int64_t n = 0;                      // tokens in the sequence so far
  const std::uint16_t* raw_k = nullptr;    // [n, kv_heads, d]
  const std::uint16_t* raw_v = nullptr;    // [n, kv_heads, d]
  const std::uint16_t* entry_k = nullptr;  // [entries, kv_heads, d], at least J(n) entries
  const std::uint16_t* entry_v = nullptr;
  std::int64_t entries = 0;
  void* workspace = nullptr;  // workspace_bytes(step) bytes, owned by the engine
  std::size_t workspace_bytes = 0;
  float* out = nullptr;  // [q_heads, d]
  float* lse = nullptr;  // [q_heads]
};

/// What one build of kernel.cpp exports.
struct KernelBuild {
  const char* name = nullptr;           // the build's name in this example
  const char* isa_namespace = nullptr;  // phasekv::isa_namespace() inside that build
  const char* arch = nullptr;           // phasekv::cpu::NativeArch::name inside that build
  std::size_t (*workspace_bytes)(const DecodeStep&) = nullptr;
  void (*decode)(const DecodeStep&) = nullptr;
};

KernelBuild kernel_build_base();    // kernel.cpp for the baseline (x86-64, or AArch64 NEON)
KernelBuild kernel_build_avx2();    // kernel.cpp with -mavx2 -mfma -mf16c
KernelBuild kernel_build_avx512();  // kernel.cpp with -mavx512f -mavx512bw -mavx512vl ...

}  // namespace engine
