#include "engine/model_dir.h"

#include <filesystem>
#include <system_error>
#include <vector>

#include "core/error.h"

namespace flashnext {

namespace fs = std::filesystem;

namespace {

/// The folders searched for bundled files: the executable's and four above it, then the current directory.
std::vector<fs::path> search_roots() {
  std::vector<fs::path> roots;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path dir = exe.parent_path();
    for (int up = 0; up <= 4 && !dir.empty(); ++up, dir = dir.parent_path()) {
      roots.push_back(dir);
      if (dir == dir.root_path()) break;
    }
  }
  roots.push_back(fs::current_path(ec));
  return roots;
}

}  // namespace

std::string resolve_model_dir(const std::string& requested) {
  std::error_code ec;
  if (!requested.empty()) {
    if (!fs::exists(requested, ec))
      fail(
          "--model {}: no such file or directory (expected a Hugging Face model folder: config.json and the "
          "*.safetensors shards)",
          requested);
    if (!fs::is_directory(requested, ec))
      fail("--model {}: not a folder (expected a Hugging Face model folder: config.json and the *.safetensors shards)",
           requested);
    if (!fs::is_regular_file(fs::path(requested) / "config.json", ec))
      fail("--model {}: the folder has no config.json (expected a Hugging Face model folder)", requested);
    return requested;
  }
  std::string searched;
  for (const auto& root : search_roots()) {
    const fs::path candidate = root / kBundledModel;
    if (fs::is_regular_file(candidate / "config.json", ec)) return candidate.string();
    searched += "\n  " + candidate.string();
  }
  fail(
      "no --model given and the bundled model {} was not found; searched:{}\npass --model DIR (a Hugging Face model "
      "folder)",
      kBundledModel, searched);
}

std::string find_bundled_file(const std::string& relative) {
  std::string searched;
  std::error_code ec;
  for (const auto& root : search_roots()) {
    const fs::path candidate = root / relative;
    if (fs::is_regular_file(candidate, ec)) return candidate.string();
    searched += "\n  " + candidate.string();
  }
  fail("the bundled file {} was not found; searched:{}", relative, searched);
}

}  // namespace flashnext
