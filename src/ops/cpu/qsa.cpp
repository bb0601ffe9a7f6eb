// CPU backend: QSA attention (query/key preparation, indexer block selection, sparse attention with output gate).
#include "ops/contract/qsa.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/topk.h"

namespace flashnext::cpu {

void CpuOps::qsa_prepare_qk(const Tensor& qg, const Tensor& k, const Tensor& q_norm, const Tensor& k_norm, double eps,
                            const RopeParams& rope, int64_t pos0, const Tensor& q, const Tensor& gate) {
  const auto [T, D, nh, nkv] = contract::qsa_prepare_qk(kCpu, "qsa_prepare_qk", qg, k, q_norm, k_norm, rope, q, gate);
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
  // Arguments as contract::qsa_indexer_select_batch checked them for the step (private: only the batched op calls
  // it, with keys gathered for positions 0 .. pos0+T-1).
  const int64_t T = qi.dim(0), Di = index_keys.dim(1);
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
  const auto [T, nh, nkv, D, n_sel] = contract::sparse_attention(kCpu, op, q, k_cache, v_cache, selected, gate, out);
  const int64_t rows = k_cache.dim(0);
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

void CpuOps::qsa_prepare_qk_batch(const Tensor& qg, const Tensor& k, const Tensor& q_norm, const Tensor& k_norm,
                                  double eps, const RopeParams& rope, const StepBatch& batch, const Tensor& q,
                                  const Tensor& gate) {
  contract::qsa_prepare_qk_batch(kCpu, qg, k, q_norm, k_norm, rope, batch, q, gate);
  for (int64_t s = 0; s < batch.num_seqs; ++s)
    qsa_prepare_qk(seq_rows(qg, batch, s), seq_rows(k, batch, s), q_norm, k_norm, eps, rope, batch.pos0[size_t(s)],
                   seq_rows(q, batch, s), seq_rows(gate, batch, s));
}

/// Per sequence over its gathered raw keys; the pooled-key cache is not used (the reference recomputes the block
/// keys for every query, and so does the oracle).
void CpuOps::qsa_indexer_select_batch(const Tensor& qi, const Tensor& index_key_pool, const Tensor& pooled_key_pool,
                                      const Tensor& q_layernorm, const Tensor& k_layernorm, double eps,
                                      const RopeParams& rope, int64_t budget, int64_t block, const StepBatch& batch,
                                      const Tensor& selected) {
  contract::qsa_indexer_select_batch(kCpu, qi, index_key_pool, pooled_key_pool, q_layernorm, k_layernorm, rope, budget,
                                     block, batch, selected);
  for (int64_t s = 0; s < batch.num_seqs; ++s) {
    const int64_t pos0 = batch.pos0[size_t(s)], end = pos0 + batch.rows_of(s);
    qsa_indexer_select(seq_rows(qi, batch, s), gather_sequence(index_key_pool, batch, s, end), q_layernorm, k_layernorm,
                       eps, rope, pos0, budget, block, seq_rows(selected, batch, s));
  }
}

void CpuOps::sparse_attention_batch(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, const Tensor& selected,
                                    const Tensor& gate, double scale, const StepBatch& batch, const Tensor& out) {
  contract::sparse_attention_batch(kCpu, q, k_pool, v_pool, selected, gate, batch, out);
  for (int64_t s = 0; s < batch.num_seqs; ++s) {
    const int64_t end = batch.pos0[size_t(s)] + batch.rows_of(s);
    sparse_attention(seq_rows(q, batch, s), gather_sequence(k_pool, batch, s, end),
                     gather_sequence(v_pool, batch, s, end), seq_rows(selected, batch, s), seq_rows(gate, batch, s),
                     scale, seq_rows(out, batch, s));
  }
}

}  // namespace flashnext::cpu
