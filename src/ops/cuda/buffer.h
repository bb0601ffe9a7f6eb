// Owning memory for the CUDA backend: device buffers and pinned, mapped host buffers (read by kernels through the
// unified address space). Sizes are exact: a buffer holds precisely the bytes asked for, never a rounded-up size
// (PEERS.md: a 47.7 GiB table rounded to 64 GiB got the process killed).
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace flashnext::cuda {

/// Device memory from cudaMalloc. Move-only; freed in the destructor. Throws Error (naming `what` and the bytes
/// asked for) when the allocation fails.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(size_t bytes, std::string what);
  ~DeviceMemory();
  DeviceMemory(DeviceMemory&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceMemory& operator=(DeviceMemory&& o) noexcept;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

/// A typed device array of `n` elements of T.
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(size_t n, std::string what) : mem_(n * sizeof(T), std::move(what)), n_(n) {}
  T* get() const { return static_cast<T*>(mem_.get()); }
  size_t size() const { return n_; }

 private:
  DeviceMemory mem_;
  size_t n_ = 0;
};

/// Pinned host memory from cudaHostAlloc(cudaHostAllocMapped | cudaHostAllocPortable), allocated at exactly
/// `bytes`. device() is the address kernels use to read it over the host link (UVA). Throws Error saying how
/// many bytes were needed, and how much host memory was available, when the allocation fails.
class PinnedMemory {
 public:
  PinnedMemory() = default;
  PinnedMemory(size_t bytes, std::string what);
  ~PinnedMemory();
  PinnedMemory(PinnedMemory&& o) noexcept
      : host_(std::exchange(o.host_, nullptr)),
        dev_(std::exchange(o.dev_, nullptr)),
        bytes_(std::exchange(o.bytes_, 0)) {}
  PinnedMemory& operator=(PinnedMemory&& o) noexcept;
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;

  void* host() const { return host_; }
  const void* device() const { return dev_; }
  size_t bytes() const { return bytes_; }

 private:
  void* host_ = nullptr;
  void* dev_ = nullptr;
  size_t bytes_ = 0;
};

/// Copies `n` elements host -> device (synchronous). Throws Error naming `what` on failure.
void copy_to_device(void* dst, const void* src, size_t bytes, const char* what);
/// Copies device -> host (synchronous).
void copy_to_host(void* dst, const void* src, size_t bytes, const char* what);

template <class T>
void upload(DeviceArray<T>& dst, const std::vector<T>& src) {
  copy_to_device(dst.get(), src.data(), std::min(dst.size(), src.size()) * sizeof(T), "upload");
}
template <class T>
std::vector<T> download(const T* src, size_t n) {
  std::vector<T> out(n);
  copy_to_host(out.data(), src, n * sizeof(T), "download");
  return out;
}
/// A device array holding a copy of `src`.
template <class T>
DeviceArray<T> to_device(const std::vector<T>& src, const char* what = "to_device") {
  DeviceArray<T> d(src.size() ? src.size() : 1, what);
  copy_to_device(d.get(), src.data(), src.size() * sizeof(T), what);
  return d;
}

}  // namespace flashnext::cuda
