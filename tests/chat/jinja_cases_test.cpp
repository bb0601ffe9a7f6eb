// Jinja2 engine against outputs rendered by jinja2 itself (tests/data/chat/jinja_cases.json, made by
// tools/make_jinja_cases.py with the environment transformers uses for chat templates). Each case is a small template
// exercising one feature; error cases must fail with jinja2's message.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "chat/jinja.h"

namespace {

using json = nlohmann::ordered_json;
using flashnext::chat::jinja::Template;
using flashnext::chat::jinja::TemplateError;
using flashnext::chat::jinja::Value;

const json& cases() {
  static const json data = [] {
    std::ifstream f(std::string(FLASHNEXT_SOURCE_DIR) + "/tests/data/chat/jinja_cases.json");
    std::stringstream ss;
    ss << f.rdbuf();
    return json::parse(ss.str());
  }();
  return data["cases"];
}

class JinjaCase : public ::testing::TestWithParam<size_t> {};

TEST_P(JinjaCase, MatchesJinja2) {
  const json& c = cases()[GetParam()];
  const std::string name = c["name"].get<std::string>();
  const std::string source = c["template"].get<std::string>();
  SCOPED_TRACE(name + ": " + source);
  const Value vars = Value::from_json(c["vars"]);
  if (c.contains("output")) {
    std::string got;
    ASSERT_NO_THROW(got = Template(source, name).render(vars));
    EXPECT_EQ(got, c["output"].get<std::string>());
    return;
  }
  const std::string expected = c["error"].get<std::string>();
  try {
    Template t(source, name);
    t.render(vars);
    ADD_FAILURE() << "expected an error: " << expected;
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.message(), expected);
    EXPECT_EQ(e.raised_by_template(), c["error_type"] == "TemplateError");
    EXPECT_NE(std::string(e.what()).find(name + " line "), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Jinja2, JinjaCase, ::testing::Range<size_t>(0, cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return cases()[info.param]["name"].get<std::string>();
                         });

}  // namespace
