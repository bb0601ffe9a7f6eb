// Structured output for the server: the grammar a request asks for (response_format json_object / json_schema, a
// forced tool_choice) as an engine TokenConstraint (engine/sampling.h) that masks every token the grammar does not
// allow, with the model's reasoning block left free.
//
// Threads: compiled grammars and their TokenMaskers (grammar/token_mask.h: a per-position cache) are shared by all
// requests with the same grammar and kept in a small LRU cache. A masker is not locked, so every constraint's mask()
// and accept() must run on one thread: the scheduler's engine thread, where every Sampler runs. The cache itself is
// locked (requests are parsed on HTTP threads).
#pragma once

#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chat/chat_template.h"
#include "engine/sampling.h"
#include "grammar/matcher.h"
#include "grammar/tool_call_grammar.h"
#include "grammar/token_mask.h"
#include "server/openai_schema.h"
#include "tokenizer/tokenizer.h"

namespace flashnext::server {

/// A grammar constraint on one sequence. Until `reasoning_end` is generated (when given) every token is allowed; then
/// the output must match the grammar, and an EOS id is allowed exactly when the grammar may end.
class GrammarConstraint : public TokenConstraint {
 public:
  /// `masker`: the grammar over the model's vocabulary; `reasoning_end`: the id of `</think>` when the prompt leaves
  /// a think block open (the grammar starts after it), else nullopt (the grammar starts at the first token).
  GrammarConstraint(std::shared_ptr<grammar::TokenMasker> masker, std::optional<int32_t> reasoning_end);

  std::unique_ptr<TokenConstraint> clone() const override;
  /// Throws Error when no token may follow (a grammar the vocabulary cannot continue).
  void mask(std::span<float> logits) override;
  /// Throws Error when the token is not allowed by the grammar (the scheduler fails the request).
  void accept(int32_t token) override;

 private:
  std::shared_ptr<grammar::TokenMasker> masker_;
  grammar::GrammarMatcher matcher_;
  std::optional<int32_t> reasoning_end_;
  bool in_reasoning_;
  std::vector<uint32_t> mask_;
};

/// The tool-call format `chat_template` renders (a probe: an assistant message with one call): HermesJson when the
/// call comes out as `<tool_call>\n{"name": ...`, else QwenXml (also without a template or when the probe fails).
grammar::ToolCallFormat tool_call_format_of(const chat::ChatTemplate* chat_template);

/// Compiles and caches the grammars of requests over one tokenizer's vocabulary.
class StructuredOutput {
 public:
  /// `eos_ids`: the model's EOS ids (allowed when a grammar may end); `vocab_rows`: the model's logits width;
  /// `tool_format`: how forced tool calls are written (tool_call_format_of the model's template).
  StructuredOutput(const Tokenizer& tokenizer, std::vector<int64_t> eos_ids, int64_t vocab_rows,
                   grammar::ToolCallFormat tool_format);

  /// The constraint `r` asks for (response_format json_object / json_schema, tool_choice required / named), or null
  /// when it asks for none. `starts_in_reasoning`: the rendered prompt leaves a `<think>` block open. Throws
  /// ApiError(400) naming the field when the schema or a tool's parameters cannot be compiled.
  std::shared_ptr<const TokenConstraint> constraint_for(const ApiRequest& r, bool starts_in_reasoning);

  /// Most grammars kept (least recently used ones are dropped).
  static constexpr size_t kCacheSize = 32;

 private:
  std::shared_ptr<grammar::TokenMasker> masker(const std::string& key, const std::function<std::shared_ptr<const grammar::Grammar>()>& compile);

  const Tokenizer& tokenizer_;
  std::vector<int32_t> eos_ids_;
  int64_t vocab_rows_;
  grammar::ToolCallFormat tool_format_;
  std::optional<int32_t> think_end_;
  std::mutex mutex_;
  std::shared_ptr<const grammar::TokenVocabulary> vocab_;  // made on first use
  std::list<std::pair<std::string, std::shared_ptr<grammar::TokenMasker>>> cache_;  // most recent first
};

}  // namespace flashnext::server
