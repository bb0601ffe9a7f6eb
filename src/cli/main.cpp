// flashnext: command-line entry point. Subcommands live in cmd_*.cpp next to this file.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>

#include "build_info.h"
#include "cli/cli.h"
#include "core/error.h"

namespace flashnext::cli {
std::vector<Subcommand>& registry() {
  static std::vector<Subcommand> r;
  return r;
}
}  // namespace flashnext::cli

int main(int argc, char** argv) {
  using namespace flashnext;
  CLI::App app{"flashnext: inference engine and OpenAI-compatible server for Qwen3.8-Flash-Next (qwen4_exp)"};
  app.require_subcommand(1);
  const std::string archs = FLASHNEXT_CUDA_ARCHS;
  app.set_version_flag("--version",
                       fmt::format("flashnext {} ({} build, {})", FLASHNEXT_GIT_DESCRIBE, FLASHNEXT_BUILD_TYPE,
                                   archs.empty() ? "CPU only" : "CUDA architectures " + archs));
  auto& subs = cli::registry();
  std::sort(subs.begin(), subs.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::vector<std::pair<CLI::App*, std::function<int()>>> actions;
  for (auto& s : subs) {
    CLI::App* sub = app.add_subcommand(s.name, s.help);
    actions.emplace_back(sub, s.setup(*sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, action] : actions) {
      if (sub->parsed()) return action();
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "flashnext: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashnext: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
