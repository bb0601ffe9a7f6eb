// Test helper shared by the engine tests on every backend: runs requests through a Scheduler to the end.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/scheduler.h"
#include "loader/memory_plan.h"
#include "model/qwen4_exp/model.h"

namespace flashnext::test {

/// A greedy request `id` for `prompt` that emits exactly `max_tokens` tokens (EOS ignored).
inline Request greedy_request(const std::string& id, std::vector<int32_t> prompt, int64_t max_tokens) {
  Request r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

/// Runs `requests` through a Scheduler over a ModelRunner of `model` (8 sequences at most, steps of at most
/// `max_num_batched_tokens` tokens, so prefill chunks and decode tokens mix) until no work is left; returns each
/// request's tokens in submission order. A request that ends with an error fails the calling test.
inline std::vector<std::vector<int32_t>> run_to_end(Model& model, std::vector<Request> requests,
                                                    int64_t max_num_batched_tokens) {
  StatePlan plan = state_plan(model.config(), 1, 4, 4);
  MemoryPlanner planner(plan, 16, int64_t(64) << 20, 8);
  ModelRunner runner(model, planner);
  Scheduler s(runner, std::move(planner),
              {.max_num_seqs = 8, .max_num_batched_tokens = max_num_batched_tokens, .max_model_len = 512});
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (Request& r : requests) {
    streams.push_back(r.stream);
    s.submit(std::move(r));
  }
  for (int i = 0; i < 100000 && s.step(); ++i) {
  }
  std::vector<std::vector<int32_t>> out;
  for (auto& st : streams) {
    std::vector<int32_t> tokens;
    for (;;) {
      auto u = st->wait(std::chrono::milliseconds(0));
      tokens.insert(tokens.end(), u.tokens.begin(), u.tokens.end());
      EXPECT_TRUE(u.error.empty()) << u.error;
      if (u.finish != EndReason::None || u.tokens.empty()) break;
    }
    out.push_back(tokens);
  }
  return out;
}

}  // namespace flashnext::test
