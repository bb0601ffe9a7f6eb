// The OpenAI-compatible HTTP server of `flashnext serve`: the OpenAI routes over the HTTP layer of
// server/http_server.h (Boost.Beast; connections run asynchronously, requests on a pool of worker threads).
//
// Endpoints: POST /v1/chat/completions and /v1/completions (streaming over SSE or not), POST /v1/responses (OpenAI's
// Responses API, streaming or not: translated to a chat request and answered from the same generation, see
// server/responses_api.h), GET /v1/models, GET /health, GET /version ({"version": git describe of the build}),
// GET /metrics (Prometheus text: flashnext_* metrics and the same values under vLLM's vllm:* names, labelled
// model_name and engine), POST /tokenize and /detokenize (vLLM's). Errors use the OpenAI
// error schema (server/api_error.h): 400 for a bad request, 401 for a wrong API key, 404 for an unknown route,
// 408 for headers or a body that arrive too slowly, 411 for a POST without a length, 413 for a body over
// --max-request-bytes, 414 for a request line over 8 KiB, 431 for headers over 64 KiB, 415 for a POST body that is
// not application/json (so that a web page cannot post to the server without a CORS preflight), 503 (with
// Retry-After) when the scheduler's waiting queue is full or the connection cap is reached, 500 for an internal
// failure.
//
// vLLM parity at the HTTP level: request fields the server does not know are ignored and logged once per name
// (ServerOptions::strict_requests brings back the 400); CORS is off unless origins are allowed
// (ServerOptions::cors, server/http_policy.h: preflights answered before authentication, Access-Control-Allow-Origin
// on every response to an allowed origin, errors and streams included); every response carries X-Request-Id (the
// client's, when it is 1 to 128 visible ASCII bytes, else a new 32-hex-digit id), which the request's log lines
// name; usage has prompt_tokens_details.cached_tokens, always 0 (there is no prefix cache yet).
//
// Hostile input: every limit is checked before the work it bounds: the body size before the body is read (from
// Content-Length) or while it is read, JSON nesting depth and element count while it is parsed
// (openai_schema.h JsonLimits), a text prompt's length before it is tokenized. Error messages quote at most a short
// excerpt of the request. Slow and idle connections cannot hold the server: a connection that waits for its headers
// or body holds no worker thread, the headers must arrive whole within ServerOptions::header_timeout_s and a body
// within body_timeout_s (deadlines, not idle timeouts), request line and headers are capped (8 KiB, 64 KiB), and at
// most ServerOptions::max_connections connections are open (one more is answered 503). Pipelined HTTP/1.1 requests
// are answered in order. After a large request the freed heap is returned to the system (malloc_trim; `flashnext
// serve` also maps blocks of 1 MiB or more on their own, M_MMAP_THRESHOLD). Request bodies with a Content-Encoding
// (gzip, ...) get 415: they are not decompressed.
//
// Each generation request runs on an HTTP worker thread: it renders and tokenizes the prompt, submits it to the
// Scheduler (engine/scheduler.h), then turns the tokens the engine thread produces into text (OutputProcessor:
// detokenization, stop strings), reasoning / tool calls (server/output_parsers.h) and JSON. The response is sent
// with chunked transfer encoding (also when not streaming; to an HTTP/1.0 client: delimited by closing the
// connection) so that a client that disconnects is noticed while its request waits or runs (a response with nothing
// to send writes a heartbeat every ServerOptions::heartbeat_ms: JSON whitespace before a non-streaming body, an SSE
// comment in a stream); its request is then cancelled and its memory freed. A failure in one request is
// answered on that request only. Caveat: once a non-streaming response has started, an engine failure can no
// longer change its status; the body is then an OpenAI error object with status 200 (on /v1/responses: a Response
// with status "failed" and its `error`).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "engine/generation_config.h"
#include "engine/scheduler.h"
#include "server/http_policy.h"
#include "server/openai_schema.h"
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
  /// HTTP worker threads: the most requests handled at once (a connection that waits for its request, or between
  /// requests, holds none; more requests wait for a free one). 0: max_num_seqs + max_waiting + 16.
  int http_threads = 0;
  /// Most open connections; one more is answered 503 (Retry-After) and closed. Lowered to what the open-file limit
  /// allows (the soft limit is raised towards the hard one as needed).
  int max_connections = 1024;

  // Request limits, checked before a body is read or parsed.
  /// Most bytes of a request body (after any Content-Encoding); a larger one gets 413 before it is read (when it
  /// declares its Content-Length) or as soon as it is past the limit. 0: default_max_request_bytes(max_model_len).
  size_t max_request_bytes = 0;
  JsonLimits json_limits;        ///< nesting depth and element count of a body's JSON (max_elements is raised to
                                 ///< 2 * max_model_len + 4096 when smaller, so that a full context of token ids fits)
  int header_timeout_s = 10;     ///< a request's line and headers must arrive whole within this long of their first
                                 ///< byte (else 408 and the connection is closed)
  int read_timeout_s = 10;       ///< a request on which no byte arrives for this long (headers or body) gets 408; a
                                 ///< new connection that sends nothing for this long is closed
  int body_timeout_s = 30;       ///< a body must arrive whole within this long of its first byte (else 408)
  int write_timeout_s = 10;      ///< a response write that makes no progress for this long drops the connection
  int keep_alive_timeout_s = 5;  ///< an idle keep-alive connection is closed after this long
  /// A request with nothing to send for this long writes a heartbeat (non-streaming: a space, JSON whitespace before
  /// the body; streaming: an SSE comment), so that a client that has gone is noticed while its request waits or
  /// runs: the failed write cancels it.
  int heartbeat_ms = 500;

  // vLLM parity (see the top of this file).
  /// Answer 400 to request fields this server does not know (the OpenAI API's behaviour) instead of ignoring them
  /// and logging each name once (vLLM's).
  bool strict_requests = false;
  CorsOptions cors;     ///< no allowed origin (default): no CORS headers, no preflights
  std::string version;  ///< GET /version's "version" (`flashnext serve`: git describe of the build)
  /// Why the engine cannot serve any more (empty: it can), asked by GET /health, which then answers 503 with it
  /// (vLLM's /health when the engine is dead): a tensor-parallel group over several nodes that failed
  /// (Model::failure). Unset: always healthy.
  std::function<std::string()> failure;
};

/// The default body limit: 1 MiB plus 32 bytes per token of the context, enough for a prompt of max_model_len tokens
/// as token ids (at most 7 bytes each) or as text (a token is 3 to 5 bytes of text on average; JSON's \uXXXX
/// escapes take 6 bytes per character), with room for the rest of the request.
size_t default_max_request_bytes(int64_t max_model_len);

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
