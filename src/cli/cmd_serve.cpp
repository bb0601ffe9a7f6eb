// `flashnext serve [--model DIR] [--device cpu|cuda] [--host H] [--port P] [--max-model-len N] [--max-num-seqs N]
// [--max-num-batched-tokens N] [--gpu-memory-utilization F] [--kv-cache-memory-bytes B] [--api-key KEY]
// [--served-model-name NAME] [--max-request-bytes B] [--http-threads N] [--max-connections N] [--header-timeout S]
// [--read-timeout S] [--body-timeout S] [--strict-requests] [--allowed-origins LIST] [--allowed-methods LIST]
// [--allowed-headers LIST]
// [--allow-credentials] [--no-enable-prefix-caching] [--prefix-cache-snapshot-interval N] [--speculative
// mtp:K|ngram:K]`: the OpenAI-compatible server (server/server.h) over the continuous-batching scheduler
// (engine/scheduler.h). Logs one line per request; SIGINT / SIGTERM stop it cleanly.
#include <fmt/ranges.h>
#include <malloc.h>
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <csignal>
#include <filesystem>
#include <thread>

#include "build_info.h"
#include "cli/cli.h"
#include "cli/device.h"
#include "cli/load_progress.h"
#include "core/error.h"
#include "engine/loaded_model.h"
#include "engine/model_dir.h"
#include "engine/scheduler.h"
#include "loader/memory_plan.h"
#include "server/http_policy.h"
#include "server/server.h"

namespace {

using namespace flashnext;

struct ServeArgs {
  std::string model, device = "cpu", host = "127.0.0.1", api_key, log_level = "info", reasoning_parser = "qwen3";
  std::vector<std::string> served_model_names;
  int port = 8000, threads = 0, tp = 1;
  cli::NodeArgs nodes;
  int64_t max_model_len = 0, max_num_seqs = 64, max_num_batched_tokens = 2048, prefill_chunk_size = 0,
          max_queued_requests = 256, block_size = 16;
  int64_t kv_cache_memory_bytes = int64_t(4) << 30;  // vLLM's CPU default (VLLM_CPU_KVCACHE_SPACE=4 GiB)
  std::optional<double> gpu_memory_utilization;
  bool reject_control_token_text = false;
  std::string sampler = "auto";
  std::string scheduling_policy = "fcfs";
  int64_t max_request_bytes = 0;
  int http_threads = 0, max_connections = 1024, header_timeout = 10, read_timeout = 10, body_timeout = 30;
  bool strict_requests = false, allow_credentials = false;
  std::string allowed_origins, allowed_methods = "*", allowed_headers = "*";  // lists: JSON or comma-separated
  bool enable_prefix_caching = true, prefix_caching_given = false;  // given: --[no-]enable-prefix-caching was passed
  std::string speculative;                                          // --speculative mtp:K | ngram:K
  cli::WeightArgs weights;                                          // --load-format, --hf-overrides
  int64_t prefix_cache_snapshot_interval = PrefixCacheConfig{}.snapshot_interval_blocks;
  int64_t prefix_cache_snapshots = 0;  // 0: sized from the budget
};

/// Bytes for KV blocks and state slots on the GPU, as vLLM sizes them: --gpu-memory-utilization (default 0.9) of
/// the GPU's memory, minus what is in use after loading the weights, minus a workspace for one step's
/// activations (about 64 wide rows per batched token, logits of max_num_seqs rows, and 1 GiB for the kernels'
/// scratch). Throws Error when nothing is left.
int64_t gpu_cache_budget(const ServeArgs& a, const ModelConfig& cfg, const SchedulerConfig& sc) {
#ifdef FLASHNEXT_HAVE_CUDA
  const GpuMemory mem = cuda_memory_info(0);
  const double util = a.gpu_memory_utilization.value_or(0.9);
  const int64_t used = mem.total_bytes - mem.free_bytes;
  const int64_t workspace =
      (int64_t(1) << 30) + sc.max_num_batched_tokens * cfg.hc_width() * 4 * 64 + sc.max_num_seqs * cfg.vocab_size * 4;
  const int64_t budget = int64_t(util * double(mem.total_bytes)) - used - workspace;
  spdlog::info("flashnext serve: GPU memory {} bytes, {} in use after loading, workspace {}, cache budget {} ({:.2f})",
               mem.total_bytes, used, workspace, budget, util);
  if (budget <= 0)
    fail(
        "--gpu-memory-utilization {}: {} of {} bytes are in use after loading the model and the step workspace "
        "needs {}; nothing is left for the KV cache (raise it, or lower --max-num-batched-tokens)",
        util, used, mem.total_bytes, workspace);
  return budget;
#else
  (void)a, (void)cfg, (void)sc;
  fail("--device cuda: the CUDA backend is not available in this build");
#endif
}

int run(const ServeArgs& a) {
  spdlog::set_level(spdlog::level::from_str(a.log_level));
  // The list flags are checked before the model loads: a malformed one fails at once.
  server::CorsOptions cors;
  cors.allowed_origins = server::parse_list_flag(a.allowed_origins, "--allowed-origins");
  cors.allowed_methods = server::parse_list_flag(a.allowed_methods, "--allowed-methods");
  cors.allowed_headers = server::parse_list_flag(a.allowed_headers, "--allowed-headers");
  cors.allow_credentials = a.allow_credentials;
  if (a.device == "cpu" && a.gpu_memory_utilization)
    spdlog::warn(
        "--gpu-memory-utilization applies to --device cuda; on the CPU the KV cache budget is "
        "--kv-cache-memory-bytes ({} bytes)",
        a.kv_cache_memory_bytes);

  // Block the stop signals in every thread (they inherit the mask); one thread waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGUSR1);  // sent to ourselves when the server ends on its own
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client that vanished is a failed write, not a dead process
  // Blocks of 1 MiB or more (request bodies, their parsed strings) are mapped on their own and unmapped when
  // freed. glibc's default threshold rises to the largest block freed so far (up to 32 MiB), after which such
  // blocks come from the worker threads' arenas, whose freed tops malloc_trim does not return: a few large bodies
  // kept gigabytes resident across hundreds of HTTP threads.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);

  const SpeculativeConfig spec = SpeculativeConfig::parse(a.speculative);  // before any weight is read
  const WeightSource weights = cli::weight_source(a.weights);
  const std::string dir = resolve_model_dir(a.model);
  ModelOptions mo;
  const bool mtp = spec.method == SpeculativeConfig::Method::Mtp;
  cli::set_backend(mo, a.device, a.threads, a.tp, a.nodes, cli::node_fingerprint(a.nodes, dir, mtp, weights));
  if (!weights.dummy) mo.progress = cli::LoadProgressPrinter();
  mo.load_mtp = mtp;
  LoadedModel m = [&] {
    try {
      return LoadedModel::load(dir, mo, /*with_chat_template=*/true, weights);
    } catch (const Error& e) {
      if (!mo.load_mtp) throw;
      fail("--speculative {}: {}", spec.str(), e.what());  // say which flag asked for the MTP layer
    }
  }();
  if (!m.model->leads()) {  // a follower node serves nothing: Ctrl-C and SIGTERM end it as any process
    pthread_sigmask(SIG_UNBLOCK, &stop_signals, nullptr);
    return cli::follow_leader(*m.model, a.nodes) ? 0 : 1;
  }
  const ModelConfig& cfg = m.model->config();

  SchedulerConfig sc;
  sc.max_num_seqs = a.max_num_seqs;
  sc.max_num_batched_tokens = a.max_num_batched_tokens;
  sc.prefill_chunk_size = a.prefill_chunk_size;
  sc.max_model_len = a.max_model_len ? a.max_model_len : cfg.max_position_embeddings;
  sc.max_waiting = a.max_queued_requests;
  sc.policy = a.scheduling_policy == "priority" ? SchedulingPolicy::Priority : SchedulingPolicy::Fcfs;
  sc.speculative = spec;
  if (sc.max_model_len > cfg.max_position_embeddings)
    fail("--max-model-len {} exceeds the model's max_position_embeddings {} ({})", sc.max_model_len,
         cfg.max_position_embeddings, cfg.source);
  // Both backends keep the caches and states in float32: 4 bytes per KV / indexer / conv element.
  StatePlan plan = state_plan(cfg, /*tp=*/1, /*kv_bytes=*/4, /*act_bytes=*/4);
  // The engine also caches the indexer's pooled block keys: one key per indexer_compress_ratio positions.
  plan.indexer_bytes_per_token += plan.indexer_bytes_per_token / cfg.indexer_compress_ratio;
  if (m.model->has_mtp()) {  // the cache pool holds one more QSA layer (the MTP layer's K, V and indexer keys)
    const int64_t qsa = cfg.num_layers_of(LayerKind::QSA);
    plan.kv_bytes_per_token += plan.kv_bytes_per_token / qsa;
    plan.indexer_bytes_per_token += plan.indexer_bytes_per_token / qsa;
  }
  const int64_t budget = a.device == "cuda" ? gpu_cache_budget(a, cfg, sc) : a.kv_cache_memory_bytes;
  PrefixCacheConfig prefix;
  prefix.enabled = a.enable_prefix_caching;
  prefix.snapshot_interval_blocks = a.prefix_cache_snapshot_interval;
  prefix.num_snapshots = a.prefix_cache_snapshots;
  // With speculation every sequence slot has a checkpoint slot beside it (the state a rejected verify goes back to).
  const int64_t checkpoints = spec.enabled() ? sc.max_num_seqs : 0;
  if (prefix.enabled && prefix.num_snapshots == 0) {
    prefix.num_snapshots =
        MemoryPlanner::default_snapshots(plan, a.block_size, budget, sc.max_num_seqs, checkpoints, sc.max_model_len);
    if (prefix.num_snapshots < 1) {
      if (a.prefix_caching_given) {
        prefix.num_snapshots = 1;  // asked for: the planner says whether one snapshot fits
      } else {
        prefix.enabled = false;
        spdlog::warn(
            "flashnext serve: prefix caching off: the cache budget ({} bytes) has no room for a state snapshot of {} "
            "bytes beside {} sequence slots and one sequence of --max-model-len {} (--enable-prefix-caching "
            "--prefix-cache-snapshots N to force it)",
            budget, MemoryPlanner::state_slot_bytes(plan), sc.max_num_seqs, sc.max_model_len);
      }
    }
  }
  MemoryPlanner planner(plan, a.block_size, budget, sc.max_num_seqs, prefix, checkpoints);
  ModelRunner runner(*m.model, planner, /*device_sampling=*/a.sampler == "auto");
  Scheduler scheduler(runner, std::move(planner), sc);

  server::ServerOptions so;
  so.host = a.host;
  so.port = a.port;
  so.api_key = a.api_key;
  so.served_model_names = a.served_model_names;
  if (so.served_model_names.empty())
    so.served_model_names.push_back(a.model.empty() ? std::filesystem::path(dir).filename().string() : a.model);
  so.model_dir = dir;
  so.reasoning_parser = a.reasoning_parser == "qwen3";
  so.reject_control_token_text = a.reject_control_token_text;
  so.max_request_bytes = size_t(a.max_request_bytes);
  so.http_threads = a.http_threads;
  so.max_connections = a.max_connections;
  so.header_timeout_s = a.header_timeout;
  so.read_timeout_s = a.read_timeout;
  so.body_timeout_s = a.body_timeout;
  so.strict_requests = a.strict_requests;
  so.cors = cors;
  so.version = FLASHNEXT_GIT_DESCRIBE;
  so.failure = [model = m.model.get()] { return model->failure(); };
  const auto& mp = scheduler.planner();
  server::Server srv(scheduler, m.tokenizer, m.chat_template ? &*m.chat_template : nullptr, m.generation, so);
  const int port = srv.bind();
  spdlog::info(
      "flashnext serve: model {}{} as \"{}\" on {}, max_model_len {}, max_num_seqs {}, "
      "max_num_batched_tokens {}, prefill chunk {}",
      dir,
      weights.dummy ? fmt::format(" (dummy weights{})", weights.hf_overrides.is_null()
                                                            ? std::string()
                                                            : ", --hf-overrides " + weights.hf_overrides.dump())
                    : std::string(),
      so.served_model_names.front(), m.model->ops().name(), sc.max_model_len, sc.max_num_seqs,
      sc.max_num_batched_tokens, scheduler.config().prefill_chunk_size);
  spdlog::info(
      "flashnext serve: memory {} bytes = {} state slots x {} B (GDN + PLE) + {} KV blocks x {} tokens x "
      "{} B/token (K, V, indexer keys)",
      mp.budget_bytes(), mp.total_slots(), mp.slot_bytes(), mp.total_blocks(), mp.block_size(),
      mp.block_size() ? mp.block_bytes() / mp.block_size() : 0);
  if (mp.prefix_caching())
    spdlog::info("flashnext serve: prefix caching on: {} state snapshots x {} B, one every {} blocks ({} tokens)",
                 mp.prefix_config().num_snapshots, mp.slot_bytes(), mp.prefix_config().snapshot_interval_blocks,
                 mp.snapshot_interval());
  if (spec.enabled())
    spdlog::info(
        "flashnext serve: speculative decoding {}: decoding requests verify up to {} drafts per step, {} checkpoint "
        "slots x {} B (request fields num_speculative_tokens, speculative: false to opt out)",
        spec.str(), spec.k, sc.max_num_seqs, mp.slot_bytes());
  if (a.model.empty() && !weights.dummy) spdlog::warn("flashnext serve: {}", kBundledModelNote);
  if (so.cors.enabled())
    spdlog::info("flashnext serve: CORS for origins {} (methods {}, headers {}{})",
                 fmt::join(so.cors.allowed_origins, ","), fmt::join(so.cors.allowed_methods, ","),
                 fmt::join(so.cors.allowed_headers, ","), so.cors.allow_credentials ? ", with credentials" : "");

  std::thread signal_waiter([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (sig != SIGUSR1) spdlog::info("flashnext serve: signal {}, stopping", sig);
    srv.stop();
  });
  scheduler.start();
  spdlog::info("flashnext serve: listening on http://{}:{}", a.host, port);
  srv.run();
  pthread_kill(signal_waiter.native_handle(), SIGUSR1);
  signal_waiter.join();
  scheduler.stop();
  spdlog::info("flashnext serve: stopped");
  return 0;
}

}  // namespace

FLASHNEXT_SUBCOMMAND(
    serve, "serve", "OpenAI-compatible HTTP server with continuous batching",
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<ServeArgs>();
      sub.add_option("--model", a->model,
                     fmt::format("model folder (Hugging Face layout); default: the bundled {}", kBundledModel));
      sub.add_option("--device", a->device, "cpu (default) or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
      cli::add_weight_options(sub, a->weights);
      sub.add_option("--host", a->host, "address to listen on (default 127.0.0.1; 0.0.0.0 = all)");
      sub.add_option("--port", a->port, "TCP port (default 8000; 0 = any free port)")->check(CLI::Range(0, 65535));
      sub.add_option("--max-model-len", a->max_model_len,
                     "most tokens per sequence, prompt + output (default: max_position_embeddings)")
          ->check(cli::non_negative_number());
      sub.add_option("--max-num-seqs", a->max_num_seqs, "most sequences in one batch (default 64)")
          ->check(cli::positive_number());
      sub.add_option("--max-num-batched-tokens", a->max_num_batched_tokens,
                     "most tokens fed in one engine step (default 2048)")
          ->check(cli::positive_number());
      sub.add_option("--prefill-chunk-size", a->prefill_chunk_size,
                     "prefill chunk length (default: max-num-batched-tokens - max-num-seqs + 1)")
          ->check(cli::non_negative_number());
      sub.add_option("--max-queued-requests", a->max_queued_requests,
                     "most requests waiting for a batch slot; more get 503 (default 256)")
          ->check(cli::non_negative_number());
      sub.add_option("--scheduling-policy", a->scheduling_policy,
                     "fcfs (arrival order) or priority (the requests' `priority`, lower first; vLLM's policy)")
          ->check(CLI::IsMember({"fcfs", "priority"}));
      sub.add_option("--gpu-memory-utilization", a->gpu_memory_utilization,
                     "fraction of GPU memory for weights + KV cache (--device cuda)")
          ->check(CLI::Range(0.0, 1.0));
      sub.add_option("--kv-cache-memory-bytes", a->kv_cache_memory_bytes,
                     "bytes for the KV cache and sequence states on the CPU (default 4 GiB)")
          ->check(cli::positive_number());
      sub.add_option("--block-size", a->block_size, "tokens per KV cache block (default 16)")
          ->check(cli::positive_number());
      CLI::Option* enable = sub.add_flag_function(
          "--enable-prefix-caching",
          [a](int64_t) {
            a->enable_prefix_caching = true;
            a->prefix_caching_given = true;
          },
          "reuse the KV blocks and state snapshots of earlier prompts' prefixes (the default, as in vLLM; "
          "docs/ENGINE.md, Prefix caching)");
      sub.add_flag_function(
             "--no-enable-prefix-caching",
             [a](int64_t) {
               a->enable_prefix_caching = false;
               a->prefix_caching_given = true;
             },
             "turn prefix caching off")
          ->excludes(enable);
      CLI::Option* interval =
          sub.add_option("--prefix-cache-snapshot-interval", a->prefix_cache_snapshot_interval,
                         "blocks between two prefix-cache state snapshots; prefill chunks end on them (default 16)")
              ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
      CLI::Option* snapshots =
          sub.add_option("--prefix-cache-snapshots", a->prefix_cache_snapshots,
                         "state snapshots the prefix cache keeps, each the size of a sequence state slot "
                         "(default: --max-num-seqs, at most a quarter of the cache budget)")
              ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
      sub.add_option("--speculative", a->speculative,
                     "speculative decoding of the running requests: mtp:K (the checkpoint's MTP layer) or ngram:K "
                     "(prompt lookup), K drafts per step in 1..8, verified beside the other requests in each step; "
                     "requests opt out with \"speculative\": false or cap K with \"num_speculative_tokens\"");
      sub.add_option("--api-key", a->api_key, "require \"Authorization: Bearer KEY\" on /v1/* (env FLASHNEXT_API_KEY)")
          ->envname("FLASHNEXT_API_KEY");
      sub.add_option("--served-model-name", a->served_model_names,
                     "model name(s) clients use; the first is reported (default: --model)");
      sub.add_option("--reasoning-parser", a->reasoning_parser, "qwen3 (default: <think> -> reasoning_content) or none")
          ->check(CLI::IsMember({"qwen3", "none"}));
      sub.add_option("--sampler", a->sampler,
                     "auto (default: requests without penalties or logprobs sample on the GPU with --device cuda) "
                     "or host (every request samples on the host: the same seeded draws as --device cpu)")
          ->check(CLI::IsMember({"auto", "host"}));
      sub.add_flag("--reject-control-token-text", a->reject_control_token_text,
                   "answer 400 to chat messages that contain special-token text such as "
                   "<|im_start|> (which would otherwise become control tokens)");
      sub.add_option("--max-request-bytes", a->max_request_bytes,
                     "most bytes of a request body; larger ones get 413 before they are read (default: 1 MiB + 32 "
                     "bytes per token of --max-model-len)")
          ->check(cli::non_negative_number());
      sub.add_option("--http-threads", a->http_threads,
                     "HTTP worker threads = most requests handled at once; connections waiting for a request hold "
                     "none (0 or unset: max-num-seqs + max-queued-requests + 16)")
          ->check(cli::non_negative_number());
      sub.add_option("--max-connections", a->max_connections,
                     "most open connections; one more is answered 503 and closed (default 1024)")
          ->check(cli::positive_number());
      sub.add_option("--header-timeout", a->header_timeout,
                     "seconds a request's line and headers may take to arrive whole; slower ones get 408 "
                     "(default 10)")
          ->check(cli::positive_number());
      sub.add_option("--read-timeout", a->read_timeout,
                     "seconds a connection may stay silent while a request is read; then 408 (default 10)")
          ->check(cli::positive_number());
      sub.add_option("--body-timeout", a->body_timeout,
                     "seconds a request body may take to arrive whole; slower ones get 408 (default 30)")
          ->check(cli::positive_number());
      sub.add_flag("--strict-requests", a->strict_requests,
                   "answer 400 to request fields this server does not know (default: ignore them and log each name "
                   "once, as vLLM does)");
      sub.add_option("--allowed-origins", a->allowed_origins,
                     "CORS: origins whose pages may call the server, as a JSON list or comma-separated; * = any "
                     "(default: none, no CORS headers)");
      sub.add_option("--allowed-methods", a->allowed_methods,
                     "CORS: methods a preflight may ask for, JSON list or comma-separated (default *)");
      sub.add_option("--allowed-headers", a->allowed_headers,
                     "CORS: request headers a preflight may ask for, JSON list or comma-separated (default *)");
      sub.add_flag("--allow-credentials", a->allow_credentials,
                   "CORS: allow credentials (Access-Control-Allow-Credentials: true)");
      sub.add_option("--threads", a->threads, "CPU threads (0 = all cores)")->check(cli::non_negative_number());
      sub.add_option("--tp", a->tp, "tensor-parallel ranks (default 1; threads of this process, docs/ENGINE.md)");
      cli::add_node_options(sub, a->nodes);
      sub.add_option("--log-level", a->log_level, "trace, debug, info (default), warn, error")
          ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
      return [a, interval, snapshots] {
        if (!a->enable_prefix_caching)
          for (const CLI::Option* o : {interval, snapshots})
            if (o->count() > 0)
              fail("{} needs prefix caching, which --no-enable-prefix-caching turned off", o->get_name());
        return run(*a);
      };
    });
