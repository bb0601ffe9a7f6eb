// Subcommand registry of the `flashnext` CLI. Each cmd_<name>.cpp registers itself with FLASHNEXT_SUBCOMMAND; main()
// builds the CLI11 app from the registry, runs the chosen subcommand and turns flashnext::Error into a message on
// stderr and exit status 1.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace flashnext::cli {

/// A subcommand: `setup` adds its options to `sub` and returns the action to run when it is chosen. The action
/// returns the process exit status.
struct Subcommand {
  std::string name;
  std::string help;
  std::function<std::function<int()>(CLI::App& sub)> setup;
};

std::vector<Subcommand>& registry();

struct Registrar {
  explicit Registrar(Subcommand s) { registry().push_back(std::move(s)); }
};

/// Option checks with plain messages (CLI11's PositiveNumber / NonNegativeNumber print "Value 0 not in range 0 to
/// 1.797...e308"): a number > 0, and a number >= 0. CLI11 prefixes the option's name to the message.
inline CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v)) return "must be a number, got '" + text + "'";
        return v > 0 ? std::string() : "must be > 0, got " + text;
      },
      "POSITIVE");
}
inline CLI::Validator non_negative_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v)) return "must be a number, got '" + text + "'";
        return v >= 0 ? std::string() : "must be >= 0, got " + text;
      },
      "NONNEGATIVE");
}

}  // namespace flashnext::cli

#define FLASHNEXT_SUBCOMMAND(ident, ...) \
  static ::flashnext::cli::Registrar ident##_registrar{::flashnext::cli::Subcommand{__VA_ARGS__}}
