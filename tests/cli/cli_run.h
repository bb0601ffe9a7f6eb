// Runs the built `flashnext` binary as a user does, for the CLI tests: its exit status, stdout and stderr, with a
// deadline (coreutils `timeout`) so that a hanging command fails its test instead of the whole ctest run.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace flashnext::testing {

struct CliRun {
  int status = -1;  ///< exit status; 124 when the deadline ended it, -1 when it died otherwise
  std::string out, err;
};

/// A scratch folder of this test process (created once).
inline std::filesystem::path cli_scratch() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("flashnext_cli_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

/// The whole content of a file ("" when it cannot be read).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// `s` quoted for the shell (single quotes, embedded ones escaped).
inline std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// Runs `flashnext ARGS` (ARGS already shell-quoted) with `input` on stdin, ended after `deadline_s` seconds.
inline CliRun run_cli_line(const std::string& args, const std::string& input = "", int deadline_s = 300) {
  const auto dir = cli_scratch();
  const auto in = dir / "stdin", out = dir / "stdout", err = dir / "stderr";
  std::ofstream(in, std::ios::binary) << input;
  const std::string cmd = "timeout -k 10 " + std::to_string(deadline_s) + " " +
                          quoted(std::string(FLASHNEXT_BINARY_DIR) + "/flashnext") + " " + args + " <" +
                          quoted(in.string()) + " >" + quoted(out.string()) + " 2>" + quoted(err.string());
  CliRun r;
  const int rc = std::system(cmd.c_str());
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

/// run_cli_line with every argument quoted.
inline CliRun run_cli(const std::vector<std::string>& args, const std::string& input = "", int deadline_s = 300) {
  std::string line;
  for (const auto& a : args) {
    if (!line.empty()) line += ' ';
    line += quoted(a);
  }
  return run_cli_line(line, input, deadline_s);
}

/// run_cli_line with stderr appended to `out` when `merge_stderr` (for tests that look for a message anywhere).
inline CliRun run_flashnext(const std::string& args, bool merge_stderr = true) {
  CliRun r = run_cli_line(args);
  if (merge_stderr) r.out += r.err;
  return r;
}

}  // namespace flashnext::testing
