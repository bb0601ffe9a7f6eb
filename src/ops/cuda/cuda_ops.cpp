// CUDA backend of the ops interface: argument checks, memory, and the glue from Tensors to the kernel launchers.
// See cuda_ops.h for the precision and memory model.
#include "ops/cuda/cuda_ops.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ops/cpu/topk.h"
#include "ops/cuda/blas.h"
#include "ops/cuda/buffer.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_ops_kernels.h"
#include "ops/cuda/gdn_kernels.h"
#include "ops/cuda/hc_kernels.h"
#include "ops/cuda/moe_kernels.h"
#include "ops/cuda/moe_w4a16.h"
#include "ops/cuda/norm_kernels.h"
#include "ops/cuda/ple_kernels.h"
#include "ops/cuda/qsa.h"
#include "ops/cuda/qsa_kernels.h"
#include "ops/cuda/random_kernels.h"
#include "ops/cuda/sampling.h"

namespace flashnext {

CudaOpsOptions CudaOpsOptions::from_env() {
  CudaOpsOptions o;
  if (const char* v = std::getenv("FLASHNEXT_PLE_TABLE"); v && *v) {
    const std::string s = v;
    if (s == "host")
      o.ple_table = PleTablePlacement::Host;
    else if (s == "device")
      o.ple_table = PleTablePlacement::Device;
    else
      fail("FLASHNEXT_PLE_TABLE must be 'host' or 'device', got '{}'", s);
  }
  if (const char* v = std::getenv("FLASHNEXT_CUDA_ACTIVATIONS"); v && *v) {
    const std::string s = v;
    if (s == "fp16x2")
      o.activations = ActivationPrecision::Fp16x2;
    else if (s == "fp16")
      o.activations = ActivationPrecision::Fp16;
    else
      fail("FLASHNEXT_CUDA_ACTIVATIONS must be 'fp16x2' or 'fp16', got '{}'", s);
  }
  return o;
}

namespace cuda {
namespace {

// Slots of the device status words: kernels OR error bits into their op's slot; every download reads them.
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
  cudaStream_t side = nullptr;     // PLE gathers started ahead of their layer (ple_gather_start)
  int32_t* status = nullptr;       // device [kStatusSlots]
  int32_t* status_host = nullptr;  // pinned [kStatusSlots]

  explicit Context(int dev) : device(dev) {
    FN_CUDA_CHECK(cudaSetDevice(dev), "cuda backend: cudaSetDevice");
    FN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cuda backend: stream");
    FN_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "cuda backend: side stream");
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
  ~Context() {  // errors ignored: at process exit the runtime may already be gone
    if (stream) cudaStreamSynchronize(stream);
    if (side) cudaStreamSynchronize(side);
    if (status) cudaFree(status);
    if (status_host) cudaFreeHost(status_host);
    if (stream) cudaStreamDestroy(stream);
    if (side) cudaStreamDestroy(side);
  }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
};

template <class T>
T* dp(const Tensor& t) {
  return static_cast<T*>(t.data());
}

int to_int(int64_t v, const char* op, const char* what) {
  FN_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(), "{}: {} = {} exceeds the kernels' 32-bit range", op, what,
           v);
  return int(v);
}

/// Routed experts repacked for the W4A16 kernels (moe_w4a16.h): gate and up fused as gate_up [E, 2I, H], down
/// [E, H, I], in device memory of GPU `device`.
class CudaW4Experts final : public PackedExperts {
 public:
  CudaW4Experts(const W4Packed& gu, const W4Packed& dn, int device_, std::string what)
      : gate_up(gu),
        down(dn),
        device(device_),
        experts(gu.experts),
        hidden(gu.cols),
        inter(dn.cols),
        bytes_(int64_t(gu.expert_bytes() + dn.expert_bytes()) * gu.experts),
        format_(std::move(what)) {}
  /// Experts already on the device (random ones: W4DeviceMatrix::random_nvfp4).
  CudaW4Experts(W4DeviceMatrix gu, W4DeviceMatrix dn, int device_, int E, int H, int I, std::string what)
      : gate_up(std::move(gu)),
        down(std::move(dn)),
        device(device_),
        experts(E),
        hidden(H),
        inter(I),
        bytes_(int64_t(E) * int64_t(gate_up.expert_bytes() + down.expert_bytes())),
        format_(std::move(what)) {}
  std::string format() const override { return format_; }
  int64_t device_bytes() const override { return bytes_; }

  W4DeviceMatrix gate_up, down;
  int device, experts, hidden, inter;

 private:
  int64_t bytes_;
  std::string format_;
};

/// An aligned copy of a little-endian checkpoint array (which may be unaligned in the mapping).
template <class T>
std::vector<T> host_copy(const HostArray& a) {
  std::vector<T> v(size_t(shape_numel(a.shape)));
  if (!v.empty()) std::memcpy(v.data(), a.data, v.size() * sizeof(T));
  return v;
}

/// A float copy of a BF16 / F16 / F32 checkpoint array (exact).
std::vector<float> float_copy(const HostArray& a, const std::string& what) {
  FN_CHECK(a.defined() && (a.dtype == DType::BF16 || a.dtype == DType::F16 || a.dtype == DType::F32),
           "load_quantized_experts: {} must be BF16, F16 or F32, got {}", what,
           a.defined() ? dtype_name(a.dtype) : "nothing");
  std::vector<float> v(size_t(shape_numel(a.shape)));
  convert_to_float(a.dtype, a.data, v.data(), v.size());
  return v;
}

class CudaOps final : public Ops {
 public:
  CudaOps(int device, const CudaOpsOptions& options) : ctx_(std::make_shared<Context>(device)), options_(options) {
    cudaDeviceProp prop{};
    FN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device), "cuda backend: device properties");
    name_ = fmt::format(
        "cuda:{} ({}, sm_{}{}; FP16 weights, FP32 activations, {} GEMM inputs; PLE tables in {} "
        "memory)",
        device, prop.name, prop.major, prop.minor, split() ? "FP16x2" : "FP16",
        options.ple_table == PleTablePlacement::Host ? "pinned host" : "GPU");
  }
  ~CudaOps() override {
    if (ctx_->side) cudaStreamSynchronize(ctx_->side);  // gathers begun but never waited for (a failed step)
    for (PendingGather& g : pending_gathers_) cudaEventDestroy(g.done);
    for (cudaEvent_t e : profile_events_) cudaEventDestroy(e);
    if (ctx_->stream) cudaStreamSynchronize(ctx_->stream);
  }

  Device device() const override { return Device::CUDA; }
  std::string name() const override { return name_; }

  // ------------------------------------------------------------------------------------------------ memory

  Tensor empty(const Shape& shape, DType dtype) override { return alloc(shape, dtype, "tensor"); }

  Tensor zeros(const Shape& shape, DType dtype) override {
    Tensor t = alloc(shape, dtype, "tensor");
    fill_zero(t);
    return t;
  }

  Tensor upload(const void* host, DType dtype, const Shape& shape) override {
    Tensor t = alloc(shape, dtype, "upload");
    if (t.nbytes()) {
      FN_CHECK(host, "upload: null host pointer for {}", t.str());
      FN_CUDA_CHECK(cudaMemcpyAsync(t.data(), host, t.nbytes(), cudaMemcpyHostToDevice, stream()), "upload");
    }
    return t;
  }

  void download(const Tensor& t, void* host) override {
    check_device(t, "download", "tensor");
    if (t.nbytes()) FN_CUDA_CHECK(cudaMemcpyAsync(host, t.data(), t.nbytes(), cudaMemcpyDefault, stream()), "download");
    synchronize("download");
  }

  void synchronize() override { synchronize("synchronize"); }

  Tensor load_weight(const void* host, DType dtype, const Shape& shape) override {
    FN_CHECK(dtype == DType::BF16 || dtype == DType::F16 || dtype == DType::F32,
             "load_weight: weights must be BF16, F16 or F32, got {}", dtype_name(dtype));
    Tensor t = alloc(shape, DType::F16, "weight");
    const int64_t n = t.numel();
    if (n == 0) return t;
    if (dtype == DType::F16) {
      FN_CUDA_CHECK(cudaMemcpyAsync(t.data(), host, t.nbytes(), cudaMemcpyHostToDevice, stream()), "load_weight");
      return t;
    }
    // Raw checkpoint bytes to the GPU, converted there; stats = {values outside FP16, bits of the largest |x|}.
    Tensor raw = alloc({n}, dtype, "weight staging");
    Tensor stats = alloc({2}, DType::I32, "weight range");
    FN_CUDA_CHECK(cudaMemcpyAsync(raw.data(), host, raw.nbytes(), cudaMemcpyHostToDevice, stream()), "load_weight");
    FN_CUDA_CHECK(cudaMemsetAsync(stats.data(), 0, stats.nbytes(), stream()), "load_weight");
    FN_CUDA_CHECK(detail::launch_weight_to_f16(raw.data(), dtype == DType::BF16 ? detail::kSrcBF16 : detail::kSrcF32,
                                               dp<__half>(t), n, dp<uint32_t>(stats), stream()),
                  "load_weight");
    uint32_t s[2] = {0, 0};
    FN_CUDA_CHECK(cudaMemcpyAsync(s, stats.data(), sizeof s, cudaMemcpyDeviceToHost, stream()), "load_weight");
    synchronize("load_weight");
    if (s[0] != 0) {
      float mx = 0;
      std::memcpy(&mx, &s[1], sizeof mx);
      fail(
          "load_weight: {} of the {} values of this {} [{}] tensor lie outside the FP16 range (|x| > 65504, or not "
          "finite; the largest finite |x| is {:g}); the CUDA backend stores weights in FP16 and cannot run it",
          s[0], n, dtype_name(dtype), fmt::join(shape, ", "), mx);
    }
    return t;
  }

  Tensor map_host_table(const void* host, DType dtype, const Shape& shape,
                        std::shared_ptr<const void> keepalive) override {
    FN_CHECK(dtype == DType::BF16 || dtype == DType::F16 || dtype == DType::F32 || dtype == DType::F8_E4M3,
             "map_host_table: table must be BF16, F16, F32 or F8_E4M3, got {}", dtype_name(dtype));
    if (dtype == DType::F32) return load_weight(host, dtype, shape);  // FP32 tables: an FP16 copy on the GPU
    const size_t bytes = size_t(shape_numel(shape)) * dtype_size(dtype);
    if (options_.ple_table == PleTablePlacement::Device) return upload(host, dtype, shape);
    // Exact-size pinned copy, mapped into the device's address space; freed with the last tensor handle.
    auto pinned = std::make_shared<PinnedMemory>(bytes, fmt::format("a PLE table shard [{}]", fmt::join(shape, ", ")));
    if (bytes) std::memcpy(pinned->host(), host, bytes);
    void* dev = const_cast<void*>(pinned->device());
    return Tensor(std::move(pinned), dev, dtype, shape, Device::CUDA, ctx_->device);
  }

  /// Pinned, mapped host memory (the placement of map_host_table's host tables, whatever options_.ple_table says).
  HostTable host_table(DType dtype, const Shape& shape) override {
    FN_CHECK(dtype == DType::BF16 || dtype == DType::F16 || dtype == DType::F8_E4M3,
             "host_table: tables are BF16, F16 or F8_E4M3, got {}", dtype_name(dtype));
    for (int64_t d : shape) FN_CHECK(d >= 0, "host_table: negative dimension in [{}]", fmt::join(shape, ", "));
    use_device();
    const size_t bytes = size_t(shape_numel(shape)) * dtype_size(dtype);
    auto pinned = std::make_shared<PinnedMemory>(bytes, fmt::format("a [{}] {} host table", fmt::join(shape, ", "),
                                                                    dtype_name(dtype)));
    void* host = pinned->host();
    void* dev = const_cast<void*>(pinned->device());
    return {Tensor(std::move(pinned), dev, dtype, shape, Device::CUDA, ctx_->device), host};
  }

  Tensor random_weight(const Shape& shape, float lo, float hi, uint64_t seed) override {
    FN_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi,
             "random_weight: bounds [{}, {}] are not an interval", lo, hi);
    FN_CHECK(std::max(std::fabs(lo), std::fabs(hi)) <= 65504.f,
             "random_weight: bounds [{}, {}] exceed the FP16 range of the CUDA backend's weights", lo, hi);
    Tensor t = alloc(shape, DType::F16, "random weight");
    FN_CUDA_CHECK(detail::launch_random_f16(dp<__half>(t), t.numel(), lo, hi, seed, stream()), "random_weight");
    return t;
  }

  /// W4A16 experts in the NVFP4 layout (moe_w4a16.h W4DeviceMatrix::random_nvfp4): gate_up [E, 2I, H] and down
  /// [E, H, I] with global scales sqrt(1 / in) / rms(E2M1), rms(E2M1) = sqrt(68.5 / 8) over the 16 equally likely
  /// codes.
  RoutedExperts random_experts(int64_t E, int64_t I, int64_t H, uint64_t seed) override {
    const char* op = "random_experts";
    FN_CHECK(E > 0 && I > 0 && H > 0, "{}: {} experts of [{}, {}]: need positive sizes", op, E, I, H);
    if (H % 8 != 0 || I % 8 != 0 || E > detail::kMoeMaxExperts) return Ops::random_experts(E, I, H, seed);
    use_device();
    const double rms = std::sqrt(68.5 / 8.0);
    auto gu = W4DeviceMatrix::random_nvfp4(to_int(E, op, "experts"), to_int(2 * I, op, "rows"), int(H),
                                           float(std::sqrt(1.0 / double(H)) / rms), seed, stream());
    auto dn = W4DeviceMatrix::random_nvfp4(int(E), int(H), int(I), float(std::sqrt(1.0 / double(I)) / rms), seed + 1,
                                           stream());
    RoutedExperts r;
    r.packed = std::make_shared<CudaW4Experts>(std::move(gu), std::move(dn), ctx_->device, int(E), int(H), int(I),
                                               "w4a16 (random, nvfp4 layout)");
    return r;
  }

  /// NVFP4 (ModelOpt, compressed-tensors) and int4 (compressed-tensors, GPTQ) experts are repacked once into the
  /// W4A16 layout (moe_w4a16.h W4Packed: lossless) and uploaded; FP8-block experts, and geometries the W4A16
  /// kernels do not take (H or I not a multiple of 8, an int4 group that is not), take the default path:
  /// dequantized exactly to float32 on the host, stored as FP16 weights.
  RoutedExperts load_quantized_experts(const QuantExperts& q) override {
    const char* op = "load_quantized_experts";
    const int64_t E = q.experts, H = q.hidden, I = q.inter;
    FN_CHECK(E > 0 && int64_t(q.gate.size()) == E && int64_t(q.up.size()) == E && int64_t(q.down.size()) == E,
             "{}: {}: {} experts but {} / {} / {} gate / up / down matrices", op, q.name, E, q.gate.size(), q.up.size(),
             q.down.size());
    const QuantKind kind = q.gate[0].format;
    const bool nvfp4 = kind == QuantKind::Nvfp4 || kind == QuantKind::CtNvfp4;
    const bool int4 = kind == QuantKind::CtInt4 || kind == QuantKind::Gptq;
    const int64_t g_gu = nvfp4 ? 16 : q.gate[0].group, g_dn = nvfp4 ? 16 : q.down[0].group;
    if ((!nvfp4 && !int4) || H % 8 != 0 || I % 8 != 0 || g_gu % 8 != 0 || g_dn % 8 != 0 || E > detail::kMoeMaxExperts) {
      return Ops::load_quantized_experts(q);
    }
    use_device();
    const bool zeros = kind == QuantKind::Gptq || (kind == QuantKind::CtInt4 && q.gate[0].zero_point.defined());
    const W4Format f = nvfp4 ? W4Format::Nvfp4 : W4Format::Int4;
    W4Packed gu(f, int(E), int(2 * I), int(H), int(g_gu), zeros), dn(f, int(E), int(H), int(I), int(g_dn), zeros);
    for (int64_t e = 0; e < E; ++e) {
      pack_rows(gu, e, 0, q.gate[size_t(e)], kind, I, H, g_gu, zeros);
      pack_rows(gu, e, I, q.up[size_t(e)], kind, I, H, g_gu, zeros);
      pack_rows(dn, e, 0, q.down[size_t(e)], kind, H, I, g_dn, zeros);
    }
    const char* src = kind == QuantKind::Nvfp4     ? "nvfp4-modelopt"
                      : kind == QuantKind::CtNvfp4 ? "nvfp4-compressed-tensors"
                      : kind == QuantKind::CtInt4  ? "int4-compressed-tensors"
                                                   : "int4-gptq";
    RoutedExperts r;
    r.packed = std::make_shared<CudaW4Experts>(gu, dn, ctx_->device, fmt::format("w4a16 ({})", src));
    return r;
  }

  void copy_rows(const Tensor& src, int64_t src_row, const Tensor& dst, int64_t dst_row, int64_t n) override {
    check_device(src, "copy_rows", "src");
    check_device(dst, "copy_rows", "dst");
    FN_CHECK(src.rank() >= 1 && dst.rank() >= 1 && src.dtype() == dst.dtype(), "copy_rows: {} -> {}: dtype differs",
             src.str(), dst.str());
    const size_t row = src.dim(0) ? src.nbytes() / size_t(src.dim(0)) : 0;
    const size_t drow = dst.dim(0) ? dst.nbytes() / size_t(dst.dim(0)) : 0;
    FN_CHECK(n == 0 || row == drow, "copy_rows: row sizes of {} and {} differ", src.str(), dst.str());
    FN_CHECK(n >= 0 && src_row >= 0 && dst_row >= 0 && src_row + n <= src.dim(0) && dst_row + n <= dst.dim(0),
             "copy_rows: rows [{}, +{}) of {} -> [{}, +{}) of {} out of range", src_row, n, src.str(), dst_row, n,
             dst.str());
    if (n == 0 || row == 0) return;
    FN_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(dst.data()) + size_t(dst_row) * row,
                                  static_cast<const uint8_t*>(src.data()) + size_t(src_row) * row, size_t(n) * row,
                                  cudaMemcpyDefault, stream()),
                  "copy_rows");
  }

  void fill_zero(const Tensor& t) override {
    check_device(t, "fill_zero", "tensor");
    if (t.nbytes()) FN_CUDA_CHECK(cudaMemsetAsync(t.data(), 0, t.nbytes(), stream()), "fill_zero");
  }

  void gather_rows(const Tensor& src, const Tensor& rows, const Tensor& dst) override {
    copy_rows_indexed("gather_rows", src, rows, dst, /*scatter=*/false);
  }

  void scatter_rows(const Tensor& src, const Tensor& rows, const Tensor& dst) override {
    copy_rows_indexed("scatter_rows", src, rows, dst, /*scatter=*/true);
  }

  // ------------------------------------------------------------------------------------------------ dense

  void embedding(const Tensor& table, const Tensor& ids, const Tensor& out) override {
    const char* op = "embedding";
    check(table, DType::F16, 2, op, "table");
    check(ids, DType::I32, 1, op, "ids");
    check(out, DType::F32, 2, op, "out");
    const int64_t V = table.dim(0), H = table.dim(1), T = ids.dim(0);
    FN_CHECK(out.dim(0) == T && H > 0 && out.dim(1) % H == 0, "embedding: out {} does not fit table {} and {} ids",
             out.str(), table.str(), T);
    FN_CUDA_CHECK(detail::launch_embedding_f32(dp<__half>(table), V, to_int(H, op, "hidden"), dp<int32_t>(ids),
                                               to_int(T, op, "tokens"), int(out.dim(1) / H), dp<float>(out),
                                               status(kStatusEmbedding), stream()),
                  op);
  }

  void linear(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& bias) override {
    const char* op = "linear";
    check(x, DType::F32, 2, op, "x");
    check(w, DType::F16, 2, op, "weight");
    check(y, DType::F32, 2, op, "y");
    FN_CHECK(x.dim(1) == w.dim(1) && y.dim(0) == x.dim(0) && y.dim(1) == w.dim(0),
             "linear: shapes do not match: x {}, weight {}, y {}", x.str(), w.str(), y.str());
    if (bias.defined()) {
      check(bias, DType::F16, 1, op, "bias");
      FN_CHECK(bias.dim(0) == w.dim(0), "linear: bias {} does not fit weight {}", bias.str(), w.str());
    }
    product(x, w, y, bias, op);
  }

  /// One decode GEMV launch for the whole group when it qualifies (gemv_group), else a product per weight.
  void linear_group(const Tensor& x, std::span<const Tensor> w, std::span<const Tensor> y,
                    std::span<const Tensor> bias) override {
    const char* op = "linear_group";
    FN_CHECK(w.size() == y.size() && (bias.empty() || bias.size() == w.size()) && !w.empty(),
             "{}: {} weights, {} outputs and {} biases", op, w.size(), y.size(), bias.size());
    check(x, DType::F32, 2, op, "x");
    for (size_t i = 0; i < w.size(); ++i) {
      check(w[i], DType::F16, 2, op, "weight");
      check(y[i], DType::F32, 2, op, "y");
      FN_CHECK(x.dim(1) == w[i].dim(1) && y[i].dim(0) == x.dim(0) && y[i].dim(1) == w[i].dim(0),
               "{}: shapes do not match: x {}, weight {} {}, y {}", op, x.str(), i, w[i].str(), y[i].str());
      if (!bias.empty() && bias[i].defined()) {
        check(bias[i], DType::F16, 1, op, "bias");
        FN_CHECK(bias[i].dim(0) == w[i].dim(0), "{}: bias {} does not fit weight {}", op, bias[i].str(), w[i].str());
      }
    }
    if (x.dim(0) == 0 || gemv_group(x, w, y, bias, op)) return;
    for (size_t i = 0; i < w.size(); ++i) product(x, w[i], y[i], bias.empty() ? Tensor() : bias[i], op);
  }

  void zc_rms_norm(const Tensor& x, const Tensor& w, int64_t group, double eps, const Tensor& y) override {
    const char* op = "zc_rms_norm";
    check(x, DType::F32, 2, op, "x");
    check(w, DType::F16, -1, op, "weight");
    check(y, DType::F32, 2, op, "y");
    const int64_t T = x.dim(0), L = x.dim(1), W = w.numel();
    FN_CHECK(y.shape() == x.shape() && group > 0 && W > 0 && L % W == 0 && W % group == 0,
             "zc_rms_norm: x {}, weight {}, group {}, y {} do not fit", x.str(), w.str(), group, y.str());
    FN_CUDA_CHECK(detail::launch_zc_rmsnorm(dp<const float>(x), L, dp<float>(y), L, dp<__half>(w), to_int(W, op, "W"),
                                            to_int(T, op, "rows"), to_int(L, op, "width"), to_int(group, op, "group"),
                                            float(eps), stream()),
                  op);
  }

  // ------------------------------------------------------------------------------------------------ hyper-connections

  void hc_read(const Tensor& X, const HcWeights& hc, double eps, const Tensor& u, const Tensor& inj) override {
    const char* op = "hc_read";
    check(X, DType::F32, 2, op, "X");
    check(u, DType::F32, 2, op, "u");
    check(hc.norm, DType::F16, 1, op, "hc_norm");
    check(hc.down, DType::F16, 2, op, "input_mix_weight_down");
    check(hc.up, DType::F16, 2, op, "input_mix_weight_up");
    const int64_t T = X.dim(0), W = X.dim(1), H = u.dim(1);
    FN_CHECK(u.dim(0) == T && H > 0 && W % H == 0 && W / H > 1, "hc_read: X {} and u {} do not fit", X.str(), u.str());
    const int64_t S = W / H, R = hc.down.dim(0);
    FN_CHECK(S <= detail::kHcMaxStreams, "hc_read: {} hyper-connection streams, the kernels take at most {}", S,
             detail::kHcMaxStreams);
    FN_CHECK(hc.norm.dim(0) == W && hc.down.dim(1) == W && hc.up.dim(0) == W && hc.up.dim(1) == R,
             "hc_read: weights hc_norm {}, down {}, up {} do not fit X {}", hc.norm.str(), hc.down.str(), hc.up.str(),
             X.str());
    const bool with_inject = hc.inject.defined();
    if (with_inject) {
      check(hc.inject, DType::F16, 2, op, "block_inject_weight");
      check(inj, DType::F32, 2, op, "inj");
      FN_CHECK(hc.inject.dim(0) == S && hc.inject.dim(1) == W && inj.dim(0) == T && inj.dim(1) == S,
               "hc_read: block_inject_weight {} / inj {} do not fit X {}", hc.inject.str(), inj.str(), X.str());
    }
    const int t = to_int(T, op, "tokens"), w = to_int(W, op, "width"), r = to_int(R, op, "rank");
    if (t == 0) return;
    const auto aligned = [](const Tensor& x) { return reinterpret_cast<uintptr_t>(x.data()) % 16 == 0; };
    if (t <= detail::kGemvMaxTokens && S <= 8 && H % 8 == 0 && R % 8 == 0 && aligned(X) && aligned(hc.norm) &&
        aligned(hc.down) && aligned(hc.up) && (!with_inject || aligned(hc.inject))) {
      // Decode: float32 throughout, two launches (norm statistics + down and inject rows; up rows + mix).
      Tensor scratch = alloc({T * (R + S)}, DType::F32, "hc_read scratch");
      FN_CUDA_CHECK(detail::launch_hc_read_decode(dp<const float>(X), dp<__half>(hc.norm), dp<__half>(hc.down),
                                                  dp<__half>(hc.up), with_inject ? dp<__half>(hc.inject) : nullptr, t,
                                                  int(S), int(H), r, float(eps), dp<float>(scratch), dp<float>(u),
                                                  with_inject ? dp<float>(inj) : nullptr, stream()),
                    "hc_read decode");
      return;
    }
    if (split()) {  // float32 throughout, products with FP16x2 inputs
      Tensor n = alloc({T, W}, DType::F32, "hc_read normed"), d = alloc({T, R}, DType::F32, "hc_read down");
      Tensor m = alloc({T, W}, DType::F32, "hc_read mix");
      FN_CUDA_CHECK(detail::launch_zc_rmsnorm(dp<const float>(X), W, dp<float>(n), W, dp<__half>(hc.norm), w, t, w,
                                              int(H), float(eps), stream()),
                    "hc_read norm");
      product(n, hc.down, d, Tensor(), "hc_read input_mix_weight_down");
      FN_CUDA_CHECK(
          detail::launch_silu_scale_f32(dp<const float>(d), dp<float>(d), d.numel(), 1.f / float(S), stream()),
          "hc_read silu");
      product(d, hc.up, m, Tensor(), "hc_read input_mix_weight_up");
      FN_CUDA_CHECK(
          detail::launch_hc_mix_f32(dp<const float>(m), dp<const float>(n), dp<float>(u), t, int(S), int(H), stream()),
          "hc_read mix");
      if (with_inject) {
        FN_CUDA_CHECK(detail::launch_linear_f32_narrow(dp<const float>(n), dp<__half>(hc.inject), dp<float>(inj), t, w,
                                                       int(S), stream()),
                      "hc_read block_inject_weight");
        FN_CUDA_CHECK(detail::launch_inject_weights_f32(dp<float>(inj), inj.numel(), 1.f / float(S), stream()),
                      "hc_read inject weights");
      }
      return;
    }
    Tensor n = alloc({T, W}, DType::F16, "hc_read normed"), d = alloc({T, R}, DType::F32, "hc_read down");
    Tensor a = alloc({T, R}, DType::F16, "hc_read act"), m = alloc({T, W}, DType::F16, "hc_read mix");
    FN_CUDA_CHECK(
        detail::launch_hc_norm(dp<float>(X), static_cast<const float*>(nullptr), nullptr, dp<__half>(hc.norm),
                               with_inject ? dp<__half>(hc.inject) : nullptr, dp<__half>(n),
                               with_inject ? dp<float>(inj) : nullptr, t, int(S), int(H), float(eps), stream()),
        "hc_read norm");
    blas_.linear(dp<__half>(n), t, w, dp<__half>(hc.down), r, d.data(), OutType::F32, r, stream(),
                 "hc_read input_mix_weight_down");
    FN_CUDA_CHECK(detail::launch_hc_act(dp<float>(d), dp<__half>(a), t, r, int(S), stream()), "hc_read silu");
    blas_.linear(dp<__half>(a), t, r, dp<__half>(hc.up), w, m.data(), OutType::F16, w, stream(),
                 "hc_read input_mix_weight_up");
    FN_CUDA_CHECK(detail::launch_hc_mix(dp<__half>(m), dp<__half>(n), dp<float>(u), t, int(S), int(H), stream()),
                  "hc_read mix");
  }

  void hc_inject(const Tensor& X, const Tensor& out, const Tensor& inj) override {
    const char* op = "hc_inject";
    check(X, DType::F32, 2, op, "X");
    check(out, DType::F32, 2, op, "out");
    check(inj, DType::F32, 2, op, "inj");
    const int64_t T = X.dim(0), H = out.dim(1), S = inj.dim(1);
    FN_CHECK(out.dim(0) == T && inj.dim(0) == T && X.dim(1) == S * H, "hc_inject: X {}, out {}, inj {} do not fit",
             X.str(), out.str(), inj.str());
    FN_CUDA_CHECK(
        detail::launch_hc_inject(dp<float>(X), dp<const float>(out), dp<const float>(inj), to_int(T, op, "tokens"),
                                 to_int(S, op, "streams"), to_int(H, op, "hidden"), stream()),
        op);
  }

  // ------------------------------------------------------------------------------------------------ Gated DeltaNet

  void gdn_conv(const Tensor& qkv, const Tensor& weight, const Tensor& state) override {
    const char* op = "gdn_conv";
    check(qkv, DType::F32, 2, op, "qkv");
    check(weight, DType::F16, 2, op, "weight");
    check(state, DType::F32, 2, op, "state");
    const int64_t T = qkv.dim(0), C = qkv.dim(1), K = weight.dim(1);
    FN_CHECK(weight.dim(0) == C && K >= 1 && state.dim(0) == K - 1 && state.dim(1) == C,
             "gdn_conv: qkv {}, weight {}, state {} do not fit", qkv.str(), weight.str(), state.str());
    if (T == 0) return;
    Tensor y = alloc(qkv.shape(), DType::F32, "gdn_conv output");
    FN_CUDA_CHECK(detail::launch_gdn_conv_f32(dp<const float>(qkv), dp<float>(y), dp<float>(state), dp<__half>(weight),
                                              to_int(T, op, "tokens"), to_int(C, op, "channels"),
                                              to_int(K, op, "kernel"), stream()),
                  op);
    FN_CUDA_CHECK(cudaMemcpyAsync(qkv.data(), y.data(), qkv.nbytes(), cudaMemcpyDeviceToDevice, stream()), op);
  }

  void gdn_chunked(const Tensor& qkv, const Tensor& a, const Tensor& b, const GdnWeights& w, const GdnDims& dims,
                   const Tensor& state, const Tensor& o) override {
    gdn_rule("gdn_chunked", qkv, a, b, w, dims, state, o, /*chunked=*/true);
  }

  void gdn_recurrent(const Tensor& qkv, const Tensor& a, const Tensor& b, const GdnWeights& w, const GdnDims& dims,
                     const Tensor& state, const Tensor& o) override {
    gdn_rule("gdn_recurrent", qkv, a, b, w, dims, state, o, /*chunked=*/false);
  }

  // ------------------------------------------------------------------------------------------------ profiling

  /// An event on the stream per mark (events reused across set_profiling calls).
  void profile_phase(const char* phase) override {
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

  void set_profiling(bool on) override {
    profiling_ = on;
    profile_marks_.clear();
  }

  std::vector<std::pair<std::string, double>> profile_times() override {
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

  // ------------------------------------------------------------------------------------------------ sampling

  bool samples_on_device() const override { return true; }

  std::vector<int32_t> sample_tokens(const Tensor& logits, std::span<const TokenSampling> params) override {
    const char* op = "sample_tokens";
    check(logits, DType::F32, 2, op, "logits");
    const int64_t rows = logits.dim(0), vocab = logits.dim(1);
    FN_CHECK(int64_t(params.size()) == rows, "{}: {} parameter rows for logits {}", op, params.size(), logits.str());
    std::vector<int32_t> out(static_cast<size_t>(rows));
    if (rows == 0) return out;
    std::vector<SamplingParams> sp(params.size());
    for (size_t r = 0; r < params.size(); ++r) {
      const TokenSampling& p = params[r];
      FN_CHECK(std::isfinite(p.temperature) && std::isfinite(p.top_p) && std::isfinite(p.min_p),
               "{}: row {} has a non-finite temperature, top_p or min_p", op, r);
      sp[r] = SamplingParams{p.temperature, p.top_k, p.top_p, p.min_p, p.seed, p.offset};
    }
    Tensor params_d = upload(sp.data(), DType::U8, {int64_t(sp.size() * sizeof(SamplingParams))});
    Tensor tokens = alloc({rows}, DType::I32, "sampled tokens");
    sample_tokens_kernel(logits, params_d, tokens, to_int(rows, op, "rows"), to_int(vocab, op, "vocab"));
    download(tokens, out.data());
    return out;
  }

  /// A decode step (one token per sequence): one conv-update launch over the state slots; else per sequence.
  void gdn_conv_batch(const Tensor& qkv, const Tensor& weight, const Tensor& state_pool,
                      const StepBatch& batch) override {
    const char* op = "gdn_conv_batch";
    check(state_pool, DType::F32, 3, op, "state pool");
    if (!all_decode(batch, state_pool, op)) return Ops::gdn_conv_batch(qkv, weight, state_pool, batch);
    check(qkv, DType::F32, 2, op, "qkv");
    check(weight, DType::F16, 2, op, "weight");
    const int64_t B = qkv.dim(0), C = qkv.dim(1), K = weight.dim(1);
    FN_CHECK(
        B == batch.num_tokens && weight.dim(0) == C && K >= 1 && state_pool.dim(1) == K - 1 && state_pool.dim(2) == C,
        "{}: qkv {}, weight {}, state pool {} do not fit a step of {} tokens", op, qkv.str(), weight.str(),
        state_pool.str(), batch.num_tokens);
    FN_CUDA_CHECK(
        detail::launch_conv_decode_slots(dp<const float>(qkv), nullptr, dp<float>(qkv), false, dp<float>(state_pool),
                                         dp<int32_t>(batch.slots), dp<__half>(weight), to_int(B, op, "sequences"),
                                         to_int(C, op, "channels"), to_int(K, op, "kernel"), 1, stream()),
        op);
  }

  /// One launch for the whole step over the state slots: the recurrence for a decode step, else the chunked form.
  void gdn_rule_batch(const Tensor& qkv, const Tensor& a, const Tensor& b, const GdnWeights& w, const GdnDims& dims,
                      const Tensor& state_pool, const StepBatch& batch, const Tensor& o) override {
    const char* op = "gdn_rule_batch";
    check(state_pool, DType::F32, 4, op, "state pool");
    FN_CHECK(state_pool.dim(1) == dims.num_v_heads && state_pool.dim(2) == dims.k_head_dim &&
                 state_pool.dim(3) == dims.v_head_dim,
             "{}: state pool {} is not [slots, {}, {}, {}]", op, state_pool.str(), dims.num_v_heads, dims.k_head_dim,
             dims.v_head_dim);
    for (int32_t slot : batch.slot_ids)
      FN_CHECK(slot >= 0 && slot < state_pool.dim(0), "{}: state slot {} outside the pool {}", op, slot,
               state_pool.str());
    // Shapes as gdn_recurrent checks them, with slot 0's state standing for every slot. A decode step takes the
    // recurrence over the slots, any other step the chunked form over every sequence's rows (cu_seqlens) in one
    // launch (a decode token among prefill chunks then goes through the chunked form: equal up to rounding).
    gdn_rule(op, qkv, a, b, w, dims, state_pool.rows(0, 1).view({dims.num_v_heads, dims.k_head_dim, dims.v_head_dim}),
             o, /*chunked=*/batch.num_tokens != batch.num_seqs, &batch, &state_pool);
  }

  /// A decode step: one conv-add launch for all sequences over the state slots; else per sequence.
  void ple_conv_add_batch(const Tensor& P, const Tensor& norm_conv, int64_t group, const Tensor& conv_w,
                          int64_t dilation, double eps, const Tensor& state_pool, const StepBatch& batch,
                          const Tensor& X) override {
    const char* op = "ple_conv_add_batch";
    check(state_pool, DType::F32, 3, op, "state pool");
    if (!all_decode(batch, state_pool, op))
      return Ops::ple_conv_add_batch(P, norm_conv, group, conv_w, dilation, eps, state_pool, batch, X);
    check(P, DType::F32, 2, op, "P");
    check(norm_conv, DType::F16, 1, op, "norm_conv");
    check(conv_w, DType::F16, 2, op, "conv1d weight");
    check(X, DType::F32, 2, op, "X");
    const int64_t B = P.dim(0), W = P.dim(1), K = conv_w.dim(1);
    FN_CHECK(B == batch.num_tokens && dilation >= 1 && K >= 1 && group > 0 && W % group == 0 && norm_conv.dim(0) == W &&
                 conv_w.dim(0) == W && state_pool.dim(1) == (K - 1) * dilation && state_pool.dim(2) == W &&
                 X.shape() == P.shape(),
             "{}: P {}, norm_conv {}, conv {}, state pool {}, X {} do not fit (group {}, dilation {})", op, P.str(),
             norm_conv.str(), conv_w.str(), state_pool.str(), X.str(), group, dilation);
    const int b = to_int(B, op, "sequences"), w = to_int(W, op, "width");
    Tensor n = alloc(P.shape(), DType::F32, "ple normed conv input");
    FN_CUDA_CHECK(detail::launch_zc_rmsnorm(dp<const float>(P), W, dp<float>(n), W, dp<__half>(norm_conv), w, b, w,
                                            to_int(group, op, "group"), float(eps), stream()),
                  "ple_conv_add_batch norm");
    FN_CUDA_CHECK(
        detail::launch_conv_decode_slots(dp<const float>(n), dp<const float>(P), dp<float>(X), true,
                                         dp<float>(state_pool), dp<int32_t>(batch.slots), dp<__half>(conv_w), b, w,
                                         to_int(K, op, "kernel"), to_int(dilation, op, "dilation"), stream()),
        op);
  }

  void gated_rms_norm(const Tensor& x, const Tensor& z, const Tensor& w, double eps, GateAct act,
                      const Tensor& y) override {
    const char* op = "gated_rms_norm";
    check(x, DType::F32, 2, op, "x");
    check(z, DType::F32, 2, op, "z");
    check(w, DType::F16, -1, op, "weight");
    check(y, DType::F32, 2, op, "y");
    const int64_t T = x.dim(0), L = x.dim(1), D = w.numel();
    FN_CHECK(D > 0 && L % D == 0 && z.shape() == x.shape() && y.shape() == x.shape(),
             "gated_rms_norm: x {}, z {}, weight {}, y {} do not fit", x.str(), z.str(), w.str(), y.str());
    FN_CUDA_CHECK(detail::launch_gated_rmsnorm(dp<const float>(x), L, dp<const float>(z), L, dp<float>(y), L,
                                               dp<__half>(w), to_int(T, op, "tokens"), to_int(L / D, op, "heads"),
                                               to_int(D, op, "dim"), float(eps), act == GateAct::Silu, stream()),
                  op);
  }

  // ------------------------------------------------------------------------------------------------ QSA

  void qsa_prepare_qk(const Tensor& qg, const Tensor& k, const Tensor& q_norm, const Tensor& k_norm, double eps,
                      const RopeParams& rope, int64_t pos0, const Tensor& q, const Tensor& gate) override {
    prepare_qk(
        "qsa_prepare_qk", qg, k, q_norm, k_norm, eps, rope,
        [&] { return positions(pos0, qg.dim(0), "qsa_prepare_qk"); }, q, gate);
  }

  void qsa_prepare_qk_batch(const Tensor& qg, const Tensor& k, const Tensor& q_norm, const Tensor& k_norm, double eps,
                            const RopeParams& rope, const StepBatch& batch, const Tensor& q,
                            const Tensor& gate) override {
    FN_CHECK(qg.rank() == 2 && qg.dim(0) == batch.num_tokens,
             "qsa_prepare_qk_batch: q_proj output {} does not have the "
             "step's {} rows",
             qg.str(), batch.num_tokens);
    prepare_qk(
        "qsa_prepare_qk_batch", qg, k, q_norm, k_norm, eps, rope, [&] { return batch.positions; }, q, gate);
  }

  void qsa_indexer_select(const Tensor& qi, const Tensor& index_keys, const Tensor& q_layernorm,
                          const Tensor& k_layernorm, double eps, const RopeParams& rope, int64_t pos0, int64_t budget,
                          int64_t block, const Tensor& selected) override {
    const char* op = "qsa_indexer_select";
    check(qi, DType::F32, 2, op, "index queries");
    check(index_keys, DType::F32, 2, op, "index keys");
    check(q_layernorm, DType::F16, 1, op, "q_layernorm");
    check(k_layernorm, DType::F16, 1, op, "k_layernorm");
    check(selected, DType::I32, 2, op, "selected");
    const int64_t T = qi.dim(0), Di = index_keys.dim(1);
    FN_CHECK(block > 0 && budget > 0 && budget % block == 0, "{}: budget {} must be a positive multiple of block {}",
             op, budget, block);
    FN_CHECK(Di > 0 && qi.dim(1) % Di == 0 && q_layernorm.dim(0) == Di && k_layernorm.dim(0) == Di &&
                 selected.dim(0) == T && selected.dim(1) == budget + block - 1 && index_keys.dim(0) >= pos0 + T &&
                 pos0 >= 0,
             "{}: index queries {}, keys {}, selected {} do not fit (pos0 {}, budget {}, block {})", op, qi.str(),
             index_keys.str(), selected.str(), pos0, budget, block);
    FN_CHECK(rope.rotary_dim > 0 && rope.rotary_dim % 2 == 0 && rope.rotary_dim <= Di,
             "{}: rotary_dim {} invalid for indexer_head_dim {}", op, rope.rotary_dim, Di);
    const int64_t ni = qi.dim(1) / Di;
    FN_CHECK(Di <= 256 && ni * Di <= 2048,
             "{}: {} indexer heads of {} exceed the kernels' limits (dim <= 256, "
             "heads*dim <= 2048)",
             op, ni, Di);
    if (T == 0) return;
    const int64_t max_blocks = budget / block, width = selected.dim(1), nb_all = (pos0 + T) / block;
    to_int(pos0 + T, op, "positions");
    // Queries: RoPE(ZC-RMSNorm(qi_h; q_layernorm), p); block keys of every complete block.
    Tensor pos = positions(pos0, T, op);
    Tensor qn = alloc(qi.shape(), DType::F32, "indexer queries");
    FN_CUDA_CHECK(detail::launch_head_norm_rope(dp<const float>(qi), ni * Di, Di, dp<float>(qn), ni * Di, Di,
                                                dp<__half>(q_layernorm), dp<int32_t>(pos), int(T), int(ni), int(Di),
                                                int(rope.rotary_dim), float(rope.theta), float(eps), stream()),
                  "qsa_indexer_select queries");
    Tensor bkeys = alloc({std::max<int64_t>(nb_all, 1), Di}, DType::F32, "indexer block keys");
    FN_CUDA_CHECK(detail::launch_qsa_block_keys_f32(dp<const float>(index_keys), int(nb_all), int(Di), int(block),
                                                    dp<__half>(k_layernorm), int(rope.rotary_dim), float(rope.theta),
                                                    float(eps), dp<float>(bkeys), stream()),
                  "qsa_indexer_select block keys");
    // Queries with at most max_blocks complete blocks take them all: no top-k.
    const int64_t t_host = std::clamp<int64_t>((max_blocks + 1) * block - 1 - pos0, 0, T);
    FN_CUDA_CHECK(detail::launch_qsa_expand_selection(nullptr, pos0, int(block), int(max_blocks), 0, int(t_host),
                                                      dp<int32_t>(selected), width, stream()),
                  "qsa_indexer_select expand");
    if (t_host == T) return;
    // The others: scores on the GPU, torch.topk's choice on the host (its tie behaviour decides among the equal
    // zero scores that relu produces), expansion on the GPU. Rows in chunks of bounded score memory.
    const int64_t rows_per_chunk = std::max<int64_t>(1, (int64_t(1) << 24) / std::max<int64_t>(nb_all, 1));
    std::vector<float> scores;
    std::vector<int32_t> top;
    std::vector<int64_t> picked(static_cast<size_t>(max_blocks));
    std::vector<std::pair<float, int64_t>> queue;
    for (int64_t t0 = t_host; t0 < T; t0 += rows_per_chunk) {
      const int64_t t1 = std::min(T, t0 + rows_per_chunk), n = t1 - t0;
      Tensor s = alloc({n, nb_all}, DType::F32, "indexer scores");
      FN_CUDA_CHECK(
          detail::launch_qsa_block_scores_f32(dp<const float>(qn), int(ni), int(Di), dp<const float>(bkeys), pos0,
                                              int(block), int(t0), int(t1), dp<float>(s), nb_all, stream()),
          "qsa_indexer_select scores");
      scores.resize(size_t(n * nb_all));
      FN_CUDA_CHECK(cudaMemcpyAsync(scores.data(), s.data(), s.nbytes(), cudaMemcpyDeviceToHost, stream()), op);
      synchronize(op);
      top.assign(size_t(n * max_blocks), 0);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t nb = (pos0 + t + 1) / block;
        cpu::torch_topk(&scores[size_t((t - t0) * nb_all)], nb, max_blocks, queue, picked.data());
        for (int64_t i = 0; i < max_blocks; ++i) top[size_t((t - t0) * max_blocks + i)] = int32_t(picked[size_t(i)]);
      }
      Tensor top_d = upload(top.data(), DType::I32, {n, max_blocks});
      FN_CUDA_CHECK(detail::launch_qsa_expand_selection(dp<int32_t>(top_d), pos0, int(block), int(max_blocks), int(t0),
                                                        int(t1), dp<int32_t>(selected), width, stream()),
                    "qsa_indexer_select expand");
    }
  }

  /// The indexer over the whole step at once, on the paged keys: pooled keys cached per complete block (written by
  /// the token that completes the block), scores from the cache, the torch-exact top-k on the GPU for the queries
  /// that have more complete blocks than the budget (launch_qsa_topk_paged: no host round trip).
  void qsa_indexer_select_batch(const Tensor& qi, const Tensor& index_key_pool, const Tensor& pooled_key_pool,
                                const Tensor& q_layernorm, const Tensor& k_layernorm, double eps,
                                const RopeParams& rope, int64_t budget, int64_t block, const StepBatch& batch,
                                const Tensor& selected) override {
    const char* op = "qsa_indexer_select_batch";
    check(qi, DType::F32, 2, op, "index queries");
    check(index_key_pool, DType::F32, 2, op, "index key pool");
    check(pooled_key_pool, DType::F32, 2, op, "pooled key pool");
    check(q_layernorm, DType::F16, 1, op, "q_layernorm");
    check(k_layernorm, DType::F16, 1, op, "k_layernorm");
    check(selected, DType::I32, 2, op, "selected");
    const int64_t T = qi.dim(0), Di = index_key_pool.dim(1), R = index_key_pool.dim(0), page = batch.block_size;
    FN_CHECK(block > 0 && budget > 0 && budget % block == 0, "{}: budget {} must be a positive multiple of block {}",
             op, budget, block);
    FN_CHECK(T == batch.num_tokens && Di > 0 && qi.dim(1) % Di == 0 && q_layernorm.dim(0) == Di &&
                 k_layernorm.dim(0) == Di && selected.dim(0) == T && selected.dim(1) == budget + block - 1 &&
                 page % block == 0 && R % page == 0 && pooled_key_pool.dim(0) == R / block &&
                 pooled_key_pool.dim(1) == Di,
             "{}: index queries {}, key pool {}, pooled pool {}, selected {} do not fit a step of {} tokens (blocks of "
             "{} positions, indexer block {}, budget {})",
             op, qi.str(), index_key_pool.str(), pooled_key_pool.str(), selected.str(), batch.num_tokens, page, block,
             budget);
    FN_CHECK(rope.rotary_dim > 0 && rope.rotary_dim % 2 == 0 && rope.rotary_dim <= Di,
             "{}: rotary_dim {} invalid for indexer_head_dim {}", op, rope.rotary_dim, Di);
    const int64_t ni = qi.dim(1) / Di;
    FN_CHECK(Di <= 256 && ni * Di <= 2048,
             "{}: {} indexer heads of {} exceed the kernels' limits (dim <= 256, heads*dim <= 2048)", op, ni, Di);
    if (T == 0) return;
    const int t = to_int(T, op, "tokens");
    to_int(batch.max_context, op, "positions");
    check_block_ids(batch, R / page, op);
    const detail::QsaPagedIndex pi{dp<int32_t>(batch.token_seq),    dp<int32_t>(batch.positions),
                                   dp<int32_t>(batch.block_tables), batch.max_blocks,
                                   to_int(page, op, "block size"),  int(block)};
    // Queries: RoPE(ZC-RMSNorm(qi_h; q_layernorm), p); pooled keys of the blocks this step completes.
    Tensor qn = alloc(qi.shape(), DType::F32, "indexer queries");
    FN_CUDA_CHECK(detail::launch_head_norm_rope(dp<const float>(qi), ni * Di, Di, dp<float>(qn), ni * Di, Di,
                                                dp<__half>(q_layernorm), dp<int32_t>(batch.positions), t, int(ni),
                                                int(Di), int(rope.rotary_dim), float(rope.theta), float(eps), stream()),
                  "qsa_indexer_select_batch queries");
    FN_CUDA_CHECK(detail::launch_qsa_pool_blocks_paged_f32(
                      pi, dp<const float>(index_key_pool), t, int(Di), dp<__half>(k_layernorm), int(rope.rotary_dim),
                      float(rope.theta), float(eps), dp<float>(pooled_key_pool), stream()),
                  "qsa_indexer_select_batch pooled keys");
    const int64_t max_blocks = budget / block, width = selected.dim(1);
    // Queries with at most max_blocks complete blocks take them all; does any query need a top-k?
    const int64_t first_topk_position = (max_blocks + 1) * block - 1;
    bool any_topk = false;
    for (int64_t q = 0; q < batch.num_seqs; ++q)
      any_topk = any_topk || batch.pos0[size_t(q)] + batch.rows_of(q) - 1 >= first_topk_position;
    if (!any_topk) {
      FN_CUDA_CHECK(detail::launch_qsa_expand_selection_paged(pi, nullptr, int(max_blocks), 0, t, dp<int32_t>(selected),
                                                              width, stream()),
                    "qsa_indexer_select_batch expand");
      return;
    }
    // Scores, torch.topk's choice (its tie behaviour decides among the equal zero scores that relu produces:
    // launch_qsa_topk_paged) and the expansion, all on the GPU without a host round trip. Rows in chunks of
    // bounded score memory.
    const int64_t ld = std::max<int64_t>(batch.max_context / block, 1);
    const int64_t rows_per_chunk = std::max<int64_t>(1, (int64_t(1) << 24) / ld);
    for (int64_t t0 = 0; t0 < T; t0 += rows_per_chunk) {
      const int64_t t1 = std::min(T, t0 + rows_per_chunk), n = t1 - t0;
      Tensor sc = alloc({n, ld}, DType::F32, "indexer scores");
      Tensor top = alloc({n, max_blocks}, DType::I32, "indexer top blocks");
      Tensor scratch = alloc({n, ld, 2}, DType::I32, "indexer top-k scratch");  // (score, index) items
      FN_CUDA_CHECK(detail::launch_qsa_block_scores_paged_f32(pi, dp<const float>(qn), int(ni), int(Di),
                                                              dp<const float>(pooled_key_pool), int(t0), int(t1),
                                                              dp<float>(sc), ld, stream()),
                    "qsa_indexer_select_batch scores");
      FN_CUDA_CHECK(detail::launch_qsa_topk_paged(pi, dp<const float>(sc), ld, int(max_blocks), int(t0), int(t1),
                                                  static_cast<topk::Scored*>(scratch.data()), dp<int32_t>(top),
                                                  stream()),
                    "qsa_indexer_select_batch top-k");
      FN_CUDA_CHECK(detail::launch_qsa_expand_selection_paged(pi, dp<int32_t>(top), int(max_blocks), int(t0), int(t1),
                                                              dp<int32_t>(selected), width, stream()),
                    "qsa_indexer_select_batch expand");
    }
  }

  void sparse_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& selected,
                        const Tensor& gate, double scale, const Tensor& out) override {
    const char* op = "sparse_attention";
    if (!check_attention(op, q, k_cache, v_cache, selected, gate, scale, out)) return;
    const int64_t T = q.dim(0), rows = k_cache.dim(0);
    to_int(rows, op, "cache rows");
    // One sequence, one page holding the whole cache; every position below `rows` visible (the caller's selection
    // already encodes causality).
    Tensor tok = alloc({2 * T + 1}, DType::I32, "attention tokens");
    int32_t* tok_seq = dp<int32_t>(tok);
    int32_t* tok_pos = tok_seq + T;
    int32_t* table = tok_seq + 2 * T;
    FN_CUDA_CHECK(detail::launch_fill_i32(tok_seq, T, 0, stream()), op);
    FN_CUDA_CHECK(detail::launch_fill_i32(tok_pos, T, int32_t(rows - 1), stream()), op);
    FN_CUDA_CHECK(detail::launch_fill_i32(table, 1, 0, stream()), op);
    attend(op, q, k_cache, v_cache, selected, gate, out, tok_seq, tok_pos, {table, 1, 1, int32_t(rows)}, rows);
  }

  /// Sparse attention over the paged K/V pools directly (no per-sequence gather): the kernel maps each selected
  /// logical position through the sequence's block table.
  void sparse_attention_batch(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, const Tensor& selected,
                              const Tensor& gate, double scale, const StepBatch& batch, const Tensor& out) override {
    const char* op = "sparse_attention_batch";
    const int64_t rows = k_pool.rank() == 3 ? k_pool.dim(0) : 0, bs = batch.block_size;
    FN_CHECK(q.rank() == 3 && q.dim(0) == batch.num_tokens && bs > 0 && rows % bs == 0,
             "{}: q {} and pool {} do not fit a step of {} tokens in blocks of {}", op, q.str(), k_pool.str(),
             batch.num_tokens, bs);
    if (!check_attention(op, q, k_pool, v_pool, selected, gate, scale, out)) return;
    check_block_ids(batch, rows / bs, op);
    // Logical positions at or beyond the step's longest context are invalid.
    attend(op, q, k_pool, v_pool, selected, gate, out, dp<int32_t>(batch.token_seq), dp<int32_t>(batch.positions),
           {dp<int32_t>(batch.block_tables), batch.max_blocks, to_int(rows / bs, op, "blocks"),
            to_int(bs, op, "block size")},
           batch.max_context);
  }

  // ------------------------------------------------------------------------------------------------ MoE

  void moe_router_topk(const Tensor& u, const Tensor& router, bool norm_topk_prob, const Tensor& ids,
                       const Tensor& weights) override {
    const char* op = "moe_router_topk";
    check(u, DType::F32, 2, op, "u");
    check(router, DType::F16, 2, op, "router");
    check(ids, DType::I32, 2, op, "ids");
    check(weights, DType::F32, 2, op, "weights");
    const int64_t T = u.dim(0), H = u.dim(1), E = router.dim(0), k = ids.dim(1);
    FN_CHECK(router.dim(1) == H && ids.dim(0) == T && weights.shape() == ids.shape() && k >= 1 && k <= E,
             "{}: u {}, router {}, ids {}, weights {} do not fit", op, u.str(), router.str(), ids.str(), weights.str());
    FN_CHECK(E <= detail::kMoeMaxExperts && k <= detail::kMoeMaxTopK,
             "{}: {} experts, top-{}: the kernel takes at most {} experts and top-{}", op, E, k, detail::kMoeMaxExperts,
             detail::kMoeMaxTopK);
    if (T == 0) return;
    Tensor logits = alloc({T, E}, DType::F32, "router logits");
    const Tensor rw[] = {router}, rl[] = {logits};
    if (!gemv_group(u, rw, rl, {}, "moe_router_topk logits"))  // float32 either way
      FN_CUDA_CHECK(detail::launch_linear_f32_narrow(dp<const float>(u), dp<__half>(router), dp<float>(logits),
                                                     to_int(T, op, "tokens"), to_int(H, op, "hidden"), int(E),
                                                     stream()),
                    "moe_router_topk logits");
    FN_CUDA_CHECK(detail::launch_moe_router_topk(dp<const float>(logits), E, int(T), int(E), int(k), norm_topk_prob,
                                                 dp<int32_t>(ids), dp<float>(weights), stream()),
                  op);
  }

  void moe_experts(const Tensor& u, const Tensor& ids, const Tensor& weights, const MoeWeights& w,
                   const Tensor& out) override {
    const char* op = "moe_experts";
    if (w.packed) {
      moe_experts_w4a16(u, ids, weights, *w.packed, out);
      return;
    }
    check(u, DType::F32, 2, op, "u");
    check(ids, DType::I32, 2, op, "ids");
    check(weights, DType::F32, 2, op, "weights");
    check(w.gate, DType::F16, 3, op, "experts gate_proj");
    check(w.up, DType::F16, 3, op, "experts up_proj");
    check(w.down, DType::F16, 3, op, "experts down_proj");
    check(out, DType::F32, 2, op, "out");
    const int64_t T = u.dim(0), H = u.dim(1), E = w.gate.dim(0), I = w.gate.dim(1), k = ids.dim(1);
    FN_CHECK(w.gate.dim(2) == H && w.up.shape() == w.gate.shape() && w.down.dim(0) == E && w.down.dim(1) == H &&
                 w.down.dim(2) == I && ids.dim(0) == T && weights.shape() == ids.shape() && out.shape() == u.shape(),
             "{}: u {}, ids {}, experts gate {} / up {} / down {}, out {} do not fit", op, u.str(), ids.str(),
             w.gate.str(), w.up.str(), w.down.str(), out.str());
    FN_CHECK(E >= 1 && E <= detail::kMoeMaxExperts && H % 8 == 0 && I % 8 == 0,
             "{}: {} experts (1..{}), hidden {} and expert width {} (multiples of 8) exceed the kernel's limits", op, E,
             detail::kMoeMaxExperts, H, I);
    if (T == 0) return;
    const int t = to_int(T, op, "tokens"), slots = to_int(T * k, op, "slots");
    const int max_tiles = (slots + detail::kMoeTileM - 1) / detail::kMoeTileM + std::min<int>(int(E), slots);
    Tensor idx = alloc({E + 1 + 2 * int64_t(slots) + 2 * int64_t(max_tiles) + 1}, DType::I32, "moe routing");
    int32_t* offsets = dp<int32_t>(idx);
    int32_t* sorted = offsets + E + 1;
    int32_t* slot_row = sorted + slots;
    int32_t* tile_expert = slot_row + slots;
    int32_t* tile_row = tile_expert + max_tiles;
    int32_t* num_tiles = tile_row + max_tiles;
    FN_CUDA_CHECK(detail::launch_moe_align(dp<int32_t>(ids), slots, int(E), offsets, sorted, slot_row, tile_expert,
                                           tile_row, num_tiles, status(kStatusMoe), stream()),
                  "moe_experts align");
    if (split()) {
      // Per expert, cuBLAS products over its sorted slots in FP16x2 (the expert counts come to the host).
      std::vector<int32_t> off(size_t(E + 1));
      FN_CUDA_CHECK(cudaMemcpyAsync(off.data(), offsets, off.size() * 4, cudaMemcpyDeviceToHost, stream()), op);
      FN_CUDA_CHECK(cudaStreamSynchronize(stream()), op);
      const int valid = off[size_t(E)];
      const int64_t rows2 = std::max<int64_t>(2 * int64_t(valid), 1);
      Tensor x2 = alloc({rows2, H}, DType::F16, "moe inputs"), a2 = alloc({rows2, I}, DType::F16, "moe activations");
      Tensor g2 = alloc({rows2, I}, DType::F32, "moe gate"), up2 = alloc({rows2, I}, DType::F32, "moe up");
      Tensor y2 = alloc({rows2, H}, DType::F32, "moe expert outputs");
      const int32_t* id = dp<int32_t>(ids);
      FN_CUDA_CHECK(detail::launch_moe_gather_f16x2(dp<const float>(u), id, sorted, offsets, valid, int(k), int(H),
                                                    dp<__half>(x2), stream()),
                    "moe_experts gather");
      for (int64_t e = 0; e < E; ++e) {
        const int64_t r0 = 2 * int64_t(off[size_t(e)]), m = 2 * int64_t(off[size_t(e + 1)] - off[size_t(e)]);
        if (m == 0) continue;
        blas_.linear(dp<__half>(x2) + r0 * H, int(m), int(H), dp<__half>(w.gate) + e * I * H, int(I),
                     dp<float>(g2) + r0 * I, OutType::F32, int(I), stream(), "experts gate_proj");
        blas_.linear(dp<__half>(x2) + r0 * H, int(m), int(H), dp<__half>(w.up) + e * I * H, int(I),
                     dp<float>(up2) + r0 * I, OutType::F32, int(I), stream(), "experts up_proj");
      }
      FN_CUDA_CHECK(detail::launch_moe_act_f16x2(dp<const float>(g2), dp<const float>(up2), id, sorted, offsets, valid,
                                                 int(I), dp<__half>(a2), stream()),
                    "moe_experts act");
      for (int64_t e = 0; e < E; ++e) {
        const int64_t r0 = 2 * int64_t(off[size_t(e)]), m = 2 * int64_t(off[size_t(e + 1)] - off[size_t(e)]);
        if (m == 0) continue;
        blas_.linear(dp<__half>(a2) + r0 * I, int(m), int(I), dp<__half>(w.down) + e * H * I, int(H),
                     dp<float>(y2) + r0 * H, OutType::F32, int(H), stream(), "experts down_proj");
      }
      FN_CUDA_CHECK(
          detail::launch_moe_combine_f16x2(dp<const float>(y2), id, slot_row, offsets, dp<const float>(weights), t,
                                           int(k), int(H), dp<float>(out), stream()),
          "moe_experts combine");
      return;
    }
    Tensor uh = half_copy(u, op);
    Tensor h = alloc({int64_t(slots), I}, DType::F16, "moe expert activations");
    Tensor ys = alloc({int64_t(slots), H}, DType::F16, "moe expert outputs");
    FN_CUDA_CHECK(detail::launch_moe_gate_up_split(dp<__half>(uh), H, int(k), dp<__half>(w.gate), dp<__half>(w.up), I,
                                                   int(H), int(I), offsets, sorted, tile_expert, tile_row, num_tiles,
                                                   max_tiles, dp<__half>(h), stream()),
                  "moe_experts gate_up");
    FN_CUDA_CHECK(
        detail::launch_moe_down(dp<__half>(h), dp<__half>(w.down), int(H), int(I), offsets, sorted, dp<float>(weights),
                                tile_expert, tile_row, num_tiles, max_tiles, dp<__half>(ys), stream()),
        "moe_experts down");
    FN_CUDA_CHECK(detail::launch_moe_combine(dp<__half>(ys), slot_row, t, int(k), int(H), nullptr, nullptr,
                                             dp<float>(out), H, stream()),
                  "moe_experts combine");
  }

  /// moe_experts on W4A16 experts: u rounded to FP16 (the kernels' activations), FP32 accumulation, FP32 output
  /// (moe_w4a16.h for the arithmetic).
  void moe_experts_w4a16(const Tensor& u, const Tensor& ids, const Tensor& weights, const PackedExperts& packed,
                         const Tensor& out) {
    const char* op = "moe_experts";
    const auto* p = dynamic_cast<const CudaW4Experts*>(&packed);
    FN_CHECK(p && p->device == ctx_->device, "{}: the packed experts ({}) were not made by this backend (cuda:{})", op,
             packed.format(), ctx_->device);
    check(u, DType::F32, 2, op, "u");
    check(ids, DType::I32, 2, op, "ids");
    check(weights, DType::F32, 2, op, "weights");
    check(out, DType::F32, 2, op, "out");
    const int64_t T = u.dim(0), k = ids.dim(1);
    FN_CHECK(u.dim(1) == p->hidden && ids.dim(0) == T && weights.shape() == ids.shape() && out.shape() == u.shape() &&
                 k >= 1,
             "{}: u {}, ids {}, weights {}, out {} do not fit W4A16 experts of hidden {}", op, u.str(), ids.str(),
             weights.str(), out.str(), p->hidden);
    if (T == 0) return;
    Tensor uh = half_copy(u, op);
    MoeW4A16Workspace& ws =
        w4_workspace(to_int(T, op, "tokens"), to_int(k, op, "top_k"), p->experts, p->hidden, p->inter);
    const MoeW4A16Experts ex{&p->gate_up, &p->down, p->experts, p->hidden, p->inter};
    moe_w4a16_routed(ex, dp<__half>(uh), p->hidden, int(T), dp<int32_t>(ids), dp<float>(weights), nullptr, nullptr,
                     dp<float>(out), p->hidden, ws, stream());
  }

  void moe_shared_expert(const Tensor& u, const MoeWeights& w, const Tensor& out) override {
    const char* op = "moe_shared_expert";
    check(u, DType::F32, 2, op, "u");
    check(w.shared_gate_proj, DType::F16, 2, op, "shared_expert.gate_proj");
    check(w.shared_up_proj, DType::F16, 2, op, "shared_expert.up_proj");
    check(w.shared_down_proj, DType::F16, 2, op, "shared_expert.down_proj");
    check(w.shared_expert_gate, DType::F16, 2, op, "shared_expert_gate");
    check(out, DType::F32, 2, op, "out");
    const int64_t T = u.dim(0), H = u.dim(1), Is = w.shared_gate_proj.dim(0);
    FN_CHECK(w.shared_gate_proj.dim(1) == H && w.shared_up_proj.shape() == w.shared_gate_proj.shape() &&
                 w.shared_down_proj.dim(0) == H && w.shared_down_proj.dim(1) == Is &&
                 w.shared_expert_gate.numel() == H && out.shape() == u.shape(),
             "{}: u {}, shared expert gate {} / up {} / down {} / gate {}, out {} do not fit", op, u.str(),
             w.shared_gate_proj.str(), w.shared_up_proj.str(), w.shared_down_proj.str(), w.shared_expert_gate.str(),
             out.str());
    if (T == 0) return;
    const int t = to_int(T, op, "tokens"), h = to_int(H, op, "hidden"), is = to_int(Is, op, "width");
    Tensor s = alloc({T, H}, DType::F32, "shared expert out"), logit = alloc({T}, DType::F32, "shared gate logit");
    bool gate_done = false;  // the gate logit computed with gate_proj / up_proj
    if (split()) {
      Tensor g = alloc({T, Is}, DType::F32, "shared expert gate"), up = alloc({T, Is}, DType::F32, "shared expert up");
      // gate_proj, up_proj and shared_expert_gate read u: one decode GEMV launch when they qualify.
      const Tensor gu_w[3] = {w.shared_gate_proj, w.shared_up_proj, w.shared_expert_gate};
      const Tensor gu_y[3] = {g, up, logit.view({T, 1})};
      gate_done = gemv_group(u, gu_w, gu_y, {}, "shared_expert gate_proj/up_proj/shared_expert_gate");
      if (!gate_done) {
        product(u, w.shared_gate_proj, g, Tensor(), "shared_expert.gate_proj");
        product(u, w.shared_up_proj, up, Tensor(), "shared_expert.up_proj");
      }
      FN_CUDA_CHECK(
          detail::launch_silu_mul_f32(dp<const float>(g), dp<const float>(up), dp<float>(g), g.numel(), stream()),
          "moe_shared_expert silu");
      product(g, w.shared_down_proj, s, Tensor(), "shared_expert.down_proj");
    } else {
      Tensor uh = half_copy(u, op);
      Tensor g = alloc({T, Is}, DType::F16, "shared expert gate"), up = alloc({T, Is}, DType::F16, "shared expert up");
      Tensor act = alloc({T, Is}, DType::F16, "shared expert act");
      blas_.linear(dp<__half>(uh), t, h, dp<__half>(w.shared_gate_proj), is, g.data(), OutType::F16, is, stream(),
                   "shared_expert.gate_proj");
      blas_.linear(dp<__half>(uh), t, h, dp<__half>(w.shared_up_proj), is, up.data(), OutType::F16, is, stream(),
                   "shared_expert.up_proj");
      FN_CUDA_CHECK(detail::launch_silu_mul(dp<__half>(g), dp<__half>(up), Is, dp<__half>(act), Is, t, is, stream()),
                    "moe_shared_expert silu");
      blas_.linear(dp<__half>(act), t, is, dp<__half>(w.shared_down_proj), h, s.data(), OutType::F32, h, stream(),
                   "shared_expert.down_proj");
    }
    if (!gate_done)
      FN_CUDA_CHECK(detail::launch_linear_f32_narrow(dp<const float>(u), dp<__half>(w.shared_expert_gate),
                                                     dp<float>(logit), t, h, 1, stream()),
                    "shared_expert_gate");
    FN_CUDA_CHECK(
        detail::launch_gated_accumulate(dp<float>(out), dp<const float>(s), dp<const float>(logit), t, h, stream()),
        op);
  }

  // ------------------------------------------------------------------------------------------------ PLE

  void ple_gather(const PleTable& table, const Tensor& rows, const Tensor& e) override {
    gather_ple_rows(table, rows, e, stream());
  }

  void ple_gather_start(const PleTable& table, const Tensor& rows, const Tensor& e) override {
    use_device();
    if (!table.shards.empty()) gather_table(table);  // made (once) on the main stream, before the event below
    // The side stream starts once the main stream has made `rows` (and allocated `e`).
    cudaEvent_t ready = nullptr, done = nullptr;
    FN_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "ple_gather_start");
    FN_CUDA_CHECK(cudaEventRecord(ready, stream()), "ple_gather_start");
    FN_CUDA_CHECK(cudaStreamWaitEvent(ctx_->side, ready, 0), "ple_gather_start");
    cudaEventDestroy(ready);  // released once the wait is satisfied
    gather_ple_rows(table, rows, e, ctx_->side);
    FN_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "ple_gather_start");
    FN_CUDA_CHECK(cudaEventRecord(done, ctx_->side), "ple_gather_start");
    pending_gathers_.push_back({rows, e, done});
  }

  void ple_gather_wait(const Tensor& e) override {
    auto it = std::find_if(pending_gathers_.begin(), pending_gathers_.end(),
                           [&](const PendingGather& g) { return g.e.data() == e.data(); });
    FN_CHECK(it != pending_gathers_.end(), "ple_gather_wait: no gather into {} was started", e.str());
    FN_CUDA_CHECK(cudaStreamWaitEvent(stream(), it->done, 0), "ple_gather_wait");
    cudaEventDestroy(it->done);
    pending_gathers_.erase(it);  // rows and e may now be freed: later frees are ordered after the gather
  }

 private:
  /// ple_gather on stream `s`.
  void gather_ple_rows(const PleTable& table, const Tensor& rows, const Tensor& e, cudaStream_t s) {
    const char* op = "ple_gather";
    check(rows, DType::I64, 2, op, "rows");
    check(e, DType::F32, 2, op, "e");
    const int64_t T = rows.dim(0), heads = rows.dim(1), hd = table.head_dim;
    FN_CHECK(e.dim(0) == T && e.dim(1) == heads * hd && !table.shards.empty(),
             "{}: rows {} and e {} do not fit a table of head_dim {}", op, rows.str(), e.str(), hd);
    const DType dt = table.shards[0].dtype();
    for (size_t i = 0; i < table.shards.size(); ++i) {
      const Tensor& s = table.shards[i];
      check_device(s, op, "table shard");
      FN_CHECK(s.rank() == 2 && s.dim(1) == hd && s.dtype() == dt &&
                   (dt == DType::BF16 || dt == DType::F16 || dt == DType::F8_E4M3),
               "{}: shard {} is {}; expected BF16, F16 or F8_E4M3 [rows, {}] like shard 0 ({})", op, i, s.str(), hd,
               dtype_name(dt));
    }
    FN_CHECK(std::isfinite(table.scale), "{}: table scale {}", op, table.scale);
    if (T == 0 || heads == 0) return;
    const GatherTable& g = gather_table(table);
    const int type = dt == DType::BF16 ? detail::kPleBF16 : dt == DType::F16 ? detail::kPleF16 : detail::kPleF8E4M3;
    FN_CUDA_CHECK(
        detail::launch_ple_gather(g.addresses.get(), int(g.addresses.size()), g.rows_per_shard, g.rows, type,
                                  table.scale, to_int(hd, op, "head_dim"), dp<int64_t>(rows), to_int(T, op, "tokens"),
                                  to_int(heads, op, "heads"), dp<float>(e), status(kStatusPle), s),
        op);
  }

 public:
  void ple_gate(const Tensor& kn, const Tensor& v, const Tensor& X, const Tensor& norm_query, double eps,
                const Tensor& P) override {
    const char* op = "ple_gate";
    check(kn, DType::F32, 2, op, "normed keys");
    check(v, DType::F32, 2, op, "value");
    check(X, DType::F32, 2, op, "X");
    check(norm_query, DType::F16, 1, op, "norm_query");
    check(P, DType::F32, 2, op, "P");
    const int64_t T = X.dim(0), W = X.dim(1), H = v.dim(1);
    FN_CHECK(H > 0 && W % H == 0 && kn.shape() == X.shape() && v.dim(0) == T && norm_query.dim(0) == W &&
                 P.shape() == X.shape(),
             "{}: keys {}, value {}, X {}, P {} do not fit", op, kn.str(), v.str(), X.str(), P.str());
    FN_CUDA_CHECK(detail::launch_ple_gate_f32(dp<const float>(kn), dp<const float>(v), dp<const float>(X),
                                              dp<__half>(norm_query), to_int(T, op, "tokens"), int(W / H),
                                              to_int(H, op, "hidden"), float(eps), dp<float>(P), stream()),
                  op);
  }

  void ple_conv_add(const Tensor& P, const Tensor& norm_conv, int64_t group, const Tensor& conv_w, int64_t dilation,
                    double eps, const Tensor& state, const Tensor& X) override {
    const char* op = "ple_conv_add";
    check(P, DType::F32, 2, op, "P");
    check(norm_conv, DType::F16, 1, op, "norm_conv");
    check(conv_w, DType::F16, 2, op, "conv1d weight");
    check(state, DType::F32, 2, op, "state");
    check(X, DType::F32, 2, op, "X");
    const int64_t T = P.dim(0), W = P.dim(1), K = conv_w.dim(1);
    const int64_t ctx = (K - 1) * dilation;
    FN_CHECK(dilation >= 1 && K >= 1 && group > 0 && W % group == 0 && norm_conv.dim(0) == W && conv_w.dim(0) == W &&
                 state.dim(0) == ctx && state.dim(1) == W && X.shape() == P.shape(),
             "{}: P {}, norm_conv {}, conv {}, state {}, X {} do not fit (group {}, dilation {})", op, P.str(),
             norm_conv.str(), conv_w.str(), state.str(), X.str(), group, dilation);
    if (T == 0) return;
    const int t = to_int(T, op, "tokens"), w = to_int(W, op, "width");
    Tensor n = alloc(P.shape(), DType::F32, "ple normed conv input");
    FN_CUDA_CHECK(detail::launch_zc_rmsnorm(dp<const float>(P), W, dp<float>(n), W, dp<__half>(norm_conv), w, t, w,
                                            to_int(group, op, "group"), float(eps), stream()),
                  "ple_conv_add norm");
    FN_CUDA_CHECK(detail::launch_ple_conv_add_f32(dp<const float>(P), dp<const float>(n), dp<__half>(conv_w), t, w,
                                                  to_int(K, op, "kernel"), to_int(dilation, op, "dilation"),
                                                  dp<float>(state), dp<float>(X), stream()),
                  op);
  }

 private:
  cudaStream_t stream() const { return ctx_->stream; }
  int32_t* status(StatusSlot s) const { return ctx_->status + s; }

  /// Makes this backend's GPU current on the calling thread (a no-op when it already is).
  void use_device() const {
    thread_local int current = -1;
    if (current != ctx_->device) {
      FN_CUDA_CHECK(cudaSetDevice(ctx_->device), "cuda backend: cudaSetDevice");
      current = ctx_->device;
    }
  }

  /// A tensor from the stream-ordered pool, freed on the stream when its last handle goes away.
  Tensor alloc(const Shape& shape, DType dtype, const char* what) {
    use_device();
    for (auto d : shape) FN_CHECK(d >= 0, "cuda: negative dimension in shape [{}]", fmt::join(shape, ", "));
    const size_t bytes = std::max<size_t>(size_t(shape_numel(shape)) * dtype_size(dtype), 1);
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
    std::shared_ptr<void> owner(p, [ctx](void* q) { cudaFreeAsync(q, ctx->stream); });
    return Tensor(std::move(owner), p, dtype, shape, Device::CUDA, ctx_->device);
  }

  bool split() const { return options_.activations == ActivationPrecision::Fp16x2; }

  /// y [T, out] F32 = x [T, in] F32 · w [out, in]^T (+ bias [out]) on the tensor cores: x as FP16x2 rows (one GEMM
  /// of 2T rows, halves summed) or rounded to FP16, per the activation precision. Shapes checked by the caller.
  void product(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& bias, const char* what) {
    const int64_t T = x.dim(0);
    const int in = to_int(x.dim(1), what, "in"), out = to_int(w.dim(0), what, "out");
    const __half* b = bias.defined() ? dp<__half>(bias) : nullptr;
    if (T == 0) return;
    // Decode-sized products: one float32 GEMV launch over the FP16 weights (as exact as FP16x2, read once).
    if (gemv_group(x, {&w, 1}, {&y, 1}, {&bias, 1}, what)) return;
    if (split()) {
      const int m = to_int(2 * T, what, "rows");
      Tensor x2 = alloc({2 * T, in}, DType::F16, "fp16x2 activations"), y2 = alloc({2 * T, out}, DType::F32, "product");
      FN_CUDA_CHECK(detail::launch_split_f16x2(dp<const float>(x), dp<__half>(x2), T, in, stream()), what);
      blas_.linear(dp<__half>(x2), m, in, dp<__half>(w), out, y2.data(), OutType::F32, out, stream(), what);
      FN_CUDA_CHECK(detail::launch_sum_halves(dp<const float>(y2), dp<float>(y), T, out, b, stream()), what);
      return;
    }
    Tensor xh = half_copy(x, what);
    blas_.linear(dp<__half>(xh), to_int(T, what, "rows"), in, dp<__half>(w), out, y.data(), OutType::F32, out, stream(),
                 what);
    if (b) FN_CUDA_CHECK(detail::launch_add_bias(dp<float>(y), b, T, out, stream()), what);
  }

  /// y[i] = x w[i]^T (+ bias[i]) as one decode GEMV launch when x has at most kGemvMaxTokens rows, K % 8 == 0 and
  /// every pointer is 16-byte aligned; returns false (nothing done) otherwise. Shapes checked by the caller.
  bool gemv_group(const Tensor& x, std::span<const Tensor> w, std::span<const Tensor> y, std::span<const Tensor> bias,
                  const char* what) {
    const int64_t T = x.dim(0), K = x.dim(1);
    const auto aligned = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data()) % 16 == 0; };
    if (T < 1 || T > detail::kGemvMaxTokens || K % 8 != 0 || !aligned(x) || w.size() > size_t(detail::kGemvMaxSegments))
      return false;
    detail::GemvSegments seg{};
    int rows = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      if (!aligned(w[i])) return false;
      seg.w[i] = dp<__half>(w[i]);
      seg.bias[i] = i < bias.size() && bias[i].defined() ? dp<__half>(bias[i]) : nullptr;
      seg.y[i] = dp<float>(y[i]);
      seg.ldy[i] = y[i].dim(1);
      rows += to_int(w[i].dim(0), what, "out");
      seg.rows_end[i] = rows;
    }
    seg.count = int(w.size());
    FN_CUDA_CHECK(detail::launch_gemv_f16w_f32x(dp<const float>(x), K, int(K), seg, int(T), stream()), what);
    return true;
  }

  /// An FP16 copy of a float32 tensor (the input of a tensor-core product).
  Tensor half_copy(const Tensor& x, const char* op) {
    Tensor h = alloc(x.shape(), DType::F16, "fp16 activations");
    FN_CUDA_CHECK(detail::launch_f32_to_f16(dp<const float>(x), dp<__half>(h), x.numel(), stream()), op);
    return h;
  }

  /// Device int32 [T]: pos0, pos0+1, ...
  void sample_tokens_kernel(const Tensor& logits, const Tensor& params, const Tensor& tokens, int rows, int vocab) {
    cuda::sample_tokens(dp<const float>(logits), vocab, rows, vocab,
                        reinterpret_cast<const SamplingParams*>(params.data()), dp<int32_t>(tokens), stream());
  }

  /// qsa_prepare_qk with the token positions from `make_positions()` (an I32 [T] device tensor).
  template <class MakePositions>
  void prepare_qk(const char* op, const Tensor& qg, const Tensor& k, const Tensor& q_norm, const Tensor& k_norm,
                  double eps, const RopeParams& rope, MakePositions make_positions, const Tensor& q,
                  const Tensor& gate) {
    check(qg, DType::F32, 2, op, "q_proj output");
    check(k, DType::F32, 2, op, "k");
    check(q_norm, DType::F16, 1, op, "q_norm");
    check(k_norm, DType::F16, 1, op, "k_norm");
    check(q, DType::F32, 2, op, "q");
    check(gate, DType::F32, 2, op, "gate");
    const int64_t T = qg.dim(0), D = q_norm.dim(0);
    FN_CHECK(D > 0 && k_norm.dim(0) == D && qg.dim(1) % (2 * D) == 0 && k.dim(0) == T && k.dim(1) % D == 0 &&
                 q.dim(0) == T && q.dim(1) * 2 == qg.dim(1) && gate.shape() == q.shape(),
             "{}: q_proj output {}, k {}, q {}, gate {} do not fit head_dim {}", op, qg.str(), k.str(), q.str(),
             gate.str(), D);
    FN_CHECK(rope.rotary_dim > 0 && rope.rotary_dim % 2 == 0 && rope.rotary_dim <= D,
             "{}: rotary_dim {} invalid for head_dim {}", op, rope.rotary_dim, D);
    if (T == 0) return;
    const int64_t nh = q.dim(1) / D, nkv = k.dim(1) / D;
    const Tensor pos = make_positions();
    check(pos, DType::I32, 1, op, "positions");
    FN_CUDA_CHECK(detail::launch_head_norm_rope(dp<const float>(qg), nh * 2 * D, 2 * D, dp<float>(q), nh * D, D,
                                                dp<__half>(q_norm), dp<int32_t>(pos), int(T), int(nh), int(D),
                                                int(rope.rotary_dim), float(rope.theta), float(eps), stream()),
                  op);
    // gate[t, h] = the second half of head h's q_proj output.
    FN_CUDA_CHECK(cudaMemcpy2DAsync(gate.data(), size_t(D) * 4, dp<float>(qg) + D, size_t(2 * D) * 4, size_t(D) * 4,
                                    size_t(T * nh), cudaMemcpyDeviceToDevice, stream()),
                  op);
    FN_CUDA_CHECK(detail::launch_head_norm_rope(dp<const float>(k), nkv * D, D, dp<float>(k), nkv * D, D,
                                                dp<__half>(k_norm), dp<int32_t>(pos), int(T), int(nkv), int(D),
                                                int(rope.rotary_dim), float(rope.theta), float(eps), stream()),
                  op);
  }

  /// The checks shared by sparse_attention and sparse_attention_batch; false when there is nothing to do (T == 0).
  bool check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& selected,
                       const Tensor& gate, double scale, const Tensor& out) {
    check(q, DType::F32, 3, op, "q");
    check(k, DType::F32, 3, op, "k cache");
    check(v, DType::F32, 3, op, "v cache");
    check(selected, DType::I32, 2, op, "selected");
    check(gate, DType::F32, 3, op, "gate");
    check(out, DType::F32, 3, op, "out");
    const int64_t T = q.dim(0), nh = q.dim(1), D = q.dim(2), nkv = k.dim(1);
    FN_CHECK(v.shape() == k.shape() && k.dim(2) == D && nkv > 0 && nh % nkv == 0 && selected.dim(0) == T &&
                 gate.shape() == q.shape() && out.shape() == q.shape() && selected.dim(1) > 0,
             "{}: q {}, caches {} / {}, selected {}, gate {}, out {} do not fit", op, q.str(), k.str(), v.str(),
             selected.str(), gate.str(), out.str());
    FN_CHECK(D <= detail::kQsaMaxDim && nh / nkv <= detail::kQsaMaxGroup,
             "{}: head_dim {} (at most {}) and {} query heads per KV head (at most {}) exceed the kernel's limits", op,
             D, detail::kQsaMaxDim, nh / nkv, detail::kQsaMaxGroup);
    FN_CHECK(std::fabs(scale * std::sqrt(double(D)) - 1.0) < 1e-6,
             "{}: the CUDA kernel scales scores by 1/sqrt(head_dim) = {}, asked for {}", op, 1.0 / std::sqrt(double(D)),
             scale);
    to_int(T, op, "tokens");
    return T > 0;
  }

  /// Attention of each query over its selected positions (entries at or beyond `visible` are invalid) through the
  /// paging `pg`, token t in block-table row tok_seq[t] at position tok_pos[t]; inputs checked by check_attention.
  void attend(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& selected,
              const Tensor& gate, const Tensor& out, const int32_t* tok_seq, const int32_t* tok_pos,
              const detail::QsaPaging& pg, int64_t visible) {
    const int64_t T = q.dim(0), nh = q.dim(1), D = q.dim(2), nkv = k.dim(1), n_sel = selected.dim(1);
    const int t = int(T);
    // Valid entries packed to the front with their counts.
    Tensor compact = alloc(selected.shape(), DType::I32, "selection");
    Tensor counts = alloc({T}, DType::I32, "selection counts");
    FN_CUDA_CHECK(detail::launch_compact_selection(dp<int32_t>(selected), t, int(n_sel), visible, dp<int32_t>(compact),
                                                   dp<int32_t>(counts), status(kStatusSelection), stream()),
                  op);
    const QsaAttentionPlan plan = qsa_attention_plan(t, int(nh), int(nkv), int(D), int(n_sel));
    Tensor partial = alloc({std::max<int64_t>(plan.partial_floats, 1)}, DType::F32, "attention partials");
    FN_CUDA_CHECK(
        detail::launch_qsa_attention(dp<const float>(q), nh * D, tok_seq, tok_pos, dp<int32_t>(compact), n_sel,
                                     dp<int32_t>(counts), t, pg, dp<const float>(k), dp<const float>(v), int(nh),
                                     int(nkv), int(D), plan.splits, plan.split_len, dp<const float>(gate), nh * D, D,
                                     dp<float>(partial), dp<float>(out), nh * D, status(kStatusQsa), stream()),
        op);
  }

  /// Every block id of the step's tables is inside a pool of `blocks` blocks (the paged kernels index with them).
  static void check_block_ids(const StepBatch& b, int64_t blocks, const char* op) {
    for (int32_t id : b.host_block_tables)
      FN_CHECK(id < blocks, "{}: block id {} outside the pool's {} blocks", op, id, blocks);
  }

  /// Whether a step is pure decode (one token per sequence) and its slots fit `pool` [slots, ...]: then the batched
  /// decode kernels run over the state slots directly.
  static bool all_decode(const StepBatch& b, const Tensor& pool, const char* op) {
    if (b.num_tokens != b.num_seqs || b.num_seqs == 0) return false;
    for (int32_t slot : b.slot_ids)
      FN_CHECK(slot >= 0 && slot < pool.dim(0), "{}: state slot {} outside the pool {}", op, slot, pool.str());
    return true;
  }

  Tensor positions(int64_t pos0, int64_t T, const char* op) {
    to_int(pos0 + T, op, "positions");
    Tensor pos = alloc({T}, DType::I32, "positions");
    FN_CUDA_CHECK(detail::launch_iota_i32(dp<int32_t>(pos), T, int32_t(pos0), stream()), op);
    return pos;
  }

  /// Rows [row0, row0 + m.rows) of expert `e` of `dst` from one checkpoint matrix (lossless, moe_w4a16.h).
  static void pack_rows(W4Packed& dst, int64_t e, int64_t row0, const QuantMatrix& m, QuantKind kind, int64_t rows,
                        int64_t cols, int64_t group, bool zeros) {
    const char* op = "load_quantized_experts";
    FN_CHECK(m.format == kind && m.rows == rows && m.cols == cols && m.data.defined() && m.scale.defined(),
             "{}: '{}' ({} [{}, {}]) does not fit its block: expected the format of the first expert, [{}, {}], with "
             "data and scales",
             op, m.name, int(m.format), m.rows, m.cols, rows, cols);
    if (kind == QuantKind::Nvfp4 || kind == QuantKind::CtNvfp4) {
      FN_CHECK(m.data.dtype == DType::U8 && m.scale.dtype == DType::F8_E4M3 && m.global_scale.defined() &&
                   m.global_scale.dtype == DType::F32 && shape_numel(m.global_scale.shape) == 1,
               "{}: NVFP4 weight '{}' needs U8 codes, F8_E4M3 block scales and one F32 global scale", op, m.name);
      float global = 0.f;
      std::memcpy(&global, m.global_scale.data, 4);
      const Nvfp4Source src{rows,
                            cols,
                            static_cast<const uint8_t*>(m.data.data),
                            static_cast<const uint8_t*>(m.scale.data),
                            global,
                            kind == QuantKind::CtNvfp4};
      try {
        dst.set_rows(int(e), int(row0), src);
      } catch (const Error& err) {
        fail("{}: '{}': {}", op, m.name, err.what());
      }
      return;
    }
    FN_CHECK(m.data.dtype == DType::I32 && (m.group ? m.group : cols) == (group ? group : cols),
             "{}: int4 weight '{}' needs I32 packed codes and group {} (has {})", op, m.name, group, m.group);
    const std::vector<int32_t> packed = host_copy<int32_t>(m.data);
    const std::vector<float> scales = float_copy(m.scale, "the scales of '" + m.name + "'");
    Int4Plain plain;
    if (kind == QuantKind::Gptq) {
      FN_CHECK(m.zero_point.defined() && m.zero_point.dtype == DType::I32, "{}: GPTQ weight '{}' needs I32 qzeros", op,
               m.name);
      const std::vector<int32_t> z = host_copy<int32_t>(m.zero_point);
      plain = unpack_gptq(packed.data(), z.data(), scales.data(), rows, cols, m.group, m.gptq_v2);
    } else {
      FN_CHECK(m.zero_point.defined() == zeros && (!zeros || m.zero_point.dtype == DType::I32),
               "{}: '{}' {} zero points, the first expert {}", op, m.name, m.zero_point.defined() ? "has" : "lacks",
               zeros ? "has them" : "does not");
      const std::vector<int32_t> z = zeros ? host_copy<int32_t>(m.zero_point) : std::vector<int32_t>();
      plain = unpack_ct_int4(packed.data(), zeros ? z.data() : nullptr, scales.data(), rows, cols, m.group);
    }
    try {
      dst.set_rows(int(e), int(row0), plain.source());
    } catch (const Error& err) {
      fail("{}: '{}': {}", op, m.name, err.what());
    }
  }

  /// The W4A16 scratch for (top_k, E, H, I), grown to at least `tokens` tokens (a replaced one is freed with
  /// cudaFree, which waits for the work that uses it).
  MoeW4A16Workspace& w4_workspace(int tokens, int top_k, int experts, int hidden, int inter) {
    auto& ws = w4_workspaces_[{top_k, experts, hidden, inter}];
    if (!ws || ws->max_tokens < tokens) {
      const int n = std::max(tokens, ws ? std::min(2 * ws->max_tokens, 1 << 16) : 64);
      ws.reset();
      ws = std::make_unique<MoeW4A16Workspace>(n, top_k, experts, hidden, inter);
    }
    return *ws;
  }

  /// What the PLE gather kernel reads: shard k holds rows [k * rows_per_shard, ...) (equal shards, the last may be
  /// shorter). Tables whose shards are not like that are merged once into one GPU copy.
  struct GatherTable {
    DeviceArray<const void*> addresses;
    int64_t rows_per_shard = 0, rows = 0;
    Tensor merged;
    std::vector<std::weak_ptr<void>> shards;  ///< the memory the view was made from
    /// Whether `table` is still the table this view was made from (not a new one at a reused address).
    bool made_from(const PleTable& table) const {
      for (size_t i = 0; i < shards.size(); ++i) {
        const std::weak_ptr<void> now = table.shards[i].memory_ref();
        if (shards[i].expired() || shards[i].owner_before(now) || now.owner_before(shards[i])) return false;
      }
      return true;
    }
  };

  /// The gather view of `table`, made once per table (keyed by its shard addresses; a view whose memory was freed,
  /// so that a new table may have its addresses, is dropped).
  const GatherTable& gather_table(const PleTable& table) {
    std::vector<const void*> key;
    for (const Tensor& s : table.shards) key.push_back(s.data());
    auto it = gather_tables_.find(key);
    if (it != gather_tables_.end() && it->second.made_from(table)) return it->second;
    std::erase_if(gather_tables_, [](const auto& kv) {
      return std::any_of(kv.second.shards.begin(), kv.second.shards.end(), [](const auto& w) { return w.expired(); });
    });
    GatherTable g;
    for (const Tensor& s : table.shards) g.shards.push_back(s.memory_ref());
    const int64_t per = table.shards[0].dim(0);
    bool uniform = per > 0;
    for (size_t i = 0; i < table.shards.size(); ++i) {
      const int64_t h = table.shards[i].dim(0);
      g.rows += h;
      uniform = uniform && (i + 1 == table.shards.size() ? h <= per : h == per);
    }
    std::vector<const void*> addresses = key;
    g.rows_per_shard = per;
    if (!uniform) {
      g.merged = alloc({g.rows, table.head_dim}, table.shards[0].dtype(), "merged PLE table");
      int64_t at = 0;
      for (const Tensor& s : table.shards) {
        copy_rows(s, 0, g.merged, at, s.dim(0));
        at += s.dim(0);
      }
      addresses = {g.merged.data()};
      g.rows_per_shard = std::max<int64_t>(g.rows, 1);
    }
    g.addresses = to_device(addresses, "PLE shard addresses");
    return gather_tables_.insert_or_assign(std::move(key), std::move(g)).first->second;
  }

  /// gather_rows / scatter_rows: `rows` index the rows of dst (scatter) or src (gather); row ids are checked on
  /// the device (status word kStatusRows, reported at the next synchronisation).
  void copy_rows_indexed(const char* op, const Tensor& src, const Tensor& rows, const Tensor& dst, bool scatter) {
    check(rows, DType::I32, 1, op, "rows");
    check_device(src, op, "src");
    check_device(dst, op, "dst");
    const Tensor& indexed = scatter ? dst : src;
    const Tensor& packed = scatter ? src : dst;
    FN_CHECK(indexed.rank() >= 1 && packed.rank() >= 1 && src.dtype() == dst.dtype() && packed.dim(0) == rows.dim(0),
             "{}: {} and {} with {} row ids do not fit", op, src.str(), dst.str(), rows.dim(0));
    const size_t row = indexed.dim(0) ? indexed.nbytes() / size_t(indexed.dim(0)) : 0;
    FN_CHECK(packed.dim(0) == 0 || packed.nbytes() / size_t(packed.dim(0)) == row, "{}: row sizes of {} and {} differ",
             op, src.str(), dst.str());
    FN_CHECK(row % 4 == 0, "{}: rows of {} bytes; the kernel copies 4-byte words", op, row);
    FN_CUDA_CHECK(
        detail::launch_copy_rows_indexed(src.data(), dst.data(), dp<int32_t>(rows), rows.dim(0), int64_t(row / 4),
                                         indexed.dim(0), scatter, status(kStatusRows), stream()),
        op);
  }

  void check_device(const Tensor& t, const char* op, const char* what) const {
    FN_CHECK(t.defined(), "{}: {} is undefined", op, what);
    FN_CHECK(t.device() == Device::CUDA && t.device_index() == ctx_->device, "{}: {} is on {}:{}, expected cuda:{}", op,
             what, device_name(t.device()), t.device_index(), ctx_->device);
  }

  void check(const Tensor& t, DType dt, int rank, const char* op, const char* what) {
    use_device();
    check_device(t, op, what);
    FN_CHECK(t.dtype() == dt, "{}: {} has dtype {}, expected {}", op, what, t.str(), dtype_name(dt));
    FN_CHECK(rank < 0 || t.rank() == rank, "{}: {} is {}, expected rank {}", op, what, t.str(), rank);
  }

  /// Waits for the stream; throws Error for a failed kernel and for index errors the kernels recorded.
  void synchronize(const char* where) {
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

  std::shared_ptr<Context> ctx_;
  CudaOpsOptions options_;
  std::string name_;
  Blas blas_;
  std::map<std::vector<const void*>, GatherTable> gather_tables_;
  std::map<std::array<int, 4>, std::unique_ptr<MoeW4A16Workspace>> w4_workspaces_;
  /// PLE gathers begun on the side stream and not yet waited for, with what they read and write.
  struct PendingGather {
    Tensor rows, e;
    cudaEvent_t done = nullptr;
  };
  std::vector<PendingGather> pending_gathers_;
  /// profile_phase: the phase of each mark and the event recorded for it (profile_events_[i] for mark i).
  bool profiling_ = false;
  std::vector<const char*> profile_marks_;
  std::vector<cudaEvent_t> profile_events_;

  /// A_log and dt_bias of `w` as float32 [2 * nv] (A_log, then dt_bias), converted once per weight pair and kept
  /// while the weights live (a pair at reused addresses is converted anew).
  const float* gdn_gates(const GdnWeights& w, int64_t nv, const char* op) {
    GdnGates& g = gdn_gates_[{w.A_log.data(), w.dt_bias.data()}];
    const auto same = [](const std::weak_ptr<void>& a, const std::weak_ptr<void>& b) {
      return !a.expired() && !a.owner_before(b) && !b.owner_before(a);
    };
    if (!g.gates.defined() || !same(g.a_log, w.A_log.memory_ref()) || !same(g.dt_bias, w.dt_bias.memory_ref())) {
      g.gates = alloc({2 * nv}, DType::F32, "gdn gates");
      FN_CUDA_CHECK(detail::launch_f16_to_f32(dp<__half>(w.A_log), dp<float>(g.gates), nv, stream()), op);
      FN_CUDA_CHECK(detail::launch_f16_to_f32(dp<__half>(w.dt_bias), dp<float>(g.gates) + nv, nv, stream()), op);
      g.a_log = w.A_log.memory_ref();
      g.dt_bias = w.dt_bias.memory_ref();
    }
    return dp<const float>(g.gates);
  }
  struct GdnGates {
    Tensor gates;
    std::weak_ptr<void> a_log, dt_bias;
  };
  std::map<std::pair<const void*, const void*>, GdnGates> gdn_gates_;

  /// Shared by gdn_chunked and gdn_recurrent (one sequence, `state` [nv, dk, dv]) and by gdn_rule_batch (`batch` and
  /// `pool` [slots, nv, dk, dv] given: sequence s's rows start at batch->cu_seqlens[s], its state is in slot
  /// batch->slots[s]; the chunked form for a step with prefill chunks, the recurrence for a decode step).
  void gdn_rule(const char* op, const Tensor& qkv, const Tensor& a, const Tensor& b, const GdnWeights& w,
                const GdnDims& d, const Tensor& state, const Tensor& o, bool chunked, const StepBatch* batch = nullptr,
                const Tensor* pool = nullptr) {
    check(qkv, DType::F32, 2, op, "qkv");
    check(a, DType::F32, 2, op, "a");
    check(b, DType::F32, 2, op, "b");
    check(w.A_log, DType::F16, -1, op, "A_log");
    check(w.dt_bias, DType::F16, -1, op, "dt_bias");
    check(state, DType::F32, 3, op, "state");
    check(o, DType::F32, 2, op, "o");
    const int64_t T = qkv.dim(0), nv = d.num_v_heads;
    FN_CHECK(d.num_k_heads > 0 && nv % d.num_k_heads == 0 && d.k_head_dim > 0 && d.v_head_dim > 0,
             "{}: bad head geometry nk={} nv={} dk={} dv={}", op, d.num_k_heads, nv, d.k_head_dim, d.v_head_dim);
    FN_CHECK(qkv.dim(1) == d.conv_dim() && a.dim(0) == T && a.dim(1) == nv && b.shape() == a.shape() &&
                 w.A_log.numel() == nv && w.dt_bias.numel() == nv && state.dim(0) == nv &&
                 state.dim(1) == d.k_head_dim && state.dim(2) == d.v_head_dim && o.dim(0) == T &&
                 o.dim(1) == nv * d.v_head_dim,
             "{}: shapes do not fit: qkv {}, a {}, b {}, state {}, o {} (nk={} nv={} dk={} dv={})", op, qkv.str(),
             a.str(), b.str(), state.str(), o.str(), d.num_k_heads, nv, d.k_head_dim, d.v_head_dim);
    FN_CHECK(d.k_head_dim <= detail::kGdnMaxDk, "{}: key head dim {} exceeds the kernels' {}", op, d.k_head_dim,
             detail::kGdnMaxDk);
    if (T == 0) return;
    const int t = to_int(T, op, "tokens");
    const detail::GdnDims dims{int(d.num_k_heads), int(nv), int(d.k_head_dim), int(d.v_head_dim)};
    const int64_t C = qkv.dim(1), ld_o = nv * d.v_head_dim;
    const float* a_log = gdn_gates(w, nv, op);
    const float* dt_bias = a_log + nv;
    if (batch && chunked) {  // a step with prefill chunks: every sequence's rows, state in slot slots[s]
      FN_CUDA_CHECK(detail::launch_gdn_chunked_prefill(dp<const float>(qkv), C, dp<const float>(a), dp<const float>(b),
                                                       nv, a_log, dt_bias, dp<float>(*pool), dp<int32_t>(batch->slots),
                                                       dp<int32_t>(batch->seq_starts), int(batch->num_seqs), dims,
                                                       dp<float>(o), ld_o, stream()),
                    op);
      return;
    }
    if (batch) {  // a decode step: token b of sequence b, state in slot slots[b]
      FN_CUDA_CHECK(detail::launch_gdn_recurrent_step(dp<const float>(qkv), C, dp<const float>(a), dp<const float>(b),
                                                      nv, a_log, dt_bias, dp<float>(*pool), dp<int32_t>(batch->slots),
                                                      t, dims, dp<float>(o), ld_o, stream()),
                    op);
      return;
    }
    // One sequence in slot 0 with cu_seqlens {0, T}.
    Tensor seq = alloc({3}, DType::I32, "gdn sequence");
    int32_t* slots = dp<int32_t>(seq);
    FN_CUDA_CHECK(detail::launch_fill_i32(slots, 2, 0, stream()), op);      // slots[0] = 0, cu[0] = 0
    FN_CUDA_CHECK(detail::launch_fill_i32(slots + 2, 1, t, stream()), op);  // cu[1] = T
    if (chunked) {
      FN_CUDA_CHECK(detail::launch_gdn_chunked_prefill(dp<const float>(qkv), C, dp<const float>(a), dp<const float>(b),
                                                       nv, a_log, dt_bias, dp<float>(state), slots, slots + 1, 1, dims,
                                                       dp<float>(o), ld_o, stream()),
                    op);
    } else {
      for (int64_t i = 0; i < T; ++i) {  // token by token: the recurrence proper
        FN_CUDA_CHECK(detail::launch_gdn_recurrent_step(
                          dp<const float>(qkv) + i * C, C, dp<const float>(a) + i * nv, dp<const float>(b) + i * nv, nv,
                          a_log, dt_bias, dp<float>(state), slots, 1, dims, dp<float>(o) + i * ld_o, ld_o, stream()),
                      op);
      }
    }
  }
};

}  // namespace
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

std::shared_ptr<Ops> make_cuda_ops(int device) {
  return make_cuda_ops(device, CudaOpsOptions::from_env());
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
