// Token embedding and lm_head on the GPU (MODEL.md "Top level": x0 = embed_tokens[ids], X = repeat(x0, S);
// logits = lm_head(h)).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/cuda/blas.h"

namespace flashnext::cuda {

/// out [tokens, copies*hidden] FP16: embed_tokens.weight [vocab, hidden] rows of ids [tokens] (device int32),
/// repeated `copies` times (hc_count streams; 1 for a plain embedding). An id outside [0, vocab) gives zeros and
/// ORs 1 into *status (device int32, may be null); embed_check_status throws for it.
void embed_tokens(const __half* table, int64_t vocab, int hidden, const int32_t* ids, int tokens, int copies,
                  __half* out, int32_t* status, cudaStream_t stream);
void embed_check_status(const int32_t* status, cudaStream_t stream);

/// logits [tokens, vocab] FP32 (row stride ld) = h [tokens, hidden] · lm_head.weight [vocab, hidden]^T (cuBLAS).
void lm_head(Blas& blas, const __half* h, int tokens, int hidden, const __half* weight, int vocab, float* logits,
             int64_t ld, cudaStream_t stream);

}  // namespace flashnext::cuda
