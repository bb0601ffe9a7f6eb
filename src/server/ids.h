// Random ids of the server's objects (completions, responses and their items, request ids).
#pragma once

#include <random>
#include <string>

namespace flashnext::server {

/// `n` random lowercase hexadecimal digits from a per-thread std::mt19937_64 seeded by std::random_device. Unique
/// enough for ids (64 bits of seed per thread); not for secrets.
inline std::string random_hex(int n) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(size_t(n > 0 ? n : 0));
  for (int i = 0; i < n; ++i) s += kHex[rng() & 15];
  return s;
}

}  // namespace flashnext::server
