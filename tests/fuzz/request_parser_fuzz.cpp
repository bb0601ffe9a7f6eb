// libFuzzer target for the request parser of `flashnext serve` (server/openai_schema.h): any byte string given as
// a body to each endpoint's parser (the Responses API's translation included) must either parse or be refused with
// ApiError(400) with a bounded message; anything else (a crash, another exception, a sanitizer report, a message
// quoting unbounded input) is a bug. Built and run by scripts/fuzz.sh (clang, -fsanitize=fuzzer,address,undefined).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/openai_schema.h"
#include "server/responses_api.h"

namespace {

using namespace flashnext;
using namespace flashnext::server;

constexpr int64_t kVocab = 151669;  // Qwen3's

// Aborts (a finding) when an error message or param is longer than the server's backstop allows.
void check_bounded(const ApiError& e) {
  if (std::string_view(e.what()).size() > kMaxErrorMessage || e.param().size() > kMaxErrorParam) std::abort();
  if (e.status() != 400) std::abort();
}

template <class F>
void expect_parse_or_400(F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    check_bounded(e);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  json doc;
  try {
    doc = parse_body(body);
  } catch (const ApiError& e) {
    check_bounded(e);
    return 0;
  }
  if (describe(doc).size() > 200) std::abort();
  const SamplingParams defaults;
  expect_parse_or_400([&] { parse_chat_request(doc, defaults, kVocab); });
  expect_parse_or_400([&] { parse_completion_request(doc, defaults, kVocab); });
  expect_parse_or_400([&] { parse_tokenize_request(doc); });
  expect_parse_or_400([&] { parse_detokenize_request(doc, kVocab); });
  // /v1/responses: the translation, then the chat parse of what it made, its errors renamed as the server does.
  expect_parse_or_400([&] {
    const ResponsesRequest rr = translate_responses_request(doc);
    try {
      parse_chat_request(rr.chat, defaults, kVocab);
    } catch (const ApiError& e) {
      check_bounded(rr.remap(e));
    }
  });
  return 0;
}
