// The CUDA backend's context and streams, memory ops, synchronisation with the status words, profiling and
// factory (backend.h lists the per-family files of the rest).
#include "ops/cuda/backend.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>

#include "ops/contract/memory.h"
#include "ops/cuda/kernel_attributes.h"
#include "ops/cuda/moe_w4a16.h"

namespace flashnext {

namespace {

/// The value of environment variable `name` among `choices` (spelling, value), or `fallback` when it is unset or
/// empty. Throws Error naming the variable, the spellings it takes and what it got.
template <class T>
T env_choice(const char* name, std::initializer_list<std::pair<const char*, T>> choices, T fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  std::string allowed;
  for (const auto& [text, value] : choices) {
    if (std::strcmp(v, text) == 0) return value;
    allowed += fmt::format("{}'{}'", allowed.empty() ? "" : ", ", text);
  }
  fail("{} must be one of {}, got '{}'", name, allowed, v);
}

}  // namespace

CudaOpsOptions CudaOpsOptions::from_env() {
  CudaOpsOptions o;
  o.ple_table = env_choice("FLASHNEXT_PLE_TABLE",
                           {{"host", PleTablePlacement::Host}, {"device", PleTablePlacement::Device}}, o.ple_table);
  o.activations =
      env_choice("FLASHNEXT_CUDA_ACTIVATIONS",
                 {{"fp16x2", ActivationPrecision::Fp16x2}, {"fp16", ActivationPrecision::Fp16}}, o.activations);
  o.step_graphs = env_choice("FLASHNEXT_CUDA_GRAPHS", {{"1", true}, {"0", false}}, o.step_graphs);
  o.qsa_attention = env_choice("FLASHNEXT_CUDA_QSA",
                               {{"auto", QsaAttentionKernel::Auto},
                                {"per_query", QsaAttentionKernel::PerQuery},
                                {"tile_union", QsaAttentionKernel::TileUnion}},
                               o.qsa_attention);
  o.gdn_chunk = env_choice("FLASHNEXT_CUDA_GDN_CHUNK",
                           {{"auto", GdnChunkKernel::Auto}, {"cuda_cores", GdnChunkKernel::CudaCores}}, o.gdn_chunk);
  o.moe_branch = env_choice("FLASHNEXT_CUDA_MOE_BRANCH", {{"1", true}, {"0", false}}, o.moe_branch);
  return o;
}

namespace cuda {

Context::Context(int dev) : device(dev) {
  FN_CUDA_CHECK(cudaSetDevice(dev), "cuda backend: cudaSetDevice");
  FN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cuda backend: stream");
  FN_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "cuda backend: side stream");
  FN_CUDA_CHECK(cudaStreamCreateWithFlags(&branch, cudaStreamNonBlocking), "cuda backend: branch stream");
  // Keep freed pool memory for reuse instead of returning it to the driver at every synchronisation.
  cudaMemPool_t pool = nullptr;
  FN_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev), "cuda backend: memory pool");
  uint64_t threshold = std::numeric_limits<uint64_t>::max();
  FN_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
                "cuda backend: memory pool");
  void* p = nullptr;
  FN_CUDA_CHECK(cudaMalloc(&p, sizeof(int32_t) * kStatusSlots), "cuda backend: status words");
  status = static_cast<int32_t*>(p);
  FN_CUDA_CHECK(cudaMemset(status, 0, sizeof(int32_t) * kStatusSlots), "cuda backend: status words");
  FN_CUDA_CHECK(cudaMallocHost(&p, sizeof(int32_t) * kStatusSlots), "cuda backend: status words");
  status_host = static_cast<int32_t*>(p);
}
Context::~Context() {
  if (stream) cudaStreamSynchronize(stream);
  if (side) cudaStreamSynchronize(side);
  if (branch) cudaStreamSynchronize(branch);
  if (status) cudaFree(status);
  if (status_host) cudaFreeHost(status_host);
  if (stream) cudaStreamDestroy(stream);
  if (side) cudaStreamDestroy(side);
  if (branch) cudaStreamDestroy(branch);
}

int to_int(int64_t v, const char* op, const char* what) {
  FN_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(), "{}: {} = {} exceeds the kernels' 32-bit range", op, what,
           v);
  return int(v);
}

CudaW4Experts::CudaW4Experts(const W4Packed& gu, const W4Packed& dn, int device_, int planes_, std::string what)
    : gate_up(gu),
      down(dn),
      device(device_),
      experts(gu.experts),
      hidden(gu.cols / planes_),
      inter(dn.cols / planes_),
      planes(planes_),
      bytes_(int64_t(gu.expert_bytes() + dn.expert_bytes()) * gu.experts),
      format_(std::move(what)) {}
CudaW4Experts::CudaW4Experts(W4DeviceMatrix gu, W4DeviceMatrix dn, int device_, int E, int H, int I, std::string what)
    : gate_up(std::move(gu)),
      down(std::move(dn)),
      device(device_),
      experts(E),
      hidden(H),
      inter(I),
      planes(1),
      bytes_(int64_t(E) * int64_t(gate_up.expert_bytes() + down.expert_bytes())),
      format_(std::move(what)) {}

CudaOps::CudaOps(int device, const CudaOpsOptions& options) : ctx_(std::make_shared<Context>(device)), options_(options) {
  cudaDeviceProp prop{};
  FN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device), "cuda backend: device properties");
  name_ = fmt::format(
      "cuda:{} ({}, sm_{}{}; FP16 weights, FP32 activations, {} GEMM inputs; PLE tables in {} "
      "memory)",
      device, prop.name, prop.major, prop.minor, split() ? "FP16x2" : "FP16",
      options.ple_table == PleTablePlacement::Host ? "pinned host" : "GPU");
}

CudaOps::~CudaOps() {
  if (ctx_->side) cudaStreamSynchronize(ctx_->side);  // gathers begun but never waited for (a failed step)
  for (PendingGather& g : pending_gathers_) cudaEventDestroy(g.done);
  join_pending_branches();  // begun, never joined (a failed step)
  for (cudaEvent_t e : profile_events_) cudaEventDestroy(e);
  if (ctx_->stream) cudaStreamSynchronize(ctx_->stream);
}

Tensor CudaOps::zeros(const Shape& shape, DType dtype) {
  Tensor t = alloc(shape, dtype, "tensor");
  fill_zero(t);
  return t;
}

Tensor CudaOps::upload(const void* host, DType dtype, const Shape& shape) {
  Tensor t = alloc(shape, dtype, "upload");
  if (t.nbytes()) {
    FN_CHECK(host, "upload: null host pointer for {}", t.str());
    if (recording_.active) {  // from a pinned copy that the recording keeps (replay_step rewrites it)
      void* pinned = nullptr;
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;  // allocating pinned memory is not a stream op
      FN_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode), "upload");
      const cudaError_t err = cudaMallocHost(&pinned, t.nbytes());
      FN_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode), "upload");
      FN_CUDA_CHECK(err, "upload: pinned staging of a recorded step");
      ++recording_.uploads;
      recording_.staging = std::shared_ptr<void>(pinned, [](void* p) { cudaFreeHost(p); });
      recording_.staging_bytes = t.nbytes();
      std::memcpy(pinned, host, t.nbytes());
      host = pinned;
    }
    FN_CUDA_CHECK(cudaMemcpyAsync(t.data(), host, t.nbytes(), cudaMemcpyHostToDevice, stream()), "upload");
  }
  return t;
}

void CudaOps::download(const Tensor& t, void* host) {
  contract::on_device(spec(), t, "download", "tensor");
  if (t.nbytes()) FN_CUDA_CHECK(cudaMemcpyAsync(host, t.data(), t.nbytes(), cudaMemcpyDefault, stream()), "download");
  synchronize("download");
}

void CudaOps::copy_rows(const Tensor& src, int64_t src_row, const Tensor& dst, int64_t dst_row, int64_t n) {
  const size_t row = contract::copy_rows(spec(), src, src_row, dst, dst_row, n);
  if (row == 0) return;
  FN_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(dst.data()) + size_t(dst_row) * row,
                                static_cast<const uint8_t*>(src.data()) + size_t(src_row) * row, size_t(n) * row,
                                cudaMemcpyDefault, stream()),
                "copy_rows");
}

void CudaOps::fill_zero(const Tensor& t) {
  contract::on_device(spec(), t, "fill_zero", "tensor");
  if (t.nbytes()) FN_CUDA_CHECK(cudaMemsetAsync(t.data(), 0, t.nbytes(), stream()), "fill_zero");
}

void CudaOps::gather_rows(const Tensor& src, const Tensor& rows, const Tensor& dst) {
  copy_rows_indexed("gather_rows", src, rows, dst, /*scatter=*/false);
}

void CudaOps::scatter_rows(const Tensor& src, const Tensor& rows, const Tensor& dst) {
  copy_rows_indexed("scatter_rows", src, rows, dst, /*scatter=*/true);
}

void CudaOps::profile_phase(const char* phase) {
  if (!profiling_) return;
  use_device();
  if (profile_marks_.size() == profile_events_.size()) {
    cudaEvent_t e = nullptr;
    FN_CUDA_CHECK(cudaEventCreate(&e), "profile_phase");
    profile_events_.push_back(e);
  }
  cudaEvent_t e = profile_events_[profile_marks_.size()];
  FN_CUDA_CHECK(cudaEventRecord(e, stream()), "profile_phase");
  profile_marks_.push_back(phase);
}

void CudaOps::set_profiling(bool on) {
  profiling_ = on;
  profile_marks_.clear();
}

std::vector<std::pair<std::string, double>> CudaOps::profile_times() {
  synchronize("profile_times");
  std::vector<std::pair<std::string, double>> out;
  for (size_t i = 0; i + 1 < profile_marks_.size(); ++i) {
    if (!profile_marks_[i]) continue;
    float ms = 0;
    FN_CUDA_CHECK(cudaEventElapsedTime(&ms, profile_events_[i], profile_events_[i + 1]), "profile_times");
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& p) { return p.first == profile_marks_[i]; });
    if (it == out.end()) it = out.insert(out.end(), {profile_marks_[i], 0.0});
    it->second += ms;
  }
  return out;
}

void CudaOps::use_device() const {
  thread_local int current = -1;
  if (current != ctx_->device) {
    FN_CUDA_CHECK(cudaSetDevice(ctx_->device), "cuda backend: cudaSetDevice");
    current = ctx_->device;
  }
}

std::shared_ptr<void> CudaOps::pool_memory(size_t bytes, const char* what, const Shape& shape, DType dtype) {
  if (recording_.active) {
    // The recording would own this memory (a graph allocation); the step is replayed only from its arena block.
    recording_.refused = fmt::format("it allocated {} bytes for a {} {}[{}] beyond its step arena", bytes,
                                     dtype_name(dtype), what, fmt::join(shape, ", "));
    fail("cuda: recorded step: {}", recording_.refused);
  }
  void* p = nullptr;
  const cudaError_t err = cudaMallocAsync(&p, bytes, stream());
  if (err != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail("cuda: cannot allocate {} bytes of GPU memory for a {} {}[{}]: {} ({} of {} bytes free)", bytes,
         dtype_name(dtype), what, fmt::join(shape, ", "), cudaGetErrorString(err), free_b, total_b);
  }
  std::shared_ptr<Context> ctx = ctx_;
  return std::shared_ptr<void>(p, [ctx](void* q) {
    if (ctx->recording)
      ctx->frees_after_recording.push_back(q);
    else
      cudaFreeAsync(q, ctx->stream);
  });
}

Tensor CudaOps::alloc(const Shape& shape, DType dtype, const char* what, Lifetime lifetime) {
  use_device();
  for (auto d : shape) FN_CHECK(d >= 0, "cuda: negative dimension in shape [{}]", fmt::join(shape, ", "));
  const size_t bytes = std::max<size_t>(size_t(shape_numel(shape)) * dtype_size(dtype), 1);
  if (arena_.active && lifetime == Lifetime::Step) {
    const size_t rounded = (bytes + 255) / 256 * 256;
    arena_.demand += rounded;
    if (arena_.used + rounded <= arena_.capacity) {
      void* p = static_cast<uint8_t*>(arena_.block.get()) + arena_.used;
      arena_.used += rounded;
      ++counters_.arena_tensors;
      return Tensor(std::shared_ptr<void>(arena_.block, p), p, dtype, shape, Device::CUDA, ctx_->device);
    }
    ++counters_.step_pool_allocations;  // the block is too small this step; the next one will fit
  } else {
    ++counters_.other_pool_allocations;
    if (lifetime == Lifetime::Kept) ++memory_generation_;  // a cache a recorded step may read
  }
  std::shared_ptr<void> owner = pool_memory(bytes, what, shape, dtype);
  void* p = owner.get();
  return Tensor(std::move(owner), p, dtype, shape, Device::CUDA, ctx_->device);
}

void CudaOps::begin_step(int64_t tokens) {
  FN_CHECK(!in_step_, "begin_step: a step is already open (steps do not nest)");
  in_step_ = true;
  ++counters_.steps;
  if (tokens > StepArena::kMaxTokens) return;  // prefill: the pool, which reuses memory within the step
  use_device();
  if (arena_.max_bytes == 0) {
    size_t free_b = 0, total_b = 0;
    FN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b), "begin_step");
    arena_.max_bytes = total_b / 8;
  }
  arena_.peak = std::max(arena_.peak, arena_.demand);
  const size_t want = std::min(arena_.peak + arena_.peak / 4, arena_.max_bytes);
  const bool free_block = arena_.block && arena_.block.use_count() == 1;
  if (!free_block || (arena_.capacity < arena_.peak && arena_.capacity < want)) {
    // Live tensors of the last step keep the old block (freed with them); a step that outgrew it gets a larger one.
    arena_.block.reset();
    arena_.capacity = 0;
    if (want > 0) {
      arena_.block = pool_memory(want, "step arena", {int64_t(want)}, DType::U8);
      arena_.capacity = want;
      ++counters_.step_pool_allocations;
    }
  }
  arena_.used = 0;
  arena_.demand = 0;
  arena_.active = true;
  counters_.arena_bytes = int64_t(arena_.capacity);
}

void CudaOps::end_step() {
  in_step_ = false;
  arena_.active = false;
  join_pending_branches();
}

cudaError_t CudaOps::fork_to(cudaStream_t to) noexcept {
  cudaEvent_t ready = nullptr;
  cudaError_t err = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
  if (err == cudaSuccess) err = cudaEventRecord(ready, ctx_->stream);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(to, ready, 0);
  if (ready) cudaEventDestroy(ready);  // released once the wait is satisfied
  return err;
}

cudaError_t CudaOps::join_event(cudaEvent_t& done) noexcept {
  if (!done) return cudaSuccess;
  const cudaError_t waited = cudaStreamWaitEvent(ctx_->stream, done, 0);
  cudaEventDestroy(done);
  done = nullptr;
  return waited;
}

void CudaOps::join_pending_branches() noexcept {
  bool failed = false;
  for (PendingShared& p : pending_shared_) failed |= join_event(p.done) != cudaSuccess;
  pending_shared_.clear();
  if (failed) cudaGetLastError();  // a failed step's: not left for the next launch's check
}

namespace {

/// A recorded step of the CUDA backend: the instantiated graph, the pinned source of its one upload, the arena block
/// its tensors live in (kept for it alone), and an event after its last replay.
struct CudaStepGraph final : StepGraph {
  std::shared_ptr<Context> ctx;
  cudaGraphExec_t exec = nullptr;
  std::shared_ptr<void> staging;
  size_t staging_bytes = 0;
  std::shared_ptr<void> block;
  uint64_t generation = 0;
  cudaEvent_t done = nullptr;
  ~CudaStepGraph() override {
    if (done) {
      cudaEventSynchronize(done);  // the pinned staging is freed with it: no replay may still read it
      cudaEventDestroy(done);
    }
    if (exec) cudaGraphExecDestroy(exec);
  }
};

}  // namespace

void CudaOps::begin_step_capture() {
  FN_CHECK(in_step_ && !recording_.active, "begin_step_capture: outside a step, or a recording is already open");
  FN_CHECK(arena_.active, "begin_step_capture: a step of {} or fewer tokens is recorded (its arena)",
           StepArena::kMaxTokens);
  use_device();
  recording_ = Recording{};
  FN_CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal), "begin_step_capture");
  recording_.active = true;
  ctx_->recording = true;
}

std::shared_ptr<StepGraph> CudaOps::end_step_capture(std::string* why) {
  if (!recording_.active) {
    if (why) *why = "no recording was open";
    return nullptr;
  }
  use_device();
  // A shared expert begun on the branch stream and never joined (a step that threw between the two): joined before
  // the capture ends, so that the driver does not refuse it as unjoined work.
  join_pending_branches();
  recording_.active = false;
  ctx_->recording = false;
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream(), &graph);
  for (void* q : ctx_->frees_after_recording) cudaFreeAsync(q, stream());
  ctx_->frees_after_recording.clear();
  auto refuse = [&](std::string reason) -> std::shared_ptr<StepGraph> {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();  // a failed capture's error is not sticky; clear it for the ops that follow
    if (why) *why = std::move(reason);
    return nullptr;
  };
  if (ended != cudaSuccess || !graph)
    return refuse(fmt::format("the driver ended the recording with {}", cudaGetErrorString(ended)));
  if (!recording_.refused.empty()) return refuse(recording_.refused);
  if (recording_.uploads != 1)
    return refuse(fmt::format("it made {} uploads (a recorded step makes one)", recording_.uploads));
  auto g = std::make_shared<CudaStepGraph>();
  g->ctx = ctx_;
  const cudaError_t made = cudaGraphInstantiate(&g->exec, graph, 0);
  if (made != cudaSuccess) {
    g->exec = nullptr;
    return refuse(fmt::format("cudaGraphInstantiate: {}", cudaGetErrorString(made)));
  }
  cudaGraphDestroy(graph);
  FN_CUDA_CHECK(cudaEventCreateWithFlags(&g->done, cudaEventDisableTiming), "end_step_capture");
  g->staging = std::move(recording_.staging);
  g->staging_bytes = recording_.staging_bytes;
  // The step's tensors stay where they were recorded: the block is the recording's from now on, and the next step
  // that is not replayed takes a new one (of this step's demand).
  g->block = std::move(arena_.block);
  arena_.capacity = 0;
  arena_.used = 0;
  g->generation = memory_generation_;
  recording_ = Recording{};
  ++counters_.graphs_recorded;
  return g;
}

StepReplay CudaOps::replay_step(StepGraph& graph, std::span<const uint8_t> input) {
  auto* g = dynamic_cast<CudaStepGraph*>(&graph);
  FN_CHECK(g && g->ctx == ctx_, "replay_step: the step was recorded by another backend");
  FN_CHECK(!in_step_, "replay_step: inside a step");
  FN_CHECK(input.size() == g->staging_bytes, "replay_step: {} input bytes; the recorded step uploads {}", input.size(),
           g->staging_bytes);
  if (g->generation != memory_generation_) return StepReplay::Stale;
  // Its tensors are rewritten: nothing but the recording (and its output) may still hold them.
  const long own = 1 + (same_memory(graph.output.memory_ref(), g->block) ? 1 : 0);
  if (g->block.use_count() > own) return StepReplay::Busy;
  use_device();
  FN_CUDA_CHECK(cudaEventSynchronize(g->done), "replay_step");  // the last replay's upload has read the staging
  std::memcpy(g->staging.get(), input.data(), input.size());
  FN_CUDA_CHECK(cudaGraphLaunch(g->exec, stream()), "replay_step");
  FN_CUDA_CHECK(cudaEventRecord(g->done, stream()), "replay_step");
  ++counters_.graph_replays;
  return StepReplay::Ran;
}

void CudaOps::copy_rows_indexed(const char* op, const Tensor& src, const Tensor& rows, const Tensor& dst,
                                bool scatter) {
  const size_t row = contract::row_map(spec(), op, scatter ? dst : src, rows, scatter ? src : dst);
  const Tensor& indexed = scatter ? dst : src;
  FN_CHECK(row % 4 == 0, "{}: rows of {} bytes; the kernel copies 4-byte words", op, row);
  FN_CUDA_CHECK(
      detail::launch_copy_rows_indexed(src.data(), dst.data(), dp<int32_t>(rows), rows.dim(0), int64_t(row / 4),
                                       indexed.dim(0), scatter, status(kStatusRows), stream()),
      op);
}

contract::Backend CudaOps::spec() const {
  use_device();
  return {Device::CUDA, ctx_->device, DType::F16, true};
}

void CudaOps::synchronize(const char* where) {
  FN_CHECK(!recording_.active, "{}: waits for the GPU, which a recorded step cannot (it would not run)", where);
  use_device();
  // PLE gathers on the side stream report into the same status words: let them finish first.
  FN_CUDA_CHECK(cudaStreamSynchronize(ctx_->side), where);
  FN_CUDA_CHECK(cudaMemcpyAsync(ctx_->status_host, ctx_->status, sizeof(int32_t) * kStatusSlots,
                                cudaMemcpyDeviceToHost, stream()),
                where);
  FN_CUDA_CHECK(cudaStreamSynchronize(stream()), where);
  std::string what;
  static const char* const kWhat[kStatusSlots] = {
      "embedding: token ids outside the vocabulary (their rows were zeroed)",
      "moe_experts: expert ids outside the expert range (those slots were dropped)",
      "ple_gather: row ids outside the n-gram table (read as zeros)",
      "sparse_attention: cache indices outside the cache (skipped)",
      "sparse_attention: selected positions at or beyond the cache rows (skipped)",
      "gather_rows/scatter_rows: row ids outside the tensor (skipped)"};
  for (int s = 0; s < kStatusSlots; ++s) {
    if (ctx_->status_host[s]) what += fmt::format("{}{}", what.empty() ? "" : "; ", kWhat[s]);
  }
  if (what.empty()) return;
  FN_CUDA_CHECK(cudaMemsetAsync(ctx_->status, 0, sizeof(int32_t) * kStatusSlots, stream()), where);
  FN_CUDA_CHECK(cudaStreamSynchronize(stream()), where);
  fail("cuda backend ({}): invalid input met by the kernels since the last synchronisation: {}", where, what);
}

}  // namespace cuda

GpuMemory cuda_memory_info(int device) {
  FN_CUDA_CHECK(cudaSetDevice(device), "cuda_memory_info");
  size_t free_b = 0, total_b = 0;
  FN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b), "cuda_memory_info");
  return {int64_t(free_b), int64_t(total_b)};
}

CudaDeviceInfo cuda_device_info(int device) {
  CudaDeviceInfo d;
  cudaDeviceProp prop{};
  FN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device), "cuda_device_info");
  d.name = prop.name;
  d.major = prop.major;
  d.minor = prop.minor;
  d.multiprocessors = prop.multiProcessorCount;
  d.memory_bus_bits = prop.memoryBusWidth;
  d.total_bytes = int64_t(prop.totalGlobalMem);
  int khz = 0;
  FN_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device), "cuda_device_info");
  d.sm_clock_mhz = khz / 1000;
  FN_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device), "cuda_device_info");
  d.memory_clock_mhz = khz / 1000;
  FN_CUDA_CHECK(cudaDriverGetVersion(&d.driver_version), "cuda_device_info");
  FN_CUDA_CHECK(cudaRuntimeGetVersion(&d.runtime_version), "cuda_device_info");
  return d;
}

double cuda_launch_cost_us(int device, int launches) {
  FN_CHECK(launches > 0, "cuda_launch_cost_us: {} launches", launches);
  FN_CUDA_CHECK(cudaSetDevice(device), "cuda_launch_cost_us");
  cudaStream_t s = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  FN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cuda_launch_cost_us");
  FN_CUDA_CHECK(cudaEventCreate(&e0), "cuda_launch_cost_us");
  FN_CUDA_CHECK(cudaEventCreate(&e1), "cuda_launch_cost_us");
  for (int i = 0; i < 100; ++i) FN_CUDA_CHECK(cuda::detail::launch_noop(s), "cuda_launch_cost_us");  // warm-up
  FN_CUDA_CHECK(cudaEventRecord(e0, s), "cuda_launch_cost_us");
  for (int i = 0; i < launches; ++i) FN_CUDA_CHECK(cuda::detail::launch_noop(s), "cuda_launch_cost_us");
  FN_CUDA_CHECK(cudaEventRecord(e1, s), "cuda_launch_cost_us");
  FN_CUDA_CHECK(cudaEventSynchronize(e1), "cuda_launch_cost_us");
  float ms = 0;
  FN_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1), "cuda_launch_cost_us");
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(s);
  return 1e3 * double(ms) / launches;
}

namespace {
// query() asked with GPU `device` current, the caller's device restored after (`what` names the query in errors).
template <class Query>
bool ask_on_device(int device, const char* what, Query&& query) {
  int current = 0;
  FN_CUDA_CHECK(cudaGetDevice(&current), what);
  FN_CUDA_CHECK(cudaSetDevice(device), fmt::format("{} (device {})", what, device));
  const bool answer = query();
  FN_CUDA_CHECK(cudaSetDevice(current), what);
  return answer;
}
}  // namespace

bool cuda_programmatic_launch(int device) {
  if (cuda::detail::programmatic_launch_setting().load() == 0) return false;
  return ask_on_device(device, "cuda_programmatic_launch",
                       [] { return cuda::detail::kernels_wait_for_dependencies(); });
}

bool cuda_w4a16_gemv_tensor_cores(int device) {
  return ask_on_device(device, "cuda_w4a16_gemv_tensor_cores", [] { return cuda::moe_w4a16_gemv_tensor_cores(); });
}

void set_cuda_programmatic_launch(bool allowed) {
  cuda::detail::programmatic_launch_setting().store(allowed ? 1 : 0);
}

CudaMemoryCounters cuda_memory_counters(const Ops& ops) {
  const auto* c = dynamic_cast<const cuda::CudaOps*>(&ops);
  FN_CHECK(c, "cuda_memory_counters: {} is not a CUDA backend", ops.name());
  return c->memory_counters();
}

std::shared_ptr<Ops> make_cuda_ops(int device) {
  return make_cuda_ops(device, CudaOpsOptions::from_env());
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

std::shared_ptr<Ops> make_cuda_ops(int device, const CudaOpsOptions& options) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    fail(
        "no CUDA device found (cudaGetDeviceCount: {}: {}); run with --device cpu, or on a machine with an NVIDIA "
        "GPU and driver",
        cudaGetErrorName(err), cudaGetErrorString(err));
  }
  if (count == 0) fail("no CUDA device found (cudaGetDeviceCount reports 0 devices); run with --device cpu");
  FN_CHECK(device >= 0 && device < count, "CUDA device {} does not exist: this machine has {} (0..{})", device, count,
           count - 1);
  return std::make_shared<cuda::CudaOps>(device, options);
}

}  // namespace flashnext
