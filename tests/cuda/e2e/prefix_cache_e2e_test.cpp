// Prefix caching on the GPU: the scheduler over a ModelRunner on the CUDA backend takes state snapshots
// (Model::copy_state_slot: Ops::copy_rows of the GDN conv / recurrent and PLE conv slots on the device) and resumes
// requests from shared KV blocks. The tiny-a fixture: a second request sharing 0, 1, 15, 16 and 48 tokens with the
// first, and the same prompt again, give the tokens of the GPU engine without the cache, and logits within the GPU
// tolerance of the chunked prefill (the chunks from the resumed position on are the uncached run's, so only the
// float rounding of the kernels may differ).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/prefix_cache_test_util.h"
#include "model/fixture.h"
#include "ops/cuda/cuda_ops.h"

namespace flashnext::test {
namespace {

constexpr const char* kTinyA = "tests/data/fixtures/tiny-a/model";

std::vector<int32_t> in_vocab(std::vector<int32_t> ids, int64_t vocab) {
  for (auto& t : ids) t = int32_t(t % vocab);
  return ids;
}

TEST(PrefixCacheOnGpu, ASecondRequestSharingAPrefixGivesTheUncachedTokens) {
  ModelOptions o;
  o.ops = make_cuda_ops(0);
  auto model = Model::load(source_path(kTinyA), o);
  const int64_t vocab = model->config().vocab_size;
  const auto first = in_vocab(prompt_ids(80, 1), vocab);
  for (int64_t shared : {int64_t(0), int64_t(1), kBlock - 1, kBlock, 3 * kBlock, int64_t(80)}) {
    const auto second =
        concat(std::vector<int32_t>(first.begin(), first.begin() + shared), in_vocab(prompt_ids(20, 2), vocab));
    auto make = [&] {
      return std::vector<Request>{greedy_request("first", first, 8), greedy_request("second", second, 8)};
    };
    Engine plain(*model, {.prefix_caching = false});
    Engine cached(*model, {.prefix_caching = true});
    const auto want = run_each(plain, make());
    const auto got = run_each(cached, make());
    EXPECT_EQ(got[0].tokens, want[0].tokens) << "shared " << shared;
    EXPECT_EQ(got[1].tokens, want[1].tokens) << "shared " << shared;
    EXPECT_EQ(got[1].cached_tokens, shared / kBlock * kBlock) << "shared " << shared;
    EXPECT_LE(max_abs_diff(cached.runner.logits, plain.runner.logits), 1e-3) << "shared " << shared;
  }
}

TEST(PrefixCacheOnGpu, EvictionAndTheSamePromptAgainKeepTheTokens) {
  ModelOptions o;
  o.ops = make_cuda_ops(0);
  auto model = Model::load(source_path(kTinyA), o);
  const int64_t vocab = model->config().vocab_size;
  const auto a = in_vocab(prompt_ids(64, 3), vocab), b = in_vocab(prompt_ids(200, 4), vocab);
  auto make = [&] {
    return std::vector<Request>{greedy_request("a", a, 6), greedy_request("a again", a, 6), greedy_request("b", b, 6),
                                greedy_request("a after b", concat(a, in_vocab(prompt_ids(9, 5), vocab)), 6)};
  };
  // 16 blocks (one sequence of max_model_len 256): a keeps 4 cached, b needs 13 of the 12 left, so a block of a's is
  // evicted.
  Engine plain(*model, {.prefix_caching = false, .blocks = 16});
  Engine cached(*model, {.prefix_caching = true, .snapshots = 4, .blocks = 16});
  const auto want = run_each(plain, make());
  const auto got = run_each(cached, make());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << i;
  EXPECT_EQ(got[1].cached_tokens, 48);  // 63 positions at most: the snapshot after block 3
  EXPECT_GT(cached.sched->stats().prefix_cache_evictions, 0);
  EXPECT_EQ(cached.sched->stats().kv_blocks_used, 0);
}

}  // namespace
}  // namespace flashnext::test
