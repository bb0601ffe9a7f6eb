// The CUDA backend's next-token sampling: one kernel over all rows (greedy, temperature, top-k, top-p, min-p and a
// counter-based draw, sampling_kernels.h), the ids downloaded to the host.
#include <cstddef>

#include "ops/contract/sampling.h"
#include "ops/cuda/backend.h"
#include "ops/cuda/sampling_kernels.h"

namespace flashnext::cuda {

// The parameter rows go to the kernel as they are.
static_assert(sizeof(TokenSampling) == sizeof(TokenSamplingRow) &&
              offsetof(TokenSampling, temperature) == offsetof(TokenSamplingRow, temperature) &&
              offsetof(TokenSampling, top_k) == offsetof(TokenSamplingRow, top_k) &&
              offsetof(TokenSampling, top_p) == offsetof(TokenSamplingRow, top_p) &&
              offsetof(TokenSampling, min_p) == offsetof(TokenSamplingRow, min_p) &&
              offsetof(TokenSampling, seed) == offsetof(TokenSamplingRow, seed) &&
              offsetof(TokenSampling, offset) == offsetof(TokenSamplingRow, offset));

std::vector<int32_t> CudaOps::sample_tokens(const Tensor& logits, std::span<const TokenSampling> params) {
  const char* op = "sample_tokens";
  const auto [rows, vocab] = contract::sample_tokens(spec(), logits, params);
  std::vector<int32_t> out(static_cast<size_t>(rows));
  if (rows == 0) return out;
  Tensor params_d = upload(params.data(), DType::U8, {int64_t(params.size_bytes())});
  Tensor tokens = alloc({rows}, DType::I32, "sampled tokens");
  FN_CUDA_CHECK(
      detail::launch_sample(dp<const float>(logits), vocab, to_int(rows, op, "rows"), to_int(vocab, op, "vocab"),
                            static_cast<const TokenSamplingRow*>(params_d.data()), dp<int32_t>(tokens), stream()),
      op);
  download(tokens, out.data());
  return out;
}

}  // namespace flashnext::cuda
