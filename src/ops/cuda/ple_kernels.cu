// PLE (hashed n-gram embedding) kernels: MODEL.md "PLE"; reference Qwen4ExpTextNGramEmbedding and
// Qwen4ExpTextPLELayer. The table may live in device memory or in pinned host memory that the gather reads
// directly over the host link (UVA). FP8 rows are decoded in software (SM70 has no FP8 instructions).
#ifndef __CUDACC_RTC__
#include "ops/cuda/kernel_attributes.h"
#endif
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/ple_kernels.h"

namespace flashnext::cuda::detail {
namespace {

constexpr int kThreads = 256;

// OCP FP8 E4M3 ("fn": no infinities, S.1111.111 is NaN) to float.
__device__ __forceinline__ float fp8e4m3_to_float(uint8_t v) {
  const uint32_t sign = uint32_t(v & 0x80u) << 24, exp = (v >> 3) & 0xfu, man = v & 0x7u;
  if (exp == 0xfu && man == 0x7u) return __int_as_float(0x7fc00000);
  float mag;
  if (exp == 0)
    mag = float(man) * 0.001953125f;  // subnormal: man * 2^-9
  else
    mag = __uint_as_float(((exp + 120u) << 23) | (man << 20));
  return __uint_as_float(__float_as_uint(mag) | sign);
}

// Element i of a float array of `type` (kPleF16, kPleBF16 or kPleF32).
__device__ __forceinline__ float float_at(const void* p, int64_t i, int type) {
  if (type == kPleF32) return static_cast<const float*>(p)[i];
  const uint16_t bits = static_cast<const uint16_t*>(p)[i];
  return type == kPleBF16 ? __uint_as_float(uint32_t(bits) << 16) : __half2float(__ushort_as_half(bits));
}

// One warp per (token, head): out[t, h*row_dim ..] = decode(table[rows[t, h]]). TO: the output type (FP16, or
// FP32 for the ops interface).

template <class TO>
__global__ void ple_gather_kernel(const void* const* __restrict__ shards, int num_shards, int64_t rows_per_shard,
                                  int64_t total_rows, int table_type, float scale, PleGroupScales group_scales,
                                  int row_dim, const int64_t* __restrict__ rows, int tokens, int heads,
                                  TO* __restrict__ out, int32_t* status) {
  pdl_begin();
  const int64_t item = (int64_t(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (item >= int64_t(tokens) * heads) return;
  const int64_t row = rows[item];
  TO* o = out + item * row_dim;
  const int64_t shard = row >= 0 ? row / rows_per_shard : -1;
  if (row < 0 || row >= total_rows || shard >= num_shards) {
    if (lane == 0 && status) atomicOr(status, 1);
    for (int d = lane; d < row_dim; d += 32) o[d] = from_f<TO>(0.f);
    return;
  }
  const int64_t local = row - shard * rows_per_shard;
  if (table_type == kPleI8) {  // q * the row's group scale in float32, as the CPU (loader/quant.h)
    const int8_t* src = static_cast<const int8_t*>(shards[shard]) + local * row_dim;
    const int64_t scale0 = local * (row_dim / group_scales.group);
    for (int d = lane; d < row_dim; d += 32)
      o[d] = from_f<TO>(float(src[d]) *
                        float_at(group_scales.shards[shard], scale0 + d / group_scales.group, group_scales.type));
  } else if (table_type == kPleF8E4M3) {
    const uint8_t* src = static_cast<const uint8_t*>(shards[shard]) + local * row_dim;
    for (int d = lane; d < row_dim; d += 32) o[d] = from_f<TO>(fp8e4m3_to_float(src[d]) * scale);
  } else {
    for (int d = lane; d < row_dim; d += 32)
      o[d] = from_f<TO>(float_at(shards[shard], local * row_dim + d, table_type) * scale);
  }
}

// Both output types are compiled in every build (NVRTC included, for the SM70 check).
template __global__ void ple_gather_kernel<float>(const void* const*, int, int64_t, int64_t, int, float, PleGroupScales,
                                                  int, const int64_t*, int, int, float*, int32_t*);

}  // namespace

#ifndef __CUDACC_RTC__  // host launchers (NVRTC, used by the SM70 check, compiles device code only)
cudaError_t launch_ple_gather(const void* const* shards, int num_shards, int64_t rows_per_shard, int64_t total_rows,
                              int table_type, float scale, PleGroupScales group_scales, int row_dim,
                              const int64_t* rows, int tokens, int heads, float* out, int32_t* status,
                              cudaStream_t stream) {
  const int64_t items = int64_t(tokens) * heads;
  if (items == 0) return cudaSuccess;
  launch(ple_gather_kernel<float>, unsigned((items * 32 + kThreads - 1) / kThreads), kThreads, 0, stream, shards,
         num_shards, rows_per_shard, total_rows, table_type, scale, group_scales, row_dim, rows, tokens, heads, out,
         status);
  return cudaGetLastError();
}

#endif

}  // namespace flashnext::cuda::detail
