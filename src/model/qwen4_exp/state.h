// Cache memory and per-sequence state of the qwen4_exp model (docs MODEL.md, "Caches and state per sequence").
//
// Memory is paged, as in vLLM: a CachePool holds, per layer,
//   QSA layer:  k, v [num_blocks*block_size, nkv, D] (K after k_norm + RoPE) and index_keys
//               [num_blocks*block_size, Di] (raw indexer keys, no norm, no RoPE): KV blocks of block_size positions;
//               pooled_keys [num_blocks*block_size/c, Di]: the indexer's pooled key of each complete block of c
//               positions (c = indexer_compress_ratio, a divisor of block_size), kept by backends that cache them;
//   GDN layer:  conv [num_slots, K-1, conv_dim] (last K-1 conv inputs, oldest first), recurrent
//               [num_slots, nv, dk, dv] F32: one state slot per sequence;
//   PLE layer:  ple_conv [num_slots, (kernel-1)*ngram_size, S*H] (last normed conv inputs, oldest first);
//   MTP layer (when the model loaded it): one more QSA entry after the decoder layers, index num_hidden_layers.
// A sequence owns one slot and a block table (logical block i of its positions -> pool block). The engine's pool is
// shared by all running sequences (Model::new_cache; the scheduler's MemoryPlanner hands out blocks and slots); a
// sequence from Model::new_sequence() has a private pool with one slot that grows with it (for tools and tests).
// All tensors live on the model's backend device. Under tensor parallelism every rank keeps its own part (its KV
// heads, its GDN value heads' states; a rank that sits a mixer kind out keeps nothing for those layers) on its own
// device; block ids, slots and block tables are the same on every rank.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ops/tensor.h"

namespace flashnext {

/// The cache tensors of one decoder layer (only those of its kind are defined).
struct LayerCache {
  Tensor k, v, index_keys, pooled_keys;  ///< QSA
  Tensor conv, recurrent;                ///< Gated DeltaNet
  Tensor ple_conv;                       ///< PLE (layers listed in ple_layer_ids)
};

/// KV blocks and state slots shared by a set of sequences.
struct CachePool {
  /// The model's number for the pool, in order of creation: every node of a group over several processes makes the
  /// same pools in the same order, so the leader names a pool to the others by it.
  uint64_t id = 0;
  int64_t block_size = 0;  ///< positions per KV block
  int64_t num_blocks = 0;  ///< KV blocks (block ids 0 .. num_blocks-1)
  int64_t num_slots = 0;   ///< state slots (slot ids 0 .. num_slots-1)
  /// Per tensor-parallel rank (one entry without tensor parallelism), per decoder layer: the rank's cache tensors.
  std::vector<std::vector<LayerCache>> ranks;
};

/// Everything the model remembers about one sequence. A copy shares the slot and the blocks (two copies must not be
/// fed in one step, nor both be fed at all): use Model::clone_sequence for an independent copy.
struct SequenceState {
  int64_t length = 0;                ///< tokens fed so far = position of the next token
  std::shared_ptr<CachePool> cache;  ///< where its KV blocks and state slot live
  int32_t slot = 0;                  ///< its state slot in `cache`
  std::vector<int32_t> block_table;  ///< its KV blocks in `cache`, covering at least `length` positions
  bool private_cache = false;        ///< `cache` is its own and grows on demand (Model::new_sequence())
  /// Per layer: the last ngram_size-1 token ids (oldest first; starts as the boundary token); empty for layers
  /// without PLE. Host memory.
  std::vector<std::vector<int64_t>> ple_history;
  /// Positions whose MTP-layer K/V and indexer keys are written (Model::mtp_forward; 0 without MTP). The MTP entry
  /// of position p pairs the trunk's state at p with token p+1, so it trails `length` by one once caught up.
  int64_t mtp_length = 0;
};

/// The inputs of a speculative verify item's recurrent state, kept by the step that fed it (BatchItem::keep_inputs)
/// so that the state can afterwards be advanced over any prefix of its tokens without the rest of the model
/// (Model::replay_state): after a partial acceptance the caller puts back the state from before the verify and
/// replays the accepted tokens through the GDN conv and gated delta rule and the PLE conv of every layer, instead of
/// feeding them again (docs/ENGINE.md "Speculative decoding"). The attention-side caches need nothing: KV, indexer
/// keys and pooled keys of positions past the new length are overwritten when those positions are fed again.
/// Device memory: per GDN layer (conv_dim + 2 nv) floats a token, per PLE layer S*H floats a token.
struct StateInputs {
  /// One decoder layer's kept rows [n, ...] F32 on the rank's device (undefined where the layer has none).
  struct Layer {
    Tensor qkv;   ///< GDN: in_proj_qkv rows before the causal conv [n, conv_dim]
    Tensor a, b;  ///< GDN: in_proj_a and in_proj_b rows [n, nv]
    Tensor ple;   ///< PLE: the short conv's input P [n, S*H]
  };
  int64_t start = 0;                              ///< the sequence's length before the step
  std::vector<int32_t> ids;                       ///< the item's tokens (n)
  std::vector<std::vector<int64_t>> ple_history;  ///< the sequence's PLE n-gram history before the step
  std::vector<std::vector<Layer>> ranks;          ///< per rank of this process, per decoder layer
  /// Whether a step filled it (Model::forward_batch with BatchItem::keep_inputs).
  bool kept() const { return !ranks.empty(); }
};

/// Rows [first, first + n) of a step's activations to copy into `into`'s tensors, allocated by the caller
/// (gated_delta_net, ple_add).
struct KeepRows {
  int64_t first = 0, n = 0;
  StateInputs::Layer* into = nullptr;
};

}  // namespace flashnext
