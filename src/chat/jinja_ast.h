// Internal: tokens and syntax tree of the Jinja2 engine (jinja.h). The node kinds mirror jinja2.nodes.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/jinja.h"

namespace flashnext::chat::jinja::detail {

enum class TokenType {
  Data,           ///< template text outside tags
  VariableBegin,  ///< {{
  VariableEnd,    ///< }}
  BlockBegin,     ///< {%
  BlockEnd,       ///< %}
  Name,
  String,
  Integer,
  Float,
  Operator,  ///< text holds the operator: + - * / // % ** ~ == != < <= > >= = . : | , ; ( ) [ ] { }
  Eof,
};

struct Token {
  TokenType type;
  std::string text;  ///< Data text, name, unescaped string value, number literal or operator
  int line;
};

/// Splits `source` into tokens following the Jinja2 lexer (newline normalisation, whitespace control, comments,
/// raw blocks). Throws TemplateError.
std::vector<Token> tokenize(std::string_view source, const std::string& name, const TemplateOptions& options);

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  Const,     ///< value
  Name,      ///< name
  List,      ///< items
  Tuple,     ///< items
  Dict,      ///< items: key, value, key, value, ...
  Getattr,   ///< a.name
  Getitem,   ///< a[b]
  Slice,     ///< a:b:c (each may be null), only as the b of Getitem
  Call,      ///< a(items..., kwargs..., *dyn_args, **dyn_kwargs)
  Filter,    ///< a|name(items..., kwargs...); a is null inside `{% filter %}` and `{% set x | f %}`
  Test,      ///< a is name(items..., kwargs...)
  Unary,     ///< name ("-", "+", "not") applied to a
  Binary,    ///< a name b, name in + - * / // % ** and or
  Concat,    ///< items joined with ~
  Compare,   ///< items[0] ops[0] items[1] ops[1] items[2] ...
  CondExpr,  ///< b if a else c (c may be null)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value value;
  std::string name;
  ExprPtr a, b, c;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  ExprPtr dyn_args, dyn_kwargs;
  std::vector<std::string> ops;
};

/// Assignment target: a name, `ns.attr`, or a tuple of targets.
struct Target {
  enum class Kind { Name, Attr, Tuple } kind = Kind::Name;
  std::string name;
  std::string attr;
  std::vector<Target> items;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtKind {
  Text,         ///< text
  Output,       ///< {{ expr }} / {% print expr %}
  If,           ///< if expr: body else else_body (elif is a nested If in else_body)
  For,          ///< for target in expr [if filter]: body else else_body
  Set,          ///< target = expr
  SetBlock,     ///< target = rendered body [| filter]
  Macro,        ///< macro text(params = defaults): body
  CallBlock,    ///< call(params) expr: body (the body is `caller`)
  FilterBlock,  ///< filter (chain in expr): body
  With,         ///< with targets = values: body
  Scope,        ///< body rendered in place (transformers' generation tag)
  Break,
  Continue,
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  Target target;
  Body body, else_body;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  ///< one per trailing parameter with a default
  std::vector<Target> with_targets;
  std::vector<ExprPtr> with_values;
  bool uses_varargs = false;  ///< macro body reads `varargs`
  bool uses_kwargs = false;   ///< macro body reads `kwargs`
  bool uses_caller = false;   ///< macro body reads `caller`
};

struct Program {
  std::string name;
  Body body;
};

/// Parses tokens into a program. Throws TemplateError.
Body parse(std::vector<Token> tokens, const std::string& name);

}  // namespace flashnext::chat::jinja::detail
