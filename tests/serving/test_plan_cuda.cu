// The batch plan arithmetic (serving/plan.hpp) and the page addressing (serving/paged.hpp) are
// host/device code: compiled by nvcc, run on the device (one thread) and compared with the
// host's answer. Skips without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "phasekv/serving/paged.hpp"
#include "phasekv/serving/plan.hpp"

namespace {

constexpr std::int64_t kBatch = 6, kChunk = 128, kWorkers = 3, kMaxItems = 64;

__global__ void plan_on_device(const std::int64_t* totals, phasekv::WorkItem* items,
                               std::int64_t* first, std::int64_t* worker_first,
                               std::int64_t* count) {
  *count = phasekv::plan_items(totals, kBatch, kChunk, items, first);
  phasekv::plan_balance(items, *count, kWorkers, worker_first);
}

__global__ void address_on_device(phasekv::PagePool<const float> pool, phasekv::BlockTable t,
                                  std::int64_t* offset) {
  *offset = pool.key(t.page(1, 1), 3, 1) - pool.keys;
}

bool has_device() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  (void)cudaGetLastError();
  return e == cudaSuccess && n > 0;
}

TEST(ServingPlanCuda, DeviceMatchesHost) {
  if (!has_device()) GTEST_SKIP() << "no CUDA device visible (cudaGetDeviceCount)";
  const std::int64_t totals[kBatch] = {0, 5000, 1, 130, 0, 64};
  std::vector<phasekv::WorkItem> items(kMaxItems);
  std::vector<std::int64_t> first(kBatch + 1), wf(kWorkers + 1);
  const std::int64_t n = phasekv::plan_items(totals, kBatch, kChunk, items.data(), first.data());
  phasekv::plan_balance(items.data(), n, kWorkers, wf.data());
  std::int64_t *d_totals, *d_first, *d_wf, *d_count;
  phasekv::WorkItem* d_items;
  ASSERT_EQ(cudaMalloc(&d_totals, sizeof(totals)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_items, kMaxItems * sizeof(phasekv::WorkItem)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_first, (kBatch + 1) * sizeof(std::int64_t)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_wf, (kWorkers + 1) * sizeof(std::int64_t)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_count, sizeof(std::int64_t)), cudaSuccess);
  cudaMemcpy(d_totals, totals, sizeof(totals), cudaMemcpyHostToDevice);
  plan_on_device<<<1, 1>>>(d_totals, d_items, d_first, d_wf, d_count);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::int64_t count = -1;
  std::vector<phasekv::WorkItem> items_d(kMaxItems);
  std::vector<std::int64_t> first_d(kBatch + 1), wf_d(kWorkers + 1);
  cudaMemcpy(&count, d_count, sizeof(count), cudaMemcpyDeviceToHost);
  cudaMemcpy(items_d.data(), d_items, kMaxItems * sizeof(phasekv::WorkItem),
             cudaMemcpyDeviceToHost);
  cudaMemcpy(first_d.data(), d_first, first_d.size() * sizeof(std::int64_t),
             cudaMemcpyDeviceToHost);
  cudaMemcpy(wf_d.data(), d_wf, wf_d.size() * sizeof(std::int64_t), cudaMemcpyDeviceToHost);
  EXPECT_EQ(count, n);
  for (std::int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(items_d[i].sequence, items[i].sequence);
    EXPECT_EQ(items_d[i].begin, items[i].begin);
    EXPECT_EQ(items_d[i].end, items[i].end);
  }
  EXPECT_EQ(first_d, first);
  EXPECT_EQ(wf_d, wf);
  // page addressing: HND pages of 4 slots, 2 heads, d 8; sequence 1's second page is page 5
  const std::int32_t indptr[] = {0, 1, 3}, indices[] = {2, 0, 5};
  std::int32_t *d_indptr, *d_indices;
  cudaMalloc(&d_indptr, sizeof(indptr));
  cudaMalloc(&d_indices, sizeof(indices));
  cudaMemcpy(d_indptr, indptr, sizeof(indptr), cudaMemcpyHostToDevice);
  cudaMemcpy(d_indices, indices, sizeof(indices), cudaMemcpyHostToDevice);
  float* d_pool;
  ASSERT_EQ(cudaMalloc(&d_pool, 8 * 4 * 2 * 8 * sizeof(float)), cudaSuccess);
  const auto pool =
      phasekv::make_page_pool<const float>(d_pool, d_pool, 8, 4, 2, 8, 8, phasekv::Layout::HND);
  address_on_device<<<1, 1>>>(pool, phasekv::csr_block_table(d_indptr, d_indices, 2), d_count);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::int64_t off = -1;
  cudaMemcpy(&off, d_count, sizeof(off), cudaMemcpyDeviceToHost);
  EXPECT_EQ(off, 5 * 64 + (1 * 4 + 3) * 8);
  for (void* p :
       {static_cast<void*>(d_totals), static_cast<void*>(d_items), static_cast<void*>(d_first),
        static_cast<void*>(d_wf), static_cast<void*>(d_count), static_cast<void*>(d_indptr),
        static_cast<void*>(d_indices), static_cast<void*>(d_pool)})
    cudaFree(p);
}

}  // namespace
