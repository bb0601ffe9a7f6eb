// Built-ins of the Jinja2 engine, transcribed from jinja2 3.1 (filters.py, tests.py, defaults.py) and Python's
// str/dict/list methods, plus the globals transformers adds (raise_exception, strftime_now) and its `tojson`
// override (json.dumps with ensure_ascii=False).
//
// Filters: abs attr batch capitalize center count d default dictsort e escape first float format indent int items
//   join last length list lower map max min reject rejectattr replace reverse round safe select selectattr sort
//   string sum title tojson trim unique upper wordcount.
// Tests: boolean callable defined divisibleby eq equalto escaped even false filter float ge greaterthan gt in
//   integer iterable le lessthan lower lt mapping ne none number odd sameas sequence string test true undefined
//   upper == != < <= > >=.
// Methods: str (capitalize center count endswith find format index isalnum isalpha isdigit islower isspace isupper
//   join ljust lower lstrip replace rfind rindex rjust rsplit rstrip split splitlines startswith strip title upper
//   zfill), dict (items keys values get copy), list/tuple (count index copy). Methods that would modify a list or
//   dict are refused, as in jinja2's ImmutableSandboxedEnvironment.
#include <fmt/format.h>
#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <ctime>
#include <limits>
#include <map>
#include <optional>

#include "chat/jinja_runtime.h"

namespace flashnext::chat::jinja::detail {

// ---------------------------------------------------------------- argument binding
ArgBinder::ArgBinder(const char* function, CallArgs& args, std::initializer_list<const char*> names)
    : bound_(names.size(), nullptr) {
  std::vector<const char*> n(names);
  if (args.positional.size() > n.size()) {
    eval_error(fmt::format("{}() takes at most {} argument(s) ({} given)", function, n.size(), args.positional.size()));
  }
  for (size_t i = 0; i < args.positional.size(); ++i) bound_[i] = &args.positional[i];
  for (auto& [key, value] : args.keyword) {
    size_t i = 0;
    while (i < n.size() && key != n[i]) ++i;
    if (i == n.size()) eval_error(fmt::format("{}() got an unexpected keyword argument '{}'", function, key));
    if (bound_[i]) eval_error(fmt::format("{}() got multiple values for argument '{}'", function, key));
    bound_[i] = &value;
  }
}

const Value& ArgBinder::get(size_t i, const Value& fallback) const {
  return bound_[i] ? *bound_[i] : fallback;
}

namespace {

using U = std::u32string;

const Value kNone = Value::none();
const Value kFalse = Value(false);
const Value kEmpty = Value("");

int64_t require_int(const Value& v, const char* what) {
  if (v.is_int()) return v.as_int();
  if (v.is_bool()) return v.as_bool();
  eval_error(fmt::format("{} must be an integer, not {}", what, v.type_name()));
}

const std::string& require_str(const Value& v, const char* what) {
  if (!v.is_string()) eval_error(fmt::format("{} must be str, not {}", what, v.type_name()));
  return v.as_string();
}

U to_u32(const std::string& s) {
  return decode_utf8(s);
}
std::string to_utf8(const U& s) {
  return encode_utf8(s);
}

char32_t lower_cp(char32_t c) {
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}
char32_t upper_cp(char32_t c) {
  return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}
char32_t title_cp(char32_t c) {
  return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c)));
}
utf8proc_category_t category(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}
bool is_cased(char32_t c) {
  auto k = category(c);
  return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}
bool is_alpha(char32_t c) {
  auto k = category(c);
  return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}
bool is_numeric(char32_t c) {
  auto k = category(c);
  return k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO;
}

// Python str.islower()/isupper(): at least one cased character, and every cased character in category `want`.
bool cased_all(const std::string& s, utf8proc_category_t want) {
  bool any = false;
  for (char32_t c : to_u32(s)) {
    if (!is_cased(c)) continue;
    any = true;
    if (category(c) != want) return false;
  }
  return any;
}

std::string str_lower(const std::string& s) {
  U u = to_u32(s);
  for (auto& c : u) c = lower_cp(c);
  return to_utf8(u);
}
std::string str_upper(const std::string& s) {
  U u = to_u32(s);
  for (auto& c : u) c = upper_cp(c);
  return to_utf8(u);
}
std::string str_capitalize(const std::string& s) {
  U u = to_u32(s);
  for (size_t i = 0; i < u.size(); ++i) u[i] = i == 0 ? title_cp(u[i]) : lower_cp(u[i]);
  return to_utf8(u);
}
std::string str_title(const std::string& s) {  // Python str.title()
  U u = to_u32(s);
  bool prev_cased = false;
  for (auto& c : u) {
    bool cased = is_cased(c);
    c = prev_cased ? lower_cp(c) : title_cp(c);
    prev_cased = cased;
  }
  return to_utf8(u);
}

// The code point starting at byte i of valid-or-not UTF-8 (U+FFFD for a bad sequence) and its length in bytes.
std::pair<char32_t, size_t> code_point_at(std::string_view s, size_t i) {
  utf8proc_int32_t cp;
  auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                            static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
  if (n <= 0) return {0xFFFD, 1};
  return {static_cast<char32_t>(cp), static_cast<size_t>(n)};
}

// Python str.strip/lstrip/rstrip, working on the UTF-8 bytes (only the stripped ends are decoded).
std::string str_strip(const std::string& s, const Value& chars, bool left, bool right) {
  U set;
  bool ws = chars.is_none() || chars.is_undefined();
  if (!ws) set = to_u32(require_str(chars, "strip arg"));
  auto strip = [&](char32_t c) { return ws ? py_isspace(c) : set.find(c) != U::npos; };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e) {
      auto [c, n] = code_point_at(s, b);
      if (!strip(c)) break;
      b += n;
    }
  }
  if (right) {
    while (e > b) {
      size_t start = e - 1;
      while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
      auto [c, n] = code_point_at(std::string_view(s).substr(0, e), start);
      if (start + n != e) c = 0xFFFD;  // a truncated sequence is not whitespace
      if (!strip(c)) break;
      e = start;
    }
  }
  return s.substr(b, e - b);
}

std::vector<Value> str_split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep.is_none() || sep.is_undefined()) {
    U u = to_u32(s);
    if (!from_right) {
      size_t i = 0;
      while (true) {
        while (i < u.size() && py_isspace(u[i])) ++i;
        if (i >= u.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
          parts.push_back(to_utf8(u.substr(i)));  // the rest keeps its trailing whitespace
          break;
        }
        size_t j = i;
        while (j < u.size() && !py_isspace(u[j])) ++j;
        parts.push_back(to_utf8(u.substr(i, j - i)));
        i = j;
      }
    } else {
      int64_t i = static_cast<int64_t>(u.size());
      while (true) {
        while (i > 0 && py_isspace(u[i - 1])) --i;
        if (i <= 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
          parts.push_back(to_utf8(u.substr(0, i)));  // the rest keeps its leading whitespace
          break;
        }
        int64_t j = i;
        while (j > 0 && !py_isspace(u[j - 1])) --j;
        parts.push_back(to_utf8(u.substr(j, i - j)));
        i = j;
      }
      std::reverse(parts.begin(), parts.end());
    }
  } else {
    const std::string& d = require_str(sep, "separator");
    if (d.empty()) eval_error("empty separator");
    if (!from_right) {
      size_t start = 0;
      while (true) {
        size_t p = s.find(d, start);
        if (p == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) {
          parts.push_back(s.substr(start));
          break;
        }
        parts.push_back(s.substr(start, p - start));
        start = p + d.size();
      }
    } else {
      size_t end = s.size();
      while (true) {
        size_t p = end >= d.size() ? s.rfind(d, end - d.size()) : std::string::npos;
        if (p == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) {
          parts.push_back(s.substr(0, end));
          break;
        }
        parts.push_back(s.substr(p + d.size(), end - p - d.size()));
        end = p;
      }
      std::reverse(parts.begin(), parts.end());
    }
  }
  std::vector<Value> out;
  out.reserve(parts.size());
  for (auto& p : parts) out.emplace_back(std::move(p));
  return out;
}

std::vector<Value> str_splitlines(const std::string& s, bool keepends) {
  U u = to_u32(s);
  std::vector<Value> out;
  size_t i = 0, start = 0;
  auto is_break = [](char32_t c) {
    return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
           c == 0x2028 || c == 0x2029;
  };
  while (i < u.size()) {
    if (is_break(u[i])) {
      size_t eol = i + 1;
      if (u[i] == '\r' && i + 1 < u.size() && u[i + 1] == '\n') eol = i + 2;
      out.emplace_back(to_utf8(u.substr(start, (keepends ? eol : i) - start)));
      start = i = eol;
    } else {
      ++i;
    }
  }
  if (start < u.size()) out.emplace_back(to_utf8(u.substr(start)));
  return out;
}

std::string str_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count) {
  std::string out;
  if (old.empty()) {
    U u = to_u32(s);
    int64_t n = 0;
    for (size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || n < count) {
        out += repl;
        ++n;
      }
      if (i < u.size()) out += to_utf8(U(1, u[i]));
    }
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t p = s.find(old, start);
    if (p == std::string::npos) break;
    out.append(s, start, p - start);
    out += repl;
    start = p + old.size();
    ++n;
  }
  out.append(s, start, std::string::npos);
  return out;
}

int64_t cp_index(const std::string& s, size_t byte_pos) {
  return byte_pos == std::string::npos ? -1
                                       : static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, byte_pos)));
}

bool affix_match(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& a) {
    const std::string& x = require_str(a, prefix ? "startswith first arg" : "endswith first arg");
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_list() && affix.as_list().is_tuple) {
    for (auto& a : affix.as_list().items)
      if (one(a)) return true;
    return false;
  }
  return one(affix);
}

std::string pad(const std::string& s, int64_t width, const std::string& fill, int where /*-1 left,0 center,1 right*/) {
  int64_t len = static_cast<int64_t>(utf8_length(s));
  if (width <= len) return s;
  int64_t marg = width - len;
  int64_t left = where < 0 ? 0 : where > 0 ? marg : marg / 2 + (marg & width & 1);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < marg - left; ++i) out += fill;
  return out;
}

// `{...}` replacement fields of str.format with an optional simple spec ([[fill]align][width][.precision][type]).
std::string apply_format_spec(const Value& v, const std::string& spec) {
  if (spec.empty()) return v.str();
  size_t i = 0;
  std::string fill = " ";
  char align = 0;
  U us = to_u32(spec);
  if (us.size() >= 2 && (us[1] == '<' || us[1] == '>' || us[1] == '^')) {
    fill = to_utf8(U(1, us[0]));
    align = static_cast<char>(us[1]);
    i = fill.size() + 1;
  } else if (spec[0] == '<' || spec[0] == '>' || spec[0] == '^') {
    align = spec[0];
    i = 1;
  }
  std::string width, precision;
  while (i < spec.size() && std::isdigit(static_cast<unsigned char>(spec[i]))) width.push_back(spec[i++]);
  if (i < spec.size() && spec[i] == '.') {
    ++i;
    while (i < spec.size() && std::isdigit(static_cast<unsigned char>(spec[i]))) precision.push_back(spec[i++]);
  }
  char type = i < spec.size() ? spec[i++] : 0;
  if (i != spec.size()) eval_error(fmt::format("unsupported format spec '{}'", spec));
  std::string body;
  if (type == 'f' || type == 'e' || type == 'g' || type == '%') {
    if (!v.is_number())
      eval_error(fmt::format("Unknown format code '{}' for object of type '{}'", type, v.type_name()));
    int p = precision.empty() ? 6 : std::stoi(precision);
    double d = v.to_double() * (type == '%' ? 100 : 1);
    body =
        fmt::format(fmt::runtime(fmt::format("{{:.{}{}}}", p, type == '%' ? 'f' : type)), d) + (type == '%' ? "%" : "");
  } else if (type == 'd') {
    if (!v.is_int() && !v.is_bool())
      eval_error(fmt::format("Unknown format code 'd' for object of type '{}'", v.type_name()));
    body = std::to_string(v.is_bool() ? v.as_bool() : v.as_int());
  } else if (type == 0 || type == 's') {
    body = v.str();
    if (!precision.empty()) {
      U u = to_u32(body);
      u.resize(std::min<size_t>(u.size(), std::stoul(precision)));
      body = to_utf8(u);
    }
  } else {
    eval_error(fmt::format("unsupported format spec '{}'", spec));
  }
  if (width.empty()) return body;
  if (!align) align = v.is_number() && !v.is_bool() && type != 's' ? '>' : '<';
  return pad(body, std::stoll(width), fill, align == '<' ? -1 : align == '>' ? 1 : 0);
}

std::string str_format(const std::string& f, CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    char c = f[i];
    if (c == '}') {
      if (i + 1 < f.size() && f[i + 1] == '}')
        ++i;
      else
        eval_error("Single '}' encountered in format string");
      out.push_back('}');
      continue;
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < f.size() && f[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    size_t close = f.find('}', i);
    if (close == std::string::npos) eval_error("Single '{' encountered in format string");
    std::string field = f.substr(i + 1, close - i - 1);
    i = close;
    std::string spec, conv;
    if (size_t colon = field.find(':'); colon != std::string::npos) spec = field.substr(colon + 1), field.resize(colon);
    if (size_t bang = field.find('!'); bang != std::string::npos) conv = field.substr(bang + 1), field.resize(bang);
    size_t name_end = std::min(field.find('.'), field.find('['));
    std::string head = field.substr(0, name_end);
    Value v;
    if (head.empty() || std::isdigit(static_cast<unsigned char>(head[0]))) {
      size_t idx = head.empty() ? auto_index++ : std::stoul(head);
      if (idx >= args.positional.size()) eval_error(fmt::format("Replacement index {} out of range", idx));
      v = args.positional[idx];
    } else {
      bool found = false;
      for (auto& [k, x] : args.keyword)
        if (k == head) v = x, found = true;
      if (!found) eval_error(fmt::format("KeyError: '{}'", head));
    }
    for (size_t p = name_end; p < field.size();) {
      if (field[p] == '.') {
        size_t e = std::min(field.find('.', p + 1), field.find('[', p + 1));
        v = get_attr(v, field.substr(p + 1, e - p - 1));
        p = e;
      } else {
        size_t e = field.find(']', p);
        if (e == std::string::npos) eval_error("Missing ']' in format string");
        std::string key = field.substr(p + 1, e - p - 1);
        bool digits = !key.empty() && std::all_of(key.begin(), key.end(),
                                                  [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); });
        v = get_item(v, digits ? Value(static_cast<int64_t>(std::stoll(key))) : Value(key));
        p = e + 1;
      }
    }
    if (conv == "r")
      v = Value(v.repr());
    else if (conv == "s")
      v = Value(v.str());
    else if (!conv.empty())
      eval_error(fmt::format("Unknown conversion specifier {}", conv));
    out += apply_format_spec(v, spec);
  }
  return out;
}

// Python int("...") / float("...") parsing, with surrounding whitespace allowed.
std::optional<int64_t> parse_int(const std::string& raw, int base) {
  std::string s = str_strip(raw, kNone, true, true);
  std::string t;
  for (char c : s)
    if (c != '_') t.push_back(c);
  if (t.empty()) return std::nullopt;
  size_t off = (t[0] == '+' || t[0] == '-') ? 1 : 0;
  if (base == 16 && t.size() > off + 2 && t[off] == '0' && (t[off + 1] == 'x' || t[off + 1] == 'X')) t.erase(off, 2);
  int64_t v = 0;
  const char* b = t.data() + (t[0] == '+' ? 1 : 0);
  auto [p, ec] = std::from_chars(b, t.data() + t.size(), v, base);
  if (ec != std::errc() || p != t.data() + t.size()) return std::nullopt;
  return v;
}

std::optional<double> parse_float(const std::string& raw) {
  std::string s = str_strip(raw, kNone, true, true);
  if (s.empty()) return std::nullopt;
  std::string low = str_lower(s);
  if (low == "nan" || low == "+nan" || low == "-nan") return std::nan("");
  if (low == "inf" || low == "+inf" || low == "infinity" || low == "+infinity") return INFINITY;
  if (low == "-inf" || low == "-infinity") return -INFINITY;
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || s.find_first_of("xXpP") != std::string::npos) return std::nullopt;
  return d;
}

}  // namespace

// ---------------------------------------------------------------- methods
bool call_method(const Value& obj, const std::string& name, CallArgs& args, Value& result) {
  auto unsafe = [&]() -> bool {
    eval_error(fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, obj.type_name()));
  };
  if (obj.is_string()) {
    const std::string& s = obj.as_string();
    const std::string fn = "str." + name;
    if (name == "startswith" || name == "endswith") {
      ArgBinder a(fn.c_str(), args, {"prefix"});
      if (!a.has(0)) eval_error(fmt::format("{}() takes at least 1 argument (0 given)", name));
      result = Value(affix_match(s, a.get(0, kNone), name == "startswith"));
    } else if (name == "strip" || name == "lstrip" || name == "rstrip") {
      ArgBinder a(fn.c_str(), args, {"chars"});
      result = Value(str_strip(s, a.get(0, kNone), name != "rstrip", name != "lstrip"));
    } else if (name == "split" || name == "rsplit") {
      ArgBinder a(fn.c_str(), args, {"sep", "maxsplit"});
      Value minus_one(int64_t{-1});
      result =
          Value::list(str_split(s, a.get(0, kNone), require_int(a.get(1, minus_one), "maxsplit"), name == "rsplit"));
    } else if (name == "splitlines") {
      ArgBinder a(fn.c_str(), args, {"keepends"});
      result = Value::list(str_splitlines(s, a.get(0, kFalse).truthy()));
    } else if (name == "replace") {
      ArgBinder a(fn.c_str(), args, {"old", "new", "count"});
      if (!a.has(0) || !a.has(1)) eval_error("replace() takes at least 2 arguments");
      Value minus_one(int64_t{-1});
      result = Value(str_replace(s, require_str(a.get(0, kNone), "replace() argument 1"),
                                 require_str(a.get(1, kNone), "replace() argument 2"),
                                 require_int(a.get(2, minus_one), "count")));
    } else if (name == "lower" || name == "upper" || name == "title" || name == "capitalize" || name == "isdigit" ||
               name == "isalpha" || name == "isalnum" || name == "isspace" || name == "islower" || name == "isupper" ||
               name == "isnumeric" || name == "isdecimal") {
      ArgBinder a(fn.c_str(), args, {});
      U u = to_u32(s);
      auto all = [&](auto pred) { return !u.empty() && std::all_of(u.begin(), u.end(), pred); };
      if (name == "lower")
        result = Value(str_lower(s));
      else if (name == "upper")
        result = Value(str_upper(s));
      else if (name == "title")
        result = Value(str_title(s));
      else if (name == "capitalize")
        result = Value(str_capitalize(s));
      else if (name == "isdigit" || name == "isdecimal")
        result = Value(all([](char32_t c) { return category(c) == UTF8PROC_CATEGORY_ND; }));
      else if (name == "isnumeric")
        result = Value(all(is_numeric));
      else if (name == "isalpha")
        result = Value(all(is_alpha));
      else if (name == "isalnum")
        result = Value(all([](char32_t c) { return is_alpha(c) || is_numeric(c); }));
      else if (name == "isspace")
        result = Value(all(py_isspace));
      else
        result = Value(cased_all(s, name == "islower" ? UTF8PROC_CATEGORY_LL : UTF8PROC_CATEGORY_LU));
    } else if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
      ArgBinder a(fn.c_str(), args, {"sub"});
      const std::string& sub = require_str(a.get(0, kNone), "substring");
      if (name == "count") {
        int64_t n = 0;
        if (sub.empty()) {
          n = static_cast<int64_t>(utf8_length(s)) + 1;
        } else {
          for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
        }
        result = Value(n);
      } else {
        size_t p = (name == "find" || name == "index") ? s.find(sub) : s.rfind(sub);
        if (p == std::string::npos && (name == "index" || name == "rindex")) eval_error("substring not found");
        result = Value(cp_index(s, p));
      }
    } else if (name == "join") {
      ArgBinder a(fn.c_str(), args, {"iterable"});
      std::string out;
      size_t i = 0;
      for (auto& item : py_iterate(a.get(0, kNone))) {
        if (!item.is_string()) {
          eval_error(fmt::format("sequence item {}: expected str instance, {} found", i, item.type_name()));
        }
        if (i++) out += s;
        out += item.as_string();
      }
      result = Value(std::move(out));
    } else if (name == "format") {
      result = Value(str_format(s, args));
    } else if (name == "center" || name == "ljust" || name == "rjust") {
      ArgBinder a(fn.c_str(), args, {"width", "fillchar"});
      Value space(" ");
      const std::string& fill = require_str(a.get(1, space), "fillchar");
      if (utf8_length(fill) != 1) eval_error("The fill character must be exactly one character long");
      result = Value(pad(s, require_int(a.get(0, kNone), "width"), fill,
                         name == "ljust"   ? -1
                         : name == "rjust" ? 1
                                           : 0));
    } else if (name == "zfill") {
      ArgBinder a(fn.c_str(), args, {"width"});
      int64_t w = require_int(a.get(0, kNone), "width");
      std::string sign, body = s;
      if (!body.empty() && (body[0] == '+' || body[0] == '-')) sign = body.substr(0, 1), body.erase(0, 1);
      int64_t len = static_cast<int64_t>(utf8_length(s));
      result = Value(sign + std::string(static_cast<size_t>(std::max<int64_t>(0, w - len)), '0') + body);
    } else {
      return false;
    }
    return true;
  }
  if (obj.is_dict()) {
    const auto& d = obj.as_dict();
    const std::string fn = "dict." + name;
    if (name == "items" || name == "keys" || name == "values") {
      ArgBinder a(fn.c_str(), args, {});
      std::vector<Value> out;
      for (auto& [k, v] : d.items) {
        if (name == "items")
          out.push_back(Value::list({k, v}, true));
        else
          out.push_back(name == "keys" ? k : v);
      }
      result = Value::list(std::move(out));
    } else if (name == "get") {
      ArgBinder a(fn.c_str(), args, {"key", "default"});
      const Value* v = d.find(a.get(0, kNone));
      result = v ? *v : a.get(1, kNone);
    } else if (name == "copy") {
      ArgBinder a(fn.c_str(), args, {});
      result = Value::dict(d.items);
    } else if (name == "clear" || name == "pop" || name == "popitem" || name == "setdefault" || name == "update" ||
               name == "fromkeys") {
      return unsafe();
    } else {
      return false;
    }
    return true;
  }
  if (obj.is_list()) {
    const auto& l = obj.as_list();
    const std::string fn = obj.type_name() + "." + name;
    if (name == "count") {
      ArgBinder a(fn.c_str(), args, {"value"});
      result = Value(static_cast<int64_t>(std::count(l.items.begin(), l.items.end(), a.get(0, kNone))));
    } else if (name == "index") {
      ArgBinder a(fn.c_str(), args, {"value"});
      auto it = std::find(l.items.begin(), l.items.end(), a.get(0, kNone));
      if (it == l.items.end()) eval_error(fmt::format("{} is not in list", a.get(0, kNone).repr()));
      result = Value(static_cast<int64_t>(it - l.items.begin()));
    } else if (name == "copy" && !l.is_tuple) {
      ArgBinder a(fn.c_str(), args, {});
      result = Value::list(l.items);
    } else if (!l.is_tuple && (name == "append" || name == "clear" || name == "extend" || name == "insert" ||
                               name == "pop" || name == "remove" || name == "reverse" || name == "sort")) {
      return unsafe();
    } else {
      return false;
    }
    return true;
  }
  return false;
}

// ---------------------------------------------------------------- filters
namespace {

// jinja2 make_attrgetter: "a.b.0" looks up a, then b, then item 0.
Value lookup_path(const Value& item, const Value& attribute) {
  if (attribute.is_int()) return get_item(item, attribute);
  Value v = item;
  const std::string path = attribute.str();
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                               [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    v = digits ? get_item(v, Value(static_cast<int64_t>(std::stoll(part)))) : get_item(v, Value(part));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return v;
}

Value ignore_case(const Value& v, bool case_sensitive) {
  return (!case_sensitive && v.is_string()) ? Value(str_lower(v.as_string())) : v;
}

CallArgs rest_args(const CallArgs& args, size_t skip) {
  CallArgs out;
  for (size_t i = skip; i < args.positional.size(); ++i) out.positional.push_back(args.positional[i]);
  out.keyword = args.keyword;
  return out;
}

std::vector<Value> select_or_reject(Environment& env, const Value& seq, CallArgs& args, bool select, bool lookup_attr,
                                    const char* fname) {
  size_t off = 0;
  Value attr;
  if (lookup_attr) {
    if (args.positional.empty()) eval_error(fmt::format("{}() missing required argument 'attr'", fname));
    attr = args.positional[0];
    off = 1;
  }
  std::string test;
  if (args.positional.size() > off) test = require_str(args.positional[off++], "test name");
  CallArgs test_args = rest_args(args, off);
  std::vector<Value> out;
  for (auto& item : py_iterate(seq)) {
    Value x = lookup_attr ? lookup_path(item, attr) : item;
    CallArgs a = test_args;
    bool ok = test.empty() ? x.truthy() : apply_test(env, test, x, a);
    if (ok == select) out.push_back(item);
  }
  return out;
}

Value min_max(const Value& value, CallArgs& args, bool want_max, const char* fname) {
  ArgBinder a(fname, args, {"case_sensitive", "attribute"});
  bool cs = a.get(0, kFalse).truthy();
  const Value& attr = a.get(1, kNone);
  auto items = py_iterate(value);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  auto key = [&](const Value& v) { return ignore_case(attr.is_none() ? v : lookup_path(v, attr), cs); };
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key(items[i]);
    if (want_max ? py_less(best_key, k) : py_less(k, best_key)) best = i, best_key = k;
  }
  return items[best];
}

std::string do_indent(const std::string& s_in, const Value& width, bool first, bool blank) {
  std::string indention =
      width.is_string() ? width.as_string()
                        : std::string(static_cast<size_t>(std::max<int64_t>(0, require_int(width, "width"))), ' ');
  std::string s = s_in + "\n";
  std::vector<Value> lines = str_splitlines(s, false);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + indention;
      rv += lines[i].as_string();
    }
  } else {
    if (!lines.empty()) rv = lines[0].as_string();
    for (size_t i = 1; i < lines.size(); ++i) {
      const std::string& l = lines[i].as_string();
      rv += "\n" + (l.empty() ? l : indention + l);
    }
  }
  if (first) rv = indention + rv;
  return rv;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

double py_round(double x, int64_t ndigits) {
  double scale = std::pow(10.0, static_cast<double>(ndigits));
  double y = x * scale;
  if (!std::isfinite(y)) return x;
  double r = std::nearbyint(y);  // round half to even under the default rounding mode, like Python's round()
  return r / scale;
}

using FilterFn = Value (*)(Environment&, const Value&, CallArgs&);

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> table = {
      {"abs",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("abs", args, {});
         if (v.is_int() || v.is_bool()) {
           int64_t x = v.is_bool() ? v.as_bool() : v.as_int();
           if (x == std::numeric_limits<int64_t>::min()) eval_error("integer overflow");
           return Value(x < 0 ? -x : x);
         }
         if (v.is_float()) return Value(std::fabs(v.as_float()));
         require_defined(v);
         eval_error(fmt::format("bad operand type for abs(): '{}'", v.type_name()));
       }},
      {"attr",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("attr", args, {"name"});
         return get_attr(v, require_str(a.get(0, kNone), "attribute name"));
       }},
      {"batch",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("batch", args, {"linecount", "fill_with"});
         int64_t n = require_int(a.get(0, kNone), "linecount");
         if (n <= 0) eval_error("batch() linecount must be positive");
         std::vector<Value> out, tmp;
         for (auto& item : py_iterate(v)) {
           if (static_cast<int64_t>(tmp.size()) == n) out.push_back(Value::list(std::move(tmp))), tmp.clear();
           tmp.push_back(item);
         }
         if (!tmp.empty()) {
           if (a.has(1))
             while (static_cast<int64_t>(tmp.size()) < n) tmp.push_back(a.get(1, kNone));
           out.push_back(Value::list(std::move(tmp)));
         }
         return Value::list(std::move(out));
       }},
      {"capitalize",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("capitalize", args, {});
         return Value(str_capitalize(v.str()));
       }},
      {"center",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("center", args, {"width"});
         Value eighty(int64_t{80});
         return Value(pad(v.str(), require_int(a.get(0, eighty), "width"), " ", 0));
       }},
      {"default",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("default", args, {"default_value", "boolean"});
         if (v.is_undefined() || (a.get(1, kFalse).truthy() && !v.truthy())) return a.get(0, kEmpty);
         return v;
       }},
      {"dictsort",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("dictsort", args, {"case_sensitive", "by", "reverse"});
         bool cs = a.get(0, kFalse).truthy();
         Value key_str("key");
         const std::string& by = require_str(a.get(1, key_str), "by");
         if (by != "key" && by != "value") eval_error("You can only sort by either \"key\" or \"value\"");
         size_t pos = by == "key" ? 0 : 1;
         if (!v.is_dict()) eval_error("dictsort() requires a mapping");
         std::vector<Value> items;
         for (auto& [k, x] : v.as_dict().items) items.push_back(Value::list({k, x}, true));
         bool rev = a.get(2, kFalse).truthy();
         std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
           Value kx = ignore_case(x.as_list().items[pos], cs), ky = ignore_case(y.as_list().items[pos], cs);
           return rev ? py_less(ky, kx) : py_less(kx, ky);
         });
         return Value::list(std::move(items));
       }},
      {"escape",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("escape", args, {});
         return Value(html_escape(v.str()));
       }},
      {"first",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("first", args, {});
         auto items = py_iterate(v);
         if (items.empty()) return Value::undefined("No first item, sequence was empty.");
         return items.front();
       }},
      {"float",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("float", args, {"default"});
         Value zero(0.0);
         if (v.is_number()) return Value(v.to_double());
         if (v.is_string())
           if (auto d = parse_float(v.as_string())) return Value(*d);
         return a.get(0, zero);
       }},
      {"format",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         if (!args.positional.empty() && !args.keyword.empty()) {
           eval_error("can't handle positional and keyword arguments at the same time");
         }
         if (!args.keyword.empty()) {
           std::vector<std::pair<Value, Value>> kw;
           for (auto& [k, x] : args.keyword) kw.emplace_back(Value(k), x);
           return Value(py_percent_format(v.str(), Value::dict(std::move(kw))));
         }
         return Value(py_percent_format(v.str(), Value::list(args.positional, true)));
       }},
      {"indent",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("indent", args, {"width", "first", "blank"});
         Value four(int64_t{4});
         return Value(do_indent(v.str(), a.get(0, four), a.get(1, kFalse).truthy(), a.get(2, kFalse).truthy()));
       }},
      {"int",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("int", args, {"default", "base"});
         Value zero(int64_t{0}), ten(int64_t{10});
         if (v.is_int() || v.is_bool()) return Value(v.is_bool() ? int64_t{v.as_bool()} : v.as_int());
         if (v.is_float()) {
           if (!std::isfinite(v.as_float())) return a.get(0, zero);
           return Value(static_cast<int64_t>(v.as_float()));
         }
         if (v.is_string()) {
           if (auto i = parse_int(v.as_string(), static_cast<int>(require_int(a.get(1, ten), "base"))))
             return Value(*i);
           if (auto d = parse_float(v.as_string()); d && std::isfinite(*d)) return Value(static_cast<int64_t>(*d));
         }
         return a.get(0, zero);
       }},
      {"items",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("items", args, {});
         if (v.is_undefined()) return Value::list({});
         if (!v.is_dict()) eval_error("Can only get item pairs from a mapping.");
         std::vector<Value> out;
         for (auto& [k, x] : v.as_dict().items) out.push_back(Value::list({k, x}, true));
         return Value::list(std::move(out));
       }},
      {"join",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("join", args, {"d", "attribute"});
         std::string d = a.get(0, kEmpty).str();
         const Value& attr = a.get(1, kNone);
         std::string out;
         bool first = true;
         for (auto& item : py_iterate(v)) {
           if (!first) out += d;
           first = false;
           out += (attr.is_none() ? item : lookup_path(item, attr)).str();
         }
         return Value(std::move(out));
       }},
      {"last",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("last", args, {});
         auto items = py_iterate(v);
         if (items.empty()) return Value::undefined("No last item, sequence was empty.");
         return items.back();
       }},
      {"length",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("length", args, {});
         return Value(py_len(v));
       }},
      {"list",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("list", args, {});
         return Value::list(py_iterate(v));
       }},
      {"lower",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("lower", args, {});
         return Value(str_lower(v.str()));
       }},
      {"map",
       [](Environment& env, const Value& v, CallArgs& args) -> Value {
         std::vector<Value> out;
         if (args.positional.empty()) {
           Value attr, dflt = kNone;
           bool has_attr = false;
           for (auto& [k, x] : args.keyword) {
             if (k == "attribute")
               attr = x, has_attr = true;
             else if (k == "default")
               dflt = x;
             else
               eval_error(fmt::format("Unexpected keyword argument '{}'", k));
           }
           if (!has_attr) eval_error("map requires a filter argument");
           for (auto& item : py_iterate(v)) {
             Value x = lookup_path(item, attr);
             out.push_back(x.is_undefined() && !dflt.is_none() ? dflt : x);
           }
           return Value::list(std::move(out));
         }
         std::string name = require_str(args.positional[0], "filter name");
         CallArgs rest = rest_args(args, 1);
         for (auto& item : py_iterate(v)) {
           CallArgs a = rest;
           out.push_back(apply_filter(env, name, item, a));
         }
         return Value::list(std::move(out));
       }},
      {"max", [](Environment&, const Value& v, CallArgs& args) { return min_max(v, args, true, "max"); }},
      {"min", [](Environment&, const Value& v, CallArgs& args) { return min_max(v, args, false, "min"); }},
      {"reject", [](Environment& env, const Value& v,
                    CallArgs& args) { return Value::list(select_or_reject(env, v, args, false, false, "reject")); }},
      {"rejectattr",
       [](Environment& env, const Value& v, CallArgs& args) {
         return Value::list(select_or_reject(env, v, args, false, true, "rejectattr"));
       }},
      {"replace",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("replace", args, {"old", "new", "count"});
         Value minus_one(int64_t{-1});
         const Value& count = a.get(2, kNone);
         return Value(str_replace(v.str(), a.get(0, kEmpty).str(), a.get(1, kEmpty).str(),
                                  count.is_none() ? -1 : require_int(count, "count")));
       }},
      {"reverse",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("reverse", args, {});
         if (v.is_string()) {
           U u = to_u32(v.as_string());
           std::reverse(u.begin(), u.end());
           return Value(to_utf8(u));
         }
         auto items = py_iterate(v);
         std::reverse(items.begin(), items.end());
         return Value::list(std::move(items));
       }},
      {"round",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("round", args, {"precision", "method"});
         Value zero(int64_t{0}), common("common");
         int64_t p = require_int(a.get(0, zero), "precision");
         const std::string& method = require_str(a.get(1, common), "method");
         if (method != "common" && method != "ceil" && method != "floor") {
           eval_error("method must be common, ceil or floor");
         }
         if (!v.is_number()) eval_error(fmt::format("type {} doesn't define __round__ method", v.type_name()));
         if (method == "common") {
           if (!v.is_float()) return v.is_bool() ? Value(int64_t{v.as_bool()}) : v;
           return Value(py_round(v.as_float(), p));
         }
         double scale = std::pow(10.0, static_cast<double>(p));
         double x = v.to_double() * scale;
         return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
       }},
      {"safe",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("safe", args, {});
         return Value(v.str());
       }},
      {"select", [](Environment& env, const Value& v,
                    CallArgs& args) { return Value::list(select_or_reject(env, v, args, true, false, "select")); }},
      {"selectattr",
       [](Environment& env, const Value& v, CallArgs& args) {
         return Value::list(select_or_reject(env, v, args, true, true, "selectattr"));
       }},
      {"sort",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("sort", args, {"reverse", "case_sensitive", "attribute"});
         bool rev = a.get(0, kFalse).truthy();
         bool cs = a.get(1, kFalse).truthy();
         const Value& attr = a.get(2, kNone);
         auto items = py_iterate(v);
         std::vector<std::pair<Value, Value>> keyed;
         for (auto& item : items)
           keyed.emplace_back(ignore_case(attr.is_none() ? item : lookup_path(item, attr), cs), item);
         std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
           return rev ? py_less(y.first, x.first) : py_less(x.first, y.first);
         });
         std::vector<Value> out;
         for (auto& [k, item] : keyed) out.push_back(item);
         return Value::list(std::move(out));
       }},
      {"string",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("string", args, {});
         return Value(v.str());
       }},
      {"sum",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("sum", args, {"attribute", "start"});
         Value zero(int64_t{0});
         const Value& attr = a.get(0, kNone);
         Value total = a.get(1, zero);
         for (auto& item : py_iterate(v)) total = py_add(total, attr.is_none() ? item : lookup_path(item, attr));
         return total;
       }},
      {"title",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("title", args, {});
         // jinja2 do_title: split at runs of [-\s({[<] and capitalise each piece
         U u = to_u32(v.str());
         auto sep = [](char32_t c) {
           return py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
         };
         bool start = true;
         for (auto& c : u) {
           if (sep(c)) {
             start = true;
             continue;
           }
           c = start ? upper_cp(c) : lower_cp(c);
           start = false;
         }
         return Value(to_utf8(u));
       }},
      {"tojson",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
         std::optional<std::string> indent;
         const Value& ind = a.get(1, kNone);
         if (ind.is_string())
           indent = ind.as_string();
         else if (!ind.is_none())
           indent = std::string(static_cast<size_t>(std::max<int64_t>(0, require_int(ind, "indent"))), ' ');
         std::string item_sep = indent ? "," : ", ", key_sep = ": ";
         const Value& seps = a.get(2, kNone);
         if (!seps.is_none()) {
           if (!seps.is_list() || seps.as_list().items.size() != 2)
             eval_error("tojson separators must be a pair of strings");
           item_sep = require_str(seps.as_list().items[0], "item separator");
           key_sep = require_str(seps.as_list().items[1], "key separator");
         }
         try {
           return Value(v.to_json(a.get(0, kFalse).truthy(), indent, item_sep, key_sep, a.get(3, kFalse).truthy()));
         } catch (const Error& e) {
           eval_error(e.what());
         }
       }},
      {"trim",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("trim", args, {"chars"});
         return Value(str_strip(v.str(), a.get(0, kNone), true, true));
       }},
      {"unique",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("unique", args, {"case_sensitive", "attribute"});
         bool cs = a.get(0, kFalse).truthy();
         const Value& attr = a.get(1, kNone);
         std::vector<Value> seen, out;
         for (auto& item : py_iterate(v)) {
           Value k = ignore_case(attr.is_none() ? item : lookup_path(item, attr), cs);
           if (std::find(seen.begin(), seen.end(), k) != seen.end()) continue;
           seen.push_back(k);
           out.push_back(item);
         }
         return Value::list(std::move(out));
       }},
      {"upper",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("upper", args, {});
         return Value(str_upper(v.str()));
       }},
      {"wordcount",
       [](Environment&, const Value& v, CallArgs& args) -> Value {
         ArgBinder a("wordcount", args, {});
         int64_t n = 0;
         bool in_word = false;
         for (char32_t c : to_u32(v.str())) {
           bool w = is_alpha(c) || is_numeric(c) || c == '_';
           if (w && !in_word) ++n;
           in_word = w;
         }
         return Value(n);
       }},
  };
  return table;
}

const std::map<std::string, std::string>& filter_aliases() {
  static const std::map<std::string, std::string> a = {{"count", "length"}, {"d", "default"}, {"e", "escape"}};
  return a;
}

const std::string& resolve_filter(const std::string& name) {
  auto it = filter_aliases().find(name);
  return it == filter_aliases().end() ? name : it->second;
}

// ---------------------------------------------------------------- tests
bool same_object(const Value& a, const Value& b) {
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Value::Type::List:
      return &a.as_list() == &b.as_list();
    case Value::Type::Dict:
      return &a.as_dict() == &b.as_dict();
    case Value::Type::Function:
      return &a.as_function() == &b.as_function();
    default:
      return a == b;
  }
}

using TestFn = bool (*)(Environment&, const Value&, CallArgs&);

const Value& one_arg(CallArgs& args, const char* test) {
  ArgBinder a(test, args, {"other"});
  if (!a.has(0)) eval_error(fmt::format("test '{}' requires an argument", test));
  return a.get(0, kNone);
}

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> table = {
      {"boolean", [](Environment&, const Value& v, CallArgs&) { return v.is_bool(); }},
      {"callable", [](Environment&, const Value& v, CallArgs&) { return v.is_function() || v.is_undefined(); }},
      {"defined", [](Environment&, const Value& v, CallArgs&) { return !v.is_undefined(); }},
      {"divisibleby",
       [](Environment&, const Value& v, CallArgs& args) {
         const Value& n = one_arg(args, "divisibleby");
         Value r = py_mod(v, n);
         return r == Value(int64_t{0});
       }},
      {"eq", [](Environment&, const Value& v, CallArgs& args) { return v == one_arg(args, "eq"); }},
      {"escaped", [](Environment&, const Value&, CallArgs&) { return false; }},
      {"even",
       [](Environment&, const Value& v, CallArgs&) { return py_mod(v, Value(int64_t{2})) == Value(int64_t{0}); }},
      {"false", [](Environment&, const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); }},
      {"filter", [](Environment&, const Value& v,
                    CallArgs&) { return v.is_string() && filters().count(resolve_filter(v.as_string())) > 0; }},
      {"float", [](Environment&, const Value& v, CallArgs&) { return v.is_float(); }},
      {"ge", [](Environment&, const Value& v, CallArgs& args) { return !py_less(v, one_arg(args, "ge")); }},
      {"gt", [](Environment&, const Value& v, CallArgs& args) { return py_less(one_arg(args, "gt"), v); }},
      {"in", [](Environment&, const Value& v, CallArgs& args) { return py_contains(one_arg(args, "in"), v); }},
      {"integer", [](Environment&, const Value& v, CallArgs&) { return v.is_int(); }},
      {"iterable", [](Environment&, const Value& v,
                      CallArgs&) { return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict(); }},
      {"le", [](Environment&, const Value& v, CallArgs& args) { return !py_less(one_arg(args, "le"), v); }},
      {"lower", [](Environment&, const Value& v, CallArgs&) { return cased_all(v.str(), UTF8PROC_CATEGORY_LL); }},
      {"lt", [](Environment&, const Value& v, CallArgs& args) { return py_less(v, one_arg(args, "lt")); }},
      {"mapping", [](Environment&, const Value& v, CallArgs&) { return v.is_dict(); }},
      {"ne", [](Environment&, const Value& v, CallArgs& args) { return !(v == one_arg(args, "ne")); }},
      {"none", [](Environment&, const Value& v, CallArgs&) { return v.is_none(); }},
      {"number", [](Environment&, const Value& v, CallArgs&) { return v.is_number(); }},
      {"odd",
       [](Environment&, const Value& v, CallArgs&) { return py_mod(v, Value(int64_t{2})) == Value(int64_t{1}); }},
      {"sameas", [](Environment&, const Value& v, CallArgs& args) { return same_object(v, one_arg(args, "sameas")); }},
      {"sequence", [](Environment&, const Value& v,
                      CallArgs&) { return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict(); }},
      {"string", [](Environment&, const Value& v, CallArgs&) { return v.is_string(); }},
      {"test",
       [](Environment&, const Value& v, CallArgs&) { return v.is_string() && tests().count(v.as_string()) > 0; }},
      {"true", [](Environment&, const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); }},
      {"undefined", [](Environment&, const Value& v, CallArgs&) { return v.is_undefined(); }},
      {"upper", [](Environment&, const Value& v, CallArgs&) { return cased_all(v.str(), UTF8PROC_CATEGORY_LU); }},
  };
  return table;
}

const std::string& resolve_test(const std::string& name) {
  static const std::map<std::string, std::string> a = {{"==", "eq"}, {"equalto", "eq"},     {"!=", "ne"},
                                                       {"<", "lt"},  {"lessthan", "lt"},    {"<=", "le"},
                                                       {">", "gt"},  {"greaterthan", "gt"}, {">=", "ge"}};
  auto it = a.find(name);
  return it == a.end() ? name : it->second;
}

}  // namespace

Value apply_filter(Environment& env, const std::string& name, const Value& input, CallArgs& args) {
  auto it = filters().find(resolve_filter(name));
  if (it == filters().end()) eval_error(fmt::format("No filter named '{}'.", name));
  return it->second(env, input, args);
}

bool apply_test(Environment& env, const std::string& name, const Value& input, CallArgs& args) {
  auto it = tests().find(resolve_test(name));
  if (it == tests().end()) eval_error(fmt::format("No test named '{}'.", name));
  return it->second(env, input, args);
}

// ---------------------------------------------------------------- globals
std::vector<std::pair<std::string, Value>> builtin_globals() {
  std::vector<std::pair<std::string, Value>> g;
  g.emplace_back("range", Value::function("range", [](CallArgs& args) {
                   if (!args.keyword.empty()) eval_error("range() takes no keyword arguments");
                   auto& p = args.positional;
                   if (p.empty() || p.size() > 3)
                     eval_error(fmt::format("range expected 1 to 3 arguments, got {}", p.size()));
                   int64_t start = 0, stop, step = 1;
                   if (p.size() == 1) {
                     stop = require_int(p[0], "range() argument");
                   } else {
                     start = require_int(p[0], "range() argument");
                     stop = require_int(p[1], "range() argument");
                     if (p.size() == 3) step = require_int(p[2], "range() argument");
                   }
                   if (step == 0) eval_error("range() arg 3 must not be zero");
                   int64_t n = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                                        : (start > stop ? (start - stop - step - 1) / -step : 0);
                   if (n > 100000)
                     eval_error("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
                   std::vector<Value> out;
                   out.reserve(static_cast<size_t>(n));
                   for (int64_t i = 0; i < n; ++i) out.emplace_back(start + i * step);
                   return Value::list(std::move(out));
                 }));
  auto dict_from_args = [](CallArgs& args, const char* fname) {
    std::vector<std::pair<Value, Value>> items;
    if (args.positional.size() > 1) eval_error(fmt::format("{} expected at most 1 positional argument", fname));
    if (!args.positional.empty()) {
      const Value& src = args.positional[0];
      if (src.is_dict() || src.is_namespace()) {
        items = src.as_dict().items;
      } else {
        for (auto& pair : py_iterate(src)) {
          auto kv = py_iterate(pair);
          if (kv.size() != 2)
            eval_error(fmt::format("{} update sequence element has length {}; 2 is required", fname, kv.size()));
          items.emplace_back(kv[0], kv[1]);
        }
      }
    }
    for (auto& [k, v] : args.keyword) items.emplace_back(Value(k), v);
    return items;
  };
  g.emplace_back("dict", Value::function("dict", [dict_from_args](CallArgs& args) {
                   return Value::dict(dict_from_args(args, "dict"));
                 }));
  g.emplace_back("namespace", Value::function("namespace", [dict_from_args](CallArgs& args) {
                   return Value::make_namespace(dict_from_args(args, "namespace"));
                 }));
  g.emplace_back("raise_exception", Value::function("raise_exception", [](CallArgs& args) -> Value {
                   ArgBinder a("raise_exception", args, {"message"});
                   throw EvalError(a.get(0, kEmpty).str(), true);
                 }));
  g.emplace_back("strftime_now", Value::function("strftime_now", [](CallArgs& args) -> Value {
                   ArgBinder a("strftime_now", args, {"format"});
                   const std::string& f = require_str(a.get(0, kNone), "strftime_now() format");
                   std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
                   std::tm tm{};
                   localtime_r(&t, &tm);
                   std::string buf(256 + f.size() * 8, '\0');
                   size_t n = std::strftime(buf.data(), buf.size(), f.c_str(), &tm);
                   buf.resize(n);
                   return Value(buf);
                 }));
  return g;
}

}  // namespace flashnext::chat::jinja::detail
