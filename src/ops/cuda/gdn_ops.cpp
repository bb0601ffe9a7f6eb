// The CUDA backend's Gated DeltaNet ops: the causal conv and the gated delta rule (while every sequence feeds at most
// CudaOps::kFewRows rows: one launch each over the state slots, a sequence's rows in order, as decode steps; past it
// the conv per sequence and the chunked form over every sequence's rows), the gated RMSNorm, and the cache of float32
// gates.
#include <cuda_fp16.h>

#include <algorithm>

#include "ops/contract/gdn.h"
#include "ops/cuda/backend.h"
#include "ops/cuda/gdn_kernels.h"
#include "ops/cuda/norm_kernels.h"

namespace flashnext::cuda {

void CudaOps::gdn_conv_batch(const Tensor& qkv, const Tensor& weight, const Tensor& state_pool,
                             const StepBatch& batch) {
  const char* op = "gdn_conv_batch";
  const auto [T, C, K] = contract::gdn_conv_batch(spec(), qkv, weight, state_pool, batch);
  const int c = to_int(C, op, "channels"), k = to_int(K, op, "kernel");
  if (T == 0) return;
  if (few_rows(batch)) {  // one launch over the state slots, each sequence's rows in order
    FN_CUDA_CHECK(detail::launch_conv_slots(dp<const float>(qkv), nullptr, dp<float>(qkv), false, dp<float>(state_pool),
                                            dp<int32_t>(batch.slots), row_starts(batch), dp<__half>(weight),
                                            to_int(batch.num_seqs, op, "sequences"), c, k, 1, stream()),
                  op);
    return;
  }
  // Per sequence, in place: the inputs each run of rows needs from the run before are copied aside first (one
  // scratch for all sequences: the stream runs them in order).
  FN_CHECK(K <= detail::kGdnConvMaxTaps, "{}: conv kernel size {} exceeds the CUDA kernels' {}", op, K,
           detail::kGdnConvMaxTaps);
  const int64_t most_rows = batch.max_rows();
  FN_CHECK(most_rows <= detail::kGdnConvMaxRows,
           "{}: a sequence of {} rows in one step exceeds the CUDA conv kernels' {} (prefill it in smaller chunks)", op,
           most_rows, detail::kGdnConvMaxRows);
  Tensor halo = alloc({std::max<int64_t>(1, detail::gdn_conv_halo_floats(to_int(most_rows, op, "tokens"), c, k))},
                      DType::F32, "gdn_conv halo");
  const int64_t slot_floats = (K - 1) * C;
  for (int64_t s = 0; s < batch.num_seqs; ++s) {
    const int64_t r0 = batch.cu_seqlens[size_t(s)];
    FN_CUDA_CHECK(detail::launch_gdn_conv_f32(
                      dp<float>(qkv) + r0 * C, dp<float>(state_pool) + batch.slot_ids[size_t(s)] * slot_floats,
                      dp<__half>(weight), dp<float>(halo), to_int(batch.rows_of(s), op, "tokens"), c, k, stream()),
                  op);
  }
}

void CudaOps::gdn_mix_batch(const Tensor& qkv, const Tensor& conv_weight, const Tensor& conv_pool, const Tensor& a,
                            const Tensor& b, const GdnWeights& w, const GdnDims& d, const Tensor& state_pool,
                            const StepBatch& batch, const GdnOutputNorm& norm, const Tensor& o) {
  const char* op = "gdn_mix_batch";
  const auto [T, C, K] = contract::gdn_conv_batch(spec(), qkv, conv_weight, conv_pool, batch);
  contract::gdn_rule_batch(spec(), qkv, a, b, w, d, state_pool, batch, o);
  if (norm.weight.defined()) {
    contract::gated_rms_norm(spec(), o, norm.z, norm.weight, o);
    FN_CHECK(norm.weight.numel() == d.v_head_dim, "{}: norm weight {} is not [{}] (the value head dim)", op,
             norm.weight.str(), d.v_head_dim);
  }
  if (!few_rows(batch) || d.k_head_dim > detail::kGdnMaxDk) {
    Ops::gdn_mix_batch(qkv, conv_weight, conv_pool, a, b, w, d, state_pool, batch, norm, o);
    return;
  }
  if (T == 0) return;
  const int64_t nv = d.num_v_heads, ld_o = nv * d.v_head_dim, slots = state_pool.dim(0);
  const int64_t blocks = batch.num_seqs * nv * ((d.v_head_dim + 31) / 32);
  if (gdn_folded_resident_ <= 0) gdn_folded_resident_ = detail::gdn_recurrent_folded_resident_blocks();  // 0: failed
  // One slot's counters: nv for the norm, then nk for the conv.
  int32_t* done = gdn_counters(slots * (nv + d.num_k_heads), op);
  detail::GdnConvIn conv;
  if (K <= detail::kGdnFoldedConvMaxTaps && blocks <= gdn_folded_resident_) {
    conv.w = dp<__half>(conv_weight);
    conv.state = dp<float>(conv_pool);
    conv.K = int(K);
    conv.done = done + slots * nv;
    ++counters_.gdn_conv_folded;
  } else {
    gdn_conv_batch(qkv, conv_weight, conv_pool, batch);
    ++counters_.gdn_conv_apart;
  }
  detail::GdnOutNorm on;
  if (norm.weight.defined()) {
    on.z = dp<const float>(norm.z);
    on.ld_z = ld_o;
    on.w = dp<__half>(norm.weight);
    on.eps = float(norm.eps);
    on.silu = norm.act == GateAct::Silu;
    on.done = done;
  }
  const detail::GdnHeads heads{int(d.num_k_heads), int(nv), int(d.k_head_dim), int(d.v_head_dim)};
  const float* a_log = gdn_gates(w, nv, op);
  FN_CUDA_CHECK(detail::launch_gdn_recurrent(dp<const float>(qkv), C, dp<const float>(a), dp<const float>(b), nv, a_log,
                                             a_log + nv, dp<float>(state_pool), dp<int32_t>(batch.slots),
                                             row_starts(batch), to_int(batch.num_seqs, op, "sequences"), heads,
                                             dp<float>(o), ld_o, conv, on, stream()),
                op);
}

int32_t* CudaOps::gdn_counters(int64_t count, const char* op) {
  if (gdn_done_.empty() || gdn_done_.back().numel() < count) {
    Tensor t = alloc({std::max<int64_t>(1, count)}, DType::I32, "gdn counters", Lifetime::Kept);
    FN_CUDA_CHECK(cudaMemsetAsync(t.data(), 0, size_t(t.numel()) * sizeof(int32_t), stream()), op);
    gdn_done_.push_back(std::move(t));  // zeroed before any launch can name it
  }
  return dp<int32_t>(gdn_done_.back());
}

void CudaOps::gdn_rule_batch(const Tensor& qkv, const Tensor& a, const Tensor& b, const GdnWeights& w, const GdnDims& d,
                             const Tensor& state_pool, const StepBatch& batch, const Tensor& o) {
  const char* op = "gdn_rule_batch";
  const int64_t T = contract::gdn_rule_batch(spec(), qkv, a, b, w, d, state_pool, batch, o);
  FN_CHECK(d.k_head_dim <= detail::kGdnMaxDk, "{}: key head dim {} exceeds the kernels' {}", op, d.k_head_dim,
           detail::kGdnMaxDk);
  if (T == 0) return;
  const int64_t nv = d.num_v_heads, C = qkv.dim(1), ld_o = nv * d.v_head_dim;
  const detail::GdnHeads heads{int(d.num_k_heads), int(nv), int(d.k_head_dim), int(d.v_head_dim)};
  const float* a_log = gdn_gates(w, nv, op);
  const float* dt_bias = a_log + nv;
  if (few_rows(batch)) {  // the recurrence, each sequence's rows in order
    FN_CUDA_CHECK(detail::launch_gdn_recurrent(dp<const float>(qkv), C, dp<const float>(a), dp<const float>(b), nv,
                                               a_log, dt_bias, dp<float>(state_pool), dp<int32_t>(batch.slots),
                                               row_starts(batch), to_int(batch.num_seqs, op, "sequences"), heads,
                                               dp<float>(o), ld_o, detail::GdnConvIn{}, detail::GdnOutNorm{}, stream()),
                  op);
    return;
  }
  // A step with prefill chunks: every sequence's rows (cu_seqlens), state in slot slots[s]; the state walk and the
  // outputs on the tensor cores (SM80+) unless FLASHNEXT_CUDA_GDN_CHUNK=cuda_cores or dk is not a multiple of 16. The
  // chunk kernels' intermediates take about 3.3 KB per row and value head at dk = dv = 128 (2.3 KB with the
  // tensor-core walk, which stores no per-chunk state); passes over the heads keep them within 1 GiB (one head's may
  // exceed it, past about 320K rows in one step).
  FN_CHECK(d.k_head_dim % 4 == 0, "{}: key head dim {} is not a multiple of 4 (the chunked kernels' vector loads)", op,
           d.k_head_dim);
  const int num_seqs = int(batch.num_seqs);
  const bool tensor_cores =
      options_.gdn_chunk != GdnChunkKernel::CudaCores && detail::gdn_chunked_tensor_cores_supported(heads);
  const int per_pass = detail::gdn_chunked_heads_per_pass(num_seqs, T, heads, tensor_cores, int64_t(1) << 28);
  Tensor scratch = alloc({detail::gdn_chunked_scratch_floats(num_seqs, T, heads, tensor_cores, per_pass)}, DType::F32,
                         "gdn chunk scratch");
  FN_CUDA_CHECK(detail::launch_gdn_chunked_prefill(dp<const float>(qkv), C, dp<const float>(a), dp<const float>(b), nv,
                                                   a_log, dt_bias, dp<float>(state_pool), dp<int32_t>(batch.slots),
                                                   dp<int32_t>(batch.seq_starts), num_seqs, T, heads, tensor_cores,
                                                   per_pass, dp<float>(scratch), dp<float>(o), ld_o, stream()),
                op);
}

void CudaOps::gated_rms_norm(const Tensor& x, const Tensor& z, const Tensor& w, double eps, GateAct act,
                             const Tensor& y) {
  const char* op = "gated_rms_norm";
  const auto [T, heads, D] = contract::gated_rms_norm(spec(), x, z, w, y);
  const int64_t L = heads * D;
  FN_CUDA_CHECK(detail::launch_gated_rmsnorm(dp<const float>(x), L, dp<const float>(z), L, dp<float>(y), L,
                                             dp<__half>(w), to_int(T, op, "tokens"), to_int(heads, op, "heads"),
                                             to_int(D, op, "dim"), float(eps), act == GateAct::Silu, stream()),
                op);
}

const float* CudaOps::gdn_gates(const GdnWeights& w, int64_t nv, const char* op) {
  GdnGates& g = gdn_gates_[{w.A_log.data(), w.dt_bias.data()}];
  if (!g.gates.defined() || !same_memory(g.a_log, w.A_log.memory_ref()) ||
      !same_memory(g.dt_bias, w.dt_bias.memory_ref())) {
    g.gates = alloc({2 * nv}, DType::F32, "gdn gates", Lifetime::Kept);
    FN_CUDA_CHECK(detail::launch_f16_to_f32(dp<__half>(w.A_log), dp<float>(g.gates), nv, stream()), op);
    FN_CUDA_CHECK(detail::launch_f16_to_f32(dp<__half>(w.dt_bias), dp<float>(g.gates) + nv, nv, stream()), op);
    g.a_log = w.A_log.memory_ref();
    g.dt_bias = w.dt_bias.memory_ref();
  }
  return dp<const float>(g.gates);
}

}  // namespace flashnext::cuda
