// `flashnext logits --model DIR --ids 1,2,3 --out FILE.npy [--chunk C] [--greedy N] [--threads N] [--device cpu|cuda]
// [--tp N] [--warmup]`: runs the prompt through the model (float32 CPU oracle by default, or the CUDA backend) and
// writes the next-token logits of every prompt position as a float32 [T, vocab] .npy file. The prompt is prefilled in
// chunks of C tokens (default: all at once). With --greedy N it then decodes N tokens one at a time (argmax, first
// index on ties, as torch.argmax) and prints `greedy: <id>,<id>,...` on stdout. Timing goes to stderr; --warmup first
// runs the prompt once untimed (first-use costs such as GPU module loading stay out of the figures).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "cli/cli.h"
#include "cli/device.h"
#include "cli/load_progress.h"
#include "cli/token_ids.h"
#include "core/error.h"
#include "core/npy.h"
#include "engine/speculative.h"
#include "model/qwen4_exp/model.h"

namespace {

using namespace flashnext;

struct LogitsArgs {
  std::string model, ids, out;
  int64_t chunk = 0;
  int greedy = 0;
  int threads = 0, tp = 1;
  cli::NodeArgs nodes;
  std::string device = "cpu";
  std::string speculative;
  bool warmup = false;
};

int64_t argmax(const float* row, int64_t n) {
  return std::max_element(row, row + n) - row;  // first maximum, like torch.argmax
}

int run(const LogitsArgs& a) {
  const std::vector<int32_t> ids = cli::parse_token_ids(a.ids, "--ids");
  if (ids.empty()) fail("--ids: the prompt is empty: give at least one token id");
  if (a.chunk < 0) fail("--chunk must be >= 1 (or 0 for the whole prompt), got {}", a.chunk);
  if (a.greedy < 0) fail("--greedy must be >= 0, got {}", a.greedy);
  const SpeculativeConfig spec = SpeculativeConfig::parse(a.speculative);  // before any weight is read
  if (spec.enabled() && a.greedy == 0)
    fail("--speculative {} applies to --greedy N decoding: give --greedy", spec.str());
  ModelOptions options;
  options.load_mtp = spec.method == SpeculativeConfig::Method::Mtp;
  cli::set_backend(options, a.device, a.threads, a.tp, a.nodes,
                   cli::node_fingerprint(a.nodes, a.model, options.load_mtp));
  options.progress = cli::LoadProgressPrinter();
  auto model = [&] {
    try {
      return Model::load(a.model, options);
    } catch (const Error& e) {
      if (!options.load_mtp) throw;
      fail("--speculative {}: {}", spec.str(), e.what());  // say which flag asked for the MTP layer
    }
  }();
  if (cli::follow_leader(*model, a.nodes)) return 0;
  const int64_t T = int64_t(ids.size()), V = model->config().vocab_size;
  const int64_t chunk = a.chunk > 0 ? a.chunk : T;

  using clock = std::chrono::steady_clock;
  if (a.warmup) {
    SequenceState warm = model->new_sequence();
    for (int64_t start = 0; start < T; start += chunk) {
      const int64_t n = std::min(chunk, T - start);
      model->forward(warm, std::span<const int32_t>(ids.data() + start, size_t(n)), LogitsMode::Last);
    }
  }
  SequenceState seq = model->new_sequence();
  std::vector<float> logits;
  logits.reserve(size_t(T * V));
  auto t0 = clock::now();
  for (int64_t start = 0; start < T; start += chunk) {
    const int64_t n = std::min(chunk, T - start);
    const std::vector<float> part = model->forward(seq, std::span<const int32_t>(ids.data() + start, size_t(n)));
    logits.insert(logits.end(), part.begin(), part.end());
  }
  const double prefill_s = std::chrono::duration<double>(clock::now() - t0).count();
  write_npy(a.out, DType::F32, {T, V}, logits.data());
  fmt::print(stderr, "wrote {} [{}, {}]; prefill {} tokens in {:.3f} s ({:.1f} tokens/s, chunk {})\n", a.out, T, V, T,
             prefill_s, double(T) / prefill_s, chunk);

  if (a.greedy > 0 && spec.enabled()) {
    // Speculative greedy decode on a fresh sequence (its own prefill, which the proposer needs).
    SpeculativeDecoder sd(*model, spec);
    SequenceState sseq = model->new_sequence();
    std::vector<int32_t> context = ids, out;
    t0 = clock::now();
    std::vector<float> row = sd.prefill(sseq, ids);
    auto choose = [&](std::span<float> r) { return int32_t(argmax(r.data(), V)); };
    out.push_back(choose(row));
    context.push_back(out.back());
    size_t used = 0;  // tokens of the last step within --greedy N
    while (int64_t(out.size()) < a.greedy) {
      used = 0;
      for (int32_t t : sd.step(sseq, context, choose)) {
        if (int64_t(out.size()) < a.greedy) {
          out.push_back(t);
          ++used;
        }
        context.push_back(t);
      }
    }
    const double decode_s = std::chrono::duration<double>(clock::now() - t0).count();
    fmt::print("greedy: {}\n", fmt::join(out, ","));
    const SpeculativeStats st = sd.stats_using(used);
    fmt::print(stderr,
               "speculative {}: {} verify steps, drafted {}, accepted {} ({:.1f}%), mean accepted length {:.2f}, "
               "{} rollbacks; prefill + decode {:.3f} s\n",
               spec.str(), st.steps, st.drafted, st.accepted, 100.0 * st.acceptance_rate(), st.mean_accepted_length(),
               st.rollbacks, decode_s);
  } else if (a.greedy > 0) {
    std::vector<int64_t> out;
    std::vector<float> row(logits.end() - V, logits.end());
    t0 = clock::now();
    for (int s = 0; s < a.greedy; ++s) {
      const int32_t next = int32_t(argmax(row.data(), V));
      out.push_back(next);
      if (s + 1 < a.greedy) row = model->forward(seq, std::span<const int32_t>(&next, 1), LogitsMode::Last);
    }
    const double decode_s = std::chrono::duration<double>(clock::now() - t0).count();
    fmt::print("greedy: {}\n", fmt::join(out, ","));
    if (a.greedy > 1) {
      fmt::print(stderr, "decode {} steps in {:.3f} s ({:.1f} tokens/s)\n", a.greedy - 1, decode_s,
                 double(a.greedy - 1) / decode_s);
    }
  }
  return 0;
}

}  // namespace

FLASHNEXT_SUBCOMMAND(logits, "logits", "Write the float32 next-token logits of a prompt to a .npy file",
                     [](CLI::App& sub) -> std::function<int()> {
                       auto a = std::make_shared<LogitsArgs>();
                       sub.add_option("--model", a->model, "model folder (config.json + safetensors)")->required();
                       sub.add_option("--ids", a->ids, "prompt token ids, comma-separated (e.g. 1,2,3)")->required();
                       sub.add_option("--out", a->out, "output .npy file: float32 [T, vocab]")->required();
                       sub.add_option("--chunk", a->chunk, "prefill chunk size in tokens (default: whole prompt)");
                       sub.add_option("--greedy", a->greedy, "then decode N greedy tokens and print them");
                       sub.add_option("--threads", a->threads, "CPU threads (default: all cores)");
                       sub.add_option("--tp", a->tp,
                                      "tensor-parallel ranks (default 1; threads of this process, docs/ENGINE.md)");
                       cli::add_node_options(sub, a->nodes);
                       sub.add_option("--device", a->device, "cpu (default: the float32 oracle) or cuda")
                           ->check(CLI::IsMember({"cpu", "cuda"}));
                       sub.add_option("--speculative", a->speculative,
                                      "speculative greedy decoding: mtp:K (the checkpoint's MTP layer) or ngram:K "
                                      "(prompt lookup), K drafts per step in 1..8");
                       sub.add_flag("--warmup", a->warmup, "run the prompt once untimed before the timed prefill");
                       return [a] { return run(*a); };
                     });
