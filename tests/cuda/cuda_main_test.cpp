// main() of test_cuda and test_cuda_e2e. These tests need a CUDA GPU and never skip: without one the binary fails
// with a message. Listing the tests (gtest_discover_tests at build time) works without a GPU. CI's ctest excludes
// the `cuda` label; scripts/gpu-check.sh (test_cuda) and scripts/gpu-e2e.sh (both) run them on the GPU machine.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (!GTEST_FLAG_GET(list_tests)) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
      std::fprintf(stderr,
                   "%s: FAILED: no usable CUDA GPU (%s). These tests need a GPU and skip nothing; run them on the GPU "
                   "machine with scripts/gpu-check.sh (kernels) or scripts/gpu-e2e.sh (everything).\n",
                   argv[0], err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
      return 1;
    }
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    std::printf("test_cuda: device 0 is %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  }
  return RUN_ALL_TESTS();
}
