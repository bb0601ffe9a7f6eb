// The `--device`, `--threads` and `--tp` options of the CLI: which ops backend runs the model, over how many
// tensor-parallel ranks.
#pragma once

#include <memory>
#include <string>

#include "core/error.h"
#include "model/qwen4_exp/model.h"
#include "ops/ops.h"
#include "parallel/staged_communicator.h"
#ifdef FLASHNEXT_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
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

/// Sets the backend fields of `options` for `--device D --threads N --tp K`. tp 1: one backend (make_backend).
/// tp > 1 on the CPU: K ranks, each a float32 CPU backend with max(1, N / K) threads (N = 0: all cores), in one
/// process with a thread per rank. tp > 1 on cuda: rank r on GPU r, collectives staged through host memory until the
/// NCCL communicator exists (parallel/staged_communicator.h). Throws Error for tp < 1 and for more ranks than GPUs
/// ("--tp 4 needs 4 GPUs, ...").
inline void set_backend(ModelOptions& options, const std::string& device, int threads, int tp) {
  FN_CHECK(tp >= 1, "--tp must be >= 1, got {}", tp);
  options.threads = threads;
  options.tp = tp;
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
    // Until the NCCL communicator exists, collectives go through host memory (parallel/staged_communicator.h).
    options.communicators = [](const std::vector<std::shared_ptr<Ops>>& ops) { return make_staged_communicators(ops); };
    return;
#else
    fail("--device cuda: the CUDA backend is not available in this build (configured without CUDA); use --device cpu");
#endif
  }
  fail("--device must be cpu or cuda, got '{}'", device);
}

}  // namespace flashnext::cli
