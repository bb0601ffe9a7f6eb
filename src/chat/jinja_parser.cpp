// Jinja2 parser (see jinja.h): a recursive-descent transcription of jinja2/parser.py, with the same operator
// precedence (condexpr < or < and < not < compare < + - < ~ < * / // % < ** < unary < postfix/filter/test).
#include <fmt/format.h>

#include <charconv>
#include <initializer_list>

#include "chat/jinja_ast.h"

namespace flashnext::chat::jinja::detail {
namespace {

ExprPtr make(ExprKind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

std::string describe(const Token& t) {
  switch (t.type) {
    case TokenType::Data:
      return "template data";
    case TokenType::VariableBegin:
      return "begin of print statement";
    case TokenType::VariableEnd:
      return "end of print statement";
    case TokenType::BlockBegin:
      return "begin of statement block";
    case TokenType::BlockEnd:
      return "end of statement block";
    case TokenType::String:
      return "string";
    case TokenType::Integer:
      return "integer";
    case TokenType::Float:
      return "float";
    case TokenType::Eof:
      return "end of template";
    default:
      return t.text;
  }
}

constexpr int kMaxNesting = 200;  // expression / block nesting; deeper templates are rejected, not overflowed

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& name) : t_(std::move(tokens)), name_(name) {}

  Body parse_template() {
    std::string end;
    Body body = subparse({}, &end);
    if (cur().type != TokenType::Eof) fail(fmt::format("unexpected '{}'", describe(cur())));
    return body;
  }

 private:
  // ---- token stream ----
  const Token& cur() const { return t_[i_]; }
  const Token& look() const { return t_[std::min(i_ + 1, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return t;
  }
  bool is_op(const char* op) const { return cur().type == TokenType::Operator && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == TokenType::Name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  [[noreturn]] void fail(const std::string& msg, int line = -1) const {
    throw TemplateError(msg, name_, line < 0 ? cur().line : line, false);
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(fmt::format("expected token '{}', got '{}'", op, describe(cur())));
  }
  void expect_type(TokenType type, const char* what) {
    if (cur().type != type) fail(fmt::format("expected {}, got '{}'", what, describe(cur())));
    next();
  }
  std::string expect_name() {
    if (cur().type != TokenType::Name) fail(fmt::format("expected name, got '{}'", describe(cur())));
    return next().text;
  }

  // Counts nesting while alive; fails beyond kMaxNesting.
  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxNesting) p.fail(fmt::format("template nesting deeper than {} levels", kMaxNesting));
    }
    ~DepthGuard() { --p.depth_; }
  };

  // ---- statements ----
  // Parses until a block tag whose name is in `end_names` (not consumed; its name is stored in *end) or EOF.
  Body subparse(std::initializer_list<const char*> end_names, std::string* end) {
    DepthGuard guard(*this);
    Body body;
    while (cur().type != TokenType::Eof) {
      const Token& t = cur();
      if (t.type == TokenType::Data) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::Text;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.type == TokenType::VariableBegin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::Output;
        s->line = cur().line;
        s->expr = parse_tuple(false, true, {});
        expect_type(TokenType::VariableEnd, "end of print statement");
        body.push_back(std::move(s));
      } else if (t.type == TokenType::BlockBegin) {
        next();
        for (const char* e : end_names) {
          if (is_name(e)) {
            *end = e;
            return body;
          }
        }
        StmtPtr s = parse_statement();
        expect_type(TokenType::BlockEnd, "end of statement block");
        if (s) body.push_back(std::move(s));
      } else {
        fail(fmt::format("unexpected '{}'", describe(t)));
      }
    }
    if (end_names.size() != 0) {
      std::string names;
      for (const char* e : end_names) names += (names.empty() ? "'" : " or '") + std::string(e) + "'";
      fail(
          fmt::format("Unexpected end of template. Jinja was looking for the following tags: {}. The innermost "
                      "block that needs to be closed is '{}'.",
                      names, block_stack_.empty() ? "" : block_stack_.back()));
    }
    return body;
  }

  // After the statement head: expects `%}`, parses the body up to one of `end_names`; consumes the end tag's
  // name when drop_needle. Returns the name of the end tag found.
  std::string parse_statements(Body& body, std::initializer_list<const char*> end_names, bool drop_needle) {
    skip_op(":");
    expect_type(TokenType::BlockEnd, "end of statement block");
    std::string end;
    body = subparse(end_names, &end);
    if (drop_needle) next();
    return end;
  }

  StmtPtr parse_statement() {
    if (cur().type != TokenType::Name) fail("tag name expected");
    std::string tag = cur().text;
    int line = cur().line;
    block_stack_.push_back(tag);
    StmtPtr s;
    if (tag == "if")
      s = parse_if();
    else if (tag == "for")
      s = parse_for();
    else if (tag == "set")
      s = parse_set();
    else if (tag == "macro")
      s = parse_macro();
    else if (tag == "call")
      s = parse_call_block();
    else if (tag == "filter")
      s = parse_filter_block();
    else if (tag == "with")
      s = parse_with();
    else if (tag == "print") {
      next();
      s = std::make_unique<Stmt>();
      s->kind = StmtKind::Output;
      s->expr = parse_tuple(false, true, {});
    } else if (tag == "break" || tag == "continue") {
      next();
      s = std::make_unique<Stmt>();
      s->kind = tag == "break" ? StmtKind::Break : StmtKind::Continue;
    } else if (tag == "generation") {
      next();
      s = std::make_unique<Stmt>();
      s->kind = StmtKind::Scope;
      parse_statements(s->body, {"endgeneration"}, true);
    } else if (tag == "extends" || tag == "include" || tag == "import" || tag == "from" || tag == "block") {
      fail(fmt::format("the '{}' tag is not supported (chat templates are single files)", tag));
    } else {
      fail(fmt::format("Encountered unknown tag '{}'.", tag));
    }
    s->line = line;
    block_stack_.pop_back();
    return s;
  }

  StmtPtr parse_if() {
    next();  // if / elif
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::If;
    s->line = cur().line;
    s->expr = parse_tuple(false, false, {});
    std::string end = parse_statements(s->body, {"elif", "else", "endif"}, false);
    if (end == "elif") {
      s->else_body.push_back(parse_if());  // consumes through endif
      return s;
    }
    next();  // else / endif
    if (end == "else") parse_statements(s->else_body, {"endif"}, true);
    return s;
  }

  StmtPtr parse_for() {
    next();
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::For;
    s->target = parse_assign_target(false, {"in"});
    if (!skip_name("in")) fail(fmt::format("expected 'in', got '{}'", describe(cur())));
    s->expr = parse_tuple(false, false, {"recursive"});
    if (skip_name("if")) s->filter = parse_expression(true);
    if (is_name("recursive")) fail("recursive for loops are not supported");
    std::string end = parse_statements(s->body, {"endfor", "else"}, false);
    next();
    if (end == "else") parse_statements(s->else_body, {"endfor"}, true);
    return s;
  }

  StmtPtr parse_set() {
    next();
    auto s = std::make_unique<Stmt>();
    s->target = parse_assign_target(true, {});
    if (skip_op("=")) {
      s->kind = StmtKind::Set;
      s->expr = parse_tuple(false, true, {});
      return s;
    }
    s->kind = StmtKind::SetBlock;
    if (is_op("|")) s->filter = parse_filter(nullptr);
    parse_statements(s->body, {"endset"}, true);
    return s;
  }

  void parse_signature(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s.params.empty()) expect_op(",");
      s.params.push_back(expect_name());
      if (skip_op("=")) {
        s.defaults.push_back(parse_expression(true));
      } else if (!s.defaults.empty()) {
        fail("non-default argument follows default argument");
      }
    }
    expect_op(")");
  }

  static void scan_names(const Expr* e, Stmt& m) {
    if (!e) return;
    if (e->kind == ExprKind::Name) {
      m.uses_varargs |= e->name == "varargs";
      m.uses_kwargs |= e->name == "kwargs";
      m.uses_caller |= e->name == "caller";
    }
    scan_names(e->a.get(), m);
    scan_names(e->b.get(), m);
    scan_names(e->c.get(), m);
    scan_names(e->dyn_args.get(), m);
    scan_names(e->dyn_kwargs.get(), m);
    for (auto& x : e->items) scan_names(x.get(), m);
    for (auto& [k, x] : e->kwargs) scan_names(x.get(), m);
  }
  static void scan_names(const Body& body, Stmt& m) {
    for (auto& s : body) {
      scan_names(s->expr.get(), m);
      scan_names(s->filter.get(), m);
      for (auto& d : s->defaults) scan_names(d.get(), m);
      for (auto& v : s->with_values) scan_names(v.get(), m);
      scan_names(s->body, m);
      scan_names(s->else_body, m);
    }
  }

  StmtPtr parse_macro() {
    next();
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::Macro;
    s->text = expect_name();
    parse_signature(*s);
    parse_statements(s->body, {"endmacro"}, true);
    scan_names(s->body, *s);
    for (auto& d : s->defaults) scan_names(d.get(), *s);
    return s;
  }

  StmtPtr parse_call_block() {
    int line = next().line;
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::CallBlock;
    if (is_op("(")) parse_signature(*s);
    s->expr = parse_expression(true);
    if (s->expr->kind != ExprKind::Call) fail("expected call", line);
    parse_statements(s->body, {"endcall"}, true);
    scan_names(s->body, *s);
    return s;
  }

  StmtPtr parse_filter_block() {
    next();
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::FilterBlock;
    s->filter = parse_filter(nullptr, true);
    parse_statements(s->body, {"endfilter"}, true);
    return s;
  }

  StmtPtr parse_with() {
    next();
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::With;
    while (cur().type != TokenType::BlockEnd) {
      if (!s->with_targets.empty()) expect_op(",");
      s->with_targets.push_back(parse_assign_target(false, {}));
      expect_op("=");
      s->with_values.push_back(parse_expression(true));
    }
    parse_statements(s->body, {"endwith"}, true);
    return s;
  }

  Target parse_assign_target(bool with_namespace, std::initializer_list<const char*> extra_end) {
    Target t;
    if (with_namespace && cur().type == TokenType::Name && look().type == TokenType::Operator && look().text == ".") {
      t.kind = Target::Kind::Attr;
      t.name = next().text;
      next();
      t.attr = expect_name();
      return t;
    }
    // parse_tuple(simplified=True): names separated by commas, optionally parenthesised
    std::vector<Target> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      if (skip_op("(")) {
        Target inner = parse_assign_target(false, {});
        expect_op(")");
        items.push_back(std::move(inner));
      } else {
        Target n;
        n.name = expect_name();
        if (n.name == "true" || n.name == "false" || n.name == "none" || n.name == "True" || n.name == "False" ||
            n.name == "None") {
          fail(fmt::format("can't assign to '{}'", n.name));
        }
        items.push_back(std::move(n));
      }
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (items.empty()) fail(fmt::format("expected assignment target, got '{}'", describe(cur())));
    if (!is_tuple) return std::move(items[0]);
    t.kind = Target::Kind::Tuple;
    t.items = std::move(items);
    return t;
  }

  // ---- expressions ----
  bool is_tuple_end(std::initializer_list<const char*> extra_end) const {
    TokenType ty = cur().type;
    if (ty == TokenType::VariableEnd || ty == TokenType::BlockEnd || (ty == TokenType::Operator && cur().text == ")"))
      return true;
    for (const char* e : extra_end)
      if (is_name(e)) return true;
    return false;
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, std::initializer_list<const char*> extra_end,
                      bool explicit_parentheses = false) {
    int line = cur().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      if (simplified)
        args.push_back(parse_primary());
      else
        args.push_back(parse_expression(with_condexpr));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parentheses) fail(fmt::format("Expected an expression, got '{}'", describe(cur())));
    }
    auto e = make(ExprKind::Tuple, line);
    e->items = std::move(args);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    int line = cur().line;
    ExprPtr expr1 = parse_or();
    while (skip_name("if")) {
      auto e = make(ExprKind::CondExpr, line);
      e->a = parse_or();
      e->b = std::move(expr1);
      if (skip_name("else")) e->c = parse_condexpr();
      expr1 = std::move(e);
      line = cur().line;
    }
    return expr1;
  }

  ExprPtr binary(const char* op, ExprPtr l, ExprPtr r, int line) {
    auto e = make(ExprKind::Binary, line);
    e->name = op;
    e->a = std::move(l);
    e->b = std::move(r);
    return e;
  }

  ExprPtr parse_or() {
    int line = cur().line;
    ExprPtr left = parse_and();
    while (skip_name("or")) left = binary("or", std::move(left), parse_and(), line);
    return left;
  }

  ExprPtr parse_and() {
    int line = cur().line;
    ExprPtr left = parse_not();
    while (skip_name("and")) left = binary("and", std::move(left), parse_not(), line);
    return left;
  }

  ExprPtr parse_not() {
    DepthGuard guard(*this);
    if (is_name("not")) {
      int line = next().line;
      auto e = make(ExprKind::Unary, line);
      e->name = "not";
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr expr = parse_math1();
    auto e = make(ExprKind::Compare, line);
    e->items.push_back(std::move(expr));
    while (true) {
      if (cur().type == TokenType::Operator && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                                cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        e->ops.push_back(next().text);
      } else if (skip_name("in")) {
        e->ops.push_back("in");
      } else if (is_name("not") && look().type == TokenType::Name && look().text == "in") {
        next();
        next();
        e->ops.push_back("notin");
      } else {
        break;
      }
      e->items.push_back(parse_math1());
    }
    if (e->ops.empty()) return std::move(e->items[0]);
    return e;
  }

  ExprPtr parse_math1() {
    int line = cur().line;
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = next().text;
      left = binary(op.c_str(), std::move(left), parse_concat(), line);
    }
    return left;
  }

  ExprPtr parse_concat() {
    int line = cur().line;
    ExprPtr first = parse_math2();
    if (!is_op("~")) return first;
    auto e = make(ExprKind::Concat, line);
    e->items.push_back(std::move(first));
    while (skip_op("~")) e->items.push_back(parse_math2());
    return e;
  }

  ExprPtr parse_math2() {
    int line = cur().line;
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = next().text;
      left = binary(op.c_str(), std::move(left), parse_pow(), line);
    }
    return left;
  }

  ExprPtr parse_pow() {
    int line = cur().line;
    ExprPtr left = parse_unary(true);
    while (skip_op("**")) left = binary("**", std::move(left), parse_unary(true), line);
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    int line = cur().line;
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      std::string op = next().text;
      node = make(ExprKind::Unary, line);
      node->name = op;
      node->a = parse_unary(false);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    int line = t.line;
    if (t.type == TokenType::Name) {
      next();
      if (t.text == "true" || t.text == "True") return constant(Value(true), line);
      if (t.text == "false" || t.text == "False") return constant(Value(false), line);
      if (t.text == "none" || t.text == "None") return constant(Value::none(), line);
      auto e = make(ExprKind::Name, line);
      e->name = t.text;
      return e;
    }
    if (t.type == TokenType::String) {
      std::string s = next().text;
      while (cur().type == TokenType::String) s += next().text;  // adjacent literals concatenate
      return constant(Value(std::move(s)), line);
    }
    if (t.type == TokenType::Integer) {
      const std::string& txt = next().text;
      int64_t v = 0;
      int base = 10;
      size_t off = 0;
      if (txt.size() > 2 && txt[0] == '0' && std::isalpha(static_cast<unsigned char>(txt[1]))) {
        char b = static_cast<char>(std::tolower(txt[1]));
        base = b == 'x' ? 16 : b == 'o' ? 8 : 2;
        off = 2;
      }
      auto [p, ec] = std::from_chars(txt.data() + off, txt.data() + txt.size(), v, base);
      if (ec != std::errc()) fail(fmt::format("integer literal {} is out of range", txt), line);
      return constant(Value(v), line);
    }
    if (t.type == TokenType::Float) {
      double d = std::strtod(next().text.c_str(), nullptr);
      return constant(Value(d), line);
    }
    if (is_op("(")) {
      next();
      ExprPtr e = parse_tuple(false, true, {}, true);
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      next();
      auto e = make(ExprKind::List, line);
      while (!is_op("]")) {
        if (!e->items.empty()) expect_op(",");
        if (is_op("]")) break;
        e->items.push_back(parse_expression(true));
      }
      expect_op("]");
      return e;
    }
    if (is_op("{")) {
      next();
      auto e = make(ExprKind::Dict, line);
      while (!is_op("}")) {
        if (!e->items.empty()) expect_op(",");
        if (is_op("}")) break;
        e->items.push_back(parse_expression(true));
        expect_op(":");
        e->items.push_back(parse_expression(true));
      }
      expect_op("}");
      return e;
    }
    fail(fmt::format("unexpected '{}'", describe(t)));
  }

  ExprPtr constant(Value v, int line) {
    auto e = make(ExprKind::Const, line);
    e->value = std::move(v);
    return e;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("["))
        node = parse_subscript(std::move(node));
      else if (is_op("("))
        node = parse_call(std::move(node));
      else
        break;
    }
    return node;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|"))
        node = parse_filter(std::move(node));
      else if (is_name("is"))
        node = parse_test(std::move(node));
      else if (is_op("("))
        node = parse_call(std::move(node));
      else
        break;
    }
    return node;
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token& t = next();
    int line = t.line;
    if (t.text == ".") {
      const Token& attr = next();
      if (attr.type == TokenType::Name) {
        auto e = make(ExprKind::Getattr, line);
        e->a = std::move(node);
        e->name = attr.text;
        return e;
      }
      if (attr.type != TokenType::Integer) fail("expected name or number", line);
      auto e = make(ExprKind::Getitem, line);
      e->a = std::move(node);
      e->b = constant(Value(static_cast<int64_t>(std::stoll(attr.text))), line);
      return e;
    }
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    auto e = make(ExprKind::Getitem, line);
    e->a = std::move(node);
    if (args.size() == 1) {
      e->b = std::move(args[0]);
    } else {
      e->b = make(ExprKind::Tuple, line);
      e->b->items = std::move(args);
    }
    return e;
  }

  ExprPtr parse_subscribed() {
    int line = cur().line;
    ExprPtr start;
    if (!is_op(":")) {
      ExprPtr node = parse_expression(true);
      if (!is_op(":")) return node;
      start = std::move(node);
    }
    next();  // ':'
    auto e = make(ExprKind::Slice, line);
    e->a = std::move(start);
    if (!is_op(":") && !is_op("]") && !is_op(",")) e->b = parse_expression(true);
    if (skip_op(":")) {
      if (!is_op("]") && !is_op(",")) e->c = parse_expression(true);
    }
    return e;
  }

  void parse_call_args(Expr& e) {
    int line = cur().line;
    expect_op("(");
    bool require_comma = false;
    auto ensure = [&](bool ok) {
      if (!ok) fail("invalid syntax for function call expression", line);
    };
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (skip_op("*")) {
        ensure(!e.dyn_args && !e.dyn_kwargs);
        e.dyn_args = parse_expression(true);
      } else if (skip_op("**")) {
        ensure(!e.dyn_kwargs);
        e.dyn_kwargs = parse_expression(true);
      } else if (cur().type == TokenType::Name && look().type == TokenType::Operator && look().text == "=") {
        ensure(!e.dyn_kwargs);
        std::string key = next().text;
        next();
        e.kwargs.emplace_back(key, parse_expression(true));
      } else {
        ensure(!e.dyn_args && !e.dyn_kwargs && e.kwargs.empty());
        e.items.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = make(ExprKind::Call, cur().line);
    e->a = std::move(node);
    parse_call_args(*e);
    return e;
  }

  ExprPtr parse_filter(ExprPtr node, bool start_inline = false) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      auto e = make(ExprKind::Filter, cur().line);
      e->name = expect_name();
      while (skip_op(".")) (e->name += '.') += expect_name();
      if (is_op("(")) parse_call_args(*e);
      e->a = std::move(node);
      node = std::move(e);
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    int line = next().line;  // 'is'
    bool negated = skip_name("not");
    auto e = make(ExprKind::Test, line);
    e->name = expect_name();
    while (skip_op(".")) (e->name += '.') += expect_name();
    e->a = std::move(node);
    const Token& t = cur();
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((t.type == TokenType::Name || t.type == TokenType::String || t.type == TokenType::Integer ||
                t.type == TokenType::Float || is_op("[") || is_op("{")) &&
               !(is_name("else") || is_name("or") || is_name("and"))) {
      if (is_name("is")) fail("You cannot chain multiple tests with is");
      e->items.push_back(parse_postfix(parse_primary()));
    }
    if (!negated) return e;
    auto n = make(ExprKind::Unary, line);
    n->name = "not";
    n->a = std::move(e);
    return n;
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  const std::string& name_;
  std::vector<std::string> block_stack_;
  int depth_ = 0;
};

}  // namespace

Body parse(std::vector<Token> tokens, const std::string& name) {
  return Parser(std::move(tokens), name).parse_template();
}

}  // namespace flashnext::chat::jinja::detail
