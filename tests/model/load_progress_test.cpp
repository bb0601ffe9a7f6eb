// Model::load's progress reports (ModelOptions::progress): the bytes consumed only grow, end at the total, and the
// total is the bytes of the checkpoint's language-model tensors (every tensor of the shards but mtp.* / visual.*,
// counted here from the raw safetensors headers).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "fixture.h"

using namespace flashnext;
using namespace flashnext::test;

namespace {

/// Bytes of the tensors of one safetensors file whose names do not start with an excluded prefix.
int64_t tensor_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(size_t(n), '\0');
  f.read(header.data(), std::streamsize(n));
  int64_t total = 0;
  const nlohmann::json doc = nlohmann::json::parse(header);
  for (const auto& [name, v] : doc.items()) {
    if (name == "__metadata__" || name.rfind("mtp.", 0) == 0 || name.find("visual.") != std::string::npos) continue;
    total += v["data_offsets"][1].get<int64_t>() - v["data_offsets"][0].get<int64_t>();
  }
  return total;
}

}  // namespace

TEST(LoadProgress, GrowsToTheBytesOfTheLanguageModelTensors) {
  const std::string dir = source_path("tests/data/fixtures/tiny-a/model");
  std::vector<std::pair<int64_t, int64_t>> calls;
  ModelOptions o;
  o.progress = [&](int64_t done, int64_t total) { calls.emplace_back(done, total); };
  auto model = Model::load(dir, o);
  ASSERT_GT(calls.size(), 10u);
  const int64_t want = tensor_bytes(dir + "/model-00001-of-00002.safetensors") +
                       tensor_bytes(dir + "/model-00002-of-00002.safetensors");
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].second, want) << "call " << i;
    if (i) {
      EXPECT_GE(calls[i].first, calls[i - 1].first) << "call " << i;
    }
  }
  EXPECT_EQ(calls.back().first, want);
  // Before the last call, the tensors loaded one by one account for nearly everything (only the PLE hash buffers,
  // checked but not loaded, are left for the final report).
  EXPECT_GT(double(calls[calls.size() - 2].first), 0.99 * double(want));
}
