// `flashnext generate [--model DIR] (--prompt TEXT | --messages FILE.json) [--raw] [--max-tokens N]
// [--temperature T --top-p P --top-k K --seed S ...] [--device cpu]`: one generation, text streamed to stdout as it
// is decoded, then prompt and decode throughput on stderr. The chat template is applied (the prompt becomes one user
// message) unless --raw; --messages is a JSON array of messages, or an object with "messages" and optionally
// "tools" (as `flashnext chat-template` takes). --show-ids also prints the prompt and output token ids on stderr.
// --speculative mtp:K | ngram:K decodes speculatively (engine/speculative.h) and prints acceptance figures.
#include <fstream>
#include <memory>
#include <sstream>

#include "cli/generation_options.h"
#include "server/openai_schema.h"

namespace {

using json = nlohmann::ordered_json;
using namespace flashnext;

struct GenerateArgs {
  cli::GenerationArgs gen;
  std::optional<std::string> prompt;
  std::string messages, speculative;
  bool raw = false, show_ids = false;
};

json read_messages(const std::string& path, json& tools) {
  std::ifstream f(path, std::ios::binary);
  FN_CHECK(f.good(), "--messages: cannot open {}", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  json doc;
  try {
    doc = json::parse(ss.str());
  } catch (const json::parse_error& e) {
    fail("--messages: {} is not valid JSON: {}", path, e.what());
  }
  if (doc.is_object()) {
    FN_CHECK(doc.contains("messages"), "--messages: {} is an object without a \"messages\" array", path);
    if (doc.contains("tools")) tools = doc["tools"];
    json m = doc["messages"];
    doc = std::move(m);
  }
  if (!doc.is_array() || doc.empty())
    fail("--messages: {} must hold a non-empty array of {{\"role\", \"content\"}} messages", path);
  try {  // the checks and normalisation of a server chat request (roles, contents, tool calls, tools)
    if (!tools.is_null()) server::check_tools(tools);
    return server::normalize_messages(doc);
  } catch (const server::ApiError& e) {
    fail("--messages: {}: {}", path, e.what());
  }
}

std::string join_ids(const std::vector<TokenId>& ids) {
  return fmt::format("{}", fmt::join(ids, " "));
}

int run(const GenerateArgs& a) {
  const bool have_messages = !a.messages.empty();
  if (a.prompt.has_value() == have_messages) fail("give exactly one of --prompt TEXT and --messages FILE.json");
  if (a.prompt && a.prompt->empty()) fail("the prompt is empty: --prompt needs some text");
  if (a.raw && have_messages) fail("--raw applies to --prompt only (--messages always uses the chat template)");

  // Everything that can be checked without the model is checked before any weight is read (the sampling options in
  // load_for_generation).
  const SpeculativeConfig spec = SpeculativeConfig::parse(a.speculative);
  json tools = nullptr;
  const json messages = have_messages ? read_messages(a.messages, tools) : json();
  cli::GenerationArgs gen_args = a.gen;
  gen_args.load_mtp = spec.method == SpeculativeConfig::Method::Mtp;
  LoadedModel m = [&] {
    try {
      return cli::load_for_generation(gen_args, /*with_chat_template=*/!a.raw);
    } catch (const Error& e) {
      if (!gen_args.load_mtp) throw;
      fail("--speculative {}: {}", spec.str(), e.what());  // say which flag asked for the MTP layer
    }
  }();
  if (cli::follow_leader(*m.model, a.gen.nodes)) return 0;
  std::vector<TokenId> prompt;
  if (a.raw) {
    prompt = m.raw_prompt(*a.prompt);
  } else {
    prompt = m.chat_prompt(have_messages ? messages : json::array({json{{"role", "user"}, {"content", *a.prompt}}}),
                           cli::template_vars(a.gen), tools);
  }
  GenerationRequest request{std::move(prompt), cli::sampling_params(a.gen, m.generation), spec};
  Generator gen = generate(*m.model, m.tokenizer, m.generation, std::move(request), cli::emit);
  cli::end_line(gen.text());
  if (a.show_ids) {
    fmt::print(stderr, "prompt ids: {}\noutput ids: {}\n", join_ids(gen.prompt()), join_ids(gen.output_ids()));
  }
  cli::print_stats(gen.stats(), gen.finish_reason());
  if (spec.enabled()) {
    const SpeculativeStats st = gen.speculative_stats();
    fmt::print(stderr,
               "speculative {}: {} verify steps, drafted {}, accepted {} ({:.1f}%), mean accepted length {:.2f}, "
               "{} rollbacks\n",
               spec.str(), st.steps, st.drafted, st.accepted, 100.0 * st.acceptance_rate(), st.mean_accepted_length(),
               st.rollbacks);
  }
  return 0;
}

}  // namespace

FLASHNEXT_SUBCOMMAND(generate, "generate", "Generate text for one prompt, streamed to stdout",
                     [](CLI::App& sub) -> std::function<int()> {
                       auto a = std::make_shared<GenerateArgs>();
                       auto* p = sub.add_option("--prompt", a->prompt, "prompt text (one user message, unless --raw)");
                       auto* m = sub.add_option("--messages", a->messages,
                                                "JSON file: array of messages, or {\"messages\": [...], \"tools\": "
                                                "[...]}");
                       p->excludes(m);
                       sub.add_flag("--raw", a->raw, "tokenize --prompt as is, without the chat template");
                       sub.add_flag("--show-ids", a->show_ids, "print the prompt and output token ids on stderr");
                       sub.add_option("--speculative", a->speculative,
                                      "speculative decoding: mtp:K (the checkpoint's MTP layer) or ngram:K (prompt "
                                      "lookup), K drafts per step in 1..8; acceptance figures on stderr");
                       cli::add_generation_options(sub, a->gen);
                       return [a] { return run(*a); };
                     });
