#include "engine/stop.h"

#include <algorithm>

#include "core/error.h"

namespace flashnext {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops, bool include_stop)
    : stops_(std::move(stops)), include_stop_(include_stop) {
  for (size_t i = 0; i < stops_.size(); ++i) {
    if (stops_[i].empty()) fail("stop string {} is empty; stop strings must be non-empty", i);
  }
}

StopStringMatcher::Result StopStringMatcher::feed(std::string_view piece) {
  FN_CHECK(!stopped_, "StopStringMatcher::feed called after a stop string matched");
  Result r;
  pending_.append(piece);
  if (stops_.empty()) {
    r.text.swap(pending_);
    return r;
  }
  // pending_ held no complete stop string before this piece, so any match ends inside the new piece; searching the
  // whole of pending_ (held prefix + piece) is cheap since the held part is shorter than the longest stop string.
  size_t best_pos = std::string::npos;
  for (size_t i = 0; i < stops_.size(); ++i) {
    size_t pos = pending_.find(stops_[i]);
    if (pos == std::string::npos) continue;
    if (pos < best_pos || (pos == best_pos && stops_[i].size() > stops_[size_t(r.matched)].size())) {
      best_pos = pos;
      r.matched = int(i);
    }
  }
  if (r.matched >= 0) {
    r.text = pending_.substr(0, best_pos + (include_stop_ ? stops_[size_t(r.matched)].size() : 0));
    r.stopped = stopped_ = true;
    pending_.clear();
    return r;
  }
  // Hold back the longest suffix of pending_ that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    for (size_t len = std::min(s.size() - 1, pending_.size()); len > hold; --len) {
      if (std::string_view(pending_).substr(pending_.size() - len) == std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  r.text = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return r;
}

std::string StopStringMatcher::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace flashnext
