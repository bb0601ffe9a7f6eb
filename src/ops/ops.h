// The ops interface: every computation of the qwen4_exp forward, at the fused-op level.
//
// Model code (src/model/qwen4_exp) calls only these functions and never touches tensor memory; a backend implements
// them for one device. The CPU backend (src/ops/cpu, `make_cpu_ops`) is plain float32 and is the oracle every other
// backend is tested against. The math of each op is the reference's (transformers `models/qwen4_exp`, summarised in
// docs MODEL.md); each comment names the module it reproduces.
//
// Conventions, shared by all ops:
// - Activations are F32 tensors of the backend's device, row-major, one row per token: `[T, width]`. T may be 0.
// - Weights are tensors produced by `load_weight` (the backend picks the storage dtype; the CPU backend stores F32)
//   in the checkpoint's layout: a linear weight is `[out, in]` (y = x W^T).
// - `H` hidden size, `S` hyper-connection streams (hc_count); wide rows are `S*H`, stream b at columns [b*H, (b+1)*H).
// - Outputs are passed in, allocated by the caller with `empty` (never aliasing an input unless the comment says
//   "in place"). Ops check shapes and dtypes and throw Error naming the op and the offending tensor.
// - Sequence state (caches) lives in tensors owned by the caller's state object; ops update it where documented.
//   A chunk of T tokens of one sequence has logical positions pos0 .. pos0+T-1; caches are indexed by logical
//   position (row p of a cache holds position p).
// - Every step is a batch (several sequences, prefill chunks and decode tokens mixed; one sequence is a batch of
//   one): token-wise ops simply run over the concatenated rows; the ops with sequence state (`*_batch`) take the
//   step's StepBatch (ops/step_batch.h), which says where each sequence's rows, positions, paged KV blocks and
//   state slots are.
// - The argument checks of every op are written once, in ops/contract/ (one header per op family); backends call
//   them and add only their kernels' own limits.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/quant_format.h"
#include "ops/step_batch.h"
#include "ops/tensor.h"

namespace flashnext {

/// Activation of the GDN gated RMSNorm (config `output_gate_type`, else `hidden_act`).
enum class GateAct : uint8_t { Silu, Sigmoid };

/// Weights of one gated residual read (`Qwen4ExpTextGatedResidual`).
struct HcWeights {
  Tensor norm;    ///< hc_norm.weight [S*H] (zero-centred: scale is 1 + w)
  Tensor down;    ///< input_mix_weight_down.weight [R, S*H]
  Tensor up;      ///< input_mix_weight_up.weight [S*H, R]
  Tensor inject;  ///< block_inject_weight.weight [S, S*H]; undefined for the final hyper_connection_mixer
};

/// Head geometry of a Gated DeltaNet layer.
struct GdnDims {
  int64_t num_k_heads = 0, num_v_heads = 0;  ///< nk, nv (nv a multiple of nk)
  int64_t k_head_dim = 0, v_head_dim = 0;    ///< dk, dv
  int64_t conv_dim() const { return 2 * num_k_heads * k_head_dim + num_v_heads * v_head_dim; }
};

/// Weights of the Gated DeltaNet recurrence proper (after the projections and the conv).
struct GdnWeights {
  Tensor A_log;    ///< [nv]
  Tensor dt_bias;  ///< [nv]
};

/// The GDN output norm (`Qwen4ExpTextRMSNormGated`) as gdn_mix_batch takes it: z [T, nv*dv] (the in_proj_z
/// output), weight [dv]; an undefined weight: no norm.
struct GdnOutputNorm {
  Tensor z, weight;
  double eps = 0;
  GateAct act = GateAct::Sigmoid;
};

/// Rotary embedding: NeoX rotate-half on the first `rotary_dim` dims of each head, angle pos * inv_freq[i] with
/// inv_freq[i] = 1 / theta^(2i / rotary_dim) computed in float32 (`Qwen4ExpTextRotaryEmbedding`; for text the
/// mRoPE sections share one position, so this is plain RoPE).
struct RopeParams {
  int64_t rotary_dim = 0;  ///< even, <= every head dim it is applied to
  double theta = 10000.0;
};

/// Routed experts that a backend keeps in a form of its own (e.g. the CUDA backend's W4A16 repacking of NVFP4 /
/// int4 checkpoints), made by `Ops::load_quantized_experts`. Only the backend that made it reads it.
class PackedExperts {
 public:
  virtual ~PackedExperts() = default;
  /// What the backend stores, for reports ("w4a16 nvfp4-modelopt").
  virtual std::string format() const = 0;
  /// Bytes of device memory held (all experts, gate/up/down).
  virtual int64_t device_bytes() const = 0;
};

/// Weights of the shared expert and router of one MoE block plus the stacked routed experts
/// (`Qwen4ExpTextSparseMoeBlock`).
struct MoeWeights {
  Tensor router;    ///< gate.weight [E, H]
  Tensor gate, up;  ///< experts' gate_proj / up_proj stacked [E, I, H]; undefined when `packed` is set
  Tensor down;      ///< experts' down_proj stacked [E, H, I]; undefined when `packed` is set
  std::shared_ptr<const PackedExperts> packed;  ///< the routed experts in the backend's own quantized form, or null
  Tensor shared_gate_proj;                      ///< shared_expert.gate_proj [Is, H]
  Tensor shared_up_proj;                        ///< shared_expert.up_proj [Is, H]
  Tensor shared_down_proj;                      ///< shared_expert.down_proj [H, Is]
  Tensor shared_expert_gate;                    ///< shared_expert_gate.weight [1, H]
};

/// The hashed n-gram table of one PLE layer: the logical table [rows, head_dim] stored as row shards in shard order
/// (shard k holds rows [sum of earlier shard heights, + its height)). Shards keep their checkpoint dtype
/// (BF16/F16/F32, F8_E4M3 for the FP8 tables of quantized releases, I8 with group scales for int8 ones) and may
/// live in host memory (see `map_host_table`). Row value = float(stored element) * scale (* the group scale).
struct PleTable {
  std::vector<Tensor> shards;  ///< each [rows_k, head_dim], all of one dtype (float, FP8, or I8 with group_scales)
  int64_t rows = 0;            ///< sum of shard heights
  int64_t head_dim = 0;
  /// Multiplies every value: the FP8 table's `ngram_embedding.weight_scale` (a BF16 scalar, converted exactly);
  /// 1 for float and int8 tables. The product float(e4m3) * scale is exact in float32 (4 by 8 significant bits).
  float scale = 1.f;
  /// I8 tables only (W8A16, loader/quant.h "PLE table, int8"): per shard k its scales [rows_k, head_dim / group]
  /// (BF16, F16 or F32, one dtype), value[r, c] = q[r, c] * group_scales[k][r, c / group] (one float32 multiply,
  /// exact for 16-bit scales).
  /// Empty otherwise.
  std::vector<Tensor> group_scales;
  int64_t group = 0;  ///< columns per group scale (I8 tables), else 0
};

/// A checkpoint array in host memory (borrowed: the mapped checkpoint outlives the load). Elements may be unaligned.
struct HostArray {
  const void* data = nullptr;  ///< null: absent
  DType dtype = DType::F32;
  Shape shape;
  bool defined() const { return data != nullptr; }
};

/// One quantized [rows, cols] matrix of one expert as the checkpoint stores it (validated by the loader,
/// loader/quant.h validate_quantized_weight), with the loader's exact float32 dequantization.
struct QuantMatrix {
  QuantFormat format = QuantFormat::Nvfp4;  ///< not None (core/quant_format.h; loader/quant.h has the rules)
  std::string name;                         ///< logical weight name, for messages
  int64_t rows = 0, cols = 0;               ///< logical [N, K]
  int64_t group = 0;                        ///< inputs per scale: 16 (NVFP4), the int4 group size (0: all of K)
  int64_t block_rows = 0, block_cols = 0;   ///< FP8 block
  bool gptq_v2 = false;                     ///< GPTQ zero points without the v1 "+1"
  int64_t bits = 4;                         ///< GPTQ: 2, 3, 4 or 8 bits per value (loader/quant.h)
  HostArray data;          ///< NVFP4 U8 [N, K/2]; FP8 F8_E4M3 [N, K]; CtInt4 I32 [N, ceil(K/8)]; GPTQ I32 [K*b/32, N];
                           ///< AWQ qweight I32 [K, N/8] (outputs in AWQ nibble order, loader/quant.h)
  HostArray scale;         ///< NVFP4 F8_E4M3 [N, K/16]; FP8 [ceil(N/bn), ceil(K/bk)]; int4 BF16/F16/F32 per group
  HostArray global_scale;  ///< NVFP4 F32 scalar (multiplier for Nvfp4, divisor for CtNvfp4)
  HostArray zero_point;    ///< CtInt4 I32 [ceil(N/8), G] (absent: symmetric); GPTQ qzeros I32 [G, N*b/32]; AWQ qzeros
                           ///< I32 [G, N/8] in AWQ nibble order (absent: zero_point false, zero 8)
  /// The exact float32 values, row-major [rows, cols] (loader/quant.h `dequantize`): the oracle's path.
  std::function<std::vector<float>()> dequantize;
};

/// The quantized routed experts of one MoE block: per expert e, gate[e] / up[e] [I, H] and down[e] [H, I], all of
/// one format, I = full_inter (the checkpoint's moe_intermediate_size). Under tensor parallelism a rank loads only
/// its slice [inter_begin, inter_begin + inter) of the intermediate width (gate / up rows, down columns; loader/
/// sharding.h); without it inter_begin = 0 and inter = full_inter. The matrices keep their checkpoint shapes.
struct QuantExperts {
  std::string name;  ///< "layers.L.mlp.experts", for messages
  int64_t experts = 0, hidden = 0, inter = 0;
  int64_t inter_begin = 0, full_inter = 0;  ///< full_inter 0: the same as inter (no slice)
  std::vector<QuantMatrix> gate, up, down;

  int64_t full() const { return full_inter > 0 ? full_inter : inter; }
  bool sliced() const { return inter != full(); }
};

/// What `Ops::load_quantized_experts` returns: either stacked backend weights (gate / up [E, I, H], down [E, H, I])
/// or the backend's own packed form (`packed`, the three tensors undefined). Assign to MoeWeights' members.
struct RoutedExperts {
  Tensor gate, up, down;
  std::shared_ptr<const PackedExperts> packed;
};

/// A linear weight [rows, cols] of 8-bit codes with float32 scales along its inputs, in host memory: the dense
/// weights of W8A8 INT8 and FP8 releases (compressed-tensors int8 / float per channel or tensor, the FP8 block
/// format; loader/quant.h w8_linear_scales). value[n, k] = float(code[n, k]) * scales[n, k / group], one float32
/// multiply: the loader's exact dequantization (loader/quant.h dequantize) of the same weight.
struct W8Linear {
  DType code = DType::I8;      ///< I8 (int8 values) or F8_E4M3
  int64_t rows = 0, cols = 0;  ///< logical [N, K]
  int64_t group = 0;           ///< inputs per scale: cols (one scale a row) or the FP8 block's columns
  std::vector<uint8_t> codes;  ///< [rows, cols], row-major
  std::vector<float> scales;   ///< [rows, ceil(cols / group)], row-major

  int64_t groups() const { return group > 0 ? (cols + group - 1) / group : 0; }
  /// Throws Error for inconsistent sizes, a code dtype other than I8 / F8_E4M3, or an E4M3 NaN code (0x7f, 0xff:
  /// which the CUDA decode would read as 480).
  void check() const;
  /// The exact float32 values [rows, cols] (the formula above). Throws Error as check().
  std::vector<float> dequantize() const;
};

/// Per-row parameters of Ops::sample_tokens (those of the GPU sampling kernel, ops/cuda/sampling_kernels.h).
struct TokenSampling {
  float temperature = 0.f;  ///< <= 0: greedy (argmax, lowest id among equal maxima)
  int32_t top_k = 0;        ///< <= 0 or >= vocab: no top-k
  float top_p = 1.f;        ///< >= 1: no top-p
  float min_p = 0.f;        ///< <= 0: no min-p
  uint64_t seed = 0;        ///< with `offset`, selects the draw (counter-based: the same pair gives the same draw)
  uint64_t offset = 0;
};

/// A table in host memory that ops read in place (Ops::host_table): `table` is the tensor ops take, `host` the
/// address through which the caller writes its `table.nbytes()` bytes (the same memory).
struct HostTable {
  Tensor table;
  void* host = nullptr;
};

/// The backend interface. One instance per device; safe to use from one thread at a time (ops parallelise
/// internally).
/// What Ops::replay_step did: ran the recorded step, or nothing because the recording is stale (memory it uses was
/// replaced: drop it) or busy (a tensor of an earlier replay is still held, which the replay would overwrite: run
/// this step without it and keep it).
enum class StepReplay : uint8_t { Ran, Stale, Busy };

/// A recorded step (Ops::end_step_capture), opaque outside the backend that made it: the step's device work with the
/// memory it uses, run again by Ops::replay_step.
class StepGraph {
 public:
  virtual ~StepGraph() = default;
  /// The step's result tensor (what the model returned from the recorded step), rewritten by every replay.
  Tensor output;
};

class Ops {
 public:
  virtual ~Ops() = default;

  /// The device tensors of this backend live on.
  virtual Device device() const = 0;
  /// A short description ("cpu (2 threads)").
  virtual std::string name() const = 0;

  // ---------------------------------------------------------------- memory

  /// Uninitialised tensor.
  virtual Tensor empty(const Shape& shape, DType dtype = DType::F32) = 0;
  /// Zero-filled tensor.
  virtual Tensor zeros(const Shape& shape, DType dtype = DType::F32) = 0;
  /// Copies `shape`-many elements of `dtype` from host memory into a new tensor of the same dtype.
  virtual Tensor upload(const void* host, DType dtype, const Shape& shape) = 0;
  /// Copies all of `t` to host memory (`t.nbytes()` bytes, same dtype).
  virtual void download(const Tensor& t, void* host) = 0;
  /// Waits until every op enqueued so far has finished (timing in `bench`); throws Error for a failed kernel or
  /// invalid input the kernels recorded, as download does. Default (synchronous backends): nothing to wait for.
  virtual void synchronize() {}
  /// A weight for the compute ops, converted from checkpoint data (BF16, F16 or F32 at `host`) to the backend's
  /// weight format (CPU: F32). Throws Error for other dtypes.
  virtual Tensor load_weight(const void* host, DType dtype, const Shape& shape) = 0;
  /// A read-only table that ops may read in place from host memory (the PLE n-gram table: too large to convert),
  /// BF16 / F16 / F32, FP8 (F8_E4M3; the CPU also takes F8_E5M2) or I8 (int8 tables, and F32/F16/BF16 group
  /// scales beside them), kept in that dtype.
  /// `keepalive` owns the memory (e.g. the mapped checkpoint). CPU: wraps the pointer without a copy.
  virtual Tensor map_host_table(const void* host, DType dtype, const Shape& shape,
                                std::shared_ptr<const void> keepalive) = 0;
  /// The routed experts of one MoE block from their quantized checkpoint tensors, converted once. Default: every
  /// matrix dequantized exactly to float32 (QuantMatrix::dequantize), loaded with load_weight and stacked (the CPU
  /// oracle's behaviour). Backends override it to keep formats their kernels read (the CUDA backend: NVFP4 and
  /// int4 repacked for its W4A16 kernels). Throws Error naming the matrix for inconsistent input.
  virtual RoutedExperts load_quantized_experts(const QuantExperts& q);
  /// A linear weight of 8-bit codes (W8Linear) for linear, linear_group and moe_shared_expert. Default: its exact
  /// float32 values loaded with load_weight (the CPU oracle's behaviour). The CUDA backend keeps the codes and
  /// scales (Tensor::with_scales: W8A16, one byte a weight) and its products apply the scales (ops/cuda
  /// dense_ops.cpp). Throws Error for inconsistent sizes or a code dtype other than I8 / F8_E4M3.
  virtual Tensor load_w8_linear(const W8Linear& w);
  /// An uninitialised table of `shape` and `dtype` (BF16, F16 or FP8) in host memory that ops read in place, like
  /// the tables of map_host_table, to be filled by the caller through HostTable::host (from any thread, while other
  /// ops run). CPU: ordinary memory; CUDA: pinned and mapped (no GPU copy, whatever CudaOpsOptions::ple_table
  /// says). May be called from another thread than the other ops. Throws Error naming the bytes asked for when the
  /// memory cannot be had.
  virtual HostTable host_table(DType dtype, const Shape& shape);

  // ---------------------------------------------------------------- random weights (Model::random, flashnext bench)

  /// A weight of `shape` in this backend's weight format with element i (row-major) = lo + (hi - lo) *
  /// random_uniform(seed, i) (ops/random_uniform.h): the same values on every backend before its rounding to the
  /// weight dtype. Made on the device where the backend has one, so that a model of the released size needs no host
  /// copy. Throws Error for non-finite bounds or lo > hi.
  virtual Tensor random_weight(const Shape& shape, float lo, float hi, uint64_t seed);

  /// Routed experts of one MoE block with pseudo-random weights of mean 0 and variance 1/in for a matrix of `in`
  /// inputs (gate / up logically [E, I, H]: 1/H; down [E, H, I]: 1/I), so that unit-variance inputs give
  /// unit-variance outputs. Default: three random_weight tensors uniform in +-sqrt(3 / in) (seeds seed, seed + 1,
  /// seed + 2). The CUDA backend makes W4A16 experts in the layout NVFP4 checkpoints load into (random E2M1 codes,
  /// unit block scales, a global scale of sqrt(1 / in) / rms(E2M1)) directly in GPU memory.
  virtual RoutedExperts random_experts(int64_t E, int64_t I, int64_t H, uint64_t seed);

  /// Copies `n` rows (dimension 0) from `src` starting at `src_row` into `dst` starting at `dst_row`. Both tensors
  /// must have the same dtype and row size.
  virtual void copy_rows(const Tensor& src, int64_t src_row, const Tensor& dst, int64_t dst_row, int64_t n) = 0;
  /// Sets every byte of `t` to zero.
  virtual void fill_zero(const Tensor& t) = 0;
  /// dst[i] = src[rows[i]] for every i (rows of dimension 0). rows I32 [n], each in [0, src.dim(0)) (checked);
  /// dst [n, ...] with src's dtype and row size.
  virtual void gather_rows(const Tensor& src, const Tensor& rows, const Tensor& dst) = 0;
  /// dst[rows[i]] = src[i] for every i: writes the tokens of a step into a paged cache (vLLM's slot mapping).
  /// rows I32 [n] distinct, each in [0, dst.dim(0)) (checked); src [n, ...] with dst's dtype and row size.
  virtual void scatter_rows(const Tensor& src, const Tensor& rows, const Tensor& dst) = 0;

  // ---------------------------------------------------------------- dense building blocks

  /// out[t, r*H + j] = table[ids[t], j] for every replica r: an embedding lookup whose row is repeated
  /// out.dim(1)/H times (the hyper-connection stream replication `hidden_states.repeat(1, 1, hc_count)`).
  /// table [V, H] weight, ids [T] I32 (each in [0, V): checked), out [T, r*H].
  virtual void embedding(const Tensor& table, const Tensor& ids, const Tensor& out) = 0;

  /// y = x W^T (+ bias). x [T, in], w [out, in], y [T, out], bias [out] or undefined (no bias).
  virtual void linear(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& bias = Tensor()) = 0;

  /// linear(x, w[i], y[i], bias[i]) for every i: several projections of one input (GDN's in_proj_qkv / z / b / a,
  /// QSA's q / k / v and indexer projections). bias is empty or has one (possibly undefined) tensor per weight.
  /// Throws Error for mismatched counts and as linear does. Default: one linear per weight; the CUDA backend runs
  /// decode-sized groups (<= 8 rows) as one GEMV launch.
  virtual void linear_group(const Tensor& x, std::span<const Tensor> w, std::span<const Tensor> y,
                            std::span<const Tensor> bias = {}) {
    FN_CHECK(w.size() == y.size() && (bias.empty() || bias.size() == w.size()),
             "linear_group: {} weights, {} outputs and {} biases", w.size(), y.size(), bias.size());
    for (size_t i = 0; i < w.size(); ++i) linear(x, w[i], y[i], bias.empty() ? Tensor() : bias[i]);
  }

  /// Zero-centred RMSNorm (`Qwen4ExpTextRMSNorm`) over each `group`-wide segment of a row:
  /// y = x * rsqrt(mean(x^2) + eps) * (1 + w[j mod W]), W = w.numel(). x, y [T, L] with L % W == 0 and W % group
  /// == 0: W = group is a per-head norm applied to every head, W = L a grouped norm with one weight row.
  /// In place (y == x) allowed.
  virtual void zc_rms_norm(const Tensor& x, const Tensor& w, int64_t group, double eps, const Tensor& y) = 0;

  // ---------------------------------------------------------------- hyper-connections

  /// Gated residual read (`Qwen4ExpTextGatedResidual.forward`): N = grouped ZC-RMSNorm(X) (groups of H);
  /// m = sigmoid(W_up silu(W_down N / S)); u = mean_b(m_b * N_b); if `hc.inject` is defined,
  /// inj = 2 sigmoid(W_inject N / S). X [T, S*H], u [T, H], inj [T, S] (ignored when hc.inject is undefined).
  virtual void hc_read(const Tensor& X, const HcWeights& hc, double eps, const Tensor& u, const Tensor& inj) = 0;

  /// Injection into every stream, in place: X[t, b*H + j] += inj[t, b] * out[t, j]. X [T, S*H], out [T, H],
  /// inj [T, S].
  virtual void hc_inject(const Tensor& X, const Tensor& out, const Tensor& inj) = 0;

  /// A sublayer's injection followed by the next gated residual read, one op so that a backend can do both in one
  /// pass over X (the CUDA decode kernels): hc_inject(X, out, inj_prev), then hc_read(X, hc, eps, u, inj). X holds the
  /// injected streams afterwards. X [T, S*H], out [T, H], inj_prev [T, S]; hc, u, inj as hc_read. The default is
  /// the two ops in order (the same float32 values: x + inj_prev * out, then the read).
  virtual void hc_inject_read(const Tensor& X, const Tensor& out, const Tensor& inj_prev, const HcWeights& hc,
                              double eps, const Tensor& u, const Tensor& inj) {
    hc_inject(X, out, inj_prev);
    hc_read(X, hc, eps, u, inj);
  }

  // ---------------------------------------------------------------- Gated DeltaNet
  //
  // The sequence-state ops (GDN, QSA, PLE conv) take the StepBatch of the step (ops/step_batch.h): activations are
  // the step's concatenated rows [batch.num_tokens, width] (sequence s owns rows cu_seqlens[s] ..), per-sequence
  // state lives in pools whose dimension 0 is the state slot (batch.slots), and KV caches in pools of
  // batch.block_size-row blocks addressed through the block tables. A single sequence is a one-sequence batch.

  /// Causal depthwise conv1d + SiLU over time, in place on `qkv` [T, C], with `weight` [C, K] (conv1d.weight
  /// squeezed), per sequence: y[t, c] = silu(sum_k weight[c, k] * x[t - (K-1) + k, c]). Inputs before a sequence's
  /// rows come from its state, state_pool [slots, K-1, C] row slots[s] (time-major: row K-2 is the newest earlier
  /// input; zeros for a new sequence), which is updated to its last K-1 inputs (`causal_conv1d_fn` /
  /// `causal_conv1d_update`).
  virtual void gdn_conv_batch(const Tensor& qkv, const Tensor& weight, const Tensor& state_pool,
                              const StepBatch& batch) = 0;

  /// Gated delta rule per sequence (`torch_chunk_gated_delta_rule`, chunks of 64, for a sequence of several rows;
  /// `torch_recurrent_gated_delta_rule` for a decode token: equal up to float rounding). qkv [T, C] is the conv
  /// output, split q | k | v ([nk*dk | nk*dk | nv*dv]); value head i uses key head i / (nv/nk). q, k are
  /// l2-normalised (x * rsqrt(sum x^2 + 1e-6)), q scaled by dk^-0.5; beta = sigmoid(b), g = -exp(A_log) *
  /// softplus(a + dt_bias), with a, b [T, nv] the in_proj_a / in_proj_b outputs. Per value head,
  /// S <- exp(g_t) S; S <- S + k_t (beta_t (v_t - S^T k_t))^T; o_t = S^T q_t. The sequence's state S,
  /// state_pool [slots, nv, dk, dv] F32 row slots[s], is read as the initial state and overwritten with the final
  /// one; o [T, nv*dv].
  virtual void gdn_rule_batch(const Tensor& qkv, const Tensor& a, const Tensor& b, const GdnWeights& w,
                              const GdnDims& dims, const Tensor& state_pool, const StepBatch& batch,
                              const Tensor& o) = 0;

  /// The GDN mixer's sequence ops in one call: gdn_conv_batch(qkv, conv_weight, conv_pool, batch), then
  /// gdn_rule_batch(qkv, a, b, w, dims, state_pool, batch, o), then where norm.weight is defined
  /// gated_rms_norm(o, norm.z, norm.weight, norm.eps, norm.act, o). qkv [T, C] is the raw in_proj_qkv output; what
  /// it holds afterwards is unspecified (the conv output here; the CUDA backend folds the conv into the recurrence of
  /// decode steps and speculative verifies, and its norm too, leaving qkv as it was). The default is the ops in order.
  virtual void gdn_mix_batch(const Tensor& qkv, const Tensor& conv_weight, const Tensor& conv_pool, const Tensor& a,
                             const Tensor& b, const GdnWeights& w, const GdnDims& dims, const Tensor& state_pool,
                             const StepBatch& batch, const GdnOutputNorm& norm, const Tensor& o) {
    gdn_conv_batch(qkv, conv_weight, conv_pool, batch);
    gdn_rule_batch(qkv, a, b, w, dims, state_pool, batch, o);
    if (norm.weight.defined()) gated_rms_norm(o, norm.z, norm.weight, norm.eps, norm.act, o);
  }

  /// GDN output norm (`Qwen4ExpTextRMSNormGated`) per head of width D = w.numel():
  /// y = w * (x * rsqrt(mean(x^2) + eps)) * act(z). x, z, y [T, n*D]; w [D] (plain scale, not zero-centred).
  /// In place (y == x) allowed.
  virtual void gated_rms_norm(const Tensor& x, const Tensor& z, const Tensor& w, double eps, GateAct act,
                              const Tensor& y) = 0;

  // ---------------------------------------------------------------- QSA attention

  /// Query/key preparation of `Qwen4ExpTextAttention`: qg [T, nh*2D] (q_proj output, per head [query D | gate D])
  /// is split into q [T, nh*D] and gate [T, nh*D]; q = RoPE(ZC-RMSNorm(q; q_norm)) per head, and in place on
  /// k [T, nkv*D]: k = RoPE(ZC-RMSNorm(k; k_norm)). q_norm, k_norm [D]; each token at its own position
  /// (batch.positions).
  virtual void qsa_prepare_qk_batch(const Tensor& qg, const Tensor& k, const Tensor& q_norm, const Tensor& k_norm,
                                    double eps, const RopeParams& rope, const StepBatch& batch, const Tensor& q,
                                    const Tensor& gate) = 0;

  /// The QSA indexer's token selection (`Qwen4ExpTextQSAIndexer.forward`) for every query of the step. qi
  /// [T, ni*Di] holds the raw index queries (index_qk_proj rows, first ni*Di columns); index_key_pool
  /// [num_blocks*block_size, Di] the raw (un-normed, un-roped) index keys of every sequence, paged like the KV
  /// cache (the step's keys already written). For the query at position p of sequence s: nb = (p+1)/c complete
  /// blocks (c = `block`); block key j = RoPE(ZC-RMSNorm(mean of the keys of positions c*j .. c*j+c-1;
  /// k_layernorm), position c*j); q_h = RoPE(ZC-RMSNorm(qi_h; q_layernorm), p); score_j = sum_h relu(q_h . key_j)
  /// / sqrt(Di); the top min(budget/c, nb) blocks by score are chosen exactly as torch.topk on CPU chooses them
  /// (ties included, see ops/cpu/topk.h), then the tail tokens c*nb .. p. selected [T, budget + c - 1] I32
  /// receives the chosen logical positions (block tokens in the order topk returns them, then the tail; a backend
  /// may return complete selections, all blocks chosen, in position order), padded with -1.
  /// pooled_key_pool [num_blocks*block_size/c, Di] is a cache the op may keep of the pooled block keys (the
  /// reference recomputes them for every query): a backend that uses it writes the pooled key of every indexer
  /// block that a token of the step completes (row block_tables[s, j*c / block_size] * (block_size / c) +
  /// (j*c % block_size) / c for block j) and reads earlier ones from it; block_size must be a multiple of c.
  virtual void qsa_indexer_select_batch(const Tensor& qi, const Tensor& index_key_pool, const Tensor& pooled_key_pool,
                                        const Tensor& q_layernorm, const Tensor& k_layernorm, double eps,
                                        const RopeParams& rope, int64_t budget, int64_t block, const StepBatch& batch,
                                        const Tensor& selected) = 0;

  /// Attention of each query over its selected positions only, with the output gate: for query t and head h
  /// (kv head h / (nh/nkv)), o = softmax_j(q . K[sel_j] * scale) V[sel_j] over the non-negative entries of
  /// selected[t] (logical positions of the token's own sequence, read through its block table; softmax in
  /// float32); out = o * sigmoid(gate). q, gate, out [T, nh, D]; k_pool, v_pool [num_blocks*block_size, nkv, D];
  /// selected [T, n_sel] I32 (-1 = unused; at least one valid entry per query; a query's positions distinct, as
  /// the indexer's are: a repeated one is counted once by some kernels, twice by others).
  virtual void sparse_attention_batch(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                                      const Tensor& selected, const Tensor& gate, double scale, const StepBatch& batch,
                                      const Tensor& out) = 0;

  // ---------------------------------------------------------------- MoE

  /// Router (`Qwen4ExpTextTopKRouter`): p = softmax(u router^T) in float32 over E experts; the top-k of p as
  /// torch.topk picks them; if norm_topk_prob the k weights are divided by their sum. u [T, H]; ids [T, k] I32,
  /// weights [T, k] F32.
  virtual void moe_router_topk(const Tensor& u, const Tensor& router, bool norm_topk_prob, const Tensor& ids,
                               const Tensor& weights) = 0;

  /// Routed experts (`Qwen4ExpTextExperts`): out[t] = sum_j weights[t, j] * down_e(silu(gate_e u_t) * up_e u_t),
  /// e = ids[t, j]. Overwrites out [T, H]. Takes w.gate / w.up / w.down, or w.packed when this backend made it.
  /// With `shared` ([T, H] F32, made by moe_shared_expert_start) out[t] = that sum + shared[t], the sum of
  /// `Qwen4ExpTextSparseMoeBlock.forward` (the shared term added last, as moe_shared_expert would add it).
  virtual void moe_experts(const Tensor& u, const Tensor& ids, const Tensor& weights, const MoeWeights& w,
                           const Tensor& out, const Tensor& shared = Tensor()) = 0;

  /// Shared expert, accumulated: out[t] += sigmoid(shared_expert_gate . u_t) * down_s(silu(gate_s u_t) * up_s u_t).
  virtual void moe_shared_expert(const Tensor& u, const MoeWeights& w, const Tensor& out) = 0;

  /// The shared expert's term on its own, begun so that it overlaps with the ops enqueued after it (the router and
  /// the routed experts): shared[t] = sigmoid(shared_expert_gate . u_t) * down_s(silu(gate_s u_t) * up_s u_t),
  /// shared [T, H] F32, overwritten, bit for bit what moe_shared_expert adds to zeros. Only moe_experts given it as
  /// `shared` may read it (the CUDA backend runs a decode step's shared expert on a stream of its own, which that
  /// call joins before the launch that reads it); u must stay unchanged until then. Errors as moe_shared_expert.
  /// Default: at once.
  virtual void moe_shared_expert_start(const Tensor& u, const MoeWeights& w, const Tensor& shared) {
    fill_zero(shared);
    moe_shared_expert(u, w, shared);
  }

  // ---------------------------------------------------------------- PLE

  /// e[t, i*hd .. (i+1)*hd) = table row rows[t, i] (converted to float32, times table.scale; FP8 rows are
  /// converted row by row as they are read): the concatenated n-gram embedding
  /// (`Qwen4ExpTextNGramEmbedding`, `ngram_embedding(ids).flatten(-2)`). rows [T, heads] I64 (checked against
  /// table.rows), e [T, heads*hd].
  virtual void ple_gather(const PleTable& table, const Tensor& rows, const Tensor& e) = 0;

  /// ple_gather begun so that it overlaps with the ops enqueued after it (the CUDA backend runs it on a side stream
  /// once `rows` is on the device, so the gather of a PLE layer's rows from host memory starts before layer 0). `e`
  /// holds the rows only after ple_gather_wait(e); the backend keeps `rows` and `e` alive until then. Default: the
  /// gather at once.
  virtual void ple_gather_start(const PleTable& table, const Tensor& rows, const Tensor& e) {
    ple_gather(table, rows, e);
  }
  /// Orders every op enqueued after this call after the gather into `e` begun by ple_gather_start (CUDA: the main
  /// stream waits on the gather's event). Throws Error when no gather into `e` is pending on a backend that tracks
  /// them. Default: nothing to wait for.
  virtual void ple_gather_wait(const Tensor& e) { (void)e; }

  /// PLE gate (`Qwen4ExpTextPLELayer.forward`, before the conv): qn = grouped ZC-RMSNorm(X; norm_query);
  /// s_b = (kn_b . qn_b) / sqrt(H); s_b = sign(s_b) sqrt(max(|s_b|, 1e-6)); P[:, b] = sigmoid(s_b) * v.
  /// kn [T, S*H] (already normed keys), v [T, H], X [T, S*H], norm_query [S*H], P [T, S*H].
  virtual void ple_gate(const Tensor& kn, const Tensor& v, const Tensor& X, const Tensor& norm_query, double eps,
                        const Tensor& P) = 0;

  /// PLE short conv and residual add, in place on X, per sequence: X += P + silu(conv(n)), n = ZC-RMSNorm(P;
  /// norm_conv) over groups of `group` (= H) columns, conv depthwise over time with weight [S*H, K] and dilation d:
  /// c[t] = sum_k w[k] * n[t - (K-1-k)*d]. Earlier inputs come from the sequence's state, state_pool
  /// [slots, (K-1)*d, S*H] row slots[s] (time-major, oldest first; zeros for a new sequence), updated to its last
  /// (K-1)*d normed inputs (`_short_conv`).
  virtual void ple_conv_add_batch(const Tensor& P, const Tensor& norm_conv, int64_t group, const Tensor& conv_w,
                                  int64_t dilation, double eps, const Tensor& state_pool, const StepBatch& batch,
                                  const Tensor& X) = 0;

  // ---------------------------------------------------------------- sampling

  /// Whether sample_tokens runs on this backend's device (the CUDA backend). Otherwise the engine samples on the host
  /// from downloaded logits (engine/sampling.h), as the CPU backend does.
  virtual bool samples_on_device() const { return false; }
  /// The next token of each row of logits [rows, vocab] F32 under params[r]: greedy for temperature <= 0; else
  /// temperature, top-k, top-p (over the top-k survivors), min-p, in that order, ties at a boundary kept, then a draw
  /// from the rest with the counter-based random number of (seed, offset) (ops/cuda/sampling_kernels.h). Returns the
  /// ids on the host. Throws Error when params.size() != rows, and on backends without device sampling.
  virtual std::vector<int32_t> sample_tokens(const Tensor& logits, std::span<const TokenSampling> params) {
    (void)logits, (void)params;
    throw Error(name() + ": sample_tokens: this backend samples on the host (samples_on_device() is false)");
  }

  // ---------------------------------------------------------------- steps

  /// Bracket the ops of one forward step of `tokens` rows (Model::forward_batch calls them through a StepScope).
  /// Tensors made between them (activations, op scratch, step metadata) are step memory: a backend may take them
  /// from a per-step arena that the next step reuses (the CUDA backend does for decode-sized steps, docs/ENGINE.md
  /// "Memory"), so nothing made inside a step may serve as a cache or state kept across steps. A handle that
  /// outlives its step stays valid: the backend then leaves that memory alone and takes fresh memory for the next
  /// step. Steps do not nest (an Error on backends that track them). Default: nothing.
  virtual void begin_step(int64_t tokens) { (void)tokens; }
  virtual void end_step() {}

  // ---------------------------------------------------------------- captured steps (CUDA graphs)
  //
  // A decode step whose ops depend on nothing but its one upload (docs/ENGINE.md "CUDA graphs") is recorded once and
  // replayed: the model calls begin_step_capture right after begin_step, runs the step's ops as always (its only
  // upload is the step's input buffer), and end_step_capture before end_step. The recorded work has NOT run then:
  // the caller runs it with replay_step, with the same input, and afterwards with the input of each later step of
  // the same shape. Tensors the step made (its logits included) keep their addresses: each replay overwrites them.

  /// Whether this backend records steps (the CUDA backend unless FLASHNEXT_CUDA_GRAPHS=0 or while profiling).
  virtual bool captures_steps() const { return false; }
  /// Starts recording the ops enqueued from now on, inside a step. Throws Error on backends that do not record.
  virtual void begin_step_capture() {
    throw Error(name() + ": begin_step_capture: this backend does not record steps");
  }
  /// Ends the recording begun by begin_step_capture: the recorded step, or null when it cannot be replayed (an op
  /// allocated memory outside the step arena, made other than one upload, or the driver refused: `why` says which).
  /// Also called, with its result dropped, when the step threw while recording (the stream is usable again).
  virtual std::shared_ptr<StepGraph> end_step_capture(std::string* why) {
    if (why) *why = "this backend does not record steps";
    return nullptr;
  }
  /// Runs `graph` after writing `input` (as many bytes as the recorded step's upload) where that upload reads from
  /// (StepReplay::Ran). Runs nothing when memory it uses was replaced since it was recorded (a workspace grown by a
  /// larger step: Stale; the caller drops it, and may record the shape anew) or a handle to one of its tensors from
  /// an earlier replay is still alive (Busy; the caller runs the step without it). Throws Error for an input of
  /// another size or a graph of another backend.
  virtual StepReplay replay_step(StepGraph& graph, std::span<const uint8_t> input) {
    (void)graph, (void)input;
    throw Error(name() + ": replay_step: this backend does not record steps");
  }

  // ---------------------------------------------------------------- profiling (flashnext bench --profile)

  /// Attributes the time of the ops enqueued from now on to `phase` (a string literal: "gdn_rule", "moe_routed",
  /// ...), ending the previous phase; null ends the current one. Costs nothing unless set_profiling(true). The
  /// default (synchronous backends) measures host time between marks; the CUDA backend records an event on its
  /// stream at each mark, so a phase's time is device time, launch gaps included.
  virtual void profile_phase(const char* phase);
  /// Turns the marks on (clearing what was measured) or off.
  virtual void set_profiling(bool on);
  /// Milliseconds per phase since set_profiling(true), summed over its marks, in the order phases first appeared
  /// (waits for the device).
  virtual std::vector<std::pair<std::string, double>> profile_times();

 private:
  // Host-clock profile of the default profile_phase (ops/profile.cpp).
  bool profiling_ = false;
  const char* phase_ = nullptr;
  double phase_start_ms_ = 0;
  std::vector<std::pair<std::string, double>> phase_ms_;
};

/// begin_step on construction, end_step on destruction (also when the step throws).
class StepScope {
 public:
  StepScope(Ops& ops, int64_t tokens) : ops_(ops) { ops_.begin_step(tokens); }
  ~StepScope() { ops_.end_step(); }
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

 private:
  Ops& ops_;
};

/// The float32 CPU backend with a pool of `threads` threads (0: hardware concurrency).
std::shared_ptr<Ops> make_cpu_ops(int threads = 0);

}  // namespace flashnext
