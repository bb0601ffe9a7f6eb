// CPU ops against mathematics and against each other (the model-level fixtures are in tiny_*_test.cpp).
#include "ops/cpu/cpu_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "ops/cpu/topk.h"
#include "ops/ops.h"

namespace flashnext {
namespace {

// The CPU backend itself: the one-sequence forms of the batched ops (gdn_chunked, gdn_recurrent, ...) are its own.
std::shared_ptr<cpu::CpuOps> cpu() {
  static auto ops = std::make_shared<cpu::CpuOps>(2);
  return ops;
}

Tensor random_tensor(const Shape& shape, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(size_t(shape_numel(shape)));
  for (auto& x : v) x = nd(rng);
  return cpu()->upload(v.data(), DType::F32, shape);
}

std::vector<float> host(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  cpu()->download(t, v.data());
  return v;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

// torch.topk on CPU resolves ties through std::nth_element, not by index. These score vectors are the QSA indexer
// scores of tiny-a prompt "short" (second QSA layer) at positions 16 and 12: relu zeroed every head, so several
// blocks tie at exactly 0. The reference's hidden states only match with blocks {1, 3} at position 16 (the rule
// "higher score, then lower index" would pick {0, 1} and fails tiny_a_test "short" at hidden.8).
TEST(TorchTopk, ZeroTiesFollowNthElementLikePyTorch) {
  std::vector<std::pair<float, int64_t>> queue;
  int64_t top[2];
  const float p16[] = {0.0f, 0.8282134f, 0.0f, 0.0f};
  cpu::torch_topk(p16, 4, 2, queue, top);
  EXPECT_EQ((std::set<int64_t>{top[0], top[1]}), (std::set<int64_t>{1, 3}));
  EXPECT_EQ(top[0], 1);  // sorted: the largest first
  const float p12[] = {0.0f, 1.8657751f, 0.0f};
  cpu::torch_topk(p12, 3, 2, queue, top);
  EXPECT_EQ((std::set<int64_t>{top[0], top[1]}), (std::set<int64_t>{0, 1}));
}

TEST(TorchTopk, DistinctValuesAreSortedDescending) {
  std::vector<std::pair<float, int64_t>> queue;
  std::vector<float> v(200);
  for (int i = 0; i < 200; ++i) v[size_t(i)] = float((i * 37) % 200);  // a permutation of 0..199
  int64_t top[3];
  cpu::torch_topk(v.data(), 200, 3, queue, top);  // k*64 <= n: the partial_sort path
  EXPECT_EQ(v[size_t(top[0])], 199.0f);
  EXPECT_EQ(v[size_t(top[1])], 198.0f);
  EXPECT_EQ(v[size_t(top[2])], 197.0f);
}

// An 8-bit weight (Tensor::with_scales): its scales follow rows(), a view of another shape and a raw bytes_as drop
// or refuse them, inconsistent scales are refused, and the CPU oracle's products refuse 8-bit weights by name (its
// load_w8_linear gives float32 values instead).
TEST(Tensor, EightBitWeightScalesFollowRows) {
  auto ops = make_cpu_ops(1);
  const std::vector<int8_t> codes = {1, -2, 3, 4, 5, -6, 7, 8, 9, 10, 11, 12};
  const std::vector<float> scales = {0.5f, 2.f, 3.f, 4.f, 5.f, 6.f};  // [3 rows, 2 groups of 2 inputs]
  const Tensor c = ops->upload(codes.data(), DType::I8, {3, 4});
  const Tensor w = c.with_scales(ops->upload(scales.data(), DType::F32, {3, 2}), 2);
  EXPECT_TRUE(w.has_scales());
  EXPECT_FALSE(c.has_scales());
  EXPECT_EQ(w.scale_group(), 2);
  const Tensor r = w.rows(1, 3);
  ASSERT_TRUE(r.has_scales());
  EXPECT_EQ(r.scales().shape(), (Shape{2, 2}));
  EXPECT_EQ(r.scales().data_as<float>()[0], 3.f);
  EXPECT_EQ(r.data_as<int8_t>()[0], 5);
  EXPECT_FALSE(w.bytes_as(0, DType::U8, {12}).has_scales());
  EXPECT_EQ(w.view({3, 4}).scales().data_as<float>(), w.scales().data_as<float>());
  EXPECT_THROW(w.view({4, 3}), Error);
  EXPECT_THROW(c.with_scales(ops->upload(scales.data(), DType::F32, {3, 1}), 2), Error);  // 2 groups a row
  EXPECT_THROW(c.with_scales(ops->upload(scales.data(), DType::F32, {3, 2}), 0), Error);
  EXPECT_THROW(ops->upload(scales.data(), DType::F32, {3, 2}).with_scales(w.scales(), 1), Error);  // not codes
  EXPECT_THROW(c.scales(), Error);
  const std::vector<float> xs = {1.f, 2.f, 3.f, 4.f};
  const Tensor x = ops->upload(xs.data(), DType::F32, {1, 4}), y = ops->empty({1, 3});
  try {
    ops->linear(x, w, y);
    ADD_FAILURE() << "the CPU backend took an 8-bit weight";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("8-bit weight"), std::string::npos) << e.what();
  }
}

// ZC-RMSNorm by hand: x = [3, 4], mean(x^2) = 12.5, y = x / sqrt(12.5 + eps) * (1 + w).
TEST(CpuOps, ZeroCentredRmsNormGrouped) {
  const float xs[] = {3, 4, 1, 1};
  const float ws[] = {0, 1, 0.5f, -0.5f};
  Tensor x = cpu()->upload(xs, DType::F32, {1, 4}), w = cpu()->upload(ws, DType::F32, {4}), y = cpu()->empty({1, 4});
  cpu()->zc_rms_norm(x, w, 2, 1e-6, y);
  const auto got = host(y);
  const float r1 = 1.0f / std::sqrt(12.5f + 1e-6f), r2 = 1.0f / std::sqrt(1.0f + 1e-6f);
  EXPECT_NEAR(got[0], 3 * r1, 1e-6);
  EXPECT_NEAR(got[1], 4 * r1 * 2, 1e-6);
  EXPECT_NEAR(got[2], 1 * r2 * 1.5f, 1e-6);
  EXPECT_NEAR(got[3], 1 * r2 * 0.5f, 1e-6);
}

struct GdnCase {
  GdnDims dims{2, 6, 16, 8};
  int64_t T = 150;  // crosses two 64-token chunk boundaries
  Tensor qkv, a, b, state;
  GdnWeights w;
  explicit GdnCase(uint32_t seed) {
    qkv = random_tensor({T, dims.conv_dim()}, seed);
    a = random_tensor({T, dims.num_v_heads}, seed + 1);
    b = random_tensor({T, dims.num_v_heads}, seed + 2);
    w.A_log = random_tensor({dims.num_v_heads}, seed + 3, 0.5f);
    w.dt_bias = random_tensor({dims.num_v_heads}, seed + 4);
    state = random_tensor({dims.num_v_heads, dims.k_head_dim, dims.v_head_dim}, seed + 5, 0.1f);
  }
  Tensor clone_state() const { return cpu()->upload(host(state).data(), DType::F32, state.shape()); }
};

// The chunked WY form equals the token-by-token recurrence (outputs and final state), from a non-zero state.
TEST(CpuOps, GdnChunkedEqualsRecurrence) {
  GdnCase c(7);
  Tensor s1 = c.clone_state(), s2 = c.clone_state();
  Tensor o1 = cpu()->empty({c.T, 48}), o2 = cpu()->empty({c.T, 48});
  cpu()->gdn_chunked(c.qkv, c.a, c.b, c.w, c.dims, s1, o1);
  cpu()->gdn_recurrent(c.qkv, c.a, c.b, c.w, c.dims, s2, o2);
  EXPECT_LE(max_diff(host(o1), host(o2)), 1e-5);
  EXPECT_LE(max_diff(host(s1), host(s2)), 1e-5);
}

// Splitting the sequence (chunked prefill of 70, then 80 single decode steps) continues the state exactly.
TEST(CpuOps, GdnStateCarriesAcrossCalls) {
  GdnCase c(11);
  Tensor s_full = c.clone_state(), s_split = c.clone_state();
  Tensor o_full = cpu()->empty({c.T, 48});
  cpu()->gdn_chunked(c.qkv, c.a, c.b, c.w, c.dims, s_full, o_full);
  std::vector<float> got;
  const int64_t first = 70;
  Tensor o = cpu()->empty({first, 48});
  cpu()->gdn_chunked(c.qkv.rows(0, first), c.a.rows(0, first), c.b.rows(0, first), c.w, c.dims, s_split, o);
  got = host(o);
  for (int64_t t = first; t < c.T; ++t) {
    Tensor o1 = cpu()->empty({1, 48});
    cpu()->gdn_recurrent(c.qkv.rows(t, t + 1), c.a.rows(t, t + 1), c.b.rows(t, t + 1), c.w, c.dims, s_split, o1);
    const auto h = host(o1);
    got.insert(got.end(), h.begin(), h.end());
  }
  EXPECT_LE(max_diff(got, host(o_full)), 1e-5);
  EXPECT_LE(max_diff(host(s_split), host(s_full)), 1e-5);
}

// Causal conv: a new sequence sees zeros before position 0; chunked calls equal one call; y = silu(sum w x).
TEST(CpuOps, GdnConvCarriesTail) {
  const int64_t T = 11, C = 5, K = 4;
  Tensor x = random_tensor({T, C}, 3), w = random_tensor({C, K}, 4);
  const auto xs = host(x), ws = host(w);
  Tensor full = cpu()->upload(xs.data(), DType::F32, {T, C}), st = cpu()->zeros({K - 1, C});
  cpu()->gdn_conv(full, w, st);
  const auto y = host(full);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < C; ++c) {
      float s = 0;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t src = t - (K - 1) + k;
        if (src >= 0) s += ws[size_t(c * K + k)] * xs[size_t(src * C + c)];
      }
      EXPECT_NEAR(y[size_t(t * C + c)], s / (1 + std::exp(-s)), 1e-6);
    }
  }
  Tensor st2 = cpu()->zeros({K - 1, C});
  std::vector<float> parts;
  for (int64_t t0 = 0; t0 < T; t0 += 3) {
    const int64_t n = std::min<int64_t>(3, T - t0);
    Tensor part = cpu()->upload(xs.data() + t0 * C, DType::F32, {n, C});
    cpu()->gdn_conv(part, w, st2);
    const auto h = host(part);
    parts.insert(parts.end(), h.begin(), h.end());
  }
  EXPECT_EQ(parts, y);
  EXPECT_EQ(host(st2), host(st));
}

// With every cached position selected, sparse attention is dense causal softmax attention (GQA), times the gate.
TEST(CpuOps, SparseAttentionOverAllTokensIsDenseAttention) {
  const int64_t T = 5, nh = 4, nkv = 2, D = 8;
  Tensor q = random_tensor({T, nh, D}, 21), k = random_tensor({T, nkv, D}, 22), v = random_tensor({T, nkv, D}, 23);
  Tensor gate = random_tensor({T, nh, D}, 24), out = cpu()->empty({T, nh, D});
  std::vector<int32_t> sel(size_t(T * T), -1);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j <= t; ++j) sel[size_t(t * T + j)] = int32_t(t - j);  // any order
  }
  const double scale = 1.0 / std::sqrt(double(D));
  cpu()->sparse_attention(q, k, v, cpu()->upload(sel.data(), DType::I32, {T, T}), gate, scale, out);
  const auto Q = host(q), K = host(k), V = host(v), G = host(gate), O = host(out);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t kh = h / (nh / nkv);
      std::vector<double> p(size_t(t + 1));
      double mx = -1e30, sum = 0;
      for (int64_t j = 0; j <= t; ++j) {
        double s = 0;
        for (int64_t d = 0; d < D; ++d)
          s += double(Q[size_t((t * nh + h) * D + d)]) * K[size_t((j * nkv + kh) * D + d)];
        p[size_t(j)] = s * scale;
        mx = std::max(mx, p[size_t(j)]);
      }
      for (auto& x : p) sum += x = std::exp(x - mx);
      for (int64_t d = 0; d < D; ++d) {
        double o = 0;
        for (int64_t j = 0; j <= t; ++j) o += p[size_t(j)] / sum * V[size_t((j * nkv + kh) * D + d)];
        const double g = 1.0 / (1.0 + std::exp(-double(G[size_t((t * nh + h) * D + d)])));
        EXPECT_NEAR(O[size_t((t * nh + h) * D + d)], o * g, 1e-5);
      }
    }
  }
}

// The MoE block's two orders agree bit for bit: moe_shared_expert_start's term added by moe_experts(..., shared)
// is the sum moe_experts then moe_shared_expert (accumulated) make. A shared term of the wrong shape, or out itself,
// is an Error naming moe_experts.
TEST(CpuOps, SharedExpertBegunAheadEqualsAccumulated) {
  const int64_t T = 3, H = 16, I = 8, E = 4, k = 2;
  MoeWeights w;
  w.gate = random_tensor({E, I, H}, 31, 0.3f);
  w.up = random_tensor({E, I, H}, 32, 0.3f);
  w.down = random_tensor({E, H, I}, 33, 0.3f);
  w.shared_gate_proj = random_tensor({I, H}, 34, 0.3f);
  w.shared_up_proj = random_tensor({I, H}, 35, 0.3f);
  w.shared_down_proj = random_tensor({H, I}, 36, 0.3f);
  w.shared_expert_gate = random_tensor({1, H}, 37, 0.3f);
  const Tensor u = random_tensor({T, H}, 38);
  const std::vector<int32_t> id = {0, 2, 3, 1, 2, 3};
  const std::vector<float> wt = {0.75f, 0.25f, 0.5f, 0.5f, 0.125f, 0.875f};
  const Tensor ids = cpu()->upload(id.data(), DType::I32, {T, k}),
               weights = cpu()->upload(wt.data(), DType::F32, {T, k});
  Tensor accumulated = cpu()->empty({T, H}), ahead = cpu()->empty({T, H}), shared = cpu()->empty({T, H});
  cpu()->moe_experts(u, ids, weights, w, accumulated);
  cpu()->moe_shared_expert(u, w, accumulated);
  cpu()->moe_shared_expert_start(u, w, shared);
  cpu()->moe_experts(u, ids, weights, w, ahead, shared);
  const auto a = host(accumulated), b = host(ahead), routed_only = [&] {
    Tensor r = cpu()->empty({T, H});
    cpu()->moe_experts(u, ids, weights, w, r);
    return host(r);
  }();
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "element " << i;
  EXPECT_GT(max_diff(a, routed_only), 1e-3);  // the shared term is there
  try {
    cpu()->moe_experts(u, ids, weights, w, ahead, cpu()->empty({T, H + 1}));
    ADD_FAILURE() << "a shared term of the wrong shape was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("moe_experts"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cpu()->moe_experts(u, ids, weights, w, ahead, ahead), Error);
}

// Shape errors are Errors naming the op, never crashes.
TEST(CpuOps, ShapeMismatchIsAnError) {
  Tensor x = cpu()->zeros({2, 3}), w = cpu()->zeros({4, 5}), y = cpu()->zeros({2, 4});
  EXPECT_THROW(cpu()->linear(x, w, y), Error);
  try {
    cpu()->linear(x, w, y);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear"), std::string::npos);
  }
}

}  // namespace
}  // namespace flashnext
