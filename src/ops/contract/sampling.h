// Contract of Ops::sample_tokens (ops/ops.h).
#pragma once

#include <cstdint>
#include <span>

#include "ops/contract/contract.h"
#include "ops/ops.h"

namespace flashnext::contract {

/// sample_tokens(logits, params): logits [rows, vocab] F32, one parameter row per logits row, finite temperature,
/// top_p and min_p. Returns {rows, vocab}.
struct SampleDims {
  int64_t rows, vocab;
};
SampleDims sample_tokens(const Backend& b, const Tensor& logits, std::span<const TokenSampling> params);

}  // namespace flashnext::contract
