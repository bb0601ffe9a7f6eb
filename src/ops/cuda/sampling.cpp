#include "ops/cuda/sampling.h"

#include "ops/cuda/cuda_check.h"

namespace flashnext::cuda {

void sample_tokens(const float* logits, int64_t ld, int rows, int vocab, const SamplingParams* params, int32_t* tokens,
                   cudaStream_t stream) {
  FN_CHECK(rows >= 0 && vocab >= 1 && ld >= vocab, "sample_tokens: {} rows of {} logits (row stride {})", rows, vocab,
           ld);
  FN_CHECK(rows == 0 || (logits && params && tokens), "sample_tokens: null pointer");
  FN_CUDA_CHECK(detail::launch_sample(logits, ld, rows, vocab, params, tokens, stream), "sample_tokens");
}

}  // namespace flashnext::cuda
