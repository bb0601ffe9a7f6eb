// Default implementations of the weight-making ops of ops/ops.h (the CPU backend's behaviour): random weights and
// host tables made on the host and loaded like checkpoint data; quantized experts dequantized exactly and stacked;
// 8-bit linear weights dequantized exactly.
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <new>

#include "core/error.h"
#include "ops/contract/memory.h"
#include "ops/ops.h"
#include "ops/random_uniform.h"

namespace flashnext {

HostTable Ops::host_table(DType dtype, const Shape& shape) {
  const size_t bytes = contract::host_table(dtype, shape);
  void* p = std::malloc(std::max<size_t>(bytes, 1));
  FN_CHECK(p, "host_table: cannot allocate {} bytes of host memory for a [{}] {} table", bytes,
           fmt::join(shape, ", "), dtype_name(dtype));
  std::shared_ptr<const void> owner(p, [](const void* q) { std::free(const_cast<void*>(q)); });
  return {map_host_table(p, dtype, shape, std::move(owner)), p};
}

Tensor Ops::random_weight(const Shape& shape, float lo, float hi, uint64_t seed) {
  contract::random_weight(lo, hi);
  std::vector<float> v(size_t(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = lo + (hi - lo) * random_uniform(seed, i);
  return load_weight(v.data(), DType::F32, shape);
}

RoutedExperts Ops::random_experts(int64_t E, int64_t I, int64_t H, uint64_t seed) {
  contract::random_experts(E, I, H);
  const float a = std::sqrt(3.f / float(H)), b = std::sqrt(3.f / float(I));
  RoutedExperts r;
  r.gate = random_weight({E, I, H}, -a, a, seed);
  r.up = random_weight({E, I, H}, -a, a, seed + 1);
  r.down = random_weight({E, H, I}, -b, b, seed + 2);
  return r;
}

void W8Linear::check() const {
  FN_CHECK((code == DType::I8 || code == DType::F8_E4M3) && rows >= 0 && cols > 0 && group > 0 &&
               codes.size() == size_t(rows * cols) && scales.size() == size_t(rows * groups()),
           "8-bit linear weight: {} [{}, {}] with group {}, {} codes and {} scales do not fit (I8 or F8_E4M3 codes "
           "[rows, cols], scales [rows, ceil(cols / group)])",
           dtype_name(code), rows, cols, group, codes.size(), scales.size());
  if (code == DType::F8_E4M3)
    for (size_t i = 0; i < codes.size(); ++i)
      FN_CHECK((codes[i] & 0x7f) != 0x7f, "8-bit linear weight: the E4M3 code at row {}, column {} is NaN (0x{:02x})",
               int64_t(i) / cols, int64_t(i) % cols, codes[i]);
}

std::vector<float> W8Linear::dequantize() const {
  check();
  std::vector<float> out(codes.size());
  const int64_t G = groups();
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t k = 0; k < cols; ++k) {
      const uint8_t b = codes[size_t(n * cols + k)];
      const float q = code == DType::I8 ? float(int8_t(b)) : f8e4m3_to_float(b);
      out[size_t(n * cols + k)] = q * scales[size_t(n * G + k / group)];
    }
  return out;
}

Tensor Ops::load_w8_linear(const W8Linear& w) {
  const std::vector<float> v = w.dequantize();
  return load_weight(v.data(), DType::F32, {w.rows, w.cols});
}

RoutedExperts Ops::load_quantized_experts(const QuantExperts& q) {
  contract::quantized_experts(q);
  const int64_t E = q.experts, H = q.hidden, I = q.inter, F = q.full(), b = q.inter_begin;
  // Each matrix dequantized whole, then the rank's rows [r0, r0 + rows) and columns [c0, c0 + cols) of it.
  auto stack = [&](const std::vector<QuantMatrix>& ms, int64_t rows, int64_t cols, int64_t r0, int64_t c0,
                   int64_t full_rows, int64_t full_cols) {
    Tensor out;
    for (int64_t e = 0; e < E; ++e) {
      const QuantMatrix& m = ms[size_t(e)];
      FN_CHECK(m.rows == full_rows && m.cols == full_cols && m.dequantize,
               "load_quantized_experts: '{}' is [{}, {}], expected "
               "[{}, {}] with its dequantization",
               m.name, m.rows, m.cols, full_rows, full_cols);
      std::vector<float> w = m.dequantize();
      if (rows != full_rows || cols != full_cols) {
        std::vector<float> part(size_t(rows * cols));
        for (int64_t i = 0; i < rows; ++i)
          std::copy_n(w.begin() + (r0 + i) * full_cols + c0, cols, part.begin() + i * cols);
        w = std::move(part);
      }
      Tensor one = load_weight(w.data(), DType::F32, {1, rows, cols});
      if (e == 0) out = empty({E, rows, cols}, one.dtype());
      copy_rows(one, 0, out, e, 1);
    }
    return out;
  };
  RoutedExperts r;
  r.gate = stack(q.gate, I, H, b, 0, F, H);
  r.up = stack(q.up, I, H, b, 0, F, H);
  r.down = stack(q.down, H, I, 0, b, H, F);
  return r;
}

}  // namespace flashnext
