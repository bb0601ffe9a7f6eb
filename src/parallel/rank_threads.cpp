#include "parallel/rank_threads.h"

#include "core/error.h"

namespace flashnext {

RankThreads::RankThreads(int world, std::vector<std::shared_ptr<Communicator>> comms)
    : world_(world), comms_(std::move(comms)) {
  FN_CHECK(world >= 1, "tensor parallel: a group needs at least one rank, got {}", world);
  for (int r = 1; r < world; ++r) threads_.emplace_back([this, r] { worker(r); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void RankThreads::run_rank(int rank) {
  try {
    (*job_)(rank);
  } catch (...) {
    bool first = false;
    {
      std::lock_guard lock(mu_);
      if (!first_error_) first_error_ = std::current_exception(), first = true;
    }
    if (first)
      for (auto& c : comms_) c->abort();
  }
}

void RankThreads::worker(int rank) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_rank(rank);
    std::lock_guard lock(mu_);
    if (--running_ == 0) done_.notify_all();
  }
}

void RankThreads::run(const std::function<void(int rank)>& job) {
  if (world_ == 1) {
    job(0);
    return;
  }
  {
    std::lock_guard lock(mu_);
    job_ = &job;
    first_error_ = nullptr;
    running_ = world_ - 1;
    ++generation_;
  }
  wake_.notify_all();
  run_rank(0);
  std::exception_ptr error;
  {
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return running_ == 0; });
    job_ = nullptr;
    error = first_error_;
  }
  if (error) {
    for (auto& c : comms_) c->reset();
    std::rethrow_exception(error);
  }
}

}  // namespace flashnext
