// Default implementations of the random-weight and host-table ops of ops/ops.h (the CPU backend's behaviour): the
// values are made on the host and loaded like checkpoint data.
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <new>

#include "core/error.h"
#include "ops/ops.h"
#include "ops/random_uniform.h"

namespace flashnext {

HostTable Ops::host_table(DType dtype, const Shape& shape) {
  FN_CHECK(dtype == DType::BF16 || dtype == DType::F16 || dtype == DType::F8_E4M3,
           "host_table: tables are BF16, F16 or F8_E4M3, got {}", dtype_name(dtype));
  for (int64_t d : shape) FN_CHECK(d >= 0, "host_table: negative dimension in [{}]", fmt::join(shape, ", "));
  const size_t bytes = size_t(shape_numel(shape)) * dtype_size(dtype);
  void* p = std::malloc(std::max<size_t>(bytes, 1));
  FN_CHECK(p, "host_table: cannot allocate {} bytes of host memory for a [{}] {} table", bytes,
           fmt::join(shape, ", "), dtype_name(dtype));
  std::shared_ptr<const void> owner(p, [](const void* q) { std::free(const_cast<void*>(q)); });
  return {map_host_table(p, dtype, shape, std::move(owner)), p};
}

Tensor Ops::random_weight(const Shape& shape, float lo, float hi, uint64_t seed) {
  FN_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, "random_weight: bounds [{}, {}] are not an interval",
           lo, hi);
  std::vector<float> v(size_t(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = lo + (hi - lo) * random_uniform(seed, i);
  return load_weight(v.data(), DType::F32, shape);
}

RoutedExperts Ops::random_experts(int64_t E, int64_t I, int64_t H, uint64_t seed) {
  FN_CHECK(E > 0 && I > 0 && H > 0, "random_experts: {} experts of [{}, {}]: need positive sizes", E, I, H);
  const float a = std::sqrt(3.f / float(H)), b = std::sqrt(3.f / float(I));
  RoutedExperts r;
  r.gate = random_weight({E, I, H}, -a, a, seed);
  r.up = random_weight({E, I, H}, -a, a, seed + 1);
  r.down = random_weight({E, H, I}, -b, b, seed + 2);
  return r;
}

}  // namespace flashnext
