// The launch contract of the CUDA kernels, checked on their source (runs without a GPU): a kernel that
// src/ops/cuda/kernel_attributes.h `launch` starts may be scheduled while the kernel ahead of it in the stream still
// runs (programmatic dependent launch on compute capability 9.0+), so its first statement must be pdl_begin()
// (device_math.cuh), the wait for the kernels ahead, or pdl_begin_after_weights (the wait after loads of weights,
// which no kernel writes). A kernel that touched other memory before it would race with them, and only sometimes;
// this test names a kernel that has neither.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// Names of the kernels `src` starts with <<<...>>> (not through launch(): they need no pdl_begin()).
std::set<std::string> plain_launched_kernels(const std::string& src) {
  std::set<std::string> names;
  static const std::regex call(R"(\b([A-Za-z_]\w*)\s*(?:<[^<>;]*>)?\s*<<<)");
  for (auto it = std::sregex_iterator(src.begin(), src.end(), call); it != std::sregex_iterator(); ++it)
    names.insert((*it)[1].str());
  return names;
}

// Every kernel of a file that uses launch() counts as started by it unless the file starts it with <<<>>> (launch()
// may be called through a variable holding one of several instances).
TEST(KernelSource, EveryKernelStartedByLaunchBeginsWithPdlBegin) {
  const std::filesystem::path dir = std::filesystem::path(FLASHNEXT_SOURCE_DIR) / "src/ops/cuda";
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
  // A kernel definition: `__global__ void [__launch_bounds__(...)] NAME(params) {` (explicit instantiations end in ';').
  static const std::regex def(R"(__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?([A-Za-z_]\w*)\s*\()");
  int files = 0, checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".cu") continue;
    const std::string src = read_file(entry.path());
    if (src.find("launch(") == std::string::npos) continue;  // a file of plain launches only
    const std::set<std::string> plain = plain_launched_kernels(src);
    ++files;
    for (auto it = std::sregex_iterator(src.begin(), src.end(), def); it != std::sregex_iterator(); ++it) {
      const std::string name = (*it)[1].str();
      const size_t after = size_t(it->position(0) + it->length(0));
      const size_t brace = src.find('{', after), semi = src.find(';', after);
      if (brace == std::string::npos || semi < brace) continue;  // a declaration or explicit instantiation
      if (plain.count(name)) continue;
      ++checked;
      size_t body = brace + 1;
      while (body < src.size() && std::isspace(static_cast<unsigned char>(src[body]))) ++body;
      // pdl_begin() first, or pdl_begin_after_weights(early, load_weights) in the kernel's body, whose prologue may
      // read weights only; what comes before that call (indices and pointers computed from the parameters, the
      // prologue's lambda) is not checked here: device_math.cuh states the rule, reviews keep it.
      const size_t after_weights = src.find("pdl_begin_after_weights(", body);
      const size_t next_kernel = src.find("__global__", body);
      const bool plain_first = src.compare(body, 12, "pdl_begin();") == 0;
      const bool weights_first = after_weights != std::string::npos && after_weights < next_kernel &&
                                 src.find("pdl_begin();", body) > after_weights;
      EXPECT_TRUE(plain_first || weights_first)
          << entry.path().filename().string() << ": kernel " << name
          << " is not started with <<<>>>, so launch() starts it, but its first statement is not pdl_begin() and it "
             "does not call pdl_begin_after_weights() before any other load";
    }
  }
  EXPECT_GE(files, 5) << "no launch() calls found under " << dir;
  EXPECT_GE(checked, 40) << "kernel definitions not found under " << dir;
}

}  // namespace
