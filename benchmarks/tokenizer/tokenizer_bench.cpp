// Tokenizer throughput on one thread: encode of a ~10 MB mixed-language text (MB/s of UTF-8 input), decode and
// streaming decode of its ids, and load time. Compare with Hugging Face tokenizers on the same text:
//
//   python3 benchmarks/tokenizer/make_corpus.py build-tok/tokenizer_corpus.txt
//   build-tok/benchmarks/bench_tokenizer --corpus=build-tok/tokenizer_corpus.txt [--tokenizer=models/tiny-b-random]
//   .venv/bin/python tools/tokenizer_reference.py bench build-tok/tokenizer_corpus.txt
//
// The BPE cache is warm after the first iteration, as the reference's is after its warm-up call.
#include <benchmark/benchmark.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace {

std::string g_corpus_path;
std::string g_tokenizer_path = std::string(FLASHNEXT_SOURCE_DIR) + "/models/tiny-b-random";

const std::string& corpus() {
  static const std::string text = [] {
    std::ifstream in(g_corpus_path, std::ios::binary);
    return in ? std::string(std::istreambuf_iterator<char>(in), {}) : std::string();
  }();
  return text;
}

const flashnext::Tokenizer& tokenizer() {
  static const flashnext::Tokenizer tok = flashnext::Tokenizer::load(g_tokenizer_path);
  return tok;
}

bool need_corpus(benchmark::State& state) {
  if (!corpus().empty()) return true;
  state.SkipWithError("no corpus: run benchmarks/tokenizer/make_corpus.py OUT and pass --corpus=OUT");
  return false;
}

void BM_EncodeCorpus(benchmark::State& state) {
  if (!need_corpus(state)) return;
  const auto& tok = tokenizer();
  size_t n_ids = 0;
  for (auto _ : state) {
    auto ids = tok.encode(corpus());
    n_ids = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * corpus().size()));
  state.counters["ids"] = static_cast<double>(n_ids);
  state.counters["MB"] = static_cast<double>(corpus().size()) / 1e6;
}
BENCHMARK(BM_EncodeCorpus)->Unit(benchmark::kMillisecond)->MinTime(5.0);

/// The corpus line by line (each line with its newline), as the reference's encode_batch over lines.
void BM_EncodeCorpusLines(benchmark::State& state) {
  if (!need_corpus(state)) return;
  const auto& tok = tokenizer();
  std::vector<std::string_view> lines;
  const std::string_view text = corpus();
  for (size_t pos = 0; pos < text.size();) {
    const size_t nl = text.find('\n', pos);
    const size_t end = nl == std::string_view::npos ? text.size() : nl + 1;
    lines.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  size_t n_ids = 0;
  for (auto _ : state) {
    n_ids = 0;
    for (std::string_view line : lines) n_ids += tok.encode(line).size();
    benchmark::DoNotOptimize(n_ids);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * corpus().size()));
  state.counters["ids"] = static_cast<double>(n_ids);
  state.counters["lines"] = static_cast<double>(lines.size());
}
BENCHMARK(BM_EncodeCorpusLines)->Unit(benchmark::kMillisecond)->MinTime(5.0);

void BM_DecodeCorpus(benchmark::State& state) {
  if (!need_corpus(state)) return;
  const auto& tok = tokenizer();
  const auto ids = tok.encode(corpus());
  for (auto _ : state) {
    auto text = tok.decode(ids);
    benchmark::DoNotOptimize(text.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * corpus().size()));
}
BENCHMARK(BM_DecodeCorpus)->Unit(benchmark::kMillisecond);

void BM_StreamDecodeCorpus(benchmark::State& state) {
  if (!need_corpus(state)) return;
  const auto& tok = tokenizer();
  const auto ids = tok.encode(corpus());
  for (auto _ : state) {
    flashnext::IncrementalDecoder dec(tok);
    size_t n = 0;
    for (auto id : ids) n += dec.push(id).size();
    n += dec.finish().size();
    benchmark::DoNotOptimize(n);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ids.size()));
}
BENCHMARK(BM_StreamDecodeCorpus)->Unit(benchmark::kMillisecond);

void BM_Load(benchmark::State& state) {
  for (auto _ : state) {
    auto tok = flashnext::Tokenizer::load(g_tokenizer_path);
    benchmark::DoNotOptimize(tok.vocab_size());
  }
}
BENCHMARK(BM_Load)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace

int main(int argc, char** argv) {
  // Our own flags first; the rest goes to Google Benchmark.
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--corpus=", 9) == 0) {
      g_corpus_path = argv[i] + 9;
    } else if (std::strncmp(argv[i], "--tokenizer=", 12) == 0) {
      g_tokenizer_path = argv[i] + 12;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
