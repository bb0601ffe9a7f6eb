#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode.h"

namespace flashnext {

namespace {

using nlohmann::json;
using tokenizer_impl::Bpe;
using tokenizer_impl::MergeRule;
using tokenizer_impl::PreTokenizer;

/// The GPT-2 ByteLevel alphabet (tokenizers pre_tokenizers/byte_level.rs `bytes_char`): printable Latin-1 bytes map
/// to themselves, the other 68 bytes to U+0100.. in byte order.
std::array<char32_t, 256> byte_level_chars() {
  std::array<char32_t, 256> map{};
  std::array<bool, 256> direct{};
  for (int b = 0; b < 256; ++b) direct[b] = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) map[b] = direct[b] ? char32_t(b) : next++;
  return map;
}

/// Bytes of one vocabulary string through the ByteLevel decoder: each character mapped back to its byte, or the
/// string's own UTF-8 when some character is not in the byte alphabet (tokenizers decoders ByteLevel).
/// `char_to_byte[c]` is the byte of ByteLevel character c (all are below U+0144), or -1.
std::string byte_level_decode(std::string_view token, const std::array<int16_t, 0x144>& char_to_byte) {
  std::string out;
  size_t i = 0;
  while (i < token.size()) {
    const unicode::Utf8Step st = unicode::utf8_step(token, i);
    if (!st.valid || st.cp >= char_to_byte.size() || char_to_byte[st.cp] < 0) return std::string(token);
    out.push_back(static_cast<char>(char_to_byte[st.cp]));
    i += st.len;
  }
  return out;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("tokenizer: cannot open {}", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("tokenizer: error reading {}", path.string());
  return std::move(ss).str();
}

bool flag(const json& obj, const char* key, std::string_view where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return false;
  if (!it->is_boolean()) fail("{}: `{}` must be true or false, got {}", where, key, it->dump());
  return it->get<bool>();
}

/// Leftmost-longest, non-overlapping search for a set of added tokens, with the reference's handling of the
/// `special` (encode_special_tokens), `single_word`, `lstrip` and `rstrip` flags
/// (tokenizers tokenizer/added_vocabulary.rs `AddedVocabulary::find_matches`).
class AddedMatcher {
 public:
  void add(const AddedToken* token, std::string pattern) {
    if (pattern.empty()) return;
    const auto first = static_cast<unsigned char>(pattern[0]);
    by_first_[first].push_back(static_cast<int>(tokens_.size()));
    tokens_.push_back(token);
    patterns_.push_back(std::move(pattern));
  }
  void finish() {
    for (auto& list : by_first_) {
      std::stable_sort(list.begin(), list.end(),
                       [&](int a, int b) { return patterns_[a].size() > patterns_[b].size(); });
    }
  }
  bool empty() const { return tokens_.empty(); }

  /// Splits `text` into spans: `on_text(view)` for text between tokens, `on_token(id)` for each added token.
  template <class OnText, class OnToken>
  void split(std::string_view text, bool parse_special, OnText&& on_text, OnToken&& on_token) const {
    if (tokens_.empty()) {
      if (!text.empty()) on_text(text);
      return;
    }
    size_t start_offset = 0;  // end of the last emitted span
    size_t pos = 0;           // where the automaton continues
    const size_t n = text.size();
    while (pos < n) {
      // Leftmost position where some pattern matches; the longest pattern there.
      int found = -1;
      size_t b = pos;
      for (; b < n; ++b) {
        const auto& cands = by_first_[static_cast<unsigned char>(text[b])];
        for (int k : cands) {
          if (text.compare(b, patterns_[k].size(), patterns_[k]) == 0) {
            found = k;
            break;
          }
        }
        if (found >= 0) break;
      }
      if (found < 0) break;
      size_t start = b, stop = b + patterns_[found].size();
      pos = stop;
      const AddedToken& tok = *tokens_[found];
      if (tok.special && !parse_special) continue;
      if (tok.single_word) {
        const bool start_ok = start == 0 || !unicode::is_word_char(last_char(text.substr(0, start)));
        const bool stop_ok = stop == n || !unicode::is_word_char(unicode::utf8_step(text, stop).cp);
        if (!start_ok || !stop_ok) continue;
      }
      if (tok.lstrip) {
        size_t s = start;
        while (s > 0) {
          const size_t c = char_start(text, s);
          if (!unicode::is_white_space(unicode::utf8_step(text, c).cp)) break;
          s = c;
        }
        start = std::max(s, start_offset);
      }
      if (tok.rstrip) {
        while (stop < n) {
          const unicode::Utf8Step st = unicode::utf8_step(text, stop);
          if (!unicode::is_white_space(st.cp)) break;
          stop += st.len;
        }
      }
      if (start_offset < start) on_text(text.substr(start_offset, start - start_offset));
      on_token(tok.id);
      start_offset = stop;
    }
    if (start_offset < n) on_text(text.substr(start_offset));
  }

 private:
  static size_t char_start(std::string_view s, size_t end) {
    size_t c = end - 1;
    while (c > 0 && (static_cast<unsigned char>(s[c]) & 0xC0) == 0x80) --c;
    return c;
  }
  static char32_t last_char(std::string_view s) { return unicode::utf8_step(s, char_start(s, s.size())).cp; }

  std::vector<const AddedToken*> tokens_;
  std::vector<std::string> patterns_;
  std::array<std::vector<int>, 256> by_first_;
};

/// Open-addressing index from token text to id; the strings themselves live in `tokens` (indexed by id), which
/// must outlive it and stay unchanged for the indexed ids.
class TokenIndex {
 public:
  explicit TokenIndex(size_t capacity_hint = 0) {
    size_t cap = 16;
    while (cap < capacity_hint * 2) cap <<= 1;
    slots_.assign(cap, Slot{0, -1});
    mask_ = cap - 1;
  }
  /// Adds `id` under tokens[id] unless that text is already indexed.
  void insert(TokenId id, const std::vector<std::string>& tokens) {
    const std::string_view key = tokens[id];
    const uint64_t h = std::hash<std::string_view>{}(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.id < 0) {
        s = Slot{h, id};
        return;
      }
      if (s.hash == h && tokens[s.id] == key) return;
    }
  }
  std::optional<TokenId> find(std::string_view key, const std::vector<std::string>& tokens) const {
    const uint64_t h = std::hash<std::string_view>{}(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.id < 0) return std::nullopt;
      if (s.hash == h && tokens[s.id] == key) return s.id;
    }
  }

 private:
  struct Slot {
    uint64_t hash;
    TokenId id;  // -1: empty
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

/// model.vocab and model.merges, read while parsing (keeping 150,000-entry objects out of the DOM saves most of the
/// load time).
struct ModelTables {
  bool have_vocab = false, have_merges = false;
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
};

/// Parses tokenizer.json; model.vocab and model.merges go to `tables` and are left empty in the returned DOM.
json parse_tokenizer_json(std::string_view text, const std::string& where, ModelTables& tables) {
  struct Frame {
    bool object;
    std::string key;  // the current key, for objects
  };
  std::vector<Frame> stack;
  std::vector<std::string> pair;
  // Innermost open containers: [top-level object, model object, vocab object | merges array, merge pair array].
  auto under_model = [&](const char* key) {
    return stack.size() >= 3 && stack[0].key == "model" && stack[1].key == key;
  };
  auto cb = [&](int /*depth*/, json::parse_event_t event, json& parsed) -> bool {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        stack.push_back({event == json::parse_event_t::object_start, {}});
        if (stack.size() == 3 && under_model("vocab") && stack[2].object) tables.have_vocab = true;
        if (stack.size() == 3 && under_model("merges") && !stack[2].object) tables.have_merges = true;
        if (stack.size() == 4 && under_model("merges") && !stack[2].object) pair.clear();
        return true;
      case json::parse_event_t::key:
        stack.back().key = parsed.get<std::string>();
        return !(stack.size() == 3 && under_model("vocab") && stack[2].object);
      case json::parse_event_t::value:
        if (stack.size() == 3 && under_model("vocab") && stack[2].object) {
          if (!parsed.is_number_integer())
            fail("{}: model.vocab[\"{}\"] must be an integer id, got {}", where, stack[2].key, parsed.dump());
          tables.vocab.emplace_back(std::move(stack[2].key), parsed.get<int64_t>());
          return false;
        }
        if (stack.size() == 3 && under_model("merges") && !stack[2].object) {  // "left right"
          const size_t k = tables.merges.size();
          if (!parsed.is_string())
            fail("{}: model.merges[{}] must be a string or a pair, got {}", where, k, parsed.dump());
          const std::string& m = parsed.get_ref<const std::string&>();
          const size_t sp = m.find(' ');
          if (sp == std::string::npos || m.find(' ', sp + 1) != std::string::npos)
            fail("{}: model.merges[{}] `{}` is not two tokens separated by one space", where, k, m);
          tables.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
          return false;
        }
        if (stack.size() == 4 && under_model("merges") && !stack[2].object) {  // ["left", "right"]
          if (!parsed.is_string())
            fail("{}: model.merges[{}] must hold two strings, got {}", where, tables.merges.size(), parsed.dump());
          pair.push_back(std::move(parsed.get_ref<std::string&>()));
          return false;
        }
        return true;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end: {
        const bool merge_pair = stack.size() == 4 && under_model("merges") && !stack[2].object;
        if (merge_pair) {
          if (pair.size() != 2)
            fail("{}: model.merges[{}] must be [\"left\", \"right\"], got {} strings", where, tables.merges.size(),
                 pair.size());
          tables.merges.emplace_back(std::move(pair[0]), std::move(pair[1]));
        }
        stack.pop_back();
        return !merge_pair;
      }
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), cb);
  } catch (const json::parse_error& e) {
    fail("{}: not a valid tokenizer.json (JSON parse error: {})", where, e.what());
  }
}

}  // namespace

struct Tokenizer::Impl {
  std::string source;
  bool nfc = false;
  std::unique_ptr<PreTokenizer> pre;
  std::unique_ptr<Bpe> bpe;
  int32_t vocab_size = 0;
  TokenIndex token_ids;                                // model vocabulary strings -> id
  std::unordered_map<std::string, TokenId> added_ids;  // added-token contents -> id
  std::vector<std::string> tokens;                     // id -> vocabulary string / added content ("" = hole)
  std::vector<uint8_t> known;                          // id -> has a token
  std::vector<uint8_t> special;                        // id -> special added token
  std::vector<int32_t> added_index;                    // id -> index into `added`, -1 if not added
  std::string bytes;                                   // decoded bytes of every id, concatenated
  std::vector<uint32_t> bytes_offset;                  // [vocab_size + 1]
  std::vector<AddedToken> added;                       // sorted by id
  AddedMatcher raw_matcher, normalized_matcher;

  /// Calls `on_text(span)` for the normalized text spans to pre-tokenize and `on_token(id)` for added tokens.
  template <class OnText, class OnToken>
  void segment(std::string_view text, bool parse_special, OnText&& on_text, OnToken&& on_token) const {
    std::string clean;
    if (!unicode::is_valid_utf8(text)) {
      clean = unicode::replace_invalid_utf8(text);
      text = clean;
    }
    raw_matcher.split(
        text, parse_special,
        [&](std::string_view span) {
          std::string normalized;
          if (nfc && unicode::nfc_quick_check(span) != std::string_view::npos) {
            normalized = unicode::nfc(span);
            span = normalized;
          }
          normalized_matcher.split(span, parse_special, on_text, on_token);
        },
        on_token);
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::path file = path;
  if (std::filesystem::is_directory(path, ec)) {
    file = path / "tokenizer.json";
    if (!std::filesystem::exists(file, ec)) fail("tokenizer: the model folder {} has no tokenizer.json", path.string());
  } else if (!std::filesystem::exists(path, ec)) {
    fail("tokenizer: {} does not exist (expected a tokenizer.json file or a model folder that holds one)",
         path.string());
  }
  return from_json(read_file(file), file.string());
}

Tokenizer Tokenizer::from_json(std::string_view text, std::string_view source) {
  auto impl = std::make_unique<Impl>();
  impl->source = std::string(source);
  const std::string& where = impl->source;
  ModelTables tables;
  const json j = parse_tokenizer_json(text, where, tables);
  if (!j.is_object()) fail("{}: not a valid tokenizer.json (the top level is not an object)", where);

  // --- model ---
  auto model_it = j.find("model");
  if (model_it == j.end() || !model_it->is_object()) fail("{}: missing the `model` object", where);
  const json& model = *model_it;
  const std::string model_type = model.value("type", model.contains("merges") ? "BPE" : "");
  if (model_type != "BPE") fail("{}: model type `{}` is not supported (only BPE)", where, model_type);
  if (auto d = model.find("dropout"); d != model.end() && !d->is_null() && !(d->is_number() && d->get<double>() == 0))
    fail("{}: model.dropout {} is not supported (BPE dropout is a training feature)", where, d->dump());
  if (flag(model, "byte_fallback", where))
    fail("{}: model.byte_fallback is not supported (byte-level BPE only)", where);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(key);
    if (it != model.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
      fail("{}: model.{} {} is not supported (byte-level BPE only)", where, key, it->dump());
  }
  const bool ignore_merges = flag(model, "ignore_merges", where);

  if (!tables.have_vocab) fail("{}: model.vocab must be an object", where);
  int64_t max_id = -1;
  std::vector<std::pair<std::string, TokenId>> vocab;
  vocab.reserve(tables.vocab.size());
  for (auto& [token, id] : tables.vocab) {
    if (id < 0 || id >= INT32_MAX)
      fail("{}: model.vocab[\"{}\"] must be an id in [0, 2^31-1), got {}", where, token, id);
    vocab.emplace_back(std::move(token), static_cast<TokenId>(id));
    max_id = std::max<int64_t>(max_id, id);
  }
  tables.vocab.clear();

  // --- normalizer ---
  if (auto nz = j.find("normalizer"); nz != j.end() && !nz->is_null()) {
    std::vector<const json*> items;
    if (nz->is_object() && nz->value("type", "") == "Sequence" && nz->contains("normalizers") &&
        (*nz)["normalizers"].is_array()) {
      for (const auto& x : (*nz)["normalizers"]) items.push_back(&x);
    } else {
      items.push_back(&*nz);
    }
    for (const json* x : items) {
      const std::string t = x->is_object() ? x->value("type", "") : "";
      if (t != "NFC") fail("{}: normalizer `{}` is not supported (only NFC)", where, t.empty() ? x->dump() : t);
      impl->nfc = true;
    }
  }

  // --- added tokens ---
  std::vector<AddedToken> added;
  if (auto at = j.find("added_tokens"); at != j.end() && !at->is_null()) {
    if (!at->is_array()) fail("{}: `added_tokens` must be a list", where);
    for (size_t k = 0; k < at->size(); ++k) {
      const json& t = (*at)[k];
      const std::string tw = fmt::format("{}: added_tokens[{}]", where, k);
      if (!t.is_object()) fail("{} must be an object", tw);
      auto id = t.find("id");
      auto content = t.find("content");
      if (id == t.end() || !id->is_number_integer() || id->get<int64_t>() < 0 || id->get<int64_t>() >= INT32_MAX)
        fail("{}: `id` must be an id in [0, 2^31-1)", tw);
      if (content == t.end() || !content->is_string() || content->get<std::string>().empty())
        fail("{}: `content` must be a non-empty string", tw);
      AddedToken a;
      a.id = static_cast<TokenId>(id->get<int64_t>());
      a.content = content->get<std::string>();
      if (!unicode::is_valid_utf8(a.content)) fail("{}: `content` is not valid UTF-8", tw);
      a.special = flag(t, "special", tw);
      a.single_word = flag(t, "single_word", tw);
      a.lstrip = flag(t, "lstrip", tw);
      a.rstrip = flag(t, "rstrip", tw);
      a.normalized = flag(t, "normalized", tw);
      added.push_back(std::move(a));
      max_id = std::max<int64_t>(max_id, added.back().id);
    }
  }
  const int32_t n = static_cast<int32_t>(max_id + 1);
  impl->vocab_size = n;
  impl->tokens.assign(n, std::string());
  impl->known.assign(n, 0);
  impl->special.assign(n, 0);
  impl->added_index.assign(n, -1);
  impl->token_ids = TokenIndex(vocab.size() + added.size());
  for (auto& [token, id] : vocab) {
    if (impl->known[id]) fail("{}: model.vocab maps both `{}` and `{}` to id {}", where, impl->tokens[id], token, id);
    impl->known[id] = 1;
    impl->tokens[id] = std::move(token);
    impl->token_ids.insert(id, impl->tokens);
  }
  {
    // The reference (tokenizers AddedVocabulary::add_tokens, in file order) gives an added token the id of the
    // vocabulary entry with the same content, or else the next id after the model vocabulary and the added tokens
    // so far. It ignores the declared id, so a file whose declared ids differ would be tokenized differently there:
    // reject it.
    std::unordered_map<std::string_view, TokenId> assigned;
    const int64_t model_size = static_cast<int64_t>(vocab.size());
    int64_t max_added = -1;
    for (const AddedToken& a : added) {
      int64_t id;
      const std::optional<TokenId> in_vocab = impl->token_ids.find(a.content, impl->tokens);
      if (auto it = assigned.find(a.content); it != assigned.end()) {
        id = it->second;
      } else if (in_vocab) {
        id = *in_vocab;
      } else {
        id = max_added < 0 ? model_size : (max_added >= model_size || model_size == 0 ? max_added + 1 : model_size);
      }
      if (id != a.id)
        fail(
            "{}: added token `{}` declares id {}, but the reference tokenizer would give it id {} (model.vocab has {} "
            "entries{})",
            where, a.content, a.id, id, model_size,
            in_vocab ? fmt::format(" and lists `{}` as id {}", a.content, *in_vocab) : "");
      assigned.emplace(a.content, a.id);
      max_added = std::max<int64_t>(max_added, id);
    }
  }
  std::sort(added.begin(), added.end(), [](const AddedToken& a, const AddedToken& b) { return a.id < b.id; });
  for (size_t k = 0; k < added.size(); ++k) {
    const AddedToken& a = added[k];
    if (k > 0 && a.id == added[k - 1].id)
      fail("{}: added tokens `{}` and `{}` share id {}", where, added[k - 1].content, a.content, a.id);
    if (impl->known[a.id] && impl->tokens[a.id] != a.content)
      fail("{}: added token `{}` has id {}, which model.vocab already gives to `{}`", where, a.content, a.id,
           impl->tokens[a.id]);
    impl->known[a.id] = 1;
    // The reference shows (and decodes) a normalized token by its normalized content, but looks it up by the
    // content as written.
    impl->tokens[a.id] = a.normalized && impl->nfc ? unicode::nfc(a.content) : a.content;
    impl->special[a.id] = a.special;
    impl->added_index[a.id] = static_cast<int32_t>(k);
    impl->added_ids.emplace(a.content, a.id);
  }
  impl->added = std::move(added);

  // --- pre-tokenizer, decoder, post-processor ---
  auto pre_it = j.find("pre_tokenizer");
  if (pre_it == j.end() || pre_it->is_null())
    fail("{}: no pre_tokenizer; only byte-level BPE (a ByteLevel pre-tokenizer) is supported", where);
  impl->pre = PreTokenizer::from_json(*pre_it, where);
  auto only_byte_level = [&](const char* key, bool allow_null) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
      if (allow_null) return;
      fail("{}: no {}; only the ByteLevel {} is supported", where, key, key);
    }
    std::vector<const json*> items;
    if (it->is_object() && it->value("type", "") == "Sequence") {
      const char* list = std::string_view(key) == "decoder" ? "decoders" : "processors";
      if (!it->contains(list) || !(*it)[list].is_array()) fail("{}: {} Sequence lacks `{}`", where, key, list);
      for (const auto& x : (*it)[list]) items.push_back(&x);
    } else {
      items.push_back(&*it);
    }
    for (const json* x : items) {
      const std::string t = x->is_object() ? x->value("type", "") : "";
      if (t != "ByteLevel")
        fail("{}: {} `{}` is not supported (only ByteLevel)", where, key, t.empty() ? x->dump() : t);
    }
  };
  only_byte_level("decoder", false);
  only_byte_level("post_processor", true);

  // --- byte-level tables ---
  const std::array<char32_t, 256> chars = byte_level_chars();
  std::array<int16_t, 0x144> char_to_byte;
  char_to_byte.fill(-1);
  std::array<int32_t, 256> byte_ids{};
  for (int b = 0; b < 256; ++b) {
    char_to_byte[chars[b]] = static_cast<int16_t>(b);
    std::string s;
    unicode::append_utf8(s, chars[b]);
    const std::optional<TokenId> id = impl->token_ids.find(s, impl->tokens);
    if (!id || impl->added_index[*id] >= 0)
      fail(
          "{}: model.vocab has no token for byte 0x{:02X} (ByteLevel character `{}`); a byte-level BPE vocabulary "
          "needs all 256",
          where, b, s);
    byte_ids[b] = *id;
  }
  impl->bytes_offset.assign(n + 1, 0);
  std::unordered_map<std::string, int32_t> whole_words;
  for (int32_t id = 0; id < n; ++id) {
    impl->bytes_offset[id] = static_cast<uint32_t>(impl->bytes.size());
    if (!impl->known[id]) continue;
    const std::string b = byte_level_decode(impl->tokens[id], char_to_byte);
    impl->bytes += b;
    if (ignore_merges && impl->added_index[id] < 0) whole_words.emplace(b, id);
  }
  impl->bytes_offset[n] = static_cast<uint32_t>(impl->bytes.size());

  // --- merges ---
  if (!tables.have_merges) fail("{}: model.merges must be a list", where);
  std::vector<MergeRule> merges;
  merges.reserve(tables.merges.size());
  std::string joined;
  for (size_t k = 0; k < tables.merges.size(); ++k) {
    const auto& [left, right] = tables.merges[k];
    joined.assign(left).append(right);
    const auto l = impl->token_ids.find(left, impl->tokens), r = impl->token_ids.find(right, impl->tokens),
               mg = impl->token_ids.find(joined, impl->tokens);
    if (!l || !r || !mg)
      fail("{}: model.merges[{}] ({} {}) uses a token that is not in model.vocab", where, k, left, right);
    merges.push_back({*l, *r, *mg});
  }
  impl->bpe = std::make_unique<Bpe>(byte_ids, merges, ignore_merges, std::move(whole_words));

  // --- added-token matchers ---
  for (const AddedToken& a : impl->added) {
    if (a.normalized) {
      impl->normalized_matcher.add(&a, impl->nfc ? unicode::nfc(a.content) : a.content);
    } else {
      impl->raw_matcher.add(&a, a.content);
    }
  }
  impl->raw_matcher.finish();
  impl->normalized_matcher.finish();
  return Tokenizer(std::move(impl));
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  const Impl& im = *impl_;
  im.segment(
      text, parse_special,
      [&](std::string_view span) { im.pre->split(span, [&](std::string_view piece) { im.bpe->encode(piece, ids); }); },
      [&](TokenId id) { ids.push_back(id); });
  return ids;
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text, bool parse_special) const {
  std::vector<std::string> pieces;
  const Impl& im = *impl_;
  im.segment(
      text, parse_special,
      [&](std::string_view span) { im.pre->split(span, [&](std::string_view p) { pieces.emplace_back(p); }); },
      [&](TokenId id) { pieces.push_back(im.tokens[id]); });
  return pieces;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special_tokens) const {
  std::string raw;
  for (TokenId id : ids) {
    if (skip_special_tokens && is_special(id)) continue;
    raw += token_bytes(id);
  }
  if (unicode::is_valid_utf8(raw)) return raw;
  return unicode::replace_invalid_utf8(raw);
}

std::string_view Tokenizer::token_bytes(TokenId id) const {
  const Impl& im = *impl_;
  if (id < 0 || id >= im.vocab_size) return {};
  return std::string_view(im.bytes).substr(im.bytes_offset[id], im.bytes_offset[id + 1] - im.bytes_offset[id]);
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_ids.find(std::string(token)); it != impl_->added_ids.end()) return it->second;
  return impl_->token_ids.find(token, impl_->tokens);
}

std::optional<std::string> Tokenizer::id_to_token(TokenId id) const {
  if (id < 0 || id >= impl_->vocab_size || !impl_->known[id]) return std::nullopt;
  return impl_->tokens[id];
}

bool Tokenizer::is_special(TokenId id) const {
  return id >= 0 && id < impl_->vocab_size && impl_->special[id] != 0;
}

const AddedToken* Tokenizer::added_token(TokenId id) const {
  if (id < 0 || id >= impl_->vocab_size || impl_->added_index[id] < 0) return nullptr;
  return &impl_->added[impl_->added_index[id]];
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const {
  return impl_->added;
}

int32_t Tokenizer::vocab_size() const {
  return impl_->vocab_size;
}

const std::string& Tokenizer::source() const {
  return impl_->source;
}

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_(skip_special_tokens) {}

std::string IncrementalDecoder::push(TokenId id) {
  if (skip_special_ && tokenizer_->is_special(id)) return {};
  pending_ += tokenizer_->token_bytes(id);
  const size_t stable = unicode::utf8_stable_prefix(pending_);
  if (stable == 0) return {};
  std::string out = unicode::replace_invalid_utf8(std::string_view(pending_).substr(0, stable));
  pending_.erase(0, stable);
  return out;
}

std::string IncrementalDecoder::finish() {
  std::string out = unicode::replace_invalid_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace flashnext
