// Launcher of the QSA sparse-attention kernel (qsa_kernels.cu) and the paging it reads. No argument checks here:
// qsa_ops.cpp checks the tensors (through ops/contract/qsa.h) and the kernel limits below.
#pragma once

#include <cuda_fp16.h>

#include "ops/cuda/cuda_stdint.h"
#ifndef __CUDACC_RTC__
#include <cuda_runtime_api.h>
#endif

namespace flashnext::cuda::detail {

constexpr int kQsaMaxGroup = 16;    // query heads per KV head
constexpr int kQsaMaxDim = 256;     // attention head dim
constexpr int kQsaMaxIdxHeads = 8;  // indexer query heads
constexpr int kQsaMaxIdxDim = 256;  // indexer head dim
constexpr int kQsaMaxBlock = 16;    // tokens per indexer block (compress ratio)
constexpr int kQsaAttentionTile = 32;  // selected tokens per tile of launch_qsa_attention (splits are multiples)
constexpr int kQsaMaxSplits = 512;     // splits of a query's selection launch_qsa_attention takes

/// Error bits a QSA kernel ORs into the status word when it meets an index it must not follow.
enum QsaError : int32_t { kQsaBadPage = 1, kQsaBadPosition = 2, kQsaCountOverflow = 4 };

/// Paged-cache geometry shared by the kernels: block_table [num_seqs, table_ld] int32 of physical page ids,
/// num_pages pages of page_size tokens.
struct QsaPaging {
  const int32_t* block_table;
  int64_t table_ld;
  int32_t num_pages;
  int32_t page_size;
};

#ifndef __CUDACC_RTC__  // host launchers
cudaError_t launch_qsa_attention(const float* q, int64_t ldq, const int32_t* tok_seq, const int32_t* tok_pos,
                                 const int32_t* selected, int64_t ld_sel, const int32_t* counts, int tokens,
                                 QsaPaging pg, const float* k_cache, const float* v_cache, int heads, int kv_heads,
                                 int dim, int splits, int split_len, const float* gate, int64_t ld_gate,
                                 int64_t gate_head_stride, float* partial, float* out, int64_t ldo, int32_t* status,
                                 cudaStream_t stream);

/// How the tile-union attention kernel (prefill, mma.sync: compute capability 8.0+) runs a head geometry on the
/// current device: qpc consecutive queries of a sequence a block (at most 8, qpc * G <= 96 rows for G = heads /
/// kv_heads; the most that fit the device's shared memory), the head dim padded to 16 nt (32, 64, 128 or 256), smem
/// bytes of dynamic shared memory. qpc = 0: the kernel cannot run it here (its code is not SM80+ on this device,
/// dim % 4 != 0 or dim > 256, or too little shared memory). multiprocessors: the device's (one block an SM).
struct QsaUnionPlan {
  int qpc = 0;
  int nt = 0;
  size_t smem = 0;
  int multiprocessors = 0;
};
QsaUnionPlan qsa_union_plan(int heads, int kv_heads, int dim);

/// Sparse attention by groups of plan.qpc consecutive rows of a sequence: `groups` = the sum over the step's
/// sequences (seq_starts [num_seqs + 1]) of ceil(rows / qpc); each group's (KV head's) block reads the union of its
/// queries' selections (compact rows of `counts` logical positions, as launch_qsa_attention's) once. Launches of
/// group_batch groups at most, each over the same scratch: words [group_batch * kv_heads, words_ld] (words_ld >=
/// largest position / 4 + 1; zeroed here) and lists [group_batch * kv_heads, list_ld] (list_ld >= the union's size).
/// Caches 16-byte aligned, dim % 4 == 0 and cache rows below 2^31 (the caller checks). Out-of-range positions and pages
/// set kQsaBadPosition / kQsaBadPage in `status` and are skipped. Writes out = softmax(q k / sqrt(dim)) v *
/// sigmoid(gate) (gate may be null).
cudaError_t launch_qsa_union_attention(const QsaUnionPlan& plan, const float* q, int64_t ldq, const int32_t* seq_starts,
                                       int num_seqs, int groups, const int32_t* tok_pos, const int32_t* selected,
                                       int64_t ld_sel, const int32_t* counts, QsaPaging pg, const float* k_cache,
                                       const float* v_cache, int heads, int kv_heads, int dim, const float* gate,
                                       int64_t ld_gate, int64_t gate_head_stride, float* out, int64_t ldo,
                                       uint32_t* words, int64_t words_ld, uint2* lists, int64_t list_ld,
                                       int group_batch, int32_t* status, cudaStream_t stream);
#endif

}  // namespace flashnext::cuda::detail
