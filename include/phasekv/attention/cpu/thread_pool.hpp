/// @file
/// @brief `ThreadPool`: a minimal persistent pool over std::thread that runs one job as
/// (thread index, thread count) calls, the calling thread taking index 0. A convenience for
/// driving the partitioned kernels; engines with their own pool call the kernels directly.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "phasekv/core/config.hpp"
#include "phasekv/core/error.hpp"

PHASEKV_NAMESPACE_BEGIN
namespace cpu {

namespace detail {
/// A spin-wait hint to the CPU (pause / yield instruction), nothing elsewhere.
inline void cpu_relax() {
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
  __builtin_ia32_pause();
#elif (defined(__GNUC__) || defined(__clang__)) && defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/// Spins (with cpu_relax) until `done()` or until `spin` has elapsed; returns done().
template <class Done>
bool spin_until(const Done& done, std::chrono::microseconds spin) {
  if (done()) return true;
  if (spin.count() <= 0) return false;
  const auto until = std::chrono::steady_clock::now() + spin;
  for (;;) {
    for (int k = 0; k < 64; ++k) {
      if (done()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= until) return done();
  }
}
}  // namespace detail

/// A fixed set of worker threads. `run(f)` calls `f(i, size())` once for every i in
/// `[0, size())` (index 0 on the calling thread) and returns when all calls have finished,
/// rethrowing the first exception any call threw. Not reentrant: one `run` at a time.
///
/// Between jobs, workers (and the caller waiting for them) spin for up to `spin_us`
/// microseconds before they block on a condition variable: a decode step is tens of
/// microseconds to milliseconds, and waking a blocked thread costs about as much, so
/// back-to-back steps should find the workers spinning.
/// `spin_us = 0` blocks at once (no CPU burnt between jobs).
class ThreadPool {
 public:
  /// Starts `threads - 1` workers (`threads` >= 1) that spin `spin_us` (>= 0) microseconds
  /// for the next job before they block.
  explicit ThreadPool(int threads, int spin_us = 200) {
    phasekv::detail::check_arg(threads >= 1, "phasekv::cpu::ThreadPool", "threads", threads,
                               "must be >= 1");
    phasekv::detail::check_arg(spin_us >= 0, "phasekv::cpu::ThreadPool", "spin_us", spin_us,
                               "must be >= 0");
    size_ = threads;
    spin_ = std::chrono::microseconds(spin_us);
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { loop(i); });
  }
  ThreadPool(const ThreadPool&) = delete;             ///< Not copyable.
  ThreadPool& operator=(const ThreadPool&) = delete;  ///< Not copyable.
  /// Stops and joins the workers.
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_.store(true, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_start_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  /// Number of threads, the caller included.
  int size() const { return size_; }

  /// Runs `f(i, size())` for every i; see the class comment.
  void run(const std::function<void(int, int)>& f) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      job_ = &f;
      error_ = nullptr;
      pending_.store(size_ - 1, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);  // publishes job_ to spinners
    }
    cv_start_.notify_all();
    std::exception_ptr mine;
    try {
      f(0, size_);
    } catch (...) {
      mine = std::current_exception();
    }
    const auto all_done = [this] { return pending_.load(std::memory_order_acquire) == 0; };
    if (!detail::spin_until(all_done, spin_)) {
      std::unique_lock<std::mutex> lk(mu_);
      cv_done_.wait(lk, all_done);
    }
    std::exception_ptr err;
    {
      std::lock_guard<std::mutex> lk(mu_);
      job_ = nullptr;
      err = error_;
    }
    if (mine) std::rethrow_exception(mine);
    if (err) std::rethrow_exception(err);
  }

 private:
  void loop(int index) {
    std::uint64_t seen = 0;
    for (;;) {
      const auto started = [&] { return generation_.load(std::memory_order_acquire) != seen; };
      if (!detail::spin_until(started, spin_)) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_start_.wait(lk, started);
      }
      seen = generation_.load(std::memory_order_acquire);
      if (stop_.load(std::memory_order_relaxed)) return;
      const std::function<void(int, int)>* job = job_;
      std::exception_ptr err;
      try {
        (*job)(index, size_);
      } catch (...) {
        err = std::current_exception();
      }
      std::lock_guard<std::mutex> lk(mu_);
      if (err && !error_) error_ = err;
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) cv_done_.notify_one();
    }
  }

  int size_ = 1;
  std::chrono::microseconds spin_{0};
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<int> pending_{0};
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::exception_ptr error_;
};

}  // namespace cpu
PHASEKV_NAMESPACE_END
