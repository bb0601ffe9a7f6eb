// A Jinja2 template engine for chat templates: lexer, parser (AST) and evaluator of the Jinja2 subset that Hugging
// Face chat templates use, with Python value semantics.
//
// Behaviour follows Jinja2 3.1 configured the way transformers renders chat templates
// (`ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])`, default
// `Undefined`, no autoescape, `tojson` = `json.dumps(ensure_ascii=False)`, globals `raise_exception`,
// `strftime_now`, `range`, `namespace`, `dict`). Supported:
//  * syntax: `{{ }}`, `{% %}`, `{# #}`, whitespace control `-`/`+`, trim_blocks/lstrip_blocks, `raw`;
//  * statements: if/elif/else, for (tuple targets, `else`, `if` filter, loop.index/index0/revindex/revindex0/
//    first/last/length/previtem/nextitem/cycle), break/continue, set (expression, block, `ns.attr`), macro (defaults,
//    varargs/kwargs, caller), call, filter, with, print, generation (transformers' tracking tag, rendered inline);
//  * expressions: literals (str/int/float/bool/none/list/tuple/dict), attribute and item access, slices, calls with
//    keyword/`*`/`**` arguments, filters, tests, `+ - * / // % ** ~`, comparisons (chained), `in`/`not in`,
//    `and`/`or`/`not`, conditional expressions;
//  * str/dict/list methods, filters and tests listed in jinja_builtins.cpp.
// Template inheritance and includes (`extends`, `block`, `include`, `import`) are not supported: chat templates are
// single files.
//
// Errors: a template that does not parse throws TemplateError at construction; an error while rendering (undefined
// variable called or used in arithmetic, type errors, `raise_exception(msg)`) throws TemplateError from render().
// Both name the template and line.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/error.h"

namespace flashnext::chat::jinja {

/// Error from a template: syntax error, runtime error or `raise_exception`. `what()` is
/// "<template> line <N>: <message>"; `message()` is the bare message (for `raise_exception('x')` exactly "x").
class TemplateError : public Error {
 public:
  TemplateError(std::string message, std::string template_name, int line, bool raised);
  /// The message without the template name and line.
  const std::string& message() const { return message_; }
  /// 1-based line of the template where the error happened (0 when unknown).
  int line() const { return line_; }
  /// True when the template itself raised the error with `raise_exception(message)`.
  bool raised_by_template() const { return raised_; }

 private:
  std::string message_;
  int line_;
  bool raised_;
};

class Value;

/// Arguments of a call: positional then keyword, as written.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

/// A template value with Python semantics (what Jinja2 sees when rendering with Python objects): undefined, None,
/// bool, int (64-bit), float (double), str (UTF-8; lengths, indices and slices count code points), list or tuple,
/// dict (keys keep insertion order), namespace, function. Lists and dicts are shared by reference, like Python
/// objects; only namespaces are mutable from a template.
class Value {
 public:
  struct Undefined {
    std::string message;  ///< what to report when the value is used (e.g. "'x' is undefined")
  };
  struct None {};
  struct ListData {
    std::vector<Value> items;
    bool is_tuple = false;
  };
  struct DictData {
    std::vector<std::pair<Value, Value>> items;
    bool is_namespace = false;
    /// The value stored under `key` (Python equality), or nullptr.
    const Value* find(const Value& key) const;
    /// Inserts or replaces `key`, keeping the position of an existing key.
    void set(Value key, Value value);
  };
  using Function = std::function<Value(CallArgs&)>;
  struct FunctionData {
    std::string name;
    Function fn;
  };
  enum class Type { Undefined, None, Bool, Int, Float, String, List, Dict, Function };

  /// An undefined value carrying the message to report if it is used.
  Value() : v_(Undefined{}) {}
  static Value undefined(std::string message) { return Value(Undefined{std::move(message)}); }
  static Value none() { return Value(None{}); }
  Value(bool b) : v_(b) {}
  Value(int i) : v_(int64_t{i}) {}
  Value(int64_t i) : v_(i) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(std::string_view s) : v_(std::string(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  static Value list(std::vector<Value> items, bool is_tuple = false);
  static Value dict(std::vector<std::pair<Value, Value>> items = {});
  /// A Jinja2 `namespace()` object: attributes readable as `ns.x`, assignable with `{% set ns.x = ... %}`.
  static Value make_namespace(std::vector<std::pair<Value, Value>> items = {});
  static Value function(std::string name, Function fn);
  /// Converts JSON (objects keep key order) to a Value: null -> None, numbers -> int or float.
  static Value from_json(const nlohmann::ordered_json& j);

  Type type() const { return static_cast<Type>(v_.index()); }
  bool is_undefined() const { return type() == Type::Undefined; }
  bool is_none() const { return type() == Type::None; }
  bool is_bool() const { return type() == Type::Bool; }
  bool is_int() const { return type() == Type::Int; }
  bool is_float() const { return type() == Type::Float; }
  /// int, float or bool (Python numbers.Number).
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return type() == Type::String; }
  bool is_list() const { return type() == Type::List; }
  bool is_dict() const { return type() == Type::Dict && !std::get<std::shared_ptr<DictData>>(v_)->is_namespace; }
  bool is_namespace() const { return type() == Type::Dict && std::get<std::shared_ptr<DictData>>(v_)->is_namespace; }
  bool is_function() const { return type() == Type::Function; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const ListData& as_list() const { return *std::get<std::shared_ptr<ListData>>(v_); }
  /// Dict or namespace storage (shared: changing it changes every copy of this value).
  DictData& as_dict() const { return *std::get<std::shared_ptr<DictData>>(v_); }
  const FunctionData& as_function() const { return *std::get<std::shared_ptr<FunctionData>>(v_); }
  const std::string& undefined_message() const { return std::get<Undefined>(v_).message; }
  /// The number as a double (int, float or bool).
  double to_double() const;

  /// Python truthiness (undefined and None are false, empty str/list/dict are false).
  bool truthy() const;
  /// Python `str()`: strings as they are, None -> "None", True -> "True", floats like `repr(float)`, containers
  /// like Python's repr; undefined -> "".
  std::string str() const;
  /// Python `repr()`.
  std::string repr() const;
  /// Python type name used in error messages: "str", "int", "dict", "list", "NoneType", "Undefined", ...
  std::string type_name() const;
  /// `json.dumps(value, ensure_ascii=, indent=, separators=(item_sep, key_sep), sort_keys=)`; `indent` is the
  /// string repeated per nesting level (nullopt = None: one line). Throws Error for values that JSON cannot
  /// represent (undefined, functions, namespaces).
  std::string to_json(bool ensure_ascii = false, const std::optional<std::string>& indent = std::nullopt,
                      const std::string& item_sep = ", ", const std::string& key_sep = ": ",
                      bool sort_keys = false) const;

  /// Python `==` (1 == 1.0 == True, list != tuple, dicts compare without order, undefined == undefined).
  friend bool operator==(const Value& a, const Value& b);

 private:
  using Storage = std::variant<Undefined, None, bool, int64_t, double, std::string, std::shared_ptr<ListData>,
                               std::shared_ptr<DictData>, std::shared_ptr<FunctionData>>;
  explicit Value(Storage v) : v_(std::move(v)) {}
  Storage v_;
};

namespace detail {
struct Program;
}

/// Lexer options (Jinja2 Environment settings that change how template text is split).
struct TemplateOptions {
  bool trim_blocks = true;             ///< drop the first newline after a block tag
  bool lstrip_blocks = true;           ///< strip spaces and tabs before a block tag at the start of a line
  bool keep_trailing_newline = false;  ///< keep a single trailing newline of the source
};

/// A parsed template. Parsing happens once, in the constructor; render() can be called any number of times and from
/// several threads at once.
class Template {
 public:
  /// Parses `source`. `name` is used in error messages. Throws TemplateError on a syntax error.
  explicit Template(std::string_view source, std::string name = "<template>", TemplateOptions options = {});
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  /// Renders with `variables` (a dict) as the template context, on top of the globals `range`, `namespace`,
  /// `dict`, `raise_exception` and `strftime_now`. Throws TemplateError.
  std::string render(const Value& variables) const;

  const std::string& name() const;

 private:
  std::unique_ptr<detail::Program> program_;
};

}  // namespace flashnext::chat::jinja
