// Contracts of the memory ops (memory.h).
#include "ops/contract/memory.h"

#include <fmt/ranges.h>

#include <cmath>

namespace flashnext::contract {

void load_weight(DType dtype) {
  FN_CHECK(dtype == DType::BF16 || dtype == DType::F16 || dtype == DType::F32,
           "load_weight: weights must be BF16, F16 or F32, got {}", dtype_name(dtype));
}

size_t host_table(DType dtype, const Shape& shape) {
  FN_CHECK(dtype == DType::BF16 || dtype == DType::F16 || dtype == DType::F8_E4M3,
           "host_table: tables are BF16, F16 or F8_E4M3, got {}", dtype_name(dtype));
  for (int64_t d : shape) FN_CHECK(d >= 0, "host_table: negative dimension in [{}]", fmt::join(shape, ", "));
  return size_t(shape_numel(shape)) * dtype_size(dtype);
}

void random_weight(float lo, float hi) {
  FN_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, "random_weight: bounds [{}, {}] are not an interval", lo,
           hi);
}

void random_experts(int64_t E, int64_t I, int64_t H) {
  FN_CHECK(E > 0 && I > 0 && H > 0, "random_experts: {} experts of [{}, {}]: need positive sizes", E, I, H);
}

void quantized_experts(const QuantExperts& q) {
  const int64_t E = q.experts;
  FN_CHECK(E > 0 && int64_t(q.gate.size()) == E && int64_t(q.up.size()) == E && int64_t(q.down.size()) == E,
           "load_quantized_experts: {}: {} experts but {} / {} / {} gate / up / down matrices", q.name, E,
           q.gate.size(), q.up.size(), q.down.size());
  FN_CHECK(q.inter > 0 && q.inter_begin >= 0 && q.inter_begin + q.inter <= q.full(),
           "load_quantized_experts: {}: the slice [{}, {}) is outside the {}-wide intermediate", q.name, q.inter_begin,
           q.inter_begin + q.inter, q.full());
}

size_t copy_rows(const Backend& b, const Tensor& src, int64_t src_row, const Tensor& dst, int64_t dst_row, int64_t n) {
  on_device(b, src, "copy_rows", "src");
  on_device(b, dst, "copy_rows", "dst");
  FN_CHECK(src.rank() >= 1 && dst.rank() >= 1 && src.dtype() == dst.dtype(), "copy_rows: {} -> {}: dtype differs",
           src.str(), dst.str());
  const size_t row = src.dim(0) ? src.nbytes() / size_t(src.dim(0)) : 0;
  const size_t drow = dst.dim(0) ? dst.nbytes() / size_t(dst.dim(0)) : 0;
  FN_CHECK(n == 0 || row == drow, "copy_rows: row sizes of {} and {} differ", src.str(), dst.str());
  FN_CHECK(n >= 0 && src_row >= 0 && dst_row >= 0 && src_row + n <= src.dim(0) && dst_row + n <= dst.dim(0),
           "copy_rows: rows [{}, +{}) of {} -> [{}, +{}) of {} out of range", src_row, n, src.str(), dst_row, n,
           dst.str());
  return n == 0 ? 0 : row;
}

size_t row_map(const Backend& b, const char* op, const Tensor& indexed, const Tensor& rows, const Tensor& packed) {
  tensor(b, rows, DType::I32, 1, op, "rows");
  on_device(b, indexed, op, "indexed tensor");
  on_device(b, packed, op, "packed tensor");
  FN_CHECK(
      indexed.rank() >= 1 && packed.rank() >= 1 && indexed.dtype() == packed.dtype() && packed.dim(0) == rows.dim(0),
      "{}: {} and {} with {} row ids do not fit", op, indexed.str(), packed.str(), rows.dim(0));
  const size_t row = indexed.dim(0) ? indexed.nbytes() / size_t(indexed.dim(0)) : 0;
  FN_CHECK(packed.dim(0) == 0 || packed.nbytes() / size_t(packed.dim(0)) == row, "{}: row sizes of {} and {} differ",
           op, indexed.str(), packed.str());
  return row;
}

}  // namespace flashnext::contract
