// Contracts of the memory and weight-making ops of ops/ops.h: load_weight, host_table, random_weight,
// random_experts, load_quantized_experts, copy_rows, gather_rows, scatter_rows.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/contract/contract.h"
#include "ops/ops.h"

namespace flashnext::contract {

/// load_weight: the checkpoint dtype is BF16, F16 or F32.
void load_weight(DType dtype);
/// host_table: BF16, F16 or F8_E4M3, no negative dimension. Returns the bytes of the table.
size_t host_table(DType dtype, const Shape& shape);
/// random_weight: [lo, hi] a finite interval.
void random_weight(float lo, float hi);
/// random_experts: positive sizes.
void random_experts(int64_t E, int64_t I, int64_t H);
/// load_quantized_experts: E > 0 experts, each with its gate, up and down matrix.
void quantized_experts(const QuantExperts& q);

/// copy_rows(src, src_row, dst, dst_row, n): same dtype and row size, row ranges inside both tensors. Returns the
/// bytes of one row (0 when n == 0 or the rows are empty).
size_t copy_rows(const Backend& b, const Tensor& src, int64_t src_row, const Tensor& dst, int64_t dst_row, int64_t n);

/// gather_rows / scatter_rows: `indexed` is the tensor addressed by `rows` (src of a gather, dst of a scatter),
/// `packed` has one row per index; rows I32 [n]. Same dtype and row size. Returns the bytes of one row. The row ids
/// themselves are the backend's to check (the CPU before copying, the CUDA kernel on the device).
size_t row_map(const Backend& b, const char* op, const Tensor& indexed, const Tensor& rows, const Tensor& packed);

}  // namespace flashnext::contract
