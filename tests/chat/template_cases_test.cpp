// Whole chat templates (Qwen3, Qwen3.8-Flash-Next, QwQ, Qwen3-Coder, Llama 3.3) over a set of conversations with and
// without tools and with template variables, against the prompts jinja2 renders in the transformers environment
// (tests/data/chat/template_cases.json, made by tools/make_jinja_cases.py). Errors must carry jinja2's message.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "chat/chat_template.h"

namespace {

using json = nlohmann::ordered_json;
using flashnext::chat::ChatTemplate;
using flashnext::chat::jinja::TemplateError;

const std::string kSource = FLASHNEXT_SOURCE_DIR;

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const json& data() {
  static const json d = json::parse(read_text(kSource + "/tests/data/chat/template_cases.json"));
  return d;
}

const ChatTemplate& template_named(const std::string& name) {
  static std::map<std::string, std::unique_ptr<ChatTemplate>> cache;
  auto& slot = cache[name];
  if (!slot) {
    const json& t = data()["templates"][name];
    const std::string path = t["path"].get<std::string>();
    std::string text = read_text(kSource + "/" + path);
    if (path.size() > 5 && path.substr(path.size() - 5) == ".json")
      text = json::parse(text)["chat_template"].get<std::string>();
    slot = std::make_unique<ChatTemplate>(text, path, t["special_tokens"]);
  }
  return *slot;
}

class TemplateCase : public ::testing::TestWithParam<size_t> {};

TEST_P(TemplateCase, MatchesJinja2) {
  const json& c = data()["cases"][GetParam()];
  SCOPED_TRACE(c["template"].get<std::string>() + " / " + c["conversation"].get<std::string>() +
               " tools=" + (c["tools"].is_null() ? "no" : "yes") + " vars=" + c["vars"].dump() +
               " add_generation_prompt=" + c["add_generation_prompt"].dump());
  const ChatTemplate& ct = template_named(c["template"].get<std::string>());
  if (c.contains("output")) {
    EXPECT_EQ(ct.render(c["messages"], c["tools"], c["add_generation_prompt"].get<bool>(), c["vars"]),
              c["output"].get<std::string>());
    return;
  }
  try {
    ct.render(c["messages"], c["tools"], c["add_generation_prompt"].get<bool>(), c["vars"]);
    ADD_FAILURE() << "expected error: " << c["error"].get<std::string>();
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.message(), c["error"].get<std::string>());
  }
}

INSTANTIATE_TEST_SUITE_P(Templates, TemplateCase, ::testing::Range<size_t>(0, data()["cases"].size()));

}  // namespace
