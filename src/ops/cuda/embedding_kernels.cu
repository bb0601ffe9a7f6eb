// Embedding gather: x0 = embed_tokens[ids], written `copies` times side by side (the S hyper-connection streams
// all start equal: MODEL.md "Top level"). Ids outside the vocabulary give zeros and set the status word.
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/embedding_kernels.h"

namespace flashnext::cuda::detail {
namespace {

__global__ void embed_kernel(const __half* __restrict__ table, int64_t vocab, int hidden,
                             const int32_t* __restrict__ ids, int copies, __half* __restrict__ out, int32_t* status) {
  const int t = blockIdx.x;
  const int64_t id = ids[t];
  const bool ok = id >= 0 && id < vocab;
  if (!ok && threadIdx.x == 0 && status) atomicOr(status, 1);
  __half* o = out + int64_t(t) * copies * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const __half v = ok ? table[id * hidden + i] : to_h(0.f);
    for (int c = 0; c < copies; ++c) o[int64_t(c) * hidden + i] = v;
  }
}

}  // namespace

#ifndef __CUDACC_RTC__  // host launchers (NVRTC, used by the SM70 check, compiles device code only)
cudaError_t launch_embed(const __half* table, int64_t vocab, int hidden, const int32_t* ids, int tokens, int copies,
                         __half* out, int32_t* status, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  embed_kernel<<<tokens, 256, 0, stream>>>(table, vocab, hidden, ids, copies, out, status);
  return cudaGetLastError();
}
#endif

}  // namespace flashnext::cuda::detail
