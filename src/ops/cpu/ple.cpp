// CPU backend: PLE (n-gram table gather, gate, dilated short conv).
#include "ops/contract/ple.h"

#include <algorithm>
#include <cstring>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/kernels.h"

namespace flashnext::cpu {

void CpuOps::ple_gather(const PleTable& table, const Tensor& rows, const Tensor& e) {
  const char* op = "ple_gather";
  const auto [T, heads, hd, total] = contract::ple_gather(kCpu, table, rows, e, [](DType dt) {
    return dt == DType::BF16 || dt == DType::F16 || dt == DType::F32 || dt == DType::F8_E4M3 || dt == DType::F8_E5M2 ||
           dt == DType::I8;
  });
  const int64_t groups = table.group > 0 ? hd / table.group : 0;
  std::vector<float> scales(static_cast<size_t>(groups));
  // Shard start rows (prefix sums of shard heights).
  std::vector<int64_t> starts;
  for (int64_t at = 0; const auto& s : table.shards) {
    starts.push_back(at);
    at += s.dim(0);
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
    if (groups > 0) {  // int8: q * the row's group scale (loader/quant.h dequantize_ple_shard_int8)
      const Tensor& gs = table.group_scales[s];
      convert_to_float(
          gs.dtype(),
          static_cast<const uint8_t*>(gs.data()) + size_t(row - starts[s]) * size_t(groups) * dtype_size(gs.dtype()),
          scales.data(), size_t(groups));
      for (int64_t j = 0; j < hd; ++j) out[j] *= scales[size_t(j / table.group)];
    }
    if (table.scale != 1.f) {
      for (int64_t j = 0; j < hd; ++j) out[j] *= table.scale;  // exact for FP8 rows (loader/quant.h)
    }
  }
}

void CpuOps::ple_gate(const Tensor& kn, const Tensor& v, const Tensor& X, const Tensor& norm_query, double eps,
                      const Tensor& P) {
  const auto [T, S, H] = contract::ple_gate(kCpu, kn, v, X, norm_query, P);
  const int64_t W = S * H;
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
  const auto [T, W, K, ctx] = contract::ple_conv_add(kCpu, P, norm_conv, group, conv_w, dilation, state, X);
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

void CpuOps::ple_conv_add_batch(const Tensor& P, const Tensor& norm_conv, int64_t group, const Tensor& conv_w,
                                int64_t dilation, double eps, const Tensor& state_pool, const StepBatch& batch,
                                const Tensor& X) {
  contract::ple_conv_add_batch(kCpu, P, norm_conv, group, conv_w, dilation, state_pool, batch, X);
  for (int64_t s = 0; s < batch.num_seqs; ++s)
    ple_conv_add(seq_rows(P, batch, s), norm_conv, group, conv_w, dilation, eps,
                 slot_view(state_pool, batch.slot_ids[size_t(s)]), seq_rows(X, batch, s));
}

}  // namespace flashnext::cpu
