// Device helpers shared by the baseline (SM70) kernels: conversions, activations and block reductions.
// Only instructions that a V100 has: FP16 storage with FP32 arithmetic, warp shuffles.
#pragma once

#include <cuda_fp16.h>

#include "ops/cuda/cuda_stdint.h"
#include "ops/cuda/grid_barrier.h"

namespace flashnext::cuda {

/// The two halves of pdl_begin() (below): the wait for the kernels ahead of this one in the stream (PTX
/// griddepcontrol.wait: they have finished and their writes are visible), and the launch of the next kernel of the
/// stream onto the SMs this grid leaves free (griddepcontrol.launch_dependents), where it waits in turn. Apart, for a
/// kernel whose blocks wait for each other (grid_barrier): it may launch its dependents only after its barrier, since
/// a dependent scheduled earlier could take the SM room that blocks of this grid still need to become resident, and
/// then wait for them forever. Compute capability 9.0 and newer; nothing below (a V100 has no programmatic dependent
/// launch), and launch() does not ask for it for a kernel compiled so (kernel_waits_for_dependencies).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// The first statement of every kernel launched by launch() (kernel_attributes.h): pdl_wait(), then
/// pdl_launch_dependents(). Nothing of a kernel may read or write global memory before it.
__device__ __forceinline__ void pdl_begin() {
  pdl_wait();
  pdl_launch_dependents();
}

/// pdl_wait() with a weights prologue: with `early`, load_weights() runs first, so that its loads are in flight while
/// the kernel ahead still runs, then pdl_wait(); without, pdl_wait() first. load_weights may read only weights, memory
/// that no kernel writes while steps run (the model's weights, written at load: the weight operands of the ops,
/// ops.h), and may write only registers; the caller passes `early` from early_weights() (kernel_attributes.h:
/// FLASHNEXT_CUDA_EARLY_WEIGHTS=0 turns it off). Below compute capability 9.0 the order makes no difference: the
/// kernel starts after the one ahead has finished. The opening of a kernel with a grid barrier, which calls
/// pdl_launch_dependents() after it.
template <class LoadWeights>
__device__ __forceinline__ void pdl_wait_after_weights(bool early, LoadWeights&& load_weights) {
  if (early) {
    load_weights();
    pdl_wait();
  } else {
    pdl_wait();
    load_weights();
  }
}

/// pdl_wait_after_weights, then pdl_launch_dependents(): the only other way a kernel launched by launch() may begin.
template <class LoadWeights>
__device__ __forceinline__ void pdl_begin_after_weights(bool early, LoadWeights&& load_weights) {
  pdl_wait_after_weights(early, load_weights);
  pdl_launch_dependents();
}

/// Nanoseconds of the GPU's global timer.
__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// Waits until every block of the grid has called it: what a block wrote to global memory before the call is visible
/// to every block after it (read it with ld.cg, e.g. __ldcg: the L1 is not coherent). Every block of the grid must be
/// resident at once (a cooperative launch, a grid no larger than the GPU holds, and no dependent launched before the
/// barrier: pdl_wait_after_weights). The last block to arrive resets `arrived` and advances `generation`, which the
/// others watch; a wait longer than 10 s traps: the launch fails with an error instead of hanging the stream, and the
/// CUDA context is lost with it (every later call fails), as after any kernel fault.
__device__ __forceinline__ void grid_barrier(GridBarrier* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned int* generation = &bar->generation;
    const unsigned int seen = *generation;  // cannot advance before this block arrives
    __threadfence();                        // this block's writes before its arrival
    const unsigned int blocks = gridDim.x * gridDim.y * gridDim.z;
    if (atomicAdd(&bar->arrived, 1u) == blocks - 1) {
      atomicExch(&bar->arrived, 0u);
      __threadfence();
      atomicAdd(&bar->generation, 1u);
    } else {
      const unsigned long long start = global_timer_ns();
      while (*generation == seen) {
        __nanosleep(64);
        if (global_timer_ns() - start > 10000000000ull) __trap();
      }
    }
    __threadfence();
  }
  __syncthreads();
}

__device__ __forceinline__ float to_f(__half x) {
  return __half2float(x);
}
__device__ __forceinline__ float to_f(float x) {
  return x;
}
__device__ __forceinline__ __half to_h(float x) {
  return __float2half_rn(x);
}

/// FP16x2 halves of a float: x = hi + lo up to about 2^-22 relative (where |x| >= 2^-3; smaller, lo is an FP16
/// subnormal: at most 2^-25 absolute); products of the halves on the tensor cores (hi·hi + hi·lo + lo·hi, or hi·w +
/// lo·w against FP16 weights) keep float32 accuracy.
__device__ __forceinline__ void split_f16x2(float x, __half* hi, __half* lo) {
  const __half h = __float2half_rn(x);
  *hi = h;
  *lo = __float2half_rn(x - __half2float(h));
}
/// float -> T for the kernels templated on their activation type (FP16 storage, or FP32 for the ops interface's
/// float32 activations).
template <class T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_f<__half>(float x) {
  return __float2half_rn(x);
}

/// The 32 bits of a half2 (low half in bits 0..15), for packed stores.
__device__ __forceinline__ uint32_t h2_bits(__half2 h) {
  return uint32_t(__half_as_ushort(__low2half(h))) | (uint32_t(__half_as_ushort(__high2half(h))) << 16);
}

__device__ __forceinline__ float sigmoidf_(float x) {
  return 1.f / (1.f + expf(-x));
}
__device__ __forceinline__ float siluf_(float x) {
  return x / (1.f + expf(-x));
}
/// softplus as torch.nn.functional.softplus (beta 1, threshold 20).
__device__ __forceinline__ float softplusf_(float x) {
  return x > 20.f ? x : log1pf(expf(x));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Sum of `v` over the whole block (blockDim.x a multiple of 32, at most 1024). `scratch` holds 32 floats; the
/// result is returned to every thread. Contains __syncthreads: call from all threads.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = lane < nwarps ? scratch[lane] : 0.f;
  return warp_sum(r);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = lane < nwarps ? scratch[lane] : -__int_as_float(0x7f800000);
  return warp_max(r);
}

/// Maps a float to an unsigned key whose unsigned order is the float order (-inf < ... < +inf; NaN above +inf).
__device__ __forceinline__ uint32_t float_order_key(float f) {
  uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/// Rotary cos/sin for rotary pair i (0 <= i < rotary_dims/2) at `position`, computed as the reference does:
/// inv_freq = 1 / theta^(2i/R) in float32, angle = inv_freq * position in float32.
__device__ __forceinline__ void rope_cos_sin(int i, int rotary_dims, float theta, int64_t position, float* c,
                                             float* s) {
  float inv_freq = 1.f / powf(theta, float(2 * i) / float(rotary_dims));
  float angle = inv_freq * float(position);
  sincosf(angle, s, c);
}

}  // namespace flashnext::cuda
