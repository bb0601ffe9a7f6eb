// Contracts of the PLE ops (ple.h).
#include "ops/contract/ple.h"

#include <cmath>

namespace flashnext::contract {

GatherDims ple_gather(const Backend& b, const PleTable& table, const Tensor& rows, const Tensor& e,
                      bool (*dtype_ok)(DType)) {
  const char* op = "ple_gather";
  tensor(b, rows, DType::I64, 2, op, "rows");
  activation(b, e, 2, op, "e");
  const int64_t T = rows.dim(0), heads = rows.dim(1), hd = table.head_dim;
  FN_CHECK(e.dim(0) == T && e.dim(1) == heads * hd && !table.shards.empty(),
           "{}: rows {} and e {} do not fit a table of head_dim {}", op, rows.str(), e.str(), hd);
  const DType dt = table.shards[0].dtype();
  int64_t total = 0;
  for (size_t i = 0; i < table.shards.size(); ++i) {
    const Tensor& s = table.shards[i];
    on_device(b, s, op, "table shard");
    FN_CHECK(s.rank() == 2 && s.dim(1) == hd && s.dtype() == dt && dtype_ok(dt),
             "{}: shard {} is {}; expected [rows, {}] of a table dtype this backend reads, like shard 0 ({})", op, i,
             s.str(), hd, dtype_name(dt));
    total += s.dim(0);
  }
  FN_CHECK(std::isfinite(table.scale), "{}: table scale {}", op, table.scale);
  if (dt != DType::I8) {
    FN_CHECK(table.group_scales.empty() && table.group == 0, "{}: group scales given with a {} table", op,
             dtype_name(dt));
  } else {
    FN_CHECK(table.scale == 1.f, "{}: an I8 table is scaled by its group scales, not by a table scale ({})", op,
             table.scale);
    FN_CHECK(table.group > 0 && hd % table.group == 0 && table.group_scales.size() == table.shards.size(),
             "{}: an I8 table needs a group dividing head_dim {} (got {}) and group scales for each of its {} shards "
             "(got {})",
             op, hd, table.group, table.shards.size(), table.group_scales.size());
    const DType st = table.group_scales[0].dtype();
    for (size_t i = 0; i < table.group_scales.size(); ++i) {
      const Tensor& g = table.group_scales[i];
      on_device(b, g, op, "group scales");
      FN_CHECK(g.rank() == 2 && g.dim(0) == table.shards[i].dim(0) && g.dim(1) == hd / table.group && g.dtype() == st &&
                   (st == DType::BF16 || st == DType::F16 || st == DType::F32) && dtype_ok(st),
               "{}: group scales {} of shard {} {}: expected [{}, {}] of a float dtype this backend reads, like those "
               "of shard 0 ({})",
               op, g.str(), i, table.shards[i].str(), table.shards[i].dim(0), hd / table.group, dtype_name(st));
    }
  }
  return {T, heads, hd, total};
}

PleGateDims ple_gate(const Backend& b, const Tensor& kn, const Tensor& v, const Tensor& X, const Tensor& norm_query,
                     const Tensor& P) {
  const char* op = "ple_gate";
  activation(b, kn, 2, op, "normed keys");
  activation(b, v, 2, op, "value");
  activation(b, X, 2, op, "X");
  weight(b, norm_query, 1, op, "norm_query");
  activation(b, P, 2, op, "P");
  const int64_t T = X.dim(0), W = X.dim(1), H = v.dim(1);
  FN_CHECK(H > 0 && W % H == 0 && kn.shape() == X.shape() && v.dim(0) == T && norm_query.dim(0) == W &&
               P.shape() == X.shape(),
           "{}: keys {}, value {}, X {}, P {} do not fit", op, kn.str(), v.str(), X.str(), P.str());
  return {T, W / H, H};
}

PleConvDims ple_conv_add(const Backend& b, const Tensor& P, const Tensor& norm_conv, int64_t group,
                         const Tensor& conv_w, int64_t dilation, const Tensor& state, const Tensor& X, const char* op) {
  activation(b, P, 2, op, "P");
  weight(b, norm_conv, 1, op, "norm_conv");
  weight(b, conv_w, 2, op, "conv1d weight");
  activation(b, state, 2, op, "state");
  activation(b, X, 2, op, "X");
  const int64_t T = P.dim(0), W = P.dim(1), K = conv_w.dim(1), ctx = (K - 1) * dilation;
  FN_CHECK(dilation >= 1 && K >= 1 && group > 0 && W % group == 0 && norm_conv.dim(0) == W && conv_w.dim(0) == W &&
               state.dim(0) == ctx && state.dim(1) == W && X.shape() == P.shape(),
           "{}: P {}, norm_conv {}, conv {}, state {}, X {} do not fit (group {}, dilation {})", op, P.str(),
           norm_conv.str(), conv_w.str(), state.str(), X.str(), group, dilation);
  return {T, W, K, ctx};
}

PleConvDims ple_conv_add_batch(const Backend& b, const Tensor& P, const Tensor& norm_conv, int64_t group,
                               const Tensor& conv_w, int64_t dilation, const Tensor& state_pool, const StepBatch& batch,
                               const Tensor& X) {
  const char* op = "ple_conv_add_batch";
  activation(b, state_pool, 3, op, "state pool");
  step_rows(P, batch, op, "P");
  state_slots(state_pool, batch, op);
  return ple_conv_add(b, P, norm_conv, group, conv_w, dilation,
                      state_pool.rows(0, 1).view({state_pool.dim(1), state_pool.dim(2)}), X, op);
}

}  // namespace flashnext::contract
