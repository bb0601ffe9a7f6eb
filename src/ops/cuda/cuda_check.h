// Error checks for the CUDA backend's host code (.cpp files only: fmt's compile-time format checks do not build
// under nvcc, so kernels live in *_kernels.cu files whose launchers return cudaError_t and the .cpp wrappers check).
#pragma once

#include <cuda_runtime_api.h>

#include "core/error.h"

/// FN_CUDA_CHECK(expr, what): evaluates a CUDA runtime call and throws flashnext::Error naming `what` (the op or
/// buffer) and the CUDA error when it did not return cudaSuccess.
#define FN_CUDA_CHECK(expr, what)                                                            \
  do {                                                                                       \
    cudaError_t fn_cuda_err_ = (expr);                                                       \
    if (fn_cuda_err_ != cudaSuccess)                                                         \
      ::flashnext::fail("CUDA error in {}: {} ({})", what, cudaGetErrorString(fn_cuda_err_), \
                        cudaGetErrorName(fn_cuda_err_));                                     \
  } while (0)
