// `flashnext tokenize` (text in, ids out) and `flashnext detokenize` (ids in, text out).
//
//   flashnext tokenize --tokenizer DIR (--text T | --file F) [--json] [--no-special] [--pieces]
//   flashnext detokenize --tokenizer DIR (--ids "1 2 3" | --file F) [--json] [--skip-special]
//
// Unknown ids are an error here (they are skipped silently by Tokenizer::decode, as the reference does).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/cli.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace flashnext::cli {
namespace {

/// Contents of `path` ("-" = standard input), as raw bytes.
std::string read_input(const std::string& path) {
  if (path == "-") return std::string(std::istreambuf_iterator<char>(std::cin), {});
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open {}", path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// Ids written as a JSON list ("[1, 2]") or separated by spaces, commas or newlines.
std::vector<TokenId> parse_ids(const std::string& text, const Tokenizer& tok) {
  std::vector<int64_t> raw;
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      fail("ids: not a valid JSON list ({})", e.what());
    }
    if (!j.is_array()) fail("ids: expected a JSON list of integers");
    for (const auto& v : j) {
      if (!v.is_number_integer()) fail("ids: expected integers, got {}", v.dump());
      raw.push_back(v.get<int64_t>());
    }
  } else {
    std::string cleaned = text;
    for (char& c : cleaned) {
      if (c == ',') c = ' ';
    }
    std::istringstream in(cleaned);
    std::string word;
    while (in >> word) {
      size_t used = 0;
      int64_t v = 0;
      try {
        v = std::stoll(word, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != word.size()) fail("ids: `{}` is not an integer", word);
      raw.push_back(v);
    }
  }
  std::vector<TokenId> ids;
  for (int64_t v : raw) {
    if (v < 0 || v >= tok.vocab_size() || !tok.id_to_token(static_cast<TokenId>(v)))
      fail("ids: {} is not a token of {} (ids are 0..{})", v, tok.source(), tok.vocab_size() - 1);
    ids.push_back(static_cast<TokenId>(v));
  }
  return ids;
}

struct TokenizeArgs {
  std::string tokenizer, text, file;
  bool json = false, no_special = false, pieces = false;
};

int run_tokenize(const TokenizeArgs& a, bool have_text, bool have_file) {
  if (!have_text && !have_file) fail("tokenize: give --text or --file");
  const Tokenizer tok = Tokenizer::load(a.tokenizer);
  const std::string input = have_text ? a.text : read_input(a.file);
  if (a.pieces) {
    const auto pieces = tok.pre_tokenize(input, !a.no_special);
    std::printf("%s\n", nlohmann::json(pieces).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  const std::vector<TokenId> ids = tok.encode(input, !a.no_special);
  if (a.json) {
    nlohmann::json j;
    j["ids"] = ids;
    auto& tokens = j["tokens"] = nlohmann::json::array();
    for (TokenId id : ids) tokens.push_back(tok.id_to_token(id).value_or(""));
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
    std::printf("%s\n", line.c_str());
  }
  return 0;
}

struct DetokenizeArgs {
  std::string tokenizer, ids, file;
  bool json = false, skip_special = false;
};

int run_detokenize(const DetokenizeArgs& a, bool have_ids, bool have_file) {
  if (!have_ids && !have_file) fail("detokenize: give --ids or --file");
  const Tokenizer tok = Tokenizer::load(a.tokenizer);
  const std::vector<TokenId> ids = parse_ids(have_ids ? a.ids : read_input(a.file), tok);
  const std::string text = tok.decode(ids, a.skip_special);
  if (a.json) {
    std::printf("%s\n", nlohmann::json{{"text", text}}.dump().c_str());
  } else {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::printf("\n");
  }
  return 0;
}

FLASHNEXT_SUBCOMMAND(tokenize, "tokenize",
                     "Print the token ids of a text (tokenizer.json of a byte-level BPE model, e.g. Qwen)",
                     [](CLI::App& sub) -> std::function<int()> {
                       auto a = std::make_shared<TokenizeArgs>();
                       sub.add_option("--tokenizer", a->tokenizer, "model folder or tokenizer.json")->required();
                       auto* text = sub.add_option("--text", a->text, "text to tokenize");
                       auto* file = sub.add_option("--file", a->file, "file to tokenize, raw bytes (- = stdin)");
                       text->excludes(file);
                       sub.add_flag("--json", a->json, "print {\"ids\": [...], \"tokens\": [...]}");
                       sub.add_flag("--no-special", a->no_special,
                                    "encode special-token text such as <|im_start|> as plain text");
                       sub.add_flag("--pieces", a->pieces, "print the pre-tokenizer pieces (JSON list) instead");
                       return [a, text, file] { return run_tokenize(*a, text->count() > 0, file->count() > 0); };
                     });

FLASHNEXT_SUBCOMMAND(detokenize, "detokenize", "Print the text of token ids (tokenizer.json of a byte-level BPE model)",
                     [](CLI::App& sub) -> std::function<int()> {
                       auto a = std::make_shared<DetokenizeArgs>();
                       sub.add_option("--tokenizer", a->tokenizer, "model folder or tokenizer.json")->required();
                       auto* ids = sub.add_option("--ids", a->ids, "ids: \"1 2 3\", \"1,2,3\" or \"[1, 2, 3]\"");
                       auto* file = sub.add_option("--file", a->file, "file with ids (- = stdin)");
                       ids->excludes(file);
                       sub.add_flag("--skip-special", a->skip_special, "leave out special tokens");
                       sub.add_flag("--json", a->json, "print {\"text\": ...}");
                       return [a, ids, file] { return run_detokenize(*a, ids->count() > 0, file->count() > 0); };
                     });

}  // namespace
}  // namespace flashnext::cli
