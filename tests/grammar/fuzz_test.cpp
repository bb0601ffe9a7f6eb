// Bounded fuzz: random schemas from a small generator, random walks over the allowed tokens of the real Qwen3
// vocabulary. Every token a walk picks must be accepted by the matcher, and every walk that ends (EOS) must parse as
// JSON (nlohmann) and validate against its schema (the small validator below, for the generator's subset).
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "grammar_test_util.h"

namespace flashnext::grammar {
namespace {

using json = nlohmann::ordered_json;

// ---- the generator: integer, number, boolean, null, string (min/maxLength), enum, object, array, anyOf ----
json random_schema(std::mt19937_64& rng, int depth) {
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  int kind = pick(depth >= 3 ? 6 : 9);
  switch (kind) {
    case 0: return {{"type", "integer"}};
    case 1: return {{"type", "number"}};
    case 2: return {{"type", "boolean"}};
    case 3: return {{"type", "null"}};
    case 4: {
      json s = {{"type", "string"}};
      if (pick(2)) s["maxLength"] = pick(6);
      if (pick(3) == 0) s["minLength"] = std::min<int>(pick(3), s.value("maxLength", 3));
      return s;
    }
    case 5: return {{"enum", json::array({"x", "yz", 1, nullptr, true})}};
    case 6: {
      json props = json::object(), req = json::array();
      int n = 1 + pick(3);
      for (int i = 0; i < n; ++i) {
        std::string name = std::string(1, static_cast<char>('a' + i)) + (pick(2) ? "_key" : "");
        props[name] = random_schema(rng, depth + 1);
        if (pick(2)) req.push_back(name);
      }
      json s = {{"type", "object"}, {"properties", props}, {"required", req}, {"additionalProperties", false}};
      return s;
    }
    case 7: {
      json s = {{"type", "array"}, {"items", random_schema(rng, depth + 1)}};
      if (pick(2)) s["maxItems"] = 1 + pick(3);
      if (pick(2)) s["minItems"] = std::min<int>(pick(2), s.value("maxItems", 2));
      return s;
    }
    default: return {{"anyOf", json::array({random_schema(rng, depth + 1), random_schema(rng, depth + 1)})}};
  }
}

// Code points of a valid UTF-8 string.
size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// ---- the validator (JSON Schema semantics for the generator's subset) ----
bool valid(const nlohmann::json& v, const json& s) {
  if (s.contains("anyOf")) {
    for (const json& alt : s["anyOf"])
      if (valid(v, alt)) return true;
    return false;
  }
  if (s.contains("enum")) {
    for (const json& e : s["enum"])
      if (nlohmann::json::parse(e.dump()) == v) return true;
    return false;
  }
  const std::string t = s["type"];
  if (t == "integer") return v.is_number_integer();
  if (t == "number") return v.is_number();
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  if (t == "string") {
    if (!v.is_string()) return false;
    size_t n = code_points(v.get<std::string>());
    return n >= s.value("minLength", 0u) && (!s.contains("maxLength") || n <= s["maxLength"].get<size_t>());
  }
  if (t == "array") {
    if (!v.is_array()) return false;
    if (v.size() < s.value("minItems", 0u) || (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()))
      return false;
    for (const auto& x : v)
      if (!valid(x, s["items"])) return false;
    return true;
  }
  if (t == "object") {
    if (!v.is_object()) return false;
    for (const auto& [k, x] : v.items())
      if (!s["properties"].contains(k) || !valid(x, s["properties"][k])) return false;  // additionalProperties false
    for (const json& r : s["required"])
      if (!v.contains(r.get<std::string>())) return false;
    return true;
  }
  ADD_FAILURE() << "validator: unknown schema " << s.dump();
  return false;
}

TEST(GrammarFuzz, RandomSchemasRandomWalks) {
  auto vocab = test::qwen3_vocab();
  const Tokenizer& tok = test::qwen3_tokenizer();
  std::mt19937_64 rng(20261201);
  const int kSchemas = 12, kWalks = 6, kMaxSteps = 300;
  int completed = 0, total = 0, brute_force_checks = 0;
  std::vector<int32_t> allowed, closing;
  for (int si = 0; si < kSchemas; ++si) {
    json schema = random_schema(rng, 0);
    SCOPED_TRACE(schema.dump());
    auto g = compile_json_schema(schema);
    TokenMasker masker(g, vocab);
    for (int w = 0; w < kWalks; ++w) {
      ++total;
      GrammarMatcher m(g);
      std::string text;
      for (int step = 0; step < kMaxSteps && !m.is_terminated(); ++step) {
        std::vector<uint32_t> mask = masker.mask(m);
        if (step % 17 == 3 && brute_force_checks < 40) {  // the mask at random states, token by token
          ++brute_force_checks;
          test::check_mask_brute_force(masker, m);
        }
        allowed.clear();
        closing.clear();
        for (int32_t id = 0; id < vocab->mask_size(); ++id) {
          if (!((mask[id >> 5] >> (id & 31)) & 1u)) continue;
          allowed.push_back(id);
          const std::string& b = vocab->bytes(id);
          bool eos = std::find(vocab->eos_ids().begin(), vocab->eos_ids().end(), id) != vocab->eos_ids().end();
          if (eos || b.find_first_of("\"]}") != std::string::npos || (b.size() <= 2 && b.find_first_of(",:[{0123456789ntf") != std::string::npos))
            closing.push_back(id);
        }
        ASSERT_FALSE(allowed.empty()) << "dead end after " << text;
        // Bias toward structure (quotes, brackets, EOS) so that most walks finish within the step budget.
        const auto& from = (!closing.empty() && rng() % 10 < 6) ? closing : allowed;
        int32_t id = from[rng() % from.size()];
        ASSERT_TRUE(masker.accept_token(m, id)) << "mask allowed token " << id << " after " << text;
        if (!m.is_terminated()) text += vocab->bytes(id);
      }
      if (!m.is_terminated()) continue;
      ++completed;
      nlohmann::json value;
      ASSERT_NO_THROW(value = nlohmann::json::parse(text)) << text;
      EXPECT_TRUE(valid(value, schema)) << text;
      EXPECT_FALSE(text.empty());
      (void)tok;
    }
  }
  // The walks are biased to finish; most must (otherwise this test would check little).
  EXPECT_GE(completed, total / 2) << completed << " of " << total << " walks completed";
  std::printf("fuzz: %d of %d walks completed and validated; %d masks checked against brute force\n", completed,
              total, brute_force_checks);
}

}  // namespace
}  // namespace flashnext::grammar
