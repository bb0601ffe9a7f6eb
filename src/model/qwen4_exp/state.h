// Per-sequence state of the qwen4_exp model (docs MODEL.md, "Caches and state per sequence").
//
// All tensors live on the model's backend device and are owned by the state (shared handles: a copied
// SequenceState shares memory; use Model::clone_sequence for an independent copy). Layouts:
//   QSA layer:  k_cache, v_cache [capacity, nkv, D] (row p = position p, K after norm+RoPE),
//               index_keys [capacity, Di] raw indexer keys (no norm, no RoPE); rows >= length are unused.
//   GDN layer:  conv [K-1, conv_dim] (time-major: last K-1 conv inputs, oldest first), recurrent [nv, dk, dv] F32.
//   PLE layer:  history: the last ngram_size-1 token ids (host; oldest first; starts as the boundary token),
//               ple_conv [(kernel-1)*ngram_size, S*H] (last normed conv inputs, oldest first).
// The QSA caches grow on demand (capacity doubles, bounded by max_position_embeddings); a paged cache can replace
// them behind the same fields later.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/tensor.h"

namespace flashnext {

/// State of one decoder layer (only the fields of its kind are defined).
struct LayerState {
  // QSA
  Tensor k_cache, v_cache, index_keys;
  int64_t capacity = 0;  ///< rows allocated in the QSA caches
  // Gated DeltaNet
  Tensor conv, recurrent;
  // PLE (layers listed in ple_layer_ids)
  std::vector<int64_t> ple_history;
  Tensor ple_conv;
};

/// Everything the model remembers about one sequence.
struct SequenceState {
  int64_t length = 0;  ///< tokens fed so far = position of the next token
  std::vector<LayerState> layers;
};

}  // namespace flashnext
