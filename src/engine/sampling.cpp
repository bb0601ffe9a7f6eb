#include "engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "core/error.h"

namespace flashnext {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Largest logit, NaN entries ignored; -inf when none is above -inf.
float max_logit(std::span<const float> logits) {
  // Eight independent lanes so the compiler can keep them in one vector register (no -ffast-math needed).
  float m[8] = {kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf};
  size_t i = 0;
  for (; i + 8 <= logits.size(); i += 8) {
    for (int k = 0; k < 8; ++k) m[k] = logits[i + k] > m[k] ? logits[i + k] : m[k];
  }
  for (; i < logits.size(); ++i) m[0] = logits[i] > m[0] ? logits[i] : m[0];
  return *std::max_element(m, m + 8);
}

// True when some logit is NaN.
bool any_nan(std::span<const float> logits) {
  int bad[8] = {};
  size_t i = 0;
  for (; i + 8 <= logits.size(); i += 8) {
    for (int k = 0; k < 8; ++k) bad[k] |= logits[i + k] != logits[i + k];
  }
  for (; i < logits.size(); ++i) bad[0] |= logits[i] != logits[i];
  return std::any_of(bad, bad + 8, [](int b) { return b != 0; });
}

// A token that survived filtering so far: its (scaled) logit, id and unnormalised probability exp(logit - max).
struct Cand {
  double w;
  float logit;
  int32_t id;
};

// The order of the nucleus: descending logit, lowest id first on ties (a strict total order).
bool before(const Cand& a, const Cand& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// Sets w = exp(logit - max logit) for every candidate; returns their sum.
double weigh(std::vector<Cand>& c) {
  float lmax = kNegInf;
  for (auto& x : c) lmax = std::max(lmax, x.logit);
  double z = 0;
  for (auto& x : c) z += (x.w = std::exp(x.logit - lmax));  // float exp: ~4x faster, 1e-7 relative error
  return z;
}

// All tokens with logit > -inf (NaN skipped), in id order.
std::vector<Cand> gather(std::span<const float> logits, float threshold = kNegInf) {
  std::vector<Cand> c;
  if (threshold == kNegInf) c.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] > kNegInf && logits[i] >= threshold) c.push_back({0.0, logits[i], int32_t(i)});
  }
  return c;
}

// The k-th largest logit (k >= 1, k < size), by a size-k min-heap: one pass, no copy of the logits.
float kth_largest(std::span<const float> logits, int64_t k) {
  std::vector<float> heap;
  heap.reserve(size_t(k));
  for (float l : logits) {
    if (std::isnan(l)) continue;
    if (heap.size() < size_t(k)) {
      heap.push_back(l);
      std::push_heap(heap.begin(), heap.end(), std::greater<float>());
    } else if (l > heap.front()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<float>());
      heap.back() = l;
      std::push_heap(heap.begin(), heap.end(), std::greater<float>());
    }
  }
  return heap.empty() ? kNegInf : heap.front();
}

// Top-k candidates (ties with the k-th kept), in id order.
std::vector<Cand> top_k_cands(std::span<const float> logits, int64_t k) {
  if (k <= 0 || size_t(k) >= logits.size()) return gather(logits);
  return gather(logits, kth_largest(logits, k));
}

// Nucleus filter on weighed candidates (`z` = sum of w): keeps, in `before` order, each candidate while the mass
// before it is < p * z. A quickselect on mass (expected O(n)) instead of a full sort; the kept candidates end up
// first, in a deterministic order.
void top_p_cands(std::vector<Cand>& c, double z, double p) {
  if (p >= 1.0 || c.size() <= 1) return;
  const double target = p * z;
  size_t lo = 0, hi = c.size(), keep = 0;
  double acc = 0;  // mass of c[0, lo), all of which is kept; invariant: acc < target
  // Invariant: every element of [0, lo) comes before every element of [lo, hi), which come before [hi, n).
  while (hi - lo > 32 && keep == 0) {
    const Cand pivot = c[lo + (hi - lo) / 2];
    auto mid_it =
        std::stable_partition(c.begin() + lo, c.begin() + hi, [&](const Cand& x) { return before(x, pivot); });
    size_t mid = size_t(mid_it - c.begin());
    auto piv_it = std::find_if(mid_it, c.begin() + hi, [&](const Cand& x) { return x.id == pivot.id; });
    std::rotate(mid_it, piv_it, piv_it + 1);  // pivot to position mid, the rest keeps its order
    double left = 0;
    for (size_t i = lo; i < mid; ++i) left += c[i].w;
    if (acc + left >= target) {
      hi = mid;
    } else {
      acc += left + c[mid].w;
      lo = mid + 1;
      if (acc >= target) keep = lo;
    }
  }
  if (keep == 0) {
    std::sort(c.begin() + lo, c.begin() + hi, before);
    keep = hi;  // reached only through rounding: mass of [lo, hi) was >= target - acc when hi was set
    for (size_t i = lo; i < hi; ++i) {
      if (acc >= target) {
        keep = i;
        break;
      }
      acc += c[i].w;
    }
  }
  c.resize(std::max<size_t>(keep, 1));
}

// Min-p on weighed candidates: keeps w >= min_p * max w.
void min_p_cands(std::vector<Cand>& c, double min_p) {
  if (min_p <= 0 || c.empty()) return;
  double wmax = 0;
  for (auto& x : c) wmax = std::max(wmax, x.w);
  std::erase_if(c, [&](const Cand& x) { return !(x.w >= min_p * wmax); });
}

// Inverse-CDF draw over the candidates in their current order.
int32_t draw(const std::vector<Cand>& c, std::mt19937_64& rng) {
  FN_CHECK(!c.empty(), "sampling: every token was filtered out (no logit above -inf)");
  double z = 0;
  for (auto& x : c) z += x.w;
  const double u = uniform01(rng) * z;
  double acc = 0;
  for (auto& x : c) {
    acc += x.w;
    if (u < acc) return x.id;
  }
  return c.back().id;  // u within rounding of z
}

// Writes -inf into every logit whose id is not among `c`.
void mask_to(std::span<float> logits, const std::vector<Cand>& c) {
  std::vector<uint8_t> keep(logits.size(), 0);
  for (auto& x : c) keep[size_t(x.id)] = 1;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!keep[i]) logits[i] = kNegInf;
  }
}

// Inverse-CDF draw from softmax(logits * inv_t) over the whole row, in id order, without a candidate list: sum the
// weights, then walk them again up to the drawn mass.
int32_t draw_row(std::span<const float> logits, float inv_t, std::mt19937_64& rng) {
  const float lmax = max_logit(logits);
  FN_CHECK(lmax > kNegInf, "sampling: every token was filtered out (all {} logits are -inf or NaN)", logits.size());
  if (std::isinf(lmax)) return int32_t(std::find(logits.begin(), logits.end(), lmax) - logits.begin());
  double z = 0;
  for (float l : logits) z += l > kNegInf ? std::exp((l - lmax) * inv_t) : 0.f;
  const double u = uniform01(rng) * z;
  double acc = 0;
  int32_t last = -1;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!(logits[i] > kNegInf)) continue;
    acc += std::exp((logits[i] - lmax) * inv_t);
    last = int32_t(i);
    if (u < acc) return last;
  }
  return last;  // u within rounding of z
}

}  // namespace

void validate(const SamplingParams& p, int64_t vocab_size) {
  if (!(p.temperature >= 0.0) || !std::isfinite(p.temperature))
    fail("sampling: temperature must be a finite number >= 0 (0 = greedy), got {}", p.temperature);
  if (p.top_k < -1) fail("sampling: top_k must be -1 or 0 (disabled) or >= 1, got {}", p.top_k);
  if (!(p.top_p > 0.0 && p.top_p <= 1.0)) fail("sampling: top_p must be in (0, 1], got {}", p.top_p);
  if (!(p.min_p >= 0.0 && p.min_p <= 1.0)) fail("sampling: min_p must be in [0, 1], got {}", p.min_p);
  if (!(p.repetition_penalty > 0.0) || !std::isfinite(p.repetition_penalty))
    fail("sampling: repetition_penalty must be a finite number > 0 (1 = off), got {}", p.repetition_penalty);
  if (!(p.presence_penalty >= -2.0 && p.presence_penalty <= 2.0))
    fail("sampling: presence_penalty must be in [-2, 2], got {}", p.presence_penalty);
  if (!(p.frequency_penalty >= -2.0 && p.frequency_penalty <= 2.0))
    fail("sampling: frequency_penalty must be in [-2, 2], got {}", p.frequency_penalty);
  if (p.max_tokens < 0) fail("sampling: max_tokens must be >= 0, got {}", p.max_tokens);
  if (p.min_tokens < 0 || p.min_tokens > p.max_tokens)
    fail("sampling: min_tokens must be in [0, max_tokens = {}], got {}", p.max_tokens, p.min_tokens);
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || id >= vocab_size)
      fail("sampling: logit_bias token id {} is out of range [0, {}) of the model's vocabulary", id, vocab_size);
    if (!(bias >= -100.f && bias <= 100.f))
      fail("sampling: logit_bias of token {} must be in [-100, 100], got {}", id, bias);
  }
  for (size_t i = 0; i < p.stop.size(); ++i) {
    if (p.stop[i].empty()) fail("sampling: stop string {} is empty; stop strings must be non-empty", i);
  }
  for (int64_t id : p.stop_token_ids) {
    if (id < 0 || id >= vocab_size)
      fail("sampling: stop token id {} is out of range [0, {}) of the model's vocabulary", id, vocab_size);
  }
}

void apply_repetition_penalty(std::span<float> logits, std::span<const int32_t> tokens, double penalty) {
  if (penalty == 1.0) return;
  for (int32_t id : tokens) {
    float& l = logits[size_t(id)];
    l = l > 0 ? float(l / penalty) : float(l * penalty);
  }
}

void apply_presence_frequency(std::span<float> logits, std::span<const int32_t> ids, std::span<const int32_t> counts,
                              double presence, double frequency) {
  FN_CHECK(ids.size() == counts.size(), "apply_presence_frequency: {} ids but {} counts", ids.size(), counts.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (counts[i] <= 0) continue;
    float& l = logits[size_t(ids[i])];
    l = float(l - (frequency * counts[i] + presence));
  }
}

void apply_temperature(std::span<float> logits, double temperature) {
  FN_CHECK(temperature > 0, "apply_temperature: temperature must be > 0, got {}", temperature);
  if (temperature == 1.0) return;
  const float inv = float(1.0 / temperature);
  for (float& l : logits) l *= inv;
}

void apply_top_k(std::span<float> logits, int64_t k) {
  if (k <= 0 || size_t(k) >= logits.size()) return;
  mask_to(logits, top_k_cands(logits, k));
}

void apply_top_p(std::span<float> logits, double p) {
  if (p >= 1.0) return;
  auto c = gather(logits);
  if (c.empty()) return;
  top_p_cands(c, weigh(c), p);
  mask_to(logits, c);
}

void apply_min_p(std::span<float> logits, double min_p) {
  if (min_p <= 0) return;
  auto c = gather(logits);
  weigh(c);
  min_p_cands(c, min_p);
  mask_to(logits, c);
}

int32_t argmax(std::span<const float> logits) {
  FN_CHECK(!logits.empty(), "argmax: empty logits");
  // Two branch-free passes (the max reduction vectorises; NaN never wins a `>`), then the first index holding it.
  const float m = max_logit(logits);
  FN_CHECK(m > kNegInf, "argmax: no logit is above -inf (all {} are -inf or NaN)", logits.size());
  return int32_t(std::find(logits.begin(), logits.end(), m) - logits.begin());
}

double uniform01(std::mt19937_64& rng) {
  return double(rng() >> 11) * 0x1.0p-53;
}

int32_t sample_from_logits(std::span<const float> logits, std::mt19937_64& rng) {
  return draw_row(logits, 1.0f, rng);
}

Sampler::Sampler(const SamplingParams& params, int64_t vocab_size, std::span<const int32_t> prompt,
                 std::span<const int64_t> eos_ids)
    : params_(params), vocab_size_(vocab_size) {
  FN_CHECK(vocab_size > 0 && vocab_size <= std::numeric_limits<int32_t>::max(), "sampler: bad vocabulary size {}",
           vocab_size);
  validate(params_, vocab_size_);
  rng_.seed(params_.seed ? *params_.seed : (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}());
  for (size_t i = 0; i < prompt.size(); ++i) {
    FN_CHECK(prompt[i] >= 0 && prompt[i] < vocab_size_,
             "sampler: prompt token {} at position {} is out of range [0, {})", prompt[i], i, vocab_size_);
  }
  if (params_.repetition_penalty != 1.0) {
    seen_mask_.assign(size_t(vocab_size_), 0);
    for (int32_t t : prompt) note_seen(t);
  }
  if (params_.presence_penalty != 0.0 || params_.frequency_penalty != 0.0)
    output_counts_.assign(size_t(vocab_size_), 0);
  for (int64_t id : eos_ids)
    FN_CHECK(id >= 0 && id < vocab_size_, "sampler: EOS id {} is out of range [0, {})", id, vocab_size_);
  if (params_.min_tokens > 0) {
    for (int64_t id : params_.stop_token_ids) min_tokens_ids_.push_back(int32_t(id));
    if (!params_.ignore_eos)
      for (int64_t id : eos_ids) min_tokens_ids_.push_back(int32_t(id));
  }
  if (params_.constraint) constraint_ = params_.constraint->clone();
}

void Sampler::note_seen(int32_t token) {
  if (!seen_mask_[size_t(token)]) {
    seen_mask_[size_t(token)] = 1;
    seen_.push_back(token);
  }
}

void Sampler::accept(int32_t token) {
  FN_CHECK(token >= 0 && token < vocab_size_, "sampler: token {} is out of range [0, {})", token, vocab_size_);
  if (!seen_mask_.empty()) note_seen(token);
  if (!output_counts_.empty() && output_counts_[size_t(token)]++ == 0) output_ids_.push_back(token);
  if (constraint_) constraint_->accept(token);
  ++num_output_;
}

int32_t Sampler::sample(std::span<float> logits) {
  FN_CHECK(int64_t(logits.size()) == vocab_size_, "sampler: got {} logits for a vocabulary of {}", logits.size(),
           vocab_size_);
  if (any_nan(logits)) {
    const auto it = std::find_if(logits.begin(), logits.end(), [](float l) { return std::isnan(l); });
    fail("sampler: the model produced a NaN logit (token {})", it - logits.begin());
  }
  apply_repetition_penalty(logits, seen_, params_.repetition_penalty);
  if (!output_ids_.empty()) {
    counts_buf_.resize(output_ids_.size());
    for (size_t i = 0; i < output_ids_.size(); ++i) counts_buf_[i] = output_counts_[size_t(output_ids_[i])];
    apply_presence_frequency(logits, output_ids_, counts_buf_, params_.presence_penalty, params_.frequency_penalty);
  }
  for (const auto& [id, bias] : params_.logit_bias) logits[size_t(id)] += bias;
  if (num_output_ < params_.min_tokens) {
    for (int32_t id : min_tokens_ids_) logits[size_t(id)] = kNegInf;
  }
  if (constraint_) constraint_->mask(logits);
  if (params_.greedy()) return argmax(logits);
  // From here on `logits` is only read: the temperature and the filters work on a copy of the survivors.
  const float inv_t = float(1.0 / params_.temperature);
  if ((params_.top_k <= 0 || params_.top_k >= vocab_size_) && params_.top_p >= 1.0 && params_.min_p <= 0) {
    return draw_row(logits, inv_t, rng_);  // no filter: draw from the whole row
  }
  // Top-k commutes with the temperature (a positive scale keeps the order), so it selects on the raw logits.
  auto c = top_k_cands(logits, params_.top_k);
  FN_CHECK(!c.empty(), "sampler: no logit is above -inf");
  const Cand& top = *std::min_element(c.begin(), c.end(), before);
  if (std::isinf(top.logit)) return top.id;  // +inf: that token has all the mass
  if (params_.temperature != 1.0) {
    for (auto& x : c) x.logit *= inv_t;
  }
  const double z = weigh(c);
  top_p_cands(c, z, params_.top_p);
  min_p_cands(c, params_.min_p);
  return draw(c, rng_);
}

}  // namespace flashnext
