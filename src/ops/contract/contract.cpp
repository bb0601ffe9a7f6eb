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
