// The HTTP/1.1 layer of `flashnext serve`: connections, request parsing, timeouts and response framing, on
// Boost.Beast + Boost.Asio. The OpenAI routes (server.cpp) see only the types of this file, not the library.
//
// Threads: a few I/O threads (HttpOptions::io_threads) run every connection asynchronously: accepting, reading
// headers and bodies, writing fixed responses. A request is handed to one of HttpOptions::worker_threads only once it
// has arrived whole, so a connection that is idle or sends slowly holds a socket, never a worker. A worker runs
// HttpHandlers::request (which may block: tokenizing, waiting for the engine) and writes a streamed body chunk by
// chunk. The requests of one connection are handled one after the other and answered in their order (HTTP/1.1
// pipelining; bytes of the next request that arrive early wait in the connection's buffer).
//
// Limits (each answered with HttpHandlers::error, then the connection is closed):
//   - at most HttpOptions::max_connections open connections; one more is answered 503 at once and closed;
//   - a request line over max_request_line bytes: 414; headers over max_header_bytes in all: 431;
//   - the headers must arrive whole within header_timeout_s of their first byte (a deadline, not an idle
//     timeout, so that a byte every few seconds does not keep a connection): else 408;
//   - a body must arrive whole within body_timeout_s of the end of its headers: else 408; a body larger than
//     max_body_bytes: 413 (from Content-Length, before it is read, or as soon as a chunked one passes it);
//   - no byte for read_timeout_s while a request is being read: 408; an idle keep-alive connection is closed
//     (silently) after keep_alive_timeout_s, a new one that sends nothing after read_timeout_s;
//   - a response write that does not complete within write_timeout_s drops the connection.
// HTTP/1.0 clients get no chunked encoding: a streamed body ends when the connection closes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/http_policy.h"

namespace flashnext::server {

/// A request as the routes see it.
struct HttpRequest {
  std::string method;       ///< as sent ("GET", "POST", ...)
  std::string target;       ///< the request target as sent ("/v1/models?x=1")
  std::string path;         ///< the target without its query ("/v1/models")
  int version = 11;         ///< 10 for HTTP/1.0, 11 for HTTP/1.1
  HeaderList headers;       ///< in the order received, names as sent
  std::string body;         ///< the whole body (empty before HttpHandlers::request)
  std::string remote_addr;  ///< the peer's IP address
  /// Free for the handlers: HttpHandlers::headers may set it (the request id), request and error see it.
  std::string request_id;

  /// The value of the first header named `name` (compared case-insensitively); "" when there is none.
  std::string header(std::string_view name) const;
  /// Whether a header named `name` (case-insensitively) was sent.
  bool has_header(std::string_view name) const;
};

/// A response. Content-Length, Transfer-Encoding and Connection are set by the HTTP layer; everything else (the
/// Content-Type too) comes from `headers`.
struct HttpResponse {
  int status = 200;
  HeaderList headers;
  std::string body;  ///< the whole body, when `stream` is empty
  /// A body produced piece by piece (sent chunked to HTTP/1.1 clients, delimited by closing the connection to
  /// HTTP/1.0 ones): called on the worker thread again and again; it appends what is to be sent now to `out`
  /// (possibly nothing) and returns false once the body is complete. It should not block for long (a few tens of
  /// milliseconds), and it is not called again after a write failed.
  std::function<bool(std::string& out)> stream;
  /// For a streamed body: the head is written when the body first has bytes to send (or ends), not before, and this
  /// (if set) is called just then: its result replaces `status` (a request that failed before anything was sent
  /// answers with its error status instead of 200).
  std::function<int()> status_before_head;
  /// Called once when the response has ended (on the thread that wrote its last byte): `complete` false when it
  /// could not be sent whole (the client went away, a write timed out, the server stopped).
  std::function<void(bool complete)> on_end;
  bool close = false;  ///< close the connection after this response
};

/// What the HTTP layer calls. Exceptions from them are not caught: they must answer every failure themselves.
struct HttpHandlers {
  /// Called on an I/O thread when a request's headers have arrived, before its body is read; must not block.
  /// Returns a response to send without reading the body (the connection is then closed if a body was
  /// announced), or nullopt to read the body and call `request`.
  std::function<std::optional<HttpResponse>(HttpRequest& request)> headers;
  /// Called on a worker thread with the whole request; may block.
  std::function<HttpResponse(HttpRequest& request)> request;
  /// The answer to a request the HTTP layer refuses (408, 413, 414, 431, 400 malformed; 503 when a connection is
  /// over the cap), with a message in English. `request` is null when its headers were not parsed. Called on an
  /// I/O thread; must not block.
  std::function<HttpResponse(int status, const std::string& message, const HttpRequest* request)> error;
};

/// Settings of HttpServer. Times in seconds.
struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                     ///< 0: any free port
  int io_threads = 2;                  ///< threads that run the connections (all of their I/O is asynchronous)
  int worker_threads = 16;             ///< threads that run HttpHandlers::request: the most requests handled at once
  int max_connections = 1024;          ///< open connections at most (lowered to what RLIMIT_NOFILE allows)
  size_t max_request_line = 8192;      ///< bytes of the request line at most (else 414)
  size_t max_header_bytes = 64 << 10;  ///< bytes of request line and headers at most (else 431)
  uint64_t max_body_bytes = 1 << 20;   ///< bytes of a body at most (after chunked decoding; else 413)
  int header_timeout_s = 10;           ///< the headers must arrive whole within this long of their first byte
  int read_timeout_s = 10;             ///< a request being read with no byte arriving for this long gets 408
  int body_timeout_s = 30;             ///< a body must arrive whole within this long of the end of its headers
  int write_timeout_s = 10;            ///< a write (a fixed response, one chunk) must complete within this long
  int keep_alive_timeout_s = 5;        ///< an idle keep-alive connection is closed after this long
};

/// The server: bind(), then run() on one thread until another calls stop().
class HttpServer {
 public:
  /// Throws Error when an option is out of range (a thread count or limit below 1).
  HttpServer(HttpOptions options, HttpHandlers handlers);
  ~HttpServer();

  /// Binds and listens on options.host:options.port; returns the port bound (the one chosen for port 0). Throws
  /// Error when the address cannot be bound.
  int bind();
  /// Serves until stop(): runs the I/O and worker threads and returns once they have ended. On stop, the
  /// listening socket is closed and so are the connections that wait for a request; a streamed body being sent
  /// ends where it is (its on_end gets false), a fixed response being handled or written is sent whole (each write
  /// bounded by write_timeout_s).
  void run();
  /// Makes run() return (any thread, also before run(); idempotent).
  void stop();

  struct Impl;  ///< opaque (http_server.cpp)

 private:
  std::unique_ptr<Impl> impl_;
};

/// Parses one request from bytes as they arrive (Boost.Beast's HTTP/1 parser), within the limits of HttpOptions:
/// the connection's reader, and the entry the fuzz target (tests/fuzz/http_request_fuzz.cpp) feeds raw bytes.
class RequestReader {
 public:
  enum class State {
    NeedMore,    ///< feed more bytes
    HeaderDone,  ///< the headers are in (request() has them): begin_body(), then feed the body
    Done,        ///< the request is whole: take() it; bytes not used by feed() belong to the next request
    Failed,      ///< malformed or over a limit: error_status() and error_message() say how
  };

  RequestReader(size_t max_request_line, size_t max_header_bytes);
  ~RequestReader();
  RequestReader(RequestReader&&) noexcept;
  RequestReader& operator=(RequestReader&&) noexcept;

  /// Parses what it can of `data` (the bytes not used by the previous calls, then more) and returns how many
  /// bytes it used; the caller keeps the rest and feeds them again with what arrives next. Stops at the end of
  /// the headers (HeaderDone) and at the end of the request (Done). Not to be called in the states Failed or
  /// Done, nor in HeaderDone before begin_body().
  size_t feed(std::string_view data);
  /// The connection ended (EOF) after the bytes fed so far: Failed (400, a partial request) unless nothing had
  /// arrived. Returns whether any byte of a request had arrived.
  bool feed_eof();
  State state() const;
  /// Whether any byte of the request has been parsed.
  bool started() const;

  /// After HeaderDone: the request line and headers (body empty), for the headers handler.
  HttpRequest& request();
  /// After HeaderDone: whether a body was announced (Content-Length > 0, or chunked).
  bool has_body() const;
  /// After HeaderDone: Content-Length (nullopt when absent or chunked).
  std::optional<uint64_t> content_length() const;
  /// Whether the client asked for "Expect: 100-continue" (HTTP/1.1).
  bool expects_continue() const;
  /// Whether the connection may serve another request after this one (HTTP/1.1 without "Connection: close",
  /// HTTP/1.0 with "Connection: keep-alive").
  bool keep_alive() const;
  /// After HeaderDone: reads the body, at most `max_body_bytes` of it (Failed with 413 past that).
  void begin_body(uint64_t max_body_bytes);
  /// After Done: the request with its body.
  HttpRequest take();

  /// After Failed: the status to answer (400, 413, 414 or 431) and why, in English.
  int error_status() const;
  const std::string& error_message() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashnext::server
