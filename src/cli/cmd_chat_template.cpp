// `flashnext chat-template --tokenizer DIR --messages FILE.json [--tools FILE.json] [--no-generation-prompt]
// [--var k=v ...]`: prints the prompt the model's chat template renders (src/chat/chat_template.h) and nothing else.
// --messages is a JSON array of messages (or an object with "messages" and optionally "tools"); --var values are
// parsed as JSON when they are JSON (`enable_thinking=false`, `n=3`), else taken as strings (`reasoning_effort=low`).
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "cli/cli.h"
#include "core/error.h"

namespace {

using json = nlohmann::ordered_json;

struct ChatTemplateArgs {
  std::string tokenizer;
  std::string messages;
  std::string tools;
  bool no_generation_prompt = false;
  std::vector<std::string> vars;
};

json read_json(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  FN_CHECK(f.good(), "chat-template: cannot open {} file {}", what, path);
  std::ostringstream ss;
  ss << f.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::parse_error& e) {
    flashnext::fail("chat-template: {} file {} is not valid JSON: {}", what, path, e.what());
  }
}

}  // namespace

FLASHNEXT_SUBCOMMAND(
    chat_template, "chat-template", "Render the model's chat template for a conversation and print the prompt",
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<ChatTemplateArgs>();
      sub.add_option("--tokenizer", a->tokenizer, "tokenizer folder (chat_template.jinja or tokenizer_config.json)")
          ->required();
      sub.add_option("--messages", a->messages,
                     "JSON file: array of messages, or {\"messages\": [...], \"tools\": [...]}")
          ->required();
      sub.add_option("--tools", a->tools, "JSON file: array of tool definitions");
      sub.add_flag("--no-generation-prompt", a->no_generation_prompt, "render without the assistant generation prompt");
      sub.add_option("--var", a->vars,
                     "template variable k=v (v parsed as JSON when it is JSON, e.g. "
                     "enable_thinking=false, else a string); repeatable");
      return [a] {
        json messages = read_json(a->messages, "--messages");
        json tools = nullptr;
        if (messages.is_object()) {
          FN_CHECK(messages.contains("messages"), "chat-template: {} is an object without a \"messages\" array",
                   a->messages);
          if (messages.contains("tools")) tools = messages["tools"];
          json m = messages["messages"];
          messages = std::move(m);
        }
        if (!a->tools.empty()) tools = read_json(a->tools, "--tools");
        json vars = json::object();
        for (const std::string& kv : a->vars) {
          size_t eq = kv.find('=');
          FN_CHECK(eq != std::string::npos && eq > 0, "chat-template: --var expects k=v, got '{}'", kv);
          std::string key = kv.substr(0, eq), text = kv.substr(eq + 1);
          json value = json::parse(text, nullptr, false);
          vars[key] = value.is_discarded() ? json(text) : value;
        }
        auto ct = flashnext::chat::ChatTemplate::from_dir(a->tokenizer);
        const std::string prompt = ct.render(messages, tools, !a->no_generation_prompt, vars);
        std::fwrite(prompt.data(), 1, prompt.size(), stdout);
        return 0;
      };
    });
