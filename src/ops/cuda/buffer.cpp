#include "ops/cuda/buffer.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include "ops/cuda/cuda_check.h"

namespace flashnext::cuda {

DeviceMemory::DeviceMemory(size_t bytes, std::string what) : bytes_(bytes) {
  if (bytes == 0) return;
  cudaError_t err = cudaMalloc(&ptr_, bytes);
  if (err != cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    cudaGetLastError();
    cudaMemGetInfo(&free_b, &total_b);
    fail("cannot allocate {} bytes of device memory for {}: {} ({} bytes free of {})", bytes, what,
         cudaGetErrorString(err), free_b, total_b);
  }
}

DeviceMemory::~DeviceMemory() {
  if (ptr_) cudaFree(ptr_);
}

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

PinnedMemory::PinnedMemory(size_t bytes, std::string what) : bytes_(bytes) {
  if (bytes == 0) return;
  cudaError_t err = cudaHostAlloc(&host_, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
  if (err != cudaSuccess) {
    cudaGetLastError();
    long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    fail(
        "cannot pin {} bytes ({:.2f} GiB) of host memory for {}: {}; about {:.2f} GiB of host memory is free, "
        "{:.2f} GiB are needed",
        bytes, bytes / 1073741824.0, what, cudaGetErrorString(err), double(pages) * page / 1073741824.0,
        bytes / 1073741824.0);
  }
  err = cudaHostGetDevicePointer(&dev_, host_, 0);
  if (err != cudaSuccess) {
    cudaFreeHost(host_);
    host_ = nullptr;
    fail("pinned buffer for {} has no device address: {}", what, cudaGetErrorString(err));
  }
}

PinnedMemory::~PinnedMemory() {
  if (host_) cudaFreeHost(host_);
}

PinnedMemory& PinnedMemory::operator=(PinnedMemory&& o) noexcept {
  if (this != &o) {
    if (host_) cudaFreeHost(host_);
    host_ = std::exchange(o.host_, nullptr);
    dev_ = std::exchange(o.dev_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void copy_to_device(void* dst, const void* src, size_t bytes, const char* what) {
  if (bytes) FN_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), what);
}

void copy_to_host(void* dst, const void* src, size_t bytes, const char* what) {
  if (bytes) FN_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), what);
}

}  // namespace flashnext::cuda
