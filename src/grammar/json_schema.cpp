#include "grammar/json_schema.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <map>
#include <set>

#include "core/error.h"

namespace flashnext::grammar {

std::string json_pointer_token(const std::string& key) {
  std::string out;
  for (char c : key) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return out;
}

namespace {

using json = nlohmann::ordered_json;
using Frag = GrammarBuilder::Frag;

std::string where(const std::string& ptr) { return "#" + ptr; }


// Keywords that constrain values and that this compiler does not implement.
const std::set<std::string> kUnsupported = {
    "pattern",      "patternProperties", "propertyNames",    "not",           "if",
    "then",         "else",              "dependentRequired", "dependentSchemas", "dependencies",
    "uniqueItems",  "contains",          "minContains",      "maxContains",   "prefixItems",
    "unevaluatedProperties", "unevaluatedItems", "minProperties", "maxProperties", "$dynamicRef",
    "$recursiveRef", "additionalItems"};

// Keywords that constrain a value (used to refuse combinations this compiler would get wrong).
const std::set<std::string> kConstraints = {"type", "properties", "required", "additionalProperties", "items",
                                            "minItems", "maxItems", "minLength", "maxLength", "format", "enum",
                                            "const", "anyOf", "oneOf", "allOf", "$ref", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};

class Compiler {
 public:
  Compiler(const json& root, const JsonSchemaOptions& opt, GrammarBuilder& b) : root_(root), opt_(opt), b_(b) {}

  std::shared_ptr<const Grammar> compile() {
    int32_t top = b_.declare_rule("root");
    b_.define_rule(top, schema(root_, ""));
    return std::make_shared<const Grammar>(b_.finish(top));
  }

  std::shared_ptr<const Grammar> any_object() {
    int32_t top = b_.declare_rule("root");
    b_.define_rule(top, b_.call(object_any_rule()));
    return std::make_shared<const Grammar>(b_.finish(top));
  }

  // The rule of the schema at JSON pointer `ptr` of the root document.
  int32_t rule_at(const std::string& ptr) {
    const json* node = &root_;
    if (!ptr.empty()) {
      try {
        node = &root_.at(json::json_pointer(ptr));
      } catch (const std::exception&) {
        fail("JSON Schema: {} does not exist", where(ptr));
      }
    }
    return rule_for(*node, ptr);
  }

 private:
  void check_size(const std::string& ptr) {
    if (b_.size() > opt_.max_states)
      fail("JSON Schema: the schema is too large to compile (over {} grammar states at {})", opt_.max_states,
           where(ptr));
  }

  Frag ws() {
    std::vector<Frag> alts{b_.literal(" "),
                           b_.seq({b_.literal("\n"), b_.repeat([&] { return b_.literal(" "); }, 0, opt_.max_indent)})};
    return b_.opt(b_.alt(alts));
  }
  Frag hex() { return b_.ranges({{'0', '9'}, {'a', 'f'}, {'A', 'F'}}); }
  Frag digit() { return b_.range('0', '9'); }
  Frag digits(int n) { return b_.repeat([&] { return digit(); }, n, n); }

  // One JSON string character: an unescaped code point (strict UTF-8) or an escape (no surrogate \u escapes).
  Frag string_char() {
    std::vector<Frag> alts;
    alts.push_back(b_.utf8_char({{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x7F}}));  // no '"', '\\' or control byte
    Frag u = b_.seq({b_.literal("u"), b_.alt({b_.seq({b_.ranges({{'0', '9'}, {'a', 'c'}, {'A', 'C'}, {'e', 'f'}, {'E', 'F'}}),
                                                      hex(), hex(), hex()}),
                                              b_.seq({b_.ranges({{'d', 'd'}, {'D', 'D'}}), b_.range('0', '7'), hex(), hex()})})});
    Frag esc = b_.alt({b_.ranges({{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {'b', 'b'}, {'f', 'f'}, {'n', 'n'}, {'r', 'r'}, {'t', 't'}}), u});
    alts.push_back(b_.seq({b_.literal("\\"), esc}));
    return b_.alt(alts);
  }

  int32_t shared(int32_t& slot, const char* name, const std::function<Frag()>& body) {
    if (slot < 0) {
      slot = b_.declare_rule(name);
      b_.define_rule(slot, body());
    }
    return slot;
  }
  int32_t string_rule() {
    return shared(string_, "string", [&] { return b_.seq({b_.literal("\""), b_.star(string_char()), b_.literal("\"")}); });
  }
  int32_t char_rule() { return shared(char_, "char", [&] { return string_char(); }); }
  Frag integer_frag(bool sign) {
    // At most 18 digits: always an int64 (parsers turn longer integers into doubles or reject them).
    Frag mag = b_.alt({b_.literal("0"), b_.seq({b_.range('1', '9'), b_.repeat([&] { return digit(); }, 0, 17)})});
    return sign ? b_.seq({b_.opt(b_.literal("-")), mag}) : mag;
  }
  Frag number_frag(bool sign) {
    Frag frac = b_.opt(b_.seq({b_.literal("."), b_.repeat([&] { return digit(); }, 1, -1)}));
    // At most 2 exponent digits: the value stays a finite double (1e999 overflows every JSON parser's double).
    Frag exp = b_.opt(b_.seq({b_.ranges({{'e', 'e'}, {'E', 'E'}}), b_.opt(b_.ranges({{'+', '+'}, {'-', '-'}})),
                              b_.repeat([&] { return digit(); }, 1, 2)}));
    return b_.seq({integer_frag(sign), frac, exp});
  }
  int32_t number_rule() { return shared(number_, "number", [&] { return number_frag(true); }); }
  int32_t value_any_rule() {
    if (value_ < 0) {
      value_ = b_.declare_rule("value");
      b_.define_rule(value_, b_.alt({b_.call(object_any_rule()), b_.call(array_any_rule()), b_.call(string_rule()),
                                     b_.call(number_rule()), b_.literal("true"), b_.literal("false"), b_.literal("null")}));
    }
    return value_;
  }
  // '{' ws ( member (ws ',' ws member)* ws )? '}'   with member = string ws ':' ws value
  int32_t object_any_rule() {
    if (object_ < 0) {
      object_ = b_.declare_rule("object");
      auto member = [&] { return b_.seq({b_.call(string_rule()), ws(), b_.literal(":"), ws(), b_.call(value_any_rule())}); };
      Frag more = b_.star(b_.seq({ws(), b_.literal(","), ws(), member()}));
      b_.define_rule(object_, b_.seq({b_.literal("{"), ws(), b_.opt(b_.seq({member(), more, ws()})), b_.literal("}")}));
    }
    return object_;
  }
  int32_t array_any_rule() {
    if (array_ < 0) {
      array_ = b_.declare_rule("array");
      Frag more = b_.star(b_.seq({ws(), b_.literal(","), ws(), b_.call(value_any_rule())}));
      b_.define_rule(array_, b_.seq({b_.literal("["), ws(), b_.opt(b_.seq({b_.call(value_any_rule()), more, ws()})),
                                     b_.literal("]")}));
    }
    return array_;
  }

  // A rule for the schema at `ptr` (compiled once; calls make nested schemas linear in size).
  int32_t rule_for(const json& s, const std::string& ptr) {
    auto it = rules_.find(ptr);
    if (it != rules_.end()) return it->second;
    int32_t r = b_.declare_rule(ptr.empty() ? "#" : ptr);
    rules_[ptr] = r;
    b_.define_rule(r, schema(s, ptr));
    return r;
  }

  int64_t count(const json& s, const char* key, const std::string& ptr, int64_t dflt) {
    if (!s.contains(key)) return dflt;
    const json& v = s[key];
    if (!v.is_number_integer() && !(v.is_number_float() && v.get<double>() == static_cast<double>(static_cast<int64_t>(v.get<double>()))))
      fail("JSON Schema: '{}' at {} must be a non-negative integer", key, where(ptr));
    int64_t n = v.is_number_float() ? static_cast<int64_t>(v.get<double>()) : v.get<int64_t>();
    if (n < 0) fail("JSON Schema: '{}' at {} must be a non-negative integer, not {}", key, where(ptr), n);
    if (n > opt_.max_repeat)
      fail("JSON Schema: '{}' = {} at {} is larger than the supported {}", key, n, where(ptr), opt_.max_repeat);
    return n;
  }

  Frag schema(const json& s, const std::string& ptr) {
    check_size(ptr);
    if (s.is_boolean()) {
      if (s.get<bool>()) return b_.call(value_any_rule());
      fail("JSON Schema: the schema 'false' at {} matches nothing", where(ptr));
    }
    if (!s.is_object()) fail("JSON Schema: the schema at {} must be an object or a boolean", where(ptr));
    for (const auto& [key, value] : s.items())
      if (kUnsupported.count(key)) fail("JSON Schema: unsupported keyword '{}' at {}", key, where(ptr));
    auto constraints_besides = [&](std::initializer_list<const char*> allowed) {
      for (const auto& [key, value] : s.items())
        if (kConstraints.count(key) && std::find_if(allowed.begin(), allowed.end(), [&](const char* a) { return key == a; }) == allowed.end())
          return key;
      return std::string();
    };

    if (s.contains("$ref")) {
      if (auto other = constraints_besides({"$ref"}); !other.empty())
        fail("JSON Schema: unsupported: '$ref' together with '{}' at {}", other, where(ptr));
      return b_.call(ref_rule(s["$ref"], ptr));
    }
    if (s.contains("const")) return b_.literal(s["const"].dump());
    if (s.contains("enum")) {
      const json& e = s["enum"];
      if (!e.is_array() || e.empty()) fail("JSON Schema: 'enum' at {} must be a non-empty array", where(ptr));
      std::vector<Frag> alts;
      for (const json& v : e) alts.push_back(b_.literal(v.dump()));
      return b_.alt(alts);
    }
    for (const char* comb : {"anyOf", "oneOf"}) {
      if (!s.contains(comb)) continue;
      if (auto other = constraints_besides({"anyOf", "oneOf"}); !other.empty())
        fail("JSON Schema: unsupported: '{}' together with '{}' at {}", comb, other, where(ptr));
      const json& list = s[comb];
      if (!list.is_array() || list.empty()) fail("JSON Schema: '{}' at {} must be a non-empty array", comb, where(ptr));
      std::vector<Frag> alts;
      for (size_t i = 0; i < list.size(); ++i)
        alts.push_back(b_.call(rule_for(list[i], fmt::format("{}/{}/{}", ptr, comb, i))));
      if (s.contains("anyOf") && s.contains("oneOf"))
        fail("JSON Schema: unsupported: both 'anyOf' and 'oneOf' at {}", where(ptr));
      return b_.alt(alts);
    }
    if (s.contains("allOf")) {
      const json& list = s["allOf"];
      if (!list.is_array() || list.size() != 1)
        fail("JSON Schema: unsupported: 'allOf' with other than one schema at {}", where(ptr));
      if (auto other = constraints_besides({"allOf"}); !other.empty())
        fail("JSON Schema: unsupported: 'allOf' together with '{}' at {}", other, where(ptr));
      return schema(list[0], ptr + "/allOf/0");
    }

    std::vector<std::string> types;
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const json& x : t) {
          if (!x.is_string()) fail("JSON Schema: 'type' at {} must be a string or an array of strings", where(ptr));
          types.push_back(x.get<std::string>());
        }
      } else {
        fail("JSON Schema: 'type' at {} must be a string or a non-empty array of strings", where(ptr));
      }
    } else if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("format")) {
      types.push_back("string");
    } else {
      return b_.call(value_any_rule());
    }
    std::vector<Frag> alts;
    for (const std::string& t : types) alts.push_back(typed(s, t, ptr));
    return alts.size() == 1 ? alts[0] : b_.alt(alts);
  }

  Frag typed(const json& s, const std::string& t, const std::string& ptr) {
    if (t == "object") return object(s, ptr);
    if (t == "array") return array(s, ptr);
    if (t == "string") return string(s, ptr);
    if (t == "integer") {
      if (auto range = small_integer_range(s, ptr)) {
        std::vector<std::string> words;
        for (int64_t v = range->first; v <= range->second; ++v) words.push_back(std::to_string(v));
        std::sort(words.begin(), words.end());
        return word_trie(words, 0, words.size(), 0);
      }
    }
    if (t == "integer" || t == "number") {
      bool sign = true;
      if (s.contains("minimum")) {
        if (!s["minimum"].is_number()) fail("JSON Schema: 'minimum' at {} must be a number", where(ptr));
        sign = s["minimum"].get<double>() < 0;
      }
      return t == "integer" ? integer_frag(sign) : (sign ? b_.call(number_rule()) : number_frag(false));
    }
    if (t == "boolean") return b_.alt({b_.literal("true"), b_.literal("false")});
    if (t == "null") return b_.literal("null");
    fail("JSON Schema: unknown type '{}' at {}", t, where(ptr));
  }

  // [lo, hi] of an integer schema whose minimum / maximum (or exclusive forms) are integers and span at most
  // kMaxEnumeratedIntegers values; nullopt otherwise (then only the sign is constrained).
  std::optional<std::pair<int64_t, int64_t>> small_integer_range(const json& s, const std::string& ptr) {
    auto bound = [&](const char* key) -> std::optional<double> {
      if (!s.contains(key)) return std::nullopt;
      if (!s[key].is_number()) fail("JSON Schema: '{}' at {} must be a number", key, where(ptr));
      return s[key].get<double>();
    };
    std::optional<double> lo = bound("minimum"), hi = bound("maximum");
    if (auto x = bound("exclusiveMinimum")) lo = std::max(lo.value_or(*x + 1), std::floor(*x) + 1);
    if (auto x = bound("exclusiveMaximum")) hi = std::min(hi.value_or(*x - 1), std::ceil(*x) - 1);
    if (!lo || !hi) return std::nullopt;
    const double l = std::ceil(*lo), h = std::floor(*hi);
    if (l > h) fail("JSON Schema: the integer range at {} is empty", where(ptr));
    if (std::abs(l) > 1e15 || std::abs(h) > 1e15 || h - l + 1 > kMaxEnumeratedIntegers) return std::nullopt;
    return std::make_pair(int64_t(l), int64_t(h));
  }
  static constexpr double kMaxEnumeratedIntegers = 1024;

  // The words[begin, end) (sorted, distinct), from byte `depth` on, as a trie: one path per shared prefix.
  Frag word_trie(const std::vector<std::string>& words, size_t begin, size_t end, size_t depth) {
    std::vector<Frag> alts;
    bool ends_here = false;
    for (size_t i = begin; i < end;) {
      if (words[i].size() == depth) {
        ends_here = true;
        ++i;
        continue;
      }
      const char c = words[i][depth];
      size_t j = i;
      while (j < end && words[j].size() > depth && words[j][depth] == c) ++j;
      alts.push_back(b_.seq({b_.range(uint8_t(c), uint8_t(c)), word_trie(words, i, j, depth + 1)}));
      i = j;
    }
    if (alts.empty()) return b_.empty();
    Frag f = b_.alt(alts);
    return ends_here ? b_.opt(f) : f;
  }

  Frag object(const json& s, const std::string& ptr) {
    static const json kEmpty = json::object();
    const json& props = s.contains("properties") ? s["properties"] : kEmpty;
    if (!props.is_object()) fail("JSON Schema: 'properties' at {} must be an object", where(ptr));
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) fail("JSON Schema: 'required' at {} must be an array of strings", where(ptr));
      for (const json& r : s["required"]) {
        if (!r.is_string()) fail("JSON Schema: 'required' at {} must be an array of strings", where(ptr));
        if (!props.contains(r.get<std::string>()))
          fail("JSON Schema: unsupported: required property '{}' at {} is not declared in 'properties'",
               r.get<std::string>(), where(ptr));
        required.insert(r.get<std::string>());
      }
    }
    // additionalProperties: -1 none allowed, otherwise the rule of their values.
    int32_t extra = -1;
    if (s.contains("additionalProperties")) {
      const json& a = s["additionalProperties"];
      if (a.is_boolean())
        extra = a.get<bool>() ? value_any_rule() : -1;
      else if (a.is_object())
        extra = rule_for(a, ptr + "/additionalProperties");
      else
        fail("JSON Schema: 'additionalProperties' at {} must be a boolean or a schema", where(ptr));
    } else if (props.empty()) {
      extra = value_any_rule();
    }

    // Nodes N[i][started]: before property i, with (1) or without (0) a member already written.
    const size_t k = props.size();
    std::vector<std::array<int32_t, 2>> n(k + 1);
    for (auto& x : n) x = {b_.node(), b_.node()};
    size_t i = 0;
    for (const auto& [name, sub] : props.items()) {
      int32_t value = rule_for(sub, ptr + "/properties/" + json_pointer_token(name));
      for (int st = 0; st < 2; ++st) {
        std::vector<Frag> parts;
        if (st) parts = {ws(), b_.literal(","), ws()};
        for (Frag f : {b_.literal(json(name).dump()), ws(), b_.literal(":"), ws(), b_.call(value)}) parts.push_back(f);
        Frag m = b_.seq(parts);
        b_.link(n[i][st], m.in);
        b_.link(m.out, n[i + 1][1]);
        if (!required.count(name)) b_.link(n[i][st], n[i + 1][st]);
      }
      ++i;
    }
    Frag open = b_.seq({b_.literal("{"), ws()});
    b_.link(open.out, n[0][0]);
    int32_t end = b_.node();
    if (extra >= 0) {
      for (int st = 0; st < 2; ++st) {
        std::vector<Frag> parts;
        if (st) parts = {ws(), b_.literal(","), ws()};
        for (Frag f : {b_.call(string_rule()), ws(), b_.literal(":"), ws(), b_.call(extra)}) parts.push_back(f);
        Frag m = b_.seq(parts);
        b_.link(n[k][st], m.in);
        b_.link(m.out, n[k][1]);
      }
    }
    Frag close1 = b_.seq({ws(), b_.literal("}")});
    b_.link(n[k][1], close1.in);
    b_.link(close1.out, end);
    Frag close0 = b_.literal("}");
    b_.link(n[k][0], close0.in);
    b_.link(close0.out, end);
    return {open.in, end};
  }

  Frag array(const json& s, const std::string& ptr) {
    int32_t item;
    if (!s.contains("items")) {
      item = value_any_rule();
    } else if (s["items"].is_array()) {
      fail("JSON Schema: unsupported: 'items' as an array (tuple validation) at {}", where(ptr));
    } else {
      item = rule_for(s["items"], ptr + "/items");
    }
    int64_t lo = count(s, "minItems", ptr, 0), hi = count(s, "maxItems", ptr, -1);
    if (hi >= 0 && lo > hi) fail("JSON Schema: 'minItems' {} > 'maxItems' {} at {}", lo, hi, where(ptr));
    if (hi == 0) return b_.seq({b_.literal("["), ws(), b_.literal("]")});
    Frag list = b_.seq({b_.call(item), b_.repeat([&] { return b_.seq({ws(), b_.literal(","), ws(), b_.call(item)}); },
                                                   lo > 0 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1)});
    Frag body = b_.seq({list, ws()});
    return b_.seq({b_.literal("["), ws(), lo > 0 ? body : b_.opt(body), b_.literal("]")});
  }

  Frag string(const json& s, const std::string& ptr) {
    if (s.contains("format")) {
      if (!s["format"].is_string()) fail("JSON Schema: 'format' at {} must be a string", where(ptr));
      if (s.contains("minLength") || s.contains("maxLength"))
        fail("JSON Schema: unsupported: 'format' together with 'minLength'/'maxLength' at {}", where(ptr));
      std::string f = s["format"].get<std::string>();
      Frag body;
      if (f == "date") body = date();
      else if (f == "time") body = time();
      else if (f == "date-time") body = b_.seq({date(), b_.ranges({{'T', 'T'}, {'t', 't'}}), time()});
      else if (f == "uuid") body = b_.seq({b_.repeat([&] { return hex(); }, 8, 8), b_.literal("-"),
                                          b_.repeat([&] { return hex(); }, 4, 4), b_.literal("-"),
                                          b_.repeat([&] { return hex(); }, 4, 4), b_.literal("-"),
                                          b_.repeat([&] { return hex(); }, 4, 4), b_.literal("-"),
                                          b_.repeat([&] { return hex(); }, 12, 12)});
      else if (f == "email") body = email();
      else fail("JSON Schema: unsupported string format '{}' at {}", f, where(ptr));
      return b_.seq({b_.literal("\""), body, b_.literal("\"")});
    }
    int64_t lo = count(s, "minLength", ptr, 0), hi = count(s, "maxLength", ptr, -1);
    if (hi >= 0 && lo > hi) fail("JSON Schema: 'minLength' {} > 'maxLength' {} at {}", lo, hi, where(ptr));
    if (lo == 0 && hi < 0) return b_.call(string_rule());
    int32_t ch = char_rule();
    return b_.seq({b_.literal("\""), b_.repeat([&] { return b_.call(ch); }, lo, hi), b_.literal("\"")});
  }

  Frag two_digits(char first_lo, char first_hi, char second_lo, char second_hi) {
    return b_.seq({b_.range(first_lo, first_hi), b_.range(second_lo, second_hi)});
  }
  Frag date() {  // YYYY-MM-DD, month 01-12, day 01-31 (the day is not checked against the month)
    Frag month = b_.alt({two_digits('0', '0', '1', '9'), two_digits('1', '1', '0', '2')});
    Frag day = b_.alt({two_digits('0', '0', '1', '9'), two_digits('1', '2', '0', '9'), two_digits('3', '3', '0', '1')});
    return b_.seq({digits(4), b_.literal("-"), month, b_.literal("-"), day});
  }
  Frag hour() { return b_.alt({two_digits('0', '1', '0', '9'), two_digits('2', '2', '0', '3')}); }
  Frag time() {  // RFC 3339 full-time: HH:MM:SS[.frac](Z|+HH:MM|-HH:MM), leap second 60 allowed
    Frag sec = b_.alt({two_digits('0', '5', '0', '9'), b_.literal("60")});
    Frag frac = b_.opt(b_.seq({b_.literal("."), b_.repeat([&] { return digit(); }, 1, 9)}));
    Frag offset = b_.alt({b_.ranges({{'Z', 'Z'}, {'z', 'z'}}),
                          b_.seq({b_.ranges({{'+', '+'}, {'-', '-'}}), hour(), b_.literal(":"), two_digits('0', '5', '0', '9')})});
    return b_.seq({hour(), b_.literal(":"), two_digits('0', '5', '0', '9'), b_.literal(":"), sec, frac, offset});
  }
  Frag email() {  // local@label(.label)+ with local [A-Za-z0-9._%+-]{1,64}, label [A-Za-z0-9-]{1,63}
    auto local = [&] { return b_.ranges({{'A', 'Z'}, {'a', 'z'}, {'0', '9'}, {'.', '.'}, {'_', '_'}, {'%', '%'}, {'+', '+'}, {'-', '-'}}); };
    auto label = [&] {
      return b_.repeat([&] { return b_.ranges({{'A', 'Z'}, {'a', 'z'}, {'0', '9'}, {'-', '-'}}); }, 1, 63);
    };
    return b_.seq({b_.repeat(local, 1, 64), b_.literal("@"), label(),
                   b_.repeat([&] { return b_.seq({b_.literal("."), label()}); }, 1, -1)});
  }

  int32_t ref_rule(const json& ref, const std::string& ptr) {
    if (!ref.is_string()) fail("JSON Schema: '$ref' at {} must be a string", where(ptr));
    std::string r = ref.get<std::string>();
    if (r.empty() || r[0] != '#')
      fail("JSON Schema: unsupported '$ref' \"{}\" at {} (only local references '#...' are)", r, where(ptr));
    std::string target = r.substr(1);
    if (!target.empty() && target.rfind("/$defs/", 0) != 0 && target.rfind("/definitions/", 0) != 0)
      fail("JSON Schema: unsupported '$ref' \"{}\" at {} (only '#', '#/$defs/...' and '#/definitions/...' are)", r,
           where(ptr));
    const json* node = &root_;
    if (!target.empty()) {
      try {
        node = &root_.at(json::json_pointer(target));
      } catch (const std::exception&) {
        fail("JSON Schema: '$ref' \"{}\" at {} does not resolve", r, where(ptr));
      }
    }
    return rule_for(*node, target);
  }

  const json& root_;
  JsonSchemaOptions opt_;
  GrammarBuilder& b_;
  std::map<std::string, int32_t> rules_;
  int32_t string_ = -1, char_ = -1, number_ = -1, value_ = -1, object_ = -1, array_ = -1;
};

}  // namespace

std::shared_ptr<const Grammar> compile_json_schema(const nlohmann::ordered_json& schema,
                                                   const JsonSchemaOptions& options) {
  GrammarBuilder b;
  return Compiler(schema, options, b).compile();
}

int32_t add_json_schema(GrammarBuilder& builder, const nlohmann::ordered_json& root, const std::string& pointer,
                        const JsonSchemaOptions& options) {
  return Compiler(root, options, builder).rule_at(pointer);
}

std::shared_ptr<const Grammar> compile_json_schema(const nlohmann::json& schema, const JsonSchemaOptions& options) {
  return compile_json_schema(json::parse(schema.dump()), options);
}

std::shared_ptr<const Grammar> compile_json_schema(std::string_view schema_text, const JsonSchemaOptions& options) {
  json schema;
  try {
    schema = json::parse(schema_text);
  } catch (const json::exception& e) {
    fail("JSON Schema: not valid JSON: {}", e.what());
  }
  return compile_json_schema(schema, options);
}

std::shared_ptr<const Grammar> json_object_grammar(const JsonSchemaOptions& options) {
  static const json kNone = json::object();
  GrammarBuilder b;
  return Compiler(kNone, options, b).any_object();
}

}  // namespace flashnext::grammar
