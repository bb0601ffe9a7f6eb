// The `--device` option of the CLI: which ops backend runs the model.
#pragma once

#include <memory>
#include <string>

#include "core/error.h"
#include "ops/ops.h"
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

}  // namespace flashnext::cli
