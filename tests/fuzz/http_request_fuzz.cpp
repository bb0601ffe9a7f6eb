// libFuzzer target for the request handling of `flashnext serve` that takes raw bytes: the HTTP layer's
// RequestReader (server/http_server.h: Boost.Beast's parser within the request-line, header and body limits) fed
// the input in pieces, one pipelined request after another, then the checks the server makes on a request's headers
// (check_post_headers) and, for a whole request, the body's parse by each endpoint's parser. Every outcome must be
// a request or a refusal with one of the statuses the layer answers and a bounded message; anything else (a crash,
// an exception, a sanitizer report, a parser that neither progresses nor asks for more) is a bug. The first input
// byte picks the size of the pieces. Built and run by scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "server/http_policy.h"
#include "server/http_server.h"
#include "server/openai_schema.h"

namespace {

using namespace flashnext;
using namespace flashnext::server;

constexpr size_t kMaxLine = 256, kMaxHeader = 1024, kMaxBody = 2048;  // small, so that the fuzzer reaches them
constexpr int64_t kVocab = 151669;

std::optional<std::string_view> header(const HttpRequest& r, std::string_view name, std::string& storage) {
  if (!r.has_header(name)) return std::nullopt;
  storage = r.header(name);
  return std::string_view(storage);
}

void check_refusal(int status, const std::string& message) {
  if (status != 400 && status != 413 && status != 414 && status != 431) std::abort();
  if (message.empty() || message.size() > 200) std::abort();
}

// The body of a whole request, through the endpoint parsers (as request_parser_fuzz.cpp does).
void parse_request_body(const HttpRequest& r) {
  try {
    const json doc = parse_body(r.body);
    const SamplingParams defaults;
    if (r.path == "/v1/chat/completions") parse_chat_request(doc, defaults, kVocab);
    if (r.path == "/v1/completions") parse_completion_request(doc, defaults, kVocab);
    if (r.path == "/tokenize") parse_tokenize_request(doc);
    if (r.path == "/detokenize") parse_detokenize_request(doc, kVocab);
  } catch (const ApiError& e) {
    if (e.status() != 400 || std::string_view(e.what()).size() > kMaxErrorMessage) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] % 64;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string pending;  // bytes received and not yet used (a connection's buffer)
  size_t offset = 0;
  for (int requests = 0; requests < 8; ++requests) {
    RequestReader reader(kMaxLine, kMaxHeader);
    bool ended = false;
    for (int steps = 0;; ++steps) {
      if (steps > 100000) std::abort();  // no progress
      const size_t used = reader.feed(pending);
      if (used > pending.size()) std::abort();
      pending.erase(0, used);
      const RequestReader::State state = reader.state();
      if (state == RequestReader::State::Failed) {
        check_refusal(reader.error_status(), reader.error_message());
        return 0;
      }
      if (state == RequestReader::State::HeaderDone) {
        const HttpRequest& r = reader.request();
        if (r.version != 10 && r.version != 11) std::abort();
        std::string a, b, c, d;
        if (r.method == "POST") {
          if (auto refused =
                  check_post_headers(header(r, "Content-Type", a), header(r, "Content-Length", b),
                                     header(r, "Transfer-Encoding", c), header(r, "Content-Encoding", d), kMaxBody)) {
            if (refused->status != 411 && refused->status != 413 && refused->status != 415) std::abort();
            if (refused->message.size() > 300) std::abort();
          }
        }
        reader.begin_body(kMaxBody);
        continue;
      }
      if (state == RequestReader::State::Done) {
        const HttpRequest r = reader.take();
        if (r.body.size() > kMaxBody) std::abort();
        parse_request_body(r);
        break;
      }
      // NeedMore: the next piece of input, or the end of the connection.
      if (offset >= input.size()) {
        if (reader.feed_eof() && reader.state() == RequestReader::State::Failed)
          check_refusal(reader.error_status(), reader.error_message());
        ended = true;
        break;
      }
      const size_t n = std::min(piece, input.size() - offset);
      pending.append(input.substr(offset, n));
      offset += n;
    }
    if (ended) break;
  }
  return 0;
}
