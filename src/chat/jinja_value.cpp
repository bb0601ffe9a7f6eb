// Values of the Jinja2 engine with Python semantics: str()/repr()/json.dumps, equality and ordering, arithmetic,
// iteration, attribute/item access and slicing as jinja2's sandbox does them.
#include <fmt/format.h>
#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>

#include "chat/jinja_runtime.h"

namespace flashnext::chat::jinja {

TemplateError::TemplateError(std::string message, std::string template_name, int line, bool raised)
    : Error(line > 0 ? fmt::format("{} line {}: {}", template_name, line, message)
                     : fmt::format("{}: {}", template_name, message)),
      message_(std::move(message)),
      line_(line),
      raised_(raised) {}

using detail::eval_error;

// ---------------------------------------------------------------- construction
const Value* Value::DictData::find(const Value& key) const {
  if (key.is_string()) {
    for (auto& [k, v] : items)
      if (k.is_string() && k.as_string() == key.as_string()) return &v;
    return nullptr;
  }
  for (auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Value::DictData::set(Value key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

Value Value::list(std::vector<Value> items, bool is_tuple) {
  auto d = std::make_shared<ListData>();
  d->items = std::move(items);
  d->is_tuple = is_tuple;
  return Value(Storage(std::move(d)));
}

Value Value::dict(std::vector<std::pair<Value, Value>> items) {
  auto d = std::make_shared<DictData>();
  for (auto& [k, v] : items) d->set(std::move(k), std::move(v));
  return Value(Storage(std::move(d)));
}

Value Value::make_namespace(std::vector<std::pair<Value, Value>> items) {
  Value v = dict(std::move(items));
  v.as_dict().is_namespace = true;
  return v;
}

Value Value::function(std::string name, Function fn) {
  auto d = std::make_shared<FunctionData>();
  d->name = std::move(name);
  d->fn = std::move(fn);
  return Value(Storage(std::move(d)));
}

namespace {
constexpr int kMaxJsonDepth = 256;

Value from_json_at(const nlohmann::ordered_json& j, int depth);
}  // namespace

Value Value::from_json(const nlohmann::ordered_json& j) {
  return from_json_at(j, 0);
}

namespace {
Value from_json_at(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxJsonDepth) fail("chat template input: JSON nested deeper than {} levels", kMaxJsonDepth);
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return Value(static_cast<int64_t>(u));
      return Value(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (auto& x : j) items.push_back(from_json_at(x, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = Value::dict();
      auto& items = d.as_dict().items;
      items.reserve(j.size());
      for (auto& [k, x] : j.items()) items.emplace_back(Value(k), from_json_at(x, depth + 1));
      return d;
    }
    default:
      fail("chat template input: JSON binary values are not supported");
  }
}
}  // namespace

// ---------------------------------------------------------------- conversions
double Value::to_double() const {
  if (is_int()) return static_cast<double>(as_int());
  if (is_bool()) return as_bool() ? 1.0 : 0.0;
  return as_float();
}

bool Value::truthy() const {
  switch (type()) {
    case Type::Undefined:
    case Type::None:
      return false;
    case Type::Bool:
      return as_bool();
    case Type::Int:
      return as_int() != 0;
    case Type::Float:
      return as_float() != 0.0;
    case Type::String:
      return !as_string().empty();
    case Type::List:
      return !as_list().items.empty();
    case Type::Dict:
      return is_namespace() || !as_dict().items.empty();
    case Type::Function:
      return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (type()) {
    case Type::Undefined:
      return "Undefined";
    case Type::None:
      return "NoneType";
    case Type::Bool:
      return "bool";
    case Type::Int:
      return "int";
    case Type::Float:
      return "float";
    case Type::String:
      return "str";
    case Type::List:
      return as_list().is_tuple ? "tuple" : "list";
    case Type::Dict:
      return is_namespace() ? "Namespace" : "dict";
    case Type::Function:
      return "function";
  }
  return "object";
}

std::string Value::str() const {
  switch (type()) {
    case Type::Undefined:
      return "";
    case Type::String:
      return as_string();
    case Type::Dict:
      if (is_namespace()) return "<Namespace " + Value::dict(as_dict().items).repr() + ">";
      return repr();
    default:
      return repr();
  }
}

std::string Value::repr() const {
  switch (type()) {
    case Type::Undefined:
      return "Undefined";
    case Type::None:
      return "None";
    case Type::Bool:
      return as_bool() ? "True" : "False";
    case Type::Int:
      return std::to_string(as_int());
    case Type::Float:
      return detail::format_float(as_float());
    case Type::String:
      return detail::py_repr_string(as_string());
    case Type::List: {
      const ListData& l = as_list();
      std::string s = l.is_tuple ? "(" : "[";
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i) s += ", ";
        s += l.items[i].repr();
      }
      if (l.is_tuple && l.items.size() == 1) s += ",";
      return s + (l.is_tuple ? ")" : "]");
    }
    case Type::Dict: {
      if (is_namespace()) return str();
      std::string s = "{";
      bool first = true;
      for (auto& [k, v] : as_dict().items) {
        if (!first) s += ", ";
        first = false;
        s += k.repr() + ": " + v.repr();
      }
      return s + "}";
    }
    case Type::Function:
      return "<function " + as_function().name + ">";
  }
  return "";
}

namespace {

// The short escapes of Python's json.dumps; false for characters without one.
bool json_short_escape(std::string& out, char32_t c) {
  switch (c) {
    case '"': out += "\\\""; return true;
    case '\\': out += "\\\\"; return true;
    case '\n': out += "\\n"; return true;
    case '\r': out += "\\r"; return true;
    case '\t': out += "\\t"; return true;
    case '\b': out += "\\b"; return true;
    case '\f': out += "\\f"; return true;
    default: return false;
  }
}

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out.push_back('"');
  auto hex4 = [&](uint32_t v) { out += fmt::format("\\u{:04x}", v); };
  if (!ensure_ascii) {
    for (char ch : s) {
      unsigned char c = static_cast<unsigned char>(ch);
      if (json_short_escape(out, c)) continue;
      if (c < 0x20)
        hex4(c);
      else
        out.push_back(ch);
    }
  } else {
    for (char32_t c : detail::decode_utf8(s)) {
      if (json_short_escape(out, c)) continue;
      if (c >= 0x20 && c <= 0x7e) {
        out.push_back(static_cast<char>(c));
      } else if (c >= 0x10000) {
        uint32_t v = c - 0x10000;
        hex4(0xD800 + (v >> 10));
        hex4(0xDC00 + (v & 0x3FF));
      } else {
        hex4(c);
      }
    }
  }
  out.push_back('"');
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return detail::format_float(d);
}

struct JsonWriter {
  bool ensure_ascii;
  const std::optional<std::string>& indent;
  const std::string& item_sep;
  const std::string& key_sep;
  bool sort_keys;
  std::string out;

  void newline(int level) {
    out.push_back('\n');
    for (int i = 0; i < level; ++i) out += *indent;
  }

  std::string key_string(const Value& k) {
    switch (k.type()) {
      case Value::Type::String:
        return k.as_string();
      case Value::Type::Int:
        return std::to_string(k.as_int());
      case Value::Type::Float:
        return json_float(k.as_float());
      case Value::Type::Bool:
        return k.as_bool() ? "true" : "false";
      case Value::Type::None:
        return "null";
      default:
        fail("keys must be str, int, float, bool or None, not {}", k.type_name());
    }
  }

  void write(const Value& v, int level) {
    switch (v.type()) {
      case Value::Type::None:
        out += "null";
        return;
      case Value::Type::Bool:
        out += v.as_bool() ? "true" : "false";
        return;
      case Value::Type::Int:
        out += std::to_string(v.as_int());
        return;
      case Value::Type::Float:
        out += json_float(v.as_float());
        return;
      case Value::Type::String:
        json_string(out, v.as_string(), ensure_ascii);
        return;
      case Value::Type::List: {
        const auto& items = v.as_list().items;
        if (items.empty()) {
          out += "[]";
          return;
        }
        out.push_back('[');
        for (size_t i = 0; i < items.size(); ++i) {
          if (i) out += item_sep;
          if (indent) newline(level + 1);
          write(items[i], level + 1);
        }
        if (indent) newline(level);
        out.push_back(']');
        return;
      }
      case Value::Type::Dict: {
        if (v.is_namespace()) break;
        std::vector<std::pair<std::string, const Value*>> items;
        for (auto& [k, x] : v.as_dict().items) items.emplace_back(key_string(k), &x);
        if (items.empty()) {
          out += "{}";
          return;
        }
        if (sort_keys) {
          std::stable_sort(items.begin(), items.end(), [](auto& a, auto& b) { return a.first < b.first; });
        }
        out.push_back('{');
        for (size_t i = 0; i < items.size(); ++i) {
          if (i) out += item_sep;
          if (indent) newline(level + 1);
          json_string(out, items[i].first, ensure_ascii);
          out += key_sep;
          write(*items[i].second, level + 1);
        }
        if (indent) newline(level);
        out.push_back('}');
        return;
      }
      default:
        break;
    }
    fail("Object of type {} is not JSON serializable", v.type_name());
  }
};

}  // namespace

std::string Value::to_json(bool ensure_ascii, const std::optional<std::string>& indent, const std::string& item_sep,
                           const std::string& key_sep, bool sort_keys) const {
  JsonWriter w{ensure_ascii, indent, item_sep, key_sep, sort_keys, {}};
  w.write(*this, 0);
  return std::move(w.out);
}

bool operator==(const Value& a, const Value& b) {
  using T = Value::Type;
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) {
      int64_t x = a.is_bool() ? a.as_bool() : a.as_int();
      int64_t y = b.is_bool() ? b.as_bool() : b.as_int();
      return x == y;
    }
    return a.to_double() == b.to_double();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case T::Undefined:
    case T::None:
      return true;
    case T::String:
      return a.as_string() == b.as_string();
    case T::List: {
      const auto& x = a.as_list();
      const auto& y = b.as_list();
      if (x.is_tuple != y.is_tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i)
        if (!(x.items[i] == y.items[i])) return false;
      return true;
    }
    case T::Dict: {
      if (a.is_namespace() || b.is_namespace()) return &a.as_dict() == &b.as_dict();
      const auto& x = a.as_dict().items;
      const auto& y = b.as_dict();
      if (x.size() != y.items.size()) return false;
      for (auto& [k, v] : x) {
        const Value* w = y.find(k);
        if (!w || !(v == *w)) return false;
      }
      return true;
    }
    case T::Function:
      return &a.as_function() == &b.as_function();
    default:
      return false;
  }
}

}  // namespace flashnext::chat::jinja

namespace flashnext::chat::jinja::detail {

void eval_error(const std::string& msg) {
  throw EvalError(msg);
}

// ---------------------------------------------------------------- strings
std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    utf8proc_int32_t cp;
    auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                              static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (n <= 0) {
      out.push_back(0xFFFD);
      ++i;
    } else {
      out.push_back(static_cast<char32_t>(cp));
      i += static_cast<size_t>(n);
    }
  }
  return out;
}

std::string encode_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  utf8proc_uint8_t buf[4];
  for (char32_t c : s) {
    auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(c), buf);
    out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
  }
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string s(buf, res.ptr);
  std::string sign;
  if (s[0] == '-') {
    sign = "-";
    s.erase(0, 1);
  }
  size_t epos = s.find('e');
  int exp = std::stoi(s.substr(epos + 1));
  std::string digits;
  for (size_t i = 0; i < epos; ++i)
    if (s[i] != '.') digits.push_back(s[i]);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      std::string int_part = digits.substr(0, std::min<size_t>(digits.size(), exp + 1));
      while (static_cast<int>(int_part.size()) < exp + 1) int_part.push_back('0');
      std::string frac = digits.size() > static_cast<size_t>(exp + 1) ? digits.substr(exp + 1) : "0";
      out = int_part + "." + frac;
    } else {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
  }
  return sign + out;
}

namespace {
bool py_isprintable(char32_t c) {
  if (c == ' ') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}
}  // namespace

std::string py_repr_string(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : decode_utf8(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x80 ? (c < 0x20 || c == 0x7f) : !py_isprintable(c)) {
      if (c < 0x100)
        out += fmt::format("\\x{:02x}", static_cast<uint32_t>(c));
      else if (c < 0x10000)
        out += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
      else
        out += fmt::format("\\U{:08x}", static_cast<uint32_t>(c));
    } else {
      out += encode_utf8(std::u32string(1, c));
    }
  }
  out.push_back(quote);
  return out;
}

// ---------------------------------------------------------------- operators
void require_defined(const Value& v) {
  if (v.is_undefined()) eval_error(v.undefined_message().empty() ? "value is undefined" : v.undefined_message());
}

namespace {

bool int_like(const Value& v) {
  return v.is_int() || v.is_bool();
}
int64_t to_int(const Value& v) {
  return v.is_bool() ? int64_t{v.as_bool()} : v.as_int();
}

[[noreturn]] void unsupported(const char* op, const Value& a, const Value& b) {
  eval_error(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name()));
}

Value checked(bool overflow, int64_t r) {
  if (overflow) eval_error("integer overflow (the value does not fit in 64 bits)");
  return Value(r);
}

Value repeat(const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  constexpr size_t kMax = size_t{1} << 28;
  if (seq.is_string()) {
    const std::string& s = seq.as_string();
    if (!s.empty() && static_cast<size_t>(n) > kMax / s.size()) eval_error("string repetition result is too large");
    std::string out;
    out.reserve(s.size() * n);
    for (int64_t i = 0; i < n; ++i) out += s;
    return Value(std::move(out));
  }
  const auto& l = seq.as_list();
  if (!l.items.empty() && static_cast<size_t>(n) > kMax / l.items.size())
    eval_error("list repetition result is too large");
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), l.items.begin(), l.items.end());
  return Value::list(std::move(out), l.is_tuple);
}

}  // namespace

Value py_add(const Value& a, const Value& b) {
  require_defined(a);
  require_defined(b);
  if (a.is_number() && b.is_number()) {
    if (int_like(a) && int_like(b)) {
      int64_t r = 0;
      bool overflow = __builtin_add_overflow(to_int(a), to_int(b), &r);
      return checked(overflow, r);
    }
    return Value(a.to_double() + b.to_double());
  }
  if (a.is_string()) {
    if (!b.is_string()) eval_error(fmt::format("can only concatenate str (not \"{}\") to str", b.type_name()));
    return Value(a.as_string() + b.as_string());
  }
  if (a.is_list() && b.is_list() && a.as_list().is_tuple == b.as_list().is_tuple) {
    std::vector<Value> items = a.as_list().items;
    items.insert(items.end(), b.as_list().items.begin(), b.as_list().items.end());
    return Value::list(std::move(items), a.as_list().is_tuple);
  }
  if (a.is_list()) {
    eval_error(fmt::format("can only concatenate {0} (not \"{1}\") to {0}", a.type_name(), b.type_name()));
  }
  unsupported("+", a, b);
}

Value py_sub(const Value& a, const Value& b) {
  require_defined(a);
  require_defined(b);
  if (!a.is_number() || !b.is_number()) unsupported("-", a, b);
  if (int_like(a) && int_like(b)) {
    int64_t r = 0;
    bool overflow = __builtin_sub_overflow(to_int(a), to_int(b), &r);
    return checked(overflow, r);
  }
  return Value(a.to_double() - b.to_double());
}

Value py_mul(const Value& a, const Value& b) {
  require_defined(a);
  require_defined(b);
  if (a.is_number() && b.is_number()) {
    if (int_like(a) && int_like(b)) {
      int64_t r = 0;
      bool overflow = __builtin_mul_overflow(to_int(a), to_int(b), &r);
      return checked(overflow, r);
    }
    return Value(a.to_double() * b.to_double());
  }
  if ((a.is_string() || a.is_list()) && int_like(b)) return repeat(a, to_int(b));
  if ((b.is_string() || b.is_list()) && int_like(a)) return repeat(b, to_int(a));
  unsupported("*", a, b);
}

Value py_div(const Value& a, const Value& b) {
  require_defined(a);
  require_defined(b);
  if (!a.is_number() || !b.is_number()) unsupported("/", a, b);
  if (b.to_double() == 0) eval_error("division by zero");
  return Value(a.to_double() / b.to_double());
}

Value py_floordiv(const Value& a, const Value& b) {
  require_defined(a);
  require_defined(b);
  if (!a.is_number() || !b.is_number()) unsupported("//", a, b);
  if (int_like(a) && int_like(b)) {
    int64_t x = to_int(a), y = to_int(b);
    if (y == 0) eval_error("integer division or modulo by zero");
    if (x == std::numeric_limits<int64_t>::min() && y == -1) eval_error("integer overflow");
    int64_t q = x / y;
    if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
    return Value(q);
  }
  if (b.to_double() == 0) eval_error("float floor division by zero");
  return Value(std::floor(a.to_double() / b.to_double()));
}

Value py_mod(const Value& a, const Value& b) {
  require_defined(a);
  require_defined(b);
  if (a.is_string()) return Value(py_percent_format(a.as_string(), b));
  if (!a.is_number() || !b.is_number()) unsupported("%", a, b);
  if (int_like(a) && int_like(b)) {
    int64_t x = to_int(a), y = to_int(b);
    if (y == 0) eval_error("integer division or modulo by zero");
    if (y == -1) return Value(int64_t{0});
    int64_t r = x % y;
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return Value(r);
  }
  double y = b.to_double();
  if (y == 0) eval_error("float modulo");
  double r = std::fmod(a.to_double(), y);
  if (r != 0 && ((r < 0) != (y < 0))) r += y;
  return Value(r);
}

Value py_pow(const Value& a, const Value& b) {
  require_defined(a);
  require_defined(b);
  if (!a.is_number() || !b.is_number()) unsupported("** or pow()", a, b);
  if (int_like(a) && int_like(b) && to_int(b) >= 0) {
    int64_t base = to_int(a), e = to_int(b), r = 1;
    while (e > 0) {
      if ((e & 1) && __builtin_mul_overflow(r, base, &r)) eval_error("integer overflow");
      e >>= 1;
      if (e > 0 && __builtin_mul_overflow(base, base, &base)) eval_error("integer overflow");
    }
    return Value(r);
  }
  if (a.to_double() == 0 && b.to_double() < 0) eval_error("0.0 cannot be raised to a negative power");
  return Value(std::pow(a.to_double(), b.to_double()));
}

Value py_neg(const Value& a) {
  require_defined(a);
  if (int_like(a)) {
    if (to_int(a) == std::numeric_limits<int64_t>::min()) eval_error("integer overflow");
    return Value(-to_int(a));
  }
  if (a.is_float()) return Value(-a.as_float());
  eval_error(fmt::format("bad operand type for unary -: '{}'", a.type_name()));
}

bool py_less(const Value& a, const Value& b) {
  require_defined(a);
  require_defined(b);
  if (a.is_number() && b.is_number()) {
    if (int_like(a) && int_like(b)) return to_int(a) < to_int(b);
    return a.to_double() < b.to_double();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_list() && b.is_list() && a.as_list().is_tuple == b.as_list().is_tuple) {
    const auto& x = a.as_list().items;
    const auto& y = b.as_list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!(x[i] == y[i])) return py_less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  eval_error(fmt::format("'<' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name()));
}

bool py_contains(const Value& container, const Value& item) {
  switch (container.type()) {
    case Value::Type::Undefined:
      return false;
    case Value::Type::String:
      if (!item.is_string()) {
        eval_error(fmt::format("'in <string>' requires string as left operand, not {}", item.type_name()));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Type::List:
      for (auto& x : container.as_list().items)
        if (x == item) return true;
      return false;
    case Value::Type::Dict:
      if (!container.is_namespace()) return container.as_dict().find(item) != nullptr;
      [[fallthrough]];
    default:
      eval_error(fmt::format("argument of type '{}' is not iterable", container.type_name()));
  }
}

std::vector<Value> py_iterate(const Value& v) {
  switch (v.type()) {
    case Value::Type::Undefined:
      return {};
    case Value::Type::List:
      return v.as_list().items;
    case Value::Type::String: {
      std::vector<Value> out;
      for (char32_t c : decode_utf8(v.as_string())) out.emplace_back(encode_utf8(std::u32string(1, c)));
      return out;
    }
    case Value::Type::Dict:
      if (!v.is_namespace()) {
        std::vector<Value> out;
        for (auto& [k, x] : v.as_dict().items) out.push_back(k);
        return out;
      }
      [[fallthrough]];
    default:
      eval_error(fmt::format("'{}' object is not iterable", v.type_name()));
  }
}

int64_t py_len(const Value& v) {
  switch (v.type()) {
    case Value::Type::Undefined:
      return 0;
    case Value::Type::String:
      return static_cast<int64_t>(utf8_length(v.as_string()));
    case Value::Type::List:
      return static_cast<int64_t>(v.as_list().items.size());
    case Value::Type::Dict:
      if (!v.is_namespace()) return static_cast<int64_t>(v.as_dict().items.size());
      [[fallthrough]];
    default:
      eval_error(fmt::format("object of type '{}' has no len()", v.type_name()));
  }
}

std::string py_percent_format(const std::string& f, const Value& args) {
  std::vector<Value> positional;
  const Value* mapping = nullptr;
  if (args.is_list() && args.as_list().is_tuple)
    positional = args.as_list().items;
  else if (args.is_dict())
    mapping = &args, positional = {args};
  else
    positional = {args};
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') {
      out.push_back(f[i]);
      continue;
    }
    if (++i >= f.size()) eval_error("incomplete format");
    if (f[i] == '%') {
      out.push_back('%');
      continue;
    }
    const Value* arg = nullptr;
    if (f[i] == '(') {
      size_t close = f.find(')', i);
      if (close == std::string::npos) eval_error("incomplete format key");
      if (!mapping) eval_error("format requires a mapping");
      arg = mapping->as_dict().find(Value(f.substr(i + 1, close - i - 1)));
      if (!arg) eval_error(fmt::format("KeyError: '{}'", f.substr(i + 1, close - i - 1)));
      i = close + 1;
    }
    std::string flags;
    while (i < f.size() && std::strchr("-+ #0", f[i])) flags.push_back(f[i++]);
    std::string width, precision;
    while (i < f.size() && std::isdigit(static_cast<unsigned char>(f[i]))) width.push_back(f[i++]);
    if (i < f.size() && f[i] == '.') {
      precision = ".";
      ++i;
      while (i < f.size() && std::isdigit(static_cast<unsigned char>(f[i]))) precision.push_back(f[i++]);
    }
    if (i >= f.size()) eval_error("incomplete format");
    char conv = f[i];
    if (!arg) {
      if (next >= positional.size()) eval_error("not enough arguments for format string");
      arg = &positional[next++];
    }
    std::string spec = "%" + flags + width + precision;
    char buf[512];
    std::string piece;
    switch (conv) {
      case 's':
      case 'r':
      case 'a': {
        std::string s = conv == 's' ? arg->str() : arg->repr();
        if (precision.size() > 1) {
          std::u32string u = decode_utf8(s);
          u.resize(std::min<size_t>(u.size(), std::stoul(precision.substr(1))));
          s = encode_utf8(u);
        }
        size_t w = width.empty() ? 0 : std::stoul(width);
        size_t len = utf8_length(s);
        if (len < w) {
          std::string pad(w - len, ' ');
          s = flags.find('-') != std::string::npos ? s + pad : pad + s;
        }
        piece = s;
        break;
      }
      case 'd':
      case 'i':
      case 'u': {
        if (!arg->is_number())
          eval_error(fmt::format("%{} format: a real number is required, not {}", conv, arg->type_name()));
        int64_t v =
            arg->is_float() ? static_cast<int64_t>(arg->as_float()) : (arg->is_bool() ? arg->as_bool() : arg->as_int());
        std::snprintf(buf, sizeof(buf), (spec + "lld").c_str(), static_cast<long long>(v));
        piece = buf;
        break;
      }
      case 'x':
      case 'X':
      case 'o': {
        if (!arg->is_int() && !arg->is_bool())
          eval_error(fmt::format("%{} format: an integer is required, not {}", conv, arg->type_name()));
        std::snprintf(buf, sizeof(buf), (spec + "ll" + conv).c_str(),
                      static_cast<long long>(arg->is_bool() ? arg->as_bool() : arg->as_int()));
        piece = buf;
        break;
      }
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G': {
        if (!arg->is_number()) eval_error(fmt::format("must be real number, not {}", arg->type_name()));
        std::snprintf(buf, sizeof(buf), (spec + conv).c_str(), arg->to_double());
        piece = buf;
        break;
      }
      case 'c': {
        if (arg->is_string() && utf8_length(arg->as_string()) == 1)
          piece = arg->as_string();
        else if (arg->is_int())
          piece = encode_utf8(std::u32string(1, static_cast<char32_t>(arg->as_int())));
        else
          eval_error("%c requires int or char");
        break;
      }
      default:
        eval_error(fmt::format("unsupported format character '{}'", conv));
    }
    out += piece;
  }
  if (!mapping && next < positional.size()) eval_error("not all arguments converted during string formatting");
  return out;
}

// ---------------------------------------------------------------- attribute and item access
namespace {

std::string object_type_repr(const Value& obj) {
  if (obj.is_none()) return "None";
  if (obj.is_namespace()) return "jinja2.utils.Namespace object";
  return obj.type_name() + " object";
}

Value missing_attr(const Value& obj, const std::string& name) {
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", object_type_repr(obj), name));
}

bool is_dict_attr(const std::string& n) {
  static const char* names[] = {"clear", "copy",    "fromkeys",   "get",    "items", "keys",
                                "pop",   "popitem", "setdefault", "update", "values"};
  for (const char* x : names)
    if (n == x) return true;
  return false;
}

bool is_list_attr(const std::string& n, bool tuple) {
  if (n == "count" || n == "index") return true;
  if (tuple) return false;
  static const char* names[] = {"append", "clear", "copy", "extend", "insert", "pop", "remove", "reverse", "sort"};
  for (const char* x : names)
    if (n == x) return true;
  return false;
}

bool is_str_attr(const std::string& n) {
  static const char* names[] = {
      "capitalize", "casefold",     "center",       "count",   "encode",     "endswith",    "expandtabs",
      "find",       "format",       "format_map",   "index",   "isalnum",    "isalpha",     "isascii",
      "isdecimal",  "isdigit",      "isidentifier", "islower", "isnumeric",  "isprintable", "isspace",
      "istitle",    "isupper",      "join",         "ljust",   "lower",      "lstrip",      "maketrans",
      "partition",  "removeprefix", "removesuffix", "replace", "rfind",      "rindex",      "rjust",
      "rpartition", "rsplit",       "rstrip",       "split",   "splitlines", "startswith",  "strip",
      "swapcase",   "title",        "translate",    "upper",   "zfill"};
  for (const char* x : names)
    if (n == x) return true;
  return false;
}

Value bound_method(const Value& obj, const std::string& name) {
  return Value::function(name, [obj, name](CallArgs& args) {
    Value result;
    if (!call_method(obj, name, args, result)) {
      eval_error(fmt::format("'{}' object has no attribute '{}'", obj.type_name(), name));
    }
    return result;
  });
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name) {
  require_defined(obj);
  switch (obj.type()) {
    case Value::Type::String:
      if (is_str_attr(name)) return bound_method(obj, name);
      return missing_attr(obj, name);
    case Value::Type::List:
      if (is_list_attr(name, obj.as_list().is_tuple)) return bound_method(obj, name);
      return missing_attr(obj, name);
    case Value::Type::Dict: {
      if (!obj.is_namespace() && is_dict_attr(name)) return bound_method(obj, name);
      const Value* v = obj.as_dict().find(Value(name));
      if (v) return *v;
      return missing_attr(obj, name);
    }
    default:
      return missing_attr(obj, name);
  }
}

Value get_item(const Value& obj, const Value& key) {
  require_defined(obj);
  if (obj.is_dict()) {
    const Value* v = obj.as_dict().find(key);
    if (v) return *v;
  } else if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.is_bool() ? key.as_bool() : key.as_int();
    if (obj.is_list()) {
      const auto& items = obj.as_list().items;
      int64_t n = static_cast<int64_t>(items.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return items[static_cast<size_t>(i)];
    } else {
      std::u32string u = decode_utf8(obj.as_string());
      int64_t n = static_cast<int64_t>(u.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value(encode_utf8(u.substr(static_cast<size_t>(i), 1)));
    }
    return Value::undefined(fmt::format("{} has no element {}", object_type_repr(obj), key.repr()));
  }
  if (key.is_string()) return get_attr(obj, key.as_string());
  return Value::undefined(fmt::format("{} has no element {}", object_type_repr(obj), key.repr()));
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  require_defined(obj);
  auto index = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none()) return std::nullopt;
    if (v.is_int()) return v.as_int();
    if (v.is_bool()) return int64_t{v.as_bool()};
    eval_error(fmt::format("slice {} must be an integer or None, not {}", what, v.type_name()));
  };
  auto st = index(step, "step");
  int64_t stp = st.value_or(1);
  if (stp == 0) eval_error("slice step cannot be zero");
  auto pick = [&](int64_t len, auto&& take) {
    int64_t lower = stp > 0 ? 0 : -1, upper = stp > 0 ? len : len - 1;
    auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
      if (!v) return dflt;
      int64_t x = *v;
      if (x < 0) {
        x += len;
        if (x < lower) x = lower;
      } else if (x > upper) {
        x = upper;
      }
      return x;
    };
    int64_t b = clamp(index(start, "start"), stp > 0 ? lower : upper);
    int64_t e = clamp(index(stop, "stop"), stp > 0 ? upper : lower);
    for (int64_t i = b; stp > 0 ? i < e : i > e; i += stp) take(static_cast<size_t>(i));
  };
  if (obj.is_list()) {
    const auto& items = obj.as_list().items;
    std::vector<Value> out;
    pick(static_cast<int64_t>(items.size()), [&](size_t i) { out.push_back(items[i]); });
    return Value::list(std::move(out), obj.as_list().is_tuple);
  }
  if (obj.is_string()) {
    std::u32string u = decode_utf8(obj.as_string());
    std::u32string out;
    pick(static_cast<int64_t>(u.size()), [&](size_t i) { out.push_back(u[i]); });
    return Value(encode_utf8(out));
  }
  return Value::undefined(fmt::format("{} is not subscriptable with a slice", object_type_repr(obj)));
}

}  // namespace flashnext::chat::jinja::detail
