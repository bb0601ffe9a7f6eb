// Runs the built `flashnext` binary as a user does, for the CLI tests: its exit status and its output.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace flashnext::testing {

struct CliRun {
  int status = -1;
  std::string out;  ///< stdout, and stderr when merged
};

/// Runs `flashnext ARGS` (ARGS already shell-quoted) from the build folder and captures its output and exit status
/// (128 + signal when it was killed).
inline CliRun run_flashnext(const std::string& args, bool merge_stderr = true) {
  const std::string cmd =
      std::string("'") + FLASHNEXT_BINARY_DIR + "/flashnext' " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  CliRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

inline std::string quoted(const std::string& s) {
  return "'" + s + "'";
}

}  // namespace flashnext::testing
