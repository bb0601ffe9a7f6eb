// The threads that drive the ranks of a tensor-parallel group in one process: rank 0 runs on the calling thread,
// ranks 1..N-1 on persistent worker threads, all on the same job, in lock step through their collectives
// (parallel/communicator.h). One node is one process with one thread per rank (docs/ENGINE.md).
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "parallel/communicator.h"

namespace flashnext {

class RankThreads {
 public:
  /// Starts world - 1 worker threads. `comms` (one per rank, or empty) are aborted when a rank's job throws, so that
  /// the other ranks leave their collectives, and reset once every rank returned. `timeout_s` > 0 (world > 1, or
  /// communicators of a larger group whose other ranks live in other processes): a
  /// watchdog thread aborts them too when a run has not finished after that many seconds (a rank that hangs, or
  /// never reaches a collective the others wait in), and the run then throws Error saying so once every rank
  /// returned. A rank stuck outside any collective (in its own host code) is not interrupted: the run waits for it.
  RankThreads(int world, std::vector<std::shared_ptr<Communicator>> comms, double timeout_s = 0);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int world() const { return world_; }

  /// Calls job(r) for every rank r at once (r = 0 on this thread) and returns when all returned. When jobs throw,
  /// rethrows the first failure (by time: the cause, not the "another rank failed" errors it triggered in the others)
  /// after every rank returned. Not reentrant; one run at a time.
  void run(const std::function<void(int rank)>& job);

 private:
  void worker(int rank);
  void run_rank(int rank);
  void watchdog();
  /// Records `error` as the run's failure when it is the first, and then aborts the communicators.
  void fail_run(std::exception_ptr error);

  const int world_;
  std::vector<std::shared_ptr<Communicator>> comms_;
  const double timeout_s_;
  /// The ranks have peers (here or in other processes): runs are watched and failures abort the communicators.
  const bool group_;
  std::vector<std::thread> threads_;
  std::thread watchdog_;
  std::condition_variable watch_;
  bool in_run_ = false;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int running_ = 0;
  bool stop_ = false;
  std::exception_ptr first_error_;
};

}  // namespace flashnext
