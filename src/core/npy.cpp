#include "core/npy.h"

#include <cstring>
#include <fstream>
#include <regex>

#include "core/error.h"

namespace flashnext {

namespace {

const char* descr_of(DType t) {
  switch (t) {
    case DType::F32:
      return "<f4";
    case DType::I32:
      return "<i4";
    case DType::I64:
      return "<i8";
    default:
      return nullptr;
  }
}

}  // namespace

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

const float* NpyArray::f32() const {
  FN_CHECK(dtype == DType::F32, "npy array holds {}, not F32", dtype_name(dtype));
  return reinterpret_cast<const float*>(data.data());
}

void write_npy(const std::string& path, DType dtype, const std::vector<int64_t>& shape, const void* data) {
  const char* descr = descr_of(dtype);
  FN_CHECK(descr, "{}: cannot write dtype {} to .npy (supported: F32, I32, I64)", path, dtype_name(dtype));
  std::string shape_str = "(";
  int64_t numel = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    shape_str += std::to_string(shape[i]) + (shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
    numel *= shape[i];
  }
  shape_str += ")";
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr, shape_str);
  // magic(6) + version(2) + len(2) + header + '\n' padded to a multiple of 64.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  if (!out) fail("{}: cannot open for writing", path);
  const uint16_t hlen = uint16_t(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  const char len_bytes[2] = {char(hlen & 0xff), char(hlen >> 8)};
  out.write(len_bytes, 2);
  out.write(header.data(), std::streamsize(header.size()));
  out.write(static_cast<const char*>(data), std::streamsize(numel * int64_t(dtype_size(dtype))));
  if (!out) fail("{}: write failed", path);
}

NpyArray read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open .npy file", path);
  char magic[10];
  in.read(magic, 10);
  if (!in || std::memcmp(magic, "\x93NUMPY", 6) != 0) fail("{}: not a .npy file (bad magic)", path);
  const int major = magic[6];
  size_t hlen;
  if (major == 1) {
    hlen = uint8_t(magic[8]) | size_t(uint8_t(magic[9])) << 8;
  } else {
    char more[2];
    in.read(more, 2);
    hlen = uint8_t(magic[8]) | size_t(uint8_t(magic[9])) << 8 | size_t(uint8_t(more[0])) << 16 |
           size_t(uint8_t(more[1])) << 24;
  }
  std::string header(hlen, '\0');
  in.read(header.data(), std::streamsize(hlen));
  if (!in) fail("{}: truncated .npy header", path);
  std::smatch m;
  if (!std::regex_search(header, m, std::regex("'descr':\\s*'([^']*)'"))) fail("{}: .npy header has no descr", path);
  NpyArray a;
  const std::string descr = m[1];
  if (descr == "<f4")
    a.dtype = DType::F32;
  else if (descr == "<i4")
    a.dtype = DType::I32;
  else if (descr == "<i8")
    a.dtype = DType::I64;
  else
    fail("{}: unsupported .npy dtype '{}' (supported: <f4, <i4, <i8)", path, descr);
  if (std::regex_search(header, std::regex("'fortran_order':\\s*True")))
    fail("{}: Fortran-order .npy not supported", path);
  if (!std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)")))
    fail("{}: .npy header has no shape", path);
  const std::string dims = m[1];
  const std::regex number("\\d+");
  for (std::sregex_iterator it(dims.begin(), dims.end(), number), end; it != end; ++it) {
    a.shape.push_back(std::stoll(it->str()));
  }
  a.data.resize(size_t(a.numel()) * dtype_size(a.dtype));
  in.read(reinterpret_cast<char*>(a.data.data()), std::streamsize(a.data.size()));
  if (!in) fail("{}: truncated .npy data (expected {} bytes)", path, a.data.size());
  return a;
}

}  // namespace flashnext
