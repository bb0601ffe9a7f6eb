// bench_moe_w4a16: the W4A16 routed-expert MoE (ops/cuda/moe_w4a16.h) at the released geometry: 512 experts,
// hidden 2560, expert width 640, top-10, experts in NVFP4 and in int4 group 32 (symmetric). Random routing (10
// distinct experts per token), random weights in the repacked layout. One markdown row per (format, tokens, path;
// the GEMV paths up to 256 tokens, the two GEMM kernels at every size). 8-bit experts (W8A16: GPTQ 8-bit group 128,
// compressed-tensors int8 per channel) run as two 4-bit planes over the inputs twice (moe_w4a16.h int8_planes):
// formats int8-g128 and int8-channel. FP8 experts (W8A16: compressed-tensors float-quantized per channel, the FP8
// block format's 128-input blocks) as FP8 bytes (moe_w4a16.h W4Format::Fp8; the FP32-FMA GEMV and the WMMA GEMM):
// formats fp8-channel and fp8-block128.
// time per moe_w4a16_routed call (grouping + both expert GEMMs + combine; CUDA events, mean of the timed calls after
// warm-up), the achieved bandwidth of the expert weight bytes read (the experts hit, each read once) against the
// 4.3 TB/s measured copy bandwidth of LIMITS.md (and this run's own copy measurement), and the arithmetic rate
// (2 * slots * 3 * H * I) against LIMITS.md's ~990 TFLOP/s dense FP16 peak and 790 TFLOP/s measured GEMM.
// Usage: bench_moe_w4a16 [filter-substring of the format name] [token counts, comma-separated (default
// 1,4,16,64,256,1024,4096)]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "bench_util.h"
#include "ops/cuda/buffer.h"
#include "ops/cuda/moe_w4a16.h"

using namespace flashnext::cuda;
using flashnext::cuda::bench::time_ms;

namespace {

constexpr double kLimitGbs = 4300;      // LIMITS.md: H200 device-to-device copy, measured
constexpr double kPeakTflops = 990;     // LIMITS.md: FP16 dense tensor peak
constexpr double kMeasuredTflops = 790; // LIMITS.md: 8192^3 GEMM as measured
double g_copy_gbs = 0;

// Random repacked weights (valid codes: FP8 without its NaN bytes; scales and global multipliers; no checkpoint).
// planes 2: an 8-bit matrix [rows, cols] as two 4-bit planes [rows, 2 cols] with zero points.
W4Packed random_packed(W4Format f, int E, int rows, int cols, int group, uint32_t seed, int planes = 1) {
  W4Packed p(f, E, rows, planes * cols, group, planes == 2);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& w : p.codes) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    w = x;
    if (f == W4Format::Fp8)  // an E4M3 NaN byte (0x7f / 0xff) becomes 0x7e / 0xfe
      for (int b = 0; b < 4; ++b)
        if (((w >> (8 * b)) & 0x7fu) == 0x7fu) w ^= 1u << (8 * b);
  }
  const float s = f == W4Format::Nvfp4 ? 1.f : 1024.f;  // int4: scales live in [2^10, 2^11) after the row shift
  for (auto& h : p.scales) h = __float2half_rn(s);
  for (auto& v : p.fscales) v = 16384.f;  // FP8: group scales in [2^14, 2^15) after the row shift
  const float g = f == W4Format::Nvfp4 ? 0.5f / std::sqrt(float(cols)) : 0.25f / std::sqrt(float(cols)) / 1024.f;
  std::fill(p.global.begin(), p.global.end(), g);
  for (size_t i = 0; i < p.zeros.size(); ++i) p.zeros[i] = uint8_t(i % 17);
  return p;
}

DeviceArray<__half> halfs(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<__half> h(n);
  for (auto& v : h) v = __float2half(d(rng));
  return to_device(h, "bench input");
}

std::vector<int> g_tokens = {1, 4, 16, 64, 256, 1024, 4096};

// group 0: one group a row of each plane (the row's inputs).
void bench_format(const char* name, W4Format f, int group, int planes = 1) {
  const int E = 512, H = 2560, I = 640, k = 10;
  const W4Packed gu = random_packed(f, E, 2 * I, H, group ? group : H, 1, planes),
                 dn = random_packed(f, E, H, I, group ? group : I, 2, planes);
  const double expert_bytes = double(gu.expert_bytes() + dn.expert_bytes());
  const W4DeviceMatrix dgu(gu), ddn(dn);
  const MoeW4A16Experts experts{&dgu, &ddn, E, H, I, planes};
  std::mt19937 rng(5);
  std::vector<int> perm(E);
  std::iota(perm.begin(), perm.end(), 0);
  for (int T : g_tokens) {
    std::vector<int32_t> ids(size_t(T) * k);
    for (int t = 0; t < T; ++t) {
      std::shuffle(perm.begin(), perm.end(), rng);
      std::copy(perm.begin(), perm.begin() + k, ids.begin() + size_t(t) * k);
    }
    const double hit = double(std::set<int32_t>(ids.begin(), ids.end()).size());
    auto dids = to_device(ids);
    auto dw = to_device(std::vector<float>(size_t(T) * k, 1.f / k));
    auto u = halfs(size_t(T) * H, 3);
    DeviceArray<__half> out(size_t(T) * H, "out");
    MoeW4A16Workspace ws(T, k, E, H, I, planes);
    // FP8 runs the FP32-FMA GEMV and the WMMA GEMM only: its auto choice is marked on those rows.
    const bool fp8 = f == W4Format::Fp8;
    W4Path chosen = moe_w4a16_auto_path(experts, T, k);
    if (fp8) chosen = chosen == W4Path::Gemv ? W4Path::GemvFma : chosen == W4Path::Gemm ? W4Path::GemmWmma : chosen;
    for (W4Path path : {W4Path::Gemv, W4Path::GemvGrouped, W4Path::GemvFma, W4Path::Gemm, W4Path::GemmWmma}) {
      const bool gemv = path == W4Path::Gemv || path == W4Path::GemvGrouped || path == W4Path::GemvFma;
      if (T >= 1024 && gemv) continue;  // 20-110 ms a call
      // FP8: the same kernels as other rows (the grouped GEMV falls back to the GEMV, which runs the FP32-FMA one)
      if (fp8 && (path == W4Path::Gemv || path == W4Path::GemvGrouped || path == W4Path::Gemm)) continue;
      const int iters = T >= 1024 ? 10 : 50;
      const double ms = time_ms(
          [&] {
            moe_w4a16_routed(experts, u.get(), H, T, dids.get(), dw.get(), nullptr, nullptr, out.get(), H, ws, nullptr,
                             path);
          },
          iters);
      const double bytes = hit * expert_bytes;
      const double gbs = bytes / (ms * 1e-3) / 1e9;
      const double tflops = 2.0 * T * k * 3.0 * H * I / (ms * 1e-3) / 1e12;
      std::printf(
          "| %s | %d | %s%s | %.0f | %.1f | %.0f GB/s (%.0f%% of 4.3 TB/s, %.0f%% of copy) | %.1f TFLOP/s "
          "(%.1f%% of 990, %.1f%% of 790) |\n",
          name, T,
          path == W4Path::Gemv          ? "GEMV"
          : path == W4Path::GemvGrouped ? "GEMV grouped"
          : path == W4Path::GemvFma     ? "GEMV FMA"
          : path == W4Path::Gemm        ? "GEMM mma.sync"
                                        : "GEMM WMMA",
          path == chosen ? " (auto)" : "", hit, ms * 1e3, gbs, 100.0 * gbs / kLimitGbs, 100.0 * gbs / g_copy_gbs,
          tflops, 100.0 * tflops / kPeakTflops, 100.0 * tflops / kMeasuredTflops);
      std::fflush(stdout);
    }
  }
  std::printf("| %s | weight bytes per expert: %.3f MB (%.4f B/param) | | | | | |\n", name, expert_bytes / 1e6,
              expert_bytes / (3.0 * H * I));
}

}  // namespace

int main(int argc, char** argv) {
  const char* filter = argc > 1 ? argv[1] : nullptr;
  if (argc > 2) {
    g_tokens.clear();
    for (const char* p = argv[2]; *p;) {
      char* end = nullptr;
      const long v = std::strtol(p, &end, 10);
      if (end == p || v < 1 || v > 65536) {
        std::fprintf(stderr, "bench_moe_w4a16: token counts must be integers 1..65536, comma-separated: %s\n", argv[2]);
        return 2;
      }
      g_tokens.push_back(int(v));
      p = *end == ',' ? end + 1 : end;
    }
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "bench_moe_w4a16: no CUDA GPU\n");
    return 1;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  g_copy_gbs = bench::measure_copy_gbs();
  std::printf("bench_moe_w4a16 on %s: device-to-device copy %.0f GB/s (read + write); E=512 H=2560 I=640 top-10\n\n",
              prop.name, g_copy_gbs);
  std::printf("| format | tokens | path | experts hit | us/call | expert weight bytes | arithmetic |\n"
              "| --- | --- | --- | --- | --- | --- | --- |\n");
  try {
    if (!filter || std::string("nvfp4").find(filter) != std::string::npos) bench_format("nvfp4", W4Format::Nvfp4, 16);
    if (!filter || std::string("int4-g32").find(filter) != std::string::npos)
      bench_format("int4-g32", W4Format::Int4, 32);
    if (!filter || std::string("int8-g128").find(filter) != std::string::npos)
      bench_format("int8-g128", W4Format::Int4, 128, 2);
    if (!filter || std::string("int8-channel").find(filter) != std::string::npos)
      bench_format("int8-channel", W4Format::Int4, 0, 2);
    if (!filter || std::string("fp8-channel").find(filter) != std::string::npos)
      bench_format("fp8-channel", W4Format::Fp8, 0);
    if (!filter || std::string("fp8-block128").find(filter) != std::string::npos)
      bench_format("fp8-block128", W4Format::Fp8, 128);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_moe_w4a16: %s\n", e.what());
    return 1;
  }
  return 0;
}
