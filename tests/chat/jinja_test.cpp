// Jinja2 engine: small templates whose expected output follows by hand from Jinja2/Python semantics, and the C++ API
// (values, JSON, errors, limits, concurrent rendering).
#include "chat/jinja.h"

#include <gtest/gtest.h>

#include <ctime>
#include <string>
#include <thread>
#include <vector>

namespace {

using json = nlohmann::ordered_json;
using flashnext::chat::jinja::Template;
using flashnext::chat::jinja::TemplateError;
using flashnext::chat::jinja::Value;

std::string render(const std::string& source, const json& vars = json::object()) {
  return Template(source, "t").render(Value::from_json(vars));
}

// The message of the TemplateError that parsing or rendering raises ("" if none).
std::string error_of(const std::string& source, const json& vars = json::object()) {
  try {
    render(source, vars);
  } catch (const TemplateError& e) {
    return e.message();
  }
  return "";
}

TEST(Jinja, TextAndComments) {
  EXPECT_EQ(render("plain text"), "plain text");
  EXPECT_EQ(render("a{# comment #}b"), "ab");
  EXPECT_EQ(render("{{ '{{' }} and {{ '}}' }}"), "{{ and }}");
  EXPECT_EQ(render("{% raw %}{% if %}{{ x }}{% endraw %}"), "{% if %}{{ x }}");
}

TEST(Jinja, WhitespaceControl) {
  // trim_blocks drops the newline after a block tag; lstrip_blocks drops indentation before it.
  EXPECT_EQ(render("<ul>\n  {% for x in [1, 2] %}\n  <li>{{ x }}</li>\n  {% endfor %}\n</ul>"),
            "<ul>\n  <li>1</li>\n  <li>2</li>\n</ul>");
  // `-` strips all whitespace, newlines included, on its side.
  EXPECT_EQ(render("a \n\t {{- 'b' -}} \n c"), "abc");
  EXPECT_EQ(render("{% if true -%}\n\n  x  {%- endif %}"), "x");
  // Output tags are not affected by trim_blocks.
  EXPECT_EQ(render("{{ 'a' }}\nb"), "a\nb");
  // A single trailing newline of the template is dropped (keep_trailing_newline=False).
  EXPECT_EQ(render("x\n\n"), "x\n");
}

TEST(Jinja, ExpressionsFollowPython) {
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 8 }}"), "3 -4 2 3.5 256");
  EXPECT_EQ(render("{{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1.0 }} {{ 1e-5 }}"), "0.30000000000000004 1e+16 1.0 1e-05");
  EXPECT_EQ(render("{{ 'ab' ~ 1 ~ none ~ true }}"), "ab1NoneTrue");
  EXPECT_EQ(render("{{ [1, 'two', none, {'k': false}] }}"), "[1, 'two', None, {'k': False}]");
  EXPECT_EQ(render("{{ 0 or '' or 'x' }} {{ 1 and [] }}"), "x []");
  EXPECT_EQ(render("{{ 1 < 2 <= 2 < 1 }} {{ 'b' > 'a' }} {{ 1 == 1.0 == true }}"), "False True True");
  EXPECT_EQ(render("{{ 'y' if 0 else 'n' }} {{ 'x' in 'xyz' }} {{ 3 not in [1, 2] }}"), "n True True");
  EXPECT_EQ(render("{{ 'héllo'[1] }} {{ 'héllo'[1:3] }} {{ [1, 2, 3][::-1] }} {{ 'abc'[-1] }}"), "é él [3, 2, 1] c");
}

TEST(Jinja, UndefinedBehavesLikeJinja2) {
  EXPECT_EQ(render("[{{ missing }}][{{ d.missing }}][{{ missing|length }}][{{ missing is defined }}]",
                   {{"d", json::object()}}),
            "[][][0][False]");
  EXPECT_EQ(render("{% for x in missing %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(error_of("{{ missing.attr }}"), "'missing' is undefined");
  EXPECT_EQ(error_of("{{ d.a.b }}", {{"d", json::object()}}), "'dict object' has no attribute 'a'");
  EXPECT_EQ(error_of("{{ missing + 1 }}"), "'missing' is undefined");
  EXPECT_EQ(error_of("{{ missing() }}"), "'missing' is undefined");
}

TEST(Jinja, LoopsAndScoping) {
  EXPECT_EQ(render("{% for x in 'ab' %}{{ loop.index }}{{ x }}{{ '|' if not loop.last }}{% endfor %}"), "1a|2b");
  // A `set` inside a loop does not leak out; a namespace attribute does.
  EXPECT_EQ(render("{% set n = 0 %}{% set ns = namespace(n=0) %}{% for i in [1, 2, 3] %}{% set n = n + i %}"
                   "{% set ns.n = ns.n + i %}{% endfor %}{{ n }} {{ ns.n }}"),
            "0 6");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}{{ v }}{% endfor %}"), "a1b2");
  EXPECT_EQ(render("{% for i in range(6) if i is even %}{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
            "02");
  // previtem/nextitem are undefined at the ends: testable, but an attribute of them is an error.
  EXPECT_EQ(render("{% for m in msgs %}{{ loop.previtem.r if loop.previtem else '^' }}{{ m.r }}"
                   "{{ loop.nextitem.r if loop.nextitem is defined else '$' }} {% endfor %}",
                   {{"msgs", json::parse(R"([{"r": "a"}, {"r": "b"}])")}}),
            "^ab ab$ ");
  EXPECT_EQ(error_of("{% for m in [1] %}{{ loop.previtem.r }}{% endfor %}"), "there is no previous item");
}

TEST(Jinja, Macros) {
  EXPECT_EQ(render("{% macro f(a, b='B') %}{{ a }}{{ b }}{% endmacro %}{{ f(1) }}{{ f(1, 2) }}{{ f(b=3, a=4) }}"),
            "1B1243");
  EXPECT_EQ(render("{% macro f() %}{{ varargs|length }}{{ kwargs.x }}{% endmacro %}{{ f(1, 2, x=3) }}"), "23");
  EXPECT_EQ(render("{% macro b() %}[{{ caller() }}]{% endmacro %}{% call b() %}in{% endcall %}"), "[in]");
  EXPECT_EQ(error_of("{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}"), "macro 'f' takes not more than 1 argument(s)");
  EXPECT_NE(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("recursion"), std::string::npos);
}

TEST(Jinja, FiltersAndTests) {
  EXPECT_EQ(
      render("{{ '  x  '|trim }}|{{ [3, 1, 2]|sort|join(',') }}|{{ 'a'|upper }}|{{ [1, 2]|length }}|{{ []|first }}"),
      "x|1,2,3|A|2|");
  EXPECT_EQ(render("{{ {'b': 1, 'a': [1, 'é']}|tojson }}"), "{\"b\": 1, \"a\": [1, \"é\"]}");
  EXPECT_EQ(render("{{ {'a': [1]}|tojson(indent=2) }}"), "{\n  \"a\": [\n    1\n  ]\n}");
  EXPECT_EQ(render("{{ 'x' is string }} {{ {} is mapping }} {{ [] is sequence }} {{ 1 is number }} {{ none is none }}"),
            "True True True True True");
  EXPECT_EQ(render("{{ x is defined }} {{ true is true }} {{ 1 is true }} {{ 4 is divisibleby 2 }}"),
            "False True False True");
  EXPECT_EQ(
      render("{{ users|selectattr('admin')|map(attribute='name')|join(', ') }}",
             {{"users", json::parse(R"([{"name": "a", "admin": true}, {"name": "b"}, {"name": "c", "admin": 1}])")}}),
      "a, c");
  EXPECT_EQ(error_of("{{ 1|nosuch }}"), "No filter named 'nosuch'.");
}

TEST(Jinja, StringMethods) {
  EXPECT_EQ(render("{{ '<a>x</a>'.startswith('<a>') and '<a>x</a>'.endswith('</a>') }}"), "True");
  EXPECT_EQ(render("{{ 'x</think>\\n\\ny'.split('</think>')[-1].lstrip('\\n') }}"), "y");
  EXPECT_EQ(render("{{ ' a b '.split() }} {{ 'a-b'.replace('-', '+') }} {{ 'Ab'.lower() }}{{ 'Ab'.upper() }}"),
            "['a', 'b'] a+b abAB");
  EXPECT_EQ(error_of("{{ [].append(1) }}"), "access to attribute 'append' of 'list' object is unsafe.");
}

TEST(Jinja, GenerationTagRendersInline) {
  // transformers' {% generation %} marks assistant text for masks; it renders its body unchanged.
  EXPECT_EQ(render("a{% generation %}b{{ 1 }}{% endgeneration %}c"), "ab1c");
}

TEST(Jinja, RaiseExceptionCarriesMessageAndLine) {
  try {
    Template("line1\n{% if true %}\n{{ raise_exception('bad ' ~ 42) }}\n{% endif %}", "tmpl.jinja")
        .render(Value::dict());
    FAIL() << "expected an error";
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.message(), "bad 42");
    EXPECT_TRUE(e.raised_by_template());
    EXPECT_EQ(e.line(), 3);
    EXPECT_STREQ(e.what(), "tmpl.jinja line 3: bad 42");
  }
}

TEST(Jinja, SyntaxErrorsNameTheLine) {
  try {
    Template("ok\n{{ 1 + }}\n", "bad.jinja");
    FAIL() << "expected a syntax error";
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.line(), 2);
    EXPECT_FALSE(e.raised_by_template());
    EXPECT_EQ(e.message(), "unexpected 'end of print statement'");
  }
  EXPECT_EQ(error_of("{% for x in y %}"),
            "Unexpected end of template. Jinja was looking for the following tags: "
            "'endfor' or 'else'. The innermost block that needs to be closed is 'for'.");
  EXPECT_NE(error_of("{% include 'x' %}").find("'include'"), std::string::npos);
  EXPECT_NE(error_of("{{ 'unterminated }}"), "");
  EXPECT_NE(error_of("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}"),
            "");  // rejected, not a stack overflow
}

TEST(Jinja, ValuesFromJsonKeepOrderAndTypes) {
  const json j = json::parse(R"({"z": 1, "a": 2.5, "m": [true, null, "s"], "e": 1e300})");
  const Value v = Value::from_json(j);
  ASSERT_TRUE(v.is_dict());
  EXPECT_EQ(v.repr(), "{'z': 1, 'a': 2.5, 'm': [True, None, 's'], 'e': 1e+300}");
  EXPECT_EQ(v.to_json(), "{\"z\": 1, \"a\": 2.5, \"m\": [true, null, \"s\"], \"e\": 1e+300}");
  EXPECT_EQ(v.to_json(false, std::nullopt, ",", ":", true), "{\"a\":2.5,\"e\":1e+300,\"m\":[true,null,\"s\"],\"z\":1}");
  EXPECT_EQ(Value("\x01\t").to_json(), "\"\\u0001\\t\"");
  EXPECT_EQ(Value("é🙂").to_json(true), "\"\\u00e9\\ud83d\\ude42\"");
  json deep = json::array();
  for (int i = 0; i < 300; ++i) deep = json::array({deep});
  EXPECT_THROW(Value::from_json(deep), flashnext::Error);
  EXPECT_THROW(Value::undefined("x").to_json(), flashnext::Error);
}

TEST(Jinja, StrftimeNowUsesTheClock) {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  const std::string year = std::to_string(tm.tm_year + 1900);
  const std::string got = render("{{ strftime_now('%Y') }}");
  // Allow the year to roll over between the two clock reads.
  EXPECT_TRUE(got == year || got == std::to_string(tm.tm_year + 1901)) << got;
}

TEST(Jinja, RangeIsCappedLikeTheSandbox) {
  EXPECT_EQ(render("{{ range(3)|list }} {{ range(5, 0, -2)|list }}"), "[0, 1, 2] [5, 3, 1]");
  EXPECT_EQ(error_of("{{ range(100001)|length }}"),
            "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  EXPECT_NE(error_of("{{ 'ab' * 1000000000 }}"), "");  // refused instead of allocating 2 GB
}

TEST(Jinja, RendersConcurrently) {
  const Template t(
      "{% set ns = namespace(s=0) %}{% for i in range(n) %}{% set ns.s = ns.s + i %}{% endfor %}{{ ns.s }}", "sum");
  std::vector<std::thread> threads;
  std::vector<std::string> out(8);
  for (int k = 0; k < 8; ++k) {
    threads.emplace_back([&, k] { out[k] = t.render(Value::from_json({{"n", 1000 + k}})); });
  }
  for (auto& th : threads) th.join();
  for (int k = 0; k < 8; ++k) {
    const int64_t n = 1000 + k;
    EXPECT_EQ(out[k], std::to_string(n * (n - 1) / 2));
  }
}

}  // namespace
