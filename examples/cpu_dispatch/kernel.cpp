// One build of the decode kernel. CMake compiles this file once per instruction set, each
// time with PHASEKV_EXAMPLE_BUILD set to the build's name (base, avx2, avx512), which names
// the exported factory (engine::kernel_build_<name>). Inside, phasekv::cpu::NativeArch follows
// the flags, so each build instantiates its own kernels, in its own phasekv namespace.
//
// It uses the split-KV API with the engine's workspace rather than the convenience
// phasekv::cpu::decode, which allocates a std::vector: standard-library inline functions are
// not in phasekv's namespace, and one compiled for AVX-512 here could be picked by the linker
// for the baseline build as well (the check_odr test lists such shared symbols).
#include "dispatch.hpp"

#include "phasekv/attention/cpu/decode.hpp"
#include "phasekv/phase/geometry.hpp"

#ifndef PHASEKV_EXAMPLE_BUILD
#error "compile kernel.cpp with -DPHASEKV_EXAMPLE_BUILD=<name>"
#endif
#define PHASEKV_EXAMPLE_CAT_(a, b) a##b
#define PHASEKV_EXAMPLE_CAT(a, b) PHASEKV_EXAMPLE_CAT_(a, b)

namespace {

using T = phasekv::bf16_t;  // a standard-layout struct holding the std::uint16_t bit pattern

phasekv::cpu::DecodeArgs<T> make_args(const engine::DecodeStep& s) {
  const phasekv::Geometry g(s.window, s.stride);
  const phasekv::Visibility vis = g.visible(s.n, s.local);
  auto view = [&](const std::uint16_t* p, std::int64_t first, std::int64_t tokens) {
    return phasekv::make_view(reinterpret_cast<const T*>(p) + first * s.kv_heads * s.d, tokens,
                              s.kv_heads, s.d);
  };
  phasekv::cpu::DecodeArgs<T> a;
  a.q = s.q;
  a.q_heads = s.q_heads;
  a.kv_heads = s.kv_heads;
  a.d_k = a.d_v = s.d;
  a.kv.push({view(s.raw_k, 0, vis.prefix_end), view(s.raw_v, 0, vis.prefix_end), 0,
             phasekv::SegmentKind::prefix});
  a.kv.push({view(s.entry_k, 0, vis.entries), view(s.entry_v, 0, vis.entries), 0,
             phasekv::SegmentKind::compressed});
  a.kv.push({view(s.raw_k, vis.raw_begin, vis.raw_count()),
             view(s.raw_v, vis.raw_begin, vis.raw_count()), vis.raw_begin,
             phasekv::SegmentKind::raw});
  a.out = s.out;
  a.lse = s.lse;
  return a;
}

std::size_t workspace_bytes(const engine::DecodeStep& s) {
  return phasekv::cpu::decode_workspace_size(make_args(s), 1);
}

void decode(const engine::DecodeStep& s) {
  const phasekv::cpu::DecodeArgs<T> a = make_args(s);
  // this build's own instruction set (main.cpp chooses the build; the default arch::Auto
  // would choose again at run time)
  phasekv::cpu::decode_partition<phasekv::cpu::NativeArch>(a, s.workspace, s.workspace_bytes, 0, 1);
  phasekv::cpu::decode_merge(a, s.workspace, s.workspace_bytes, 1);
}

}  // namespace

engine::KernelBuild engine::PHASEKV_EXAMPLE_CAT(kernel_build_, PHASEKV_EXAMPLE_BUILD)() {
  engine::KernelBuild b;
  b.name = PHASEKV_STRINGIFY(PHASEKV_EXAMPLE_BUILD);
  b.isa_namespace = phasekv::isa_namespace();
  b.arch = phasekv::cpu::NativeArch::name;
  b.workspace_bytes = &workspace_bytes;
  b.decode = &decode;
  return b;
}
