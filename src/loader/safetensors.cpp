#include "loader/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace flashnext {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string TensorView::shape_str() const { return fmt::format("[{}]", fmt::join(shape, ", ")); }

SafetensorsFile::SafetensorsFile(const std::string& path, const std::string& name_prefix) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open safetensors file ({})", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail("{}: cannot stat ({})", path, std::strerror(errno));
  }
  size_ = size_t(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    fail("{}: truncated safetensors file: {} bytes, the 8-byte header length alone needs 8", path, size_);
  }
  map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail("{}: mmap failed ({})", path, std::strerror(errno));
  }
  try {
    auto* base = static_cast<const uint8_t*>(map_);
    uint64_t header_len = 0;
    std::memcpy(&header_len, base, 8);  // little-endian on every platform we build for
    if (header_len > size_ - 8) {
      fail("{}: header length {} runs past the end of the file ({} bytes): not a safetensors file?", path, header_len,
           size_);
    }
    json header;
    try {
      header = json::parse(base + 8, base + 8 + header_len);
    } catch (const json::exception& e) {
      fail("{}: header is not valid JSON ({})", path, e.what());
    }
    if (!header.is_object()) fail("{}: header is not a JSON object", path);
    const uint8_t* data = base + 8 + header_len;
    const size_t data_size = size_ - 8 - header_len;
    std::vector<std::pair<size_t, size_t>> ranges;
    std::vector<std::string> range_names;
    for (auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        if (entry.is_object()) {
          for (auto& [k, v] : entry.items()) metadata_[k] = v.is_string() ? v.get<std::string>() : v.dump();
        }
        continue;
      }
      if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
          !entry.contains("data_offsets")) {
        fail("{}: tensor '{}' needs dtype, shape and data_offsets", path, name);
      }
      TensorView t;
      t.name = name_prefix + name;
      t.file = path;
      if (!entry["dtype"].is_string()) fail("{}: tensor '{}': dtype is not a string", path, name);
      std::string dt = entry["dtype"];
      if (!parse_dtype(dt, &t.dtype)) {
        fail("{}: tensor '{}' has dtype {}, which flashnext does not read (expected one of BF16, F16, F32, F8_E4M3, "
             "F8_E5M2, U8, I8, I32, I64)", path, name, dt);
      }
      const auto& shape = entry["shape"];
      if (!shape.is_array()) fail("{}: tensor '{}': shape is not an array", path, name);
      size_t numel = 1;
      for (auto& d : shape) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0) fail("{}: tensor '{}': bad shape {}", path, name, shape.dump());
        int64_t v = d.get<int64_t>();
        t.shape.push_back(v);
        if (v != 0 && numel > (size_t(1) << 62) / size_t(v)) fail("{}: tensor '{}': shape {} overflows", path, name, shape.dump());
        numel *= size_t(v);
      }
      const auto& off = entry["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
        fail("{}: tensor '{}': data_offsets must be two non-negative integers, got {}", path, name, off.dump());
      }
      size_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
      if (begin > end || end > data_size) {
        fail("{}: tensor '{}': data_offsets [{}, {}] out of range (data block is {} bytes)", path, name, begin, end,
             data_size);
      }
      size_t expected = 0;
      if (__builtin_mul_overflow(numel, dtype_size(t.dtype), &expected) || end - begin != expected) {
        fail("{}: tensor '{}': {} bytes stored but shape {} of {} needs {}", path, name, end - begin, shape.dump(), dt,
             expected);
      }
      t.data = data + begin;
      t.nbytes = expected;
      ranges.emplace_back(begin, end);
      range_names.push_back(name);
      std::string key = t.name;
      tensors_.emplace(std::move(key), std::move(t));
    }
    std::vector<size_t> order(ranges.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
    // Sorted by start, a non-empty range overlaps an earlier one iff it starts before the furthest end so far
    // (empty ranges hold no bytes and are skipped, so they cannot hide an overlap).
    size_t furthest = 0;
    const std::pair<size_t, size_t>* furthest_range = nullptr;
    for (size_t i : order) {
      const auto& cur = ranges[i];
      if (cur.first == cur.second) continue;
      if (furthest_range && cur.first < furthest) {
        fail("{}: tensors '{}' and '{}' overlap (bytes [{}, {}) and [{}, {}))", path,
             range_names[size_t(furthest_range - ranges.data())], range_names[i], furthest_range->first,
             furthest_range->second, cur.first, cur.second);
      }
      if (cur.second > furthest) {
        furthest = cur.second;
        furthest_range = &cur;
      }
    }
  } catch (...) {
    ::munmap(map_, size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

namespace {

// The JSON document in file `p` (a checkpoint folder's index or PLE table descriptor); Error naming it otherwise.
json read_json_file(const fs::path& p) {
  if (!fs::is_regular_file(p)) fail("{}: not a file", p.string());
  std::ifstream in(p);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON ({})", p.string(), e.what());
  }
}

}  // namespace

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  if (!fs::is_directory(dir)) fail("{}: not a directory (expected a Hugging Face model folder)", dir);
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  fs::path single = fs::path(dir) / "model.safetensors";
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  std::vector<std::string> shard_names;
  if (fs::exists(index)) {
    const json j = read_json_file(index);
    if (!j.contains("weight_map") || !j["weight_map"].is_object()) {
      fail("{}: missing the \"weight_map\" object", index.string());
    }
    for (auto& [k, v] : j["weight_map"].items()) {
      if (!v.is_string()) fail("{}: weight_map entry '{}' is not a file name", index.string(), k);
      weight_map[k] = v.get<std::string>();
      if (std::find(shard_names.begin(), shard_names.end(), weight_map[k]) == shard_names.end()) {
        shard_names.push_back(weight_map[k]);
      }
    }
    std::sort(shard_names.begin(), shard_names.end());
    for (auto& s : shard_names) {
      fs::path p = fs::path(dir) / s;
      if (!fs::exists(p)) fail("{}: shard {} named by the index is missing", index.string(), p.string());
    }
  } else if (fs::exists(single)) {
    shard_names.push_back("model.safetensors");
  }
  // A PLE table kept in files of its own beside the shards (ple_table.json; see the class comment).
  const fs::path ple_desc = fs::path(dir) / "ple_table.json";
  std::vector<std::string> ple_files;
  std::string ple_prefix;
  if (fs::exists(ple_desc)) {
    const json j = read_json_file(ple_desc);
    if (!j.is_object()) fail("{}: expected a JSON object, got {}", ple_desc.string(), j.dump());
    for (const auto& [k, v] : j.items())
      if (k != "files" && k != "tensor_prefix")
        fail("{}: unknown field \"{}\" (the descriptor has \"files\" and \"tensor_prefix\")", ple_desc.string(), k);
    if (!j.contains("files") || !j["files"].is_array() || j["files"].empty())
      fail("{}: \"files\" must be a non-empty array of safetensors file names", ple_desc.string());
    for (const auto& f : j["files"]) {
      if (!f.is_string()) fail("{}: \"files\" entry {} is not a file name", ple_desc.string(), f.dump());
      const std::string name = f.get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
        fail("{}: \"files\" entry '{}' must be the bare name of a file in {} (no directory part)", ple_desc.string(),
             name, dir);
      if (!fs::is_regular_file(fs::path(dir) / name))
        fail("{}: \"files\" names '{}', which is not a file of {}", ple_desc.string(), name, dir);
      if (std::find(shard_names.begin(), shard_names.end(), name) != shard_names.end())
        fail("{}: '{}' is a shard of the checkpoint itself, not a separate PLE table file", ple_desc.string(), name);
      if (std::find(ple_files.begin(), ple_files.end(), name) != ple_files.end())
        fail("{}: \"files\" lists '{}' twice", ple_desc.string(), name);
      ple_files.push_back(name);
    }
    if (j.contains("tensor_prefix")) {
      if (!j["tensor_prefix"].is_string())
        fail("{}: \"tensor_prefix\" must be a string, got {}", ple_desc.string(), j["tensor_prefix"].dump());
      ple_prefix = j["tensor_prefix"].get<std::string>();
    }
  }
  if (!fs::exists(index) && !fs::exists(single)) {
    for (auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (e.path().extension() == ".safetensors" &&
          std::find(ple_files.begin(), ple_files.end(), name) == ple_files.end())
        shard_names.push_back(name);
    }
    std::sort(shard_names.begin(), shard_names.end());
    if (shard_names.empty()) fail("{}: no model.safetensors, no model.safetensors.index.json and no *.safetensors", dir);
  }
  auto add_file = [&](const std::string& s, const std::string& prefix) {
    files_.push_back(std::make_unique<SafetensorsFile>((fs::path(dir) / s).string(), prefix));
    for (auto& [name, t] : files_.back()->tensors()) {
      auto [it, inserted] = by_name_.emplace(name, &t);
      if (!inserted) fail("{}: tensor '{}' appears in both {} and {}", dir, name, it->second->file, t.file);
    }
  };
  for (auto& s : shard_names) add_file(s, "");
  for (auto& s : ple_files) {
    add_file(s, ple_prefix);
    for (auto& [name, t] : files_.back()->tensors())
      if (name.find(".ple.ple_embedding.ngram_embedding.") == std::string::npos || name.rfind("model.", 0) != 0)
        fail(
            "{}: tensor '{}' of {} is not a PLE table tensor (expected a name model.[language_model.]layers.N."
            "ple.ple_embedding.ngram_embedding.*: \"tensor_prefix\" '{}' is prepended to the file's names)",
            ple_desc.string(), name, t.file, ple_prefix);
  }
  for (auto& [name, shard] : weight_map) {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) {
      fail("{}: the index places tensor '{}' in {}, which does not hold it", index.string(), name, shard);
    }
    if (fs::path(it->second->file).filename() != shard) {
      fail("{}: the index places tensor '{}' in {}, but it is in {}", index.string(), name, shard, it->second->file);
    }
  }
}

const TensorView* Checkpoint::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

const TensorView& Checkpoint::get(const std::string& name) const {
  auto* t = find(name);
  if (!t) fail("{}: tensor '{}' is missing from the checkpoint", dir_, name);
  return *t;
}

}  // namespace flashnext
