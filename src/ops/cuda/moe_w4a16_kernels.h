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
constexpr int kW4GemvThreads = 256; // threads per GEMV block
constexpr int kW4GemvOutsGateUp = 1;  // output columns per GEMV lane group, gate/up (a gate and an up row each)
constexpr int kW4GemvOutsDown = 2;    // output columns per GEMV lane group, down
constexpr int kW4GemvChunks = 3;    // 16-byte code chunks per lane and row loaded ahead of the arithmetic
constexpr int kW4MmaWarps = 4;      // warps per tensor-core GEMV block (gate/up: one 16-row tile, K split 4 ways)
constexpr int kW4MmaDownTiles = 2;  // 16-row tiles per tensor-core down GEMV block (K split kW4MmaWarps / 2 ways)
constexpr int kW4GroupSlots = 8;    // slots of one expert per grouped tensor-core GEMV block: the MMA's 8 columns

/// One repacked W4 matrix stack on the device (layout: moe_w4a16.h, W4Packed).
struct W4Mat {
  const uint32_t* codes = nullptr;  ///< [E][rows][wpr] words of 8 codes, nibble order k0 k2 k4 k6 k1 k3 k5 k7
                                    ///< (FP8: 4 E4M3 bytes, input 4i + b in byte b)
  const __half* scales = nullptr;   ///< [E][rows][groups] FP16 group scales (not FP8)
  const float* fscales = nullptr;   ///< FP8: [E][rows][groups] F32 group scales
  const uint8_t* zeros = nullptr;   ///< [E][rows][groups] int4 zero points 0..16, or null (implicit 8)
  const float* global = nullptr;    ///< [E][rows] FP32 row multipliers (divisors when `divide`)
  int rows = 0, cols = 0, wpr = 0, groups = 0, group = 0;
  bool nvfp4 = false, divide = false;
  bool fp8 = false;      ///< W4Format::Fp8: one byte a weight (only the FP32-FMA GEMV and the WMMA GEMM take it)
  int chunk_shift = -1;  ///< log2(group / 32) where group is 32 * 2^k (chunk c's group: c >> chunk_shift), else -1
};

/// The grouping of token slots by expert that launch_w4_align writes (device arrays): offsets [E+1] (expert e's
/// sorted rows are offsets[e] .. offsets[e+1]-1), sorted_slots [slots] (the slot of each sorted row), and tiles of
/// at most `tile_m` sorted rows of one expert (tile i: expert tile_expert[i], first row tile_row[i]; *num_tiles of
/// them).
struct W4Tiles {
  const int32_t* offsets = nullptr;
  const int32_t* sorted_slots = nullptr;
  const int32_t* tile_expert = nullptr;
  const int32_t* tile_row = nullptr;
  const int32_t* num_tiles = nullptr;
};

#ifndef __CUDACC_RTC__  // host launchers
/// Lanes that share one output row in the GEMV kernels for rows of `cols` inputs: the fewest of 4, 8, 16, 32 that
/// leave each lane at most kW4GemvChunks code chunks of 32 inputs (32 when none does; the lanes then loop).
constexpr int w4_gemv_lanes(int cols) {
  const int chunks = (cols + 31) / 32;
  int lanes = 4;
  while (lanes < 32 && (chunks + lanes - 1) / lanes > kW4GemvChunks) lanes *= 2;
  return lanes;
}
/// The `cols` argument of w4_gemv_lanes / w4_gemv_row_blocks for a matrix: its width in 4-bit code columns (an FP8
/// row of C inputs has the code bytes of a 4-bit row of 2C).
constexpr int w4_code_cols(const W4Mat& w) {
  return w.fp8 ? 2 * w.cols : w.cols;
}
/// GEMV blocks over `rows` output columns of `cols` inputs, `outs` columns per lane group (the grid's y extent).
constexpr int w4_gemv_row_blocks(int rows, int cols, int outs) {
  const int per_block = outs * (kW4GemvThreads / w4_gemv_lanes(cols));
  return (rows + per_block - 1) / per_block;
}
/// Row blocks of the down GEMV, either kernel (the completion counters per token: at least this many), `inter` in
/// code columns (w4_code_cols).
constexpr int w4_gemv_down_row_blocks(int hidden, int inter) {
  const int fma = w4_gemv_row_blocks(hidden, inter, kW4GemvOutsDown),
            mma = (hidden + 16 * kW4MmaDownTiles - 1) / (16 * kW4MmaDownTiles);
  return fma > mma ? fma : mma;
}

/// Whether the tensor-core GEMV kernels (mma.sync m16n8k16, compute capability 8.0+) can compute `w` on the current
/// device: the build holds them for 8.0+ (kernel_ptx_version: not so in the compute_70 PTX build) and the format is
/// NVFP4 or int4 with groups of a multiple of 32 inputs (not FP8). Otherwise the FP32-FMA kernels (every GPU) run.
bool w4_gemv_tensor_cores(const W4Mat& w);
/// Whether this build's tensor-core GEMV code for the current device holds the SM80 instructions (any format).
bool w4_gemv_tensor_cores_compiled();

/// dst [rows, copies * cols] = `copies` copies of each row of src [rows, cols] (row stride ld) side by side: the
/// inputs of experts held as two 4-bit planes (moe_w4a16.h MoeW4A16Experts::planes). cols and ld multiples of 8,
/// both pointers 16-byte aligned (cudaErrorInvalidValue otherwise).
cudaError_t launch_repeat_cols_f16(const __half* src, int64_t ld, int rows, int cols, int copies, __half* dst,
                                   cudaStream_t stream);
/// Groups token slots by expert (one block, parallel scan; experts <= kMoeMaxExperts): offsets [E+1],
/// sorted_slots / slot_row [slots] (a slot's sorted row), tiles of at most tile_m sorted rows of one expert
/// (tile_expert / tile_row, count in *num_tiles; at most ceil(slots / tile_m) + min(E, slots) of them): kW4TileM for
/// the GEMM path, kW4GroupSlots for the grouped GEMV. Ids outside [0, E) get slot_row -1 and set *status.
cudaError_t launch_w4_align(const int32_t* ids, int slots, int experts, int tile_m, int32_t* offsets,
                            int32_t* sorted_slots, int32_t* slot_row, int32_t* tile_expert, int32_t* tile_row,
                            int32_t* num_tiles, int32_t* status, cudaStream_t stream);
/// GEMV path (decode), gate/up, one slot per block column: h[s, n] = fp16(silu(g) * u) of expert ids[s] on token
/// s / top_k, for every slot s < slots. Ids outside [0, E) are skipped and set *status. tensor_cores: the mma.sync
/// kernel (only where w4_gemv_tensor_cores(w)), else the FP32-FMA one.
cudaError_t launch_w4_gemv_gate_up(const W4Mat& w, const __half* u, int64_t ldu, const int32_t* ids, int slots,
                                   int top_k, int experts, int inter, __half* h, int32_t* status, bool tensor_cores,
                                   cudaStream_t stream);
/// The tensor-core gate/up GEMV (only where w4_gemv_tensor_cores(w)) over FP32 activations u (ldu a multiple of 4,
/// 16-byte aligned rows), rounded to FP16 as the kernel stages them: h as the FP16 form's on an FP16 copy of u.
/// cudaErrorInvalidValue where w4_gemv_tensor_cores(w) is false (FP8 experts, a GPU below SM80) or u is misaligned.
cudaError_t launch_w4_gemv_gate_up(const W4Mat& w, const float* u, int64_t ldu, const int32_t* ids, int slots,
                                   int top_k, int experts, int inter, __half* h, int32_t* status, cudaStream_t stream);
/// GEMV path, down and combine in one kernel: ys[s, n] = fp16(weights[s] * down_{ids[s]}(h[s])); the last block of
/// each (token, row block) to finish (counted in done [tokens, w4_gemv_down_row_blocks(H, w4_code_cols(w))], zero
/// before and after) writes out[t, n] = the FP32 sum of the token's valid slots in slot order (+ shared[t, n], the
/// gated shared expert's term in FP32, when shared is not null), as launch_moe_combine. TO: __half or float.
/// tensor_cores as in launch_w4_gemv_gate_up.
template <class TO>
cudaError_t launch_w4_gemv_down(const W4Mat& w, const __half* h, const int32_t* ids, const float* weights, int tokens,
                                int top_k, int experts, int hidden, int inter, __half* ys, int32_t* done,
                                const float* shared, TO* out, int64_t ldo, bool tensor_cores, cudaStream_t stream);
/// Whether the grouped tensor-core GEMV kernels can compute `w` on the current device: w4_gemv_tensor_cores(w), and
/// the kW4GroupSlots staged activation rows fit the device's shared memory per block (opt-in limit).
bool w4_gemv_grouped(const W4Mat& w);
/// Shared memory a grouped GEMV block of `w` takes (staged rows and static arrays), in bytes: what bounds its blocks
/// per SM.
size_t w4_gemv_grouped_smem(const W4Mat& w);
/// Grouped GEMV path (decode of several tokens), gate/up: one block per (tile of launch_w4_align with tile_m =
/// kW4GroupSlots, 8 gate rows and their up rows); the tile's slots' activations are the MMA's columns, so each of an
/// expert's weights is read once per kW4GroupSlots of its slots. h[r, n] = fp16(silu(g) * u) for every sorted row r
/// (the GEMM path's layout), bit for bit the tensor-core GEMV's value for r's slot. max_tiles: the grid's extent
/// (blocks past *num_tiles return at once). Only where w4_gemv_grouped(w). u: FP16, or FP32 rounded to FP16 as the
/// rows are staged (ldu a multiple of 4 and 16-byte aligned rows; launch_w4_gemv_gate_up's FP32 form).
cudaError_t launch_w4_gemv_grouped_gate_up(const W4Mat& w, const __half* u, int64_t ldu, const W4Tiles& tiles,
                                           int max_tiles, int top_k, int inter, __half* h, cudaStream_t stream);
cudaError_t launch_w4_gemv_grouped_gate_up(const W4Mat& w, const float* u, int64_t ldu, const W4Tiles& tiles,
                                           int max_tiles, int top_k, int inter, __half* h, cudaStream_t stream);
/// Grouped GEMV path, down: ys[r, n] = fp16(weights[sorted_slots[r]] * down_e(h[r])) for every sorted row r (h rows
/// `inter` wide), bit for bit the tensor-core down GEMV's value; combined afterwards by launch_moe_combine. Only where
/// w4_gemv_grouped(w).
cudaError_t launch_w4_gemv_grouped_down(const W4Mat& w, const __half* h, const W4Tiles& tiles, int max_tiles,
                                        const float* weights, int hidden, int inter, __half* ys, cudaStream_t stream);
/// Whether the mma.sync GEMM kernels (compute capability 8.0+) can compute `w` on the current device: compiled for
/// it (as w4_gemv_tensor_cores_compiled) and NVFP4 or int4 with groups of a multiple of 32 inputs (not FP8).
/// Otherwise the WMMA GEMM (every GPU) runs.
bool w4_gemm_tensor_cores(const W4Mat& w);
/// GEMM path (prefill) over the sorted rows of launch_w4_align, FP32 accumulation: h[r, n] = fp16(silu(g) * u) and
/// ys[r, n] = fp16(weight(slot) * y) for every sorted row r (combined afterwards by launch_moe_combine).
/// tensor_cores: the mma.sync m16n8k16 kernels (only where w4_gemm_tensor_cores(w)), else WMMA m16n16k16 (SM70 set).
cudaError_t launch_w4_gemm_gate_up(const W4Mat& w, const __half* u, int64_t ldu, int top_k, int inter,
                                   const int32_t* offsets, const int32_t* sorted_slots, const int32_t* tile_expert,
                                   const int32_t* tile_row, const int32_t* num_tiles, int max_tiles, __half* h,
                                   bool tensor_cores, cudaStream_t stream);
cudaError_t launch_w4_gemm_down(const W4Mat& w, const __half* h, int hidden, int inter, const int32_t* offsets,
                                const int32_t* sorted_slots, const float* weights, const int32_t* tile_expert,
                                const int32_t* tile_row, const int32_t* num_tiles, int max_tiles, __half* ys,
                                bool tensor_cores, cudaStream_t stream);
#endif

}  // namespace flashnext::cuda::detail
