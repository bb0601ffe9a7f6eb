// The default (host-clock) profile marks of ops/ops.h, for synchronous backends.
#include <chrono>

#include "ops/ops.h"

namespace flashnext {

namespace {
double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

void Ops::profile_phase(const char* phase) {
  if (!profiling_) return;
  const double t = now_ms();
  if (phase_) {
    auto it = phase_ms_.begin();
    while (it != phase_ms_.end() && it->first != phase_) ++it;
    if (it == phase_ms_.end()) it = phase_ms_.insert(it, {phase_, 0.0});
    it->second += t - phase_start_ms_;
  }
  phase_ = phase;
  phase_start_ms_ = t;
}

void Ops::set_profiling(bool on) {
  profiling_ = on;
  phase_ = nullptr;
  phase_ms_.clear();
}

std::vector<std::pair<std::string, double>> Ops::profile_times() {
  return phase_ms_;
}

}  // namespace flashnext
