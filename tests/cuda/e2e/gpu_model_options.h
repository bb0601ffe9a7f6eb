// How the end-to-end GPU tests put a model on GPU 0: one CUDA backend, or, when FLASHNEXT_TEST_TP1_NCCL=1, the
// tensor-parallel code path as a group of one whose collectives go through NCCL (ops/cuda/nccl_communicator.h).
// scripts/gpu-bench.sh runs test_cuda_e2e once each way, so that every end-to-end test covers both paths.
#pragma once

#include <cstdlib>
#include <string>

#include "model/qwen4_exp/model.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/nccl_communicator.h"

namespace flashnext::test {

/// Whether this run's models go through NCCL as a tensor-parallel group of one (FLASHNEXT_TEST_TP1_NCCL=1).
inline bool tp1_through_nccl() {
  const char* e = std::getenv("FLASHNEXT_TEST_TP1_NCCL");
  return e && std::string(e) == "1";
}

/// Options for Model::load of a model on GPU 0 with backend `options` (see the header comment).
inline ModelOptions gpu_model_options(const CudaOpsOptions& options = CudaOpsOptions::from_env()) {
  ModelOptions o;
  if (tp1_through_nccl()) {
    o.rank_ops = [options](int) { return make_cuda_ops(0, options); };
    o.communicators = [](const std::vector<std::shared_ptr<Ops>>& ops) { return make_nccl_communicators(ops); };
  } else {
    o.ops = make_cuda_ops(0, options);
  }
  return o;
}

}  // namespace flashnext::test
