// The OpenAI-compatible HTTP server of `flashnext serve` (cpp-httplib; one thread per open connection).
//
// Endpoints: POST /v1/chat/completions and /v1/completions (streaming over SSE or not), GET /v1/models,
// GET /health, GET /metrics (Prometheus text), POST /tokenize and /detokenize (vLLM's). Errors use the OpenAI
// error schema (server/api_error.h): 400 for a bad request, 401 for a wrong API key, 404 for an unknown route,
// 503 when the scheduler's waiting queue is full, 500 for an internal failure.
//
// Each generation request runs on its HTTP thread: it renders and tokenizes the prompt, submits it to the
// Scheduler (engine/scheduler.h), then turns the tokens the engine thread produces into text (OutputProcessor:
// detokenization, stop strings), reasoning / tool calls (server/output_parsers.h) and JSON. The response is sent
// with chunked transfer encoding (also when not streaming) so that a client that disconnects is noticed while
// its request waits or runs; its request is then cancelled and its memory freed. A failure in one request is
// answered on that request only. Caveat: once a non-streaming response has started, an engine failure can no
// longer change its status; the body is then an OpenAI error object with status 200.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "engine/generation_config.h"
#include "engine/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace flashnext::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                              ///< 0: any free port (see Server::bind)
  std::string api_key;                          ///< empty: no authentication; else /v1/* need "Bearer KEY"
  std::vector<std::string> served_model_names;  ///< names the `model` field may take; the first is reported
  std::string model_dir;                        ///< reported as the model's `root`
  bool reasoning_parser = true;                 ///< split <think>...</think> into reasoning_content
  /// Reject (400) chat requests whose messages or tools contain the text of a special token (e.g. "<|im_start|>"):
  /// the rendered prompt is tokenized with special-token text parsed, so such text would inject control tokens.
  bool reject_control_token_text = false;
  int http_threads = 0;  ///< 0: max_num_seqs + max_waiting + 16
};

class Server {
 public:
  /// All references must outlive the server. `chat_template` may be null (then chat requests get 400).
  /// Throws Error when `options.served_model_names` is empty.
  Server(Scheduler& scheduler, const Tokenizer& tokenizer, const chat::ChatTemplate* chat_template,
         const GenerationConfig& generation, ServerOptions options);
  ~Server();

  /// Binds host:port and returns the port bound. Throws Error when the address cannot be bound.
  int bind();
  /// Serves until stop() (blocking). bind() first.
  void run();
  /// Stops serving (any thread); run() returns.
  void stop();

  struct Impl;  ///< opaque (server.cpp)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashnext::server
