// Tensor-core instructions of compute capability 8.0 and newer that the faster kernels beside the SM70 baseline use:
// mma.sync m16n8k16 (FP16 inputs, FP32 accumulation), ldmatrix (shared memory to fragments) and cp.async (global to
// shared memory without registers), PTX ISA 7.0. Below
// 8.0 they compile to nothing: a kernel built on them is an empty body there, and the host picks it only where its
// code holds them (kernel_ptx_version >= 80, kernel_attributes.h). Fragment layouts: PTX ISA "Matrix fragments for
// mma.m16n8k16" (g = lane / 4, t = lane % 4).
#pragma once

#include "ops/cuda/cuda_stdint.h"

namespace flashnext::cuda::detail {

/// D += A B for one m16n8k16 step: a0..a3 = A rows g / g + 8 at k-slots {2t, 2t+1}, rows g / g + 8 at {2t+8, 2t+9};
/// b0, b1 = B column g at the same k-slots; d[0..1] row g, d[2..3] row g + 8 (columns 2t, 2t+1).
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

/// Four 8x8 FP16 matrices from shared memory: lanes 8i..8i+7 give the 16-byte row addresses of matrix i, and r[i]
/// holds row g, columns 2t and 2t + 1 of matrix i. With `trans`, r[i] holds rows 2t and 2t + 1 of column g (the
/// matrix transposed). Addresses 16-byte aligned.
template <bool trans = false>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
  if (trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#else
  r[0] = r[1] = r[2] = r[3] = 0;
#endif
}

/// 16 bytes from global to shared memory, asynchronously (cp.async.cg: through L2 only); with valid false the 16
/// bytes are zeros and nothing is read (gmem must still be a mapped address). Both 16-byte aligned.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned dst = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0));
#endif
}
/// Closes the group of the cp.async issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
/// Waits until at most N committed groups of this thread are pending (their shared memory then written; a barrier
/// makes it visible to the other threads).
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

}  // namespace flashnext::cuda::detail
