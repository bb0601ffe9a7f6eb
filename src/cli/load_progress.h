// Load progress on stderr for `generate`, `chat`, `serve`, `logits` and `bench --model`: a bar redrawn in place on a
// terminal, a plain line every 10% otherwise; silent for checkpoints under 1 GB (the bundled model loads at once).
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace flashnext::cli {

/// The progress text for `done` of `total` bytes after `seconds`: "loading 12.3 / 78.0 GB (15%, 4.5 GB/s)", with a
/// 30-character bar in front when `bar`.
inline std::string format_load_progress(int64_t done, int64_t total, double seconds, bool bar) {
  const double frac = total > 0 ? double(done) / double(total) : 1.0;
  const double rate = seconds > 0 ? double(done) / seconds / 1e9 : 0.0;
  std::string s;
  if (bar) {
    const int filled = int(frac * 30 + 0.5);
    s = "[" + std::string(size_t(filled), '#') + std::string(size_t(30 - filled), ' ') + "] ";
  }
  return s + fmt::format("loading {:.1f} / {:.1f} GB ({:.0f}%, {:.1f} GB/s)", double(done) / 1e9,
                         double(total) / 1e9, 100 * frac, rate);
}

/// A LoadProgress callback (model.h) that prints format_load_progress on stderr: on a terminal at most every 0.2 s
/// and at the end, redrawn in place; otherwise a line at every 10% step. Nothing for totals under `min_bytes`.
class LoadProgressPrinter {
 public:
  explicit LoadProgressPrinter(int64_t min_bytes = int64_t(1) << 30)
      : min_bytes_(min_bytes), tty_(isatty(fileno(stderr)) != 0), t0_(std::chrono::steady_clock::now()) {}

  void operator()(int64_t done, int64_t total) {
    if (total < min_bytes_) return;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    const bool end = done >= total;
    if (tty_) {
      if (!end && s - last_s_ < 0.2) return;
      last_s_ = s;
      std::fprintf(stderr, "\r%s%s", format_load_progress(done, total, s, true).c_str(), end ? "\n" : "");
      return;
    }
    const int step = total > 0 ? int(10 * done / total) : 10;
    if (step <= last_step_) return;
    last_step_ = step;
    std::fprintf(stderr, "flashnext: %s\n", format_load_progress(done, total, s, false).c_str());
  }

 private:
  int64_t min_bytes_;
  bool tty_;
  std::chrono::steady_clock::time_point t0_;
  double last_s_ = -1;
  int last_step_ = 0;
};

}  // namespace flashnext::cli
