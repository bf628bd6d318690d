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

namespace detail {

/// decode_parallel after its checks (`workspace` holds decode_workspace_size(args,
/// pool.size()) bytes).
template <class Arch, class T, class Variant>
void decode_parallel_unchecked(const DecodeArgs<T, Variant>& args, ThreadPool& pool,
                               void* workspace) {
  const int n = pool.size();
  pool.run([&](int i, int count) { decode_partition_unchecked<Arch>(args, workspace, i, count); });
  if (n == 1) {
    decode_merge_unchecked(args, workspace, n, 0, 1);
    return;
  }
  pool.run([&](int i, int count) { decode_merge_unchecked(args, workspace, n, i, count); });
}

/// decode_parallel's checks; true when the call is a size query (`workspace` null and `query`
/// non-null: the size was stored in `*query`).
template <class T, class Variant>
bool check_decode_parallel(const DecodeArgs<T, Variant>& args, const ThreadPool& pool,
                           void* workspace, std::size_t workspace_bytes, std::size_t* query) {
  const char* where = "phasekv::cpu::decode_parallel";
  check_decode_args(args, where, true);
  if (workspace == nullptr && query != nullptr) {
    *query = decode_args_workspace_bytes(args, pool.size());
    return true;
  }
  check_decode_workspace(where, args, workspace, workspace_bytes, pool.size());
  return false;
}

}  // namespace detail

/// Split-KV decode over all threads of `pool` using the caller's `workspace`: every thread
/// computes its partial, then every thread merges its share of the heads into `args.out` /
/// `args.lse`. Workspace protocol as decode_partition's: a null `workspace` stores the bytes
/// needed (decode_workspace_size(args, pool.size())) in `workspace_bytes` and returns.
template <class Arch = arch::Auto, class T, class Variant>
void decode_parallel(const DecodeArgs<T, Variant>& args, ThreadPool& pool, void* workspace,
                     std::size_t& workspace_bytes) {
  if (detail::check_decode_parallel(args, pool, workspace, workspace_bytes, &workspace_bytes))
    return;
  detail::decode_parallel_unchecked<Arch>(args, pool, workspace);
}

/// decode_parallel with a workspace size it cannot write back (a constant or temporary):
/// `workspace` must point to `workspace_bytes` >= decode_workspace_size(args, pool.size())
/// bytes.
template <class Arch = arch::Auto, class T, class Variant>
void decode_parallel(const DecodeArgs<T, Variant>& args, ThreadPool& pool, void* workspace,
                     const std::size_t& workspace_bytes) {
  detail::check_decode_parallel(args, pool, workspace, workspace_bytes, nullptr);
  detail::decode_parallel_unchecked<Arch>(args, pool, workspace);
}

/// Split-KV decode over `pool` with a workspace allocated for this call.
template <class Arch = arch::Auto, class T, class Variant>
void decode_parallel(const DecodeArgs<T, Variant>& args, ThreadPool& pool) {
  check_decode_args(args, "phasekv::cpu::decode_parallel", true);
  std::vector<float> ws(detail::decode_args_workspace_bytes(args, pool.size()) / sizeof(float));
  detail::decode_parallel_unchecked<Arch>(args, pool, ws.data());
}

/// Prefill over all threads of `pool` (each thread takes its share of the (KV head, query
/// tile) work items).
template <class Arch = arch::Auto, class T, class Variant>
void prefill_parallel(const PrefillArgs<T, Variant>& args, ThreadPool& pool) {
  check_prefill_args(args, "phasekv::cpu::prefill_parallel");
  pool.run([&](int i, int count) { detail::prefill_partition_unchecked<Arch>(args, i, count); });
}

}  // namespace cpu
PHASEKV_NAMESPACE_END
