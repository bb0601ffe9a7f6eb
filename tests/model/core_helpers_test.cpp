// The small core helpers the CPU engine uses: the .npy writer/reader and the thread pool.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <fstream>

#include "core/error.h"
#include "core/npy.h"
#include "core/thread_pool.h"

namespace flashnext {
namespace {

// The header layout NumPy documents: magic, version 1.0, header length, dict, data aligned to 64 bytes.
TEST(Npy, WritesNumpyFormat1AndReadsItBack) {
  const std::string path = ::testing::TempDir() + "/npy_test.npy";
  const float data[6] = {1, 2, 3, 4, 5, -0.5f};
  write_npy(path, DType::F32, {2, 3}, data);
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const size_t hlen = uint8_t(bytes[8]) | size_t(uint8_t(bytes[9])) << 8;
  EXPECT_EQ((10 + hlen) % 64, 0u);
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  EXPECT_EQ(bytes.substr(10, dict.size()), dict);
  EXPECT_EQ(bytes[10 + hlen - 1], '\n');
  EXPECT_EQ(bytes.size(), 10 + hlen + sizeof data);
  const NpyArray a = read_npy(path);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::vector<float>(a.f32(), a.f32() + 6), std::vector<float>(data, data + 6));
  const int64_t one[1] = {7};
  write_npy(path, DType::I64, {1}, one);
  EXPECT_EQ(read_npy(path).shape, (std::vector<int64_t>{1}));  // "(1,)"
  std::remove(path.c_str());
}

TEST(Npy, BadFilesAreErrors) {
  EXPECT_THROW(read_npy(::testing::TempDir() + "/does-not-exist.npy"), Error);
  const std::string path = ::testing::TempDir() + "/not_npy.npy";
  std::ofstream(path) << "hello";
  EXPECT_THROW(read_npy(path), Error);
  std::remove(path.c_str());
}

TEST(ThreadPool, CoversEveryIndexOnceAndRethrows) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 7, 1000}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.parallel_for(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
      // Nested loops run serially inside a range.
      pool.parallel_for(4, 1, [](int64_t, int64_t) {});
    });
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  }
  EXPECT_THROW(pool.parallel_for(100, 1,
                                 [](int64_t b, int64_t) {
                                   if (b == 0) throw Error("boom");
                                 }),
               Error);
  int64_t total = 0;  // still usable after an exception
  std::mutex mu;
  pool.parallel_for(10, 1, [&](int64_t b, int64_t e) {
    std::lock_guard<std::mutex> lock(mu);
    total += e - b;
  });
  EXPECT_EQ(total, 10);
}

}  // namespace
}  // namespace flashnext
