// Launchers for the PLE kernels (ple_kernels.cu). No argument checks here: call through ple.h.
#pragma once

#include <cuda_fp16.h>

#include "ops/cuda/cuda_stdint.h"
#ifndef __CUDACC_RTC__
#include <cuda_runtime_api.h>
#endif

namespace flashnext::cuda::detail {

/// Storage type of the PLE table rows.
enum PleTableType : int32_t { kPleF16 = 0, kPleBF16 = 1, kPleF8E4M3 = 2 };
constexpr int kPleMaxStreams = 8;
constexpr int kPleMaxConvTail = 32;  // (kernel-1)*dilation

#ifndef __CUDACC_RTC__  // host launchers
cudaError_t launch_ple_gather(const void* const* shards, int num_shards, int64_t rows_per_shard, int64_t total_rows,
                              int table_type, float scale, int row_dim, const int64_t* rows, int tokens, int heads,
                              __half* out, int32_t* status, cudaStream_t stream);
// FP32-output gather (the ops interface's float32 n-gram embedding); same kernel.
cudaError_t launch_ple_gather(const void* const* shards, int num_shards, int64_t rows_per_shard, int64_t total_rows,
                              int table_type, float scale, int row_dim, const int64_t* rows, int tokens, int heads,
                              float* out, int32_t* status, cudaStream_t stream);
cudaError_t launch_ple_gate(const __half* key, const __half* value, const __half* x, const __half* w_key,
                            const __half* w_query, const __half* w_conv, int tokens, int streams, int hidden, float eps,
                            __half* p, __half* pn, cudaStream_t stream);
cudaError_t launch_ple_conv(__half* x, const __half* p, const __half* pn, const int32_t* cu_seqlens, int num_seqs,
                            int total_tokens, __half* state, const int32_t* slots, const __half* w, int channels,
                            int kernel, int dilation, cudaStream_t stream);
#endif

}  // namespace flashnext::cuda::detail
