// MoE block on the GPU (MODEL.md "MoE block"; reference Qwen4ExpTextSparseMoeBlock): FP32 router softmax + top-k,
// grouped FP16 routed experts (token slots sorted by expert, WMMA tensor-core GEMMs), and the shared expert
// (cuBLAS). Unquantized FP16 weights in checkpoint layouts. Work is enqueued on `stream`; bad sizes throw Error.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/cuda/blas.h"
#include "ops/cuda/buffer.h"

namespace flashnext::cuda {

/// Router: p = softmax(logits) in FP32 over `experts` (<= 1024), the top_k (<= 32) experts by (higher p, then lower
/// index), weights renormalised to sum 1 when `norm_topk_prob`. logits [tokens, experts] FP32 with row stride ld
/// (router.weight · u from Blas::linear with OutType::F32); ids/weights [tokens, top_k].
void moe_router_topk(const float* logits, int64_t ld, int tokens, int experts, int top_k, bool norm_topk_prob,
                     int32_t* ids, float* weights, cudaStream_t stream);

/// Routed experts of any weight storage W: gate_up [E, 2I, H] (gate rows, then up rows) and down [E, H, I].
/// H and I must be multiples of 8.
template <class W>
struct MoeExpertWeights {
  const W* gate_up = nullptr;
  const W* down = nullptr;
  int experts = 0, hidden = 0, inter = 0;
};
/// FP16 routed experts: experts.gate_up_proj and experts.down_proj as stored in the checkpoint.
using MoeExperts = MoeExpertWeights<__half>;

/// Scratch for moe_routed, sized for up to max_tokens tokens with top_k slots each.
class MoeWorkspace {
 public:
  MoeWorkspace(int max_tokens, int top_k, int experts, int hidden, int inter);
  int max_tokens, top_k, experts, hidden, inter, max_tiles;
  DeviceArray<int32_t> offsets, sorted_slots, slot_row, tile_expert, tile_row, num_tiles, status;
  DeviceArray<__half> h, ys;
};

/// out[t] = sum_j weights[t,j] * down_{ids[t,j]}( silu(gate(u_t)) * up(u_t) )  (+ sigmoid(shared_gate[t]) *
/// shared[t] when `shared` is given: the shared expert's output [tokens, H] FP16 and its gate logit [tokens] FP32).
/// u [tokens, H] FP16 with row stride ldu (a multiple of 8); out [tokens, H] FP16 with row stride ldo. Each routed
/// expert output is rounded to FP16 after weighting; the k slots of a token are summed in FP32 in slot order
/// (deterministic). An expert id outside [0, E) is dropped and reported by moe_check_status.
void moe_routed(const MoeExperts& w, const __half* u, int64_t ldu, int tokens, const int32_t* ids, const float* weights,
                const __half* shared, const float* shared_gate, __half* out, int64_t ldo, MoeWorkspace& ws,
                cudaStream_t stream);

/// Throws Error if a routed call met expert ids outside [0, E) (waits for the stream).
void moe_check_status(MoeWorkspace& ws, cudaStream_t stream);

namespace detail {
/// Waits for `stream`, then throws Error naming `op` if the device flag `status` (set by the grouping kernels) is
/// non-zero: expert ids outside [0, experts) were given.
void check_expert_status(const int32_t* status, int experts, const char* op, cudaStream_t stream);
}  // namespace detail

/// Shared expert: shared_expert.{gate,up}_proj [I, H], down_proj [H, I]; shared_expert_gate.weight [1, H].
struct SharedExpert {
  const __half* gate = nullptr;
  const __half* up = nullptr;
  const __half* down = nullptr;
  const __half* gate_logit = nullptr;
  int hidden = 0, inter = 0;
};

/// Scratch for moe_shared: [max_tokens, I] x 3 FP16.
class SharedExpertWorkspace {
 public:
  SharedExpertWorkspace(int max_tokens, int inter);
  int max_tokens;
  DeviceArray<__half> g, u, a;
};

/// out [tokens, H] FP16 = down(silu(gate(x)) * up(x)); gate_logit_out [tokens] FP32 = shared_expert_gate · x
/// (moe_routed applies the sigmoid).
void moe_shared(Blas& blas, const SharedExpert& w, const __half* x, int tokens, __half* out, float* gate_logit_out,
                SharedExpertWorkspace& ws, cudaStream_t stream);

}  // namespace flashnext::cuda
