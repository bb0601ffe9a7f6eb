// `flashnext inspect MODEL_DIR|config.json [--json] [--context N] [--tp N]`: architecture, per-layer plan, parameter
// counts, stored bytes and memory plan (src/loader/inspect.h; JSON keys in docs/INSPECT.md). A model folder is fully
// validated (every tensor's shape and dtype); bad input exits with status 1 and a message naming the file.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/cli.h"
#include "core/error.h"
#include "loader/inspect.h"

namespace {

struct InspectArgs {
  std::string path;
  bool json = false;
  int64_t context = 0;
  int64_t tp = 1;
};

}  // namespace

FLASHNEXT_SUBCOMMAND(
    inspect, "inspect",
    "Show the architecture, layer plan, parameter counts and memory plan of a model folder or a "
    "config.json",
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<InspectArgs>();
      sub.add_option("model", a->path, "model folder (config.json + safetensors) or config.json")->required();
      sub.add_flag("--json", a->json, "print one JSON object (keys: docs/INSPECT.md)");
      sub.add_option("--context", a->context,
                     "tokens of one sequence for the memory total (default: max_position_embeddings)");
      sub.add_option("--tp", a->tp, "tensor-parallel degree for the per-GPU figures (default 1)");
      return [a, &sub] {
        if (sub.count("--context") && a->context < 1) {
          flashnext::fail("inspect: --context must be >= 1, got {}", a->context);
        }
        flashnext::InspectOptions opt;
        opt.context = a->context;
        opt.tp = a->tp;
        const nlohmann::json report = flashnext::inspect_model(a->path, opt);
        const std::string out = a->json ? report.dump(2) + "\n" : flashnext::format_inspect(report);
        std::fwrite(out.data(), 1, out.size(), stdout);
        return 0;
      };
    });
