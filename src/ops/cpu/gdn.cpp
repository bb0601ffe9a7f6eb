// CPU backend: Gated DeltaNet (causal conv, chunked and recurrent gated delta rule, gated RMSNorm).
#include "ops/contract/gdn.h"

#include <algorithm>
#include <cstring>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/kernels.h"

namespace flashnext::cpu {

namespace {

// Per value head inputs of the delta rule: l2-normalised q (scaled by dk^-0.5) and k, v, beta, g for every token.
struct HeadInputs {
  std::vector<float> q, k, v, beta, g;  // [T, dk], [T, dk], [T, dv], [T], [T]
};

void gather_head(const Tensor& qkv, const Tensor& a, const Tensor& b, const GdnWeights& w, const GdnDims& d, int64_t h,
                 HeadInputs& in) {
  const int64_t T = qkv.dim(0), C = qkv.dim(1), dk = d.k_head_dim, dv = d.v_head_dim, nv = d.num_v_heads;
  const int64_t kh = h / (nv / d.num_k_heads), key_dim = d.num_k_heads * dk;
  const float scale = 1.0f / std::sqrt(float(dk));
  in.q.resize(size_t(T * dk));
  in.k.resize(size_t(T * dk));
  in.v.resize(size_t(T * dv));
  in.beta.resize(size_t(T));
  in.g.resize(size_t(T));
  const float A = -std::exp(fp(w.A_log)[h]);
  for (int64_t t = 0; t < T; ++t) {
    const float* row = fp(qkv) + t * C;
    l2norm(row + kh * dk, dk, &in.q[t * dk]);
    for (int64_t i = 0; i < dk; ++i) in.q[t * dk + i] *= scale;
    l2norm(row + key_dim + kh * dk, dk, &in.k[t * dk]);
    std::memcpy(&in.v[t * dv], row + 2 * key_dim + h * dv, size_t(dv) * 4);
    in.beta[t] = sigmoid(fp(b)[t * nv + h]);
    in.g[t] = A * softplus(fp(a)[t * nv + h] + fp(w.dt_bias)[h]);
  }
}

}  // namespace

void CpuOps::gdn_conv(const Tensor& qkv, const Tensor& weight, const Tensor& state) {
  const auto [T, C, K] = contract::gdn_conv(kCpu, qkv, weight, state);
  // ext = [state; qkv]: row K-1+t is input t.
  std::vector<float> ext(static_cast<size_t>((K - 1 + T) * C));
  std::memcpy(ext.data(), fp(state), size_t((K - 1) * C) * 4);
  std::memcpy(ext.data() + (K - 1) * C, fp(qkv), size_t(T * C) * 4);
  pool_.parallel_for(T, std::max<int64_t>(1, 2048 / C), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* y = mp(qkv) + t * C;
      for (int64_t c = 0; c < C; ++c) {
        float s = 0;
        for (int64_t k = 0; k < K; ++k) s += fp(weight)[c * K + k] * ext[(t + k) * C + c];
        y[c] = silu(s);
      }
    }
  });
  std::memcpy(mp(state), ext.data() + T * C, size_t((K - 1) * C) * 4);
}

void CpuOps::gdn_recurrent(const Tensor& qkv, const Tensor& a, const Tensor& b, const GdnWeights& w, const GdnDims& d,
                           const Tensor& state, const Tensor& o) {
  contract::gdn_rule(kCpu, "gdn_recurrent", qkv, a, b, w, d, state, o);
  const int64_t T = qkv.dim(0), dk = d.k_head_dim, dv = d.v_head_dim, nv = d.num_v_heads;
  pool_.parallel_for(nv, 1, [&](int64_t h0, int64_t h1) {
    HeadInputs in;
    std::vector<float> kv_mem(static_cast<size_t>(dv));
    for (int64_t h = h0; h < h1; ++h) {
      gather_head(qkv, a, b, w, d, h, in);
      float* S = mp(state) + h * dk * dv;  // [dk, dv]
      for (int64_t t = 0; t < T; ++t) {
        const float decay = std::exp(in.g[t]);
        for (int64_t i = 0; i < dk * dv; ++i) S[i] *= decay;
        const float* k = &in.k[t * dk];
        const float* q = &in.q[t * dk];
        // kv_mem = S^T k; delta = (v - kv_mem) * beta; S += k delta^T; o = S^T q.
        std::fill(kv_mem.begin(), kv_mem.end(), 0.0f);
        for (int64_t i = 0; i < dk; ++i) axpy(k[i], S + i * dv, kv_mem.data(), dv);
        for (int64_t j = 0; j < dv; ++j) kv_mem[j] = (in.v[t * dv + j] - kv_mem[j]) * in.beta[t];
        for (int64_t i = 0; i < dk; ++i) axpy(k[i], kv_mem.data(), S + i * dv, dv);
        float* out = mp(o) + t * nv * dv + h * dv;
        std::fill(out, out + dv, 0.0f);
        for (int64_t i = 0; i < dk; ++i) axpy(q[i], S + i * dv, out, dv);
      }
    }
  });
}

void CpuOps::gdn_chunked(const Tensor& qkv, const Tensor& a, const Tensor& b, const GdnWeights& w, const GdnDims& d,
                         const Tensor& state, const Tensor& o) {
  contract::gdn_rule(kCpu, "gdn_chunked", qkv, a, b, w, d, state, o);
  constexpr int64_t kChunk = 64;
  const int64_t T = qkv.dim(0), dk = d.k_head_dim, dv = d.v_head_dim, nv = d.num_v_heads;
  pool_.parallel_for(nv, 1, [&](int64_t h0, int64_t h1) {
    HeadInputs in;
    std::vector<float> cum(kChunk), A(kChunk * kChunk), U(kChunk * dv), Wk(kChunk * dk), vnew(kChunk * dv),
        tmp(std::max(dk, dv));
    for (int64_t h = h0; h < h1; ++h) {
      gather_head(qkv, a, b, w, d, h, in);
      float* S = mp(state) + h * dk * dv;  // [dk, dv]
      for (int64_t c0 = 0; c0 < T; c0 += kChunk) {
        const int64_t L = std::min(kChunk, T - c0);
        const float* q = &in.q[c0 * dk];
        const float* k = &in.k[c0 * dk];
        const float* v = &in.v[c0 * dv];
        const float* beta = &in.beta[c0];
        // Cumulative log-decay inside the chunk.
        float acc = 0;
        for (int64_t i = 0; i < L; ++i) cum[i] = acc += in.g[c0 + i];
        // UT system: A[i][j] = beta_i (k_i . k_j) exp(cum_i - cum_j), j < i (unit diagonal implied).
        for (int64_t i = 0; i < L; ++i) {
          for (int64_t j = 0; j < i; ++j)
            A[i * kChunk + j] = beta[i] * dot(k + i * dk, k + j * dk, dk) * std::exp(cum[i] - cum[j]);
        }
        // Forward substitution: U = (I + A)^-1 (beta v), Wk = (I + A)^-1 (beta k exp(cum)).
        for (int64_t i = 0; i < L; ++i) {
          float* u = &U[i * dv];
          float* wk = &Wk[i * dk];
          const float e = std::exp(cum[i]);
          for (int64_t j = 0; j < dv; ++j) u[j] = v[i * dv + j] * beta[i];
          for (int64_t j = 0; j < dk; ++j) wk[j] = k[i * dk + j] * beta[i] * e;
          for (int64_t j = 0; j < i; ++j) {
            axpy(-A[i * kChunk + j], &U[j * dv], u, dv);
            axpy(-A[i * kChunk + j], &Wk[j * dk], wk, dk);
          }
        }
        // v_new = U - Wk S (the part of the values the incoming state does not predict).
        for (int64_t i = 0; i < L; ++i) {
          float* vn = &vnew[i * dv];
          std::memcpy(vn, &U[i * dv], size_t(dv) * 4);
          for (int64_t p = 0; p < dk; ++p) axpy(-Wk[i * dk + p], S + p * dv, vn, dv);
        }
        // Outputs: o_i = (q_i exp(cum_i)) S + sum_{j <= i} (q_i . k_j) exp(cum_i - cum_j) v_new_j.
        for (int64_t i = 0; i < L; ++i) {
          float* out = mp(o) + (c0 + i) * nv * dv + h * dv;
          std::fill(out, out + dv, 0.0f);
          const float e = std::exp(cum[i]);
          for (int64_t p = 0; p < dk; ++p) axpy(q[i * dk + p] * e, S + p * dv, out, dv);
          for (int64_t j = 0; j <= i; ++j) {
            axpy(dot(q + i * dk, k + j * dk, dk) * std::exp(cum[i] - cum[j]), &vnew[j * dv], out, dv);
          }
        }
        // State: S = S exp(cum_last) + sum_j (k_j exp(cum_last - cum_j)) v_new_j^T.
        const float last = cum[L - 1];
        const float chunk_decay = std::exp(last);
        for (int64_t i = 0; i < dk * dv; ++i) S[i] *= chunk_decay;
        for (int64_t j = 0; j < L; ++j) {
          const float e = std::exp(last - cum[j]);
          for (int64_t p = 0; p < dk; ++p) axpy(k[j * dk + p] * e, &vnew[j * dv], S + p * dv, dv);
        }
      }
    }
  });
}

void CpuOps::gated_rms_norm(const Tensor& x, const Tensor& z, const Tensor& w, double eps, GateAct act,
                            const Tensor& y) {
  const auto [T, heads, D] = contract::gated_rms_norm(kCpu, x, z, w, y);
  const int64_t L = heads * D;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t g = 0; g < L; g += D) {
      const float* xr = fp(x) + t * L + g;
      const float* zr = fp(z) + t * L + g;
      float* yr = mp(y) + t * L + g;
      const float r = rms_scale(xr, D, float(eps));
      for (int64_t i = 0; i < D; ++i) {
        const float gate = act == GateAct::Silu ? silu(zr[i]) : sigmoid(zr[i]);
        yr[i] = (fp(w)[i] * (xr[i] * r)) * gate;
      }
    }
  }
}

void CpuOps::gdn_conv_batch(const Tensor& qkv, const Tensor& weight, const Tensor& state_pool, const StepBatch& batch) {
  contract::gdn_conv_batch(kCpu, qkv, weight, state_pool, batch);
  for (int64_t s = 0; s < batch.num_seqs; ++s)
    gdn_conv(seq_rows(qkv, batch, s), weight, slot_view(state_pool, batch.slot_ids[size_t(s)]));
}

void CpuOps::gdn_rule_batch(const Tensor& qkv, const Tensor& a, const Tensor& b, const GdnWeights& w,
                            const GdnDims& dims, const Tensor& state_pool, const StepBatch& batch, const Tensor& o) {
  contract::gdn_rule_batch(kCpu, qkv, a, b, w, dims, state_pool, batch, o);
  for (int64_t s = 0; s < batch.num_seqs; ++s) {
    const Tensor state = slot_view(state_pool, batch.slot_ids[size_t(s)]);
    const Tensor q = seq_rows(qkv, batch, s), as = seq_rows(a, batch, s), bs = seq_rows(b, batch, s);
    if (batch.rows_of(s) == 1)
      gdn_recurrent(q, as, bs, w, dims, state, seq_rows(o, batch, s));
    else
      gdn_chunked(q, as, bs, w, dims, state, seq_rows(o, batch, s));
  }
}

}  // namespace flashnext::cpu
