// Jinja2 lexer (see jinja.h). Follows jinja2/lexer.py: newlines are normalised to "\n" and one trailing newline is
// dropped (keep_trailing_newline=False); `{%-`/`-%}` strip all whitespace on that side; `{%+`/`+%}` disable
// lstrip_blocks/trim_blocks for that tag; lstrip_blocks removes spaces/tabs between the start of a line and a block
// or comment tag; trim_blocks removes the first newline after a block or comment tag. Inside a tag, the end marker
// is only recognised while brackets are balanced.
#include <fmt/format.h>

#include <cctype>
#include <cstring>

#include "chat/jinja_ast.h"
#include "core/utf8.h"

namespace flashnext::chat::jinja::detail {
namespace {

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

std::string normalize_newlines(std::string_view in, bool keep_trailing_newline) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < in.size() && in[i + 1] == '\n') ++i;
    } else {
      out.push_back(in[i]);
    }
  }
  if (!keep_trailing_newline && !out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  Lexer(std::string src, const std::string& name, const TemplateOptions& opt)
      : src_(std::move(src)), name_(name), opt_(opt) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t idx = find_tag_start(pos_);
      if (idx == std::string::npos) {
        emit_data(src_.substr(pos_));
        pos_ = src_.size();
        break;
      }
      char kind = src_[idx + 1];
      char sign = idx + 2 < src_.size() && (src_[idx + 2] == '-' || src_[idx + 2] == '+') ? src_[idx + 2] : 0;
      std::string text = src_.substr(pos_, idx - pos_);
      int text_lines = count_newlines(text);
      if (sign == '-') {
        size_t end = text.size();
        while (end > 0 && is_ws(text[end - 1])) --end;
        text.resize(end);
      } else if (sign != '+' && opt_.lstrip_blocks && kind != '{') {
        size_t nl = text.rfind('\n');
        size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size()) {
          bool all_ws = true;
          for (size_t i = l_pos; i < text.size(); ++i) all_ws = all_ws && is_ws(text[i]);
          if (all_ws) text.resize(l_pos);
        }
      }
      if (!text.empty()) tokens_.push_back({TokenType::Data, std::move(text), line_});
      line_ += text_lines;
      pos_ = idx + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        line_starting = lex_comment();
      } else if (kind == '%' && lex_raw()) {
        line_starting = false;
      } else {
        line_starting = lex_tag(kind == '%');
      }
    }
    tokens_.push_back({TokenType::Eof, "", line_});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void error(const std::string& msg) { throw TemplateError(msg, name_, line_, false); }

  static int count_newlines(std::string_view s) {
    int n = 0;
    for (char c : s) n += c == '\n';
    return n;
  }

  size_t find_tag_start(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  void emit_data(std::string text) {
    int lines = count_newlines(text);
    if (!text.empty()) tokens_.push_back({TokenType::Data, std::move(text), line_});
    line_ += lines;
  }

  // Consumes what follows a block/comment end marker according to its sign; returns whether it ended a line.
  bool after_block_end(char sign) {
    if (sign == '-') {
      skip_ws();
      return false;
    }
    if (sign != '+' && opt_.trim_blocks && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
      ++line_;
      return true;
    }
    return false;
  }

  void skip_ws() {
    while (pos_ < src_.size() && is_ws(src_[pos_])) {
      if (src_[pos_] == '\n') ++line_;
      ++pos_;
    }
  }

  bool lex_comment() {
    size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) error("Missing end of comment tag");
    char sign = end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
    line_ += count_newlines(std::string_view(src_).substr(pos_, end - pos_));
    pos_ = end + 2;
    return after_block_end(sign);
  }

  // `{% raw %}...{% endraw %}`: the content is data. Returns false (consuming nothing) if the tag is not `raw`.
  bool lex_raw() {
    size_t p = pos_;
    auto skip = [&](size_t q) {
      while (q < src_.size() && is_ws(src_[q])) ++q;
      return q;
    };
    p = skip(p);
    if (src_.compare(p, 3, "raw") != 0) return false;
    p = skip(p + 3);
    char sign = 0;
    if (p < src_.size() && src_[p] == '-') sign = '-', ++p;
    if (src_.compare(p, 2, "%}") != 0) return false;
    line_ += count_newlines(std::string_view(src_).substr(pos_, p + 2 - pos_));
    pos_ = p + 2;
    if (sign == '-') skip_ws();
    // find {%[-+]? endraw [-+]?%}
    for (size_t i = src_.find("{%", pos_); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t q = i + 2;
      char open_sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
      if (open_sign) ++q;
      q = skip(q);
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q = skip(q + 6);
      char close_sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
      if (close_sign) ++q;
      if (src_.compare(q, 2, "%}") != 0) continue;
      std::string text = src_.substr(pos_, i - pos_);
      int lines = count_newlines(text) + count_newlines(std::string_view(src_).substr(i, q - i));
      if (open_sign == '-') {
        size_t end = text.size();
        while (end > 0 && is_ws(text[end - 1])) --end;
        text.resize(end);
      } else if (open_sign != '+' && opt_.lstrip_blocks) {
        size_t nl = text.rfind('\n');
        size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        bool all_ws = l_pos < text.size();
        for (size_t k = l_pos; k < text.size(); ++k) all_ws = all_ws && is_ws(text[k]);
        if (all_ws && l_pos > 0) text.resize(l_pos);
      }
      if (!text.empty()) tokens_.push_back({TokenType::Data, std::move(text), line_});
      line_ += lines;
      pos_ = q + 2;
      after_block_end(close_sign);
      return true;
    }
    error("Missing end of raw directive");
  }

  // Lexes the inside of {% ... %} (block) or {{ ... }}; returns whether the end marker consumed a newline.
  bool lex_tag(bool block) {
    tokens_.push_back({block ? TokenType::BlockBegin : TokenType::VariableBegin, "", line_});
    std::vector<char> balance;
    const char* end_marker = block ? "%}" : "}}";
    while (true) {
      skip_ws();
      if (pos_ >= src_.size())
        error(block ? "unexpected end of template, expected 'end of statement block'."
                    : "unexpected end of template, expected 'end of print statement'.");
      if (balance.empty()) {
        char sign = src_[pos_] == '-' || src_[pos_] == '+' ? src_[pos_] : 0;
        size_t m = pos_ + (sign ? 1 : 0);
        if (src_.compare(m, 2, end_marker) == 0 && (sign != '+' || block)) {
          tokens_.push_back({block ? TokenType::BlockEnd : TokenType::VariableEnd, "", line_});
          pos_ = m + 2;
          if (block) return after_block_end(sign);
          if (sign == '-') skip_ws();
          return false;
        }
      }
      char c = src_[pos_];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t start = pos_;
        while (pos_ < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_'))
          ++pos_;
        tokens_.push_back({TokenType::Name, src_.substr(start, pos_ - start), line_});
      } else if (c == '\'' || c == '"') {
        lex_string(c);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number();
      } else {
        lex_operator(balance);
      }
    }
  }

  void lex_string(char quote) {
    int start_line = line_;
    std::string out;
    size_t p = pos_ + 1;
    while (true) {
      if (p >= src_.size()) error("unexpected end of string");
      char c = src_[p];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        out.push_back(c);
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) error("unexpected end of string");
      char e = src_[p + 1];
      p += 2;
      auto hex = [&](int digits) {
        if (p + digits > src_.size()) error("truncated \\x/\\u escape in string");
        uint32_t v = 0;
        for (int k = 0; k < digits; ++k) {
          char h = src_[p + k];
          if (!std::isxdigit(static_cast<unsigned char>(h))) error("truncated \\x/\\u escape in string");
          v = v * 16 + (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
        }
        p += digits;
        return v;
      };
      switch (e) {
        case '\n':
          ++line_;
          break;  // line continuation
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
          append_utf8(out, hex(2));
          break;
        case 'u':
          append_utf8(out, hex(4));
          break;
        case 'U':
          append_utf8(out, hex(8));
          break;
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = e - '0';
            for (int k = 0; k < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++k)
              v = v * 8 + (src_[p++] - '0');
            append_utf8(out, v);
          } else {
            out.push_back('\\');
            out.push_back(e);
          }
      }
    }
    pos_ = p + 1;
    tokens_.push_back({TokenType::String, std::move(out), start_line});
  }

  void lex_number() {
    size_t start = pos_;
    auto digits = [&](auto pred) {
      size_t s = pos_;
      while (pos_ < src_.size() &&
             (pred(src_[pos_]) || (src_[pos_] == '_' && pos_ > s && pos_ + 1 < src_.size() && pred(src_[pos_ + 1])))) {
        ++pos_;
      }
    };
    auto dec = [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)) != 0; };
    if (src_[pos_] == '0' && pos_ + 1 < src_.size() && std::strchr("xXoObB", src_[pos_ + 1])) {
      char base = static_cast<char>(std::tolower(src_[pos_ + 1]));
      pos_ += 2;
      size_t dstart = pos_;
      if (base == 'x') digits([](char ch) { return std::isxdigit(static_cast<unsigned char>(ch)) != 0; });
      if (base == 'o') digits([](char ch) { return ch >= '0' && ch <= '7'; });
      if (base == 'b') digits([](char ch) { return ch == '0' || ch == '1'; });
      if (pos_ == dstart) error("invalid number literal");
      std::string text;
      for (size_t i = start; i < pos_; ++i)
        if (src_[i] != '_') text.push_back(src_[i]);
      tokens_.push_back({TokenType::Integer, text, line_});
      return;
    }
    digits(dec);
    bool is_float = false;
    bool after_dot = start > 0 && src_[start - 1] == '.';
    if (!after_dot && pos_ + 1 < src_.size() && src_[pos_] == '.' && dec(src_[pos_ + 1])) {
      ++pos_;
      digits(dec);
      is_float = true;
    }
    if (!after_dot && pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t p = pos_ + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && dec(src_[p])) {
        pos_ = p;
        digits(dec);
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = start; i < pos_; ++i)
      if (src_[i] != '_') text.push_back(src_[i]);
    tokens_.push_back({is_float ? TokenType::Float : TokenType::Integer, text, line_});
  }

  void lex_operator(std::vector<char>& balance) {
    static const char* two[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : two) {
      if (src_.compare(pos_, 2, op) == 0) {
        tokens_.push_back({TokenType::Operator, op, line_});
        pos_ += 2;
        return;
      }
    }
    char c = src_[pos_];
    if (!std::strchr("+-/*%~[](){}><=.:|,;", c)) {
      error(fmt::format("unexpected char '{}' at {}", std::string(1, c), pos_));
    }
    if (c == '(' || c == '[' || c == '{') {
      balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (balance.empty()) error(fmt::format("unexpected '{}'", c));
      if (balance.back() != c) error(fmt::format("unexpected '{}', expected '{}'", c, balance.back()));
      balance.pop_back();
    }
    tokens_.push_back({TokenType::Operator, std::string(1, c), line_});
    ++pos_;
  }

  std::string src_;
  const std::string& name_;
  TemplateOptions opt_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const std::string& name, const TemplateOptions& options) {
  return Lexer(normalize_newlines(source, options.keep_trailing_newline), name, options).run();
}

}  // namespace flashnext::chat::jinja::detail
