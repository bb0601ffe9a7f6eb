// `flashnext bench`: the released model at full size without a checkpoint on disk. Builds the geometry of a
// config.json (default: models/release/config.json) with pseudo-random weights made on the device (Model::random:
// W4A16 routed experts in the NVFP4 layout on the GPU, FP16 dense weights, the FP8 PLE table in pinned host memory
// filled by host threads), or loads `--model DIR`, then measures prefill (tokens/s and time to first token per prompt
// length), decode at batch 1 (the gate of the seed material: 8192 in / 512 out, emitted tokens 33-512) and batched
// decode throughput at long contexts, each with its ratio to the ceilings of docs/LIMITS.md computed from the bytes
// and FLOPs the step moves (model/qwen4_exp/cost.h). `--profile` adds a per-phase breakdown from device events around
// op groups (Ops::profile_phase); `--json` prints one JSON object instead of the table (keys: docs/BENCH.md).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "build_info.h"
#include "cli/cli.h"
#include "cli/device.h"
#include "cli/load_progress.h"
#include "core/error.h"
#include "engine/model_dir.h"
#include "engine/sampling.h"
#include "engine/speculative.h"
#include "loader/config.h"
#include "loader/sharding.h"
#include "model/qwen4_exp/cost.h"
#include "model/qwen4_exp/model.h"
#include "model/qwen4_exp/weights.h"
#include "ops/random_uniform.h"
#include "ple/ngram_hash.h"

namespace {

using json = nlohmann::ordered_json;
using namespace flashnext;
using Clock = std::chrono::steady_clock;

struct BenchArgs {
  std::string model, config, device = "cuda", out;
  int threads = 0, tp = 1;
  cli::NodeArgs nodes;
  std::optional<int64_t> layers, experts, experts_per_token, vocab, ple_rows;  // unset: as the config says
  uint64_t seed = 1;
  std::vector<int64_t> prompts{1024, 4096, 8192, 32768};
  int64_t chunk = 8192, block_size = 16;
  std::vector<int64_t> prefill_chunks;  ///< --prefill-chunks: the prefill runs' chunk sizes (empty: {chunk})
  int64_t decode_context = 8192, decode_tokens = 512, decode_skip = 32;
  std::vector<int64_t> batches{8, 32, 64};
  int64_t batch_context = 8192, batch_steps = 32;
  int repeat = 3;
  bool profile = false, json = false;
  bool kernel_trace = false;  ///< --kernel-trace: the kernels of an extra prefill run per prompt and of decode steps
  std::string speculative;                    ///< "mtp:K" / "ngram:K": speculative decoding at forced acceptance
  std::vector<double> acceptance{0, 0.5, 1};  ///< fractions of the K drafts accepted in every step
  int64_t spec_steps = 24;                    ///< verify steps per acceptance rate (the first 4 untimed)
  std::vector<std::string> spec_rollback{"replay"};  ///< per mode, every rate: "replay" (Model::replay_state) or
                                                     ///< "refeed" (the accepted tokens fed again)
};

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5))];
}

/// Bytes of host memory available now (MemAvailable of /proc/meminfo), or -1 when unknown.
int64_t host_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return -1;
}

/// Peak resident set of this process (VmHWM of /proc/self/status), bytes; -1 when unknown.
int64_t host_peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

/// Roofline figures of a device (docs/LIMITS.md): copy bandwidth and dense FP16 GEMM rate.
struct Ceiling {
  std::string name, source;
  double bytes_per_s = 0, flops_per_s = 0;
  bool known() const { return bytes_per_s > 0; }
};

Ceiling ceiling_for(const std::string& backend_name) {
  if (backend_name.find("H200") != std::string::npos)
    return {"H200", "docs/LIMITS.md: 4.3 TB/s measured device copy, ~790 TFLOP/s measured 8192^3 GEMM", 4.3e12,
            790e12};
  if (backend_name.find("V100") != std::string::npos)
    return {"V100", "docs/LIMITS.md: 900 GB/s HBM2, 125 TFLOP/s FP16 tensor", 900e9, 125e12};
  return {};
}

/// Prompts longer than this are prefilled once, whatever --repeat says (a 32K prefill is the longest run).
constexpr int64_t kLongPrompt = 16384;

/// The V100's figures for the projection (docs/LIMITS.md).
constexpr double kV100Bytes = 900e9, kV100Flops = 125e12;

/// The benchmark model's config: `path` with the overrides of `a` applied to the JSON before validation, so that
/// every changed field is checked as a config.json field is.
ModelConfig bench_config(const BenchArgs& a, const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  FN_CHECK(f.good(), "--config: cannot open {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  json doc;
  try {
    doc = json::parse(ss.str());
  } catch (const json::parse_error& e) {
    fail("--config: {} is not valid JSON: {}", path, e.what());
  }
  FN_CHECK(doc.is_object(), "--config: {} must hold a JSON object", path);
  json& t = doc.contains("text_config") ? doc["text_config"] : doc;
  if (a.layers) {
    const int64_t n = *a.layers;
    FN_CHECK(t.contains("layer_types") && t["layer_types"].is_array() && int64_t(t["layer_types"].size()) >= n,
             "--layers {}: {} lists fewer layer_types", n, path);
    json types = json::array();
    for (int64_t l = 0; l < n; ++l) types.push_back(t["layer_types"][size_t(l)]);
    t["layer_types"] = types;
    t["num_hidden_layers"] = n;
    if (t.contains("ple_layer_ids") && t["ple_layer_ids"].is_array()) {  // one-indexed
      json kept = json::array();
      for (const json& id : t["ple_layer_ids"])
        if (id.is_number_integer() && id.get<int64_t>() <= n) kept.push_back(id);
      t["ple_layer_ids"] = kept;
    }
  }
  if (a.experts) t["num_experts"] = *a.experts;
  if (a.experts_per_token) t["num_experts_per_tok"] = *a.experts_per_token;
  if (a.vocab) {
    const int64_t vocab = *a.vocab;
    t["vocab_size"] = vocab;
    for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {  // keep special ids in the vocab
      if (!t.contains(key)) continue;
      json& v = t[key];
      if (v.is_number_integer() && v.get<int64_t>() >= vocab) v = vocab - 1;
      if (v.is_array())
        for (json& e : v)
          if (e.is_number_integer() && e.get<int64_t>() >= vocab) e = vocab - 1;
    }
  }
  if (a.ple_rows) {
    const int64_t n = t.value("ngram_size", int64_t(3)), h = t.value("heads_per_ngram", int64_t(8));
    t["ngram_vocab_size_base"] = std::max<int64_t>(2, *a.ple_rows / std::max<int64_t>(1, (n - 1) * h));
  }
  const int64_t E = t.value("num_experts", int64_t(0)), k = t.value("num_experts_per_tok", int64_t(0));
  FN_CHECK(k <= E, "{} experts per token (--experts-per-token or num_experts_per_tok) but only {} experts "
           "(--experts or num_experts)", k, E);
  return parse_config(doc, path);
}

/// A simple block allocator over one cache pool: each sequence takes consecutive blocks.
struct PoolSeqs {
  Model& model;
  std::shared_ptr<CachePool> cache;
  int64_t next_block = 0;

  SequenceState take(int32_t slot, int64_t positions) {
    const int64_t bs = cache->block_size, n = (positions + bs - 1) / bs;
    FN_CHECK(next_block + n <= cache->num_blocks, "bench: the cache pool has {} blocks, {} more are needed",
             cache->num_blocks, next_block + n - cache->num_blocks);
    SequenceState s = model.new_sequence(cache, slot);
    s.block_table.resize(size_t(n));
    std::iota(s.block_table.begin(), s.block_table.end(), int32_t(next_block));
    next_block += n;
    return s;
  }
};

/// Random token ids in [0, vocab): stream `seed`.
std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = int32_t(random_bits(seed, uint64_t(i)) % uint64_t(vocab));
  return ids;
}

/// The next token of every row of `logits`: on the device when the backend samples there, else on the host with the
/// engine's sampler functions (greedy: argmax; with temperature: a draw from softmax(logits / temperature) seeded by
/// (seed + row, offset)).
std::vector<int32_t> sample(Model& m, const Tensor& logits, float temperature, uint64_t seed, uint64_t offset) {
  Ops& ops = m.ops();
  const int64_t rows = logits.dim(0), V = logits.dim(1);
  if (ops.samples_on_device()) {
    std::vector<TokenSampling> p(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) p[size_t(r)] = TokenSampling{temperature, 0, 1.f, 0.f, seed + uint64_t(r), offset};
    return ops.sample_tokens(logits, p);
  }
  std::vector<float> host = m.download(logits);
  std::vector<int32_t> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const std::span<float> row(host.data() + r * V, size_t(V));
    if (temperature <= 0) {
      out[size_t(r)] = argmax(row);
      continue;
    }
    apply_temperature(row, temperature);
    std::mt19937_64 rng(random_bits(seed + uint64_t(r), offset));
    out[size_t(r)] = sample_from_logits(row, rng);
  }
  return out;
}

/// What became of the recordable decode steps between two Model::step_graph_stats (docs/BENCH.md "step_graphs").
json step_graphs_json(const Model::StepGraphStats& before, const Model::StepGraphStats& after) {
  return json{{"plain", after.plain - before.plain},
              {"captured", after.captured - before.captured},
              {"replayed", after.replayed - before.replayed},
              {"failed", after.failed - before.failed}};
}

json profile_json(const std::vector<std::pair<std::string, double>>& times, double divide) {
  json j = json::object();
  for (const auto& [name, ms] : times) j[name] = ms / divide;
  return j;
}

/// `--kernel-trace`: `calls` calls of `call` with kernel tracing on (cuda_kernel_tracing), summed per call
/// (summarize_kernel_trace) over the kernels of GPU 0 (rank 0's under --tp): wall_ms (host clock, traced), span_ms,
/// idle_ms, kernels, and per kernel name (by_kernel) and per name and grid (by_kernel_grid) launches, busy_us,
/// critical_us and idle_before_us. Null without a CUDA
/// backend or where CUPTI is unavailable (a build without it, or another profiler attached).
json kernel_trace_json(Ops& ops, int calls, const std::function<void()>& call) {
#ifdef FLASHNEXT_HAVE_CUDA
  if (ops.device() != Device::CUDA || calls < 1) return nullptr;
  ops.synchronize();
  if (!cuda_kernel_tracing(true)) return nullptr;
  const auto t0 = Clock::now();
  for (int i = 0; i < calls; ++i) call();
  ops.synchronize();
  const double wall_s = seconds(t0, Clock::now());
  cuda_kernel_tracing(false);
  std::vector<KernelInterval> trace = cuda_kernel_trace();
  std::erase_if(trace, [](const KernelInterval& k) { return k.device != 0; });
  const KernelTraceSummary s = summarize_kernel_trace(trace), g = summarize_kernel_trace(std::move(trace), true);
  const double n = calls;
  auto rows = [n](const KernelTraceSummary& sum) {
    json j = json::array();
    for (const KernelTraceRow& r : sum.rows)
      j.push_back(json{{"name", r.name},
                       {"launches", double(r.launches) / n},
                       {"busy_us", r.busy_us / n},
                       {"critical_us", r.critical_us / n},
                       {"idle_before_us", r.idle_before_us / n}});
    return j;
  };
  return json{{"calls", calls},
              {"wall_ms", 1e3 * wall_s / n},
              {"span_ms", 1e-3 * s.span_us / n},
              {"idle_ms", 1e-3 * s.idle_us / n},
              {"kernels", double(s.kernels) / n},
              {"by_kernel", rows(s)},
              {"by_kernel_grid", rows(g)}};
#else
  (void)ops, (void)calls, (void)call;
  return nullptr;
#endif
}

/// The first `top` rows of a kernel_trace_json's `rows` (by_kernel or by_kernel_grid), a line each, under a header
/// naming `what`.
void print_kernel_trace(const json& t, const std::string& what, size_t top, const char* rows = "by_kernel") {
  if (t.is_null()) return;
  fmt::print(
      "{} kernel trace, per call: traced wall {:.3f} ms, kernels' span {:.3f} ms, idle {:.3f} ms, {:.0f} "
      "kernels; critical us (busy us, launches, idle before us):\n",
      what, t["wall_ms"].get<double>(), t["span_ms"].get<double>(), t["idle_ms"].get<double>(),
      t["kernels"].get<double>());
  size_t i = 0;
  for (const json& r : t[rows]) {
    if (i++ == top) break;
    fmt::print("  {:9.1f} ({:9.1f}, {:6.1f}, {:7.1f})  {}\n", r["critical_us"].get<double>(),
               r["busy_us"].get<double>(), r["launches"].get<double>(), r["idle_before_us"].get<double>(),
               r["name"].get<std::string>());
  }
}

double sum_ms(const std::vector<std::pair<std::string, double>>& times) {
  double s = 0;
  for (const auto& t : times) s += t.second;
  return s;
}

/// Feeds `ids` to `seq` in chunks of `chunk` and samples the first token; returns (seconds to the first token,
/// cost of the chunks).
std::pair<double, StepCost> prefill(Model& m, SequenceState& seq, const std::vector<int32_t>& ids, int64_t chunk) {
  StepCost total;
  const auto t0 = Clock::now();
  Tensor logits;
  for (int64_t off = 0; off < int64_t(ids.size()); off += chunk) {
    const int64_t n = std::min<int64_t>(chunk, int64_t(ids.size()) - off);
    const StepWork w{n, seq.length};
    const StepCost c = step_cost(m, {&w, 1}, 1);
    total.weight_bytes += c.weight_bytes;
    total.cache_bytes += c.cache_bytes;
    total.host_bytes += c.host_bytes;
    total.flops += c.flops;
    logits = m.forward_tensor(seq, std::span<const int32_t>(ids).subspan(size_t(off), size_t(n)), LogitsMode::Last);
  }
  m.ops().profile_phase("sampling");
  (void)sample(m, logits, 0.f, 0, 0);
  m.ops().profile_phase(nullptr);
  return {seconds(t0, Clock::now()), total};
}

/// Batch-1 speculative decoding at forced acceptance rates (`--speculative mtp:K | ngram:K --acceptance ...`): per
/// rate f, a fresh sequence of --decode-context random tokens (the MTP layer caught up over it), then --spec-steps
/// steps as serve runs them for one sequence, with j = round(f K) of the K drafts accepted by construction (the
/// drafts are the MTP layer's greedy chain, or random tokens for ngram, whose host lookup costs nothing here):
/// drafting (K - 1 chained MTP calls after the first draft), the verify step of 1 + K tokens with the state saved in
/// a spare pool slot before it and the verify's state inputs kept, and when j < K the rollback (the slot copied back,
/// then advanced over the 1 + j accepted tokens: Model::replay_state; with --spec-rollback refeed those tokens fed
/// again, as before replay_state existed; every rate once per mode given); then the
/// MTP layer catches up over the 1 + j accepted rows. Emitted tokens per step: 1 + j. Phases are timed between
/// device synchronisations (pool slot 1 is the checkpoint slot; slot 0 the sequence).
json speculative_decode(Model& m, const BenchArgs& a, const SpeculativeConfig& spec, PoolSeqs& pool, int64_t base,
                        const std::function<void(const std::string&)>& log) {
  const int K = spec.k;
  const bool mtp = spec.method == SpeculativeConfig::Method::Mtp;
  const int64_t V = m.config().vocab_size, P = a.decode_context;
  Ops& ops = m.ops();
  json runs = json::array();
  std::vector<std::pair<std::string, double>> cases;  // (rollback mode, acceptance rate)
  for (const std::string& mode : a.spec_rollback)
    for (double f : a.acceptance) cases.emplace_back(mode, f);
  for (const auto& [mode, f] : cases) {
    const bool refeed = mode == "refeed";
    const int j = int(std::lround(f * K));  // drafts accepted in every step
    pool.next_block = base;
    SequenceState s = pool.take(0, P + (a.spec_steps + 2) * (K + 1) + 1);  // + the profiled step
    const std::vector<int32_t> prompt = random_ids(P, V, a.seed + 5);
    Tensor wide, last_state;
    int32_t tok = 0, first_draft = 0;
    for (int64_t off = 0; off < P; off += a.chunk) {  // the prompt, and the MTP layer over its rows
      const int64_t n = std::min<int64_t>(a.chunk, P - off);
      const BatchItem it{&s, std::span<const int32_t>(prompt).subspan(size_t(off), size_t(n)), LogitsMode::Last};
      const Tensor logits = m.forward_batch({&it, 1}, nullptr, {}, &wide);
      if (off + n == P) tok = sample(m, logits, 0.f, 0, 0)[0];
      if (!mtp) continue;
      std::vector<int32_t> next(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) next[size_t(i)] = off + i + 1 < P ? prompt[size_t(off + i + 1)] : tok;
      const Model::MtpOutput o = m.mtp_forward(s, wide, next, LogitsMode::Last);
      first_draft = sample(m, o.logits, 0.f, 0, 0)[0];
      last_state = o.wide.rows(n - 1, n);
    }
    std::vector<double> step_ms, draft_ms, verify_ms, rollback_ms, catchup_ms;
    const auto ms_since = [&](Clock::time_point& t) {
      ops.synchronize();
      const auto now = Clock::now();
      const double d = 1e3 * seconds(t, now);
      t = now;
      return d;
    };
    json verify_prof = nullptr, rollback_prof = nullptr;
    // With --profile one more step, untimed, whose verify and rollback run with the phase marks on.
    for (int64_t step = 0; step < a.spec_steps + (a.profile ? 1 : 0); ++step) {
      const bool profiled = step == a.spec_steps;
      const auto t0 = Clock::now();
      auto t = t0;
      std::vector<int32_t> feed{tok};  // the last emitted token, then the drafts
      if (mtp) {
        int32_t d = first_draft;
        Tensor state = last_state;
        const int64_t caught_up = s.mtp_length;
        feed.push_back(d);
        for (int k = 1; k < K; ++k) {
          const Model::MtpOutput o = m.mtp_forward(s, state, {&d, 1}, LogitsMode::Last);
          d = sample(m, o.logits, 0.f, 0, 0)[0];
          feed.push_back(d);
          state = o.wide;
        }
        s.mtp_length = caught_up;  // the draft positions' MTP entries are overwritten later
      } else {
        const std::vector<int32_t> drafts = random_ids(K, V, a.seed + 1000 + uint64_t(step));
        feed.insert(feed.end(), drafts.begin(), drafts.end());
      }
      const double draft = ms_since(t);
      // Verify with the state saved in the spare slot (a device copy, as serve's checkpoints).
      const int64_t length = s.length;
      const auto history = s.ple_history;
      m.copy_state_slot(*s.cache, s.slot, 1);
      StateInputs kept;
      const BatchItem verify{&s, feed, LogitsMode::All, refeed ? nullptr : &kept};
      if (profiled) ops.set_profiling(true);
      const Tensor logits = m.forward_batch({&verify, 1}, nullptr, {}, &wide);
      const int32_t bonus = sample(m, logits.rows(j, j + 1), 0.f, 0, 0)[0];
      const double verify_t = ms_since(t);
      if (profiled) {
        verify_prof = profile_json(ops.profile_times(), 1.0);
        ops.set_profiling(true);  // the marks start again for the rollback
      }
      double rollback = 0;
      if (j < K) {  // the rejected drafts leave: the state comes back, advanced over the accepted tokens
        m.copy_state_slot(*s.cache, 1, s.slot);
        s.length = length;
        s.ple_history = history;
        if (kept.kept()) {
          m.replay_state(s, kept, j + 1);
        } else {
          const BatchItem again{&s, std::span<const int32_t>(feed).first(size_t(j) + 1), LogitsMode::Last};
          (void)m.forward_batch({&again, 1}, nullptr, {}, &wide);
        }
        rollback = ms_since(t);
        if (profiled) rollback_prof = profile_json(ops.profile_times(), 1.0);
      }
      if (profiled) ops.set_profiling(false);
      double catchup = 0;
      if (mtp) {  // the MTP layer over the accepted rows, paired with the tokens after them; its last row drafts next
        std::vector<int32_t> next(feed.begin() + 1, feed.begin() + 1 + j);
        next.push_back(bonus);
        const Model::MtpOutput o = m.mtp_forward(s, wide.rows(0, j + 1), next, LogitsMode::Last);
        first_draft = sample(m, o.logits, 0.f, 0, 0)[0];
        last_state = o.wide.rows(j, j + 1);
        catchup = ms_since(t);
      }
      tok = bonus;
      if (step < 4 || profiled) continue;  // warm-up steps, the profiled one
      step_ms.push_back(1e3 * seconds(t0, Clock::now()));
      draft_ms.push_back(draft);
      verify_ms.push_back(verify_t);
      rollback_ms.push_back(rollback);
      catchup_ms.push_back(catchup);
    }
    const double step = median(step_ms), tps = 1e3 * double(j + 1) / step;
    runs.push_back(json{{"rollback", refeed || !m.replays_state() ? "refeed" : "replay"},
                        {"acceptance", f},
                        {"accepted_per_step", j},
                        {"emitted_per_step", j + 1},
                        {"tokens_per_s", tps},
                        {"step_ms_median", step},
                        {"draft_ms_median", median(draft_ms)},
                        {"verify_ms_median", median(verify_ms)},
                        {"rollback_ms_median", median(rollback_ms)},
                        {"mtp_catchup_ms_median", median(catchup_ms)}});
    if (a.profile) {
      runs.back()["verify_profile_ms"] = verify_prof;
      runs.back()["rollback_profile_ms"] = rollback_prof;
      for (const auto& [what, prof] : {std::pair{"verify", &verify_prof}, std::pair{"rollback", &rollback_prof}}) {
        if (prof->is_null()) continue;
        std::string line = fmt::format("  {} phases (ms):", what);
        for (const auto& [k, v] : prof->items()) line += fmt::format(" {} {:.3f}", k, v.get<double>());
        log(line);
      }
    }
    log(
        fmt::format("speculative {} at {} in, acceptance {:.2f} ({} of {} drafts): {:.1f} tokens/s, step {:.2f} ms "
                    "(draft {:.2f}, verify {:.2f}, rollback ({}) {:.2f}, MTP catch-up {:.2f})",
                    spec.str(), P, f, j, K, tps, step, median(draft_ms), median(verify_ms), mode, median(rollback_ms),
                    median(catchup_ms)));
  }
  return json{{"method", spec.str()}, {"context_tokens", P}, {"steps_timed", a.spec_steps - 4}, {"runs", runs}};
}

std::string fmt_ratio(double r) {
  return r > 0 ? fmt::format("{:.1f}%", 100 * r) : "-";
}

int run(BenchArgs a) {
  // Flags first: nothing is allocated before they are all valid.
  const bool random_model = a.model.empty();
  FN_CHECK(random_model || (!a.layers && !a.experts && !a.experts_per_token && !a.vocab && !a.ple_rows &&
                            a.config.empty()),
           "--model DIR benchmarks the checkpoint as it is: --config, --layers, --experts, --experts-per-token, "
           "--vocab and --ple-rows apply to random-weight models only");
  for (auto [flag, v] : {std::pair{"--layers", &a.layers}, {"--experts", &a.experts},
                         {"--experts-per-token", &a.experts_per_token}, {"--vocab", &a.vocab},
                         {"--ple-rows", &a.ple_rows}})
    FN_CHECK(!*v || **v >= 1, "{} must be >= 1, got {}", flag, **v);
  FN_CHECK(a.repeat >= 1, "--repeat must be >= 1, got {}", a.repeat);
  FN_CHECK(a.chunk >= 1, "--chunk must be >= 1, got {}", a.chunk);
  for (int64_t c : a.prefill_chunks) FN_CHECK(c >= 1, "--prefill-chunks: every chunk size must be >= 1, got {}", c);
  FN_CHECK(a.decode_tokens == 0 || a.decode_tokens > a.decode_skip + 1,
           "--decode-tokens {} must exceed --decode-skip {} + 1 (or be 0: no batch-1 decode)", a.decode_tokens,
           a.decode_skip);
  FN_CHECK(a.decode_skip >= 1, "--decode-skip must be >= 1 (the first emitted token comes from the prefill)");
  FN_CHECK(!a.kernel_trace || a.device == "cuda", "--kernel-trace traces CUDA kernels: it needs --device cuda");
  FN_CHECK(a.batch_steps >= 3 || a.batches.empty(), "--batch-steps must be >= 3 (2 warm-up steps), got {}",
           a.batch_steps);
  for (int64_t p : a.prompts) FN_CHECK(p >= 1, "--prompts: every prompt length must be >= 1, got {}", p);
  for (int64_t b : a.batches) FN_CHECK(b >= 1, "--batches: every batch size must be >= 1, got {}", b);
  FN_CHECK(a.decode_context >= 1 && a.batch_context >= 1, "--decode-context and --batch-context must be >= 1");
  const SpeculativeConfig spec = SpeculativeConfig::parse(a.speculative);
  FN_CHECK(!spec.enabled() || a.spec_steps >= 5, "--spec-steps must be >= 5 (4 untimed), got {}", a.spec_steps);
  for (double f : a.acceptance)
    FN_CHECK(f >= 0 && f <= 1, "--acceptance: every rate must be in [0, 1] (a fraction of the drafts), got {}", f);
  for (const std::string& mode : a.spec_rollback)
    FN_CHECK(mode == "replay" || mode == "refeed", "--spec-rollback: expected replay or refeed, got '{}'", mode);

  std::string config_path;
  ModelConfig cfg;
  if (random_model) {
    config_path = a.config.empty() ? find_bundled_file("models/release/config.json") : a.config;
    cfg = bench_config(a, config_path);
  } else {
    cfg = load_config(a.model);
    config_path = cfg.source;
  }
  const int64_t spec_positions = spec.enabled() ? a.decode_context + (a.spec_steps + 2) * (spec.k + 1) + 1 : 0;
  const int64_t longest =
      std::max({a.prompts.empty() ? 0 : *std::max_element(a.prompts.begin(), a.prompts.end()),
                a.decode_context + a.decode_tokens, a.batch_context + a.batch_steps, spec_positions});
  FN_CHECK(longest <= cfg.max_position_embeddings,
           "the longest sequence of this run ({} positions) exceeds max_position_embeddings = {}", longest,
           cfg.max_position_embeddings);
  (void)TpPlan::make(cfg, a.tp);  // a degree the heads do not allow fails here, before anything is allocated
  int64_t ple_bytes = 0;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l)
    if (const int m = cfg.ple_index_of_layer(l); m >= 0)
      ple_bytes += ngram_hash_params(cfg, m).rows * cfg.ple_head_dim();  // FP8: one byte per value
  if (random_model) {
    const int64_t avail = host_available_bytes();
    FN_CHECK(avail < 0 || ple_bytes < avail,
             "--ple-rows: the PLE table needs {:.2f} GB of host memory ({} rows x {} FP8 bytes per layer), but only "
             "{:.2f} GB are available; pass --ple-rows N with fewer rows",
             double(ple_bytes) / 1e9, ple_bytes / std::max<int64_t>(1, cfg.ple_head_dim()), cfg.ple_head_dim(),
             double(avail) / 1e9);
  }

  // The model.
  ModelOptions model_options;
  // Every node must build the same model: its geometry after the flags, and the seed of its random weights.
  model_options.load_mtp = spec.method == SpeculativeConfig::Method::Mtp;  // a random model makes a random MTP layer
  cli::set_backend(model_options, a.device, a.threads, a.tp, a.nodes,
                   a.nodes.nnodes > 1
                       ? cli::node_fingerprint(cfg, model_options.load_mtp) + fmt::format(", seed {}", a.seed)
                       : "");
  if (!random_model) model_options.progress = cli::LoadProgressPrinter();
  const auto t_build = Clock::now();
  RandomWeightsReport built;
  std::unique_ptr<Model> model =
      random_model ? Model::random(cfg, model_options, a.seed, &built) : Model::load(a.model, model_options);
  if (cli::follow_leader(*model, a.nodes)) return 0;
  // Under tensor parallelism: rank 0's backend (GPU 0): its profile, memory and launches are reported; the others
  // run the same kernels on their shards in lock step.
  Ops* ops = &model->ops();
  ops->synchronize();  // every rank synchronised its own build (random_weights, load_weights)
  const double build_s = seconds(t_build, Clock::now());
  Model& m = *model;
  const Ceiling ceil = ceiling_for(ops->name());

  json gpu = nullptr;
  int64_t gpu_used_after_build = -1;
  auto gpu_used = [&]() -> int64_t {
#ifdef FLASHNEXT_HAVE_CUDA
    if (ops->device() == Device::CUDA) {
      const GpuMemory g = cuda_memory_info(0);
      return g.total_bytes - g.free_bytes;
    }
#endif
    return -1;
  };
#ifdef FLASHNEXT_HAVE_CUDA
  if (ops->device() == Device::CUDA) {
    const CudaDeviceInfo d = cuda_device_info(0);
    gpu = json{{"name", d.name},
               {"compute_capability", fmt::format("{}.{}", d.major, d.minor)},
               {"multiprocessors", d.multiprocessors},
               {"sm_clock_mhz", d.sm_clock_mhz},
               {"memory_clock_mhz", d.memory_clock_mhz},
               {"memory_bus_bits", d.memory_bus_bits},
               {"driver_version", d.driver_version},
               {"runtime_version", d.runtime_version},
               {"total_bytes", d.total_bytes},
               {"programmatic_launch", cuda_programmatic_launch(0)},
               {"w4a16_gemv", cuda_w4a16_gemv_tensor_cores(0) ? "tensor_cores" : "fma"}};
  }
#endif
  gpu_used_after_build = gpu_used();
  int64_t gpu_peak = gpu_used_after_build;
  auto note_memory = [&] { gpu_peak = std::max(gpu_peak, gpu_used()); };

  const int64_t bs = a.block_size, V = cfg.vocab_size;
  auto log = [&](const std::string& s) {
    if (!a.json) fmt::print(stderr, "bench: {}\n", s);
  };
  log(fmt::format("model built in {:.1f} s ({}); {}", build_s, random_model ? "random weights" : a.model, ops->name()));

  // Prefill and batch-1 decode share one pool of two slots (slot 0 measured, slot 1 the warm-up).
  json prefill_runs = json::array(), decode = nullptr, sanity = nullptr, speculative = nullptr;
  {
    const int64_t positions = std::max<int64_t>(longest + 16, 600);
    PoolSeqs pool{m, m.new_cache(2 * ((positions + bs - 1) / bs + 1), bs, 2)};
    {  // warm-up: kernels loaded, workspaces grown (512 tokens, fewer when every measured prompt is shorter)
      int64_t warm = std::min<int64_t>(512, a.decode_tokens > 0 ? a.decode_context : 512);
      for (int64_t P : a.prompts) warm = std::min(warm, P);
      SequenceState w = pool.take(1, warm + 8);
      (void)prefill(m, w, random_ids(warm, V, a.seed + 99), a.chunk);
      // The random weights keep activations in range: the logits of the warm-up prompt's next token are finite.
      const std::vector<float> l = m.download(m.forward_tensor(w, std::vector<int32_t>{1}, LogitsMode::Last));
      double ss = 0, mx = 0;
      bool finite = true;
      for (float v : l) {
        finite = finite && std::isfinite(v);
        ss += double(v) * v;
        mx = std::max(mx, double(std::fabs(v)));
      }
      FN_CHECK(finite, "bench: the model's logits are not finite (a weight or activation overflowed)");
      sanity = json{{"warmup_logit_rms", std::sqrt(ss / double(l.size()))}, {"warmup_logit_max_abs", mx}};
      for (int i = 0; i < 3; ++i) {
        const int32_t tok = int32_t(i);
        (void)sample(m, m.forward_tensor(w, {&tok, 1}, LogitsMode::Last), 0.f, 0, 0);
      }
    }
    const int64_t base = pool.next_block;
    const std::vector<int64_t> chunks = a.prefill_chunks.empty() ? std::vector<int64_t>{a.chunk} : a.prefill_chunks;
    for (int64_t chunk : chunks)
      for (int64_t P : a.prompts) {
        std::vector<double> runs;
        StepCost cost;
        json prof = nullptr;
        const int runs_of_p = P > kLongPrompt ? 1 : a.repeat;
        for (int r = 0; r < runs_of_p; ++r) {
          pool.next_block = base;
          SequenceState s = pool.take(0, P);
          const bool profiled = a.profile && r + 1 == runs_of_p;
          ops->set_profiling(profiled);
          auto [t, c] = prefill(m, s, random_ids(P, V, a.seed + uint64_t(P) * 7 + uint64_t(r)), chunk);
          if (profiled) prof = profile_json(ops->profile_times(), 1.0);
          ops->set_profiling(false);
          runs.push_back(t);
          cost = c;
          note_memory();
        }
        json trace = nullptr;
        if (a.kernel_trace)  // one more run, untimed, with the kernels traced
          trace = kernel_trace_json(*ops, 1, [&] {
            pool.next_block = base;
            SequenceState s = pool.take(0, P);
            (void)prefill(m, s, random_ids(P, V, a.seed + uint64_t(P) * 7), chunk);
          });
        const double t = median(runs);
        const double ratio = ceil.known() ? cost.flops / ceil.flops_per_s / t : 0;
        json j{{"prompt_tokens", P},
               {"chunk", chunk},
               {"runs_s", runs},
               {"ttft_s", t},
               {"tokens_per_s", double(P) / t},
               {"flops", cost.flops},
               {"tflops_per_s", cost.flops / t / 1e12},
               {"ratio_to_compute_ceiling", ceil.known() ? json(ratio) : json()}};
        if (a.profile) j["profile_ms"] = prof;
        if (a.kernel_trace) {
          j["kernel_trace"] = trace;
          if (trace.is_null())
            log("--kernel-trace: no trace (this build has no CUPTI, or CUPTI refused: another "
                "profiler attached?)");
        }
        prefill_runs.push_back(j);
        log(
            fmt::format("prefill {:>6} tokens{}: {:8.0f} tokens/s, TTFT {:.3f} s, {:.1f} TFLOP/s ({} of the compute "
                        "ceiling)",
                        P, chunks.size() > 1 || chunk < P ? fmt::format(" (chunks of {})", chunk) : std::string(),
                        double(P) / t, t, cost.flops / t / 1e12, fmt_ratio(ratio)));
      }

    if (a.decode_tokens > 0) {  // batch 1: decode_context in, decode_tokens out
      pool.next_block = base;
      const int kProfileSteps = int(std::min<int64_t>(16, a.decode_tokens));  // marked steps after the timed ones
      const int kCountSteps = 8;  // then steps with CUDA API counting on (launches per step)
      const int kTraceSteps = a.kernel_trace ? 8 : 0;  // then steps with the kernels traced
      SequenceState s = pool.take(0, a.decode_context + a.decode_tokens + kProfileSteps + kCountSteps + kTraceSteps);
      const auto [t_first, pc] = prefill(m, s, random_ids(a.decode_context, V, a.seed + 5), a.chunk);
      (void)pc;
      std::vector<Clock::time_point> emitted{Clock::now()};  // token 1 (from the prefill)
      int32_t tok = int32_t(random_bits(a.seed, 77) % uint64_t(V));
      std::vector<double> steps, issue;  // issue: host time until forward_tensor returns (the GPU may still run)
      const Model::StepGraphStats graphs0 = m.step_graph_stats();
      for (int64_t i = 2; i <= a.decode_tokens; ++i) {
        Tensor logits = m.forward_tensor(s, {&tok, 1}, LogitsMode::Last);
        issue.push_back(seconds(emitted.back(), Clock::now()));
        tok = sample(m, logits, 0.f, 0, 0)[0];
        emitted.push_back(Clock::now());
        steps.push_back(seconds(emitted[emitted.size() - 2], emitted.back()));
      }
      const int64_t skip = a.decode_skip;
      const double span = seconds(emitted[size_t(skip - 1)], emitted.back());
      const double tps = double(a.decode_tokens - skip) / span;
      const StepWork w{1, a.decode_context + a.decode_tokens / 2};
      const StepCost c = step_cost(m, {&w, 1}, 1);
      const double step_s = span / double(a.decode_tokens - skip);
      const double ratio = ceil.known() ? c.device_bytes() / ceil.bytes_per_s / step_s : 0;
      decode = json{{"context_tokens", a.decode_context},
                    {"output_tokens", a.decode_tokens},
                    {"timed_tokens", fmt::format("{}-{}", skip + 1, a.decode_tokens)},
                    {"prefill_ttft_s", t_first},
                    {"tokens_per_s", tps},
                    {"step_ms_median", 1e3 * median(steps)},
                    {"step_ms_p90", 1e3 * percentile(steps, 0.9)},
                    {"host_issue_ms_median", 1e3 * median(issue)},
                    {"bytes_per_step", c.device_bytes()},
                    {"weight_bytes_per_step", c.weight_bytes},
                    {"cache_bytes_per_step", c.cache_bytes},
                    {"host_bytes_per_step", c.host_bytes},
                    {"achieved_bytes_per_s", c.device_bytes() / step_s},
                    {"ratio_to_bytes_roofline", ceil.known() ? json(ratio) : json()},
                    {"roofline_tokens_per_s", ceil.known() ? json(ceil.bytes_per_s / c.device_bytes()) : json()},
                    {"step_graphs", step_graphs_json(graphs0, m.step_graph_stats())}};
      if (a.profile) {  // a few more steps with the phase marks on (not part of the timing above)
        ops->set_profiling(true);
        const auto t0 = Clock::now();
        int done = 0;
        for (; done < kProfileSteps; ++done) {
          Tensor logits = m.forward_tensor(s, {&tok, 1}, LogitsMode::Last);
          ops->profile_phase("sampling");
          tok = sample(m, logits, 0.f, 0, 0)[0];
          ops->profile_phase(nullptr);
        }
        const double wall_ms = 1e3 * seconds(t0, Clock::now()) / std::max(1, done);
        const auto times = ops->profile_times();
        ops->set_profiling(false);
        decode["profile_ms_per_step"] = profile_json(times, std::max(1, done));
        decode["profile_wall_ms_per_step"] = wall_ms;
        decode["profile_host_gap_ms_per_step"] = wall_ms - sum_ms(times) / std::max(1, done);
      }
      if (a.kernel_trace) {
        decode["kernel_trace"] = kernel_trace_json(*ops, kTraceSteps, [&] {
          Tensor logits = m.forward_tensor(s, {&tok, 1}, LogitsMode::Last);
          tok = sample(m, logits, 0.f, 0, 0)[0];
        });
        if (decode["kernel_trace"].is_null()) log("--kernel-trace: no trace of the decode steps (no CUPTI)");
      }
      decode["launches_per_step"] = nullptr;
      decode["memcpys_per_step"] = nullptr;
      decode["memsets_per_step"] = nullptr;
#ifdef FLASHNEXT_HAVE_CUDA
      if (ops->device() == Device::CUDA && cuda_api_counting(true)) {  // not timed: counting slows the host
        for (int i = 0; i < kCountSteps; ++i) {
          Tensor logits = m.forward_tensor(s, {&tok, 1}, LogitsMode::Last);
          tok = sample(m, logits, 0.f, 0, 0)[0];
        }
        ops->synchronize();
        const CudaApiCounts n = cuda_api_counts();
        cuda_api_counting(false);
        decode["launches_per_step"] = double(n.kernel_launches) / kCountSteps;
        decode["memcpys_per_step"] = double(n.memcpys) / kCountSteps;
        decode["memsets_per_step"] = double(n.memsets) / kCountSteps;
        log(fmt::format("decode batch 1: {:.0f} kernel launches, {:.0f} copies and {:.0f} sets per step",
                        double(n.kernel_launches) / kCountSteps, double(n.memcpys) / kCountSteps,
                        double(n.memsets) / kCountSteps));
      }
#endif
      note_memory();
      log(fmt::format("decode {} in / {} out, batch 1: {:.1f} tokens/s (tokens {}-{}), step {:.2f} ms median, {:.2f} "
                      "GB/step, {} of the bytes roofline",
                      a.decode_context, a.decode_tokens, tps, skip + 1, a.decode_tokens, 1e3 * median(steps),
                      c.device_bytes() / 1e9, fmt_ratio(ratio)));
    }
    if (spec.enabled()) speculative = speculative_decode(m, a, spec, pool, base, log);
  }

  // Batched decode: one prompt of batch_context tokens prefilled once, copied into every sequence of the batch;
  // each step feeds every sequence its own sampled token (temperature 1, one seed per sequence, so the sequences
  // diverge and route to different experts).
  json batch_runs = json::array();
  if (!a.batches.empty()) {
    const int64_t bmax = *std::max_element(a.batches.begin(), a.batches.end());
    const int64_t per = (a.batch_context + a.batch_steps + 1 + bs - 1) / bs;  // + the profiled step
    PoolSeqs pool{m, m.new_cache((bmax + 1) * per, bs, int32_t(bmax + 1))};
    SequenceState src = pool.take(int32_t(bmax), a.batch_context);
    (void)prefill(m, src, random_ids(a.batch_context, V, a.seed + 11), a.chunk);
    const int64_t base = pool.next_block;
    for (int64_t B : a.batches) {
      pool.next_block = base;
      std::vector<SequenceState> seqs;
      for (int64_t b = 0; b < B; ++b) {
        seqs.push_back(pool.take(int32_t(b), a.batch_context + a.batch_steps + 1));
        m.copy_sequence(src, seqs.back());
      }
      std::vector<int32_t> toks(static_cast<size_t>(B));
      for (int64_t b = 0; b < B; ++b) toks[size_t(b)] = int32_t(random_bits(a.seed + 3, uint64_t(b)) % uint64_t(V));
      std::vector<double> steps;
      json prof = nullptr;
      double prof_wall = 0, prof_gap = 0;
      // The experts the router really picks: counted in the first warm-up step (its downloads are not timed).
      double hit_sum = 0;
      int64_t hit_layers = 0;
      const Model::StepGraphStats graphs0 = m.step_graph_stats();
      for (int64_t i = 0; i < a.batch_steps + (a.profile ? 1 : 0); ++i) {
        const bool profiled = i == a.batch_steps;  // one more step with the phase marks on, not timed
        ops->set_profiling(profiled);
        if (i == 0) {
          m.set_router_observer([&](int64_t, const Tensor& ids) {
            std::vector<int32_t> h(size_t(ids.numel()));
            ops->download(ids, h.data());
            std::sort(h.begin(), h.end());
            hit_sum += double(std::unique(h.begin(), h.end()) - h.begin());
            ++hit_layers;
          });
        }
        std::vector<BatchItem> items;
        for (int64_t b = 0; b < B; ++b) items.push_back({&seqs[size_t(b)], {&toks[size_t(b)], 1}, LogitsMode::Last});
        const auto t0 = Clock::now();
        Tensor logits = m.forward_batch(items);
        ops->profile_phase("sampling");
        toks = sample(m, logits, 1.f, a.seed + 1000 * uint64_t(B), uint64_t(i));
        ops->profile_phase(nullptr);
        const double t = seconds(t0, Clock::now());
        if (profiled) {
          const auto times = ops->profile_times();
          prof = profile_json(times, 1.0);
          prof_wall = 1e3 * t;
          prof_gap = prof_wall - sum_ms(times);
        } else if (i >= 2) {  // two warm-up steps
          steps.push_back(t);
        }
        ops->set_profiling(false);
        m.set_router_observer({});
      }
      note_memory();
      const double step_s = median(steps);
      std::vector<StepWork> work(static_cast<size_t>(B), StepWork{1, a.batch_context + a.batch_steps / 2});
      const double hit = hit_layers > 0 ? hit_sum / double(hit_layers) : 0;
      const StepCost c = step_cost(m, work, B, hit);
      const StepCost uniform = step_cost(m, work, B);
      const double ratio = ceil.known() ? c.device_bytes() / ceil.bytes_per_s / step_s : 0;
      json j{{"batch", B},
             {"context_tokens", a.batch_context},
             {"steps_timed", int64_t(steps.size())},
             {"step_ms_median", 1e3 * step_s},
             {"tokens_per_s", double(B) / step_s},
             {"experts_hit_per_layer", c.experts_hit},
             {"experts_hit_per_layer_uniform", uniform.experts_hit},
             {"bytes_per_step", c.device_bytes()},
             {"weight_bytes_per_step", c.weight_bytes},
             {"cache_bytes_per_step", c.cache_bytes},
             {"achieved_bytes_per_s", c.device_bytes() / step_s},
             {"ratio_to_bytes_roofline", ceil.known() ? json(ratio) : json()},
             {"step_graphs", step_graphs_json(graphs0, m.step_graph_stats())}};
      if (a.profile) {
        j["profile_ms_per_step"] = prof;
        j["profile_wall_ms_per_step"] = prof_wall;
        j["profile_host_gap_ms_per_step"] = prof_gap;
      }
      batch_runs.push_back(j);
      log(fmt::format("decode batch {:>3} at {} context: {:8.1f} tokens/s, step {:.2f} ms, {:.2f} GB/step ({:.0f} "
                      "experts/layer), {} of the bytes roofline",
                      B, a.batch_context, double(B) / step_s, 1e3 * step_s, c.device_bytes() / 1e9, c.experts_hit,
                      fmt_ratio(ratio)));
    }
  }

  // The V100 projection: the bytes (decode) and FLOPs (prefill) this run counted, on 1, 2 and 4 V100s at the
  // fraction of the roofline measured here, and the decode bytes plus launches at the launch cost measured here.
  double launch_cost_us = 0;
#ifdef FLASHNEXT_HAVE_CUDA
  if (ops->device() == Device::CUDA) launch_cost_us = cuda_launch_cost_us(0);
#endif
  json v100 = nullptr;
  if (ceil.known() && ceil.name != "V100") {
    json dec = json::object(), pre = json::object();
    for (int n : {1, 2, 4}) {
      if (!decode.is_null()) {
        const double bytes = decode["bytes_per_step"].get<double>();
        const double roof = n * kV100Bytes / bytes;
        json d{{"roofline_tokens_per_s", roof},
               {"at_measured_ratio_tokens_per_s", roof * decode["ratio_to_bytes_roofline"].get<double>()},
               {"bytes_plus_launches_tokens_per_s", nullptr}};
        if (decode["launches_per_step"].is_number() && launch_cost_us > 0)
          d["bytes_plus_launches_tokens_per_s"] =
              1.0 / (bytes / (n * kV100Bytes) + decode["launches_per_step"].get<double>() * launch_cost_us * 1e-6);
        dec[std::to_string(n)] = d;
      }
      if (!prefill_runs.empty()) {
        json per = json::object();
        for (const json& p : prefill_runs) {
          const double f = p["flops"].get<double>() / p["prompt_tokens"].get<double>();
          per[std::to_string(p["prompt_tokens"].get<int64_t>())] =
              n * kV100Flops / f * p["ratio_to_compute_ceiling"].get<double>();
        }
        pre[std::to_string(n)] = per;
      }
    }
    v100 = json{{"method",
                 "n V100s (900 GB/s, 125 TFLOP/s each, docs/LIMITS.md) reading the bytes (decode) or doing the FLOPs "
                 "(prefill) this run counted, split evenly over n GPUs, at the fraction of the roofline measured "
                 "here; bytes_plus_launches_tokens_per_s: 1 / (bytes / (n * 900 GB/s) + launches per step * the "
                 "empty-kernel launch cost measured here): every GPU of a TP group launches every kernel; collectives "
                 "(TP) not included"},
                {"launch_cost_us", launch_cost_us > 0 ? json(launch_cost_us) : json()},
                {"decode_batch1", dec},
                {"prefill_tokens_per_s_at_measured_ratio", pre}};
  }

  json report{{"build",
               {{"commit", FLASHNEXT_GIT_COMMIT},
                {"dirty", FLASHNEXT_GIT_DIRTY},
                {"build_type", FLASHNEXT_BUILD_TYPE},
                {"cuda_architectures", FLASHNEXT_CUDA_ARCHS},
                {"compiler", FLASHNEXT_COMPILER}}},
              {"device",
               {{"backend", ops->name()},
                {"gpu", gpu},
                {"tp", a.tp},
                {"tp_communicator", model->tp() > 1 ? json(model->communicator_kind()) : json()},
                {"host_cpus", std::thread::hardware_concurrency()}}},
              {"model",
               {{"source", random_model ? "random" : a.model},
                {"config", config_path},
                {"layers", cfg.num_hidden_layers},
                {"gdn_layers", cfg.num_layers_of(LayerKind::GatedDeltaNet)},
                {"qsa_layers", cfg.num_layers_of(LayerKind::QSA)},
                {"hidden_size", cfg.hidden_size},
                {"experts", cfg.num_experts},
                {"experts_per_token", cfg.num_experts_per_tok},
                {"vocab", cfg.vocab_size},
                {"ple_bytes", ple_bytes},
                {"routed_experts", m.weights().layers.empty() ? json()
                                   : m.weights().layers[0].moe.packed
                                       ? json(m.weights().layers[0].moe.packed->format())
                                       : json(dtype_name(m.weights().layers[0].moe.gate.dtype()))},
                {"seed", a.seed}}},
              {"build_times_s",
               {{"total", build_s},
                {"weights", random_model ? json(built.weights_s) : json()},
                {"ple_alloc_pin", random_model ? json(built.ple_alloc_s) : json()},
                {"ple_fill", random_model ? json(built.ple_fill_s) : json()},
                {"ple_fill_threads", random_model ? json(built.ple_fill_threads) : json()}}},
              {"memory",
               {{"gpu_used_after_build_bytes", gpu_used_after_build},
                {"gpu_used_peak_bytes", gpu_peak},
                {"host_peak_rss_bytes", host_peak_rss_bytes()}}},
              {"ceilings", ceil.known() ? json{{"device", ceil.name},
                                               {"bytes_per_s", ceil.bytes_per_s},
                                               {"flops_per_s", ceil.flops_per_s},
                                               {"source", ceil.source}}
                                        : json()},
              {"sanity", sanity},
              {"settings",
               {{"chunk", a.chunk},
                {"block_size", bs},
                {"repeat", a.repeat},
                {"profile", a.profile},
                {"decode_context", a.decode_context},
                {"decode_tokens", a.decode_tokens},
                {"batch_context", a.batch_context},
                {"batch_steps", a.batch_steps}}},
              {"prefill", prefill_runs},
              {"decode", decode},
              {"speculative", speculative},
              {"batch_decode", batch_runs},
              {"v100_projection", v100}};
  const std::string text = report.dump(2) + "\n";
  if (!a.out.empty()) {
    std::ofstream f(a.out, std::ios::binary);
    FN_CHECK(f.good(), "--out: cannot write {}", a.out);
    f << text;
  }
  if (a.json) {
    std::fwrite(text.data(), 1, text.size(), stdout);
  } else {
    fmt::print("commit {}{} | {}{} | {}host peak RSS {:.1f} GB\n", std::string(FLASHNEXT_GIT_COMMIT).substr(0, 12),
               FLASHNEXT_GIT_DIRTY ? "+dirty" : "", ops->name(),
               model->tp() > 1 ? fmt::format(" x TP {} ({}; figures of GPU 0)", model->tp(), model->communicator_kind())
                               : std::string(),
               gpu_used_after_build < 0 ? std::string()
                                        : fmt::format("GPU memory {:.1f} GB after build, {:.1f} GB peak | ",
                                                      double(gpu_used_after_build) / 1e9, double(gpu_peak) / 1e9),
               double(host_peak_rss_bytes()) / 1e9);
    if (random_model)
      fmt::print("build {:.1f} s (weights {:.1f} s; PLE table {:.2f} GB: pin {:.1f} s, fill {:.1f} s on {} threads)\n",
                 build_s, built.weights_s, double(ple_bytes) / 1e9, built.ple_alloc_s, built.ple_fill_s,
                 built.ple_fill_threads);
    for (const json& p : prefill_runs) {
      const int64_t P = p["prompt_tokens"].get<int64_t>(), chunk = p["chunk"].get<int64_t>();
      fmt::print("prefill {:>6}{}: {:9.0f} tok/s  TTFT {:7.3f} s  {:6.1f} TFLOP/s  {}\n", P,
                 chunk < P || !a.prefill_chunks.empty() ? fmt::format(" (chunks of {})", chunk) : std::string(),
                 p["tokens_per_s"].get<double>(), p["ttft_s"].get<double>(), p["tflops_per_s"].get<double>(),
                 p["ratio_to_compute_ceiling"].is_null() ? "" : fmt_ratio(p["ratio_to_compute_ceiling"].get<double>()));
    }
    if (!decode.is_null())
      fmt::print(
          "decode b=1 {}/{}: {:7.1f} tok/s  step {:.2f} ms (host issue {:.2f})  {:.2f} GB/step  {}\n", a.decode_context,
          a.decode_tokens, decode["tokens_per_s"].get<double>(), decode["step_ms_median"].get<double>(),
          decode["host_issue_ms_median"].get<double>(), decode["bytes_per_step"].get<double>() / 1e9,
          decode["ratio_to_bytes_roofline"].is_null() ? ""
                                                      : fmt_ratio(decode["ratio_to_bytes_roofline"].get<double>()));
    for (const json& b : batch_runs)
      fmt::print("decode b={:<3} ctx {}: {:8.1f} tok/s  step {:.2f} ms  {:.2f} GB/step  {}\n", b["batch"].get<int64_t>(),
                 b["context_tokens"].get<int64_t>(), b["tokens_per_s"].get<double>(), b["step_ms_median"].get<double>(),
                 b["bytes_per_step"].get<double>() / 1e9,
                 b["ratio_to_bytes_roofline"].is_null() ? "" : fmt_ratio(b["ratio_to_bytes_roofline"].get<double>()));
    if (a.profile && !decode.is_null() && decode.contains("profile_ms_per_step")) {
      fmt::print("decode b=1 per step (ms):");
      for (const auto& [k, v] : decode["profile_ms_per_step"].items()) fmt::print(" {} {:.3f}", k, v.get<double>());
      fmt::print(" | host gap {:.3f}\n", decode["profile_host_gap_ms_per_step"].get<double>());
    }
    for (const json& p : prefill_runs)
      if (p.contains("kernel_trace"))
        print_kernel_trace(p["kernel_trace"], fmt::format("prefill {}", p["prompt_tokens"].get<int64_t>()), 30);
    if (!decode.is_null() && decode.contains("kernel_trace"))
      print_kernel_trace(decode["kernel_trace"], "decode b=1", 40, "by_kernel_grid");
    if (!decode.is_null() && decode["launches_per_step"].is_number()) {
      fmt::print("decode b=1 per step: {:.0f} kernel launches, {:.0f} copies, {:.0f} sets (empty-kernel launch {:.2f} us)\n",
                 decode["launches_per_step"].get<double>(), decode["memcpys_per_step"].get<double>(),
                 decode["memsets_per_step"].get<double>(), launch_cost_us);
      if (!v100.is_null()) {
        fmt::print("V100 projection, decode b=1 (bytes + launches):");
        for (const char* n : {"1", "2", "4"})
          if (v100["decode_batch1"][n]["bytes_plus_launches_tokens_per_s"].is_number())
            fmt::print(" {}x {:.0f} tok/s", n, v100["decode_batch1"][n]["bytes_plus_launches_tokens_per_s"].get<double>());
        fmt::print("\n");
      }
    }
  }
  return 0;
}

std::vector<int64_t> parse_list(const std::string& s, const char* flag) {
  std::vector<int64_t> out;
  if (s.empty() || s == "none") return out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      FN_CHECK(used == item.size(), "");
      out.push_back(v);
    } catch (...) {
      fail("{} expects a comma-separated list of integers (or 'none'), got '{}'", flag, s);
    }
  }
  return out;
}

}  // namespace

FLASHNEXT_SUBCOMMAND(
    bench, "bench",
    "Benchmark prefill and decode at the released geometry (random weights on the device) or of --model DIR",
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<BenchArgs>();
      auto prompts = std::make_shared<std::string>("1024,4096,8192,32768");
      auto batches = std::make_shared<std::string>("8,32,64");
      sub.add_option("--model", a->model, "benchmark this checkpoint folder instead of a random-weight model");
      sub.add_option("--config", a->config, "config.json of the random-weight model (default: models/release/config.json)");
      sub.add_option("--device", a->device, "cuda (default) or cpu")->check(CLI::IsMember({"cpu", "cuda"}));
      sub.add_option("--threads", a->threads, "CPU threads (0 = all cores)")->check(cli::non_negative_number());
      sub.add_option("--tp", a->tp, "tensor-parallel ranks (rank r on GPU r; on the CPU threads of this process)")
          ->check(cli::positive_number());
      cli::add_node_options(sub, a->nodes);
      sub.add_option("--layers", a->layers, "first N layers of the config's layer_types (PLE layers beyond N dropped)");
      sub.add_option("--experts", a->experts, "routed experts per MoE layer");
      sub.add_option("--experts-per-token", a->experts_per_token, "routed experts per token (top-k)");
      sub.add_option("--vocab", a->vocab, "vocabulary size");
      sub.add_option("--ple-rows", a->ple_rows, "about N rows in the PLE table (for hosts with less memory)");
      sub.add_option("--seed", a->seed, "seed of the random weights and token ids (default 1)");
      // The defaults measure a GPU at the released geometry; on the CPU (float32 oracle) they would run for hours, so
      // there the flags a user does not give take the small values beside them (said on stderr).
      std::vector<std::pair<CLI::Option*, const char*>> cpu_defaults;
      auto scaled = [&](CLI::Option* o, const char* cpu_value) {
        o->description(fmt::format("{} (--device cpu: {})", o->get_description(), cpu_value));
        cpu_defaults.emplace_back(o, cpu_value);
      };
      scaled(sub.add_option("--prompts", *prompts,
                            "prefill prompt lengths, comma-separated, or 'none' (default 1024,4096,8192,32768)"),
             "64,256");
      scaled(sub.add_option("--chunk", a->chunk, "prefill chunk size in tokens (default 8192)"), "256");
      auto prefill_chunks = std::make_shared<std::string>();
      sub.add_option("--prefill-chunks", *prefill_chunks,
                     "the prefill runs' chunk sizes, comma-separated: every prompt length once per size (default: "
                     "--chunk); decode and batched decode prefill with --chunk");
      sub.add_option("--block-size", a->block_size, "KV cache block size in positions (default 16, as serve)");
      scaled(sub.add_option("--decode-context", a->decode_context,
                            "prompt tokens before the batch-1 decode (default 8192)"),
             "128");
      scaled(sub.add_option("--decode-tokens", a->decode_tokens,
                            "tokens emitted by the batch-1 decode, 0 = none (default 512)"),
             "40");
      scaled(sub.add_option("--decode-skip", a->decode_skip,
                            "emitted tokens not timed (default 32: tokens 33-512 are timed)"),
             "8");
      scaled(
          sub.add_option("--batches", *batches, "batched-decode sizes, comma-separated, or 'none' (default 8,32,64)"),
          "2,4");
      scaled(sub.add_option("--batch-context", a->batch_context,
                            "context of every sequence of a batched decode (default 8192)"),
             "64");
      scaled(sub.add_option("--batch-steps", a->batch_steps, "steps per batch size, the first 2 untimed (default 32)"),
             "6");
      scaled(sub.add_option("--repeat", a->repeat,
                            "runs per prefill length, the median reported; prompts over 16K run once (default 3)"),
             "1");
      sub.add_option("--speculative", a->speculative,
                     "also batch-1 speculative decoding, mtp:K (a random MTP layer) or ngram:K, at forced acceptance "
                     "rates (docs/BENCH.md)");
      sub.add_option("--acceptance", a->acceptance,
                     "with --speculative: fractions of the drafts accepted per step (default 0,0.5,1)")
          ->delimiter(',');
      sub.add_option("--spec-steps", a->spec_steps, "with --speculative: verify steps per rate, 4 untimed (default 24)");
      sub.add_option("--spec-rollback", a->spec_rollback,
                     "with --speculative: how a rollback advances the state over the accepted tokens, every rate once "
                     "per mode listed: replay (their GDN and PLE state ops from the verify's kept inputs, default), "
                     "refeed (a forward over them)")
          ->delimiter(',');
      sub.add_flag("--profile", a->profile, "per-phase device time of a prefill run and of decode steps");
      sub.add_flag("--kernel-trace", a->kernel_trace,
                   "the kernels of one more prefill run per prompt and of 8 more decode steps (CUPTI), each charged "
                   "with the time it alone extends the timeline (docs/BENCH.md)");
      sub.add_flag("--json", a->json, "print one JSON object (docs/BENCH.md) instead of the table");
      sub.add_option("--out", a->out, "also write the JSON report to this file");
      return [a, prompts, batches, prefill_chunks, cpu_defaults] {
        if (a->device == "cpu") {
          std::vector<std::string> applied;
          for (const auto& [o, value] : cpu_defaults)
            if (o->count() == 0) {
              o->clear();
              o->add_result(std::string(value));
              o->run_callback();
              applied.push_back(fmt::format("{} {}", o->get_name(), value));
            }
          if (!applied.empty())
            fmt::print(stderr, "bench: --device cpu: small defaults {} (give a flag to change it)\n",
                       fmt::join(applied, ", "));
        }
        a->prompts = parse_list(*prompts, "--prompts");
        a->batches = parse_list(*batches, "--batches");
        if (!prefill_chunks->empty()) a->prefill_chunks = parse_list(*prefill_chunks, "--prefill-chunks");
        return run(*a);
      };
    });
