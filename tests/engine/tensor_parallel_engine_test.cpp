// The serving engine under tensor parallelism on the CPU (what `serve --tp N` runs): the continuous-batching
// Scheduler over a ModelRunner whose model is split over 2 and 4 ranks gives the reference's greedy ids for requests
// running together, and a seeded sampled request draws TP 1's tokens (the logits agree to float rounding and every
// rank holds the same ones); with the prefix cache a resumed request restores every rank's state slot.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/prefix_cache_test_util.h"
#include "engine/scheduler.h"
#include "engine/scheduler_test_util.h"
#include "loader/memory_plan.h"
#include "model/fixture.h"

namespace flashnext::test {
namespace {

constexpr const char* kTinyA = "tests/data/fixtures/tiny-a/model";

/// The requests run together to the end, steps of at most 32 tokens (prefill chunks and decode tokens mix).
std::vector<std::vector<int32_t>> serve(Model& model, std::vector<Request> requests) {
  return run_to_end(model, std::move(requests), 32);
}

Request request(const std::string& id, std::vector<int32_t> prompt, int64_t max_tokens, double temperature = 0) {
  Request r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.sampling.temperature = temperature;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  if (temperature > 0) r.sampling.seed = 1234;
  return r;
}

class EngineTp : public ::testing::TestWithParam<int> {};

TEST_P(EngineTp, RequestsRunningTogetherGiveTheReferenceAndTp1Tokens) {
  ModelOptions o;
  o.tp = GetParam();
  auto model = Model::load(source_path(kTinyA), o);
  ASSERT_EQ(model->tp(), GetParam());
  Reference ref("tiny-a");
  auto make = [&] {
    std::vector<Request> requests;
    for (const char* p : {"short", "eos_inside", "single", "eos_first"}) requests.push_back(request(p, ref.ids(p), 16));
    requests.push_back(request("sampled", ref.ids("long"), 12, 0.8));
    return requests;
  };
  const auto got = serve(*model, make());
  const char* names[] = {"short", "eos_inside", "single", "eos_first"};
  for (size_t i = 0; i < 4; ++i) {
    const std::vector<int64_t> want = ref.i64(std::string(names[i]) + ".greedy_ids");
    EXPECT_EQ(std::vector<int64_t>(got[i].begin(), got[i].end()), want) << names[i];
  }
  EXPECT_EQ(got, serve(shared_model(kTinyA), make()));
}

TEST_P(EngineTp, PrefixCacheSnapshotsEveryRankAndResumesWithTheUncachedTokens) {
  ModelOptions o;
  o.tp = GetParam();
  auto model = Model::load(source_path(kTinyA), o);
  const auto first = prompt_ids(70, 40);
  const auto second = concat(std::vector<int32_t>(first.begin(), first.begin() + 50), prompt_ids(12, 41));
  const int32_t vocab = int32_t(model->config().vocab_size);
  auto in_vocab = [&](std::vector<int32_t> ids) {
    for (auto& t : ids) t %= vocab;
    return ids;
  };
  auto make = [&] {
    return std::vector<Request>{greedy_request("first", in_vocab(first), 6),
                                greedy_request("second", in_vocab(second), 6)};
  };
  Engine plain(*model, {.prefix_caching = false});
  Engine cached(*model, {.prefix_caching = true});
  const auto want = run_each(plain, make());
  const auto got = run_each(cached, make());
  EXPECT_EQ(got[1].cached_tokens, 48);
  EXPECT_EQ(got[0].tokens, want[0].tokens);
  EXPECT_EQ(got[1].tokens, want[1].tokens);
  EXPECT_EQ(cached.runner.logits, plain.runner.logits);
}

INSTANTIATE_TEST_SUITE_P(Degrees, EngineTp, ::testing::Values(2, 4));

}  // namespace
}  // namespace flashnext::test
