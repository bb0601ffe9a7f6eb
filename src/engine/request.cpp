#include "engine/request.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace flashnext {

const char* end_reason_name(EndReason r) {
  switch (r) {
    case EndReason::None:
      return "";
    case EndReason::Stop:
      return "stop";
    case EndReason::Length:
      return "length";
    case EndReason::Abort:
      return "abort";
    case EndReason::Error:
      return "error";
  }
  return "";
}

void RequestStream::push_token(int32_t token, std::optional<TokenLogprobs> logprobs, Clock::time_point when) {
  {
    std::lock_guard lock(mutex_);
    if (finished_) return;
    pending_.tokens.push_back(token);
    if (logprobs) pending_.logprobs.push_back(std::move(*logprobs));
    pending_.times.push_back(when);
  }
  cv_.notify_one();
}

void RequestStream::push_prompt_logprobs(std::vector<TokenLogprobs> logprobs) {
  {
    std::lock_guard lock(mutex_);
    if (finished_) return;
    for (auto& lp : logprobs) pending_.prompt_logprobs.push_back(std::move(lp));
  }
  cv_.notify_one();
}

void RequestStream::mark_scheduled(Clock::time_point when, int64_t cached_tokens) {
  {
    std::lock_guard lock(mutex_);
    if (scheduled_ || finished_) return;
    scheduled_ = true;
    pending_.scheduled = when;
    pending_.cached_tokens = cached_tokens;
  }
  cv_.notify_one();
}

void RequestStream::finish(EndReason reason, std::optional<int32_t> stop_token, std::string error) {
  {
    std::lock_guard lock(mutex_);
    if (finished_) return;
    finished_ = true;
    pending_.finish = reason;
    pending_.stop_token = stop_token;
    pending_.error = std::move(error);
  }
  cv_.notify_one();
}

RequestStream::Update RequestStream::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  cv_.wait_for(lock, timeout, [&] {
    return !pending_.tokens.empty() || !pending_.prompt_logprobs.empty() || pending_.finish != EndReason::None ||
           pending_.scheduled.has_value();
  });
  Update out = std::move(pending_);
  pending_ = Update{};
  return out;
}

bool RequestStream::finished() const {
  std::lock_guard lock(mutex_);
  return finished_;
}

TokenLogprobs compute_logprobs(std::span<const float> logits, int32_t token, int top) {
  FN_CHECK(token >= 0 && size_t(token) < logits.size(), "compute_logprobs: token {} outside [0, {})", token,
           logits.size());
  double m = -std::numeric_limits<double>::infinity();
  for (float l : logits) {
    if (std::isfinite(l)) m = std::max(m, double(l));
  }
  FN_CHECK(std::isfinite(m), "compute_logprobs: no finite logit");
  double sum = 0;
  for (float l : logits) {
    if (std::isfinite(l)) sum += std::exp(double(l) - m);
  }
  const double lse = m + std::log(sum);
  auto logp = [&](int32_t id) {
    float l = logits[size_t(id)];
    return std::isfinite(l) ? float(double(l) - lse) : -std::numeric_limits<float>::infinity();
  };
  TokenLogprobs out;
  out.logprob = logp(token);
  top = std::clamp(top, 0, int(logits.size()));
  if (top > 0) {
    std::vector<int32_t> ids(logits.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
    auto key = [&](int32_t id) { return std::isfinite(logits[size_t(id)]) ? logits[size_t(id)] : -INFINITY; };
    std::partial_sort(ids.begin(), ids.begin() + top, ids.end(), [&](int32_t a, int32_t b) {
      float ka = key(a), kb = key(b);
      return ka > kb || (ka == kb && a < b);
    });
    for (int i = 0; i < top; ++i) out.top.emplace_back(ids[size_t(i)], logp(ids[size_t(i)]));
  }
  return out;
}

}  // namespace flashnext
