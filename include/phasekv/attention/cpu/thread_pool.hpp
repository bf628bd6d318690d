/// @file
/// @brief `ThreadPool`: a minimal persistent pool over std::thread that runs one job as
/// (thread index, thread count) calls, the calling thread taking index 0. A convenience for
/// driving the partitioned kernels; engines with their own pool call the kernels directly.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "phasekv/core/error.hpp"

namespace phasekv {
namespace cpu {

/// A fixed set of worker threads. `run(f)` calls `f(i, size())` once for every i in
/// `[0, size())` (index 0 on the calling thread) and returns when all calls have finished,
/// rethrowing the first exception any call threw. Not reentrant: one `run` at a time.
class ThreadPool {
 public:
  /// Starts `threads - 1` workers (`threads` >= 1).
  explicit ThreadPool(int threads) {
    phasekv::detail::check_arg(threads >= 1, "phasekv::cpu::ThreadPool", "threads", threads,
                      "must be >= 1");
    size_ = threads;
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { loop(i); });
  }
  ThreadPool(const ThreadPool&) = delete;             ///< Not copyable.
  ThreadPool& operator=(const ThreadPool&) = delete;  ///< Not copyable.
  /// Stops and joins the workers.
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      ++generation_;
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
      pending_ = size_ - 1;
      error_ = nullptr;
      ++generation_;
    }
    cv_start_.notify_all();
    std::exception_ptr mine;
    try {
      f(0, size_);
    } catch (...) {
      mine = std::current_exception();
    }
    std::unique_lock<std::mutex> lk(mu_);
    cv_done_.wait(lk, [this] { return pending_ == 0; });
    job_ = nullptr;
    if (mine) std::rethrow_exception(mine);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void loop(int index) {
    std::uint64_t seen = 0;
    for (;;) {
      const std::function<void(int, int)>* job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_start_.wait(lk, [&] { return generation_ != seen; });
        seen = generation_;
        if (stop_) return;
        job = job_;
      }
      std::exception_ptr err;
      try {
        (*job)(index, size_);
      } catch (...) {
        err = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (err && !error_) error_ = err;
        if (--pending_ == 0) cv_done_.notify_one();
      }
    }
  }

  int size_ = 1;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  const std::function<void(int, int)>* job_ = nullptr;
  int pending_ = 0;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace cpu
}  // namespace phasekv
