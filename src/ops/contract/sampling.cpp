// Contract of sample_tokens (sampling.h).
#include "ops/contract/sampling.h"

#include <cmath>

namespace flashnext::contract {

SampleDims sample_tokens(const Backend& b, const Tensor& logits, std::span<const TokenSampling> params) {
  const char* op = "sample_tokens";
  activation(b, logits, 2, op, "logits");
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  FN_CHECK(int64_t(params.size()) == rows, "{}: {} parameter rows for logits {}", op, params.size(), logits.str());
  for (size_t r = 0; r < params.size(); ++r) {
    const TokenSampling& p = params[r];
    FN_CHECK(std::isfinite(p.temperature) && std::isfinite(p.top_p) && std::isfinite(p.min_p),
             "{}: row {} has a non-finite temperature, top_p or min_p", op, r);
  }
  return {rows, vocab};
}

}  // namespace flashnext::contract
