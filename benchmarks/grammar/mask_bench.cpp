// Token-mask cost for the real Qwen3 vocabulary (models/tiny-b-random/tokenizer.json, 151669 ids), one thread:
//   - BM_MaskWarm/<state>: fill_mask at a state whose positions are cached (the steady state of a decode);
//   - BM_MaskCold/<state>: the same with an empty cache (the first visit of each position pays its trie walk);
//   - BM_WalkWarm / BM_WalkCold: mask + accept_token per token over 20 whole generated JSON documents (typical decode),
//     with the cache warm / starting empty;
//   - BM_VocabularyBuild, BM_CompileSchema: one-off costs.
//   build/benchmarks/bench_grammar [--benchmark_filter=Warm]
#include <benchmark/benchmark.h>

#include <filesystem>
#include <random>

#include "grammar/json_schema.h"
#include "grammar/token_mask.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace flashnext;
using namespace flashnext::grammar;

const char* kSchema = R"({"type":"object","properties":{
  "name":{"type":"string"},
  "age":{"type":"integer","minimum":0},
  "email":{"type":"string","format":"email"},
  "role":{"enum":["admin","editor","viewer"]},
  "tags":{"type":"array","items":{"type":"string"},"maxItems":8},
  "address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"},
             "zip":{"type":"string","minLength":5,"maxLength":10}},"required":["city"]},
  "scores":{"type":"array","items":{"type":"number"}}},
  "required":["name","age","role"]})";

const Tokenizer& tokenizer() {
  static const Tokenizer t = Tokenizer::load(std::filesystem::path(FLASHNEXT_SOURCE_DIR) / "models/tiny-b-random");
  return t;
}
std::shared_ptr<const TokenVocabulary> vocab() {
  static auto v = TokenVocabulary::from_tokenizer(tokenizer(), {*tokenizer().token_to_id("<|im_end|>"),
                                                                *tokenizer().token_to_id("<|endoftext|>")});
  return v;
}
std::shared_ptr<const Grammar> grammar() {
  static auto g = compile_json_schema(kSchema);
  return g;
}

struct NamedState {
  const char* name;
  const char* prefix;
};
const NamedState kStates[] = {
    {"start", ""},
    {"object_key", "{\"na"},
    {"string_value", "{\"name\": \"Ada Lov"},
    {"after_string", "{\"name\": \"Ada\""},
    {"integer", "{\"name\": \"Ada\", \"age\": 3"},
    {"enum", "{\"name\": \"Ada\", \"age\": 36, \"role\": \"ed"},
    {"email", "{\"name\": \"Ada\", \"age\": 36, \"email\": \"ada@exa"},
    {"array_item", "{\"name\": \"Ada\", \"age\": 36, \"role\": \"admin\", \"tags\": [\"x\", "},
    {"bounded_string", "{\"name\": \"Ada\", \"age\": 36, \"role\": \"admin\", \"address\": {\"city\": \"L\", \"zip\": \"123"},
};

void BM_MaskWarm(benchmark::State& state) {
  const NamedState& ns = kStates[state.range(0)];
  state.SetLabel(ns.name);
  TokenMasker masker(grammar(), vocab());
  GrammarMatcher m(grammar());
  if (!m.accept_bytes(ns.prefix)) return state.SkipWithError("prefix rejected");
  std::vector<uint32_t> mask(vocab()->words());
  masker.fill_mask(m, mask);  // warm the cache
  for (auto _ : state) {
    masker.fill_mask(m, mask);
    benchmark::DoNotOptimize(mask.data());
  }
  size_t allowed = 0;
  for (uint32_t w : mask) allowed += __builtin_popcount(w);
  state.counters["allowed"] = static_cast<double>(allowed);
}

void BM_MaskCold(benchmark::State& state) {
  const NamedState& ns = kStates[state.range(0)];
  state.SetLabel(ns.name);
  GrammarMatcher m(grammar());
  if (!m.accept_bytes(ns.prefix)) return state.SkipWithError("prefix rejected");
  std::vector<uint32_t> mask(vocab()->words());
  for (auto _ : state) {
    TokenMasker masker(grammar(), vocab());
    masker.fill_mask(m, mask);
    benchmark::DoNotOptimize(mask.data());
  }
}

// 20 documents made by random walks (fixed seed) over allowed tokens, biased toward structure so that they finish.
const std::vector<std::vector<int32_t>>& documents() {
  static const std::vector<std::vector<int32_t>> docs = [] {
    TokenMasker masker(grammar(), vocab());
    std::mt19937_64 rng(7);
    std::vector<uint32_t> mask(vocab()->words());
    std::vector<std::vector<int32_t>> out;
    std::vector<int32_t> allowed, closing;
    while (out.size() < 20) {
      GrammarMatcher m(grammar());
      std::vector<int32_t> doc;
      for (int step = 0; step < 400 && !m.is_terminated(); ++step) {
        masker.fill_mask(m, mask);
        allowed.clear();
        closing.clear();
        for (int32_t id = 0; id < vocab()->mask_size(); ++id)
          if ((mask[id >> 5] >> (id & 31)) & 1u) {
            allowed.push_back(id);
            const std::string& b = vocab()->bytes(id);
            if (b.empty() || b.find_first_of("\"]},") != std::string::npos) closing.push_back(id);
          }
        const auto& from = (!closing.empty() && rng() % 10 < 5) ? closing : allowed;
        doc.push_back(from[rng() % from.size()]);
        masker.accept_token(m, doc.back());
      }
      if (m.is_terminated()) out.push_back(std::move(doc));
    }
    return out;
  }();
  return docs;
}

// Replays the documents: mask + accept per token. `fresh`: a new masker per pass (every first visit is paid).
void walk_documents(benchmark::State& state, bool fresh) {
  const auto& docs = documents();
  TokenMasker warm(grammar(), vocab());
  std::vector<uint32_t> mask(vocab()->words());
  auto replay = [&](TokenMasker& masker) {
    for (const auto& doc : docs) {
      GrammarMatcher m(grammar());
      for (int32_t id : doc) {
        masker.fill_mask(m, mask);
        if (!masker.accept_token(m, id)) state.SkipWithError("replayed token rejected");
      }
    }
  };
  if (!fresh) replay(warm);
  int64_t tokens = 0;
  for (const auto& doc : docs) tokens += static_cast<int64_t>(doc.size());
  for (auto _ : state) {
    if (fresh) {
      TokenMasker masker(grammar(), vocab());
      replay(masker);
      state.counters["positions"] = static_cast<double>(masker.cached_positions());
      state.counters["trie_walks"] = static_cast<double>(masker.trie_walks());
    } else {
      replay(warm);
    }
  }
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["s_per_token"] = benchmark::Counter(static_cast<double>(tokens * state.iterations()),
                                                     benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
void BM_WalkWarm(benchmark::State& state) { walk_documents(state, false); }
void BM_WalkCold(benchmark::State& state) { walk_documents(state, true); }

void BM_VocabularyBuild(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(TokenVocabulary::from_tokenizer(tokenizer(), {0}));
}
void BM_CompileSchema(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(compile_json_schema(kSchema));
}
BENCHMARK(BM_MaskWarm)->DenseRange(0, std::size(kStates) - 1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MaskCold)->DenseRange(0, std::size(kStates) - 1)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_WalkWarm)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_WalkCold)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_VocabularyBuild)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_CompileSchema)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
