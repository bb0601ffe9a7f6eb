// JSON Schema -> grammar: schemas against strings that JSON Schema semantics accept or reject, and the errors for
// unsupported or invalid schemas.
#include <gtest/gtest.h>

#include "core/error.h"
#include "grammar_test_util.h"

namespace flashnext::grammar {
namespace {

using test::full_match;

std::shared_ptr<const Grammar> compile(std::string_view s) { return compile_json_schema(s); }

TEST(JsonSchema, Primitives) {
  auto i = compile(R"({"type":"integer"})");
  for (const char* ok : {"0", "-0", "7", "-12", "1234567890", "-999999999999999999"})
    EXPECT_TRUE(full_match(i, ok)) << ok;
  EXPECT_FALSE(full_match(i, "1000000000000000000"));  // 19 digits: beyond the bounded integer syntax
  for (const char* bad : {"", "01", "+1", "1.0", "1e3", "-", "1 ", " 1", "\"1\"", "--1"}) EXPECT_FALSE(full_match(i, bad)) << bad;
  auto n = compile(R"({"type":"number"})");
  for (const char* ok : {"0", "-0.5", "3.25", "1e10", "1E+2", "2.5e-3", "-0"}) EXPECT_TRUE(full_match(n, ok)) << ok;
  for (const char* bad : {".5", "1.", "01.5", "00", "001", "0.5.5", "1e5e5", "1e", "NaN", "Infinity", "0x10", "1.2.3", "1e100", "9E519669544"}) EXPECT_FALSE(full_match(n, bad)) << bad;
  auto b = compile(R"({"type":"boolean"})");
  EXPECT_TRUE(full_match(b, "true"));
  EXPECT_TRUE(full_match(b, "false"));
  EXPECT_FALSE(full_match(b, "True"));
  EXPECT_FALSE(full_match(b, "null"));
  auto z = compile(R"({"type":"null"})");
  EXPECT_TRUE(full_match(z, "null"));
  EXPECT_FALSE(full_match(z, "nul"));
  auto nonneg = compile(R"({"type":"integer","minimum":0})");
  EXPECT_TRUE(full_match(nonneg, "5"));
  EXPECT_FALSE(full_match(nonneg, "-5"));
}

TEST(JsonSchema, Strings) {
  auto s = compile(R"({"type":"string"})");
  for (const char* ok : {R"("")", R"("abc")", R"("a\"b")", R"("\\")", R"("\n\t\/")", R"("\u00e9")", "\"\xC3\xA9\"",
                         "\"\xE2\x82\xAC\"", "\"\xF0\x9F\x98\x80\""})
    EXPECT_TRUE(full_match(s, ok)) << ok;
  for (const char* bad : {"abc", R"("abc)", R"("a"b")", "\"a\nb\"", R"("\x")", R"("\u12")", R"("\ud800")",
                          "\"\xC3\"", "\"\xC0\xAF\"", "\"\xED\xA0\x80\"", "\"\xFF\""})
    EXPECT_FALSE(full_match(s, bad)) << bad;
  auto len = compile(R"({"type":"string","minLength":2,"maxLength":3})");
  EXPECT_FALSE(full_match(len, R"("a")"));
  EXPECT_TRUE(full_match(len, R"("ab")"));
  EXPECT_TRUE(full_match(len, "\"a\xC3\xA9\""));     // 2 code points, 3 bytes
  EXPECT_TRUE(full_match(len, R"("a\nb")"));          // an escape is one character
  EXPECT_FALSE(full_match(len, R"("abcd")"));
}

TEST(JsonSchema, Formats) {
  auto d = compile(R"({"type":"string","format":"date"})");
  EXPECT_TRUE(full_match(d, R"("2026-12-01")"));
  EXPECT_FALSE(full_match(d, R"("2026-13-01")"));
  EXPECT_FALSE(full_match(d, R"("2026-00-10")"));
  EXPECT_FALSE(full_match(d, R"("2026-1-01")"));
  auto dt = compile(R"({"type":"string","format":"date-time"})");
  EXPECT_TRUE(full_match(dt, R"("2026-12-01T21:47:33Z")"));
  EXPECT_TRUE(full_match(dt, R"("2026-12-01T21:47:33.123+05:30")"));
  EXPECT_FALSE(full_match(dt, R"("2026-12-01T24:00:00Z")"));
  EXPECT_FALSE(full_match(dt, R"("2026-12-01T21:47:33")"));  // RFC 3339 requires the offset
  auto u = compile(R"({"type":"string","format":"uuid"})");
  EXPECT_TRUE(full_match(u, R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_FALSE(full_match(u, R"("123e4567e89b12d3a456426614174000")"));
  EXPECT_FALSE(full_match(u, R"("123e4567-e89b-12d3-a456-42661417400g")"));
  auto e = compile(R"({"type":"string","format":"email"})");
  EXPECT_TRUE(full_match(e, R"("first.last+tag@example.co.uk")"));
  EXPECT_FALSE(full_match(e, R"("no-at-sign.example.com")"));
  EXPECT_FALSE(full_match(e, R"("user@localhost")"));
}

TEST(JsonSchema, ObjectPropertiesAndRequired) {
  auto g = compile(R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
                       "tags":{"type":"array","items":{"type":"string"}}},"required":["name"]})");
  EXPECT_TRUE(full_match(g, R"({"name":"x"})"));
  EXPECT_TRUE(full_match(g, R"({"name":"x","age":3})"));
  EXPECT_TRUE(full_match(g, R"({"name":"x","tags":["a","b"]})"));
  EXPECT_TRUE(full_match(g, R"({"name":"x","age":3,"tags":[]})"));
  EXPECT_TRUE(full_match(g, "{\n  \"name\": \"x\",\n  \"age\": 3\n}"));
  EXPECT_TRUE(full_match(g, R"({ "name" : "x" , "age" : 3 })"));
  EXPECT_FALSE(full_match(g, R"({})"));                       // name is required
  EXPECT_FALSE(full_match(g, R"({"age":3})"));
  EXPECT_FALSE(full_match(g, R"({"name":"x","extra":1})"));   // additionalProperties false (strict default)
  EXPECT_FALSE(full_match(g, R"({"name":3})"));
  EXPECT_FALSE(full_match(g, R"({"name":"x",})"));
  EXPECT_FALSE(full_match(g, R"({"name":"x","age":3.5})"));
  EXPECT_FALSE(full_match(g, R"({"name":"x"} )"));            // nothing after the value
  EXPECT_FALSE(full_match(g, "{   \"name\":\"x\"}"));          // at most one space
}

TEST(JsonSchema, AdditionalProperties) {
  auto open = compile(R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":true})");
  EXPECT_TRUE(full_match(open, R"({"a":1,"b":[1,{"c":null}]})"));
  EXPECT_TRUE(full_match(open, R"({"z":"anything"})"));
  auto typed = compile(R"({"type":"object","additionalProperties":{"type":"integer"}})");
  EXPECT_TRUE(full_match(typed, R"({"x":1,"y":2})"));
  EXPECT_FALSE(full_match(typed, R"({"x":"1"})"));
  auto any = compile(R"({"type":"object"})");
  EXPECT_TRUE(full_match(any, R"({})"));
  EXPECT_TRUE(full_match(any, R"({"k":{"n":[true,false,null,1.5,"s"]}})"));
  EXPECT_FALSE(full_match(any, R"([])"));
}

TEST(JsonSchema, EnumConstAnyOf) {
  auto e = compile(R"({"enum":["red","green",3,null]})");
  for (const char* ok : {R"("red")", R"("green")", "3", "null"}) EXPECT_TRUE(full_match(e, ok)) << ok;
  for (const char* bad : {R"("blue")", R"("re")", "4", R"("red" )"}) EXPECT_FALSE(full_match(e, bad)) << bad;
  auto c = compile(R"({"const":{"k":[1,2]}})");
  EXPECT_TRUE(full_match(c, R"({"k":[1,2]})"));
  EXPECT_FALSE(full_match(c, R"({"k":[1]})"));
  auto a = compile(R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":1}]})");
  EXPECT_TRUE(full_match(a, "12"));
  EXPECT_TRUE(full_match(a, R"("x")"));
  EXPECT_FALSE(full_match(a, R"("xy")"));
  auto t = compile(R"({"type":["string","null"]})");
  EXPECT_TRUE(full_match(t, "null"));
  EXPECT_TRUE(full_match(t, R"("s")"));
  EXPECT_FALSE(full_match(t, "1"));
}

TEST(JsonSchema, ArraysMinMaxItems) {
  auto g = compile(R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})");
  EXPECT_FALSE(full_match(g, "[]"));
  EXPECT_TRUE(full_match(g, "[1]"));
  EXPECT_TRUE(full_match(g, "[1, 2, 3]"));
  EXPECT_FALSE(full_match(g, "[1,2,3,4]"));
  EXPECT_FALSE(full_match(g, "[1,]"));
  EXPECT_FALSE(full_match(g, "[\"a\"]"));
}

TEST(JsonSchema, RefsAndRecursion) {
  auto g = compile(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
                      "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}},
                      "$ref":"#/$defs/node"})");
  EXPECT_TRUE(full_match(g, R"({"v":1})"));
  EXPECT_TRUE(full_match(g, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4}]}]})"));
  EXPECT_FALSE(full_match(g, R"({"v":1,"kids":[{}]})"));
  auto d = compile(R"({"definitions":{"p":{"type":"string"}},"type":"object","properties":{"a":{"$ref":"#/definitions/p"}},"required":["a"]})");
  EXPECT_TRUE(full_match(d, R"({"a":"s"})"));
  EXPECT_FALSE(full_match(d, R"({"a":1})"));
}

TEST(JsonSchema, JsonObjectMode) {
  auto g = json_object_grammar();
  EXPECT_TRUE(full_match(g, R"({})"));
  EXPECT_TRUE(full_match(g, R"({"a": [1, {"b": "c"}], "d": -1.5e3})"));
  EXPECT_FALSE(full_match(g, "[1]"));
  EXPECT_FALSE(full_match(g, R"("s")"));
  EXPECT_FALSE(full_match(g, R"({"a":})"));
  EXPECT_FALSE(full_match(g, R"({a:1})"));
}

TEST(JsonSchema, WhitespaceIsBounded) {
  auto g = compile(R"({"type":"array","items":{"type":"integer"}})");
  EXPECT_TRUE(full_match(g, "[1,2]"));
  EXPECT_TRUE(full_match(g, "[ 1 , 2 ]"));
  EXPECT_TRUE(full_match(g, "[\n" + std::string(20, ' ') + "1\n]"));
  EXPECT_FALSE(full_match(g, "[\n" + std::string(21, ' ') + "1\n]"));  // at most 20 spaces after a newline
  EXPECT_FALSE(full_match(g, "[  1]"));                                // at most one space
  EXPECT_FALSE(full_match(g, "[\t1]"));                               // no tabs
  EXPECT_FALSE(full_match(g, "[\n\n1]"));                            // one newline
  EXPECT_FALSE(full_match(g, " [1]"));                                 // nothing before the value
}

TEST(JsonSchema, AnyOfObjectsAndOptionalOrder) {
  auto g = compile(R"({"anyOf":[{"type":"object","properties":{"cat":{"const":true}},"required":["cat"]},
                                {"type":"object","properties":{"dog":{"type":"integer"},"x":{"type":"null"}}}]})");
  EXPECT_TRUE(full_match(g, R"({"cat":true})"));
  EXPECT_TRUE(full_match(g, R"({"dog":1,"x":null})"));
  EXPECT_TRUE(full_match(g, R"({"x":null})"));
  EXPECT_TRUE(full_match(g, R"({})"));                  // the second branch has no required property
  EXPECT_FALSE(full_match(g, R"({"cat":false})"));
  EXPECT_FALSE(full_match(g, R"({"x":null,"dog":1})"));  // members come in the order of 'properties'
  EXPECT_FALSE(full_match(g, R"({"cat":true,"dog":1})"));
}

void expect_error(std::string_view schema, const std::string& needle) {
  try {
    compile(schema);
    ADD_FAILURE() << "no error for " << schema;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(JsonSchema, Errors) {
  expect_error(R"({"type":"object","properties":{"name":{"type":"string","pattern":"^a"}}})",
               "unsupported keyword 'pattern' at #/properties/name");
  expect_error(R"({"type":"string","format":"hostname"})", "unsupported string format 'hostname' at #");
  expect_error(R"({"type":"array","items":{"not":{}}})", "unsupported keyword 'not' at #/items");
  expect_error(R"({"$ref":"#/$defs/missing"})", "does not resolve");
  expect_error(R"({"$ref":"http://example.com/s.json"})", "only local references");
  expect_error(R"({"type":"strin"})", "unknown type 'strin' at #");
  expect_error(R"({"enum":[]})", "'enum' at # must be a non-empty array");
  expect_error(R"({"type":"string","minLength":3,"maxLength":2})", "'minLength' 3 > 'maxLength' 2");
  expect_error(R"({"$defs":{"a":{"anyOf":[{"$ref":"#/$defs/a"},{"type":"null"}]}},"$ref":"#/$defs/a"})",
               "left recursion");
  expect_error(R"({"type":"object","properties":{"a":{}},"required":["b"]})", "required property 'b'");
  expect_error("{not json", "not valid JSON");
  expect_error("false", "matches nothing");
}

TEST(Matcher, RollbackAndSaveRestore) {
  auto g = compile(R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})");
  GrammarMatcher m(g);
  ASSERT_TRUE(m.accept_bytes("{\"a\""));
  MatcherState saved = m.save();
  ASSERT_TRUE(m.accept_bytes(":1"));
  ASSERT_TRUE(m.accept_bytes("2}"));
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.is_exhausted());
  EXPECT_FALSE(m.accept_bytes(" "));
  m.rollback(1);
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.can_accept("3}"));
  EXPECT_FALSE(m.can_accept("x"));
  m.restore(saved);
  EXPECT_FALSE(m.can_accept("}"));
  EXPECT_TRUE(m.accept_bytes(":7}"));
  EXPECT_TRUE(m.terminate());
  EXPECT_FALSE(m.accept_bytes("1"));
  EXPECT_THROW(m.rollback(100), Error);
  EXPECT_FALSE(m.accept_bytes("{x"));  // a rejected chunk leaves the state unchanged
}

TEST(JsonSchema, SmallIntegerRangesAreEnforcedExactly) {
  const auto g = compile_json_schema(R"({"type": "integer", "minimum": -3, "maximum": 12})");
  for (int v = -3; v <= 12; ++v) EXPECT_TRUE(full_match(g, std::to_string(v))) << v;
  for (const char* bad : {"13", "-4", "012", "1.0", "-0", "100", "", "+1"}) EXPECT_FALSE(full_match(g, bad)) << bad;
  const auto ex = compile_json_schema(R"({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 5})");
  for (const char* ok : {"1", "2", "3", "4"}) EXPECT_TRUE(full_match(ex, ok)) << ok;
  for (const char* bad : {"0", "5"}) EXPECT_FALSE(full_match(ex, bad)) << bad;
  // A wide range constrains the sign only (documented); an empty one is an error.
  const auto wide = compile_json_schema(R"({"type": "integer", "minimum": 0, "maximum": 100000})");
  EXPECT_TRUE(full_match(wide, "123456789"));
  EXPECT_FALSE(full_match(wide, "-1"));
  EXPECT_THROW(compile_json_schema(R"({"type": "integer", "minimum": 3, "maximum": 2})"), Error);
}

}  // namespace
}  // namespace flashnext::grammar
