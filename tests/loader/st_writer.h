// Test helpers: write small safetensors files and checkpoint folders into a per-test temporary directory.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loader/safetensors.h"

namespace flashnext::testing {

namespace fs = std::filesystem;

#ifndef FLASHNEXT_SOURCE_DIR
#define FLASHNEXT_SOURCE_DIR "."
#endif

inline std::string source_path(const std::string& rel) {
  return std::string(FLASHNEXT_SOURCE_DIR) + "/" + rel;
}

/// One tensor to write: safetensors dtype name, shape, raw little-endian bytes.
struct RawTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

inline RawTensor raw_from_view(const std::string& name, const TensorView& v) {
  return RawTensor{name, std::string(dtype_name(v.dtype)), v.shape, std::vector<uint8_t>(v.data, v.data + v.nbytes)};
}

/// Serialises `tensors` in the safetensors layout (header padded with spaces to a multiple of 8).
inline std::string safetensors_bytes(const std::vector<RawTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t off = 0;
  for (auto& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8) h.push_back(' ');
  std::string out(8, '\0');
  const uint64_t n = h.size();
  std::memcpy(out.data(), &n, 8);
  out += h;
  for (auto& t : tensors) out.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  return out;
}

inline void write_file(const fs::path& p, const std::string& data) {
  std::ofstream f(p, std::ios::binary);
  f.write(data.data(), std::streamsize(data.size()));
}

inline void write_json(const fs::path& p, const nlohmann::json& j) {
  write_file(p, j.dump(2));
}

inline nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

/// A fresh empty directory under the system temp dir, removed by the destructor.
struct TempDir {
  fs::path path;
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path = fs::temp_directory_path() / (std::string("flashnext-") + info->test_suite_name() + "-" + info->name() + "-" +
                                        std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string str() const { return path.string(); }
};

/// Every tensor of the checkpoint in `dir`, by name.
inline std::map<std::string, RawTensor> read_checkpoint(const std::string& dir) {
  Checkpoint c(dir);
  std::map<std::string, RawTensor> out;
  for (auto& [name, v] : c.tensors()) out.emplace(name, raw_from_view(name, *v));
  return out;
}

/// Writes `tensors` as a single-file checkpoint `dir/model.safetensors` with `config`.
inline void write_checkpoint(const fs::path& dir, const nlohmann::json& config, const std::vector<RawTensor>& tensors) {
  fs::create_directories(dir);
  write_json(dir / "config.json", config);
  write_file(dir / "model.safetensors", safetensors_bytes(tensors));
}

}  // namespace flashnext::testing
