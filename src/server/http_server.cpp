// HttpServer (server/http_server.h) on Boost.Asio (sockets, timers, strands, the worker pool) and Boost.Beast (the
// request parser, response serialization, chunked encoding).
//
// Every connection lives on its own strand. One steady_timer per connection bounds whatever it waits for: while a
// request is read, its expiry cancels the read (so that a 408 can still be written); while a response is written,
// it closes the socket. Closing is graceful: the send side is shut down, then what the client still sends is read
// and dropped for a moment, so that an answer sent before a body was read is not lost to a TCP reset.
#include "server/http_server.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_set>
#include <vector>

#include "core/error.h"

namespace flashnext::server {

namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;
using SteadyClock = std::chrono::steady_clock;

namespace {

constexpr size_t kHeaderReadBytes = 8 << 10;       // bytes read at once while a request line and headers arrive
constexpr size_t kBodyReadBytes = 64 << 10;        // while a body arrives
constexpr auto kLinger = std::chrono::seconds(2);  // how long a closing connection's input is drained
constexpr int kMaxRejecting = 64;                  // connections over the cap being answered 503 at once, at most

std::chrono::seconds secs(int s) {
  return std::chrono::seconds(s);
}

}  // namespace

class Connection;

struct HttpServer::Impl {
  Impl(HttpOptions o, HttpHandlers h) : options(std::move(o)), handlers(std::move(h)) {}

  HttpOptions options;
  HttpHandlers handlers;

  std::mutex stop_mu;  // guards stop_requested, and `stopping` against posting to the joined worker pool
  std::condition_variable stop_cv;
  bool stop_requested = false;
  std::atomic<bool> stopping{false};

  // Declared before the io_context: connections still queued in it when it is destroyed unregister here.
  std::mutex conns_mu;
  std::unordered_set<Connection*> conns;  // the open connections (each registers itself)
  std::condition_variable conns_cv;
  std::atomic<int> rejecting{0};

  net::io_context ioc;
  net::strand<net::io_context::executor_type> accept_strand = net::make_strand(ioc);
  tcp::acceptor acceptor{accept_strand};
  net::steady_timer accept_retry{accept_strand};
  std::unique_ptr<net::thread_pool> workers;

  void accept();
  void on_accept(error_code ec, tcp::socket socket);
  void reject(tcp::socket socket);
  /// Runs `task` on the worker pool unless the server is stopping; returns whether it was posted.
  bool post_work(std::function<void()> task) {
    std::lock_guard lock(stop_mu);
    if (stopping) return false;
    net::post(*workers, std::move(task));
    return true;
  }
  void fit_connection_limit();
};

// ------------------------------------------------------------------------------------------------------------------

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(HttpServer::Impl& srv, tcp::socket socket)
      : srv_(srv),
        socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        reader_(srv.options.max_request_line, srv.options.max_header_bytes) {
    std::lock_guard lock(srv_.conns_mu);
    srv_.conns.insert(this);
  }
  ~Connection() {
    std::lock_guard lock(srv_.conns_mu);
    srv_.conns.erase(this);
    srv_.conns_cv.notify_all();
  }

  /// On the connection's strand.
  void start() {
    error_code ec;
    socket_.set_option(tcp::no_delay(true), ec);
    const auto ep = socket_.remote_endpoint(ec);
    if (!ec) remote_ = ep.address().to_string();
    next_request();
  }

  /// The connection's strand.
  net::any_io_executor executor() { return socket_.get_executor(); }

  /// stop(): closes the connection unless a request is being handled or answered (posted to its strand).
  void stop_if_waiting() {
    if (phase_ == Phase::Idle || phase_ == Phase::Header || phase_ == Phase::Body) close_now();
  }

 private:
  enum class Phase { Idle, Header, Body, Handling, Writing, Closing, Closed };

  net::any_io_executor strand() { return socket_.get_executor(); }

  // Arms the timer: at `deadline`, a pending read is cancelled (read_timed_out_ set) or, with `close`, the socket
  // is closed.
  void arm(SteadyClock::time_point deadline, bool close) {
    timer_.expires_at(deadline);
    timer_.async_wait([self = shared_from_this(), close](error_code ec) {
      if (ec) return;  // re-armed or cancelled
      if (close) {
        self->close_now();
      } else {
        self->read_timed_out_ = true;
        error_code ignored;
        self->socket_.cancel(ignored);
      }
    });
  }

  void next_request() {
    if (srv_.stopping || phase_ == Phase::Closed) return close_now();
    reader_ = RequestReader(srv_.options.max_request_line, srv_.options.max_header_bytes);
    phase_ = Phase::Idle;
    if (buffer_.capacity() > 2 * kBodyReadBytes) buffer_.shrink_to_fit();
    if (buffer_.size() > 0) {  // a pipelined request arrived with the one before
      begin_header();
      parse();
    } else {
      read();
    }
  }

  void begin_header() {
    phase_ = Phase::Header;
    header_deadline_ = SteadyClock::now() + secs(srv_.options.header_timeout_s);
  }

  void read() {
    const HttpOptions& o = srv_.options;
    const auto now = SteadyClock::now();
    SteadyClock::time_point deadline;
    if (phase_ == Phase::Idle)
      deadline = now + secs(first_ ? o.read_timeout_s : o.keep_alive_timeout_s);
    else if (phase_ == Phase::Header)
      deadline = std::min(header_deadline_, now + secs(o.read_timeout_s));
    else
      deadline = std::min(body_deadline_, now + secs(o.read_timeout_s));
    read_timed_out_ = false;
    arm(deadline, /*close=*/false);
    auto space = buffer_.prepare(phase_ == Phase::Body ? kBodyReadBytes : kHeaderReadBytes);
    socket_.async_read_some(space, [self = shared_from_this()](error_code ec, size_t n) { self->on_read(ec, n); });
  }

  void on_read(error_code ec, size_t n) {
    timer_.cancel();
    if (phase_ == Phase::Closed) return;
    if (ec) {
      if (read_timed_out_) return on_timeout();
      if (ec == net::error::eof && reader_.feed_eof() && reader_.state() == RequestReader::State::Failed)
        spdlog::debug("http: {} closed the connection inside a request", remote_);
      return close_now();
    }
    buffer_.commit(n);
    if (phase_ == Phase::Idle) begin_header();
    parse();
  }

  void on_timeout() {
    const HttpOptions& o = srv_.options;
    const bool past_deadline = SteadyClock::now() >= (phase_ == Phase::Body ? body_deadline_ : header_deadline_);
    switch (phase_) {
      case Phase::Idle:
        return close_now();  // an idle connection: closed without a word
      case Phase::Header:
        return fail(
            408,
            past_deadline
                ? fmt::format("the request headers did not arrive within {} s (--header-timeout)", o.header_timeout_s)
                : fmt::format("no byte of the request arrived for {} s (--read-timeout)", o.read_timeout_s),
            nullptr);
      case Phase::Body:
        return fail(408,
                    past_deadline ? fmt::format("the request body did not arrive within {} s", o.body_timeout_s)
                                  : fmt::format("no byte of the request body arrived for {} s (--read-timeout)",
                                                o.read_timeout_s),
                    &reader_.request());
      default:
        return close_now();
    }
  }

  void parse() {
    using State = RequestReader::State;
    for (;;) {
      const auto data = buffer_.data();
      const size_t used = reader_.feed(std::string_view(static_cast<const char*>(data.data()), data.size()));
      buffer_.consume(used);
      switch (reader_.state()) {
        case State::NeedMore:
          if (used > 0 && buffer_.size() > 0) continue;
          return read();
        case State::Failed:
          return fail(reader_.error_status(), reader_.error_message(),
                      phase_ == Phase::Body ? &reader_.request() : nullptr);
        case State::HeaderDone:
          return on_headers();
        case State::Done:
          return dispatch();
      }
    }
  }

  void on_headers() {
    HttpRequest& req = reader_.request();
    req.remote_addr = remote_;
    first_ = false;
    std::optional<HttpResponse> early = srv_.handlers.headers(req);
    if (early) {
      const bool close = early->close || reader_.has_body() || !reader_.keep_alive();
      return send(std::move(*early), req.version, close, req.method == "HEAD");
    }
    phase_ = Phase::Body;
    body_deadline_ = SteadyClock::now() + secs(srv_.options.body_timeout_s);
    reader_.begin_body(srv_.options.max_body_bytes);
    if (reader_.state() == RequestReader::State::Done) return dispatch();
    if (reader_.state() == RequestReader::State::Failed)
      return fail(reader_.error_status(), reader_.error_message(), &req);
    if (reader_.expects_continue() && buffer_.size() == 0) {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      arm(SteadyClock::now() + secs(srv_.options.write_timeout_s), /*close=*/true);
      net::async_write(socket_, net::buffer(kContinue), [self = shared_from_this()](error_code ec, size_t) {
        self->timer_.cancel();
        if (ec) return self->close_now();
        self->parse();
      });
      return;
    }
    parse();
  }

  // Answers a refused request, then closes the connection.
  void fail(int status, const std::string& message, const HttpRequest* req) {
    HttpResponse res = srv_.handlers.error(status, message, req);
    send(std::move(res), req ? req->version : 11, /*close=*/true, /*head=*/false);
  }

  // Hands the whole request to a worker.
  void dispatch() {
    const bool keep_alive = reader_.keep_alive();
    HttpRequest req = reader_.take();
    phase_ = Phase::Handling;
    auto self = shared_from_this();
    auto task = [self, keep_alive, req = std::make_shared<HttpRequest>(std::move(req))]() mutable {
      self->handle(std::move(*req), keep_alive);
    };
    if (!srv_.post_work(std::move(task))) close_now();
  }

  // On a worker thread.
  void handle(HttpRequest req, bool keep_alive) {
    HttpResponse res;
    try {
      res = srv_.handlers.request(req);
    } catch (const std::exception& e) {  // the handler should have answered it: a backstop
      res = srv_.handlers.error(500, fmt::format("internal error: {}", e.what()), &req);
    }
    const int version = req.version;
    const bool head = req.method == "HEAD";
    std::string().swap(req.body);  // the body's memory goes back before a long answer
    const bool close = res.close || !keep_alive;
    if (!res.stream) {
      net::post(strand(), [self = shared_from_this(), res = std::move(res), version, close, head]() mutable {
        self->send(std::move(res), version, close, head);
      });
      return;
    }
    const bool chunked = version >= 11;
    bool ok = true, head_sent = false;
    auto send_head = [&] {  // before the first bytes: the status may still change until then
      head_sent = true;
      if (res.status_before_head) res.status = res.status_before_head();
      return write_head(res, version, close);
    };
    std::string out;
    for (bool more = true; ok && more;) {
      if (srv_.stopping) {  // the server stops: the body ends where it is (the handler cancels its work)
        ok = false;
        break;
      }
      out.clear();
      try {
        more = res.stream(out);
      } catch (const std::exception& e) {  // the body cannot be finished: the client sees it cut off
        spdlog::error("http: a streamed response failed: {}", e.what());
        if (!head_sent) {  // nothing sent yet: an error response instead
          if (res.on_end) res.on_end(false);
          HttpResponse error = srv_.handlers.error(500, fmt::format("internal error: {}", e.what()), &req);
          net::post(strand(), [self = shared_from_this(), error = std::move(error), version]() mutable {
            self->send(std::move(error), version, /*close=*/true, /*head=*/false);
          });
          return;
        }
        ok = false;
        break;
      }
      if (out.empty()) continue;
      if (!head_sent && !(ok = send_head())) break;
      ok = chunked ? write_blocking(http::make_chunk(net::buffer(out))) : write_blocking(net::buffer(out));
    }
    if (ok && !head_sent) ok = send_head();
    if (ok && chunked) ok = write_blocking(http::make_chunk_last());
    if (res.on_end) res.on_end(ok);
    net::post(strand(), [self = shared_from_this(), ok, again = ok && chunked && !close] {
      if (!ok) return self->close_now();
      if (again) return self->next_request();
      self->close_gracefully();
    });
  }

  // Writes the head of a streamed response (on a worker thread: waits for the write).
  bool write_head(const HttpResponse& res, int version, bool close) {
    http::response<http::empty_body> head{http::status(res.status), unsigned(version)};
    for (const auto& [k, v] : res.headers) head.insert(k, v);
    if (version >= 11) {
      head.chunked(true);
      if (close) head.set(http::field::connection, "close");
    } else {
      head.set(http::field::connection, "close");  // the body ends when the connection does
    }
    http::response_serializer<http::empty_body> sr{head};
    return run_write([&](auto done) { http::async_write_header(socket_, sr, std::move(done)); });
  }

  template <class Buffers>
  bool write_blocking(const Buffers& buffers) {
    return run_write([&](auto done) { net::async_write(socket_, buffers, std::move(done)); });
  }

  // Starts the write `start(handler)` on the strand, bounded by the write timeout, and waits for it (worker thread).
  template <class Start>
  bool run_write(Start&& start) {
    auto result = std::make_shared<std::promise<bool>>();
    std::future<bool> done = result->get_future();
    net::post(strand(), [this, self = shared_from_this(), &start, result] {
      if (phase_ == Phase::Closed) return result->set_value(false);
      phase_ = Phase::Writing;
      arm(SteadyClock::now() + secs(srv_.options.write_timeout_s), /*close=*/true);
      start([self, result](error_code ec, size_t) {
        self->timer_.cancel();
        result->set_value(!ec);
      });
    });
    return done.get();
  }

  // Writes a response with a fixed body (on the strand), then reads the next request or closes.
  void send(HttpResponse res, int version, bool close, bool head) {
    phase_ = Phase::Writing;
    auto on_end = std::move(res.on_end);
    const bool keep = !close && !srv_.stopping;
    auto finish = [self = shared_from_this(), on_end = std::move(on_end), keep](error_code ec, size_t) {
      self->timer_.cancel();
      if (on_end) on_end(!ec);
      if (ec) return self->close_now();
      if (keep) return self->next_request();
      self->close_gracefully();
    };
    arm(SteadyClock::now() + secs(srv_.options.write_timeout_s), /*close=*/true);
    auto prepare = [&](auto& msg) {
      for (const auto& [k, v] : res.headers) msg.insert(k, v);
      if (!keep)
        msg.set(http::field::connection, "close");
      else if (version < 11)
        msg.set(http::field::connection, "keep-alive");
    };
    if (head) {  // the head of the answer a GET would get, without its body
      auto msg = std::make_shared<http::response<http::empty_body>>(http::status(res.status), unsigned(version));
      prepare(*msg);
      msg->content_length(res.body.size());
      http::async_write(socket_, *msg, [msg, finish = std::move(finish)](error_code ec, size_t n) { finish(ec, n); });
    } else {
      auto msg = std::make_shared<http::response<http::string_body>>(http::status(res.status), unsigned(version));
      prepare(*msg);
      msg->body() = std::move(res.body);
      msg->prepare_payload();
      http::async_write(socket_, *msg, [msg, finish = std::move(finish)](error_code ec, size_t n) { finish(ec, n); });
    }
  }

  // Shuts the send side down, drops what the client still sends for a moment, then closes.
  void close_gracefully() {
    if (phase_ == Phase::Closed) return;
    phase_ = Phase::Closing;
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return close_now();
    arm(SteadyClock::now() + kLinger, /*close=*/true);
    drain();
  }

  void drain() {
    buffer_.clear();
    socket_.async_read_some(buffer_.prepare(kHeaderReadBytes), [self = shared_from_this()](error_code ec, size_t) {
      if (ec || self->phase_ == Phase::Closed) return self->close_now();
      self->drain();
    });
  }

  void close_now() {
    if (phase_ == Phase::Closed) return;
    phase_ = Phase::Closed;
    error_code ec;
    timer_.cancel();
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
  }

  HttpServer::Impl& srv_;
  tcp::socket socket_;
  net::steady_timer timer_;
  boost::beast::flat_buffer buffer_;
  RequestReader reader_;
  Phase phase_ = Phase::Idle;
  bool first_ = true;  // no request has arrived yet
  bool read_timed_out_ = false;
  SteadyClock::time_point header_deadline_{}, body_deadline_{};
  std::string remote_;
};

// ------------------------------------------------------------------------------------------------------------------

// A connection over the cap: answered 503 and closed.
class Rejection : public std::enable_shared_from_this<Rejection> {
 public:
  Rejection(HttpServer::Impl& srv, tcp::socket socket, std::string bytes)
      : srv_(srv), socket_(std::move(socket)), timer_(socket_.get_executor()), bytes_(std::move(bytes)) {
    ++srv_.rejecting;
  }
  ~Rejection() { --srv_.rejecting; }

  void start() {
    timer_.expires_after(std::chrono::seconds(1) + kLinger);
    timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (!ec) self->close();
    });
    net::async_write(socket_, net::buffer(bytes_), [self = shared_from_this()](error_code ec, size_t) {
      if (ec) return self->close();
      self->socket_.shutdown(tcp::socket::shutdown_send, ec);
      self->drain();
    });
  }

 private:
  void drain() {
    socket_.async_read_some(net::buffer(scratch_), [self = shared_from_this()](error_code ec, size_t) {
      if (ec) return self->close();
      self->drain();
    });
  }
  void close() {
    error_code ec;
    timer_.cancel();
    socket_.close(ec);
  }

  HttpServer::Impl& srv_;
  tcp::socket socket_;
  net::steady_timer timer_;
  std::string bytes_;
  char scratch_[1024];
};

void HttpServer::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc),
                        [this](error_code ec, tcp::socket socket) { on_accept(ec, std::move(socket)); });
}

void HttpServer::Impl::on_accept(error_code ec, tcp::socket socket) {
  if (ec == net::error::operation_aborted || stopping || !acceptor.is_open()) return;
  if (ec) {  // out of file descriptors, most likely: wait a little rather than spin
    spdlog::warn("http: accept failed: {}", ec.message());
    accept_retry.expires_after(std::chrono::milliseconds(100));
    accept_retry.async_wait([this](error_code e) {
      if (!e) accept();
    });
    return;
  }
  size_t open = 0;
  {
    std::lock_guard lock(conns_mu);
    open = conns.size();
  }
  if (open >= size_t(options.max_connections)) {
    reject(std::move(socket));
  } else {
    auto conn = std::make_shared<Connection>(*this, std::move(socket));
    net::dispatch(conn->executor(), [conn] { conn->start(); });
  }
  accept();
}

void HttpServer::Impl::reject(tcp::socket socket) {
  if (rejecting >= kMaxRejecting) {
    error_code ec;
    socket.close(ec);
    return;
  }
  HttpResponse res = handlers.error(
      503, fmt::format("the server has {} connections open, its limit (--max-connections)", options.max_connections),
      nullptr);
  http::response<http::string_body> msg{http::status(res.status), 11};
  for (const auto& [k, v] : res.headers) msg.insert(k, v);
  msg.set(http::field::connection, "close");
  msg.body() = std::move(res.body);
  msg.prepare_payload();
  std::ostringstream text;
  text << msg;
  auto r = std::make_shared<Rejection>(*this, std::move(socket), text.str());
  r->start();
}

void HttpServer::Impl::fit_connection_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  // Besides the connections: the worker threads' and the engine's files, the rejections, some slack.
  const rlim_t want = rlim_t(options.max_connections) + kMaxRejecting + 256;
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < want) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max == RLIM_INFINITY ? want : std::min(want, lim.rlim_max);
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < want) {
    const int fit = std::max(16, int(lim.rlim_cur) - kMaxRejecting - 256);
    spdlog::warn("http: --max-connections {} lowered to {}: the open-file limit (ulimit -n) is {}",
                 options.max_connections, fit, lim.rlim_cur);
    options.max_connections = fit;
  }
}

// ------------------------------------------------------------------------------------------------------------------

HttpServer::HttpServer(HttpOptions options, HttpHandlers handlers) {
  FN_CHECK(options.io_threads >= 1 && options.worker_threads >= 1, "http: io_threads and worker_threads must be >= 1");
  FN_CHECK(options.max_connections >= 1, "http: max_connections must be >= 1");
  FN_CHECK(options.header_timeout_s >= 1 && options.read_timeout_s >= 1 && options.body_timeout_s >= 1 &&
               options.write_timeout_s >= 1 && options.keep_alive_timeout_s >= 1,
           "http: every timeout must be at least 1 s");
  FN_CHECK(handlers.headers && handlers.request && handlers.error, "http: every handler must be set");
  impl_ = std::make_unique<Impl>(std::move(options), std::move(handlers));
  impl_->fit_connection_limit();
}

HttpServer::~HttpServer() {
  stop();
}

int HttpServer::bind() {
  Impl& m = *impl_;
  error_code ec;
  tcp::endpoint ep(net::ip::make_address(m.options.host, ec), static_cast<unsigned short>(m.options.port));
  if (ec) {  // a host name (e.g. localhost): its first address, as uvicorn (vLLM) and llama.cpp's server bind
    tcp::resolver resolver(m.ioc);
    const auto found = resolver.resolve(m.options.host, std::to_string(m.options.port), ec);
    if (ec || found.empty())
      fail("server: --host {} is neither an IP address nor a name this machine resolves ({})", m.options.host,
           ec ? ec.message() : std::string("no address"));
    ep = found.begin()->endpoint();
  }
  m.acceptor.open(ep.protocol(), ec);
  if (!ec) m.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) m.acceptor.bind(ep, ec);
  if (!ec) m.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    fail("server: cannot bind to {}:{} ({}; address in use, or not an address of this machine?)", m.options.host,
         m.options.port, ec.message());
  m.options.port = m.acceptor.local_endpoint().port();
  return m.options.port;
}

void HttpServer::run() {
  Impl& m = *impl_;
  m.workers = std::make_unique<net::thread_pool>(size_t(m.options.worker_threads));
  auto guard = net::make_work_guard(m.ioc);
  net::post(m.accept_strand, [&m] { m.accept(); });
  std::vector<std::thread> io;
  for (int i = 0; i < m.options.io_threads; ++i) io.emplace_back([&m] { m.ioc.run(); });
  {
    std::unique_lock lock(m.stop_mu);
    m.stop_cv.wait(lock, [&] { return m.stop_requested; });
    m.stopping = true;
  }
  net::post(m.accept_strand, [&m] {
    error_code ec;
    m.acceptor.close(ec);
    m.accept_retry.cancel();
  });
  {
    // The live connections, then their stops posted outside conns_mu: a connection that ends meanwhile may be
    // released here by its last owner, and its destructor takes conns_mu (under it, this thread deadlocked).
    std::vector<std::shared_ptr<Connection>> live;
    {
      std::lock_guard lock(m.conns_mu);
      for (Connection* c : m.conns)
        if (auto conn = c->weak_from_this().lock()) live.push_back(std::move(conn));
    }
    for (auto& conn : live) net::post(conn->executor(), [conn] { conn->stop_if_waiting(); });
  }
  m.workers->join();  // the requests being handled are answered to their end
  {
    std::unique_lock lock(m.conns_mu);
    m.conns_cv.wait_for(lock, std::chrono::seconds(m.options.write_timeout_s) + kLinger,
                        [&] { return m.conns.empty(); });
  }
  guard.reset();
  m.ioc.stop();
  for (auto& t : io) t.join();
}

void HttpServer::stop() {
  if (!impl_) return;
  std::lock_guard lock(impl_->stop_mu);
  impl_->stop_requested = true;
  impl_->stop_cv.notify_all();
}

}  // namespace flashnext::server
