// Launchers of the gated delta rule kernels (gdn_kernels.cu). No argument checks here: gdn_ops.cpp checks the
// tensors (ops/contract/gdn.h) and the limits below.
#pragma once

#include <cuda_fp16.h>

#include "ops/cuda/cuda_stdint.h"
#ifndef __CUDACC_RTC__
#include <cuda_runtime_api.h>
#endif

namespace flashnext::cuda::detail {

constexpr int kGdnMaxDk = 128;    // key head dim (smem-sized in the chunked kernel)
constexpr int kGdnChunk = 64;     // tokens per chunk in the chunked prefill (the reference's chunk size)

/// Head geometry as the kernels take it (ops.h GdnDims in 32-bit form).
struct GdnHeads {
  int nk, nv, dk, dv;
};

/// The GDN output norm (`Qwen4ExpTextRMSNormGated`, ops.h gated_rms_norm) folded into the recurrence:
/// o <- w * (o * rsqrt(mean over the head's dv outputs of o^2 + eps)) * act(z), per row and value head, in float32;
/// act = silu (silu) or sigmoid. z == nullptr: no norm. z [rows, ld_z] at the outputs' columns; w [dv]; done: one
/// int32 counter per (state slot, value head), [slots * nv], all zero before the launch and left zero after it (the
/// last block of a (slot, head) resets its counter).
struct GdnOutNorm {
  const float* z = nullptr;
  int64_t ld_z = 0;
  const __half* w = nullptr;
  float eps = 0.f;
  bool silu = false;
  int32_t* done = nullptr;
};

/// The causal conv (ops.h gdn_conv_batch) folded into the recurrence: the kernel reads the raw in_proj_qkv rows and
/// computes silu(sum_k w[c, k] x[t - (K-1) + k, c]) itself (inputs before the sequence's rows from its conv state),
/// leaving qkv as it was, and writes the slot's new conv state (its last K - 1 inputs). w == nullptr: qkv is already
/// the conv output. w [C, K] FP16, state [slots, K-1, C] F32 (C = ld_qkv), 1 <= K <= kGdnFoldedConvMaxTaps; done:
/// one int32 counter per (state slot, key head), [slots * nk], zero before and after the launch (the last block of
/// a key head's value heads writes its q and k channels' state).
constexpr int kGdnFoldedConvMaxTaps = 8;
struct GdnConvIn {
  const __half* w = nullptr;
  float* state = nullptr;
  int K = 0;
  int32_t* done = nullptr;
};

#ifndef __CUDACC_RTC__  // host launchers
/// The recurrence, one launch for every sequence s of the step: over its rows seq_starts[s] .. seq_starts[s+1] in
/// order (seq_starts null: row s alone, a decode step), state in slot slots[s] read once and written once. Each row
/// runs a decode step's operations, so n rows equal n decode steps bit for bit. For few rows per sequence (CudaOps::
/// few_rows: a speculative verify, its replay, a short chunk); the chunked form is faster beyond. With conv.w set,
/// qkv is the raw projection and the conv is computed in the launch (GdnConvIn); with norm.z set, the outputs are the
/// gated norm's (GdnOutNorm), made by the last of each (sequence, value head)'s blocks to finish.
cudaError_t launch_gdn_recurrent(const float* qkv, int64_t ld_qkv, const float* a, const float* b, int64_t ld_ab,
                                 const float* a_log, const float* dt_bias, float* state, const int32_t* slots,
                                 const int32_t* seq_starts, int num_seqs, GdnHeads dims, float* out, int64_t ld_out,
                                 const GdnConvIn& conv, const GdnOutNorm& norm, cudaStream_t stream);

/// Blocks of launch_gdn_recurrent's folded-conv kernel (conv.w set) that the current GPU holds at once (its SMs times
/// the kernel's blocks an SM, by the occupancy calculator; 0 where the query fails). The folded kernel takes twice
/// the registers of the other, so the CUDA backend folds the conv in only where a launch's num_seqs * nv *
/// ceil(dv / 32) blocks fit in this.
int gdn_recurrent_folded_resident_blocks();

/// The chunked form over the rows cu_seqlens[s] .. cu_seqlens[s+1] of every sequence s (`rows` in all), state in
/// slot slots[s] read and written. Per pass of `heads_per_pass` value heads (gdn_kernels.cu): the chunk preparation,
/// then the state walk and the outputs (one tensor-core launch, or two float32 ones), with their intermediates in
/// `scratch`, which holds
/// gdn_chunked_scratch_floats(num_seqs, rows, dims, tensor_cores, heads_per_pass) floats (16-byte aligned: the walk's
/// cp.async). Needs dk <= kGdnMaxDk, dk % 4 == 0. tensor_cores: the state walk and the outputs in one kernel of FP16x2
/// mma.sync products (about 2^-22 of the largest element of each warp's operand: gdn_kernels.cu), where
/// gdn_chunked_tensor_cores_supported (else cudaErrorInvalidValue); otherwise float32 FMAs.
cudaError_t launch_gdn_chunked_prefill(const float* qkv, int64_t ld_qkv, const float* a, const float* b, int64_t ld_ab,
                                       const float* a_log, const float* dt_bias, float* state, const int32_t* slots,
                                       const int32_t* cu_seqlens, int num_seqs, int64_t rows, GdnHeads dims,
                                       bool tensor_cores, int heads_per_pass, float* scratch, float* out,
                                       int64_t ld_out, cudaStream_t stream);
/// Whether the tensor-core form of launch_gdn_chunked_prefill runs on the current device for these heads: its kernel
/// compiled for SM80+ there, dk a multiple of 16, and its shared memory (about 138 KB at dk = 128) within the
/// device's per-block limit.
bool gdn_chunked_tensor_cores_supported(GdnHeads dims);
/// Value heads per pass of launch_gdn_chunked_prefill so that its scratch stays within max_scratch_floats (at least
/// one head), and the scratch that takes.
int gdn_chunked_heads_per_pass(int num_seqs, int64_t rows, GdnHeads dims, bool tensor_cores,
                               int64_t max_scratch_floats);
int64_t gdn_chunked_scratch_floats(int num_seqs, int64_t rows, GdnHeads dims, bool tensor_cores, int heads_per_pass);
#endif

}  // namespace flashnext::cuda::detail
