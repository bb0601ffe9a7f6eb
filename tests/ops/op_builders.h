// The case builders of the op-case registry (op_cases.h): one function per op, taking the shape parameters and
// returning an OpCase named after them, with its byte and FLOP counts. op_cases.cpp lists the shapes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "op_cases.h"

namespace flashnext::opcases {

/// Where a case's weights come from: host values rounded to FP16 and loaded with load_weight (the same weights on
/// every backend: test cases), or Ops::random_weight / random_experts on the device (perf cases at the released
/// widths, where a host copy would be too large; the backends' values then differ by their rounding).
enum class Weights : uint8_t { HostFp16, DeviceRandom };

/// Sequences of a batched case: `context[s]` positions fed before the first step, and per step the tokens each
/// sequence feeds (0: not in that step). State slots and KV blocks are handed out in a scrambled order.
struct StepPlan {
  std::vector<int64_t> context;
  std::vector<std::vector<int64_t>> steps;
  int64_t page = 16;  ///< positions per KV block (a multiple of the indexer block)
  /// "ctx=5,0/steps=1,1|7,1" style description for case names.
  std::string describe() const;
};
/// One-sequence plan: `tokens` fed at position `pos0` in one step.
StepPlan one_sequence(int64_t tokens, int64_t pos0 = 0);
/// `n` sequences, each decoding one token after `context` positions.
StepPlan decode_batch(int64_t n, int64_t context);

// ---------------------------------------------------------------- memory
OpCase copy_rows_case(int64_t rows, int64_t width, int64_t src_row, int64_t dst_row, int64_t n);
OpCase gather_rows_case(int64_t src_rows, int64_t width, int64_t n);
OpCase scatter_rows_case(int64_t dst_rows, int64_t width, int64_t n);
/// fill_zero of rows [r0, r1) of a [rows, width] tensor (a row view: the rest keeps its values).
OpCase fill_zero_case(int64_t rows, int64_t width, int64_t r0, int64_t r1);
/// Ops::random_weight of `shape` in [lo, hi): the CPU's float32 values; another backend's are them rounded to its
/// weight dtype (FP16: within 2^-11 relative).
OpCase random_weight_case(Shape shape, float lo, float hi);

// ---------------------------------------------------------------- dense
OpCase embedding_case(int64_t V, int64_t H, int64_t T, int64_t replicas, Weights wk = Weights::HostFp16);
OpCase linear_case(int64_t T, int64_t in, int64_t out, bool bias, Weights wk = Weights::HostFp16);
/// `outs[i]` output widths; `bias[i]` whether projection i has a bias (empty: none has).
OpCase linear_group_case(int64_t T, int64_t in, std::vector<int64_t> outs, std::vector<bool> bias,
                         Weights wk = Weights::HostFp16);
/// linear with an 8-bit weight (Ops::load_w8_linear: `code` I8 or F8_E4M3, float32 scales per row and `group`
/// inputs; group = in: one a row) against the oracle's exact float32 values of it.
OpCase linear_w8_case(int64_t T, int64_t in, int64_t out, DType code, int64_t group, bool bias);
/// linear_group with 8-bit weights (as linear_w8_case), the last one an FP16 weight when `fp16_last` (a mixed group).
OpCase linear_group_w8_case(int64_t T, int64_t in, std::vector<int64_t> outs, DType code, int64_t group,
                            bool fp16_last);
/// zc_rms_norm over [T, L] with weight width W and groups of `group` (W = group: per head; W = L: grouped).
OpCase zc_rms_norm_case(int64_t T, int64_t L, int64_t W, int64_t group, bool in_place, Weights wk = Weights::HostFp16);
/// gated_rms_norm over [T, heads * D], in place as the model calls it.
OpCase gated_rms_norm_case(int64_t T, int64_t heads, int64_t D, GateAct act, Weights wk = Weights::HostFp16);

// ---------------------------------------------------------------- hyper-connections
/// x_scale: X uniform in [-x_scale, x_scale] (the normed values, and so the outputs, do not depend on it; a large or
/// small residual checks that no kernel rounds X itself to FP16).
OpCase hc_read_case(int64_t T, int64_t S, int64_t H, int64_t R, bool inject, Weights wk = Weights::HostFp16,
                    float x_scale = 2.f);
/// hc_inject_read: the injection of a sublayer output into X, then the next read (X, u and inj compared).
OpCase hc_inject_read_case(int64_t T, int64_t S, int64_t H, int64_t R, bool inject, Weights wk = Weights::HostFp16);
OpCase hc_inject_case(int64_t T, int64_t S, int64_t H);

// ---------------------------------------------------------------- Gated DeltaNet
OpCase gdn_conv_batch_case(const GdnDims& d, int64_t K, const StepPlan& plan, Weights wk = Weights::HostFp16);
/// state_scale: the initial states uniform in [-state_scale, state_scale] (0.1; 1e5 passes FP16's range).
OpCase gdn_rule_batch_case(const GdnDims& d, const StepPlan& plan, Weights wk = Weights::HostFp16,
                           float state_scale = 0.1f);
/// gdn_mix_batch: the conv of K taps, the rule, then the gated output norm (act; none: no norm) of every step.
OpCase gdn_mix_batch_case(const GdnDims& d, int64_t K, const StepPlan& plan, std::optional<GateAct> act,
                          Weights wk = Weights::HostFp16);

// ---------------------------------------------------------------- QSA
OpCase qsa_prepare_qk_batch_case(int64_t nh, int64_t nkv, int64_t D, int64_t rotary, const StepPlan& plan,
                                 Weights wk = Weights::HostFp16);
/// The indexer over paged raw keys, built through the steps from position 0 (plan contexts must be 0, so that a
/// backend's pooled-key cache sees every block); every `zero_every`-th query row is zero (all scores tie at 0;
/// 0: none). With Weights::DeviceRandom (perf) the contexts may be non-zero: the pools then hold random keys.
OpCase qsa_indexer_select_batch_case(int64_t ni, int64_t Di, int64_t budget, int64_t block, const StepPlan& plan,
                                     int64_t zero_every, Weights wk = Weights::HostFp16);
/// Sparse attention over random paged K/V with a random valid selection per query (top blocks and the tail).
OpCase sparse_attention_batch_case(int64_t nh, int64_t nkv, int64_t D, int64_t budget, int64_t block,
                                   const StepPlan& plan);

// ---------------------------------------------------------------- MoE
OpCase moe_router_topk_case(int64_t T, int64_t H, int64_t E, int64_t k, bool norm, Weights wk = Weights::HostFp16);
/// Dense stacked experts [E, I, H] / [E, H, I] on routing made on the host (distinct ids, positive weights). The
/// moe_experts cases with `shared` ("/shared") also have a shared expert of width I, begun first
/// (moe_shared_expert_start) and added by moe_experts: the MoE block after its router, as the model runs it (on the
/// CUDA backend a decode step's shared expert then runs on its branch stream).
OpCase moe_experts_case(int64_t T, int64_t H, int64_t I, int64_t E, int64_t k, Weights wk = Weights::HostFp16,
                        bool shared = false);
/// Quantized experts of checkpoint format `kind` (Nvfp4, CtInt4 (symmetric, group 32) or Gptq (group 32)) loaded
/// with Ops::load_quantized_experts from synthetic checkpoint arrays.
OpCase moe_quantized_experts_case(QuantFormat kind, int64_t T, int64_t H, int64_t I, int64_t E, int64_t k,
                                  bool shared = false);
/// Experts made by Ops::random_experts (the CUDA backend's W4A16 form): perf only (the backends' weights differ).
OpCase moe_random_experts_case(int64_t T, int64_t H, int64_t I, int64_t E, int64_t k, bool shared = false);
OpCase moe_shared_expert_case(int64_t T, int64_t H, int64_t Is, Weights wk = Weights::HostFp16);
/// moe_shared_expert with 8-bit gate / up / down projections (one scale a row; the gate an FP16 weight).
OpCase moe_shared_expert_w8_case(int64_t T, int64_t H, int64_t Is, DType code);

// ---------------------------------------------------------------- PLE
/// Where a ple_gather case's table lives.
enum class TableSource : uint8_t { MapHost, HostTable };
/// ple_gather from a table of `rows` x `hd` in `dtype` (BF16, F16, F32, F8_E4M3 with scale 0.5, or I8 with
/// `scales_dtype` group scales of `group` columns) split into `shards` row shards. `ahead`: begun with
/// ple_gather_start, a linear enqueued, then ple_gather_wait (the model's order).
OpCase ple_gather_case(int64_t T, int64_t heads, int64_t hd, int64_t rows, DType dtype, int64_t shards,
                       TableSource source, bool ahead = false, int64_t group = 0, DType scales_dtype = DType::F16);
OpCase ple_gate_case(int64_t T, int64_t S, int64_t H, Weights wk = Weights::HostFp16);
OpCase ple_conv_add_batch_case(int64_t S, int64_t H, int64_t K, int64_t dilation, const StepPlan& plan,
                               Weights wk = Weights::HostFp16);

// ---------------------------------------------------------------- sampling
/// Greedy sample_tokens (and top-k 1 rows) over [rows, V] logits with planted ties: the CPU argmax (lowest id).
OpCase sample_tokens_case(int64_t rows, int64_t V);

}  // namespace flashnext::opcases
