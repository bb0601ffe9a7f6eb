#include "ops/cuda/ple.h"

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/ple_kernels.h"

namespace flashnext::cuda {

size_t ple_row_bytes(PleTableType type, int row_dim) {
  return size_t(row_dim) * (type == PleTableType::F8E4M3 ? 1 : 2);
}

PleTable::PleTable(const std::vector<const void*>& shard_addresses, int64_t rows_per_shard_, int64_t total_rows_,
                   int row_dim_, PleTableType type_, float scale_)
    : rows_per_shard(rows_per_shard_),
      total_rows(total_rows_),
      row_dim(row_dim_),
      type(type_),
      scale(scale_),
      shards_(to_device(shard_addresses, "PLE shard addresses")) {
  FN_CHECK(!shard_addresses.empty() && rows_per_shard > 0 && row_dim > 0 && total_rows > 0,
           "PleTable: {} shards of {} rows, {} rows in all, rows of {} elements", shard_addresses.size(),
           rows_per_shard, total_rows, row_dim);
  FN_CHECK(total_rows <= rows_per_shard * int64_t(shard_addresses.size()),
           "PleTable: {} rows do not fit in {} shards of {} rows", total_rows, shard_addresses.size(), rows_per_shard);
  for (const void* p : shard_addresses) FN_CHECK(p, "PleTable: null shard address");
}

void ple_gather(const PleTable& t, const int64_t* rows, int tokens, int heads, __half* out, int32_t* status,
                cudaStream_t stream) {
  FN_CHECK(tokens >= 0 && heads >= 1, "ple_gather: {} tokens, {} heads", tokens, heads);
  FN_CHECK(tokens == 0 || (rows && out), "ple_gather: null pointer");
  const int type = t.type == PleTableType::F16    ? detail::kPleF16
                   : t.type == PleTableType::BF16 ? detail::kPleBF16
                                                  : detail::kPleF8E4M3;
  FN_CUDA_CHECK(detail::launch_ple_gather(t.shards(), t.num_shards(), t.rows_per_shard, t.total_rows, type, t.scale,
                                          t.row_dim, rows, tokens, heads, out, status, stream),
                "ple_gather");
}

void ple_check_status(const int32_t* status, cudaStream_t stream) {
  FN_CUDA_CHECK(cudaStreamSynchronize(stream), "ple_check_status");
  int32_t v = 0;
  FN_CUDA_CHECK(cudaMemcpy(&v, status, sizeof v, cudaMemcpyDeviceToHost), "ple_check_status");
  FN_CHECK(v == 0, "ple_gather: row ids outside the PLE table were given; those rows were read as zeros");
}

void ple_gate(const __half* key, const __half* value, const __half* x, const __half* norm_key_w,
              const __half* norm_query_w, const __half* norm_conv_w, int tokens, int streams, int hidden, float eps,
              __half* p, __half* pn, cudaStream_t stream) {
  FN_CHECK(streams >= 1 && streams <= detail::kPleMaxStreams && hidden >= 1 && tokens >= 0,
           "ple_gate: {} streams (1..{}) of {} over {} tokens", streams, detail::kPleMaxStreams, hidden, tokens);
  FN_CHECK(tokens == 0 || (key && value && x && norm_key_w && norm_query_w && norm_conv_w && p && pn),
           "ple_gate: null pointer");
  FN_CUDA_CHECK(detail::launch_ple_gate(key, value, x, norm_key_w, norm_query_w, norm_conv_w, tokens, streams, hidden,
                                        eps, p, pn, stream),
                "ple_gate");
}

void ple_conv(__half* x, const __half* p, const __half* pn, const int32_t* cu_seqlens, int num_seqs, int total_tokens,
              __half* state, const int32_t* slots, const __half* w, int channels, int kernel, int dilation,
              cudaStream_t stream) {
  FN_CHECK(channels >= 1 && kernel >= 1 && dilation >= 1 && (kernel - 1) * dilation <= detail::kPleMaxConvTail,
           "ple_conv: kernel {} with dilation {} (tail at most {}), {} channels", kernel, dilation,
           detail::kPleMaxConvTail, channels);
  FN_CHECK(num_seqs >= 0 && total_tokens >= 0, "ple_conv: {} sequences, {} tokens", num_seqs, total_tokens);
  FN_CHECK(total_tokens == 0 || (x && p && pn && cu_seqlens && slots && w && (state || kernel == 1)),
           "ple_conv: null pointer");
  FN_CUDA_CHECK(detail::launch_ple_conv(x, p, pn, cu_seqlens, num_seqs, total_tokens, state, slots, w, channels, kernel,
                                        dilation, stream),
                "ple_conv");
}

}  // namespace flashnext::cuda
