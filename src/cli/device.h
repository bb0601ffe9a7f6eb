// The `--device`, `--threads`, `--tp` and node options of the CLI: which ops backend runs the model, over how many
// tensor-parallel ranks, in how many processes.
#pragma once

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <memory>
#include <string>

#include "core/error.h"
#include "engine/loaded_model.h"
#include "loader/config.h"
#include "model/qwen4_exp/model.h"
#include "ops/ops.h"
#include "parallel/node_group.h"
#include "parallel/staged_communicator.h"
#ifdef FLASHNEXT_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/nccl_communicator.h"
#endif

namespace flashnext::cli {

/// The Error of `--device cuda` in a build without the CUDA backend.
[[noreturn]] inline void fail_without_cuda() {
  fail("--device cuda: the CUDA backend is not available in this build (configured without CUDA); use --device cpu");
}

/// The backend for `--device NAME`: "cpu" (the float32 CPU backend with `threads` threads, 0 = all cores) or "cuda"
/// (GPU 0; FLASHNEXT_PLE_TABLE=host|device places the PLE tables). Throws Error for another name, for "cuda" in a
/// build without the CUDA backend, and, from make_cuda_ops, "no CUDA device found (...)" on a machine without a GPU.
inline std::shared_ptr<Ops> make_backend(const std::string& device, int threads) {
  if (device == "cpu") return make_cpu_ops(threads);
  if (device == "cuda") {
#ifdef FLASHNEXT_HAVE_CUDA
    return make_cuda_ops(0);
#else
    fail_without_cuda();
#endif
  }
  fail("--device must be cpu or cuda, got '{}'", device);
}

#ifdef FLASHNEXT_HAVE_CUDA
/// How CUDA ranks communicate, FLASHNEXT_TP_COMM: "nccl" (the default) or "staged". Throws Error for another value.
inline std::string tp_comm_kind_from_env() {
  const char* env = std::getenv("FLASHNEXT_TP_COMM");
  const std::string kind = env && *env ? env : "nccl";
  FN_CHECK(kind == "nccl" || kind == "staged", "FLASHNEXT_TP_COMM must be nccl or staged, got '{}'", kind);
  return kind;
}

/// The communicators of CUDA ranks, by FLASHNEXT_TP_COMM: "nccl" (the default; parallel/communicator.h through
/// ops/cuda/nccl_communicator.h) or "staged" (through host memory, parallel/staged_communicator.h: slow, for a
/// machine without NCCL). Throws Error for another value and, for nccl, when NCCL cannot be loaded (naming the file
/// tried, FLASHNEXT_NCCL_LIBRARY and FLASHNEXT_TP_COMM=staged).
inline ModelOptions::CommunicatorFactory tp_communicators_from_env() {
  if (tp_comm_kind_from_env() == "staged")
    return [](const std::vector<std::shared_ptr<Ops>>& ops) { return make_staged_communicators(ops); };
  std::string why;
  FN_CHECK(nccl_available(&why),
           "--tp on cuda: {} (or set FLASHNEXT_TP_COMM=staged: collectives through host memory, slow)", why);
  return [](const std::vector<std::shared_ptr<Ops>>& ops) { return make_nccl_communicators(ops); };
}
#endif

/// `--nnodes N --node-rank R --master-addr A --master-port P` (torchrun's names): tensor parallelism over N processes,
/// on one machine or several (parallel/node_group.h). FLASHNEXT_RENDEZVOUS_TIMEOUT: seconds the rendezvous waits.
struct NodeArgs {
  int nnodes = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

inline void add_node_options(CLI::App& sub, NodeArgs& a) {
  sub.add_option("--nnodes", a.nnodes,
                 "processes (nodes) the --tp ranks are spread over, --tp/--nnodes each (default 1); start the same "
                 "command on every node with its --node-rank; node 0 runs the command, the others follow it")
      ->check(cli::positive_number());
  sub.add_option("--node-rank", a.node_rank, "this process's node, 0 .. nnodes-1 (default 0)")
      ->check(cli::non_negative_number());
  sub.add_option("--master-addr", a.master_addr, "host name or address of node 0 (default 127.0.0.1)");
  sub.add_option("--master-port", a.master_port, "port node 0 listens on for the other nodes (default 29500)");
}

/// Seconds the rendezvous waits for the other nodes: FLASHNEXT_RENDEZVOUS_TIMEOUT, default 300. Throws Error for a
/// value that is not a number > 0.
inline double rendezvous_timeout_from_env() {
  const char* t = std::getenv("FLASHNEXT_RENDEZVOUS_TIMEOUT");
  if (!t || !*t) return 300;
  char* end = nullptr;
  const double s = std::strtod(t, &end);
  FN_CHECK(end && *end == '\0' && s > 0, "FLASHNEXT_RENDEZVOUS_TIMEOUT must be a number of seconds > 0, got '{}'", t);
  return s;
}

/// What the nodes of a group compare of the model (the rendezvous refuses a node whose model differs): its geometry,
/// and whether the node loads the MTP layer (every node runs its steps, so all load it or none does).
inline std::string node_fingerprint(const ModelConfig& c, bool load_mtp) {
  return fmt::format("model: {} layers, hidden {}, vocab {}, {} experts of {} (top {}), {} PLE layers of {} rows, {}",
                     c.num_hidden_layers, c.hidden_size, c.vocab_size, c.num_experts, c.moe_intermediate_size,
                     c.num_experts_per_tok, c.ple_layer_ids.size(), c.ngram_vocab_size_base,
                     load_mtp ? "MTP layer" : "no MTP layer");
}

/// node_fingerprint of the model folder `dir` when `nodes` spans several processes; "" otherwise (nothing read). With
/// dummy weights: of the config with its overrides, and saying so (every node makes the same random weights).
inline std::string node_fingerprint(const NodeArgs& nodes, const std::string& dir, bool load_mtp,
                                    const WeightSource& weights = {}) {
  if (nodes.nnodes <= 1) return std::string();
  return node_fingerprint(config_with_overrides(dir, weights.hf_overrides), load_mtp) +
         (weights.dummy ? fmt::format(", dummy weights of seed {}", weights.seed) : std::string());
}

/// --load-format and --hf-overrides (vLLM's flags) of generate, chat and serve.
struct WeightArgs {
  std::string load_format = "auto", hf_overrides;
};

inline void add_weight_options(CLI::App& sub, WeightArgs& a) {
  sub.add_option("--load-format", a.load_format,
                 "auto (default): the folder's checkpoint; dummy: pseudo-random weights of its config.json made on "
                 "the device, the same on every run (profiling and serving benchmarks without the checkpoint; the "
                 "folder needs config.json and a tokenizer)")
      ->check(CLI::IsMember({"auto", "dummy"}));
  sub.add_option("--hf-overrides", a.hf_overrides,
                 "with --load-format dummy: a JSON object of config.json fields to override (the text config's, "
                 "flat or under \"text_config\"), e.g. '{\"num_experts\": 256}'");
}

/// The weight source the flags ask for. Throws Error naming --hf-overrides when it is not a JSON object or comes
/// without --load-format dummy.
inline WeightSource weight_source(const WeightArgs& a) {
  WeightSource w;
  w.dummy = a.load_format == "dummy";
  if (!a.hf_overrides.empty()) {
    try {
      w.hf_overrides = nlohmann::json::parse(a.hf_overrides);
    } catch (const nlohmann::json::parse_error& e) {
      fail("--hf-overrides is not valid JSON ({}): '{}'", e.what(), a.hf_overrides);
    }
    FN_CHECK(w.hf_overrides.is_object(), "--hf-overrides must be a JSON object of config fields, got '{}'",
             a.hf_overrides);
    FN_CHECK(w.dummy, "--hf-overrides applies to --load-format dummy only: a checkpoint's tensors fix its config");
  }
  return w;
}

/// Sets the backend fields of `options` for `--device D --threads N --tp K`. tp 1: one backend (make_backend).
/// tp > 1 on the CPU: K ranks, each a float32 CPU backend with max(1, N / K) threads (N = 0: all cores), in one
/// process with a thread per rank. tp > 1 on cuda: rank r on GPU r, collectives by
/// tp_communicators_from_env (NCCL by default). Throws Error for tp < 1, for more ranks than GPUs ("--tp 4 needs 4
/// GPUs, ...") and when the communicator cannot be had.
/// With `nodes.nnodes` > 1 this process runs K / nnodes ranks (on cuda its GPUs 0 .. K/nnodes - 1, NCCL made from a
/// unique id node 0 hands out; on the CPU the node communicators of parallel/node_group.h), after the rendezvous
/// with the other nodes, which must have been started with the same --tp, --nnodes and --device and a model of the
/// same model (`model_fingerprint`: node_fingerprint of its config, and whatever else the command needs to be equal).
/// node_fingerprint(load_config(dir)) for a model folder.
/// Throws Error for bad node options and when the rendezvous fails (parallel/node_group.h rendezvous).
inline void set_backend(ModelOptions& options, const std::string& device, int threads, int tp,
                        const NodeArgs& nodes = {}, const std::string& model_fingerprint = {}) {
  FN_CHECK(tp >= 1, "--tp must be >= 1, got {}", tp);
  options.threads = threads;
  options.tp = tp;
  if (const char* t = std::getenv("FLASHNEXT_TP_TIMEOUT"); t && *t) {
    char* end = nullptr;
    const double s = std::strtod(t, &end);
    FN_CHECK(end && *end == '\0' && s >= 0,
             "FLASHNEXT_TP_TIMEOUT must be a number of seconds >= 0 (0: no timeout), "
             "got '{}'",
             t);
    options.tp_timeout_s = s;
  }
  FN_CHECK(nodes.nnodes > 1 || nodes.node_rank == 0,
           "--node-rank {} without --nnodes: give the number of nodes (--nnodes M) on every node", nodes.node_rank);
  if (nodes.nnodes > 1) {
    NodeOptions no{nodes.nnodes, nodes.node_rank, nodes.master_addr, nodes.master_port, rendezvous_timeout_from_env()};
    check_node_options(no, tp);
    fmt::print(stderr, "flashnext: node {} of {}: {} (up to {:g} s, FLASHNEXT_RENDEZVOUS_TIMEOUT)\n", nodes.node_rank,
               nodes.nnodes,
               nodes.node_rank == 0 ? fmt::format("waiting for the other nodes on port {}", nodes.master_port)
                                    : fmt::format("joining node 0 at {}:{}", nodes.master_addr, nodes.master_port),
               no.timeout_s);
    FN_CHECK(device == "cpu" || device == "cuda", "--device must be cpu or cuda, got '{}'", device);
    std::string fingerprint = fmt::format("--tp {} --nnodes {} --device {}", tp, nodes.nnodes, device);
    if (!model_fingerprint.empty()) fingerprint += ", " + model_fingerprint;
    std::vector<uint8_t> payload;
    if (device == "cuda") {
#ifdef FLASHNEXT_HAVE_CUDA
      const int per_node = tp / nodes.nnodes, gpus = cuda_device_count();
      FN_CHECK(per_node <= gpus, "--tp {} --nnodes {} runs {} ranks on each node (one GPU each), this one has {} GPUs",
               tp, nodes.nnodes, per_node, gpus);
      // FLASHNEXT_TP_COMM=staged: through host memory and the node links (several processes may then share a GPU).
      const std::string comm = tp_comm_kind_from_env();
      fingerprint += ", collectives " + comm;
      if (comm == "nccl") {
        std::string why;
        FN_CHECK(nccl_available(&why), "--nnodes on cuda: {} (or set FLASHNEXT_TP_COMM=staged on every node)", why);
        if (nodes.node_rank == 0) payload = nccl_unique_id();
      }
      auto group = rendezvous(no, tp, fingerprint, std::move(payload));
      options.nodes = group;
      options.rank_ops = [per_node](int rank) { return make_cuda_ops(rank % per_node); };
      if (comm == "staged")
        options.communicators = [group](const std::vector<std::shared_ptr<Ops>>& ops) {
          return make_staged_communicators(ops, make_node_communicators(group));
        };
      else
        options.communicators = [group](const std::vector<std::shared_ptr<Ops>>& ops) {
          return make_nccl_communicators(ops, group->payload(), group->world(), group->first_rank());
        };
      return;
#else
      fail_without_cuda();
#endif
    }
    options.nodes = rendezvous(no, tp, fingerprint);
    return;  // Model::load makes the node's CPU backends and the node communicators
  }
  if (tp == 1) {
    options.ops = make_backend(device, threads);
    return;
  }
  if (device == "cpu") return;  // Model::load makes the ranks' CPU backends and the CPU communicator
  if (device == "cuda") {
#ifdef FLASHNEXT_HAVE_CUDA
    const int gpus = cuda_device_count();
    FN_CHECK(tp <= gpus, "--tp {} needs {} GPUs (one per rank), this machine has {}", tp, tp, gpus);
    options.rank_ops = [](int rank) { return make_cuda_ops(rank); };
    options.communicators = tp_communicators_from_env();
    return;
#else
    fail_without_cuda();
#endif
  }
  fail("--device must be cpu or cuda, got '{}'", device);
}

/// On a follower node (--node-rank > 0, after the model loaded its ranks): says so on stderr, runs node 0's calls
/// until node 0's model ends (Model::follow; an Error when the group fails) and returns true: the command then ends
/// with status 0 without doing its own work. False on node 0 and without --nnodes.
inline bool follow_leader(Model& model, const NodeArgs& nodes) {
  if (model.leads()) return false;
  const int per_node = model.tp() / nodes.nnodes, first = nodes.node_rank * per_node;
  fmt::print(stderr, "flashnext: node {} of {}: {} of --tp {} loaded; following node 0 at {}:{}\n", nodes.node_rank,
             nodes.nnodes,
             per_node == 1 ? fmt::format("rank {}", first) : fmt::format("ranks {}-{}", first, first + per_node - 1),
             model.tp(), nodes.master_addr, nodes.master_port);
  model.follow();
  fmt::print(stderr, "flashnext: node {}: node 0 ended the group\n", nodes.node_rank);
  return true;
}

}  // namespace flashnext::cli
