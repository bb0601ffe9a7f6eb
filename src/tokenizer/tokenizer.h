// Tokenizer: a Hugging Face `tokenizer.json` engine for byte-level BPE (the Qwen and GPT-2 family of files),
// matching the `tokenizers` library (the reference) id for id. Nothing is specific to one model: the normalizer,
// the pre-tokenizer regexes, the vocabulary, the merges and the added tokens all come from the file.
//
// Encoding pipeline (tokenizers `TokenizerImpl::encode_single_sequence`):
//   1. Invalid UTF-8 in the input is replaced, one U+FFFD per maximal ill-formed subpart (see below).
//   2. Added tokens with `normalized: false` are found in the raw text (leftmost-longest, non-overlapping), with
//      their `single_word`, `lstrip` and `rstrip` flags; they become their own id.
//   3. Each remaining span is normalized (NFC, or nothing) and searched for the `normalized: true` added tokens.
//   4. Each remaining span is pre-tokenized: Split steps (regex from the file, run by PCRE2), then ByteLevel.
//   5. Each pre-token is merged by the BPE model (merge rank order) over its bytes; results are cached.
// No post-processor tokens are added (ByteLevel post-processing does not change ids).
//
// Invalid UTF-8: the reference takes `str` (Python) / `&str` (Rust), which cannot hold invalid UTF-8, so its
// behaviour is defined at the boundary where bytes become text. This engine accepts any bytes and first decodes
// them the way Python's `bytes.decode("utf-8", errors="replace")` does (the Unicode "maximal subpart" practice,
// also Rust's `String::from_utf8_lossy`); the reference tests feed exactly that string to `tokenizers`.
//
// Unicode versions: the reference's regex engine (Oniguruma) classifies characters by Unicode 16.0 and its NFC uses
// Unicode 9.0 tables. PCRE2 and utf8proc here are older or newer, so the regex's general categories are widened
// with the code points assigned since (unicode_tables.h, generated), and characters the reference's NFC does not
// know are left alone; tests/data/tokenizer's sweep checks every code point against the reference.
//
// Decoding concatenates each token's bytes (ByteLevel decoder: every character of the token mapped back to its
// byte; a token with a character outside the byte map contributes its UTF-8 text as is) and replaces invalid UTF-8
// the same lossy way. Ids outside the vocabulary are skipped, as the reference does.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace flashnext {

/// A token id: an index into the vocabulary (model vocab plus added tokens), 0 <= id < vocab_size().
using TokenId = int32_t;

/// An added (or special) token of tokenizer.json's `added_tokens` list.
struct AddedToken {
  TokenId id = 0;
  std::string content;
  bool special = false;      ///< a control token: skipped by decode(skip_special_tokens), not parsed when
                             ///< encode(parse_special = false)
  bool single_word = false;  ///< only matches when not preceded or followed by a word character
  bool lstrip = false;       ///< also swallows the whitespace on its left
  bool rstrip = false;       ///< also swallows the whitespace on its right
  bool normalized = false;   ///< matched in the normalized (NFC) text rather than the raw text
};

/// A loaded tokenizer. Immutable after load; every method is safe to call from many threads at once.
class Tokenizer {
 public:
  /// Loads `path`: a tokenizer.json file, or a model folder that contains one. Throws Error naming the file and the
  /// problem when it is missing, unreadable, not JSON, or uses a component this engine does not implement (only
  /// byte-level BPE is: model BPE, normalizer NFC / Sequence of NFC / none, pre-tokenizer Split* + ByteLevel,
  /// decoder ByteLevel, post-processor ByteLevel / none).
  static Tokenizer load(const std::filesystem::path& path);

  /// Builds a tokenizer from the text of a tokenizer.json; `source` names it in error messages.
  static Tokenizer from_json(std::string_view json, std::string_view source = "tokenizer.json");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  /// Token ids of `text` (any bytes; invalid UTF-8 is replaced as described above). With `parse_special` true,
  /// the text of a special token (e.g. "<|im_start|>") becomes its id, as in the reference. With false, special
  /// tokens are encoded as ordinary text, so user-supplied text cannot inject control tokens; added tokens that are
  /// not special (e.g. "<think>" in Qwen3) are still recognised, as the reference does with
  /// `encode_special_tokens = True`.
  std::vector<TokenId> encode(std::string_view text, bool parse_special = true) const;

  /// Text of `ids` (valid UTF-8 always). With `skip_special_tokens`, special added tokens are left out. Unknown ids
  /// are skipped.
  std::string decode(std::span<const TokenId> ids, bool skip_special_tokens = false) const;

  /// Raw bytes that token `id` contributes to a decoding (may be an incomplete UTF-8 sequence); empty for an
  /// unknown id.
  std::string_view token_bytes(TokenId id) const;

  /// Id of a vocabulary entry written as in tokenizer.json (byte-level form, e.g. "Ġthe"), or of an added token's
  /// content (e.g. "<|im_end|>"); nullopt when there is none.
  std::optional<TokenId> token_to_id(std::string_view token) const;

  /// The vocabulary entry (byte-level form) or added-token content of `id`; nullopt for an unknown id.
  std::optional<std::string> id_to_token(TokenId id) const;

  /// True when `id` is an added token marked special.
  bool is_special(TokenId id) const;

  /// The added token with id `id`, or nullptr.
  const AddedToken* added_token(TokenId id) const;

  /// All added tokens, in id order.
  const std::vector<AddedToken>& added_tokens() const;

  /// One past the largest id (model vocabulary and added tokens): the number of embedding rows the tokenizer can
  /// address. For Qwen3 this is 151669 (151643 BPE tokens + 26 added).
  int32_t vocab_size() const;

  /// Pre-tokens of `text` after normalization, with added tokens (parsed as `parse_special` says) shown as their
  /// content: the pieces the BPE model sees. For tests and `flashnext tokenize --pieces`.
  std::vector<std::string> pre_tokenize(std::string_view text, bool parse_special = true) const;

  /// The file this tokenizer was loaded from (or the `source` given to from_json).
  const std::string& source() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Streaming detokenizer: turns ids, fed one at a time, into text as soon as it is complete. The emitted pieces
/// never split a UTF-8 sequence and never repeat a character, and their concatenation (including finish()) equals
/// `tokenizer.decode(all ids, skip_special_tokens)`. Bytes of a character that is still incomplete are held back;
/// bytes that can no longer form a valid character are emitted as U+FFFD, exactly where decode() puts them.
class IncrementalDecoder {
 public:
  /// Keeps a reference to `tokenizer`, which must outlive this object.
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);

  /// Adds one id; returns the text that became complete (often empty for the first bytes of a multi-byte
  /// character).
  std::string push(TokenId id);

  /// Ends the stream: returns the held-back bytes, an incomplete character becoming U+FFFD. The decoder can then be
  /// reused for a new stream.
  std::string finish();

  /// Number of bytes currently held back (0 to 3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace flashnext
