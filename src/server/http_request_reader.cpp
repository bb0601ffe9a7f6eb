// RequestReader (server/http_server.h): Boost.Beast's request parser plus the request-line limit and the mapping of
// its errors to statuses. No sockets here, so that the fuzz target can feed it raw bytes.
#include <fmt/format.h>

#include <boost/beast/http.hpp>
#include <limits>

#include "server/http_server.h"

namespace flashnext::server {

namespace http = boost::beast::http;

namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

}  // namespace

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (iequals(k, name)) return v;
  }
  return {};
}

bool HttpRequest::has_header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (iequals(k, name)) return true;
  }
  return false;
}

struct RequestReader::Impl {
  Impl(size_t line, size_t header) : max_request_line(line), max_header_bytes(header) {
    parser.header_limit(std::uint32_t(std::min<size_t>(header, UINT32_MAX)));
    // Checked by begin_body, after the headers handler has seen Content-Length. (Not boost::none: Beast 1.74
    // compares a Content-Length with an empty optional as larger.)
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    parser.eager(false);  // stop at the end of the headers
  }

  void fail(int status, std::string message) {
    state = State::Failed;
    error_status = status;
    error_message = std::move(message);
  }

  size_t max_request_line, max_header_bytes;
  uint64_t max_body = 0;  // set by begin_body
  http::request_parser<http::string_body> parser;
  State state = State::NeedMore;
  bool header_seen = false;  // HeaderDone was reported
  bool body_begun = false;
  HttpRequest request;
  int error_status = 0;
  std::string error_message;
};

RequestReader::RequestReader(size_t max_request_line, size_t max_header_bytes)
    : impl_(std::make_unique<Impl>(max_request_line, max_header_bytes)) {}
RequestReader::~RequestReader() = default;
RequestReader::RequestReader(RequestReader&&) noexcept = default;
RequestReader& RequestReader::operator=(RequestReader&&) noexcept = default;

size_t RequestReader::feed(std::string_view data) {
  Impl& m = *impl_;
  if (m.state == State::Failed || m.state == State::Done || (m.state == State::HeaderDone && !m.body_begun)) return 0;
  if (!m.header_seen) {
    // The request line, checked before the parser sees it: 414 rather than the parser's header limit.
    const size_t eol = data.substr(0, m.max_request_line + 2).find('\n');
    const size_t line =
        eol == std::string_view::npos ? data.size() : (eol > 0 && data[eol - 1] == '\r' ? eol - 1 : eol);
    if (line > m.max_request_line) {
      m.fail(414, fmt::format("the request line is longer than {} bytes", m.max_request_line));
      return 0;
    }
  }
  if (m.body_begun && m.parser.chunked() && data.size() < 5) {
    // Beast 1.74 asserts that a put after the last chunk's size line ("0\r\n") brings at least 5 bytes
    // (basic_parser.ipp parse_chunk_header; fixed upstream in boostorg/beast#2861): hold such a put back until
    // 5 bytes are here. No deadlock: until the message is complete, the unused rest of a chunked body is its
    // last chunk at least ("0\r\n\r\n", 5 bytes) or a chunk's data with that still to come.
    m.state = State::NeedMore;
    return 0;
  }
  boost::beast::error_code ec;
  const size_t used = m.parser.put(boost::asio::const_buffer(data.data(), data.size()), ec);
  if (ec == http::error::need_more) {
    m.state = State::NeedMore;
    ec = {};
  } else if (ec == http::error::header_limit) {
    m.fail(431, fmt::format("the request line and headers are larger than {} bytes", m.max_header_bytes));
    return used;
  } else if (ec == http::error::body_limit) {
    m.fail(413, fmt::format("the request body is larger than {} bytes (--max-request-bytes)", m.max_body));
    return used;
  } else if (ec) {
    m.fail(400, m.header_seen ? fmt::format("malformed request body ({})", ec.message())
                              : fmt::format("malformed HTTP request ({})", ec.message()));
    return used;
  }
  if (!m.header_seen && m.parser.is_header_done()) {
    m.header_seen = true;
    const auto& msg = m.parser.get();
    HttpRequest& r = m.request;
    r.method = std::string(msg.method_string());
    r.target = std::string(msg.target());
    r.path = r.target.substr(0, r.target.find('?'));
    r.version = int(msg.version());
    for (const auto& f : msg) r.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    m.state = State::HeaderDone;
  } else if (m.parser.is_done()) {
    m.state = State::Done;
  } else {
    m.state = State::NeedMore;
  }
  return used;
}

bool RequestReader::feed_eof() {
  Impl& m = *impl_;
  if (!m.parser.got_some()) return false;
  if (m.state != State::Done && m.state != State::Failed)
    m.fail(400, "the connection ended before the request was complete");
  return true;
}

RequestReader::State RequestReader::state() const {
  return impl_->state;
}
bool RequestReader::started() const {
  return impl_->parser.got_some();
}
HttpRequest& RequestReader::request() {
  return impl_->request;
}

bool RequestReader::has_body() const {
  return impl_->parser.chunked() || impl_->parser.content_length().value_or(0) > 0;
}

std::optional<uint64_t> RequestReader::content_length() const {
  if (auto n = impl_->parser.content_length()) return *n;
  return std::nullopt;
}

bool RequestReader::expects_continue() const {
  const auto& msg = impl_->parser.get();
  return msg.version() >= 11 && iequals(msg[http::field::expect], "100-continue");
}

bool RequestReader::keep_alive() const {
  return impl_->parser.keep_alive();
}

void RequestReader::begin_body(uint64_t max_body_bytes) {
  Impl& m = *impl_;
  if (m.state != State::HeaderDone || m.body_begun) return;
  m.body_begun = true;
  m.max_body = max_body_bytes;
  if (content_length().value_or(0) > max_body_bytes) {
    m.fail(413, fmt::format("the request body is larger than {} bytes (--max-request-bytes)", max_body_bytes));
    return;
  }
  m.parser.body_limit(max_body_bytes);  // for chunked bodies, checked as each chunk's size arrives
  m.parser.eager(true);
  m.state = m.parser.is_done() ? State::Done : State::NeedMore;
}

HttpRequest RequestReader::take() {
  Impl& m = *impl_;
  HttpRequest r = std::move(m.request);
  r.body = std::move(m.parser.get().body());
  m.request = HttpRequest{};
  return r;
}

int RequestReader::error_status() const {
  return impl_->error_status;
}
const std::string& RequestReader::error_message() const {
  return impl_->error_message;
}

}  // namespace flashnext::server
