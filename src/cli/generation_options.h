// Options shared by `flashnext generate` and `flashnext chat`: model folder and device, sampling parameters
// (unset ones take the model's generation_config.json defaults, as in vLLM), chat-template variables, and the
// statistics line printed on stderr.
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "cli/device.h"
#include "cli/load_progress.h"
#include "core/error.h"
#include "engine/generator.h"
#include "engine/loaded_model.h"
#include "engine/model_dir.h"

namespace flashnext::cli {

struct GenerationArgs {
  std::string model, device = "cpu";
  int threads = 0, tp = 1;
  NodeArgs nodes;
  std::optional<int64_t> max_tokens, top_k;
  std::optional<double> temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop, vars;
  bool ignore_eos = false, no_thinking = false;
  bool load_mtp = false;  ///< load the MTP layer too (generate --speculative mtp:K)
  WeightArgs weights;
};

inline void add_generation_options(CLI::App& sub, GenerationArgs& a) {
  sub.add_option("--model", a.model,
                 fmt::format("model folder (Hugging Face layout); default: the bundled {}", kBundledModel));
  sub.add_option("--device", a.device, "cpu (default) or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  sub.add_option("--threads", a.threads, "CPU threads (0 = all cores)")->check(cli::non_negative_number());
  sub.add_option("--tp", a.tp, "tensor-parallel ranks (default 1; threads of this process, docs/ENGINE.md)");
  add_node_options(sub, a.nodes);
  add_weight_options(sub, a.weights);
  sub.add_option("--max-tokens", a.max_tokens, "most tokens to generate (default 256, or the model's max_new_tokens)");
  sub.add_option("--temperature", a.temperature, "sampling temperature; 0 = greedy (default: the model's, else 1)");
  sub.add_option("--top-p", a.top_p, "nucleus sampling mass in (0, 1] (default: the model's, else 1)");
  sub.add_option("--top-k", a.top_k, "keep the k most likely tokens; 0 or -1 = off (default: the model's, else off)");
  sub.add_option("--min-p", a.min_p, "drop tokens below min_p x the top probability (default: the model's, else 0)");
  sub.add_option("--repetition-penalty", a.repetition_penalty, "HF repetition penalty > 0 (1 = off)");
  sub.add_option("--presence-penalty", a.presence_penalty, "OpenAI presence penalty in [-2, 2]");
  sub.add_option("--frequency-penalty", a.frequency_penalty, "OpenAI frequency penalty in [-2, 2]");
  sub.add_option("--seed", a.seed, "RNG seed: the same seed gives the same output (default: random)");
  sub.add_option("--stop", a.stop, "stop string (not printed); repeatable")->allow_extra_args(false);
  sub.add_flag("--ignore-eos", a.ignore_eos, "do not stop at the model's EOS tokens");
  sub.add_flag("--no-thinking", a.no_thinking, "render the chat template with enable_thinking=false");
  sub.add_option("--var", a.vars,
                 "chat-template variable k=v (v parsed as JSON when it is JSON, e.g. enable_thinking=false, else a "
                 "string); repeatable")
      ->allow_extra_args(false);
}

/// The request's sampling parameters: the model's defaults overridden by every option given.
inline SamplingParams sampling_params(const GenerationArgs& a, const GenerationConfig& g) {
  SamplingParams p = g.default_sampling();
  if (a.max_tokens) p.max_tokens = *a.max_tokens;
  if (a.temperature) p.temperature = *a.temperature;
  if (a.top_p) p.top_p = *a.top_p;
  if (a.top_k) p.top_k = *a.top_k;
  if (a.min_p) p.min_p = *a.min_p;
  if (a.repetition_penalty) p.repetition_penalty = *a.repetition_penalty;
  if (a.presence_penalty) p.presence_penalty = *a.presence_penalty;
  if (a.frequency_penalty) p.frequency_penalty = *a.frequency_penalty;
  p.seed = a.seed;
  p.stop = a.stop;
  p.ignore_eos = a.ignore_eos;
  return p;
}

/// Chat-template variables from --var and --no-thinking.
inline nlohmann::ordered_json template_vars(const GenerationArgs& a) {
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  for (const std::string& kv : a.vars) {
    const size_t eq = kv.find('=');
    FN_CHECK(eq != std::string::npos && eq > 0, "--var expects k=v, got '{}'", kv);
    const std::string text = kv.substr(eq + 1);
    auto value = nlohmann::ordered_json::parse(text, nullptr, false);
    vars[kv.substr(0, eq)] = value.is_discarded() ? nlohmann::ordered_json(text) : value;
  }
  if (a.no_thinking) vars["enable_thinking"] = false;
  return vars;
}

/// Checks the sampling options given, and the --var values, before any weight is read (the model's defaults fill
/// the others later and are checked with the request): --max-tokens must be >= 1 (a generation emits at least one
/// token; vLLM's rule), every other value the range of engine/sampling.h validate(). Throws Error naming the value.
inline void check_sampling_options(const GenerationArgs& a) {
  if (a.max_tokens && *a.max_tokens < 1) fail("--max-tokens must be >= 1, got {}", *a.max_tokens);
  try {
    validate(sampling_params(a, GenerationConfig{}), std::numeric_limits<int64_t>::max());
  } catch (const Error& e) {
    fail("a sampling option is out of range: {}", e.what());
  }
  template_vars(a);
}

/// Checks the sampling options (check_sampling_options), the device, finds the model folder and loads it; says on
/// stderr what was loaded and how long it took.
inline LoadedModel load_for_generation(const GenerationArgs& a, bool with_chat_template) {
  check_sampling_options(a);
  const WeightSource weights = weight_source(a.weights);
  ModelOptions options;
  const std::string dir = resolve_model_dir(a.model);
  set_backend(options, a.device, a.threads, a.tp, a.nodes, node_fingerprint(a.nodes, dir, a.load_mtp, weights));
  if (!weights.dummy) options.progress = LoadProgressPrinter();
  options.load_mtp = a.load_mtp;
  const auto t0 = std::chrono::steady_clock::now();
  LoadedModel m = LoadedModel::load(dir, options, with_chat_template, weights);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print(stderr, "flashnext: {} {} in {:.2f} s ({}{}){}\n", weights.dummy ? "made dummy weights for" : "loaded",
             dir, s, m.model->ops().name(),
             m.model->tp() > 1 ? fmt::format(", tensor-parallel over {} ranks", m.model->tp()) : "",
             a.model.empty() && !weights.dummy ? fmt::format("; {}", kBundledModelNote) : std::string());
  return m;
}

/// One line on stderr: prompt and decode throughput and why generation ended.
inline void print_stats(const GenerationStats& st, FinishReason finish) {
  fmt::print(stderr, "prompt: {} tokens, {:.1f} tokens/s | decode: {} tokens, {:.1f} tokens/s | finish: {}\n",
             st.prompt_tokens, st.prompt_tokens_per_second(), st.output_tokens, st.decode_tokens_per_second(),
             finish_reason_name(finish));
}

/// Writes `text` to stdout at once (streaming).
inline void emit(std::string_view text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

/// Ends the output line when stdout is a terminal and the text did not end with a newline.
inline void end_line(const std::string& text) {
  if (isatty(fileno(stdout)) && (text.empty() || text.back() != '\n')) emit("\n");
}

}  // namespace flashnext::cli
