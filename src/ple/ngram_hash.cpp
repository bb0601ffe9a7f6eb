#include "ple/ngram_hash.h"

#include "core/error.h"

namespace flashnext {

namespace {

constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kM1 = 0xBF58476D1CE4E5B9ull;
constexpr uint64_t kM2 = 0x94D049BB133111EBull;
constexpr int64_t kPrime1 = 10007;

bool is_prime(int64_t v) {
  if (v < 2) return false;
  if (v % 2 == 0) return v == 2;
  for (int64_t d = 3; d * d <= v; d += 2) {
    if (v % d == 0) return false;
  }
  return true;
}

// `_find_nth_prime_after(start, count)`: the count-th prime strictly greater than start.
int64_t nth_prime_after(int64_t start, int64_t count) {
  int64_t p = start;
  for (int64_t i = 0; i < count; ++i) {
    ++p;
    while (!is_prime(p)) ++p;
  }
  return p;
}

}  // namespace

uint64_t splitmix64(uint64_t v) {
  v = v + kGamma;
  v = (v ^ (v >> 30)) * kM1;
  v = (v ^ (v >> 27)) * kM2;
  return v ^ (v >> 31);
}

NgramHashParams ngram_hash_params(const ModelConfig& cfg, int ple_layer_index) {
  if (ple_layer_index < 0 || ple_layer_index >= int(cfg.ple_layer_ids.size())) {
    fail("{}: PLE layer number {} does not exist (ple_layer_ids has {} entries)", cfg.source, ple_layer_index,
         cfg.ple_layer_ids.size());
  }
  NgramHashParams p;
  p.ple_layer_index = ple_layer_index;
  p.ngram_size = cfg.ngram_size;
  p.heads_per_ngram = cfg.heads_per_ngram;
  p.boundary_token = cfg.ple_boundary_token();
  const int64_t heads = cfg.ngram_heads();
  // Consecutive heads need consecutive primes: walk once instead of restarting for every head.
  int64_t prime = nth_prime_after(cfg.ngram_vocab_size_base - 1, int64_t(ple_layer_index) * heads + 1);
  for (int64_t i = 0; i < heads; ++i) {
    if (i > 0) prime = nth_prime_after(prime, 1);
    p.offsets.push_back(p.rows_used);
    p.moduli.push_back(prime);
    p.rows_used += prime;
  }
  const int64_t div = cfg.make_ngram_vocab_size_divisible_by;
  p.rows = (p.rows_used + div - 1) / div * div;

  const uint64_t max_long = (uint64_t(1) << 63) - 1;
  const uint64_t multiplier_max = max_long / uint64_t(std::max<int64_t>(cfg.vocab_size, 1));
  const uint64_t half_bound = std::max<uint64_t>(1, multiplier_max / 2);
  const uint64_t base_seed = uint64_t(cfg.seed) + uint64_t(kPrime1) * uint64_t(ple_layer_index);
  for (int64_t s = 0; s < cfg.ngram_size; ++s) {
    uint64_t value = base_seed + kGamma * uint64_t(s + 1);
    p.multipliers.push_back(int64_t(2 * (splitmix64(value) % half_bound) + 1));
  }
  return p;
}

void NgramHashParams::rows_for(std::span<const int64_t> history, std::span<const int64_t> ids, int64_t* out) const {
  const int64_t ctx = context_len();
  FN_CHECK(int64_t(history.size()) == ctx, "PLE hashing: history has {} tokens, expected {}", history.size(), ctx);
  // Window = history followed by ids; position w of the window holds token h[w].
  std::vector<int64_t> h(history.begin(), history.end());
  h.insert(h.end(), ids.begin(), ids.end());
  const int64_t H = heads();
  std::vector<int64_t> tok(static_cast<size_t>(ngram_size));
  for (size_t t = 0; t < ids.size(); ++t) {
    const int64_t w = ctx + int64_t(t);
    // tok[s]: token s places back, replaced by the boundary once a boundary token at w-1 .. w-s is crossed or the
    // window start is passed.
    tok[0] = h[w];
    bool crossed = false;
    for (int64_t s = 1; s < ngram_size; ++s) {
      if (w - s < 0) crossed = true;
      // The reference keeps h[w-s] only when no boundary token sits in h[w-s .. w-1]; a boundary at h[w-s] itself
      // yields the boundary either way, so checking h[w-s+1] for each s >= 2 is enough.
      if (!crossed && s >= 2 && h[w - s + 1] == boundary_token) crossed = true;
      tok[s] = crossed ? boundary_token : h[w - s];
    }
    for (int64_t n = 2; n <= ngram_size; ++n) {
      uint64_t mix = uint64_t(tok[0]) * uint64_t(multipliers[0]);
      for (int64_t s = 1; s < n; ++s) mix ^= uint64_t(tok[s]) * uint64_t(multipliers[s]);
      const int64_t smix = int64_t(mix);
      for (int64_t j = 0; j < heads_per_ngram; ++j) {
        const int64_t i = (n - 2) * heads_per_ngram + j;
        int64_t r = smix % moduli[i];
        if (r < 0) r += moduli[i];
        out[int64_t(t) * H + i] = offsets[i] + r;
      }
    }
  }
}

}  // namespace flashnext
