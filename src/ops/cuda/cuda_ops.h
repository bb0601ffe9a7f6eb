// The CUDA backend of the ops interface (ops/ops.h): every op of the qwen4_exp forward on one GPU, through the
// SM70-set kernels of src/ops/cuda and cuBLAS.
//
// Precision: weights are stored in FP16 (`load_weight` converts BF16/F32 checkpoints and fails, naming the count and
// the largest magnitude, when a value lies outside the FP16 range; BF16 values convert exactly unless they are
// below FP16's normal range). Quantized routed experts (`load_quantized_experts`): NVFP4, int4 (GPTQ, AWQ,
// compressed-tensors) and GPTQ / AutoRound of 2 or 3 bits are repacked once, losslessly, into the W4A16 layout of
// moe_w4a16.h and run by its grouped kernels with FP16 activations; 8-bit integer experts (8-bit GPTQ / AutoRound,
// W8A8 INT8) as two 4-bit planes and FP8 experts (W8A8 FP8, the FP8 block format) as their bytes, in the same kernels
// (moe_w4a16.h). 8-bit dense projections (W8A8 INT8 and FP8 releases: Ops::load_w8_linear) stay codes with float32
// scales, one byte a weight, which the products apply (W8A16, exact weights; dense_ops.cpp); other quantized dense
// weights are dequantized to FP16 at load. An FP8 or int8 PLE table stays as stored and
// is converted row by row in the gather. Activations at the interface stay
// float32, as the interface defines them: the residual stream, norm statistics, softmaxes, GDN states, QSA caches,
// indexer scores and the router are FP32. The inputs of tensor-core products are, by default
// (ActivationPrecision::Fp16x2), split into two FP16 halves hi = fp16(x), lo = fp16(x - hi) (stacked as rows of one
// GEMM, which reads the weights once; from 2,048 rows two GEMMs, the second adding to the first's output), which makes
// every product float32-accurate: needed because near-tied discrete decisions
// of the model (MoE routing, the QSA indexer's block top-k) flip under plain FP16 activations and move the logits far
// beyond rounding (tiny-a "long": 0.15 with FP16 rounding at the GEMM inputs, 4e-6 with the split; measured by
// emulation on the CPU oracle). ActivationPrecision::Fp16 rounds those inputs to FP16 and runs the batched FP16 kernels
// (WMMA grouped experts, the FP16 hyper-connection path): half the GEMM work in prefill, not reference-exact. The
// batched indexer's top-k runs on the GPU with torch.topk's exact tie behaviour (ops/torch_topk_order.h, the same
// selection as the CPU oracle's ops/cpu/topk.h) whenever a query has more complete blocks than its budget, so the
// selected token sets match the reference whenever the scores' order does. Products of at most 8 rows and decode
// hyper-connection reads run as float32 GEMV kernels.
//
// Memory: tensors come from the device's stream-ordered pool (cudaMallocAsync), all work runs on one stream in
// order (except PLE gathers begun ahead with `ple_gather_start`, on a side stream joined by `ple_gather_wait`, and a
// decode step's shared expert, on a branch stream joined by the routed experts: `moe_shared_expert_start`), and
// only `download` waits for it. Batched steps: a pure decode step runs the GDN conv and recurrence and the PLE conv
// over the state slots in one launch each; the indexer (with a cache of pooled block keys) and sparse attention
// run once per step over the paged pools through the block tables; the GDN rule of a step with prefill chunks runs
// in chunked form over all its sequences at once; the GDN and PLE convs of such a step launch once per sequence.
// Next tokens can be sampled on the GPU
// (`sample_tokens`). Index errors that kernels meet (token ids, expert ids, PLE rows, QSA selections) are recorded in
// a device status word and reported by the next `download` as an Error naming the op.
// The PLE n-gram tables stay in pinned host memory read by the gather kernel over the host link (an exact-size
// pinned copy of each shard), or are copied to the GPU: CudaOpsOptions::ple_table.
//
// Differences from the CPU oracle: `qsa_indexer_select_batch` returns complete-selection rows (all blocks chosen)
// in position order (ops.h allows it), and `sparse_attention_batch` supports only scale = 1/sqrt(head_dim) (what the
// model uses). Up to float rounding every op computes what ops.h documents. The implementation is one class,
// CudaOps (backend.h), in one file per op family.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ops/kernel_trace.h"
#include "ops/ops.h"

namespace flashnext {

/// Where the CUDA backend keeps the PLE n-gram tables (`Ops::map_host_table`).
enum class PleTablePlacement : uint8_t {
  Host,    ///< an exact-size pinned host copy per shard, read by the gather kernel through the unified address space
  Device,  ///< a copy in GPU memory
};

/// How float32 activations enter the FP16 tensor-core products (see the header comment).
enum class ActivationPrecision : uint8_t {
  Fp16x2,  ///< hi + lo FP16 pairs: float32-accurate products (default)
  Fp16,    ///< rounded to FP16: the batched FP16 kernels, faster prefill, not reference-exact
};

/// Which kernel computes QSA sparse attention (sparse_attention_batch).
enum class QsaAttentionKernel : uint8_t {
  Auto,       ///< tile-union where it runs for steps with a sequence of at least kQsaTileUnionMinRows rows and at least
              ///< one of its blocks (8 queries x KV head) per SM, else per-query
  PerQuery,   ///< a block per (query, KV head, split of the selection): decode, and every step on SM70
  TileUnion,  ///< a block per (8 consecutive queries of a sequence, KV head) over their selections' union (SM80+;
              ///< per-query where it cannot run)
};
/// Rows of one sequence in a step from which Auto takes the tile-union kernel.
constexpr int64_t kQsaTileUnionMinRows = 16;

/// Which kernels compute the chunked gated delta rule of prefill steps (gdn_rule_batch past CudaOps::kFewRows rows).
enum class GdnChunkKernel : uint8_t {
  Auto,       ///< the state walk and the outputs in one kernel of FP16x2 mma.sync products where dk is a multiple of
              ///< 16 (SM80+), else CudaCores
  CudaCores,  ///< float32 FMAs throughout (SM70 always)
};

/// Options of the CUDA backend.
struct CudaOpsOptions {
  PleTablePlacement ple_table = PleTablePlacement::Host;
  ActivationPrecision activations = ActivationPrecision::Fp16x2;
  /// Decode steps recorded as CUDA graphs and replayed (Ops::captures_steps; docs/ENGINE.md "CUDA graphs").
  bool step_graphs = true;
  QsaAttentionKernel qsa_attention = QsaAttentionKernel::Auto;
  GdnChunkKernel gdn_chunk = GdnChunkKernel::Auto;
  /// A decode step's shared expert on a stream of its own, beside the router and the routed experts
  /// (moe_shared_expert_start); false: in order on the one stream.
  bool moe_branch = true;

  /// The defaults, overridden by the environment: FLASHNEXT_PLE_TABLE=host|device,
  /// FLASHNEXT_CUDA_ACTIVATIONS=fp16x2|fp16, FLASHNEXT_CUDA_GRAPHS=1|0,
  /// FLASHNEXT_CUDA_QSA=auto|per_query|tile_union, FLASHNEXT_CUDA_GDN_CHUNK=auto|cuda_cores and
  /// FLASHNEXT_CUDA_MOE_BRANCH=1|0. Throws Error for another value.
  static CudaOpsOptions from_env();
};

/// The CUDA backend on GPU `device` with options from the environment (CudaOpsOptions::from_env()).
/// Throws Error "no CUDA device found (...)" naming the cudaGetDeviceCount error when the machine has no usable
/// GPU, and an Error when `device` is not one of the GPUs found.
std::shared_ptr<Ops> make_cuda_ops(int device = 0);
/// The same with explicit options.
std::shared_ptr<Ops> make_cuda_ops(int device, const CudaOpsOptions& options);
/// GPUs the CUDA runtime sees (cudaGetDeviceCount); 0 when there is none or the query fails.
int cuda_device_count();

/// How a CUDA backend's step memory was had since it was made (ops.h begin_step / end_step): steps, tensors carved
/// from the step arena, and allocations from the stream-ordered pool inside steps (0 per step once the arena has
/// grown to a step's demand) and outside them (weights, tables, caches, the tensors made between steps).
struct CudaMemoryCounters {
  int64_t steps = 0;
  int64_t arena_tensors = 0;
  int64_t step_pool_allocations = 0;
  int64_t other_pool_allocations = 0;
  int64_t arena_bytes = 0;  ///< size of the current arena block
  /// Recorded steps (Ops::begin_step_capture ... end_step_capture): made, and replayed (replay_step runs).
  int64_t graphs_recorded = 0, graph_replays = 0;
  /// gdn_mix_batch launches with the conv folded into the recurrence (docs/ENGINE.md), and those with it apart.
  int64_t gdn_conv_folded = 0, gdn_conv_apart = 0;
};
/// The counters of `ops`, a backend made by make_cuda_ops. Throws Error for another backend.
CudaMemoryCounters cuda_memory_counters(const Ops& ops);

/// CUDA work the process enqueued while counting was on (cuda_api_counting): kernel launches (cuBLAS's included),
/// memory copies and memory sets, as CUPTI's driver-API callbacks see them.
struct CudaApiCounts {
  int64_t kernel_launches = 0, memcpys = 0, memsets = 0;
};
/// Turns counting on (counts reset) or off. Returns false, counting nothing, when this build has no CUPTI or CUPTI
/// refuses (another profiler attached). Counting costs about a microsecond per call of the host: do not time with it.
bool cuda_api_counting(bool on);
/// What was counted since counting was last turned on.
CudaApiCounts cuda_api_counts();
/// Kernel tracing (CUPTI's activity records of kind CONCURRENT_KERNEL: every kernel of the process, those of replayed
/// graphs and cuBLAS's included, with device timestamps, overlap kept). On: what was collected is dropped and tracing
/// starts; off: the records are flushed and tracing stops (synchronize the device first: a kernel still running has no
/// record). Returns false, tracing nothing, when this build has no CUPTI or CUPTI refuses (another profiler attached).
/// Tracing adds device and host time per kernel: report traced steps beside untraced timings, never as them.
bool cuda_kernel_tracing(bool on);
/// The kernels traced between the last cuda_kernel_tracing(true) and (false), in the order CUPTI delivered them.
std::vector<KernelInterval> cuda_kernel_trace();
/// The mean device time of one launch of an empty kernel on GPU `device`, launched back to back `launches` times
/// on one stream between two events, in microseconds: the floor each kernel of a step pays.
double cuda_launch_cost_us(int device, int launches = 2000);

/// Programmatic dependent launch of the CUDA backend's kernels (kernel_attributes.h `launch`, docs/ENGINE.md
/// "Kernel launches"): whether it is on for GPU `device` (compute capability 9.0 or newer, kernels compiled for it,
/// not turned off by FLASHNEXT_CUDA_PDL=0 or set_cuda_programmatic_launch). Throws Error when a device query fails.
bool cuda_programmatic_launch(int device);
/// Turns programmatic dependent launch off (false) or back on where a GPU has it (true), for the whole process, from
/// the next launch on. For tests and benchmarks that compare both; not thread-safe against steps in flight.
void set_cuda_programmatic_launch(bool allowed);
/// The routed W4A16 experts' decode GEMV on GPU `device` (docs/ENGINE.md "Precision"): true for the tensor-core
/// kernels (compute capability 8.0+, compiled for it, not turned off by FLASHNEXT_CUDA_W4_GEMV=fma), false for the
/// FP32-FMA ones. Throws Error when a device query fails.
bool cuda_w4a16_gemv_tensor_cores(int device);

/// Memory of one GPU, in bytes.
struct GpuMemory {
  int64_t free_bytes = 0;   ///< free now (cudaMemGetInfo)
  int64_t total_bytes = 0;  ///< the device's total
};
/// Free and total memory of GPU `device` (cudaMemGetInfo). Throws Error when the query fails.
GpuMemory cuda_memory_info(int device);

/// What `bench` reports about a GPU.
struct CudaDeviceInfo {
  std::string name;
  int major = 0, minor = 0;        ///< compute capability
  int multiprocessors = 0;
  int sm_clock_mhz = 0;            ///< peak SM clock (cudaDevAttrClockRate)
  int memory_clock_mhz = 0;        ///< peak memory clock (cudaDevAttrMemoryClockRate)
  int memory_bus_bits = 0;
  int driver_version = 0, runtime_version = 0;  ///< as cudaDriverGetVersion / cudaRuntimeGetVersion (13000 = 13.0)
  int64_t total_bytes = 0;
};
/// The properties of GPU `device`. Throws Error when a query fails.
CudaDeviceInfo cuda_device_info(int device);

}  // namespace flashnext
