// The CUDA backend's PLE ops: n-gram row gathers from pinned host (or GPU) tables, on a side stream when begun
// ahead (ple_gather_start / _wait), the gate, and the dilated short conv with its residual add.
#include <cuda_fp16.h>

#include <algorithm>

#include "ops/contract/ple.h"
#include "ops/cuda/backend.h"
#include "ops/cuda/norm_kernels.h"
#include "ops/cuda/ple_kernels.h"

namespace flashnext::cuda {

bool CudaOps::GatherTable::made_from(const PleTable& table) const {
  if (shards.size() != table.shards.size() + table.group_scales.size()) return false;
  for (size_t i = 0; i < shards.size(); ++i) {
    const Tensor& t = i < table.shards.size() ? table.shards[i] : table.group_scales[i - table.shards.size()];
    if (!same_memory(shards[i], t.memory_ref())) return false;
  }
  return true;
}

void CudaOps::ple_conv_add_batch(const Tensor& P, const Tensor& norm_conv, int64_t group, const Tensor& conv_w,
                                 int64_t dilation, double eps, const Tensor& state_pool, const StepBatch& batch,
                                 const Tensor& X) {
  const char* op = "ple_conv_add_batch";
  const auto [T, W, K, context] =
      contract::ple_conv_add_batch(spec(), P, norm_conv, group, conv_w, dilation, state_pool, batch, X);
  if (T == 0) return;
  const int w = to_int(W, op, "width"), k = to_int(K, op, "kernel"), d = to_int(dilation, op, "dilation");
  // n = ZC-RMSNorm(P; norm_conv) for every row at once, then the conv and residual add.
  Tensor n = alloc(P.shape(), DType::F32, "ple normed conv input");
  FN_CUDA_CHECK(detail::launch_zc_rmsnorm(dp<const float>(P), W, dp<float>(n), W, dp<__half>(norm_conv), w,
                                          to_int(T, op, "tokens"), w, to_int(group, op, "group"), float(eps), stream()),
                "ple_conv_add_batch norm");
  if (few_rows(batch)) {  // one launch over the state slots, each sequence's rows in order
    FN_CUDA_CHECK(
        detail::launch_conv_slots(dp<const float>(n), dp<const float>(P), dp<float>(X), true, dp<float>(state_pool),
                                  dp<int32_t>(batch.slots), row_starts(batch), dp<__half>(conv_w),
                                  to_int(batch.num_seqs, op, "sequences"), w, k, d, stream()),
        op);
    return;
  }
  for (int64_t s = 0; s < batch.num_seqs; ++s) {  // per sequence, its state in slot slot_ids[s]
    const int64_t r0 = batch.cu_seqlens[size_t(s)];
    FN_CUDA_CHECK(detail::launch_ple_conv_add_f32(dp<const float>(P) + r0 * W, dp<const float>(n) + r0 * W,
                                                  dp<__half>(conv_w), to_int(batch.rows_of(s), op, "tokens"), w, k, d,
                                                  dp<float>(state_pool) + batch.slot_ids[size_t(s)] * context * W,
                                                  dp<float>(X) + r0 * W, stream()),
                  op);
  }
}

void CudaOps::ple_gather(const PleTable& table, const Tensor& rows, const Tensor& e) {
  gather_ple_rows(table, rows, e, stream());
}

void CudaOps::ple_gather_start(const PleTable& table, const Tensor& rows, const Tensor& e) {
  use_device();
  if (!table.shards.empty()) gather_table(table);  // made (once) on the main stream, before the event below
  // The side stream starts once the main stream has made `rows` (and allocated `e`).
  FN_CUDA_CHECK(fork_to(ctx_->side), "ple_gather_start");
  gather_ple_rows(table, rows, e, ctx_->side);
  cudaEvent_t done = nullptr;
  FN_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "ple_gather_start");
  FN_CUDA_CHECK(cudaEventRecord(done, ctx_->side), "ple_gather_start");
  pending_gathers_.push_back({rows, e, done});
}

void CudaOps::ple_gather_wait(const Tensor& e) {
  auto it = std::find_if(pending_gathers_.begin(), pending_gathers_.end(),
                         [&](const PendingGather& g) { return g.e.data() == e.data(); });
  FN_CHECK(it != pending_gathers_.end(), "ple_gather_wait: no gather into {} was started", e.str());
  const cudaError_t waited = join_event(it->done);
  pending_gathers_.erase(it);  // rows and e may now be freed: later frees are ordered after the gather
  FN_CUDA_CHECK(waited, "ple_gather_wait");
}

void CudaOps::gather_ple_rows(const PleTable& table, const Tensor& rows, const Tensor& e, cudaStream_t s) {
  const char* op = "ple_gather";
  [[maybe_unused]] const auto [T, heads, hd, total] = contract::ple_gather(spec(), table, rows, e, [](DType dt) {
    return dt == DType::BF16 || dt == DType::F16 || dt == DType::F32 || dt == DType::F8_E4M3 || dt == DType::I8;
  });
  if (T == 0 || heads == 0) return;
  const GatherTable& g = gather_table(table);
  auto type_of = [](DType dt) {
    return dt == DType::BF16  ? detail::kPleBF16
           : dt == DType::F16 ? detail::kPleF16
           : dt == DType::F32 ? detail::kPleF32
           : dt == DType::I8  ? detail::kPleI8
                              : detail::kPleF8E4M3;
  };
  const bool int8 = table.shards[0].dtype() == DType::I8;
  const detail::PleGroupScales group_scales{int8 ? g.scale_addresses.get() : nullptr,
                                            int8 ? type_of(table.group_scales[0].dtype()) : 0,
                                            int8 ? to_int(table.group, op, "group") : 0};
  FN_CUDA_CHECK(detail::launch_ple_gather(g.addresses.get(), int(g.addresses.size()), g.rows_per_shard, g.rows,
                                          type_of(table.shards[0].dtype()), table.scale, group_scales,
                                          to_int(hd, op, "head_dim"), dp<int64_t>(rows), to_int(T, op, "tokens"),
                                          to_int(heads, op, "heads"), dp<float>(e), status(kStatusPle), s),
                op);
}

void CudaOps::ple_gate(const Tensor& kn, const Tensor& v, const Tensor& X, const Tensor& norm_query, double eps,
                       const Tensor& P) {
  const char* op = "ple_gate";
  const auto [T, S, H] = contract::ple_gate(spec(), kn, v, X, norm_query, P);
  FN_CUDA_CHECK(detail::launch_ple_gate_f32(dp<const float>(kn), dp<const float>(v), dp<const float>(X),
                                            dp<__half>(norm_query), to_int(T, op, "tokens"), int(S),
                                            to_int(H, op, "hidden"), float(eps), dp<float>(P), stream()),
                op);
}

const CudaOps::GatherTable& CudaOps::gather_table(const PleTable& table) {
  std::vector<const void*> key;
  for (const Tensor& s : table.shards) key.push_back(s.data());
  for (const Tensor& s : table.group_scales) key.push_back(s.data());
  auto it = gather_tables_.find(key);
  if (it != gather_tables_.end() && it->second.made_from(table)) return it->second;
  std::erase_if(gather_tables_, [](const auto& kv) {
    return std::any_of(kv.second.shards.begin(), kv.second.shards.end(), [](const auto& w) { return w.expired(); });
  });
  ++memory_generation_;  // views may be dropped and made: recorded steps that used them are stale
  GatherTable g;
  for (const Tensor& s : table.shards) g.shards.push_back(s.memory_ref());
  for (const Tensor& s : table.group_scales) g.shards.push_back(s.memory_ref());
  const int64_t per = table.shards[0].dim(0);
  bool uniform = per > 0;
  for (size_t i = 0; i < table.shards.size(); ++i) {
    const int64_t h = table.shards[i].dim(0);
    g.rows += h;
    uniform = uniform && (i + 1 == table.shards.size() ? h <= per : h == per);
  }
  std::vector<const void*> addresses(key.begin(), key.begin() + std::ptrdiff_t(table.shards.size()));
  std::vector<const void*> scale_addresses(key.begin() + std::ptrdiff_t(table.shards.size()), key.end());
  g.rows_per_shard = per;
  if (!uniform) {
    // One copy of the shards (and of their group scales) in row order.
    auto merge = [&](const std::vector<Tensor>& parts, Tensor& into, const char* what) {
      into = alloc({g.rows, parts[0].dim(1)}, parts[0].dtype(), what, Lifetime::Kept);
      int64_t at = 0;
      for (const Tensor& s : parts) {
        copy_rows(s, 0, into, at, s.dim(0));
        at += s.dim(0);
      }
    };
    merge(table.shards, g.merged, "merged PLE table");
    addresses = {g.merged.data()};
    if (!table.group_scales.empty()) {
      merge(table.group_scales, g.merged_scales, "merged PLE group scales");
      scale_addresses = {g.merged_scales.data()};
    }
    g.rows_per_shard = std::max<int64_t>(g.rows, 1);
  }
  g.addresses = to_device(addresses, "PLE shard addresses");
  if (!scale_addresses.empty()) g.scale_addresses = to_device(scale_addresses, "PLE group-scale addresses");
  return gather_tables_.insert_or_assign(std::move(key), std::move(g)).first->second;
}

}  // namespace flashnext::cuda
