// Where the model folder is when the user names none: the bundled `models/tiny-fortunes` (a 10.8 M-parameter qwen4_exp
// trained on fortune cookies by tools/train_tiny.py, with an MTP layer), so that a fresh clone's first command runs
// without a download and prints English.
#pragma once

#include <string>

namespace flashnext {

/// Folder name of the bundled model, relative to the source tree.
inline constexpr const char* kBundledModel = "models/tiny-fortunes";

/// What the CLI says when it runs the bundled model (no --model given).
inline constexpr const char* kBundledModelNote =
    "the bundled tiny model (10.8 M parameters, trained on fortune cookies): expect jokes and quotes, not answers";

/// Returns `requested` when it is non-empty and a folder holding a config.json (throws Error naming `--model` and the
/// path when it is not: missing, not a folder, no config.json). Otherwise looks for the bundled model in the folder of
/// the running executable and its parents (up to four levels: `build/flashnext`, `build/tests/test_engine`, ...), then
/// in the current directory, and returns the first folder holding a config.json. Throws Error listing the places
/// searched when none does.
std::string resolve_model_dir(const std::string& requested);

/// The path of `relative` (a file of the source tree, e.g. "models/release/config.json") found the same way as the
/// bundled model: beside the running executable or up to four folders above it, then in the current directory.
/// Throws Error listing the places searched when it is in none.
std::string find_bundled_file(const std::string& relative);

}  // namespace flashnext
