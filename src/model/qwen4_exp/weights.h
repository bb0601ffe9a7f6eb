// Typed weights of the qwen4_exp language model, one struct per block, filled from a validated WeightManifest.
//
// Every tensor is converted once at load into the backend's weight format (`Ops::load_weight`; CPU: float32);
// routed experts are stacked into [E, ...] tensors; the PLE n-gram tables stay in the mapped checkpoint
// (`Ops::map_host_table`). Names in comments are the reference's module paths (logical manifest names).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "loader/config.h"
#include "loader/manifest.h"
#include "loader/quant.h"
#include "loader/safetensors.h"
#include "loader/sharding.h"
#include "ops/ops.h"
#include "ple/ngram_hash.h"

namespace flashnext {

/// layers.L.linear_attn.*
struct GdnLayerWeights {
  Tensor in_proj_qkv;  ///< [2*nk*dk + nv*dv, H]
  Tensor in_proj_z;    ///< [nv*dv, H]
  Tensor in_proj_b;    ///< [nv, H]
  Tensor in_proj_a;    ///< [nv, H]
  Tensor conv1d;       ///< [conv_dim, K] (checkpoint [conv_dim, 1, K])
  Tensor norm;         ///< [dv] gated RMSNorm weight
  Tensor out_proj;     ///< [H, nv*dv]
  GdnWeights rule;     ///< A_log, dt_bias [nv]
};

/// layers.L.self_attn.*
struct QsaLayerWeights {
  Tensor q_proj, k_proj, v_proj, o_proj;  ///< [nh*2D, H], [nkv*D, H], [nkv*D, H], [H, nh*D]
  Tensor q_bias, k_bias, v_bias, o_bias;  ///< defined only when attention_bias
  Tensor q_norm, k_norm;                  ///< [D]
  Tensor index_q_proj;                    ///< rows [0, ni*Di) of indexer.index_qk_proj: [ni*Di, H]
  Tensor index_k_proj;                    ///< the last Di rows of indexer.index_qk_proj: [Di, H]
  Tensor index_q_norm, index_k_norm;      ///< indexer.q_layernorm / k_layernorm [Di]
};

/// layers.L.ple.*
struct PleLayerWeights {
  NgramHashParams hash;  ///< derived from the config for this PLE layer
  PleTable table;        ///< ple_embedding.ngram_embedding (shards in row order)
  /// The logical table rows this rank holds (all of them without tensor parallelism). When that is not all,
  /// `table` holds them followed by one zero row, which the rows of other ranks read (ple.h ple_fetch).
  IndexRange rows_held;
  Tensor key_proj;                         ///< [S*H, ple_embed_dim]
  Tensor value_proj;                       ///< [H, ple_embed_dim]
  Tensor norm_key, norm_query, norm_conv;  ///< [S*H]
  Tensor conv1d;                           ///< [S*H, kernel] (checkpoint [S*H, 1, kernel])
};

/// layers.L
struct LayerWeights {
  LayerKind kind = LayerKind::GatedDeltaNet;
  HcWeights attn_hc, mlp_hc;
  GdnLayerWeights gdn;  ///< when kind == GatedDeltaNet
  QsaLayerWeights qsa;  ///< when kind == QSA
  MoeWeights moe;
  std::optional<PleLayerWeights> ple;
};

/// mtp.* (docs MODEL.md "MTP"; ARTIFACTS.md 2.5): the multi-token-prediction layer, BF16 in every release (quantized
/// checkpoints keep it BF16), loaded only when asked for (ModelOptions::load_mtp).
struct MtpWeights {
  Tensor pre_fc_norm_embedding;  ///< [H] ZC-RMSNorm of the next token's embedding
  Tensor pre_fc_norm_hidden;     ///< [S*H] ZC-RMSNorm over the full wide residual (one group of S*H)
  Tensor fc_embedding;           ///< [H, H]
  Tensor fc_hidden;              ///< [H, H], applied to each stream (shared weights)
  HcWeights mixer;               ///< mtp.hyper_connection_mixer (no inject)
  LayerWeights layer;            ///< mtp.layers.0: a QSA decoder layer with its own HC and MoE (no PLE)
};

struct ModelWeights {
  /// [vocab, H]; under tensor parallelism the rank's vocabulary rows (RankShard::vocab) followed by one zero row,
  /// which the ids of other ranks read.
  Tensor embed_tokens;
  Tensor lm_head;   ///< [vocab, H] (embed_tokens when tied); the rank's vocabulary rows under tensor parallelism
  HcWeights mixer;  ///< hyper_connection_mixer (no inject)
  std::vector<LayerWeights> layers;
  std::optional<MtpWeights> mtp;  ///< present when loaded with ModelOptions::load_mtp
};

/// The routed experts of MoE block `prefix` ("layers.L.mlp") as the ops interface describes quantized experts
/// (gate / up [I, H], down [H, I] per expert), or nullopt when not all 3E matrices are quantized in one format.
/// The result borrows `scheme` and the checkpoint memory behind it.
std::optional<QuantExperts> quantized_experts(const QuantScheme& scheme, const std::string& prefix, int64_t E,
                                              int64_t I, int64_t H);

/// What building random weights took (random_weights).
struct RandomWeightsReport {
  double weights_s = 0;     ///< making every weight but the PLE tables on the device (wall time, synchronised)
  double ple_alloc_s = 0;   ///< allocating (pinning) the PLE tables' host memory
  double ple_fill_s = 0;    ///< filling them (host threads, overlapped with the weights)
  double total_s = 0;       ///< the whole build
  int64_t ple_bytes = 0;    ///< bytes of all PLE tables
  int ple_fill_threads = 0;
};

/// Pseudo-random weights of the shapes `cfg` gives, made by the backend (Ops::random_weight / random_experts: on the
/// GPU for the CUDA backend, no host copy) for `flashnext bench` at the released size without a checkpoint. Element
/// values are deterministic in `seed` and the same on every backend (ops/random_uniform.h). Scaling, so that
/// activations stay in FP16 range and the router spreads tokens over experts:
/// - every linear weight [out, in] (projections, hyper-connection down/up/inject, router, shared and routed experts,
///   lm_head) uniform in +-sqrt(3 / in): unit-variance inputs give unit-variance outputs (variance 1/in per weight),
///   so the router's logits are about N(0, 1) and its top-k differs from token to token;
/// - embed_tokens uniform in +-sqrt(3) (unit variance); conv1d weights [C, K] uniform in +-sqrt(3 / K);
/// - zero-centred RMSNorm weights uniform in +-0.1 (scales 0.9..1.1); the GDN gated norm (a plain scale) 0.9..1.1;
/// - A_log uniform in [0, ln 16] and dt_bias in [-6.9, -2.3] (the reference's initialisation ranges: A in [1, 16],
///   dt = softplus(dt_bias) in [0.001, 0.1]);
/// - routed experts with variance 1/in as well (the CUDA backend: NVFP4-layout W4A16 codes, Ops::random_experts);
/// - the PLE tables FP8 E4M3 (as the quantized releases store them), scale 1, each byte a random sign and magnitude
///   in [0.5, 1.875] (no NaN codes), allocated with Ops::host_table and filled by host threads while the device
///   makes the other weights.
/// `plan` (optional, with `rank`): only rank `rank`'s part, in the shapes loader/sharding.h gives it (its heads and
/// intermediate slices, its vocabulary rows of embed_tokens followed by the zero row, its PLE rows followed by the
/// zero row; nothing for a mixer it sits out). Each layer's tensors draw seeds from a base of their own (seed +
/// 1000 (l + 1), the MoE block and the PLE layer at fixed offsets in it), so the replicated weights (hyper-
/// connections, router, norms, the PLE projections) are the same on every rank and every rank routes alike; the
/// sharded ones are random tensors of the shard's shape, not slices of the TP 1 model (for timing, not exactness).
/// `with_mtp`: also an MTP layer (ModelWeights::mtp; seeds from the base of layer index L), its routed experts in
/// the backend's random_experts format like the trunk's (the releases keep them BF16: a model for timing).
/// Throws Error for a backend failure (naming the tensor's shape and the memory asked for when it runs out).
ModelWeights random_weights(const ModelConfig& cfg, Ops& ops, uint64_t seed, RandomWeightsReport* report = nullptr,
                            const TpPlan* plan = nullptr, int rank = 0, bool with_mtp = false);

/// Fills the weights of `cfg` from `manifest` (built over `checkpoint`, which the PLE tables keep alive).
/// Quantized weights (the quantization_config / hf_quant_config.json of checkpoint->dir(), loader/quant.h) are
/// dequantized exactly to float32 at load, except routed experts quantized in one format, which go to
/// `Ops::load_quantized_experts` (the backend decides: CPU dequantizes, CUDA keeps NVFP4 / int4 as W4A16). FP8 PLE
/// tables stay FP8 with their scale (PleTable::scale), int8 ones I8 with their group scales (PleTable::group_scales).
/// Throws Error for tensors the backend cannot use and for every quantization error of QuantScheme::build.
/// `progress` (optional) is called after each tensor with the checkpoint bytes consumed and the bytes of every
/// manifest tensor but the vision and MTP ones (the last call: done == total).
/// `plan` (optional, with `rank`): load only rank `rank`'s part of every tensor (loader/sharding.h), read from the
/// mapped checkpoint without a copy of the whole tensor (a row slice is used in place, column slices and multi-range
/// row slices are copied strided into a buffer of the part's size; quantized weights are dequantized, then sliced;
/// quantized routed experts then take the dequantized path). `progress` then counts the rank's share.
/// The mtp.* tensors of `manifest` (WeightManifest::extra(), checkpoint names `mtp.*` or `model.mtp.*`) as
/// MtpWeights: every tensor of expected_mtp_tensors(cfg) present, BF16/F16/F32, of the listed shape; the fused
/// routed experts (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]) split into gate / up / down.
/// Throws Error naming the tensor for a missing, mis-shaped or non-float one, and naming mtp_num_hidden_layers when
/// the config has no MTP layer (or more than the one implemented).
/// `plan` (optional, with `rank`): rank `rank`'s part, split as the trunk's QSA layer and MoE block are
/// (TpPlan::split of the mtp.* names; the fused experts along the rank's slice of the intermediate); fc_embedding,
/// fc_hidden, the norms and hyper-connections replicated.
MtpWeights load_mtp_weights(const ModelConfig& cfg, const WeightManifest& manifest, Ops& ops,
                            const TpPlan* plan = nullptr, int rank = 0);

/// True when the checkpoint behind `manifest` holds mtp.* tensors.
bool has_mtp_tensors(const WeightManifest& manifest);

ModelWeights load_weights(const ModelConfig& cfg, const WeightManifest& manifest,
                          std::shared_ptr<const Checkpoint> checkpoint, Ops& ops,
                          const std::function<void(int64_t, int64_t)>& progress = {}, const TpPlan* plan = nullptr,
                          int rank = 0);

}  // namespace flashnext
