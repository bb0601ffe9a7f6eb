// safetensors reader: memory-mapped, zero-copy, single file or sharded through model.safetensors.index.json.
//
// Format (https://github.com/huggingface/safetensors): 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data block; offsets are
// relative to the data block. Every tensor is validated when the file is opened: known dtype, byte size equal to
// shape x dtype size, offsets inside the file, no two tensors overlapping. Any violation throws flashnext::Error
// naming the file and the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace flashnext {

/// A read-only, zero-copy view of one tensor inside a memory-mapped file. Valid while its SafetensorsFile lives.
struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  ///< first byte, inside the mapping
  size_t nbytes = 0;
  std::string file;               ///< path of the file that holds it (for error messages)

  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  /// The shape as "[a, b, c]".
  std::string shape_str() const;
};

/// One memory-mapped .safetensors file.
class SafetensorsFile {
 public:
  /// Maps `path` and validates its header; every tensor's name is `name_prefix` + its name in the header (a PLE
  /// table file whose descriptor gives a prefix). Throws Error on any malformed input.
  explicit SafetensorsFile(const std::string& path, const std::string& name_prefix = "");
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  size_t file_size() const { return size_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// All tensors of a checkpoint folder: `model.safetensors`, or the shards listed in `model.safetensors.index.json`,
/// or (when neither exists) every `*.safetensors` file in the folder. A tensor name that appears twice, a shard that
/// the index names but is missing, and a tensor the index places in a shard that does not hold it are errors.
/// A PLE table may sit in files of its own beside the shards, which the index does not list: `ple_table.json` in the
/// folder, {"files": ["NAME.safetensors", ...], "tensor_prefix": "..."} (the prefix optional, default empty), adds
/// those files' tensors, each named tensor_prefix + its name in the file. They must be PLE table tensors (names with
/// ".ple.ple_embedding.ngram_embedding.": shards `shard_K.weight` in BF16 / F16 / F32 / F8_E4M3 / I8 and their
/// scales, as loader/manifest.h reads them wherever they are stored); a file that is also a shard, a missing file,
/// another field or another tensor is an error naming the descriptor.
class Checkpoint {
 public:
  /// Opens the checkpoint in `dir`. Throws Error naming the file on failure.
  explicit Checkpoint(const std::string& dir);

  const std::string& dir() const { return dir_; }
  /// All tensors by name.
  const std::map<std::string, const TensorView*>& tensors() const { return by_name_; }
  /// The tensor `name`, or nullptr.
  const TensorView* find(const std::string& name) const;
  /// The tensor `name`; throws Error naming the checkpoint when it is missing.
  const TensorView& get(const std::string& name) const;
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> by_name_;
};

}  // namespace flashnext
