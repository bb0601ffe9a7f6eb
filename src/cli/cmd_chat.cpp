// `flashnext chat [--model DIR] [--system TEXT] [sampling options]`: an interactive conversation on stdin/stdout.
// Each line read is a user message; the whole conversation is rendered with the chat template and the reply is
// streamed as it is decoded, followed by the throughput line on stderr. `/reset` starts over, `/exit` (or end of
// input) quits. A turn that fails (e.g. the conversation outgrew the context length) is reported and dropped; the
// session goes on.
#include <iostream>
#include <memory>

#include "cli/generation_options.h"

namespace {

using json = nlohmann::ordered_json;
using namespace flashnext;

struct ChatArgs {
  cli::GenerationArgs gen;
  std::string system;
};

int run(const ChatArgs& a) {
  LoadedModel m = cli::load_for_generation(a.gen, /*with_chat_template=*/true);
  if (cli::follow_leader(*m.model, a.gen.nodes)) return 0;
  const json vars = cli::template_vars(a.gen);
  const SamplingParams params = cli::sampling_params(a.gen, m.generation);
  const bool interactive = isatty(fileno(stdin));
  auto start = [&] {
    json h = json::array();
    if (!a.system.empty()) h.push_back(json{{"role", "system"}, {"content", a.system}});
    return h;
  };
  json history = start();
  if (interactive) fmt::print(stderr, "Type a message. /reset starts over, /exit quits.\n");
  std::string line;
  while (true) {
    if (interactive) fmt::print(stderr, "> ");
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      history = start();
      fmt::print(stderr, "(conversation cleared)\n");
      continue;
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    history.push_back(json{{"role", "user"}, {"content", line}});
    try {
      GenerationRequest request{m.chat_prompt(history, vars), params, {}};
      Generator gen = generate(*m.model, m.tokenizer, m.generation, std::move(request), cli::emit);
      if (gen.text().empty() || gen.text().back() != '\n') cli::emit("\n");
      cli::print_stats(gen.stats(), gen.finish_reason());
      history.push_back(json{{"role", "assistant"}, {"content", gen.text()}});
    } catch (const Error& e) {
      history.erase(history.size() - 1);
      fmt::print(stderr, "flashnext: error: {}\n(the message was dropped; /reset starts a new conversation)\n",
                 e.what());
    }
  }
  return 0;
}

}  // namespace

FLASHNEXT_SUBCOMMAND(chat, "chat", "Interactive chat with the model on stdin/stdout",
                     [](CLI::App& sub) -> std::function<int()> {
                       auto a = std::make_shared<ChatArgs>();
                       sub.add_option("--system", a->system, "system message that opens the conversation");
                       cli::add_generation_options(sub, a->gen);
                       return [a] { return run(*a); };
                     });
