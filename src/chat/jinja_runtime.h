// Internal: Python value operations and the built-in filters, tests, methods and globals of the Jinja2 engine.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "chat/jinja.h"

namespace flashnext::chat::jinja::detail {

/// An error raised while evaluating; the renderer adds the template name and line. `raised` marks
/// `raise_exception(msg)`.
struct EvalError : std::runtime_error {
  explicit EvalError(const std::string& msg, bool raised = false) : std::runtime_error(msg), raised(raised) {}
  bool raised;
};

[[noreturn]] void eval_error(const std::string& msg);

// ---- UTF-8 / Python string helpers ----
std::u32string decode_utf8(std::string_view s);  ///< invalid bytes decode to U+FFFD
std::string encode_utf8(std::u32string_view s);
size_t utf8_length(std::string_view s);  ///< number of code points
bool py_isspace(char32_t c);             ///< Python str.isspace() for one code point
std::string format_float(double d);      ///< Python repr(float)
std::string py_repr_string(const std::string& s);

// ---- Python operators ----
/// Raises the undefined value's error ("'x' is undefined") if `v` is undefined.
void require_defined(const Value& v);
Value py_add(const Value& a, const Value& b);
Value py_sub(const Value& a, const Value& b);
Value py_mul(const Value& a, const Value& b);
Value py_div(const Value& a, const Value& b);
Value py_floordiv(const Value& a, const Value& b);
Value py_mod(const Value& a, const Value& b);
Value py_pow(const Value& a, const Value& b);
Value py_neg(const Value& a);
/// Python `<`: numbers, strings (code point order), lists/tuples (lexicographic); TypeError otherwise.
bool py_less(const Value& a, const Value& b);
/// Python `a in b` (b a dict: key, str: substring, list: element, undefined: false).
bool py_contains(const Value& container, const Value& item);
/// Python `iter()` materialised: list items, dict keys, string code points; undefined -> empty.
std::vector<Value> py_iterate(const Value& v);
/// Python `len()`; undefined -> 0.
int64_t py_len(const Value& v);
/// `'%s' % args` (printf-style formatting: %s %r %d %i %f %e %g %x %o %c %% with flags/width/precision).
std::string py_percent_format(const std::string& fmt, const Value& args);

// ---- attribute and item access (jinja2 sandbox getattr/getitem) ----
/// `obj.name`: an attribute/method of str/dict/list, else the item `name`; undefined if missing.
Value get_attr(const Value& obj, const std::string& name);
/// `obj[key]`: item or slice, else the attribute `key` when key is a string; undefined if missing.
Value get_item(const Value& obj, const Value& key);
/// `obj[start:stop:step]` for str, list and tuple (None for an absent bound).
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
/// Calls the method `name` of a str/dict/list value; returns false if there is no such method.
bool call_method(const Value& obj, const std::string& name, CallArgs& args, Value& result);

// ---- built-ins ----
class Environment {
 public:
  virtual ~Environment() = default;
  /// Calls a callable value (function or macro).
  virtual Value call(const Value& callee, CallArgs& args) = 0;
};

/// Applies filter `name`; throws EvalError "No filter named 'x'." for unknown names.
Value apply_filter(Environment& env, const std::string& name, const Value& input, CallArgs& args);
/// Applies test `name`; throws EvalError "No test named 'x'." for unknown names.
bool apply_test(Environment& env, const std::string& name, const Value& input, CallArgs& args);
/// The globals every render starts with: range, dict, namespace, raise_exception, strftime_now.
std::vector<std::pair<std::string, Value>> builtin_globals();

/// Binds call arguments to parameter names the Python way (positional then keyword); throws EvalError for extra
/// or unknown arguments.
class ArgBinder {
 public:
  ArgBinder(const char* function, CallArgs& args, std::initializer_list<const char*> names);
  /// The argument bound to parameter `i`, or `fallback` if it was not passed.
  const Value& get(size_t i, const Value& fallback) const;
  bool has(size_t i) const { return bound_[i] != nullptr; }

 private:
  std::vector<const Value*> bound_;
};

}  // namespace flashnext::chat::jinja::detail
