// Fixed-width integer types for kernel sources. The SM70 check (scripts/check-sm70.sh) compiles every .cu file with
// NVRTC from CUDA 12, which has no <cstdint>; there the types come from libcu++.
#pragma once

#if defined(__CUDACC_RTC__)
#include <cuda/std/cstdint>
using cuda::std::int32_t;
using cuda::std::int64_t;
using cuda::std::int8_t;
using cuda::std::uint16_t;
using cuda::std::uint32_t;
using cuda::std::uint64_t;
using cuda::std::uint8_t;
#else
#include <cstdint>
#endif
