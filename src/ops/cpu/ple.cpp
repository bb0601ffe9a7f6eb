// CPU backend: PLE (n-gram table gather, gate, dilated short conv).
#include <algorithm>
#include <cstring>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/kernels.h"

namespace flashnext::cpu {

void CpuOps::ple_gather(const PleTable& table, const Tensor& rows, const Tensor& e) {
  const char* op = "ple_gather";
  check_tensor(rows, DType::I64, 2, op, "rows");
  check_tensor(e, DType::F32, 2, op, "e");
  const int64_t T = rows.dim(0), heads = rows.dim(1), hd = table.head_dim;
  FN_CHECK(e.dim(0) == T && e.dim(1) == heads * hd && !table.shards.empty(),
           "{}: rows {} and e {} do not fit a table of head_dim {}", op, rows.str(), e.str(), hd);
  // Shard start rows (prefix sums of shard heights).
  std::vector<int64_t> starts;
  int64_t total = 0;
  for (const auto& s : table.shards) {
    FN_CHECK(s.device() == Device::CPU && s.rank() == 2 && s.dim(1) == hd, "{}: shard {} does not have {} columns", op,
             s.str(), hd);
    starts.push_back(total);
    total += s.dim(0);
  }
  const int64_t* r = rows.data_as<const int64_t>();
  for (int64_t i = 0; i < T * heads; ++i) {
    const int64_t row = r[i];
    FN_CHECK(row >= 0 && row < total, "{}: row {} outside the n-gram table ({} rows)", op, row, total);
    const size_t s = size_t(std::upper_bound(starts.begin(), starts.end(), row) - starts.begin() - 1);
    const Tensor& shard = table.shards[s];
    const uint8_t* src =
        static_cast<const uint8_t*>(shard.data()) + size_t(row - starts[s]) * size_t(hd) * dtype_size(shard.dtype());
    float* out = mp(e) + i * hd;
    convert_to_float(shard.dtype(), src, out, size_t(hd));  // one row at a time: FP8 tables are never copied
    if (table.scale != 1.f) {
      for (int64_t j = 0; j < hd; ++j) out[j] *= table.scale;  // exact for FP8 rows (loader/quant.h)
    }
  }
}

void CpuOps::ple_gate(const Tensor& kn, const Tensor& v, const Tensor& X, const Tensor& norm_query, double eps,
                      const Tensor& P) {
  const char* op = "ple_gate";
  check_tensor(kn, DType::F32, 2, op, "normed keys");
  check_tensor(v, DType::F32, 2, op, "value");
  check_tensor(X, DType::F32, 2, op, "X");
  check_tensor(norm_query, DType::F32, 1, op, "norm_query");
  check_tensor(P, DType::F32, 2, op, "P");
  const int64_t T = X.dim(0), W = X.dim(1), H = v.dim(1);
  FN_CHECK(H > 0 && W % H == 0 && kn.shape() == X.shape() && v.dim(0) == T && norm_query.dim(0) == W &&
               P.shape() == X.shape(),
           "{}: keys {}, value {}, X {}, P {} do not fit", op, kn.str(), v.str(), X.str(), P.str());
  const int64_t S = W / H;
  const float sqrt_h = float(std::sqrt(double(H)));
  std::vector<float> qn(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b < S; ++b) {
      zc_norm(fp(X) + t * W + b * H, fp(norm_query) + b * H, H, float(eps), qn.data());
      float s = dot(fp(kn) + t * W + b * H, qn.data(), H) / sqrt_h;
      const float sign = s > 0 ? 1.0f : (s < 0 ? -1.0f : 0.0f);
      s = std::sqrt(std::max(std::fabs(s), 1e-6f)) * sign;
      const float g = sigmoid(s);
      for (int64_t j = 0; j < H; ++j) mp(P)[t * W + b * H + j] = g * fp(v)[t * H + j];
    }
  }
}

void CpuOps::ple_conv_add(const Tensor& P, const Tensor& norm_conv, int64_t group, const Tensor& conv_w,
                          int64_t dilation, double eps, const Tensor& state, const Tensor& X) {
  const char* op = "ple_conv_add";
  check_tensor(P, DType::F32, 2, op, "P");
  check_tensor(norm_conv, DType::F32, 1, op, "norm_conv");
  check_tensor(conv_w, DType::F32, 2, op, "conv1d weight");
  check_tensor(state, DType::F32, 2, op, "state");
  check_tensor(X, DType::F32, 2, op, "X");
  const int64_t T = P.dim(0), W = P.dim(1), K = conv_w.dim(1);
  const int64_t ctx = (K - 1) * dilation;
  FN_CHECK(dilation >= 1 && K >= 1 && group > 0 && W % group == 0 && norm_conv.dim(0) == W && conv_w.dim(0) == W &&
               state.dim(0) == ctx && state.dim(1) == W && X.shape() == P.shape(),
           "{}: P {}, norm_conv {}, conv {}, state {}, X {} do not fit (group {}, dilation {})", op, P.str(),
           norm_conv.str(), conv_w.str(), state.str(), X.str(), group, dilation);
  // ext = [state; normed P]: row ctx + t is the conv input of token t.
  std::vector<float> ext(static_cast<size_t>((ctx + T) * W));
  std::memcpy(ext.data(), fp(state), size_t(ctx * W) * 4);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t g = 0; g < W; g += group) {
      zc_norm(fp(P) + t * W + g, fp(norm_conv) + g, group, float(eps), &ext[(ctx + t) * W + g]);
    }
  }
  for (int64_t t = 0; t < T; ++t) {
    float* x = mp(X) + t * W;
    const float* p = fp(P) + t * W;
    for (int64_t c = 0; c < W; ++c) {
      float s = 0;
      for (int64_t k = 0; k < K; ++k) s += fp(conv_w)[c * K + k] * ext[(t + k * dilation) * W + c];
      x[c] += p[c] + silu(s);
    }
  }
  std::memcpy(mp(state), ext.data() + T * W, size_t(ctx * W) * 4);
}

}  // namespace flashnext::cpu
