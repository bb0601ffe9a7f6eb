// NumPy .npy files (format version 1.0): write and read little-endian C-order arrays.
//
// Format (https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html): magic "\x93NUMPY", version
// 1.0, a little-endian uint16 header length, an ASCII dict {'descr': '<f4', 'fortran_order': False, 'shape': (..)}
// padded with spaces and a newline so that the data starts at a multiple of 64 bytes, then the raw data.
// Supported element types: float32 ('<f4'), int32 ('<i4'), int64 ('<i8').
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace flashnext {

/// An array read from a .npy file.
struct NpyArray {
  DType dtype = DType::F32;  ///< F32, I32 or I64
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  ///< numel * dtype_size bytes, C order

  int64_t numel() const;
  const float* f32() const;  ///< data as float; throws Error unless dtype is F32
};

/// Writes `shape`-shaped C-order data of type `dtype` (F32, I32 or I64) to `path`. Throws Error when the file cannot
/// be written or the dtype is not supported.
void write_npy(const std::string& path, DType dtype, const std::vector<int64_t>& shape, const void* data);

/// Reads a .npy file written by write_npy or NumPy. Throws Error naming the file for a bad magic, an unsupported
/// dtype or Fortran order, or a truncated file.
NpyArray read_npy(const std::string& path);

}  // namespace flashnext
