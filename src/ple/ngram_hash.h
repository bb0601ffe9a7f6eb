// PLE n-gram hashing: the per-layer hash parameters and the row ids of every token, bit-exact with the reference
// (transformers models/qwen4_exp: `_build_layer_multipliers`, `_find_nth_prime_after`,
// `Qwen4ExpTextNGramEmbedding._shift_right_ignore_eos` and `forward`).
//
// For PLE layer number m (0 for the first layer in ple_layer_ids) with H = (ngram_size-1) * heads_per_ngram heads:
//   modulus_i  = the (m*H + i + 1)-th prime >= ngram_vocab_size_base        (i = 0..H-1)
//   offset_i   = modulus_0 + ... + modulus_{i-1}
//   rows       = sum of moduli, padded up to a multiple of make_ngram_vocab_size_divisible_by
//   mult[s]    = 2 * (splitmix64((seed + 10007*m + 0x9E3779B97F4A7C15*(s+1)) mod 2^64) mod half) + 1,
//                half = max(1, ((2^63-1) / max(vocab_size,1)) / 2)          (s = 0..ngram_size-1)
// Heads [(n-2)*heads_per_ngram, (n-1)*heads_per_ngram) hash n-grams, n = 2..ngram_size:
//   mix = XOR_{s<n} tok_s * mult[s]  (int64 wraparound),  row_i = offset_i + (mix mod modulus_i)  (torch.remainder)
// where tok_s is the token s places back, or the boundary token (eos_token_id[0]) when that crosses the start of the
// history or a boundary token strictly before the current position.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "loader/config.h"

namespace flashnext {

/// Hash parameters of one PLE layer, derived from the config.
struct NgramHashParams {
  int ple_layer_index = 0;          ///< m: position of the layer in ple_layer_ids
  int64_t ngram_size = 3;           ///< largest n; n-grams 2..ngram_size are hashed
  int64_t heads_per_ngram = 8;
  int64_t boundary_token = 0;       ///< eos_token_id[0]
  std::vector<int64_t> moduli;      ///< [H] distinct primes
  std::vector<int64_t> offsets;     ///< [H] exclusive prefix sums of moduli
  std::vector<int64_t> multipliers; ///< [ngram_size] odd SplitMix64-derived multipliers
  int64_t rows_used = 0;            ///< sum of moduli (addressable rows)
  int64_t rows = 0;                 ///< rows padded to make_ngram_vocab_size_divisible_by (the table height)

  int64_t heads() const { return int64_t(moduli.size()); }
  int64_t context_len() const { return ngram_size - 1; }

  /// Row ids for `ids` (length T) following `history` (the previous ngram_size-1 token ids of the sequence, oldest
  /// first; use the boundary token for positions before the start). Writes `out[t*H + i]`.
  void rows_for(std::span<const int64_t> history, std::span<const int64_t> ids, int64_t* out) const;
};

/// Parameters for PLE layer number `ple_layer_index` of `cfg`. Throws Error when the config has no such layer.
NgramHashParams ngram_hash_params(const ModelConfig& cfg, int ple_layer_index);

/// SplitMix64 finaliser as in the reference (`_splitmix64`), exposed for tests.
uint64_t splitmix64(uint64_t value);

}  // namespace flashnext
