// Tensor: a typed, shaped, contiguous block of memory on one device, with shared ownership.
//
// A Tensor is a handle: copying it shares the memory (like torch.Tensor). Memory is allocated by a backend
// (`Ops::empty`, `Ops::upload`, ...), never by model code, and only backends read or write it: model code passes
// tensors to ops and downloads results through `Ops::download`. Tensors are always dense and row-major (C order);
// `view` reshapes and `rows` slices dimension 0 without copying.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace flashnext {

/// Where a tensor's memory lives.
enum class Device : uint8_t { CPU, CUDA };

inline const char* device_name(Device d) {
  return d == Device::CPU ? "cpu" : "cuda";
}

using Shape = std::vector<int64_t>;

inline int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

class Tensor {
 public:
  Tensor() = default;
  /// Wraps `data` (owned through `owner`, which may be null for borrowed memory that outlives the tensor).
  Tensor(std::shared_ptr<void> owner, void* data, DType dtype, Shape shape, Device device, int device_index = 0)
      : owner_(std::move(owner)),
        data_(data),
        dtype_(dtype),
        shape_(std::move(shape)),
        device_(device),
        device_index_(device_index) {}

  bool defined() const { return data_ != nullptr || (!shape_.empty() && numel() == 0); }
  /// A weak reference to the memory's owner: expired once every tensor of that memory is gone (backends that cache
  /// something per tensor, keyed by address, use it to tell a reused address from the tensor they saw).
  std::weak_ptr<void> memory_ref() const { return owner_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int device_index() const { return device_index_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return int(shape_.size()); }
  /// Size of dimension `i`; negative `i` counts from the end.
  int64_t dim(int i) const {
    const int r = rank();
    FN_CHECK(i >= -r && i < r, "tensor {}: dimension {} out of range", str(), i);
    return shape_[size_t(i < 0 ? i + r : i)];
  }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }

  /// Raw device pointer. Only backends dereference it.
  void* data() const { return data_; }
  template <class T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }

  /// The same memory with another shape of equal element count. An 8-bit weight (scales() defined) keeps its
  /// scales only under its own shape; another shape throws Error.
  Tensor view(Shape shape) const {
    FN_CHECK(shape_numel(shape) == numel(), "tensor {}: cannot view as [{}]", str(), fmt::join(shape, ", "));
    FN_CHECK(!scales_ || shape == shape_, "8-bit weight {}: cannot view as [{}] (its scales follow its rows)", str(),
             fmt::join(shape, ", "));
    Tensor t = *this;
    t.shape_ = std::move(shape);
    return t;
  }
  /// Rows [begin, end) of dimension 0, sharing memory (an 8-bit weight's scales: the same rows).
  Tensor rows(int64_t begin, int64_t end) const {
    FN_CHECK(rank() >= 1 && begin >= 0 && begin <= end && end <= shape_[0], "tensor {}: rows [{}, {}) out of range",
             str(), begin, end);
    Tensor t = *this;
    if (scales_) t.scales_ = std::make_shared<const Tensor>(scales_->rows(begin, end));
    t.shape_[0] = end - begin;
    t.data_ = static_cast<uint8_t*>(data_) + size_t(begin) * (shape_[0] ? nbytes() / size_t(shape_[0]) : 0);
    return t;
  }

  /// Bytes [offset, offset + numel(shape) * size(dtype)) of this tensor's memory as a tensor of `dtype` and `shape`
  /// (sharing memory): the sections of one uploaded byte buffer. Throws Error when the range leaves the tensor or
  /// `offset` is not a multiple of the element size.
  Tensor bytes_as(int64_t offset, DType dtype, Shape shape) const {
    const int64_t size = int64_t(dtype_size(dtype)), end = offset + shape_numel(shape) * size;
    FN_CHECK(offset >= 0 && offset % size == 0 && end <= int64_t(nbytes()),
             "tensor {}: bytes [{}, {}) as {}[{}] out of range or misaligned", str(), offset, end, dtype_name(dtype),
             fmt::join(shape, ", "));
    Tensor t = *this;
    t.scales_.reset();
    t.scale_group_ = 0;
    t.data_ = static_cast<uint8_t*>(data_) + offset;
    t.dtype_ = dtype;
    t.shape_ = std::move(shape);
    return t;
  }

  /// An 8-bit linear weight (W8A16, `Ops::load_w8_linear`): this tensor holds the codes [rows, cols] (I8, or
  /// F8_E4M3), `scales` the float32 scales [rows, ceil(cols / group)] beside them, on the same device:
  /// value[n, k] = float(code[n, k]) * scales[n, k / group] (one float32 multiply). Returns the codes with the scales
  /// attached (sharing memory). Throws Error for another dtype or rank, or scales of another shape.
  Tensor with_scales(Tensor scales, int64_t group) const {
    FN_CHECK((dtype_ == DType::I8 || dtype_ == DType::F8_E4M3) && rank() == 2 && group > 0,
             "8-bit weight {}: codes must be I8 or F8_E4M3 [rows, cols] with a positive group (got {})", str(), group);
    FN_CHECK(scales.dtype() == DType::F32 && scales.rank() == 2 && scales.dim(0) == shape_[0] &&
                 scales.dim(1) == (shape_[1] + group - 1) / group && scales.device() == device_ &&
                 scales.device_index() == device_index_,
             "8-bit weight {}: scales {} must be F32 [{}, {}] on the same device", str(), scales.str(), shape_[0],
             (shape_[1] + group - 1) / group);
    Tensor t = *this;
    t.scales_ = std::make_shared<const Tensor>(std::move(scales));
    t.scale_group_ = group;
    return t;
  }
  /// Whether this is an 8-bit weight (with_scales).
  bool has_scales() const { return scales_ != nullptr; }
  /// An 8-bit weight's scales [rows, ceil(cols / scale_group())]; throws Error for another tensor.
  const Tensor& scales() const {
    FN_CHECK(scales_ != nullptr, "tensor {} has no scales (not an 8-bit weight)", str());
    return *scales_;
  }
  /// Inputs per scale of an 8-bit weight (cols for one scale a row); 0 for another tensor.
  int64_t scale_group() const { return scale_group_; }

  /// "F32[3, 4]@cpu", for messages.
  std::string str() const {
    return fmt::format("{}[{}]@{}", dtype_name(dtype_), fmt::join(shape_, ", "), device_name(device_));
  }

 private:
  std::shared_ptr<void> owner_;
  void* data_ = nullptr;
  DType dtype_ = DType::F32;
  Shape shape_;
  Device device_ = Device::CPU;
  int device_index_ = 0;
  std::shared_ptr<const Tensor> scales_;  ///< an 8-bit weight's scales (with_scales), else null
  int64_t scale_group_ = 0;
};

}  // namespace flashnext
