// Helpers for the CUDA tests: device detection (skip without a device), RAII device buffers,
// random host tensors.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "phasekv/core/element.hpp"
#include "phasekv/core/view.hpp"

namespace pkv_cuda_test {

using i64 = std::int64_t;

// True when at least one CUDA device is usable. "No device" and "no driver" both count as
// absent; the sticky error state is cleared either way.
inline bool has_device() {
  static const bool present = [] {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    (void)cudaGetLastError();
    return e == cudaSuccess && n > 0;
  }();
  return present;
}

// Fixture base: skips every test of the suite when no device is present.
class DeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!has_device()) GTEST_SKIP() << "no CUDA device visible (cudaGetDeviceCount)";
  }
};

#define PKV_CUDA_OK(expr)                                                              \
  do {                                                                                 \
    const cudaError_t pkv_err_ = (expr);                                               \
    ASSERT_EQ(pkv_err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(pkv_err_); \
  } while (0)

// Owning device buffer of n elements of T (no copy, move only).
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    if (n > 0 && cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)) != cudaSuccess) {
      p_ = nullptr;
      n_ = 0;
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (p_ != nullptr) cudaFree(p_);
      p_ = o.p_;
      n_ = o.n_;
      o.p_ = nullptr;
      o.n_ = 0;
    }
    return *this;
  }
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  T* get() const { return p_; }
  std::size_t size() const { return n_; }
  bool ok(std::size_t want) const { return want == 0 || p_ != nullptr; }

  cudaError_t upload(const std::vector<T>& h) {
    return cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  cudaError_t download(std::vector<T>& h) const {
    h.resize(n_);
    return cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
  }
  // Fills every byte with 0xff (NaN in f32, bf16 and f16): outputs are poisoned before a run.
  cudaError_t poison() { return cudaMemset(p_, 0xff, n_ * sizeof(T)); }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

// Copies a host vector to a new device buffer.
template <class T>
DeviceBuffer<T> to_device(const std::vector<T>& h) {
  DeviceBuffer<T> d(h.size());
  if (d.get() != nullptr) (void)d.upload(h);
  return d;
}

// n random elements in [lo, hi), rounded to T.
template <class T>
std::vector<T> random_elems(std::mt19937_64& rng, std::size_t n, float lo = -1.0f,
                            float hi = 1.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = phasekv::from_float<T>(u(rng));
  return v;
}

// The same view geometry over another base pointer (host mirror <-> device buffer).
template <class T, class U>
phasekv::StridedView<const U> rebase(const phasekv::StridedView<const T>& v, const U* base,
                                     const T* old_base) {
  phasekv::StridedView<const U> r{};
  r.data = v.data == nullptr ? nullptr : base + (v.data - old_base);
  r.tokens = v.tokens;
  r.heads = v.heads;
  r.dim = v.dim;
  r.token_stride = v.token_stride;
  r.head_stride = v.head_stride;
  return r;
}

}  // namespace pkv_cuda_test
