#include "parallel/tcp_link.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <thread>

namespace flashnext {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {
/// Blocking sockets need an io_context to be made with, never run.
asio::io_context& blocking_context() {
  static asio::io_context context;
  return context;
}

std::string endpoint_str(const tcp::endpoint& e) {
  return e.address().to_string() + ":" + std::to_string(e.port());
}
}  // namespace

struct Link::Impl {
  explicit Impl(tcp::socket s) : socket(std::move(s)) {}
  tcp::socket socket;
  std::atomic<bool> read_down{false}, write_down{false};  ///< ended by shutdown() / stop_reading()
};

Link::Link(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  boost::system::error_code ec;
  const tcp::endpoint e = impl_->socket.remote_endpoint(ec);
  peer_ = ec ? std::string("(unknown peer)") : endpoint_str(e);
  impl_->socket.set_option(tcp::no_delay(true), ec);  // small collectives and calls: no Nagle delay
}

Link::~Link() = default;

std::unique_ptr<Link> Link::connect(const std::string& host, int port, double timeout_s, const std::string& what) {
  FN_CHECK(port > 0 && port < 65536, "{}: port {} is outside 1..65535", what, port);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::string last;
  for (;;) {
    boost::system::error_code ec;
    tcp::resolver resolver(blocking_context());
    const auto endpoints = resolver.resolve(host, std::to_string(port), ec);
    if (ec) {
      last = "cannot resolve '" + host + "': " + ec.message();
    } else {
      tcp::socket socket(blocking_context());
      asio::connect(socket, endpoints, ec);
      if (!ec) return std::unique_ptr<Link>(new Link(std::make_unique<Impl>(std::move(socket))));
      last = ec.message();
    }
    if (std::chrono::steady_clock::now() >= deadline)
      fail("{}: could not connect to {}:{} within {} s (last error: {})", what, host, port, timeout_s, last);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

void Link::send(std::span<const uint8_t> bytes) {
  const uint64_t n = bytes.size();
  std::array<asio::const_buffer, 2> bufs{asio::buffer(&n, sizeof n), asio::buffer(bytes.data(), bytes.size())};
  boost::system::error_code ec;
  asio::write(impl_->socket, bufs, ec);
  if (ec || impl_->write_down)
    fail("connection to {}: {}", peer_, impl_->write_down ? std::string("shut down") : "send failed: " + ec.message());
}

uint64_t Link::recv_length() {
  uint64_t n = 0;
  boost::system::error_code ec;
  asio::read(impl_->socket, asio::buffer(&n, sizeof n), ec);
  if (impl_->read_down) fail("connection to {}: shut down", peer_);
  if (ec == asio::error::eof) fail("connection to {}: the other end closed it", peer_);
  if (ec) fail("connection to {}: receive failed: {}", peer_, ec.message());
  return n;
}

std::vector<uint8_t> Link::recv(uint64_t max_bytes) {
  const uint64_t n = recv_length();
  FN_CHECK(n <= max_bytes, "connection to {}: a frame of {} bytes announced, at most {} expected", peer_, n, max_bytes);
  std::vector<uint8_t> out(static_cast<size_t>(n));
  boost::system::error_code ec;
  asio::read(impl_->socket, asio::buffer(out), ec);
  if (ec || impl_->read_down)
    fail("connection to {}: {}", peer_,
         impl_->read_down ? std::string("shut down") : "receive failed: " + ec.message());
  return out;
}

void Link::recv_into(std::span<uint8_t> out) {
  const uint64_t n = recv_length();
  FN_CHECK(n == out.size(), "connection to {}: a frame of {} bytes arrived, {} expected", peer_, n, out.size());
  boost::system::error_code ec;
  asio::read(impl_->socket, asio::buffer(out.data(), out.size()), ec);
  if (ec || impl_->read_down)
    fail("connection to {}: {}", peer_,
         impl_->read_down ? std::string("shut down") : "receive failed: " + ec.message());
}

void Link::stop_reading() {
  impl_->read_down = true;
  ::shutdown(impl_->socket.native_handle(), SHUT_RD);
}

bool Link::wait_readable(double timeout_s) {
  pollfd p{impl_->socket.native_handle(), POLLIN, 0};
  return ::poll(&p, 1, int(std::clamp(timeout_s * 1000.0, 0.0, 2.0e9))) > 0;
}

void Link::shutdown() {
  impl_->read_down = true;
  impl_->write_down = true;
  // The system call, not the socket object's: it may run while another thread is blocked in a read on the socket.
  ::shutdown(impl_->socket.native_handle(), SHUT_RDWR);
}

struct Listener::Impl {
  tcp::acceptor acceptor{blocking_context()};
};

Listener::Listener(int port) : impl_(std::make_unique<Impl>()) {
  FN_CHECK(port >= 0 && port < 65536, "--master-port {} is outside 0..65535", port);
  boost::system::error_code ec;
  const tcp::endpoint at(tcp::v4(), uint16_t(port));
  impl_->acceptor.open(at.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(at, ec);
  if (!ec) impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) fail("--master-port {}: cannot listen on it: {}", port, ec.message());
}

Listener::~Listener() = default;

int Listener::port() const {
  return impl_->acceptor.local_endpoint().port();
}

std::unique_ptr<Link> Listener::accept(double timeout_s, const std::string& waiting_for) {
  pollfd p{impl_->acceptor.native_handle(), POLLIN, 0};
  const int ms = timeout_s <= 0 ? -1 : int(std::min(timeout_s * 1000.0, 2.0e9));
  const int ready = ::poll(&p, 1, ms);
  if (ready == 0) fail("{}: nothing connected to port {} within {} s", waiting_for, port(), timeout_s);
  boost::system::error_code ec;
  tcp::socket socket(blocking_context());
  if (ready > 0) impl_->acceptor.accept(socket, ec);
  if (ready < 0 || ec) fail("{}: accept on port {} failed: {}", waiting_for, port(), ec.message());
  return std::unique_ptr<Link>(new Link(std::make_unique<Link::Impl>(std::move(socket))));
}

}  // namespace flashnext
