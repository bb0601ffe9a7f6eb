// `flashnext perplexity [--model DIR] (--file TEXT | --ids 1,2,3) [--ctx N] [--chunk C] [--max-tokens N] [--device]
// [--threads N] [--tp N] [--json]`: the perplexity of a text under the model, as transformers' fixed-length
// evaluation with stride = window computes it: the text is tokenized as is (no chat template, no BOS), cut into
// consecutive windows of N tokens (default 512; the last may be shorter), each window runs on a fresh sequence, and
// every token of a window after its first is scored by the float32 logits of the position before it:
//   perplexity = exp( sum over scored tokens of -log softmax(logits)[token] / scored tokens ).
// The log-softmax is taken in double precision on the host. Prints `perplexity: P over K tokens (W windows of up to
// N)` on stdout, or one JSON object with --json.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "cli/cli.h"
#include "cli/device.h"
#include "cli/load_progress.h"
#include "cli/token_ids.h"
#include "core/error.h"
#include "engine/loaded_model.h"
#include "engine/model_dir.h"

namespace {

using namespace flashnext;

struct PerplexityArgs {
  std::string model, file, ids, device = "cpu";
  int64_t ctx = 512, chunk = 256, max_tokens = 0;
  int threads = 0, tp = 1;
  bool json = false;
};

/// Negative log-likelihood of `target` under `row` (n logits), in double precision.
double nll(const float* row, int64_t n, int32_t target) {
  double mx = row[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, double(row[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(row[i]) - mx);
  return std::log(sum) + mx - double(row[target]);
}

int run(const PerplexityArgs& a) {
  if (a.file.empty() == a.ids.empty()) fail("give exactly one of --file (a text file) and --ids (token ids)");
  if (a.ctx < 2) fail("--ctx must be >= 2 (a window scores its tokens after the first), got {}", a.ctx);
  if (a.chunk < 0) fail("--chunk must be >= 1 (or 0 for whole windows), got {}", a.chunk);
  if (a.max_tokens < 0) fail("--max-tokens must be >= 0 (0 = the whole text), got {}", a.max_tokens);
  std::string text;
  if (!a.file.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(a.file, ec)) fail("--file {}: not a readable file", a.file);
    std::ifstream in(a.file, std::ios::binary);
    if (!in) fail("--file {}: cannot open it", a.file);
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
    if (text.empty()) fail("--file {}: the file is empty", a.file);
  }
  ModelOptions options;
  const std::string dir = resolve_model_dir(a.model);
  cli::set_backend(options, a.device, a.threads, a.tp, cli::NodeArgs{}, "");
  options.progress = cli::LoadProgressPrinter();
  // A text needs the folder's tokenizer; ids need only the model.
  std::optional<LoadedModel> loaded;
  std::unique_ptr<Model> bare;
  if (!a.file.empty()) {
    loaded = LoadedModel::load(dir, options, /*with_chat_template=*/false);
  } else {
    bare = Model::load(dir, options);
  }
  Model& model = loaded ? *loaded->model : *bare;
  const int64_t V = model.config().vocab_size;
  std::vector<int32_t> ids;
  if (loaded) {
    for (TokenId t : loaded->raw_prompt(text)) ids.push_back(int32_t(t));
  } else {
    ids = cli::parse_token_ids(a.ids, "--ids");
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] < 0 || ids[i] >= V)
        fail("--ids: token id {} at index {} is outside the vocabulary [0, {})", ids[i], i, V);
  }
  if (a.max_tokens > 0 && int64_t(ids.size()) > a.max_tokens) ids.resize(size_t(a.max_tokens));
  if (ids.size() < 2)
    fail("perplexity needs at least 2 tokens, got {}{}", ids.size(), a.max_tokens > 0 ? " (after --max-tokens)" : "");

  const int64_t T = int64_t(ids.size()), longest = std::min(a.ctx, T);
  if (longest > model.config().max_position_embeddings)
    fail("--ctx {}: a window of {} tokens passes the model's max_position_embeddings = {}; give --ctx <= {}", a.ctx,
         longest, model.config().max_position_embeddings, model.config().max_position_embeddings);
  double total = 0;
  int64_t scored = 0, windows = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t w0 = 0; w0 + 1 < T; w0 += a.ctx) {
    const int64_t n = std::min(a.ctx, T - w0), chunk = a.chunk > 0 ? a.chunk : n;
    SequenceState seq = model.new_sequence();
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
      const int64_t k = std::min(chunk, n - c0);
      const std::vector<float> logits =
          model.forward(seq, std::span<const int32_t>(ids.data() + w0 + c0, size_t(k)), LogitsMode::All);
      for (int64_t r = 0; r < k; ++r) {
        const int64_t next = w0 + c0 + r + 1;  // the token row r predicts
        if (next >= w0 + n) break;
        total += nll(logits.data() + r * V, V, ids[size_t(next)]);
        ++scored;
      }
    }
    ++windows;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double ppl = std::exp(total / double(scored));
  if (a.json) {
    nlohmann::ordered_json j{{"model", dir},
                             {"perplexity", ppl},
                             {"mean_nll", total / double(scored)},
                             {"scored_tokens", scored},
                             {"tokens", T},
                             {"windows", windows},
                             {"ctx", a.ctx},
                             {"seconds", seconds},
                             {"device", model.ops().name()}};
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("perplexity: {:.4f} over {} tokens ({} window{} of up to {})\n", ppl, scored, windows,
               windows == 1 ? "" : "s", a.ctx);
    fmt::print(stderr, "{} tokens in {:.2f} s ({:.1f} tokens/s, {})\n", T, seconds, double(T) / seconds,
               model.ops().name());
  }
  return 0;
}

}  // namespace

FLASHNEXT_SUBCOMMAND(perplexity, "perplexity", "Perplexity of a text under the model (windows of --ctx tokens)",
                     [](CLI::App& sub) -> std::function<int()> {
                       auto a = std::make_shared<PerplexityArgs>();
                       sub.add_option(
                           "--model", a->model,
                           fmt::format("model folder (Hugging Face layout); default: the bundled {}", kBundledModel));
                       sub.add_option("--file", a->file, "text file, tokenized as is (no chat template)");
                       sub.add_option("--ids", a->ids, "token ids instead of a text, comma-separated");
                       sub.add_option("--ctx", a->ctx, "window length in tokens (default 512)");
                       sub.add_option("--chunk", a->chunk,
                                      "prefill chunk size within a window: the logits of this many rows at a time "
                                      "(default 256; 0: whole windows)");
                       sub.add_option("--max-tokens", a->max_tokens, "score only the first N tokens (0 = all)");
                       sub.add_option("--device", a->device, "cpu (default: the float32 oracle) or cuda")
                           ->check(CLI::IsMember({"cpu", "cuda"}));
                       sub.add_option("--threads", a->threads, "CPU threads (default: all cores)");
                       sub.add_option("--tp", a->tp, "tensor-parallel ranks (default 1)");
                       sub.add_flag("--json", a->json, "print one JSON object");
                       return [a] { return run(*a); };
                     });
