// Launchers for the W4A16 MoE kernels (moe_w4a16_kernels.cu). No argument checks here: call through moe_w4a16.h.
#pragma once

#include <cuda_fp16.h>

#include "ops/cuda/cuda_stdint.h"
#ifndef __CUDACC_RTC__
#include <cuda_runtime_api.h>
#endif

namespace flashnext::cuda::detail {

constexpr int kW4TileM = 64;        // token slots per GEMM tile (prefill path)
constexpr int kW4WordsAlign = 4;    // code words per row are padded to a multiple of this (16 bytes, 32 inputs)
constexpr int kW4GemvTokens = 8;    // tokens per register chunk of the GEMV path

/// One repacked W4 matrix stack on the device (layout: moe_w4a16.h, W4Packed).
struct W4Mat {
  const uint32_t* codes = nullptr;  ///< [E][rows][wpr] words of 8 codes, nibble order k0 k2 k4 k6 k1 k3 k5 k7
  const __half* scales = nullptr;   ///< [E][rows][groups] FP16 group scales
  const uint8_t* zeros = nullptr;   ///< [E][rows][groups] int4 zero points 0..16, or null (implicit 8)
  const float* global = nullptr;    ///< [E][rows] FP32 row multipliers (divisors when `divide`)
  int rows = 0, cols = 0, wpr = 0, groups = 0, group = 0;
  bool nvfp4 = false, divide = false;
};

#ifndef __CUDACC_RTC__  // host launchers
/// Groups token slots by expert (one block; experts <= kMoeMaxExperts): offsets [E+1], sorted_slots / slot_row
/// [slots], GEMM tiles of kW4TileM rows (tile_expert / tile_row, count in *num_tiles), the experts with at least one
/// slot (active, count in *num_active). Ids outside [0, E) get slot_row -1 and set *status.
cudaError_t launch_w4_align(const int32_t* ids, int slots, int experts, int32_t* offsets, int32_t* sorted_slots,
                            int32_t* slot_row, int32_t* tile_expert, int32_t* tile_row, int32_t* num_tiles,
                            int32_t* active, int32_t* num_active, int32_t* status, cudaStream_t stream);
/// GEMV path, gate/up: h[r, n] = fp16(silu(g) * u) for every sorted slot r of the active experts.
cudaError_t launch_w4_gemv_gate_up(const W4Mat& w, const __half* u, int64_t ldu, int top_k, int inter,
                                   const int32_t* offsets, const int32_t* sorted_slots, const int32_t* active,
                                   const int32_t* num_active, int max_active, __half* h, cudaStream_t stream);
/// GEMV path, down: ys[r, n] = fp16(weight(slot r) * down(h[r])).
cudaError_t launch_w4_gemv_down(const W4Mat& w, const __half* h, int hidden, int inter, const int32_t* offsets,
                                const int32_t* sorted_slots, const float* weights, const int32_t* active,
                                const int32_t* num_active, int max_active, __half* ys, cudaStream_t stream);
/// Tensor-core path (WMMA m16n16k16, FP32 accumulation), same outputs as the GEMV launchers.
cudaError_t launch_w4_gemm_gate_up(const W4Mat& w, const __half* u, int64_t ldu, int top_k, int inter,
                                   const int32_t* offsets, const int32_t* sorted_slots, const int32_t* tile_expert,
                                   const int32_t* tile_row, const int32_t* num_tiles, int max_tiles, __half* h,
                                   cudaStream_t stream);
cudaError_t launch_w4_gemm_down(const W4Mat& w, const __half* h, int hidden, int inter, const int32_t* offsets,
                                const int32_t* sorted_slots, const float* weights, const int32_t* tile_expert,
                                const int32_t* tile_row, const int32_t* num_tiles, int max_tiles, __half* ys,
                                cudaStream_t stream);
#endif

}  // namespace flashnext::cuda::detail
