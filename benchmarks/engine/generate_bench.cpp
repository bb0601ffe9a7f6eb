// End-to-end generation on the bundled tiny-b model (CPU backend): prefill of the chat2 fixture prompt (33 tokens)
// and greedy decode steps, as `flashnext generate` runs them. Reports prompt and decode tokens/s. The model is tiny
// (hidden 32, 4 layers) but its vocabulary is real (151,936), so lm_head and sampling dominate a decode step.
#include <benchmark/benchmark.h>

#include "engine/generator.h"
#include "engine/loaded_model.h"

namespace {

flashnext::LoadedModel& tiny_b() {
  static flashnext::LoadedModel m = flashnext::LoadedModel::load(FLASHNEXT_SOURCE_DIR "/models/tiny-b-random");
  return m;
}

void BM_TinyBGenerate(benchmark::State& state) {
  auto& m = tiny_b();
  const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(
      R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
          {"role": "user", "content": "Tell me a joke about GPUs."}])");
  const auto prompt = m.chat_prompt(messages);
  double prefill_s = 0, decode_s = 0;
  int64_t prompt_tokens = 0, decode_steps = 0;
  for (auto _ : state) {
    flashnext::SamplingParams p;
    p.temperature = 0;
    p.max_tokens = state.range(0);
    p.ignore_eos = true;
    auto gen = flashnext::generate(*m.model, m.tokenizer, m.generation, {prompt, p});
    prefill_s += gen.stats().prefill_seconds;
    decode_s += gen.stats().decode_seconds;
    prompt_tokens += gen.stats().prompt_tokens;
    decode_steps += gen.stats().decode_steps;
  }
  state.counters["prompt_tok/s"] = prompt_tokens / prefill_s;
  state.counters["decode_tok/s"] = decode_steps / decode_s;
}
BENCHMARK(BM_TinyBGenerate)->Arg(32)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
