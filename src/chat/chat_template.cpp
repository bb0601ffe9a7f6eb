#include "chat/chat_template.h"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace flashnext::chat {
namespace {

using json = nlohmann::ordered_json;

std::string read_text(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  FN_CHECK(f.good(), "cannot open {}", path.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  FN_CHECK(!f.bad(), "cannot read {}", path.string());
  return ss.str();
}

// A tokenizer_config special token: a string, or an AddedToken object {"content": ...}; null/absent -> nullopt.
std::optional<std::string> token_string(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return std::nullopt;
  const json& t = config[key];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content") && t["content"].is_string()) return t["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

ChatTemplate::ChatTemplate(std::string_view source, std::string name, const nlohmann::ordered_json& special_tokens) {
  templates_.emplace_back("default", std::make_shared<const jinja::Template>(source, std::move(name)));
  set_special_tokens(special_tokens);
}

void ChatTemplate::set_special_tokens(const json& config) {
  special_tokens_.clear();
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (auto t = token_string(config, key)) special_tokens_.emplace_back(key, jinja::Value(*t));
  }
  if (config.is_object() && config.contains("additional_special_tokens") &&
      config["additional_special_tokens"].is_array()) {
    std::vector<jinja::Value> extra;
    for (auto& t : config["additional_special_tokens"]) {
      if (t.is_string())
        extra.emplace_back(t.get<std::string>());
      else if (t.is_object() && t.contains("content") && t["content"].is_string())
        extra.emplace_back(t["content"].get<std::string>());
    }
    special_tokens_.emplace_back("additional_special_tokens", jinja::Value::list(std::move(extra)));
  }
  bos_token_ = token_string(config, "bos_token");
  eos_token_ = token_string(config, "eos_token");
}

ChatTemplate ChatTemplate::from_dir(const std::filesystem::path& dir) {
  ChatTemplate ct;
  const auto config_path = dir / "tokenizer_config.json";
  json config;
  if (std::filesystem::exists(config_path)) {
    try {
      config = json::parse(read_text(config_path));
    } catch (const json::parse_error& e) {
      fail("{}: invalid JSON: {}", config_path.string(), e.what());
    }
    FN_CHECK(config.is_object(), "{}: expected a JSON object", config_path.string());
  }
  const auto jinja_path = dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja_path)) {
    ct.templates_.emplace_back("default",
                               std::make_shared<const jinja::Template>(read_text(jinja_path), jinja_path.string()));
  } else if (config.contains("chat_template") && !config["chat_template"].is_null()) {
    const json& t = config["chat_template"];
    const std::string where = config_path.string() + " chat_template";
    if (t.is_string()) {
      ct.templates_.emplace_back("default", std::make_shared<const jinja::Template>(t.get<std::string>(), where));
    } else if (t.is_array()) {
      for (size_t i = 0; i < t.size(); ++i) {
        const json& e = t[i];
        FN_CHECK(e.is_object() && e.contains("name") && e["name"].is_string() && e.contains("template") &&
                     e["template"].is_string(),
                 "{}[{}]: expected an object with string fields \"name\" and \"template\"", where, i);
        std::string name = e["name"].get<std::string>();
        ct.templates_.emplace_back(
            name, std::make_shared<const jinja::Template>(e["template"].get<std::string>(), where + " '" + name + "'"));
      }
    } else {
      fail("{}: expected a string or a list of named templates", where);
    }
  }
  const auto extra_dir = dir / "additional_chat_templates";
  if (std::filesystem::is_directory(extra_dir)) {
    std::vector<std::filesystem::path> files;
    for (auto& entry : std::filesystem::directory_iterator(extra_dir))
      if (entry.path().extension() == ".jinja") files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    for (auto& p : files) {
      ct.templates_.emplace_back(p.stem().string(), std::make_shared<const jinja::Template>(read_text(p), p.string()));
    }
  }
  FN_CHECK(!ct.templates_.empty(),
           "no chat template in {}: expected chat_template.jinja or a \"chat_template\" entry in tokenizer_config.json",
           dir.string());
  bool has_default =
      std::any_of(ct.templates_.begin(), ct.templates_.end(), [](auto& t) { return t.first == "default"; });
  if (!has_default) {
    std::string names;
    for (auto& [n, t] : ct.templates_) names += (names.empty() ? "" : ", ") + n;
    fail("{}: the chat templates ({}) include none named \"default\"", dir.string(), names);
  }
  ct.set_special_tokens(config);
  return ct;
}

std::vector<std::string> ChatTemplate::template_names() const {
  std::vector<std::string> names;
  for (auto& [n, t] : templates_) names.push_back(n);
  return names;
}

const jinja::Template& ChatTemplate::pick(bool have_tools) const {
  const jinja::Template* dflt = nullptr;
  for (auto& [n, t] : templates_) {
    if (have_tools && n == "tool_use") return *t;
    if (n == "default" && !dflt) dflt = t.get();
  }
  return *dflt;
}

std::string ChatTemplate::render(const json& messages, const json& tools, bool add_generation_prompt,
                                 const json& extra_vars) const {
  FN_CHECK(messages.is_array(), "chat template: messages must be a JSON array of message objects, got {}",
           messages.type_name());
  for (size_t i = 0; i < messages.size(); ++i) {
    FN_CHECK(messages[i].is_object(), "chat template: messages[{}] must be an object, got {}", i,
             messages[i].type_name());
  }
  FN_CHECK(tools.is_null() || tools.is_array(), "chat template: tools must be a JSON array of tool definitions, got {}",
           tools.type_name());
  FN_CHECK(extra_vars.is_null() || extra_vars.is_object(), "chat template: template variables must be a JSON object");

  jinja::Value vars = jinja::Value::dict();
  auto& d = vars.as_dict();
  d.set(jinja::Value("messages"), jinja::Value::from_json(messages));
  d.set(jinja::Value("tools"), jinja::Value::from_json(tools));
  d.set(jinja::Value("documents"), jinja::Value::none());
  d.set(jinja::Value("add_generation_prompt"), jinja::Value(add_generation_prompt));
  for (auto& [k, v] : special_tokens_) d.set(jinja::Value(k), v);
  if (extra_vars.is_object()) {
    for (auto& [k, v] : extra_vars.items()) {
      FN_CHECK(k != "messages" && k != "tools" && k != "add_generation_prompt",
               "chat template: variable '{}' cannot be overridden (it is a render() argument)", k);
      d.set(jinja::Value(k), jinja::Value::from_json(v));
    }
  }
  return pick(!tools.is_null()).render(vars);
}

}  // namespace flashnext::chat
