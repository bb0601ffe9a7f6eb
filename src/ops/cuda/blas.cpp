#include "ops/cuda/blas.h"

#include <cublas_v2.h>

#include "core/error.h"

namespace flashnext::cuda {

namespace {
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) fail("cuBLAS error in {}: {}", what, cublasGetStatusString(s));
}
}  // namespace

Blas::Blas() {
  cublasHandle_t h = nullptr;
  check(cublasCreate(&h), "cublasCreate");
  handle_ = h;
  // A workspace of its own, so that cuBLAS allocates nothing inside a recorded step (CUDA graphs) either.
  if (cudaMalloc(&workspace_, kWorkspaceBytes) != cudaSuccess) {
    cudaGetLastError();
    cublasDestroy(h);
    fail("cuBLAS: cannot allocate its {} MiB workspace", kWorkspaceBytes >> 20);
  }
  check(cublasSetWorkspace(h, workspace_, kWorkspaceBytes), "cublasSetWorkspace");
}

Blas::~Blas() {
  if (handle_) cublasDestroy(static_cast<cublasHandle_t>(handle_));
  if (workspace_) cudaFree(workspace_);
}

void Blas::linear(const __half* x, int M, int K, const __half* w, int N, void* y, OutType out, int ldy,
                  cudaStream_t stream, const char* what, float beta) {
  linear_strided(x, K, M, K, w, N, y, out, ldy, stream, what, beta);
}

void Blas::linear_strided(const __half* x, int ldx, int M, int K, const __half* w, int N, void* y, OutType out, int ldy,
                          cudaStream_t stream, const char* what, float beta) {
  FN_CHECK(M >= 0 && K > 0 && N > 0 && ldx >= K && ldy >= N, "{}: bad linear shape M={} K={} N={} ldx={} ldy={}", what,
           M, K, N, ldx, ldy);
  if (M == 0) return;
  auto h = static_cast<cublasHandle_t>(handle_);
  check(cublasSetStream(h, stream), what);
  const float alpha = 1.f;
  // Row-major y[M,N] = x[M,K] w[N,K]^T is column-major y^T[N,M] = w^T... : op(A)=T on w (K x N col-major), B = x.
  check(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, w, CUDA_R_16F, K, x, CUDA_R_16F, ldx, &beta, y,
                     out == OutType::F16 ? CUDA_R_16F : CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        what);
}

}  // namespace flashnext::cuda
