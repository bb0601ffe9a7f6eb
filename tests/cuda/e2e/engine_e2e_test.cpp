// The serving engine on the GPU: the continuous-batching Scheduler over a ModelRunner on the CUDA backend, with the
// next tokens sampled on the GPU (Ops::sample_tokens) for plain requests. Greedy requests of the tiny-a fixture,
// running together, give the reference's greedy ids; a request with a repetition penalty samples on the host and
// gives what the CPU backend's engine gives.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/scheduler.h"
#include "engine/scheduler_test_util.h"
#include "gpu_model_options.h"
#include "loader/memory_plan.h"
#include "model/fixture.h"
#include "ops/cuda/cuda_ops.h"

namespace flashnext::test {
namespace {

constexpr const char* kTinyA = "tests/data/fixtures/tiny-a/model";

/// The requests run together to the end, steps of at most 64 tokens.
std::vector<std::vector<int32_t>> serve(Model& model, std::vector<Request> requests) {
  return run_to_end(model, std::move(requests), 64);
}

TEST(EngineOnGpu, GreedyRequestsSampledOnTheGpuGiveTheReferenceIds) {
  auto model = Model::load(source_path(kTinyA), gpu_model_options());
  ASSERT_TRUE(model->ops().samples_on_device());
  Reference ref("tiny-a");
  std::vector<Request> requests;
  std::vector<std::vector<int64_t>> want;
  for (const char* p : {"short", "eos_inside", "single", "eos_first"}) {
    requests.push_back(greedy_request(p, ref.ids(p), 16));
    want.push_back(ref.i64(std::string(p) + ".greedy_ids"));
  }
  const auto got = serve(*model, std::move(requests));
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(std::vector<int64_t>(got[i].begin(), got[i].end()), want[i]) << "request " << i;
}

TEST(EngineOnGpu, PenalisedRequestSamplesOnTheHostLikeTheCpuEngine) {
  auto gpu = Model::load(source_path(kTinyA), gpu_model_options());
  Model& cpu = shared_model(kTinyA);
  Reference ref("tiny-a");
  auto make = [&] {
    Request r = greedy_request("penalised", ref.ids("short"), 16);
    r.sampling.repetition_penalty = 1.3;
    std::vector<Request> v;
    v.push_back(std::move(r));
    return v;
  };
  EXPECT_EQ(serve(*gpu, make()), serve(cpu, make()));
}

}  // namespace
}  // namespace flashnext::test
