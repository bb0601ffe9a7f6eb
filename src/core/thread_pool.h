// A small fixed-size thread pool for data-parallel loops (matmul rows, heads, experts).
//
// One pool is shared by all ops of a backend. parallel_for splits [0, n) into contiguous ranges and runs them on the
// workers and the calling thread; it blocks until every range is done. A parallel_for issued from inside a running
// range (nested parallelism) runs serially on the calling thread, so ops may call each other freely.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace flashnext {

class ThreadPool {
 public:
  /// Starts `threads` - 1 workers (the caller is the last thread). `threads` <= 0 means
  /// std::thread::hardware_concurrency() (at least 1).
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Number of threads that run work, the caller included.
  int size() const { return int(workers_.size()) + 1; }

  /// Calls fn(begin, end) on disjoint ranges covering [0, n), each at least `grain` items long (except possibly the
  /// last), in parallel. Blocks until all ranges finished; the first exception thrown by fn is rethrown here after
  /// the others finished.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop();
  void run_ranges();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  uint64_t generation_ = 0;
  bool stop_ = false;
  // The job in flight (guarded by mu_ for setup, ranges claimed through next_).
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 0, num_chunks_ = 0;
  int64_t next_ = 0, finished_ = 0;
  int busy_workers_ = 0;
  std::exception_ptr error_;
  std::mutex job_mu_;  // serialises concurrent parallel_for calls from different threads
};

}  // namespace flashnext
