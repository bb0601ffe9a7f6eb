// Helpers of the grammar tests: whole-string matching and the bundled Qwen3 vocabulary.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/token_mask.h"
#include "tokenizer/tokenizer.h"

namespace flashnext::grammar::test {

/// True when `text` is a complete match of `g` (a fresh matcher accepts every byte and may end after them).
inline bool full_match(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.accept_bytes(text) && m.can_end();
}

/// The real Qwen3 tokenizer bundled with the test model, loaded once.
inline const Tokenizer& qwen3_tokenizer() {
  static const Tokenizer tok =
      Tokenizer::load(std::filesystem::path(FLASHNEXT_SOURCE_DIR) / "models/tiny-b-random");
  return tok;
}

/// Its vocabulary with <|im_end|> and <|endoftext|> as EOS ids, loaded once.
inline std::shared_ptr<const TokenVocabulary> qwen3_vocab() {
  static const std::shared_ptr<const TokenVocabulary> v = [] {
    const Tokenizer& t = qwen3_tokenizer();
    return TokenVocabulary::from_tokenizer(t, {*t.token_to_id("<|im_end|>"), *t.token_to_id("<|endoftext|>")});
  }();
  return v;
}

}  // namespace flashnext::grammar::test
