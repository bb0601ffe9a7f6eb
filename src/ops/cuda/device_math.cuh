// Device helpers shared by the baseline (SM70) kernels: conversions, activations and block reductions.
// Only instructions that a V100 has: FP16 storage with FP32 arithmetic, warp shuffles.
#pragma once

#include <cuda_fp16.h>

#include "ops/cuda/cuda_stdint.h"

namespace flashnext::cuda {

/// The first statement of every kernel launched by launch() (kernel_attributes.h): waits until the kernels ahead of
/// this one in the stream have finished and their writes are visible (PTX griddepcontrol.wait), then lets the next
/// kernel of the stream be scheduled onto the SMs this grid leaves free (griddepcontrol.launch_dependents), where it
/// waits in turn. Nothing of a kernel may read or write global memory before it. Compute capability 9.0 and newer;
/// compiles to nothing below (a V100 has no programmatic dependent launch), and launch() does not ask for it for a
/// kernel compiled so (kernel_waits_for_dependencies).
__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// pdl_begin() with a weights prologue, the only other way a kernel launched by launch() may begin: with `early`,
/// load_weights() runs first, so that its loads are in flight while the kernel ahead still runs, then pdl_begin();
/// without, pdl_begin() first. load_weights may read only weights, memory that no kernel writes while steps run (the
/// model's weights, written at load: the weight operands of the ops, ops.h), and may write only registers; the
/// caller passes `early` from early_weights() (kernel_attributes.h: FLASHNEXT_CUDA_EARLY_WEIGHTS=0 turns it off).
/// Below compute capability 9.0 the order makes no difference: the kernel starts after the one ahead has finished.
template <class LoadWeights>
__device__ __forceinline__ void pdl_begin_after_weights(bool early, LoadWeights&& load_weights) {
  if (early) {
    load_weights();
    pdl_begin();
  } else {
    pdl_begin();
    load_weights();
  }
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
