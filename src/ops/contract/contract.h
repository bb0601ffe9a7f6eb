// Op contracts: the argument checks of every op of ops/ops.h, written once and called by every backend.
//
// A contract function validates the tensors one op call receives (defined, on the backend's device, dtype, rank,
// shapes that fit each other and the op's documented layout) and returns the sizes it derived from them, so that a
// backend only adds its kernels' own limits (32-bit extents, maximum head sizes) and then does the math. Every
// failure throws Error naming the op and the offending tensor, as ops.h promises. One header per op family
// (memory.h, dense.h, hc.h, gdn.h, qsa.h, moe.h, ple.h, sampling.h); this one holds what they share.
#pragma once

#include <cstdint>

#include "core/error.h"
#include "ops/step_batch.h"
#include "ops/tensor.h"

namespace flashnext::contract {

/// What a backend's tensors are: the device they live on and the dtype `Ops::load_weight` stores weights in (the
/// CPU oracle: F32; the CUDA backend: F16). Activations are F32 on every backend. `w8_linear`: whether its linear
/// products take 8-bit weights (Tensor::with_scales, made by its Ops::load_w8_linear; the CUDA backend).
struct Backend {
  Device device = Device::CPU;
  int device_index = 0;
  DType weight = DType::F32;
  bool w8_linear = false;
};

/// `t` is defined and on `b`'s device. Throws Error "<op>: <what> is undefined / is on ..., expected ...".
void on_device(const Backend& b, const Tensor& t, const char* op, const char* what);
/// `t` is on `b`'s device with dtype `dt` and rank `rank` (any rank when negative).
void tensor(const Backend& b, const Tensor& t, DType dt, int rank, const char* op, const char* what);
/// A float32 activation of rank `rank`.
inline void activation(const Backend& b, const Tensor& t, int rank, const char* op, const char* what) {
  tensor(b, t, DType::F32, rank, op, what);
}
/// A weight made by `load_weight` (dtype b.weight) of rank `rank`.
inline void weight(const Backend& b, const Tensor& t, int rank, const char* op, const char* what) {
  tensor(b, t, b.weight, rank, op, what);
}

/// The weight of a linear product (linear, linear_group, moe_shared_expert) of rank 2: a weight as `weight` checks
/// it, or, where the backend takes them (b.w8_linear), an 8-bit weight: I8 or F8_E4M3 codes [rows, cols] with F32
/// scales [rows, ceil(cols / group)] on the backend's device. Throws Error naming `op` and `what` otherwise.
void linear_weight(const Backend& b, const Tensor& t, const char* op, const char* what);

/// The checks every `*_batch` op makes of its StepBatch: `rows` (an activation of the step) has batch.num_tokens
/// rows. Throws Error naming `what`.
void step_rows(const Tensor& rows, const StepBatch& batch, const char* op, const char* what);
/// Every state slot of `batch` is a row of `pool` [slots, ...].
void state_slots(const Tensor& pool, const StepBatch& batch, const char* op);
/// Every block id of `batch`'s tables addresses a block of a pool of `pool_rows` rows in blocks of
/// batch.block_size (pool_rows a multiple of it).
void block_ids(int64_t pool_rows, const StepBatch& batch, const char* op, const char* what);

}  // namespace flashnext::contract
