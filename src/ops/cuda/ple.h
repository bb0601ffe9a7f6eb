// PLE (hashed n-gram embedding) on the GPU: the row gather from a table in device memory or in pinned host memory
// read over the host link (UVA), the per-stream gating and the dilated causal conv with the residual add.
// MODEL.md "PLE"; reference Qwen4ExpTextNGramEmbedding / Qwen4ExpTextPLELayer. Row ids come from
// ple/ngram_hash.h (they depend only on token ids). Work is enqueued on `stream`; bad sizes throw Error.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "ops/cuda/buffer.h"

namespace flashnext::cuda {

/// Element type of the table rows: FP16, BF16 (converted, not computed with), or FP8 E4M3 with one scale.
enum class PleTableType { F16, BF16, F8E4M3 };

/// Where the PLE table lives for the gather kernel: the device addresses of its row shards (device memory, or
/// PinnedMemory::device() for a host-resident table), each of rows_per_shard rows (the last may be shorter) of
/// row_dim elements; total_rows rows in all. `scale` multiplies every value (the FP8 table's weight_scale; 1
/// otherwise).
class PleTable {
 public:
  PleTable(const std::vector<const void*>& shard_addresses, int64_t rows_per_shard, int64_t total_rows, int row_dim,
           PleTableType type, float scale);
  const void* const* shards() const { return shards_.get(); }
  int num_shards() const { return int(shards_.size()); }
  int64_t rows_per_shard, total_rows;
  int row_dim;
  PleTableType type;
  float scale;

 private:
  DeviceArray<const void*> shards_;
};

/// Bytes of one row of `type` with row_dim elements.
size_t ple_row_bytes(PleTableType type, int row_dim);

/// out [tokens, heads*row_dim] FP16 = concat over heads of table[rows[t*heads + h]] (rows: device int64, e.g. from
/// NgramHashParams::rows_for). A row id outside the table gives zeros and ORs 1 into *status (device int32, may
/// be null); check it with ple_check_status.
void ple_gather(const PleTable& table, const int64_t* rows, int tokens, int heads, __half* out, int32_t* status,
                cudaStream_t stream);
void ple_check_status(const int32_t* status, cudaStream_t stream);

/// Gating, per token: kn = grouped ZC-RMSNorm(key) (norm_key), qn = grouped ZC-RMSNorm(x) (norm_query), groups of
/// `hidden`; s_b = (kn_b · qn_b)/sqrt(H), s_b = sign(s_b) sqrt(max(|s_b|, 1e-6)); p = concat_b sigmoid(s_b) * value;
/// pn = grouped ZC-RMSNorm(p) (norm_conv). key = key_proj(e) [T, S*H], value = value_proj(e) [T, H],
/// x = the wide residual [T, S*H]; outputs p, pn [T, S*H] FP16 (all contiguous rows).
void ple_gate(const __half* key, const __half* value, const __half* x, const __half* norm_key_w,
              const __half* norm_query_w, const __half* norm_conv_w, int tokens, int streams, int hidden, float eps,
              __half* p, __half* pn, cudaStream_t stream);

/// x += p + silu(depthwise causal conv over time of pn, kernel K, dilation d)  (conv1d.weight [C, 1, K] as [C, K]).
/// Sequences are packed along T with cu_seqlens [num_seqs+1] (device) and state slots [num_seqs] (device); the state
/// pool is [slots, (K-1)*d, C] FP16, the last (K-1)*d conv inputs of each sequence, oldest first (zero when new);
/// it is updated. Decode is the case of one token per sequence.
void ple_conv(__half* x, const __half* p, const __half* pn, const int32_t* cu_seqlens, int num_seqs, int total_tokens,
              __half* state, const int32_t* slots, const __half* w, int channels, int kernel, int dilation,
              cudaStream_t stream);

}  // namespace flashnext::cuda
