#include "parallel/rank_threads.h"

#include <fmt/format.h>

#include <chrono>

#include "core/error.h"

namespace flashnext {

RankThreads::RankThreads(int world, std::vector<std::shared_ptr<Communicator>> comms, double timeout_s)
    : world_(world),
      comms_(std::move(comms)),
      timeout_s_(timeout_s),
      group_(world > 1 || (!comms_.empty() && comms_[0]->world() > 1)) {
  FN_CHECK(world >= 1, "tensor parallel: a group needs at least one rank, got {}", world);
  for (int r = 1; r < world; ++r) threads_.emplace_back([this, r] { worker(r); });
  if (group_ && timeout_s > 0) watchdog_ = std::thread([this] { watchdog(); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  watch_.notify_all();
  for (std::thread& t : threads_) t.join();
  if (watchdog_.joinable()) watchdog_.join();
}

void RankThreads::fail_run(std::exception_ptr error) {
  bool first = false;
  {
    std::lock_guard lock(mu_);
    if (!first_error_) first_error_ = std::move(error), first = true;
  }
  if (!first) return;
  std::string reason = "a rank failed";
  try {
    std::rethrow_exception(first_error_);
  } catch (const std::exception& e) {
    reason = e.what();
  } catch (...) {
  }
  for (auto& c : comms_) c->abort(reason);
}

void RankThreads::run_rank(int rank) {
  try {
    (*job_)(rank);
  } catch (...) {
    fail_run(std::current_exception());
  }
}

void RankThreads::watchdog() {
  std::unique_lock lock(mu_);
  for (;;) {
    watch_.wait(lock, [&] { return stop_ || in_run_; });
    if (stop_) return;
    const uint64_t gen = generation_;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
    if (watch_.wait_until(lock, deadline, [&] { return stop_ || !in_run_ || generation_ != gen; })) {
      if (stop_) return;
      // the run finished in time: wait for the end of this one before the next
      watch_.wait(lock, [&] { return stop_ || !in_run_ || generation_ != gen; });
      continue;
    }
    // Timed out, the same run still in progress: fail it and abort, under the lock, so that neither can reach the
    // next run (run() resets the communicators only after it has read the failure).
    if (!first_error_) {
      const std::string why = fmt::format(
          "tensor parallel: a step of the {} ranks did not finish within {:g} s (FLASHNEXT_TP_TIMEOUT); the group was "
          "aborted (a rank hung or never reached a collective the others wait in)",
          comms_.empty() ? world_ : comms_[0]->world(), timeout_s_);
      first_error_ = std::make_exception_ptr(Error(why));
      for (auto& c : comms_) c->abort(why);
    }
    watch_.wait(lock, [&] { return stop_ || !in_run_ || generation_ != gen; });
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
  if (!group_) {
    job(0);
    return;
  }
  {
    std::lock_guard lock(mu_);
    job_ = &job;
    first_error_ = nullptr;
    running_ = world_ - 1;
    ++generation_;
    in_run_ = true;
  }
  wake_.notify_all();
  watch_.notify_all();
  run_rank(0);
  std::exception_ptr error;
  {
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return running_ == 0; });
    job_ = nullptr;
    in_run_ = false;
    error = first_error_;
  }
  watch_.notify_all();
  if (error) {
    for (auto& c : comms_) c->reset();
    std::rethrow_exception(error);
  }
}

}  // namespace flashnext
