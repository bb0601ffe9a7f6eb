// Helpers of the grammar tests: whole-string matching and the bundled Qwen3 vocabulary.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
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

inline bool bit(const std::vector<uint32_t>& m, int32_t id) { return (m[id >> 5] >> (id & 31)) & 1u; }

// Checks the mask of `m` against brute force; returns the number of allowed tokens.
inline size_t check_mask_brute_force(TokenMasker& masker, const GrammarMatcher& m) {
  const TokenVocabulary& v = masker.vocab();
  std::vector<uint32_t> mask = masker.mask(m);
  size_t allowed = 0, errors = 0;
  for (int32_t id = 0; id < v.mask_size(); ++id) {
    bool eos = std::find(v.eos_ids().begin(), v.eos_ids().end(), id) != v.eos_ids().end();
    bool expect;
    if (eos)
      expect = m.can_end() && !m.is_terminated();
    else
      expect = static_cast<size_t>(id) < v.num_tokens() && !v.bytes(id).empty() && m.can_accept(v.bytes(id));
    allowed += expect;
    if (expect != bit(mask, id) && ++errors <= 10)
      ADD_FAILURE() << "token " << id << " '" << (static_cast<size_t>(id) < v.num_tokens() ? v.bytes(id) : "")
                    << "': brute force " << expect << ", mask " << bit(mask, id);
  }
  return allowed;
}

}  // namespace flashnext::grammar::test
