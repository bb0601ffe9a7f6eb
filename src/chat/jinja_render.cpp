// Jinja2 evaluator (see jinja.h): walks the syntax tree with Jinja2's scoping rules. A `for` iteration, a macro
// call and a `with` block each get a fresh scope whose assignments vanish when it ends (hence `namespace()` for
// values that must survive a loop); `if` bodies share the enclosing scope.
#include <fmt/format.h>

#include "chat/jinja_ast.h"
#include "chat/jinja_runtime.h"

namespace flashnext::chat::jinja {
namespace detail {
namespace {

struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* lookup(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
      for (auto& [k, v] : s->vars)
        if (k == name) return &v;
    }
    return nullptr;
  }
  void set(const std::string& name, Value value) {
    for (auto& [k, v] : vars) {
      if (k == name) {
        v = std::move(value);
        return;
      }
    }
    vars.emplace_back(name, std::move(value));
  }
};
using ScopePtr = std::shared_ptr<Scope>;

ScopePtr child(const ScopePtr& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

enum class Flow { Normal, Break, Continue };

constexpr int kMaxCallDepth = 200;

class Renderer final : public Environment {
 public:
  explicit Renderer(const Program& program) : program_(program) {}

  std::string run(const Value& variables) {
    auto globals = std::make_shared<Scope>();
    for (auto& [k, v] : builtin_globals()) globals->set(k, std::move(v));
    if (!variables.is_dict()) eval_error("template variables must be a dict");
    for (auto& [k, v] : variables.as_dict().items) {
      if (!k.is_string()) eval_error("template variable names must be strings");
      globals->set(k.as_string(), v);
    }
    std::string out;
    out_ = &out;
    exec_body(program_.body, child(globals));
    return out;
  }

  int line() const { return line_; }

  Value call(const Value& callee, CallArgs& args) override {
    if (callee.is_function()) return callee.as_function().fn(args);
    require_defined(callee);
    eval_error(fmt::format("'{}' object is not callable", callee.type_name()));
  }

 private:
  // ------------------------------------------------------------ statements
  Flow exec_body(const Body& body, const ScopePtr& scope) {
    for (auto& s : body) {
      Flow f = exec(*s, scope);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  std::string capture(const Body& body, const ScopePtr& scope) {
    std::string buf;
    std::string* saved = out_;
    out_ = &buf;
    exec_body(body, scope);
    out_ = saved;
    return buf;
  }

  Flow exec(const Stmt& s, const ScopePtr& scope) {
    line_ = s.line;
    switch (s.kind) {
      case StmtKind::Text:
        *out_ += s.text;
        break;
      case StmtKind::Output:
        *out_ += eval(*s.expr, scope).str();
        break;
      case StmtKind::If:
        return exec_body(eval(*s.expr, scope).truthy() ? s.body : s.else_body, scope);
      case StmtKind::For:
        exec_for(s, scope);
        break;
      case StmtKind::Set:
        assign(s.target, eval(*s.expr, scope), scope);
        break;
      case StmtKind::SetBlock: {
        Value v(capture(s.body, scope));
        if (s.filter) v = eval_filter_chain(*s.filter, v, scope);
        assign(s.target, std::move(v), scope);
        break;
      }
      case StmtKind::Macro:
        scope->set(s.text, make_macro(s, scope));
        break;
      case StmtKind::CallBlock: {
        Value caller = make_macro(s, scope);
        *out_ += eval_call(*s.expr, scope, &caller).str();
        break;
      }
      case StmtKind::FilterBlock: {
        Value body(capture(s.body, child(scope)));
        *out_ += eval_filter_chain(*s.filter, body, scope).str();
        break;
      }
      case StmtKind::With: {
        std::vector<Value> values;
        for (auto& v : s.with_values) values.push_back(eval(*v, scope));
        ScopePtr inner = child(scope);
        for (size_t i = 0; i < values.size(); ++i) assign(s.with_targets[i], values[i], inner);
        return exec_body(s.body, inner);
      }
      case StmtKind::Scope:
        return exec_body(s.body, scope);
      case StmtKind::Break:
        return Flow::Break;
      case StmtKind::Continue:
        return Flow::Continue;
    }
    return Flow::Normal;
  }

  void assign(const Target& t, Value v, const ScopePtr& scope) {
    switch (t.kind) {
      case Target::Kind::Name:
        scope->set(t.name, std::move(v));
        return;
      case Target::Kind::Attr: {
        const Value* ns = scope->lookup(t.name);
        if (!ns || !ns->is_namespace()) eval_error("cannot assign attribute on non-namespace object");
        ns->as_dict().set(Value(t.attr), std::move(v));
        return;
      }
      case Target::Kind::Tuple: {
        std::vector<Value> items = py_iterate(v);
        if (items.size() != t.items.size()) {
          eval_error(
              items.size() > t.items.size()
                  ? fmt::format("too many values to unpack (expected {})", t.items.size())
                  : fmt::format("not enough values to unpack (expected {}, got {})", t.items.size(), items.size()));
        }
        for (size_t i = 0; i < items.size(); ++i) assign(t.items[i], std::move(items[i]), scope);
        return;
      }
    }
  }

  void exec_for(const Stmt& s, const ScopePtr& scope) {
    Value iterable = eval(*s.expr, scope);
    std::vector<Value> items = py_iterate(iterable);
    if (s.filter) {
      std::vector<Value> kept;
      for (auto& item : items) {
        ScopePtr f = child(scope);
        assign(s.target, item, f);
        if (eval(*s.filter, f).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      exec_body(s.else_body, child(scope));
      return;
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      ScopePtr iter = child(scope);
      std::vector<Value> cycle_args;
      Value loop = Value::dict({
          {Value("index"), Value(i + 1)},
          {Value("index0"), Value(i)},
          {Value("revindex"), Value(n - i)},
          {Value("revindex0"), Value(n - i - 1)},
          {Value("first"), Value(i == 0)},
          {Value("last"), Value(i == n - 1)},
          {Value("length"), Value(n)},
          {Value("depth"), Value(int64_t{1})},
          {Value("depth0"), Value(int64_t{0})},
          {Value("previtem"), i > 0 ? items[i - 1] : Value::undefined("there is no previous item")},
          {Value("nextitem"), i + 1 < n ? items[i + 1] : Value::undefined("there is no next item")},
          {Value("cycle"), Value::function("cycle",
                                           [i](CallArgs& args) -> Value {
                                             if (args.positional.empty()) eval_error("no items for cycling given");
                                             return args.positional[static_cast<size_t>(i) % args.positional.size()];
                                           })},
      });
      iter->set("loop", std::move(loop));
      assign(s.target, items[i], iter);
      if (exec_body(s.body, iter) == Flow::Break) break;
    }
  }

  // A macro (or a call block's `caller`) closes over its defining scope. The scope usually holds the macro itself,
  // so the closure keeps a weak reference and the renderer keeps the scope alive until the render ends.
  Value make_macro(const Stmt& s, const ScopePtr& scope) {
    pinned_.push_back(scope);
    std::weak_ptr<Scope> closure = scope;
    return Value::function(s.kind == StmtKind::CallBlock ? "caller" : s.text,
                           [this, &s, closure](CallArgs& args) { return call_macro(s, closure.lock(), args); });
  }

  Value call_macro(const Stmt& m, const ScopePtr& closure, CallArgs& args) {
    if (depth_ >= kMaxCallDepth) eval_error("maximum recursion depth exceeded in macro call");
    const std::string name = m.kind == StmtKind::CallBlock ? "caller" : m.text;
    ScopePtr scope = child(closure);
    const size_t n = m.params.size();
    std::vector<const Value*> bound(n, nullptr);
    std::vector<Value> varargs;
    std::vector<std::pair<Value, Value>> kwargs;
    for (size_t i = 0; i < args.positional.size(); ++i) {
      if (i < n)
        bound[i] = &args.positional[i];
      else if (m.uses_varargs)
        varargs.push_back(args.positional[i]);
      else
        eval_error(fmt::format("macro '{}' takes not more than {} argument(s)", name, n));
    }
    const Value* caller = nullptr;
    for (auto& [k, v] : args.keyword) {
      size_t i = 0;
      while (i < n && m.params[i] != k) ++i;
      if (i < n) {
        if (bound[i]) eval_error(fmt::format("macro '{}' got multiple values for argument '{}'", name, k));
        bound[i] = &v;
      } else if (k == "caller" && m.uses_caller) {
        caller = &v;
      } else if (m.uses_kwargs) {
        kwargs.emplace_back(Value(k), v);
      } else {
        eval_error(fmt::format("macro '{}' takes no keyword argument '{}'", name, k));
      }
    }
    const size_t first_default = n - m.defaults.size();
    for (size_t i = 0; i < n; ++i) {
      if (bound[i])
        scope->set(m.params[i], *bound[i]);
      else if (i >= first_default)
        scope->set(m.params[i], eval(*m.defaults[i - first_default], scope));
      else
        scope->set(m.params[i], Value::undefined(fmt::format("parameter '{}' was not provided", m.params[i])));
    }
    if (m.uses_varargs) scope->set("varargs", Value::list(std::move(varargs), true));
    if (m.uses_kwargs) scope->set("kwargs", Value::dict(std::move(kwargs)));
    if (m.uses_caller && m.kind == StmtKind::Macro)
      scope->set("caller", caller ? *caller : Value::undefined("No caller defined"));
    ++depth_;
    int saved_line = line_;
    std::string result = capture(m.body, scope);
    line_ = saved_line;
    --depth_;
    return Value(std::move(result));
  }

  // ------------------------------------------------------------ expressions
  CallArgs eval_args(const Expr& e, const ScopePtr& scope) {
    CallArgs args;
    for (auto& a : e.items) args.positional.push_back(eval(*a, scope));
    for (auto& [k, a] : e.kwargs) args.keyword.emplace_back(k, eval(*a, scope));
    if (e.dyn_args) {
      for (auto& v : py_iterate(eval(*e.dyn_args, scope))) args.positional.push_back(v);
    }
    if (e.dyn_kwargs) {
      Value d = eval(*e.dyn_kwargs, scope);
      if (!d.is_dict()) eval_error("argument after ** must be a mapping");
      for (auto& [k, v] : d.as_dict().items) args.keyword.emplace_back(k.str(), v);
    }
    return args;
  }

  Value eval_call(const Expr& e, const ScopePtr& scope, const Value* caller) {
    CallArgs args;
    auto with_args = [&]() {
      args = eval_args(e, scope);
      if (caller) args.keyword.emplace_back("caller", *caller);
    };
    if (e.a->kind == ExprKind::Getattr) {
      Value obj = eval(*e.a->a, scope);
      with_args();
      line_ = e.line;
      Value result;
      if ((obj.is_string() || obj.is_list() || obj.is_dict()) && call_method(obj, e.a->name, args, result))
        return result;
      return call(get_attr(obj, e.a->name), args);
    }
    Value callee = eval(*e.a, scope);
    with_args();
    line_ = e.line;
    return call(callee, args);
  }

  // Applies a filter chain parsed with a null innermost input (`{% filter %}`, `{% set x | f %}`) to `input`.
  Value eval_filter_chain(const Expr& f, const Value& input, const ScopePtr& scope) {
    Value v = f.a ? eval_filter_chain(*f.a, input, scope) : input;
    CallArgs args = eval_args(f, scope);
    line_ = f.line;
    return apply_filter(*this, f.name, v, args);
  }

  Value eval(const Expr& e, const ScopePtr& scope) {
    switch (e.kind) {
      case ExprKind::Const:
        return e.value;
      case ExprKind::Name: {
        const Value* v = scope->lookup(e.name);
        return v ? *v : Value::undefined(fmt::format("'{}' is undefined", e.name));
      }
      case ExprKind::List:
      case ExprKind::Tuple: {
        std::vector<Value> items;
        items.reserve(e.items.size());
        for (auto& x : e.items) items.push_back(eval(*x, scope));
        return Value::list(std::move(items), e.kind == ExprKind::Tuple);
      }
      case ExprKind::Dict: {
        Value d = Value::dict();
        for (size_t i = 0; i + 1 < e.items.size(); i += 2)
          d.as_dict().set(eval(*e.items[i], scope), eval(*e.items[i + 1], scope));
        return d;
      }
      case ExprKind::Getattr: {
        Value obj = eval(*e.a, scope);
        line_ = e.line;
        return get_attr(obj, e.name);
      }
      case ExprKind::Getitem: {
        Value obj = eval(*e.a, scope);
        if (e.b->kind == ExprKind::Slice) {
          const Expr& s = *e.b;
          Value none = Value::none();
          Value start = s.a ? eval(*s.a, scope) : none, stop = s.b ? eval(*s.b, scope) : none,
                step = s.c ? eval(*s.c, scope) : none;
          line_ = e.line;
          return get_slice(obj, start, stop, step);
        }
        Value key = eval(*e.b, scope);
        line_ = e.line;
        return get_item(obj, key);
      }
      case ExprKind::Slice:
        eval_error("slice outside a subscript");
      case ExprKind::Call:
        return eval_call(e, scope, nullptr);
      case ExprKind::Filter: {
        if (!e.a) eval_error("filter without input");
        Value input = eval(*e.a, scope);
        CallArgs args = eval_args(e, scope);
        line_ = e.line;
        return apply_filter(*this, e.name, input, args);
      }
      case ExprKind::Test: {
        Value input = eval(*e.a, scope);
        CallArgs args = eval_args(e, scope);
        line_ = e.line;
        return Value(apply_test(*this, e.name, input, args));
      }
      case ExprKind::Unary: {
        Value v = eval(*e.a, scope);
        line_ = e.line;
        if (e.name == "not") return Value(!v.truthy());
        if (e.name == "-") return py_neg(v);
        require_defined(v);
        if (!v.is_number()) eval_error(fmt::format("bad operand type for unary +: '{}'", v.type_name()));
        return v.is_bool() ? Value(int64_t{v.as_bool()}) : v;
      }
      case ExprKind::Binary: {
        if (e.name == "and") {
          Value l = eval(*e.a, scope);
          return l.truthy() ? eval(*e.b, scope) : l;
        }
        if (e.name == "or") {
          Value l = eval(*e.a, scope);
          return l.truthy() ? l : eval(*e.b, scope);
        }
        Value l = eval(*e.a, scope);
        Value r = eval(*e.b, scope);
        line_ = e.line;
        const std::string& op = e.name;
        if (op == "+") return py_add(l, r);
        if (op == "-") return py_sub(l, r);
        if (op == "*") return py_mul(l, r);
        if (op == "/") return py_div(l, r);
        if (op == "//") return py_floordiv(l, r);
        if (op == "%") return py_mod(l, r);
        if (op == "**") return py_pow(l, r);
        eval_error(fmt::format("unknown operator '{}'", op));
      }
      case ExprKind::Concat: {
        std::string s;
        for (auto& x : e.items) s += eval(*x, scope).str();
        return Value(std::move(s));
      }
      case ExprKind::Compare: {
        Value left = eval(*e.items[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.items[i + 1], scope);
          line_ = e.line;
          const std::string& op = e.ops[i];
          bool ok;
          if (op == "==")
            ok = left == right;
          else if (op == "!=")
            ok = !(left == right);
          else if (op == "<")
            ok = py_less(left, right);
          else if (op == ">")
            ok = py_less(right, left);
          else if (op == "<=")
            ok = py_less(left, right) || left == right;
          else if (op == ">=")
            ok = py_less(right, left) || left == right;
          else if (op == "in")
            ok = py_contains(right, left);
          else
            ok = !py_contains(right, left);  // notin
          if (!ok) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case ExprKind::CondExpr: {
        if (eval(*e.a, scope).truthy()) return eval(*e.b, scope);
        if (e.c) return eval(*e.c, scope);
        return Value::undefined(fmt::format(
            "the inline if-expression on line {} evaluated to false and no else section was defined.", e.line));
      }
    }
    return Value();
  }

  const Program& program_;
  std::vector<ScopePtr> pinned_;  // scopes that macros close over
  std::string* out_ = nullptr;
  int line_ = 0;
  int depth_ = 0;
};

}  // namespace
}  // namespace detail

Template::Template(std::string_view source, std::string name, TemplateOptions options)
    : program_(std::make_unique<detail::Program>()) {
  program_->name = std::move(name);
  program_->body = detail::parse(detail::tokenize(source, program_->name, options), program_->name);
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

const std::string& Template::name() const {
  return program_->name;
}

std::string Template::render(const Value& variables) const {
  detail::Renderer r(*program_);
  try {
    return r.run(variables);
  } catch (const TemplateError&) {
    throw;
  } catch (const detail::EvalError& e) {
    throw TemplateError(e.what(), program_->name, r.line(), e.raised);
  } catch (const Error& e) {
    throw TemplateError(e.what(), program_->name, r.line(), false);
  }
}

}  // namespace flashnext::chat::jinja
