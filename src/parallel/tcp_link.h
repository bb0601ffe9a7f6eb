// TCP connections between the processes (nodes) of a tensor-parallel group (docs/ENGINE.md "Tensor parallelism",
// several nodes): length-prefixed frames over a Boost.Asio stream socket, and the byte encoding of the messages they
// carry. Blocking calls; another thread may shut a link down to wake a call blocked on it.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"

namespace flashnext {

/// One end of a TCP connection that carries frames (a 64-bit little-endian length, then that many bytes).
/// send/recv may run on different threads; two sends (or two recvs) must not run at once.
class Link {
 public:
  /// Connects to `host`:`port` (a name or an address), retrying every 200 ms until `timeout_s` seconds passed (the
  /// other end may start later). Throws Error naming `what`, the address and the last connection error.
  static std::unique_ptr<Link> connect(const std::string& host, int port, double timeout_s, const std::string& what);
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  /// Sends one frame. Throws Error naming the peer when the connection is broken or was shut down.
  void send(std::span<const uint8_t> bytes);
  /// Receives one frame (at most `max_bytes`). Throws Error naming the peer when the connection closes, breaks, was
  /// shut down, or announces a frame larger than max_bytes.
  std::vector<uint8_t> recv(uint64_t max_bytes = uint64_t(1) << 36);
  /// Receives one frame into `out` (its size must be the frame's: an Error otherwise).
  void recv_into(std::span<uint8_t> out);
  /// Waits up to `timeout_s` seconds for bytes to read (or the end of the connection). False when none came.
  bool wait_readable(double timeout_s);
  /// Ends the connection in both directions: a send or recv blocked in another thread returns with an Error, the
  /// peer's reads end. Safe to call from any thread, more than once.
  void shutdown();
  /// Ends the reading direction only: a recv blocked in another thread returns with an Error; sends still work (a
  /// last message can still go out). Safe from any thread.
  void stop_reading();
  /// "address:port" of the other end.
  const std::string& peer() const { return peer_; }

 private:
  friend class Listener;
  struct Impl;
  explicit Link(std::unique_ptr<Impl> impl);
  uint64_t recv_length();
  std::unique_ptr<Impl> impl_;
  std::string peer_;
};

/// A listening TCP socket on every interface of this machine.
class Listener {
 public:
  /// Listens on `port` (0: a free port, see port()). Throws Error naming the port when it cannot be bound.
  explicit Listener(int port);
  ~Listener();
  /// The port listened on.
  int port() const;
  /// Waits up to `timeout_s` seconds for the next connection. Throws Error saying `waiting_for` when none came.
  std::unique_ptr<Link> accept(double timeout_s, const std::string& waiting_for);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Appends values to a message: integers and floats in this machine's byte order (the nodes of a group run the same
/// binary; the rendezvous checks a byte-order mark), strings and vectors with their lengths first.
class WireWriter {
 public:
  template <class T>
    requires std::is_arithmetic_v<T>
  WireWriter& put(T v) {
    return append(&v, sizeof(T));
  }
  WireWriter& put(const std::string& s) {
    put<uint64_t>(s.size());
    return append(s.data(), s.size());
  }
  template <class T>
    requires std::is_arithmetic_v<T>
  WireWriter& put(std::span<const T> v) {
    put<uint64_t>(v.size());
    return append(v.data(), v.size_bytes());
  }
  template <class T>
    requires std::is_arithmetic_v<T>
  WireWriter& put(const std::vector<T>& v) {
    return put(std::span<const T>(v));
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  WireWriter& append(const void* p, size_t n) {
    if (n == 0) return *this;
    const size_t at = bytes_.size();
    bytes_.resize(at + n);
    std::memcpy(bytes_.data() + at, p, n);
    return *this;
  }
  std::vector<uint8_t> bytes_;
};

/// Reads what a WireWriter wrote, in the same order. Throws Error naming `what` (the message and its sender) when
/// the message ends early or a length is impossible.
class WireReader {
 public:
  WireReader(std::span<const uint8_t> bytes, std::string what) : bytes_(bytes), what_(std::move(what)) {}
  template <class T>
    requires std::is_arithmetic_v<T>
  T get() {
    T v;
    std::memcpy(&v, take(sizeof(T)), sizeof(T));
    return v;
  }
  std::string get_string() {
    const uint64_t n = get<uint64_t>();
    const uint8_t* p = take(n);
    return std::string(reinterpret_cast<const char*>(p), size_t(n));
  }
  template <class T>
    requires std::is_arithmetic_v<T>
  std::vector<T> get_vector() {
    const uint64_t n = get<uint64_t>();
    FN_CHECK(n <= (bytes_.size() - pos_) / sizeof(T), "{}: malformed message (a vector of {} items past its end)",
             what_, n);
    std::vector<T> v(static_cast<size_t>(n));
    std::memcpy(v.data(), take(n * sizeof(T)), size_t(n * sizeof(T)));
    return v;
  }
  /// Throws Error unless every byte was read.
  void finish() const {
    FN_CHECK(pos_ == bytes_.size(), "{}: malformed message ({} bytes left over)", what_, bytes_.size() - pos_);
  }

 private:
  const uint8_t* take(uint64_t n) {
    FN_CHECK(n <= bytes_.size() - pos_, "{}: malformed message (ends after {} of {} bytes)", what_, bytes_.size(),
             pos_ + n);
    const uint8_t* p = bytes_.data() + pos_;
    pos_ += size_t(n);
    return p;
  }
  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
  std::string what_;
};

}  // namespace flashnext
