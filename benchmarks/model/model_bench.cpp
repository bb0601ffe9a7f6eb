// CPU engine throughput on the bundled model (models/tiny-b-random): prefill and single-token decode, tokens/s.
//   ./build/benchmarks/bench_model [--benchmark_filter=...]
// Prefill feeds a prompt of N pseudo-random token ids in one forward (all logits rows, as `flashnext logits` does)
// on a fresh sequence; decode feeds one token at a time after a 128-token prefill (last row only).
#include <benchmark/benchmark.h>

#include <random>

#include "model/qwen4_exp/model.h"

namespace {

using namespace flashnext;

Model& model() {
  static std::unique_ptr<Model> m = Model::load(std::string(FLASHNEXT_SOURCE_DIR) + "/models/tiny-b-random");
  return *m;
}

std::vector<int32_t> prompt(int64_t n) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> d(0, int32_t(model().config().vocab_size - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& x : ids) x = d(rng);
  return ids;
}

void BM_Prefill(benchmark::State& state) {
  const auto ids = prompt(state.range(0));
  for (auto _ : state) {
    SequenceState seq = model().new_sequence();
    benchmark::DoNotOptimize(model().forward_tensor(seq, ids, LogitsMode::All));
  }
  state.counters["tokens/s"] = benchmark::Counter(double(ids.size()), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Prefill)->Arg(32)->Arg(128)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Decode(benchmark::State& state) {
  const auto ids = prompt(128);
  SequenceState seq = model().new_sequence();
  model().forward_tensor(seq, ids, LogitsMode::Last);
  int32_t next = 42;
  for (auto _ : state) {
    benchmark::DoNotOptimize(model().forward_tensor(seq, std::span<const int32_t>(&next, 1), LogitsMode::Last));
    if (seq.length + 1 >= model().config().max_position_embeddings) {
      state.PauseTiming();
      seq = model().new_sequence();
      model().forward_tensor(seq, ids, LogitsMode::Last);
      state.ResumeTiming();
    }
  }
  state.counters["tokens/s"] = benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
