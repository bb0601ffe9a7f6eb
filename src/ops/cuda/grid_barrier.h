// The state of a grid-wide barrier (device_math.cuh grid_barrier), in its own header so that host code can allocate
// it and pass it to a launcher (NVRTC-includable: no host headers).
#pragma once

namespace flashnext::cuda {

/// Blocks arrived at the barrier now, and the number of barriers passed. Zero before first use (a persistent device
/// allocation, one per stream that launches barrier kernels: two kernels that use one state at once would count each
/// other's blocks); grid_barrier leaves `arrived` at zero.
struct GridBarrier {
  unsigned int arrived;
  unsigned int generation;
};

}  // namespace flashnext::cuda
