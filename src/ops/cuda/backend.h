// The CUDA backend's class, shared by its per-family files (internal: only src/ops/cuda includes it; users call
// make_cuda_ops in cuda_ops.h). One class, one file per op family, each owning its launches, workspaces and
// caches:
//   backend.cpp       context and streams, memory ops, synchronisation and the status words, profiling, factory
//   weights_ops.cpp   load_weight (FP16 conversion), host tables, random weights, W4A16 repacking of experts
//   dense_ops.cpp     embedding, linear / linear_group (the FP16x2 split GEMM and the float32 decode GEMV), norms
//   hc_ops.cpp        hyper-connection read and inject
//   gdn_ops.cpp       Gated DeltaNet conv, delta rule, gated norm (and the A_log / dt_bias gates cache)
//   qsa_ops.cpp       q/k preparation, the indexer (GPU top-k), sparse attention over the paged pools
//   moe_ops.cpp       router, routed experts (W4A16 and FP16), shared expert
//   ple_ops.cpp       PLE gathers (side stream), gate, conv
//   sampling_ops.cpp  next-token sampling on the device
// Argument checks are the op contracts' (ops/contract/); what a family adds are its kernels' limits.
// See cuda_ops.h for the precision and memory model and docs/ENGINE.md for streams, waits and allocations.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ops/contract/contract.h"
#include "ops/cuda/blas.h"
#include "ops/cuda/buffer.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_ops_kernels.h"
#include "ops/cuda/moe_w4a16.h"
#include "ops/cuda/qsa_kernels.h"

namespace flashnext::cuda {

/// Slots of the device status words: kernels OR error bits into their op's slot; every synchronisation reads them.
enum StatusSlot : int {
  kStatusEmbedding,
  kStatusMoe,
  kStatusPle,
  kStatusQsa,
  kStatusSelection,
  kStatusRows,
  kStatusSlots
};

/// What every tensor of the backend shares: the device, the stream all work runs on, and the status words. Tensors
/// hold it so that their memory is freed on the stream even after the backend object is gone.
struct Context {
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaStream_t side = nullptr;     ///< PLE gathers started ahead of their layer (ple_gather_start)
  cudaStream_t branch = nullptr;   ///< work beside the main stream's within a layer (moe_shared_expert_start)
  int32_t* status = nullptr;       ///< device [kStatusSlots]
  int32_t* status_host = nullptr;  ///< pinned [kStatusSlots]
  /// While a step is recorded (CudaOps::begin_step_capture): pool memory released meanwhile is freed after the
  /// recording ends (a free enqueued on the recording stream would become part of the recorded step).
  bool recording = false;
  std::vector<void*> frees_after_recording;

  /// Streams, the pool's release threshold (freed memory kept for reuse) and the status words of GPU `dev`.
  explicit Context(int dev);
  ~Context();  ///< errors ignored: at process exit the runtime may already be gone
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
};

/// The data of a tensor as T* (dtypes are checked by the contracts beforehand).
template <class T>
T* dp(const Tensor& t) {
  return static_cast<T*>(t.data());
}

/// Whether `t`'s data is 16-byte aligned (what the decode GEMV kernels' 16-byte loads need).
inline bool aligned16(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data()) % 16 == 0;
}

/// `v` as an int for the kernels' 32-bit extents; throws Error naming the op and the extent when it does not fit.
int to_int(int64_t v, const char* op, const char* what);

/// Routed experts repacked for the W4A16 kernels (moe_w4a16.h): gate and up fused as gate_up [E, 2I, H], down
/// [E, H, I], in device memory of GPU `device`; 8-bit integer experts as two 4-bit planes (planes 2: [E, 2I, 2H] and
/// [E, H, 2I], MoeW4A16Experts::planes), FP8 ones as FP8 bytes (W4Format::Fp8, planes 1).
class CudaW4Experts final : public PackedExperts {
 public:
  /// Experts packed on the host (load_quantized_experts), uploaded here.
  CudaW4Experts(const W4Packed& gu, const W4Packed& dn, int device_, int planes, std::string what);
  /// Experts already on the device (random ones: W4DeviceMatrix::random_nvfp4).
  CudaW4Experts(W4DeviceMatrix gu, W4DeviceMatrix dn, int device_, int E, int H, int I, std::string what);
  std::string format() const override { return format_; }
  int64_t device_bytes() const override { return bytes_; }

  W4DeviceMatrix gate_up, down;
  int device, experts, hidden, inter, planes;
  /// The kernels' view (moe_w4a16_routed).
  MoeW4A16Experts view() const { return {&gate_up, &down, experts, hidden, inter, planes}; }

 private:
  int64_t bytes_;
  std::string format_;
};

class CudaOps final : public Ops {
 public:
  CudaOps(int device, const CudaOpsOptions& options);
  ~CudaOps() override;

  Device device() const override { return Device::CUDA; }
  std::string name() const override { return name_; }

  // ------------------------------------------------ backend.cpp: memory, synchronisation, profiling

  Tensor empty(const Shape& shape, DType dtype) override { return alloc(shape, dtype, "tensor"); }
  Tensor zeros(const Shape& shape, DType dtype) override;
  Tensor upload(const void* host, DType dtype, const Shape& shape) override;
  void download(const Tensor& t, void* host) override;
  void synchronize() override { synchronize("synchronize"); }
  void copy_rows(const Tensor& src, int64_t src_row, const Tensor& dst, int64_t dst_row, int64_t n) override;
  void fill_zero(const Tensor& t) override;
  void gather_rows(const Tensor& src, const Tensor& rows, const Tensor& dst) override;
  void scatter_rows(const Tensor& src, const Tensor& rows, const Tensor& dst) override;
  /// The step arena (see StepArena below): begin_step reuses last step's memory when no handle of it is left.
  void begin_step(int64_t tokens) override;
  void end_step() override;
  /// Recorded steps: CUDA graphs captured from the stream (thread-local capture mode), replayed with
  /// cudaGraphLaunch; programmatic launches become programmatic edges. Recording refuses pool allocations (the step
  /// must fit its arena block, which the recording then keeps) and uploads other than the step's one; the upload's
  /// source is a pinned buffer that replay_step rewrites. Not while profiling (the phase marks are events).
  bool captures_steps() const override { return options_.step_graphs && !profiling_; }
  void begin_step_capture() override;
  std::shared_ptr<StepGraph> end_step_capture(std::string* why) override;
  StepReplay replay_step(StepGraph& graph, std::span<const uint8_t> input) override;
  /// An event on the stream per mark (events reused across set_profiling calls).
  void profile_phase(const char* phase) override;
  /// Counters of the step arena, for tests and bench (cuda_ops.h cuda_memory_counters).
  CudaMemoryCounters memory_counters() const { return counters_; }
  /// The GPU and the stream that all of this backend's work runs on in order: collectives enqueue on it
  /// (nccl_communicator.h), so that they follow the ops that made their inputs and precede those that read them.
  int gpu() const { return ctx_->device; }
  cudaStream_t work_stream() const { return ctx_->stream; }
  void set_profiling(bool on) override;
  std::vector<std::pair<std::string, double>> profile_times() override;

  // ------------------------------------------------ weights_ops.cpp

  Tensor load_weight(const void* host, DType dtype, const Shape& shape) override;
  Tensor map_host_table(const void* host, DType dtype, const Shape& shape,
                        std::shared_ptr<const void> keepalive) override;
  /// Pinned, mapped host memory (the placement of map_host_table's host tables, whatever options_.ple_table says).
  HostTable host_table(DType dtype, const Shape& shape) override;
  Tensor random_weight(const Shape& shape, float lo, float hi, uint64_t seed) override;
  /// W4A16 experts in the NVFP4 layout (moe_w4a16.h W4DeviceMatrix::random_nvfp4): gate_up [E, 2I, H] and down
  /// [E, H, I] with global scales sqrt(1 / in) / rms(E2M1), rms(E2M1) = sqrt(68.5 / 8) over the 16 equally likely
  /// codes.
  RoutedExperts random_experts(int64_t E, int64_t I, int64_t H, uint64_t seed) override;
  /// NVFP4 (ModelOpt, compressed-tensors), int4 (compressed-tensors, GPTQ, AWQ) and 2- / 3-bit GPTQ experts are
  /// repacked once into the W4A16 layout (moe_w4a16.h W4Packed: lossless) and uploaded; FP8-block, 8-bit GPTQ and
  /// 8-bit channel experts (a block with any of them: core/quant_format.h w4a16_holds), and geometries the W4A16
  /// kernels do not take (H or I not a multiple of 8, an int4 group that is not), take the default path:
  /// dequantized exactly to float32 on the host, stored as FP16 weights (which rounds 8-bit codes times scales).
  RoutedExperts load_quantized_experts(const QuantExperts& q) override;
  /// The codes (I8 / F8_E4M3, one byte a weight) and float32 scales uploaded as they are (Tensor::with_scales): the
  /// products of dense_ops.cpp apply the scales (W8A16).
  Tensor load_w8_linear(const W8Linear& w) override;

  // ------------------------------------------------ dense_ops.cpp

  void embedding(const Tensor& table, const Tensor& ids, const Tensor& out) override;
  void linear(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& bias) override;
  /// One decode GEMV launch for the whole group when it qualifies (gemv_group), else a product per weight.
  void linear_group(const Tensor& x, std::span<const Tensor> w, std::span<const Tensor> y,
                    std::span<const Tensor> bias) override;
  void zc_rms_norm(const Tensor& x, const Tensor& w, int64_t group, double eps, const Tensor& y) override;

  // ------------------------------------------------ hc_ops.cpp

  void hc_read(const Tensor& X, const HcWeights& hc, double eps, const Tensor& u, const Tensor& inj) override;
  void hc_inject(const Tensor& X, const Tensor& out, const Tensor& inj) override;
  /// Decode (hc_read_decode_supported) and, on SM80+, prefill (hc_read_prefill_supported): the injection computed
  /// inside the two read kernels, the second of which stores the injected X; otherwise the default.
  void hc_inject_read(const Tensor& X, const Tensor& out, const Tensor& inj_prev, const HcWeights& hc, double eps,
                      const Tensor& u, const Tensor& inj) override;

  // ------------------------------------------------ gdn_ops.cpp

  /// A decode step (one token per sequence): one conv-update launch over the state slots; else one launch per
  /// sequence.
  void gdn_conv_batch(const Tensor& qkv, const Tensor& weight, const Tensor& state_pool,
                      const StepBatch& batch) override;
  /// One launch for the whole step over the state slots: the recurrence for a decode step, else the chunked form
  /// over every sequence's rows (a decode token among prefill chunks then goes through the chunked form: equal up
  /// to rounding).
  void gdn_rule_batch(const Tensor& qkv, const Tensor& a, const Tensor& b, const GdnWeights& w, const GdnDims& dims,
                      const Tensor& state_pool, const StepBatch& batch, const Tensor& o) override;
  /// Where the step takes the recurrence (few_rows): one launch (detail::launch_gdn_recurrent) with the norm in it
  /// and, where its blocks fit in one wave of the folded kernel (a decode step of one sequence at the released
  /// widths), the conv too (qkv left as it was); with the conv apart, its decode launch first. Otherwise the default.
  void gdn_mix_batch(const Tensor& qkv, const Tensor& conv_weight, const Tensor& conv_pool, const Tensor& a,
                     const Tensor& b, const GdnWeights& w, const GdnDims& dims, const Tensor& state_pool,
                     const StepBatch& batch, const GdnOutputNorm& norm, const Tensor& o) override;
  void gated_rms_norm(const Tensor& x, const Tensor& z, const Tensor& w, double eps, GateAct act,
                      const Tensor& y) override;

  // ------------------------------------------------ qsa_ops.cpp

  void qsa_prepare_qk_batch(const Tensor& qg, const Tensor& k, const Tensor& q_norm, const Tensor& k_norm, double eps,
                            const RopeParams& rope, const StepBatch& batch, const Tensor& q,
                            const Tensor& gate) override;
  /// The indexer over the whole step at once, on the paged keys: pooled keys cached per complete block (written by
  /// the token that completes the block), scores from the cache, the torch-exact top-k on the GPU for the queries
  /// that have more complete blocks than the budget (launch_qsa_topk_paged: no host round trip). Queries that take
  /// every complete block get them in position order.
  void qsa_indexer_select_batch(const Tensor& qi, const Tensor& index_key_pool, const Tensor& pooled_key_pool,
                                const Tensor& q_layernorm, const Tensor& k_layernorm, double eps,
                                const RopeParams& rope, int64_t budget, int64_t block, const StepBatch& batch,
                                const Tensor& selected) override;
  /// Sparse attention over the paged K/V pools directly (no per-sequence gather): the kernel maps each selected
  /// logical position through the sequence's block table. Only scale = 1/sqrt(head_dim) (what the model uses).
  void sparse_attention_batch(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, const Tensor& selected,
                              const Tensor& gate, double scale, const StepBatch& batch, const Tensor& out) override;

  // ------------------------------------------------ moe_ops.cpp

  void moe_router_topk(const Tensor& u, const Tensor& router, bool norm_topk_prob, const Tensor& ids,
                       const Tensor& weights) override;
  void moe_experts(const Tensor& u, const Tensor& ids, const Tensor& weights, const MoeWeights& w, const Tensor& out,
                   const Tensor& shared = Tensor()) override;
  void moe_shared_expert(const Tensor& u, const MoeWeights& w, const Tensor& out) override;
  /// A decode step's shared expert (at most kGemvMaxTokens rows of FP16 weights, FP16x2 activations) on the branch
  /// stream, joined by the moe_experts call that takes `shared` before its launch that reads it (the W4A16 experts'
  /// down GEMV or combine; the FP16 experts' combine); otherwise on the stream at once. Off with
  /// CudaOpsOptions::moe_branch false.
  void moe_shared_expert_start(const Tensor& u, const MoeWeights& w, const Tensor& shared) override;

  // ------------------------------------------------ ple_ops.cpp

  void ple_gather(const PleTable& table, const Tensor& rows, const Tensor& e) override;
  void ple_gather_start(const PleTable& table, const Tensor& rows, const Tensor& e) override;
  void ple_gather_wait(const Tensor& e) override;
  void ple_gate(const Tensor& kn, const Tensor& v, const Tensor& X, const Tensor& norm_query, double eps,
                const Tensor& P) override;
  /// A decode step: one conv-add launch for all sequences over the state slots; else per sequence.
  void ple_conv_add_batch(const Tensor& P, const Tensor& norm_conv, int64_t group, const Tensor& conv_w,
                          int64_t dilation, double eps, const Tensor& state_pool, const StepBatch& batch,
                          const Tensor& X) override;

  // ------------------------------------------------ sampling_ops.cpp

  bool samples_on_device() const override { return true; }
  std::vector<int32_t> sample_tokens(const Tensor& logits, std::span<const TokenSampling> params) override;

 private:
  // ------------------------------------------------ backend.cpp

  cudaStream_t stream() const { return on_branch_ ? ctx_->branch : ctx_->stream; }
  int32_t* status(StatusSlot s) const { return ctx_->status + s; }
  /// The contracts' view of this backend (tensors on this GPU, FP16 weights); makes the GPU current on the calling
  /// thread, which every op needs before its launches: ops begin with it.
  contract::Backend spec() const;
  /// Makes this backend's GPU current on the calling thread (a no-op when it already is).
  void use_device() const;
  /// How long a tensor that an op makes lives: for the step (activations, scratch; the arena inside a step) or
  /// beyond it (weights, tables, the caches ops keep: always the pool).
  enum class Lifetime : uint8_t { Step, Kept };
  /// A tensor from the step arena (inside a step, Lifetime::Step, when it fits) or from the stream-ordered pool,
  /// freed on the stream when its last handle goes away.
  Tensor alloc(const Shape& shape, DType dtype, const char* what, Lifetime lifetime = Lifetime::Step);
  /// `bytes` of the stream-ordered pool, freed on the stream with the last owner.
  std::shared_ptr<void> pool_memory(size_t bytes, const char* what, const Shape& shape, DType dtype);
  /// The tile-union attention kernel's plan for this step and head geometry (qsa_ops.cpp), qpc = 0 for the
  /// per-query kernel: options_.qsa_attention, the step's longest sequence (Auto), and what the kernel supports.
  detail::QsaUnionPlan qsa_union_plan(const StepBatch& batch, int heads, int kv_heads, int dim, const Tensor& k_pool,
                                      const Tensor& v_pool) const;
  /// Whether products take FP16x2 inputs (ActivationPrecision::Fp16x2).
  bool split() const { return options_.activations == ActivationPrecision::Fp16x2; }
  /// Waits for the stream; throws Error for a failed kernel and for index errors the kernels recorded.
  void synchronize(const char* where);
  /// Whether a step is pure decode (one token per sequence; slots already checked): then the batched decode
  /// kernels run over the state slots directly.
  static bool all_decode(const StepBatch& b) { return b.num_tokens == b.num_seqs && b.num_seqs > 0; }
  /// Rows per sequence up to which a step's recurrent ops (the GDN and PLE causal convs, the gated delta rule) walk
  /// each sequence's rows in one launch over the state slots, as decode steps do and equal to them bit for bit: a
  /// speculative verify of 1 + K <= 9 rows, its replay, a short chunk. Longer chunks take the prefill kernels.
  static constexpr int64_t kFewRows = 16;
  static bool few_rows(const StepBatch& b) { return b.num_seqs > 0 && b.max_rows() <= kFewRows; }
  /// seq_starts for the kernels that walk a sequence's rows: null in a decode step (row s is sequence s).
  static const int32_t* row_starts(const StepBatch& b) {
    return all_decode(b) ? nullptr : static_cast<const int32_t*>(b.seq_starts.data());
  }
  /// gather_rows / scatter_rows: `rows` index the rows of dst (scatter) or src (gather); row ids are checked on
  /// the device (status word kStatusRows, reported at the next synchronisation).
  void copy_rows_indexed(const char* op, const Tensor& src, const Tensor& rows, const Tensor& dst, bool scatter);

  std::shared_ptr<Context> ctx_;
  CudaOpsOptions options_;
  std::string name_;
  /// One device block that a step's tensors are carved from (bump allocation, 256-byte aligned). Stream order makes
  /// reuse safe: the next step's kernels run after the previous step's. At begin_step the block is reused when no
  /// tensor of it is alive (its use count is 1) and it holds the largest demand of a step so far; otherwise a block
  /// of that demand (+25%) replaces it (a block with live tensors is freed when they go). A step that outgrows the
  /// block takes the rest from the pool (counted), so the next step's block is large enough: a steady state allocates
  /// nothing. Only steps of at most kMaxTokens rows use it (decode; bump allocation keeps every tensor of a step, which
  /// a prefill step's many large activations would multiply: those take the pool, which reuses within the step), and
  /// only up to a block of an eighth of the device's memory.
  struct StepArena {
    static constexpr int64_t kMaxTokens = 64;
    size_t max_bytes = 0;
    std::shared_ptr<void> block;
    size_t capacity = 0, used = 0, demand = 0;  ///< bytes: the block's size, carved so far, asked for this step
    size_t peak = 0;  ///< the largest demand of a step so far: a new block holds it (a recorded step of any shape
                      ///< seen before then fits the block it keeps)
    bool active = false;                        ///< inside a step that uses it
  } arena_;
  bool in_step_ = false;  ///< between begin_step and end_step
  /// The step being recorded (begin_step_capture .. end_step_capture): its uploads' pinned sources and sizes, and
  /// why it cannot be replayed (an allocation it asked for), if so.
  struct Recording {
    bool active = false;
    int uploads = 0;                ///< a replayable step makes one
    std::shared_ptr<void> staging;  ///< the pinned source of its (last) upload
    size_t staging_bytes = 0;
    std::string refused;
  } recording_;
  /// Changes whenever memory that a recorded step may use outside its arena block is made or replaced (kept
  /// tensors, W4A16 workspaces, PLE gather views): recordings of another generation are stale (replay_step).
  uint64_t memory_generation_ = 0;
  CudaMemoryCounters counters_;
  /// profile_phase: the phase of each mark and the event recorded for it (profile_events_[i] for mark i).
  bool profiling_ = false;
  std::vector<const char*> profile_marks_;
  std::vector<cudaEvent_t> profile_events_;

  // ------------------------------------------------ weights_ops.cpp

  /// The part of a checkpoint matrix [full_rows, full_cols] a rank packs: rows [r0, r0 + rows), columns
  /// [c0, c0 + cols), in int4 groups of `group` inputs (the whole matrix without tensor parallelism).
  struct Slice {
    int64_t r0, rows, c0, cols, full_rows, full_cols, group;
  };
  /// Rows [row0, row0 + slice.rows) of expert `e` of `dst` from the slice of one checkpoint matrix (lossless,
  /// moe_w4a16.h; int4 groups split by slice_int4 where the slice needs smaller ones).
  /// planes 2: the block is held as two 4-bit planes (moe_w4a16.h int8_planes), each matrix through its 8-bit form;
  /// an FP8 matrix (format CtFp8 / Fp8Block) goes to an FP8 `dst` through its Fp8Plain form (slice_fp8 where sliced).
  static void pack_rows(W4Packed& dst, int64_t e, int64_t row0, const QuantMatrix& m, QuantFormat format,
                        const Slice& slice, bool zeros, int planes);

  // ------------------------------------------------ dense_ops.cpp

  /// y [T, out] F32 = x [T, in] F32 · w [out, in]^T (+ bias [out]) on the tensor cores: x as FP16x2 rows
  /// (split_product) or rounded to FP16, per the activation precision; `float32_inputs` takes FP16x2
  /// whatever the precision (products whose results feed discrete choices: the router). Shapes checked by the
  /// caller.
  void product(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& bias, const char* what,
               bool float32_inputs = false);
  /// x [T, in] F32 as its FP16x2 rows x2 [2T, in] F16: hi = fp16(x) in rows 0..T-1, lo = fp16(x - hi) below.
  Tensor split_halves(const Tensor& x, const char* what);
  /// y [T, out] F32 = (x_hi + x_lo) w^T (+ bias) from split_halves' x2: from kSplitAccumulateRows rows two GEMMs of
  /// T rows, the second adding to the first's output (no [2T, out] intermediate and no summing pass, the weights read
  /// twice), below one GEMM of 2T rows (the weights read once) and a kernel that adds its halves.
  void split_product(const Tensor& x2, const Tensor& w, const Tensor& y, const Tensor& bias, const char* what);
  /// Rows from which split_product accumulates its halves' products in place (bench, H100, released widths, 256
  /// experts, the same binary with and without: prefill 1K 7,573 -> 7,250 tokens/s, 2K 8,474 -> 8,667, 4K 8,726 ->
  /// 8,934; below 2,048 rows reading the weights twice costs more than the intermediate it saves).
  static constexpr int64_t kSplitAccumulateRows = 2048;
  /// y[i] = x w[i]^T (+ bias[i]) as one decode GEMV launch when x has at most kGemvMaxTokens rows, K % 8 == 0 and
  /// every pointer is 16-byte aligned (8-bit weights: gemv_group_w8; a group mixing them with FP16 ones does not
  /// qualify); returns false (nothing done) otherwise. Shapes checked by the caller.
  bool gemv_group(const Tensor& x, std::span<const Tensor> w, std::span<const Tensor> y, std::span<const Tensor> bias,
                  const char* what);
  /// product() for an 8-bit weight (Tensor::with_scales, W8A16): up to kW8GemvMaxTokens rows the 8-bit GEMV where
  /// gemv_group takes it (8 rows a launch), else the codes as FP16 tiles (exact where one scale covers a row, which is
  /// applied to the product; block scales multiplied in first, one rounding) through the tensor-core GEMM of product's
  /// precision.
  void product_w8(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& bias, const char* what,
                  bool float32_inputs);
  /// gemv_group for a group of 8-bit weights of one code type (launch_gemv_w8_f32x): K % 16 == 0, groups multiples
  /// of 16 or whole rows; false (nothing done) otherwise.
  bool gemv_group_w8(const Tensor& x, std::span<const Tensor> w, std::span<const Tensor> y,
                     std::span<const Tensor> bias, const char* what);
  /// Rows up to which product_w8 takes the 8-bit GEMV (kGemvMaxTokens rows a launch).
  static constexpr int64_t kW8GemvMaxTokens = 32;
  /// product_w8's FP16 tile of 8-bit codes (grown on demand, kept between steps).
  Tensor w8_tile_;
  /// An FP16 copy of a float32 tensor (the input of a tensor-core product).
  Tensor half_copy(const Tensor& x, const char* op);

  Blas blas_;

  // ------------------------------------------------ hc_ops.cpp

  /// hc_read in the backend's own kernels, with the injection X += inj_prev (x) out folded in and stored when `out`
  /// is defined (hc_inject_read): the two decode kernels for at most kGemvMaxTokens rows (hc_read_decode_supported),
  /// else on SM80+ launch_hc_read_prefill (hc_read_prefill_supported; FP16x2 activations whatever split() says;
  /// FLASHNEXT_CUDA_HC_PREFILL=cublas turns it off); rows 16-byte aligned. Returns false (nothing done) where they
  /// do not apply. Shapes checked by the caller.
  bool hc_read_fused(const Tensor& X, const Tensor& out, const Tensor& inj_prev, const HcWeights& hc, double eps,
                     const Tensor& u, const Tensor& inj);

  // ------------------------------------------------ gdn_ops.cpp

  /// A_log and dt_bias of `w` as float32 [2 * nv] (A_log, then dt_bias), converted once per weight pair and kept
  /// while the weights live (a pair at reused addresses is converted anew).
  const float* gdn_gates(const GdnWeights& w, int64_t nv, const char* op);
  struct GdnGates {
    Tensor gates;
    std::weak_ptr<void> a_log, dt_bias;
  };
  std::map<std::pair<const void*, const void*>, GdnGates> gdn_gates_;
  /// The counters of the folded norm and conv (detail::GdnOutNorm::done, GdnConvIn::done), zero between launches;
  /// grown for a larger pool, and every one ever made kept (a recorded step may name it).
  std::vector<Tensor> gdn_done_;
  int32_t* gdn_counters(int64_t count, const char* op);
  /// detail::gdn_recurrent_folded_resident_blocks() of this GPU (-1: not asked yet; 0: the query failed, asked again).
  int gdn_folded_resident_ = -1;

  // ------------------------------------------------ moe_ops.cpp

  /// moe_experts on W4A16 experts: u rounded to FP16 (the kernels' activations), FP32 accumulation, FP32 output
  /// (moe_w4a16.h for the arithmetic).
  void moe_experts_w4a16(const Tensor& u, const Tensor& ids, const Tensor& weights, const PackedExperts& packed,
                         const Tensor& out, const float* shared, cudaEvent_t shared_ready);
  /// moe_experts on stacked FP16 experts (FP16x2: per-expert cuBLAS products; FP16: the WMMA grouped kernels).
  void moe_experts_f16(const Tensor& u, const Tensor& ids, const Tensor& weights, const MoeWeights& w,
                       const Tensor& out, int64_t E, int64_t I, const float* shared);
  /// The shared expert's term, out[t] (+)= sigmoid(gate . u_t) * down(silu(gate u_t) * up u_t) (accumulated or
  /// stored), on stream(); with `scratch` (the branch stream) its temporaries are appended there, to live until the
  /// join, and only the decode GEMV path may run (Error otherwise). Shapes checked by the caller.
  void shared_expert(const Tensor& u, const MoeWeights& w, const Tensor& out, bool accumulate,
                     std::vector<Tensor>* scratch);
  /// Stream `to` (the side or branch stream) waits for everything enqueued on the main stream so far (through an
  /// event, released once the wait is satisfied). Returns the first error.
  cudaError_t fork_to(cudaStream_t to) noexcept;
  /// The main stream waits for `done` (an event recorded on the side or branch stream), which is then destroyed and
  /// nulled; nothing for a null event. Returns the wait's error.
  cudaError_t join_event(cudaEvent_t& done) noexcept;
  /// join_event of every shared expert still pending (a step that threw before its moe_experts), errors cleared.
  void join_pending_branches() noexcept;
  /// A shared expert begun on the branch stream and not yet joined: what it reads and writes, its scratch, and the
  /// event its last launch records.
  struct PendingShared {
    Tensor u, shared;
    std::vector<Tensor> scratch;
    cudaEvent_t done = nullptr;
  };
  std::vector<PendingShared> pending_shared_;
  /// Whether ops now enqueue on the branch stream (stream() returns it; moe_shared_expert_start sets it around the
  /// branch's launches).
  bool on_branch_ = false;
  /// The W4A16 scratch for (top_k, E, H, I, planes), grown to at least `tokens` tokens (a replaced one is freed with
  /// cudaFree, which waits for the work that uses it).
  MoeW4A16Workspace& w4_workspace(int tokens, int top_k, int experts, int hidden, int inter, int planes);

  std::map<std::array<int, 5>, std::unique_ptr<MoeW4A16Workspace>> w4_workspaces_;

  // ------------------------------------------------ ple_ops.cpp

  /// What the PLE gather kernel reads: shard k holds rows [k * rows_per_shard, ...) (equal shards, the last may be
  /// shorter). Tables whose shards are not like that are merged once into one GPU copy.
  struct GatherTable {
    DeviceArray<const void*> addresses;
    DeviceArray<const void*> scale_addresses;  ///< I8 tables: each shard's group scales (empty otherwise)
    int64_t rows_per_shard = 0, rows = 0;
    Tensor merged, merged_scales;
    std::vector<std::weak_ptr<void>> shards;  ///< the memory the view was made from
    /// Whether `table` is still the table this view was made from (not a new one at a reused address).
    bool made_from(const PleTable& table) const;
  };
  /// The gather view of `table`, made once per table (keyed by its shard addresses; a view whose memory was freed,
  /// so that a new table may have its addresses, is dropped).
  const GatherTable& gather_table(const PleTable& table);
  /// ple_gather on stream `s`.
  void gather_ple_rows(const PleTable& table, const Tensor& rows, const Tensor& e, cudaStream_t s);

  std::map<std::vector<const void*>, GatherTable> gather_tables_;
  /// PLE gathers begun on the side stream and not yet waited for, with what they read and write.
  struct PendingGather {
    Tensor rows, e;
    cudaEvent_t done = nullptr;
  };
  std::vector<PendingGather> pending_gathers_;
};

/// Whether `a` and `b` refer to the same live allocation (the weak references of the caches above: a cache entry
/// keyed by addresses is valid only while the memory it was made from lives).
inline bool same_memory(const std::weak_ptr<void>& a, const std::weak_ptr<void>& b) {
  return !a.expired() && !a.owner_before(b) && !b.owner_before(a);
}

}  // namespace flashnext::cuda
