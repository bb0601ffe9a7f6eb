// The shared checks of the op contracts (contract.h).
#include "ops/contract/contract.h"

namespace flashnext::contract {

void on_device(const Backend& b, const Tensor& t, const char* op, const char* what) {
  FN_CHECK(t.defined(), "{}: {} is undefined", op, what);
  FN_CHECK(t.device() == b.device && (b.device == Device::CPU || t.device_index() == b.device_index),
           "{}: {} is on {}:{}, expected {}:{}", op, what, device_name(t.device()), t.device_index(),
           device_name(b.device), b.device_index);
}

void tensor(const Backend& b, const Tensor& t, DType dt, int rank, const char* op, const char* what) {
  on_device(b, t, op, what);
  FN_CHECK(t.dtype() == dt, "{}: {} has dtype {}, expected {}", op, what, t.str(), dtype_name(dt));
  FN_CHECK(rank < 0 || t.rank() == rank, "{}: {} is {}, expected rank {}", op, what, t.str(), rank);
}

void linear_weight(const Backend& b, const Tensor& t, const char* op, const char* what) {
  if (!t.defined() || !t.has_scales()) return weight(b, t, 2, op, what);
  FN_CHECK(b.w8_linear, "{}: {} is an 8-bit weight ({}), which this backend's products do not take", op, what, t.str());
  on_device(b, t, op, what);
  on_device(b, t.scales(), op, what);
  FN_CHECK((t.dtype() == DType::I8 || t.dtype() == DType::F8_E4M3) && t.rank() == 2 && t.scale_group() > 0 &&
               t.scales().dtype() == DType::F32 && t.scales().rank() == 2 && t.scales().dim(0) == t.dim(0) &&
               t.scales().dim(1) == (t.dim(1) + t.scale_group() - 1) / t.scale_group(),
           "{}: {} {} with scales {} (group {}) is not an 8-bit weight: I8 or F8_E4M3 [rows, cols] with F32 scales "
           "[rows, ceil(cols / group)]",
           op, what, t.str(), t.scales().str(), t.scale_group());
}

void step_rows(const Tensor& rows, const StepBatch& batch, const char* op, const char* what) {
  FN_CHECK(rows.rank() >= 1 && rows.dim(0) == batch.num_tokens, "{}: {} {} does not have the step's {} rows", op, what,
           rows.str(), batch.num_tokens);
}

void state_slots(const Tensor& pool, const StepBatch& batch, const char* op) {
  FN_CHECK(pool.rank() >= 2, "{}: state pool {} is not [slots, ...]", op, pool.str());
  for (int32_t slot : batch.slot_ids)
    FN_CHECK(slot >= 0 && slot < pool.dim(0), "{}: state slot {} outside the pool {}", op, slot, pool.str());
}

void block_ids(int64_t pool_rows, const StepBatch& batch, const char* op, const char* what) {
  const int64_t bs = batch.block_size;
  FN_CHECK(bs > 0 && pool_rows % bs == 0, "{}: {} of {} rows is not made of blocks of {}", op, what, pool_rows, bs);
  for (int32_t id : batch.host_block_tables)
    FN_CHECK(id < pool_rows / bs, "{}: block id {} outside the {} blocks of {}", op, id, pool_rows / bs, what);
}

}  // namespace flashnext::contract
