// The float32 CPU backend of the ops interface (ops/ops.h): plain loops, multi-threaded over rows, heads and
// experts with one ThreadPool. It is the oracle for every other backend, so clarity beats speed here.
#pragma once

#include <memory>

#include "core/thread_pool.h"
#include "ops/contract/contract.h"
#include "ops/ops.h"

namespace flashnext::cpu {

/// The float32 data of a CPU tensor, read-only (fp) or writable (mp); dtypes are checked by the ops beforehand.
inline const float* fp(const Tensor& t) {
  return t.data_as<const float>();
}
inline float* mp(const Tensor& t) {
  return t.data_as<float>();
}

/// What CPU tensors are (the op contracts' view of this backend): host memory, F32 weights.
inline constexpr contract::Backend kCpu{Device::CPU, 0, DType::F32};

/// Row `slot` of a state pool [slots, ...] as a tensor of the remaining dimensions (a view, no copy).
Tensor slot_view(const Tensor& pool, int64_t slot);
/// The activation rows of sequence `s` of a step (a view of rows cu_seqlens[s] .. cu_seqlens[s+1]).
Tensor seq_rows(const Tensor& t, const StepBatch& batch, int64_t s);

class CpuOps final : public Ops {
 public:
  explicit CpuOps(int threads);

  Device device() const override { return Device::CPU; }
  std::string name() const override;
  ThreadPool& pool() { return pool_; }

  Tensor empty(const Shape& shape, DType dtype = DType::F32) override;
  Tensor zeros(const Shape& shape, DType dtype = DType::F32) override;
  Tensor upload(const void* host, DType dtype, const Shape& shape) override;
  void download(const Tensor& t, void* host) override;
  Tensor load_weight(const void* host, DType dtype, const Shape& shape) override;
  Tensor map_host_table(const void* host, DType dtype, const Shape& shape,
                        std::shared_ptr<const void> keepalive) override;
  void copy_rows(const Tensor& src, int64_t src_row, const Tensor& dst, int64_t dst_row, int64_t n) override;
  void fill_zero(const Tensor& t) override;
  void gather_rows(const Tensor& src, const Tensor& rows, const Tensor& dst) override;
  void scatter_rows(const Tensor& src, const Tensor& rows, const Tensor& dst) override;

  void embedding(const Tensor& table, const Tensor& ids, const Tensor& out) override;
  void linear(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& bias = Tensor()) override;
  void zc_rms_norm(const Tensor& x, const Tensor& w, int64_t group, double eps, const Tensor& y) override;

  void hc_read(const Tensor& X, const HcWeights& hc, double eps, const Tensor& u, const Tensor& inj) override;
  void hc_inject(const Tensor& X, const Tensor& out, const Tensor& inj) override;

  void gdn_conv_batch(const Tensor& qkv, const Tensor& weight, const Tensor& state_pool,
                      const StepBatch& batch) override;
  void gdn_rule_batch(const Tensor& qkv, const Tensor& a, const Tensor& b, const GdnWeights& w, const GdnDims& dims,
                      const Tensor& state_pool, const StepBatch& batch, const Tensor& o) override;
  void gated_rms_norm(const Tensor& x, const Tensor& z, const Tensor& w, double eps, GateAct act,
                      const Tensor& y) override;

  void qsa_prepare_qk_batch(const Tensor& qg, const Tensor& k, const Tensor& q_norm, const Tensor& k_norm, double eps,
                            const RopeParams& rope, const StepBatch& batch, const Tensor& q,
                            const Tensor& gate) override;
  void qsa_indexer_select_batch(const Tensor& qi, const Tensor& index_key_pool, const Tensor& pooled_key_pool,
                                const Tensor& q_layernorm, const Tensor& k_layernorm, double eps,
                                const RopeParams& rope, int64_t budget, int64_t block, const StepBatch& batch,
                                const Tensor& selected) override;
  void sparse_attention_batch(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, const Tensor& selected,
                              const Tensor& gate, double scale, const StepBatch& batch, const Tensor& out) override;

  void moe_router_topk(const Tensor& u, const Tensor& router, bool norm_topk_prob, const Tensor& ids,
                       const Tensor& weights) override;
  void moe_experts(const Tensor& u, const Tensor& ids, const Tensor& weights, const MoeWeights& w, const Tensor& out,
                   const Tensor& shared = Tensor()) override;
  void moe_shared_expert(const Tensor& u, const MoeWeights& w, const Tensor& out) override;

  void ple_gather(const PleTable& table, const Tensor& rows, const Tensor& e) override;
  void ple_gate(const Tensor& kn, const Tensor& v, const Tensor& X, const Tensor& norm_query, double eps,
                const Tensor& P) override;
  void ple_conv_add_batch(const Tensor& P, const Tensor& norm_conv, int64_t group, const Tensor& conv_w,
                          int64_t dilation, double eps, const Tensor& state_pool, const StepBatch& batch,
                          const Tensor& X) override;

  // One sequence of the batched ops above, the oracle's own math: arguments as the `*_batch` op takes them for one
  // sequence (its rows, and its state as a tensor instead of a pool slot; caches contiguous, row p = position p),
  // checked by the same contracts (ops/contract/). The batched ops call them per sequence; tests compare the two
  // delta-rule forms through them.

  /// gdn_conv_batch for one sequence: state [K-1, C].
  void gdn_conv(const Tensor& qkv, const Tensor& weight, const Tensor& state);
  /// gdn_rule_batch for one sequence of several rows: the chunked WY/UT form, state [nv, dk, dv].
  void gdn_chunked(const Tensor& qkv, const Tensor& a, const Tensor& b, const GdnWeights& w, const GdnDims& dims,
                   const Tensor& state, const Tensor& o);
  /// The same computation token by token (`torch_recurrent_gated_delta_rule`): the decode path and the simplest
  /// oracle; equal to gdn_chunked up to float rounding.
  void gdn_recurrent(const Tensor& qkv, const Tensor& a, const Tensor& b, const GdnWeights& w, const GdnDims& dims,
                     const Tensor& state, const Tensor& o);
  /// qsa_prepare_qk_batch for one sequence whose token t is at position pos0 + t.
  void qsa_prepare_qk(const Tensor& qg, const Tensor& k, const Tensor& q_norm, const Tensor& k_norm, double eps,
                      const RopeParams& rope, int64_t pos0, const Tensor& q, const Tensor& gate);
  /// sparse_attention_batch for one sequence over contiguous caches k_cache, v_cache [rows, nkv, D]; every
  /// selected position must be < rows.
  void sparse_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& selected,
                        const Tensor& gate, double scale, const Tensor& out);
  /// ple_conv_add_batch for one sequence: state [(K-1)*d, S*H].
  void ple_conv_add(const Tensor& P, const Tensor& norm_conv, int64_t group, const Tensor& conv_w, int64_t dilation,
                    double eps, const Tensor& state, const Tensor& X);

  /// y[T, out] = x[T, in] W[out, in]^T on raw float32 buffers (the kernel behind `linear`).
  void matmul_nt(const float* x, int64_t T, int64_t in, const float* w, int64_t out, float* y);

 private:
  /// qsa_indexer_select_batch for one sequence at positions pos0 .. pos0+T-1 over its contiguous raw index keys
  /// index_keys [>= pos0+T, Di] (block keys recomputed, as the reference does);
  /// arguments as the batched op checked them.
  void qsa_indexer_select(const Tensor& qi, const Tensor& index_keys, const Tensor& q_layernorm,
                          const Tensor& k_layernorm, double eps, const RopeParams& rope, int64_t pos0, int64_t budget,
                          int64_t block, const Tensor& selected);
  /// Rows [0, length) of sequence s's paged cache `pool` gathered into a contiguous [length, ...] tensor.
  Tensor gather_sequence(const Tensor& pool, const StepBatch& batch, int64_t s, int64_t length);

  ThreadPool pool_;
};

}  // namespace flashnext::cpu
