// CPU backend: QSA attention (query/key preparation, indexer block selection, sparse attention with output gate).
#include <algorithm>
#include <cstring>
#include <limits>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/topk.h"

namespace flashnext::cpu {

void CpuOps::qsa_prepare_qk(const Tensor& qg, const Tensor& k, const Tensor& q_norm, const Tensor& k_norm, double eps,
                            const RopeParams& rope, int64_t pos0, const Tensor& q, const Tensor& gate) {
  const char* op = "qsa_prepare_qk";
  check_tensor(qg, DType::F32, 2, op, "q_proj output");
  check_tensor(k, DType::F32, 2, op, "k");
  check_tensor(q_norm, DType::F32, 1, op, "q_norm");
  check_tensor(k_norm, DType::F32, 1, op, "k_norm");
  check_tensor(q, DType::F32, 2, op, "q");
  check_tensor(gate, DType::F32, 2, op, "gate");
  const int64_t T = qg.dim(0), D = q_norm.dim(0);
  FN_CHECK(D > 0 && k_norm.dim(0) == D && qg.dim(1) % (2 * D) == 0 && k.dim(0) == T && k.dim(1) % D == 0 &&
               q.dim(0) == T && q.dim(1) * 2 == qg.dim(1) && gate.shape() == q.shape(),
           "{}: q_proj output {}, k {}, q {}, gate {} do not fit head_dim {}", op, qg.str(), k.str(), q.str(),
           gate.str(), D);
  FN_CHECK(rope.rotary_dim > 0 && rope.rotary_dim % 2 == 0 && rope.rotary_dim <= D,
           "{}: rotary_dim {} invalid for "
           "head_dim {}",
           op, rope.rotary_dim, D);
  const int64_t nh = q.dim(1) / D, nkv = k.dim(1) / D;
  const RopeTable table(rope.rotary_dim, rope.theta);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = pos0 + t;
    for (int64_t h = 0; h < nh; ++h) {
      const float* src = fp(qg) + t * nh * 2 * D + h * 2 * D;
      float* qh = mp(q) + t * nh * D + h * D;
      std::memcpy(mp(gate) + t * nh * D + h * D, src + D, size_t(D) * 4);
      zc_norm(src, fp(q_norm), D, float(eps), qh);
      table.apply(qh, pos);
    }
    for (int64_t h = 0; h < nkv; ++h) {
      float* kh = mp(k) + t * nkv * D + h * D;
      zc_norm(kh, fp(k_norm), D, float(eps), kh);
      table.apply(kh, pos);
    }
  }
}

void CpuOps::qsa_indexer_select(const Tensor& qi, const Tensor& index_keys, const Tensor& q_layernorm,
                                const Tensor& k_layernorm, double eps, const RopeParams& rope, int64_t pos0,
                                int64_t budget, int64_t block, const Tensor& selected) {
  const char* op = "qsa_indexer_select";
  check_tensor(qi, DType::F32, 2, op, "index queries");
  check_tensor(index_keys, DType::F32, 2, op, "index keys");
  check_tensor(q_layernorm, DType::F32, 1, op, "q_layernorm");
  check_tensor(k_layernorm, DType::F32, 1, op, "k_layernorm");
  check_tensor(selected, DType::I32, 2, op, "selected");
  const int64_t T = qi.dim(0), Di = index_keys.dim(1);
  FN_CHECK(block > 0 && budget > 0 && budget % block == 0, "{}: budget {} must be a positive multiple of block {}", op,
           budget, block);
  FN_CHECK(Di > 0 && qi.dim(1) % Di == 0 && q_layernorm.dim(0) == Di && k_layernorm.dim(0) == Di &&
               selected.dim(0) == T && selected.dim(1) == budget + block - 1 && index_keys.dim(0) >= pos0 + T,
           "{}: index queries {}, keys {}, selected {} do not fit (pos0 {}, budget {}, block {})", op, qi.str(),
           index_keys.str(), selected.str(), pos0, budget, block);
  FN_CHECK(rope.rotary_dim > 0 && rope.rotary_dim <= Di, "{}: rotary_dim {} exceeds indexer_head_dim {}", op,
           rope.rotary_dim, Di);
  const int64_t ni = qi.dim(1) / Di, max_blocks = budget / block, width = selected.dim(1);
  const RopeTable table(rope.rotary_dim, rope.theta);
  // Block keys of every complete block visible to the last query: RoPE(k_layernorm(mean of raw keys)) at the
  // block's first position. Blocks are formed by logical position (row p of index_keys is position p).
  const int64_t nb_all = (pos0 + T) / block;
  std::vector<float> bkeys(static_cast<size_t>(nb_all * Di));
  pool_.parallel_for(nb_all, 16, [&](int64_t j0, int64_t j1) {
    std::vector<float> mean(static_cast<size_t>(Di));
    for (int64_t j = j0; j < j1; ++j) {
      std::fill(mean.begin(), mean.end(), 0.0f);
      for (int64_t r = 0; r < block; ++r) {
        const float* key = fp(index_keys) + (j * block + r) * Di;
        for (int64_t i = 0; i < Di; ++i) mean[i] += key[i];
      }
      for (auto& m : mean) m /= float(block);
      zc_norm(mean.data(), fp(k_layernorm), Di, float(eps), &bkeys[j * Di]);
      table.apply(&bkeys[j * Di], j * block);
    }
  });
  const float sqrt_di = float(std::sqrt(double(Di)));
  pool_.parallel_for(T, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> qn(static_cast<size_t>(ni * Di)), scores;
    std::vector<std::pair<float, int64_t>> queue;
    std::vector<int64_t> top(static_cast<size_t>(max_blocks));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t p = pos0 + t, nb = (p + 1) / block;
      for (int64_t h = 0; h < ni; ++h) {
        zc_norm(fp(qi) + t * ni * Di + h * Di, fp(q_layernorm), Di, float(eps), &qn[h * Di]);
        table.apply(&qn[h * Di], p);
      }
      scores.assign(size_t(nb), 0.0f);
      for (int64_t j = 0; j < nb; ++j) {
        float s = 0;
        for (int64_t h = 0; h < ni; ++h) s += std::max(0.0f, dot(&qn[h * Di], &bkeys[j * Di], Di));
        scores[j] = s / sqrt_di;
      }
      const int64_t k = std::min(max_blocks, nb);
      torch_topk(scores.data(), nb, k, queue, top.data());
      int32_t* out = selected.data_as<int32_t>() + t * width;
      int64_t n = 0;
      for (int64_t i = 0; i < k; ++i) {
        for (int64_t r = 0; r < block; ++r) out[n++] = int32_t(top[i] * block + r);
      }
      for (int64_t r = nb * block; r <= p; ++r) out[n++] = int32_t(r);
      for (; n < width; ++n) out[n] = -1;
    }
  });
}

void CpuOps::sparse_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& selected,
                              const Tensor& gate, double scale, const Tensor& out) {
  const char* op = "sparse_attention";
  check_tensor(q, DType::F32, 3, op, "q");
  check_tensor(k_cache, DType::F32, 3, op, "k_cache");
  check_tensor(v_cache, DType::F32, 3, op, "v_cache");
  check_tensor(selected, DType::I32, 2, op, "selected");
  check_tensor(gate, DType::F32, 3, op, "gate");
  check_tensor(out, DType::F32, 3, op, "out");
  const int64_t T = q.dim(0), nh = q.dim(1), D = q.dim(2), rows = k_cache.dim(0), nkv = k_cache.dim(1);
  const int64_t n_sel = selected.dim(1);
  FN_CHECK(v_cache.shape() == k_cache.shape() && k_cache.dim(2) == D && nkv > 0 && nh % nkv == 0 &&
               selected.dim(0) == T && gate.shape() == q.shape() && out.shape() == q.shape(),
           "{}: q {}, caches {} / {}, selected {}, gate {}, out {} do not fit", op, q.str(), k_cache.str(),
           v_cache.str(), selected.str(), gate.str(), out.str());
  const int64_t group = nh / nkv;
  const int32_t* sel_all = selected.data_as<const int32_t>();
  for (int64_t i = 0; i < T * n_sel; ++i) {
    FN_CHECK(sel_all[i] < rows, "{}: selected position {} is outside the cache ({} rows)", op, sel_all[i], rows);
  }
  pool_.parallel_for(T * nh, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> p(static_cast<size_t>(n_sel));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / nh, h = i % nh, kvh = h / group;
      const int32_t* sel = sel_all + t * n_sel;
      const float* qh = fp(q) + (t * nh + h) * D;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n_sel; ++j) {
        if (sel[j] < 0) continue;
        p[j] = dot(qh, fp(k_cache) + (sel[j] * nkv + kvh) * D, D) * float(scale);
        mx = std::max(mx, p[j]);
      }
      float sum = 0;
      for (int64_t j = 0; j < n_sel; ++j) {
        if (sel[j] >= 0) sum += p[j] = std::exp(p[j] - mx);
      }
      float* o = mp(out) + (t * nh + h) * D;
      std::fill(o, o + D, 0.0f);
      FN_CHECK(sum > 0, "{}: query {} has no selected positions", op, t);
      for (int64_t j = 0; j < n_sel; ++j) {
        if (sel[j] >= 0) axpy(p[j] / sum, fp(v_cache) + (sel[j] * nkv + kvh) * D, o, D);
      }
      const float* g = fp(gate) + (t * nh + h) * D;
      for (int64_t d = 0; d < D; ++d) o[d] *= sigmoid(g[d]);
    }
  });
}

}  // namespace flashnext::cpu
