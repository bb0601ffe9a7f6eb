// Launchers for the MoE kernels (moe_kernels.cu). No argument checks here: call through moe.h.
#pragma once

#include <cuda_fp16.h>

#include "ops/cuda/cuda_stdint.h"
#ifndef __CUDACC_RTC__
#include <cuda_runtime_api.h>
#endif

namespace flashnext::cuda::detail {

constexpr int kMoeMaxExperts = 1024;
constexpr int kMoeMaxTopK = 32;
constexpr int kMoeTileM = 16;  // rows (token slots) per expert GEMM tile

#ifndef __CUDACC_RTC__  // host launchers
cudaError_t launch_moe_router_topk(const float* logits, int64_t ld, int tokens, int experts, int top_k, bool norm,
                                   int32_t* ids, float* weights, cudaStream_t stream);
cudaError_t launch_moe_align(const int32_t* ids, int slots, int experts, int32_t* offsets, int32_t* sorted_slots,
                             int32_t* slot_row, int32_t* tile_expert, int32_t* tile_row, int32_t* num_tiles,
                             int32_t* status, cudaStream_t stream);
cudaError_t launch_moe_down(const __half* h, const __half* down, int hidden, int inter, const int32_t* offsets,
                            const int32_t* sorted_slots, const float* weights, const int32_t* tile_expert,
                            const int32_t* tile_row, const int32_t* num_tiles, int max_tiles, __half* ys,
                            cudaStream_t stream);
/// out[t, c] = sum_j ys[slot_row[t * top_k + j], c] (rows < 0 skipped, slots in order j), + shared[t, c] (the gated
/// shared expert's term, [tokens, hidden] F32) when shared is not null; FP32 sums.
cudaError_t launch_moe_combine(const __half* ys, const int32_t* slot_row, int tokens, int top_k, int hidden,
                               const float* shared, __half* out, int64_t ldo, cudaStream_t stream);
// Gate/up GEMM over separately stacked gate_proj / up_proj [E, I, H] (expert_rows = I), or any two weight arrays
// whose expert e, row n starts at (e * expert_rows + n) * H elements.
cudaError_t launch_moe_gate_up_split(const __half* u, int64_t ldu, int top_k, const __half* gate, const __half* up,
                                     int64_t expert_rows, int hidden, int inter, const int32_t* offsets,
                                     const int32_t* sorted_slots, const int32_t* tile_expert, const int32_t* tile_row,
                                     const int32_t* num_tiles, int max_tiles, __half* h, cudaStream_t stream);
/// FP32-output combine (the ops interface's float32 MoE output); same kernel.
cudaError_t launch_moe_combine(const __half* ys, const int32_t* slot_row, int tokens, int top_k, int hidden,
                               const float* shared, float* out, int64_t ldo, cudaStream_t stream);
cudaError_t launch_silu_mul(const __half* gate, const __half* up, int64_t ld_in, __half* out, int64_t ld_out,
                            int tokens, int width, cudaStream_t stream);
#endif

}  // namespace flashnext::cuda::detail
