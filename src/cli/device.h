// The `--device`, `--threads` and `--tp` options of the CLI: which ops backend runs the model, over how many
// tensor-parallel ranks.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>

#include "core/error.h"
#include "model/qwen4_exp/model.h"
#include "ops/ops.h"
#include "parallel/staged_communicator.h"
#ifdef FLASHNEXT_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/nccl_communicator.h"
#endif

namespace flashnext::cli {

/// The backend for `--device NAME`: "cpu" (the float32 CPU backend with `threads` threads, 0 = all cores) or "cuda"
/// (GPU 0; FLASHNEXT_PLE_TABLE=host|device places the PLE tables). Throws Error for another name, for "cuda" in a
/// build without the CUDA backend, and, from make_cuda_ops, "no CUDA device found (...)" on a machine without a GPU.
inline std::shared_ptr<Ops> make_backend(const std::string& device, int threads) {
  if (device == "cpu") return make_cpu_ops(threads);
  if (device == "cuda") {
#ifdef FLASHNEXT_HAVE_CUDA
    return make_cuda_ops(0);
#else
    fail("--device cuda: the CUDA backend is not available in this build (configured without CUDA); use --device cpu");
#endif
  }
  fail("--device must be cpu or cuda, got '{}'", device);
}

#ifdef FLASHNEXT_HAVE_CUDA
/// The communicators of CUDA ranks, by FLASHNEXT_TP_COMM: "nccl" (the default; parallel/communicator.h through
/// ops/cuda/nccl_communicator.h) or "staged" (through host memory, parallel/staged_communicator.h: slow, for a
/// machine without NCCL). Throws Error for another value and, for nccl, when NCCL cannot be loaded (naming the file
/// tried, FLASHNEXT_NCCL_LIBRARY and FLASHNEXT_TP_COMM=staged).
inline ModelOptions::CommunicatorFactory tp_communicators_from_env() {
  const char* env = std::getenv("FLASHNEXT_TP_COMM");
  const std::string kind = env && *env ? env : "nccl";
  if (kind == "staged")
    return [](const std::vector<std::shared_ptr<Ops>>& ops) { return make_staged_communicators(ops); };
  FN_CHECK(kind == "nccl", "FLASHNEXT_TP_COMM must be nccl or staged, got '{}'", kind);
  std::string why;
  FN_CHECK(nccl_available(&why),
           "--tp on cuda: {} (or set FLASHNEXT_TP_COMM=staged: collectives through host memory, slow)", why);
  return [](const std::vector<std::shared_ptr<Ops>>& ops) { return make_nccl_communicators(ops); };
}
#endif

/// Sets the backend fields of `options` for `--device D --threads N --tp K`. tp 1: one backend (make_backend).
/// tp > 1 on the CPU: K ranks, each a float32 CPU backend with max(1, N / K) threads (N = 0: all cores), in one
/// process with a thread per rank. tp > 1 on cuda: rank r on GPU r, collectives by
/// tp_communicators_from_env (NCCL by default). Throws Error for tp < 1, for more ranks than GPUs ("--tp 4 needs 4
/// GPUs, ...") and when the communicator cannot be had.
inline void set_backend(ModelOptions& options, const std::string& device, int threads, int tp) {
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
    fail("--device cuda: the CUDA backend is not available in this build (configured without CUDA); use --device cpu");
#endif
  }
  fail("--device must be cpu or cuda, got '{}'", device);
}

}  // namespace flashnext::cli
