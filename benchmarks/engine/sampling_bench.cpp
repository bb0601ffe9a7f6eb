// Sampler cost per token at the released vocabulary (248,320 logits), for the settings users run: greedy, plain
// sampling (T 1, no filter), the release's generation_config (T 1.0, top-k 20, top-p 0.95), top-p alone (a full
// nucleus search), and all penalties on. The logits are Gaussian (mean 0, sd 3), roughly the spread of a real model's
// logits.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "engine/sampling.h"

namespace {

constexpr int64_t kVocab = 248320;

std::vector<float> make_logits() {
  std::mt19937_64 rng(1);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> l(kVocab);
  for (auto& x : l) x = nd(rng);
  return l;
}

void run(benchmark::State& state, flashnext::SamplingParams p) {
  const auto base = make_logits();
  std::vector<int32_t> prompt(512);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(i * 97 % kVocab);
  p.seed = 3;
  flashnext::Sampler s(p, kVocab, prompt);
  std::vector<float> l;
  for (auto _ : state) {
    l = base;
    int32_t t = s.sample(l);
    s.accept(t);
    benchmark::DoNotOptimize(t);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_Greedy(benchmark::State& st) {
  flashnext::SamplingParams p;
  p.temperature = 0;
  run(st, p);
}
void BM_PlainSampling(benchmark::State& st) {  // T 1, no filter: a draw over the whole row
  flashnext::SamplingParams p;
  run(st, p);
}
void BM_ReleaseDefaults(benchmark::State& st) {
  flashnext::SamplingParams p;
  p.top_k = 20;
  p.top_p = 0.95;
  run(st, p);
}
void BM_TopPOnly(benchmark::State& st) {
  flashnext::SamplingParams p;
  p.top_p = 0.95;
  run(st, p);
}
void BM_AllPenalties(benchmark::State& st) {
  flashnext::SamplingParams p;
  p.top_k = 20;
  p.top_p = 0.8;
  p.min_p = 0.05;
  p.repetition_penalty = 1.1;
  p.presence_penalty = 1.5;
  p.frequency_penalty = 0.2;
  run(st, p);
}

BENCHMARK(BM_Greedy)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PlainSampling)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ReleaseDefaults)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TopPOnly)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AllPenalties)->Unit(benchmark::kMicrosecond);

}  // namespace
