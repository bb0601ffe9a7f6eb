#include "engine/model_dir.h"

#include <filesystem>
#include <system_error>
#include <vector>

#include "core/error.h"

namespace flashnext {

namespace fs = std::filesystem;

std::string resolve_model_dir(const std::string& requested) {
  if (!requested.empty()) return requested;
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
  std::string searched;
  for (const auto& root : roots) {
    const fs::path candidate = root / kBundledModel;
    if (fs::is_regular_file(candidate / "config.json", ec)) return candidate.string();
    searched += "\n  " + candidate.string();
  }
  fail(
      "no --model given and the bundled model {} was not found; searched:{}\npass --model DIR (a Hugging Face model "
      "folder)",
      kBundledModel, searched);
}

}  // namespace flashnext
