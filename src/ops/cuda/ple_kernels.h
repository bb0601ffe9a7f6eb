// Launcher of the PLE gather kernel (ple_kernels.cu). No argument checks here: ple_ops.cpp checks the tensors
// (ops/contract/ple.h); the gate and conv of the ops interface are in cuda_ops_kernels.cu.
#pragma once

#include <cuda_fp16.h>

#include "ops/cuda/cuda_stdint.h"
#ifndef __CUDACC_RTC__
#include <cuda_runtime_api.h>
#endif

namespace flashnext::cuda::detail {

/// Storage type of the PLE table rows.
enum PleTableType : int32_t { kPleF16 = 0, kPleBF16 = 1, kPleF8E4M3 = 2, kPleI8 = 3, kPleF32 = 4 };

/// The group scales of an I8 table (ops.h PleTable::group_scales): per shard a [shard rows, row_dim / group] array
/// of `type` (kPleF16, kPleBF16 or kPleF32), laid out like the shards. Unused (null) for other tables.
struct PleGroupScales {
  const void* const* shards = nullptr;
  int type = 0;
  int group = 0;
};

#ifndef __CUDACC_RTC__  // host launchers
/// The n-gram rows of `rows` [tokens, heads] converted to float32 (times `scale`, and for I8 tables times each
/// group's scale) into out [tokens, heads*row_dim]; a row id outside [0, total_rows) reads zeros and sets the status
/// word.
cudaError_t launch_ple_gather(const void* const* shards, int num_shards, int64_t rows_per_shard, int64_t total_rows,
                              int table_type, float scale, PleGroupScales group_scales, int row_dim,
                              const int64_t* rows, int tokens, int heads, float* out, int32_t* status,
                              cudaStream_t stream);
#endif

}  // namespace flashnext::cuda::detail
