// Dense FP16 matrix products through cuBLAS (allowed for the SM70 baseline: cuBLAS picks V100 HMMA kernels there).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

namespace flashnext::cuda {

/// Element type of a linear layer's output.
enum class OutType { F16, F32 };

/// One cuBLAS handle. Not thread-safe: one per host thread that issues work.
class Blas {
 public:
  Blas();
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  /// y[M, N] = x[M, K] · w[N, K]^T (nn.Linear without bias), row-major, FP16 inputs, FP32 accumulation, output
  /// FP16 or FP32 with leading dimension ldy (elements; >= N). `beta` = 1 adds to y. Runs on `stream`. Throws
  /// Error on bad sizes or a cuBLAS failure, naming `what`.
  void linear(const __half* x, int M, int K, const __half* w, int N, void* y, OutType out, int ldy, cudaStream_t stream,
              const char* what, float beta = 0.f);

  /// The same with strided x: x's rows are ldx (>= K) elements apart.
  void linear_strided(const __half* x, int ldx, int M, int K, const __half* w, int N, void* y, OutType out, int ldy,
                      cudaStream_t stream, const char* what, float beta = 0.f);

 private:
  /// cuBLAS's workspace (cublasSetWorkspace): NVIDIA's recommendation for Hopper, enough for every GPU before it.
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;
  void* handle_ = nullptr;  // cublasHandle_t, kept opaque so that kernel sources never include cuBLAS
  void* workspace_ = nullptr;
};

}  // namespace flashnext::cuda
