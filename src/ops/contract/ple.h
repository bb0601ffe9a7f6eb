// Contracts of the PLE ops of ops/ops.h: ple_gather (and its _start form), ple_gate, ple_conv_add_batch, and the
// one-sequence conv the CPU oracle computes it with.
#pragma once

#include <cstdint>

#include "ops/contract/contract.h"
#include "ops/ops.h"

namespace flashnext::contract {

/// ple_gather(table, rows, e): rows [T, heads] I64, e [T, heads*hd] F32, a table of at least one shard, every
/// shard [rows_k, hd] on the backend's device with shard 0's dtype (which `dtype_ok` accepts), a finite scale. An I8
/// table has a group dividing hd and per shard group scales [rows_k, hd / group] on the device, all of one dtype
/// that `dtype_ok` accepts as a float dtype; other tables have none. Row ids are the backend's to check.
struct GatherDims {
  int64_t tokens, heads, head_dim, rows;
};
GatherDims ple_gather(const Backend& b, const PleTable& table, const Tensor& rows, const Tensor& e,
                      bool (*dtype_ok)(DType));

/// ple_gate(kn, v, X, norm_query, eps, P): kn, X, P [T, S*H], v [T, H], norm_query [S*H] weight.
struct PleGateDims {
  int64_t tokens, streams, hidden;
};
PleGateDims ple_gate(const Backend& b, const Tensor& kn, const Tensor& v, const Tensor& X, const Tensor& norm_query,
                     const Tensor& P);

/// The PLE conv of one sequence: P, X [T, W], norm_conv [W] and conv_w [W, K] weights, state [(K-1)*d, W] F32,
/// W a multiple of group, dilation >= 1.
struct PleConvDims {
  int64_t tokens, width, kernel, context;
};
PleConvDims ple_conv_add(const Backend& b, const Tensor& P, const Tensor& norm_conv, int64_t group,
                         const Tensor& conv_w, int64_t dilation, const Tensor& state, const Tensor& X,
                         const char* op = "ple_conv_add");
/// ple_conv_add_batch: the same over a step's rows with state_pool [slots, (K-1)*d, W].
PleConvDims ple_conv_add_batch(const Backend& b, const Tensor& P, const Tensor& norm_conv, int64_t group,
                               const Tensor& conv_w, int64_t dilation, const Tensor& state_pool, const StepBatch& batch,
                               const Tensor& X);

}  // namespace flashnext::contract
