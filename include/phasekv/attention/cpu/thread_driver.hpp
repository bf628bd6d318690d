/// @file
/// @brief Convenience drivers that run the partitioned decode and prefill kernels on a
/// ThreadPool (std::thread). Engines with their own pool call decode_partition /
/// decode_merge / prefill_partition directly with their (thread index, thread count).
#pragma once

#include <cstddef>
#include <vector>

#include "phasekv/attention/cpu/arch.hpp"
#include "phasekv/attention/cpu/decode.hpp"
#include "phasekv/attention/cpu/prefill.hpp"
#include "phasekv/attention/cpu/thread_pool.hpp"
#include "phasekv/core/config.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cpu {

/// Split-KV decode over all threads of `pool` using the caller's `workspace`
/// (>= decode_workspace_size(args, pool.size()) bytes): every thread computes its partial,
/// then every thread merges its share of the heads into `args.out` / `args.lse`.
template <class Arch = arch::Auto, class T, class Variant>
void decode_parallel(const DecodeArgs<T, Variant>& args, ThreadPool& pool, void* workspace,
                     std::size_t workspace_bytes) {
  check_decode_args(args, "phasekv::cpu::decode_parallel", true);
  const int n = pool.size();
  phasekv::detail::check_arg<capacity_error>(workspace_bytes >= decode_workspace_size(args, n),
                                    "phasekv::cpu::decode_parallel", "workspace_bytes",
                                    workspace_bytes, "must be >= decode_workspace_size()");
  pool.run([&](int i, int count) {
    decode_partition<Arch>(args, workspace, workspace_bytes, i, count);
  });
  if (n == 1) {
    decode_merge(args, workspace, workspace_bytes, n);
    return;
  }
  pool.run([&](int i, int count) {
    decode_merge(args, workspace, workspace_bytes, n, i, count);
  });
}

/// Split-KV decode over `pool` with a workspace allocated for this call.
template <class Arch = arch::Auto, class T, class Variant>
void decode_parallel(const DecodeArgs<T, Variant>& args, ThreadPool& pool) {
  check_decode_args(args, "phasekv::cpu::decode_parallel", true);
  std::vector<float> ws(decode_workspace_size(args, pool.size()) / sizeof(float));
  decode_parallel<Arch>(args, pool, ws.data(), ws.size() * sizeof(float));
}

/// Prefill over all threads of `pool` (each thread takes its share of the (KV head, query
/// tile) work items).
template <class Arch = arch::Auto, class T, class Variant>
void prefill_parallel(const PrefillArgs<T, Variant>& args, ThreadPool& pool) {
  check_prefill_args(args, "phasekv::cpu::prefill_parallel");
  pool.run([&](int i, int count) { prefill_partition<Arch>(args, i, count); });
}

}  // namespace cpu
PHASEKV_NAMESPACE_END
