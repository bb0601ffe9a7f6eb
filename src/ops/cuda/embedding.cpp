#include "ops/cuda/embedding.h"

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/embedding_kernels.h"

namespace flashnext::cuda {

void embed_tokens(const __half* table, int64_t vocab, int hidden, const int32_t* ids, int tokens, int copies,
                  __half* out, int32_t* status, cudaStream_t stream) {
  FN_CHECK(vocab >= 1 && hidden >= 1 && copies >= 1 && tokens >= 0,
           "embed_tokens: vocab {} hidden {} copies {} tokens {}", vocab, hidden, copies, tokens);
  FN_CHECK(tokens == 0 || (table && ids && out), "embed_tokens: null pointer");
  FN_CUDA_CHECK(detail::launch_embed(table, vocab, hidden, ids, tokens, copies, out, status, stream), "embed_tokens");
}

void embed_check_status(const int32_t* status, cudaStream_t stream) {
  FN_CUDA_CHECK(cudaStreamSynchronize(stream), "embed_check_status");
  int32_t v = 0;
  FN_CUDA_CHECK(cudaMemcpy(&v, status, sizeof v, cudaMemcpyDeviceToHost), "embed_check_status");
  FN_CHECK(v == 0, "embed_tokens: token ids outside the vocabulary were given; their embeddings were zeroed");
}

void lm_head(Blas& blas, const __half* h, int tokens, int hidden, const __half* weight, int vocab, float* logits,
             int64_t ld, cudaStream_t stream) {
  FN_CHECK(ld >= vocab && ld <= INT32_MAX, "lm_head: logits row stride {} for vocab {}", ld, vocab);
  blas.linear(h, tokens, hidden, weight, vocab, logits, OutType::F32, int(ld), stream, "lm_head");
}

}  // namespace flashnext::cuda
