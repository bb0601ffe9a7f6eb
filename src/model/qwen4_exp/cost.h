// What one forward step of the qwen4_exp model moves and computes, counted from the loaded weights and the tokens
// the step selects: the numerator of every roofline ratio that `flashnext bench` prints (ceilings in
// docs/LIMITS.md).
#pragma once

#include <cstdint>
#include <span>

namespace flashnext {

class Model;

/// One sequence's part of a step: `tokens` new tokens after `context` earlier positions.
struct StepWork {
  int64_t tokens = 0;
  int64_t context = 0;
};

/// Bytes and FLOPs of one step (step_cost).
struct StepCost {
  /// Device bytes of weights read, each weight once per step: every dense weight (embedding: only the rows of the
  /// step's tokens; lm_head: all of it), the routed experts for the expected number of distinct experts hit.
  double weight_bytes = 0;
  /// Device bytes of caches: K/V rows of every selected token (per query), the pooled indexer keys of each
  /// sequence, GDN recurrent and conv states and PLE conv states read and written once per sequence.
  double cache_bytes = 0;
  /// Host-memory bytes: the PLE table rows the step gathers.
  double host_bytes = 0;
  /// Floating-point operations (multiply-add = 2): every linear layer at 2 * out * in per row (routed experts top_k
  /// times per token, lm_head for `logit_rows` rows), QSA attention 4 * heads * head_dim per selected token, indexer
  /// scores 2 * heads * dim per complete block, the gated delta rule about 7 * dk * dv + 4 * 64 * dk per token and
  /// value head (state decay, S^T k, update, output, and the intra-chunk products of the chunked form).
  double flops = 0;
  /// Distinct routed experts per MoE layer whose weights the step reads: the measured mean when step_cost is given
  /// one, else the expectation under uniform routing, E * (1 - (1 - k/E)^tokens).
  double experts_hit = 0;

  double device_bytes() const { return weight_bytes + cache_bytes; }
};

/// The cost of feeding `work` to `model` in one step, with `logit_rows` rows through lm_head. `experts_hit` > 0: the
/// measured mean of distinct experts per MoE layer (RouterObserver), used instead of the uniform expectation. Under
/// tensor parallelism the cost of one rank (rank 0, the GPU whose time bench reports): its weight shards, its
/// heads' caches and states, its share of the PLE rows, its FLOPs — the numerator of a per-GPU roofline.
StepCost step_cost(const Model& model, std::span<const StepWork> work, int64_t logit_rows, double experts_hit = 0);

}  // namespace flashnext
