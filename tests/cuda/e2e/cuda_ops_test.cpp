// The CUDA backend (make_cuda_ops) against the float32 CPU oracle (make_cpu_ops), op by op through the ops
// interface, on random inputs at shapes that reach the kernels' limits (head dim 256, GDN key dim 128, 4 HC streams)
// and across chunk boundaries with carried state, for both activation precisions. Weights are drawn as
// FP16-representable values, so both backends see the same weights exactly: with FP16x2 activations every op must
// match to float32 reduction-order differences; with FP16 activations the products to FP16 rounding of their
// inputs.
#include "ops/cuda/cuda_ops.h"

#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "ops/ops.h"

namespace flashnext {
namespace {

std::shared_ptr<Ops> cpu() {
  static std::shared_ptr<Ops> ops = make_cpu_ops(0);
  return ops;
}
ActivationPrecision g_mode = ActivationPrecision::Fp16x2;  // set by the fixture for each test

std::shared_ptr<Ops> gpu() {
  static std::shared_ptr<Ops> split =
      make_cuda_ops(0, CudaOpsOptions{PleTablePlacement::Host, ActivationPrecision::Fp16x2});
  static std::shared_ptr<Ops> fp16 =
      make_cuda_ops(0, CudaOpsOptions{PleTablePlacement::Host, ActivationPrecision::Fp16});
  return g_mode == ActivationPrecision::Fp16x2 ? split : fp16;
}

std::vector<float> normal(size_t n, uint32_t seed, float scale, bool fp16_exact) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = fp16_exact ? __half2float(__float2half_rn(nd(rng))) : nd(rng);
  return v;
}

/// The same tensor on both backends.
struct Pair {
  Tensor c, g;
};

Pair act(const Shape& s, uint32_t seed, float scale = 1.0f) {
  const auto v = normal(size_t(shape_numel(s)), seed, scale, false);
  return {cpu()->upload(v.data(), DType::F32, s), gpu()->upload(v.data(), DType::F32, s)};
}
Pair weight(const Shape& s, uint32_t seed, float scale = 1.0f) {
  const auto v = normal(size_t(shape_numel(s)), seed, scale, true);
  return {cpu()->load_weight(v.data(), DType::F32, s), gpu()->load_weight(v.data(), DType::F32, s)};
}
Pair empty(const Shape& s, DType dt = DType::F32) {
  return {cpu()->empty(s, dt), gpu()->empty(s, dt)};
}
template <class T>
Pair ints(const std::vector<T>& v, const Shape& s) {
  const DType dt = sizeof(T) == 4 ? DType::I32 : DType::I64;
  return {cpu()->upload(v.data(), dt, s), gpu()->upload(v.data(), dt, s)};
}
Pair zeros(const Shape& s) {
  return {cpu()->zeros(s), gpu()->zeros(s)};
}

std::vector<float> host(Ops& ops, const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  ops.download(t, v.data());
  return v;
}
template <class T>
std::vector<T> host_as(Ops& ops, const Tensor& t) {
  std::vector<T> v(size_t(t.numel()));
  ops.download(t, v.data());
  return v;
}

/// Every element within atol + rtol*|cpu|; reports the worst one and returns the largest absolute difference.
double expect_close(const Pair& p, double atol, double rtol, const std::string& what) {
  const auto c = host(*cpu(), p.c), g = host(*gpu(), p.g);
  EXPECT_EQ(c.size(), g.size()) << what;
  size_t bad = 0, worst = 0;
  double worst_ratio = 0, max_abs = 0;
  for (size_t i = 0; i < std::min(c.size(), g.size()); ++i) {
    const double err = std::fabs(double(g[i]) - double(c[i]));
    const double ratio = err == 0 ? 0.0 : err / (atol + rtol * std::fabs(double(c[i])));  // 0/0 is a match
    if (!(ratio <= 1.0)) ++bad;                                                           // NaN too
    if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
    if (!(err <= max_abs)) max_abs = err;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << c.size() << " elements outside atol " << atol << " rtol "
                     << rtol << "; worst at " << worst << ": cuda " << g[worst] << ", cpu " << c[worst];
  return max_abs;
}

constexpr double kF32 = 1e-4;  // float32 on both sides, different reduction order

/// Relative tolerance of a tensor-core product's output: float32-exact with FP16x2 inputs, FP16 rounding otherwise.
double prod_rtol() {
  return g_mode == ActivationPrecision::Fp16x2 ? kF32 : 1e-2;
}
/// Absolute floor for products of O(1) values.
double prod_atol(double fp16_atol) {
  return g_mode == ActivationPrecision::Fp16x2 ? kF32 : fp16_atol;
}

class CudaOps : public ::testing::TestWithParam<ActivationPrecision> {
 protected:
  void SetUp() override { g_mode = GetParam(); }
};

TEST_P(CudaOps, MemoryRoundTrip) {
  const std::vector<int32_t> v = {1, -2, 3, 4, 5, 6};
  Tensor t = gpu()->upload(v.data(), DType::I32, {3, 2});
  Tensor z = gpu()->zeros({4, 2}, DType::I32);
  gpu()->copy_rows(t, 1, z, 2, 2);
  EXPECT_EQ(host_as<int32_t>(*gpu(), z), (std::vector<int32_t>{0, 0, 0, 0, 3, 4, 5, 6}));
  gpu()->fill_zero(t);
  EXPECT_EQ(host_as<int32_t>(*gpu(), t), std::vector<int32_t>(6, 0));
  EXPECT_EQ(t.device(), Device::CUDA);
}

// BF16 -> FP16 at load; a value beyond 65504 is an Error that says so.
TEST_P(CudaOps, LoadWeightConvertsBf16AndRejectsValuesOutsideFp16) {
  auto bf16 = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return uint16_t(u >> 16);
  };
  const std::vector<uint16_t> ok = {bf16(1.5f), bf16(-2.25f), bf16(1024.0f), bf16(0.0078125f)};
  Tensor w = gpu()->load_weight(ok.data(), DType::BF16, {2, 2});
  EXPECT_EQ(w.dtype(), DType::F16);
  const auto h = host_as<__half>(*gpu(), w);
  EXPECT_EQ(__half2float(h[0]), 1.5f);
  EXPECT_EQ(__half2float(h[1]), -2.25f);
  EXPECT_EQ(__half2float(h[2]), 1024.0f);
  EXPECT_EQ(__half2float(h[3]), 0.0078125f);
  const std::vector<uint16_t> big = {bf16(1.0f), bf16(70000.0f), bf16(-3.0e5f), bf16(2.0f)};
  try {
    gpu()->load_weight(big.data(), DType::BF16, {4});
    ADD_FAILURE() << "a BF16 weight of 70000 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 of the 4 values"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("FP16 range"), std::string::npos) << e.what();
  }
}

TEST_P(CudaOps, EmbeddingAndLinear) {
  const int64_t V = 50, H = 256, T = 23, O = 200;
  Pair table = weight({V, H}, 1);
  std::vector<int32_t> id(T);
  for (int64_t t = 0; t < T; ++t) id[size_t(t)] = int32_t((t * 17 + 3) % V);
  Pair ids = ints(id, {T}), x = empty({T, 4 * H});
  cpu()->embedding(table.c, ids.c, x.c);
  gpu()->embedding(table.g, ids.g, x.g);
  EXPECT_EQ(expect_close(x, 0, 0, "embedding"), 0.0);
  Pair in = act({T, H}, 2), w = weight({O, H}, 3, 1.0f / 16), b = weight({O}, 4), y = empty({T, O});
  cpu()->linear(in.c, w.c, y.c, b.c);
  gpu()->linear(in.g, w.g, y.g, b.g);
  expect_close(y, prod_atol(5e-3), prod_rtol(), "linear + bias");
  Pair y2 = empty({1, O});  // a one-row view (decode)
  cpu()->linear(in.c.rows(T - 1, T), w.c, y2.c);
  gpu()->linear(in.g.rows(T - 1, T), w.g, y2.g);
  expect_close(y2, prod_atol(5e-3), prod_rtol(), "linear, last row");
  // Decode-sized products (at most 8 rows, inputs a multiple of 8: the float32 GEMV, in both precisions) and the
  // tensor-core fallbacks beside them (9 rows; 258 inputs).
  for (int64_t K : {int64_t(264), int64_t(258)}) {
    for (int64_t n : {int64_t(1), int64_t(2), int64_t(5), int64_t(8), int64_t(9)}) {
      Pair xi = act({n, K}, uint32_t(10 + n)), wi = weight({O, K}, 11, 1.0f / 16), bi = weight({O}, 12),
           yi = empty({n, O});
      cpu()->linear(xi.c, wi.c, yi.c, bi.c);
      gpu()->linear(xi.g, wi.g, yi.g, bi.g);
      const bool gemv = n <= 8 && K % 8 == 0;
      expect_close(yi, gemv ? kF32 : prod_atol(5e-3), gemv ? kF32 : prod_rtol(),
                   "linear " + std::to_string(n) + " x " + std::to_string(K) + (gemv ? " (gemv)" : ""));
    }
  }
  // linear_group: three projections of one input, one with a bias, widths 200 / 24 / 8 (one GEMV launch up to 8
  // rows; a product per weight at 11 rows).
  for (int64_t n : {int64_t(1), int64_t(4), int64_t(8), int64_t(11)}) {
    const int64_t K = 136;
    Pair xg = act({n, K}, uint32_t(30 + n));
    Pair w0 = weight({200, K}, 31, 1.0f / 16), w1 = weight({24, K}, 32, 1.0f / 16), w2 = weight({8, K}, 33, 1.0f / 16);
    Pair b1 = weight({24}, 34), y0 = empty({n, 200}), y1 = empty({n, 24}), y2 = empty({n, 8});
    const Tensor wc[] = {w0.c, w1.c, w2.c}, wg[] = {w0.g, w1.g, w2.g};
    const Tensor yc[] = {y0.c, y1.c, y2.c}, yg[] = {y0.g, y1.g, y2.g};
    const Tensor bc[] = {Tensor(), b1.c, Tensor()}, bg[] = {Tensor(), b1.g, Tensor()};
    cpu()->linear_group(xg.c, wc, yc, bc);
    gpu()->linear_group(xg.g, wg, yg, bg);
    const bool gemv = n <= 8;
    for (const Pair* y : {&y0, &y1, &y2})
      expect_close(*y, gemv ? kF32 : prod_atol(5e-3), gemv ? kF32 : prod_rtol(),
                   "linear_group " + std::to_string(n) + " rows");
  }
}

TEST_P(CudaOps, Norms) {
  const int64_t T = 19, S = 4, H = 640, D = 128;
  Pair x = act({T, S * H}, 5, 3.0f), w = weight({S * H}, 6, 0.2f), y = empty({T, S * H});
  cpu()->zc_rms_norm(x.c, w.c, H, 1e-6, y.c);
  gpu()->zc_rms_norm(x.g, w.g, H, 1e-6, y.g);
  expect_close(y, kF32, kF32, "zc_rms_norm grouped");
  Pair wh = weight({D}, 7, 0.2f);
  cpu()->zc_rms_norm(x.c, wh.c, D, 1e-6, x.c);  // per head, in place
  gpu()->zc_rms_norm(x.g, wh.g, D, 1e-6, x.g);
  expect_close(x, kF32, kF32, "zc_rms_norm per head in place");
  for (GateAct act_kind : {GateAct::Silu, GateAct::Sigmoid}) {
    Pair o = act({T, 6 * D}, 8), z = act({T, 6 * D}, 9), gw = weight({D}, 10, 0.5f), out = empty({T, 6 * D});
    cpu()->gated_rms_norm(o.c, z.c, gw.c, 1e-6, act_kind, out.c);
    gpu()->gated_rms_norm(o.g, z.g, gw.g, 1e-6, act_kind, out.g);
    expect_close(out, kF32, kF32, act_kind == GateAct::Silu ? "gated_rms_norm silu" : "gated_rms_norm sigmoid");
  }
}

TEST_P(CudaOps, HyperConnections) {
  const int64_t T = 21, S = 4, H = 256, R = 64;
  Pair X = act({T, S * H}, 11, 2.0f);
  HcWeights wc, wg;
  Pair norm = weight({S * H}, 12, 0.2f), down = weight({R, S * H}, 13, 1.0f / 32), up = weight({S * H, R}, 14, 0.125f);
  Pair inject = weight({S, S * H}, 15, 1.0f / 32);
  wc = {norm.c, down.c, up.c, inject.c};
  wg = {norm.g, down.g, up.g, inject.g};
  Pair u = empty({T, H}), inj = empty({T, S});
  cpu()->hc_read(X.c, wc, 1e-6, u.c, inj.c);
  gpu()->hc_read(X.g, wg, 1e-6, u.g, inj.g);
  expect_close(u, prod_atol(1e-2), prod_rtol(), "hc_read u");
  expect_close(inj, prod_atol(1e-2), prod_rtol(), "hc_read inject weights");
  wc.inject = Tensor();
  wg.inject = Tensor();
  Pair u2 = empty({T, H});
  cpu()->hc_read(X.c, wc, 1e-6, u2.c, Tensor());
  gpu()->hc_read(X.g, wg, 1e-6, u2.g, Tensor());
  expect_close(u2, prod_atol(1e-2), prod_rtol(), "hyper_connection_mixer u");
  Pair out = act({T, H}, 16);
  cpu()->hc_inject(X.c, out.c, inj.c);
  gpu()->hc_inject(X.g, out.g, inj.g);
  expect_close(X, prod_atol(2e-2), prod_rtol(), "hc_inject");
  // Decode-sized reads (at most 8 tokens: the two-launch float32 kernels, in both precisions) at odd geometries:
  // 3 streams of 40 with rank 24; the released rank 320 (more code words than lanes) over 4 streams of 64.
  for (auto [Sd, Hd, Rd] : {std::array<int64_t, 3>{3, 40, 24}, std::array<int64_t, 3>{4, 64, 320}}) {
    for (int64_t n : {int64_t(1), int64_t(3), int64_t(8)}) {
      Pair Xd = act({n, Sd * Hd}, uint32_t(20 + n), 2.0f);
      Pair nd = weight({Sd * Hd}, 21, 0.2f), dd = weight({Rd, Sd * Hd}, 22, 1.0f / 16),
           ud = weight({Sd * Hd, Rd}, 23, 0.125f), jd = weight({Sd, Sd * Hd}, 24, 1.0f / 16);
      const std::string what = std::to_string(n) + " tokens, " + std::to_string(Sd) + "x" + std::to_string(Hd) +
                               ", rank " + std::to_string(Rd);
      for (bool with_inject : {true, false}) {
        const HcWeights hcd{nd.c, dd.c, ud.c, with_inject ? jd.c : Tensor()};
        const HcWeights hgd{nd.g, dd.g, ud.g, with_inject ? jd.g : Tensor()};
        Pair ux = empty({n, Hd}), ix = empty({n, Sd});
        cpu()->hc_read(Xd.c, hcd, 1e-6, ux.c, with_inject ? ix.c : Tensor());
        gpu()->hc_read(Xd.g, hgd, 1e-6, ux.g, with_inject ? ix.g : Tensor());
        expect_close(ux, kF32, kF32, "hc_read u (decode, " + what + ")");
        if (with_inject) expect_close(ix, kF32, kF32, "hc_read inject weights (decode, " + what + ")");
      }
    }
  }
}

// Conv and delta rule over a 70-token chunk (GDN's 32/64-token chunk boundaries), then 3 decode steps, from the
// zero state: outputs and carried states.
TEST_P(CudaOps, GatedDeltaNet) {
  const GdnDims d{2, 4, 128, 128};
  const int64_t C = d.conv_dim(), nv = d.num_v_heads, K = 4, T = 70;
  Pair conv_w = weight({C, K}, 20, 0.3f), conv_state = zeros({K - 1, C}), rec = zeros({nv, d.k_head_dim, d.v_head_dim});
  Pair a_log = weight({nv}, 21, 0.5f), dt_bias = weight({nv}, 22, 0.5f), norm = weight({d.v_head_dim}, 23, 0.2f);
  const GdnWeights wc{a_log.c, dt_bias.c}, wg{a_log.g, dt_bias.g};
  uint32_t seed = 100;
  for (int64_t n : {T, int64_t(1), int64_t(1), int64_t(1)}) {
    seed += 10;
    Pair qkv = act({n, C}, seed), a = act({n, nv}, seed + 1), b = act({n, nv}, seed + 2),
         z = act({n, nv * 128}, seed + 3);
    cpu()->gdn_conv(qkv.c, conv_w.c, conv_state.c);
    gpu()->gdn_conv(qkv.g, conv_w.g, conv_state.g);
    expect_close(qkv, kF32, kF32, "gdn_conv T=" + std::to_string(n));
    expect_close(conv_state, 0, 0, "gdn_conv state");
    Pair o = empty({n, nv * d.v_head_dim});
    if (n > 1) {
      cpu()->gdn_chunked(qkv.c, a.c, b.c, wc, d, rec.c, o.c);
      gpu()->gdn_chunked(qkv.g, a.g, b.g, wg, d, rec.g, o.g);
    } else {
      cpu()->gdn_recurrent(qkv.c, a.c, b.c, wc, d, rec.c, o.c);
      gpu()->gdn_recurrent(qkv.g, a.g, b.g, wg, d, rec.g, o.g);
    }
    expect_close(o, kF32, 1e-3, n > 1 ? "gdn_chunked output" : "gdn_recurrent output");
    expect_close(rec, kF32, 1e-3, "gdn recurrent state");
    cpu()->gated_rms_norm(o.c, z.c, norm.c, 1e-6, GateAct::Silu, o.c);
    gpu()->gated_rms_norm(o.g, z.g, norm.g, 1e-6, GateAct::Silu, o.g);
    expect_close(o, kF32, 1e-3, "gated_rms_norm in place");
  }
}

// Sorted non-negative entries of each row: the selected token set.
std::vector<std::vector<int32_t>> selection_sets(Ops& ops, const Tensor& sel) {
  const auto v = host_as<int32_t>(ops, sel);
  const int64_t T = sel.dim(0), W = sel.dim(1);
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < W; ++j)
      if (v[size_t(t * W + j)] >= 0) out[size_t(t)].push_back(v[size_t(t * W + j)]);
    std::sort(out[size_t(t)].begin(), out[size_t(t)].end());
  }
  return out;
}

// Released QSA geometry in miniature: head dim 256 (rotary 64), 8 query heads over 2 KV heads, indexer 2 x 128,
// budget 16 tokens in blocks of 4 — a 60-token prefill, then a decode step; most queries need a real top-k.
TEST_P(CudaOps, QsaAttention) {
  const int64_t nh = 8, nkv = 2, D = 256, ni = 2, Di = 128, budget = 16, block = 4, width = budget + block - 1;
  const RopeParams rope{64, 10000000.0};
  const int64_t total = 61;
  Pair qn = weight({D}, 30, 0.2f), kn = weight({D}, 31, 0.2f), iqn = weight({Di}, 32, 0.2f),
       ikn = weight({Di}, 33, 0.2f);
  Pair keys = act({total, Di}, 34), kc = empty({total, nkv, D}), vc = act({total, nkv, D}, 35);
  int64_t pos0 = 0;
  for (int64_t T : {int64_t(60), int64_t(1)}) {
    Pair qg = act({T, nh * 2 * D}, uint32_t(36 + T)), k = act({T, nkv * D}, uint32_t(37 + T));
    Pair q = empty({T, nh * D}), gate = empty({T, nh * D});
    cpu()->qsa_prepare_qk(qg.c, k.c, qn.c, kn.c, 1e-6, rope, pos0, q.c, gate.c);
    gpu()->qsa_prepare_qk(qg.g, k.g, qn.g, kn.g, 1e-6, rope, pos0, q.g, gate.g);
    expect_close(q, kF32, kF32, "qsa_prepare_qk q");
    expect_close(gate, 0, 0, "qsa_prepare_qk gate");
    expect_close(k, kF32, kF32, "qsa_prepare_qk k");
    cpu()->copy_rows(k.c.view({T, nkv, D}), 0, kc.c, pos0, T);
    gpu()->copy_rows(k.g.view({T, nkv, D}), 0, kc.g, pos0, T);
    Pair qi = act({T, ni * Di}, uint32_t(38 + T)), sel = empty({T, width}, DType::I32);
    const Tensor keys_c = keys.c.rows(0, pos0 + T), keys_g = keys.g.rows(0, pos0 + T);
    cpu()->qsa_indexer_select(qi.c, keys_c, iqn.c, ikn.c, 1e-6, rope, pos0, budget, block, sel.c);
    gpu()->qsa_indexer_select(qi.g, keys_g, iqn.g, ikn.g, 1e-6, rope, pos0, budget, block, sel.g);
    const auto sc = selection_sets(*cpu(), sel.c), sg = selection_sets(*gpu(), sel.g);
    for (int64_t t = 0; t < T; ++t)
      EXPECT_EQ(sg[size_t(t)], sc[size_t(t)]) << "selected tokens of position " << pos0 + t;
    // Attention over the CPU's selection on both (identical inputs).
    const auto sel_host = host_as<int32_t>(*cpu(), sel.c);
    Tensor sel_g = gpu()->upload(sel_host.data(), DType::I32, {T, width});
    Pair out = empty({T, nh, D});
    const double scale = 1.0 / std::sqrt(double(D));
    cpu()->sparse_attention(q.c.view({T, nh, D}), kc.c.rows(0, pos0 + T), vc.c.rows(0, pos0 + T), sel.c,
                            gate.c.view({T, nh, D}), scale, out.c);
    gpu()->sparse_attention(q.g.view({T, nh, D}), kc.g.rows(0, pos0 + T), vc.g.rows(0, pos0 + T), sel_g,
                            gate.g.view({T, nh, D}), scale, out.g);
    expect_close(out, kF32, 1e-3, "sparse_attention T=" + std::to_string(T));
    pos0 += T;
  }
}

// The batched indexer over paged raw keys (CUDA: a pooled-key cache written as blocks complete, scores from it, the
// host top-k only where a query has more blocks than the budget) against the CPU's per-sequence recomputation: 3
// sequences over 5 steps (prefill chunks, decodes, contexts up to 41 positions = 10 blocks for a budget of 4), KV
// blocks of 8 positions handed out in a scrambled order.
TEST_P(CudaOps, QsaIndexerBatchOverPagedKeys) {
  const int64_t ni = 2, Di = 128, budget = 16, block = 4, width = budget + block - 1, page = 8, num_blocks = 24;
  const RopeParams rope{64, 10000000.0};
  Pair iqn = weight({Di}, 80, 0.2f), ikn = weight({Di}, 81, 0.2f);
  Pair key_pool = zeros({num_blocks * page, Di}), pooled = zeros({num_blocks * page / block, Di});
  std::vector<int32_t> free_blocks;
  for (int32_t b = 0; b < num_blocks; ++b) free_blocks.push_back(int32_t((b * 7 + 5) % num_blocks));
  std::vector<std::vector<int32_t>> tables(3);
  std::vector<int64_t> length(3, 0);
  uint32_t seed = 800;
  // The first step stays within the budget (no top-k at all), the later ones need it.
  for (const std::vector<int64_t>& tokens :
       {std::vector<int64_t>{3, 2, 1}, std::vector<int64_t>{20, 7, 1}, std::vector<int64_t>{1, 1, 1},
        std::vector<int64_t>{5, 1, 7}, std::vector<int64_t>{1, 30, 1}}) {
    std::vector<StepSequence> seqs;
    for (size_t q = 0; q < 3; ++q) {
      while (int64_t(tables[q].size()) * page < length[q] + tokens[q]) {
        tables[q].push_back(free_blocks.back());
        free_blocks.pop_back();
      }
      seqs.push_back({tokens[q], length[q], int32_t(q), tables[q]});
    }
    const StepBatch bc = make_step_batch(*cpu(), seqs, page), bg = make_step_batch(*gpu(), seqs, page);
    const int64_t T = bc.num_tokens;
    Pair ki = act({T, Di}, ++seed), qi = act({T, ni * Di}, ++seed), sel = empty({T, width}, DType::I32);
    cpu()->scatter_rows(ki.c, bc.slot_mapping, key_pool.c);
    gpu()->scatter_rows(ki.g, bg.slot_mapping, key_pool.g);
    cpu()->qsa_indexer_select_batch(qi.c, key_pool.c, pooled.c, iqn.c, ikn.c, 1e-6, rope, budget, block, bc, sel.c);
    gpu()->qsa_indexer_select_batch(qi.g, key_pool.g, pooled.g, iqn.g, ikn.g, 1e-6, rope, budget, block, bg, sel.g);
    const auto sc = selection_sets(*cpu(), sel.c), sg = selection_sets(*gpu(), sel.g);
    for (int64_t t = 0; t < T; ++t) EXPECT_EQ(sg[size_t(t)], sc[size_t(t)]) << "selected tokens of row " << t;
    for (size_t q = 0; q < 3; ++q) length[q] += tokens[q];
  }
  EXPECT_EQ(length[1], 41);
}

// The GPU top-k's tie handling: queries whose scores are all exactly zero (zero index queries) tie across the k-th
// score and take torch's own selection (nth_element for 4 of up to 10 blocks; heap selection, k * 64 <= n, for 4 of
// 275 blocks at 1,100 positions); every other row of random queries takes the radix-select path. The same sets as
// the CPU oracle's std algorithms.
TEST_P(CudaOps, QsaIndexerTopKTiesMatchTorch) {
  const int64_t ni = 2, Di = 64, budget = 16, block = 4, width = budget + block - 1, page = 8;
  const int64_t T = 1100, num_blocks = T / page + 1;
  const RopeParams rope{32, 10000.0};
  Pair iqn = weight({Di}, 90, 0.2f), ikn = weight({Di}, 91, 0.2f);
  Pair key_pool = zeros({num_blocks * page, Di}), pooled = zeros({num_blocks * page / block, Di});
  std::vector<int32_t> table;
  for (int64_t b = 0; b < num_blocks; ++b) table.push_back(int32_t((b * 5 + 3) % num_blocks));
  const std::vector<StepSequence> seqs{{T, 0, 0, table}};
  const StepBatch bc = make_step_batch(*cpu(), seqs, page), bg = make_step_batch(*gpu(), seqs, page);
  std::vector<float> q = normal(size_t(T * ni * Di), 92, 1.0f, false);
  for (int64_t t = 0; t < T; t += 3)  // every third query zero: all its scores 0
    std::fill(q.begin() + t * ni * Di, q.begin() + (t + 1) * ni * Di, 0.f);
  Pair qi{cpu()->upload(q.data(), DType::F32, {T, ni * Di}), gpu()->upload(q.data(), DType::F32, {T, ni * Di})};
  Pair ki = act({T, Di}, 93), sel = empty({T, width}, DType::I32);
  cpu()->scatter_rows(ki.c, bc.slot_mapping, key_pool.c);
  gpu()->scatter_rows(ki.g, bg.slot_mapping, key_pool.g);
  cpu()->qsa_indexer_select_batch(qi.c, key_pool.c, pooled.c, iqn.c, ikn.c, 1e-6, rope, budget, block, bc, sel.c);
  gpu()->qsa_indexer_select_batch(qi.g, key_pool.g, pooled.g, iqn.g, ikn.g, 1e-6, rope, budget, block, bg, sel.g);
  const auto sc = selection_sets(*cpu(), sel.c), sg = selection_sets(*gpu(), sel.g);
  int64_t differ = 0;
  for (int64_t t = 0; t < T; ++t) differ += sg[size_t(t)] != sc[size_t(t)];
  EXPECT_EQ(differ, 0) << "rows whose selected tokens differ from torch.topk's";
  // The zero rows past the budget really are ties: torch does not keep the first blocks.
  bool not_first = false;
  for (int64_t t = 3 * 100; t < T; t += 3) {
    std::vector<int32_t> first;
    for (int64_t j = 0; j < budget; ++j) first.push_back(int32_t(j));
    std::vector<int32_t> blocks(sc[size_t(t)].begin(), sc[size_t(t)].begin() + budget);
    not_first = not_first || blocks != first;
  }
  EXPECT_TRUE(not_first) << "the tie rows chose the lowest indices: the test does not exercise torch's tie order";
}

TEST_P(CudaOps, Moe) {
  const int64_t T = 33, H = 256, E = 16, k = 4, I = 64, Is = 96;
  Pair u = act({T, H}, 40), router = weight({E, H}, 41, 1.0f / 16);
  Pair ids = empty({T, k}, DType::I32), wts = empty({T, k});
  cpu()->moe_router_topk(u.c, router.c, true, ids.c, wts.c);
  gpu()->moe_router_topk(u.g, router.g, true, ids.g, wts.g);
  const auto ic = host_as<int32_t>(*cpu(), ids.c), ig = host_as<int32_t>(*gpu(), ids.g);
  EXPECT_EQ(ig, ic) << "router top-k ids (sorted by probability)";
  expect_close(wts, kF32, kF32, "router weights");
  MoeWeights wc, wg;
  Pair gate = weight({E, I, H}, 42, 1.0f / 16), up = weight({E, I, H}, 43, 1.0f / 16),
       down = weight({E, H, I}, 44, 0.125f);
  Pair sg = weight({Is, H}, 45, 1.0f / 16), su = weight({Is, H}, 46, 1.0f / 16), sd = weight({H, Is}, 47, 0.1f);
  Pair seg = weight({1, H}, 48, 1.0f / 16);
  wc.gate = gate.c, wc.up = up.c, wc.down = down.c, wc.shared_gate_proj = sg.c, wc.shared_up_proj = su.c;
  wc.shared_down_proj = sd.c, wc.shared_expert_gate = seg.c;
  wg.gate = gate.g, wg.up = up.g, wg.down = down.g, wg.shared_gate_proj = sg.g, wg.shared_up_proj = su.g;
  wg.shared_down_proj = sd.g, wg.shared_expert_gate = seg.g;
  // Experts on the CPU's routing (identical ids and weights on both).
  Tensor ids_g = gpu()->upload(ic.data(), DType::I32, {T, k});
  const auto wh = host(*cpu(), wts.c);
  Tensor wts_g = gpu()->upload(wh.data(), DType::F32, {T, k});
  Pair out = empty({T, H});
  cpu()->moe_experts(u.c, ids.c, wts.c, wc, out.c);
  gpu()->moe_experts(u.g, ids_g, wts_g, wg, out.g);
  expect_close(out, prod_atol(1e-2), 2 * prod_rtol(), "moe_experts");
  cpu()->moe_shared_expert(u.c, wc, out.c);
  gpu()->moe_shared_expert(u.g, wg, out.g);
  expect_close(out, prod_atol(1e-2), 2 * prod_rtol(), "moe_experts + shared expert");
}

// PLE with both table placements: gather from two BF16 shards, gate, then the dilated conv over a 9-token chunk
// and two decode steps (state carry).
TEST_P(CudaOps, Ple) {
  const int64_t S = 4, H = 128, heads = 4, hd = 16, rows = 90, K = 4, dil = 3;
  std::vector<uint16_t> table(size_t(rows * hd));
  {
    const auto v = normal(table.size(), 50, 1.0f, false);
    for (size_t i = 0; i < v.size(); ++i) {
      uint32_t u;
      std::memcpy(&u, &v[i], 4);
      table[i] = uint16_t(u >> 16);
    }
  }
  auto keep = std::make_shared<int>(0);
  PleTable tc, tg_host, tg_dev;
  auto gpu_dev = make_cuda_ops(0, CudaOpsOptions{PleTablePlacement::Device});
  for (int64_t s0 : {int64_t(0), int64_t(50)}) {  // shards of 50 and 40 rows
    const int64_t n = std::min<int64_t>(50, rows - s0);
    const uint16_t* p = table.data() + s0 * hd;
    tc.shards.push_back(cpu()->map_host_table(p, DType::BF16, {n, hd}, keep));
    tg_host.shards.push_back(gpu()->map_host_table(p, DType::BF16, {n, hd}, keep));
    tg_dev.shards.push_back(gpu_dev->map_host_table(p, DType::BF16, {n, hd}, keep));
  }
  for (PleTable* t : {&tc, &tg_host, &tg_dev}) t->rows = rows, t->head_dim = hd;
  Pair norm_query = weight({S * H}, 51, 0.2f), norm_conv = weight({S * H}, 52, 0.2f),
       conv = weight({S * H, K}, 53, 0.3f);
  Pair state = zeros({(K - 1) * dil, S * H}), X = act({12, S * H}, 54, 2.0f);
  int64_t t0 = 0;
  for (int64_t T : {int64_t(9), int64_t(1), int64_t(1)}) {
    std::vector<int64_t> r(size_t(T * heads));
    for (size_t i = 0; i < r.size(); ++i) r[i] = int64_t((i * 37 + size_t(t0) * 11) % size_t(rows));
    Pair rr = ints(r, {T, heads}), e = empty({T, heads * hd});
    Tensor e_dev = gpu_dev->empty({T, heads * hd});
    cpu()->ple_gather(tc, rr.c, e.c);
    gpu()->ple_gather(tg_host, rr.g, e.g);
    gpu_dev->ple_gather(tg_dev, gpu_dev->upload(r.data(), DType::I64, {T, heads}), e_dev);
    expect_close(e, 0, 0, "ple_gather (pinned host table)");
    EXPECT_EQ(host(*gpu_dev, e_dev), host(*cpu(), e.c)) << "ple_gather (table on the GPU)";
    Pair kn = act({T, S * H}, uint32_t(55 + T + t0)), v = act({T, H}, uint32_t(56 + T + t0)), P = empty({T, S * H});
    const Pair Xt{X.c.rows(t0, t0 + T), X.g.rows(t0, t0 + T)};
    cpu()->ple_gate(kn.c, v.c, Xt.c, norm_query.c, 1e-6, P.c);
    gpu()->ple_gate(kn.g, v.g, Xt.g, norm_query.g, 1e-6, P.g);
    expect_close(P, kF32, kF32, "ple_gate");
    cpu()->ple_conv_add(P.c, norm_conv.c, H, conv.c, dil, 1e-6, state.c, Xt.c);
    gpu()->ple_conv_add(P.g, norm_conv.g, H, conv.g, dil, 1e-6, state.g, Xt.g);
    expect_close(Xt, kF32, kF32, "ple_conv_add");
    expect_close(state, kF32, kF32, "ple conv state");
    t0 += T;
  }
}

// The random weights of Model::random (bench): the CUDA backend's FP16 values are the CPU's float32 values rounded
// once (ops/random_uniform.h on both sides); a host table filled through HostTable::host is what ple_gather reads;
// random W4A16 experts give finite outputs of about unit variance for unit-variance inputs (variance 1/in weights).
TEST_P(CudaOps, RandomWeightsAndHostTables) {
  const Shape shape{37, 129};
  const Tensor c = cpu()->random_weight(shape, -0.75f, 1.25f, 42), g = gpu()->random_weight(shape, -0.75f, 1.25f, 42);
  ASSERT_EQ(g.dtype(), DType::F16);
  const std::vector<float> cv = host(*cpu(), c);
  const std::vector<uint16_t> gv = host_as<uint16_t>(*gpu(), g);
  size_t differ = 0;
  for (size_t i = 0; i < cv.size(); ++i) {
    EXPECT_GE(cv[i], -0.75f);
    EXPECT_LT(cv[i], 1.25f);
    __half h = __float2half_rn(cv[i]);
    uint16_t bits;
    std::memcpy(&bits, &h, 2);
    differ += bits != gv[i];
  }
  EXPECT_EQ(differ, 0u) << "FP16 random weights that are not the CPU's values rounded";
  EXPECT_NE(host(*cpu(), cpu()->random_weight(shape, -0.75f, 1.25f, 43)), cv) << "the seed is ignored";

  // A host table written after it was made, gathered on the GPU as on the CPU.
  const int64_t rows = 40, hd = 16, heads = 3, T = 5;
  HostTable hg = gpu()->host_table(DType::F8_E4M3, {rows, hd}), hc = cpu()->host_table(DType::F8_E4M3, {rows, hd});
  for (int64_t i = 0; i < rows * hd; ++i) {
    const uint8_t byte = uint8_t(0x30 | (i * 7 % 16) | (i % 3 == 0 ? 0x80 : 0));
    static_cast<uint8_t*>(hg.host)[i] = byte;
    static_cast<uint8_t*>(hc.host)[i] = byte;
  }
  PleTable tc, tg;
  tc.shards = {hc.table};
  tg.shards = {hg.table};
  for (PleTable* t : {&tc, &tg}) t->rows = rows, t->head_dim = hd, t->scale = 0.5f;
  std::vector<int64_t> r(size_t(T * heads));
  for (size_t i = 0; i < r.size(); ++i) r[i] = int64_t((i * 13 + 5) % size_t(rows));
  Pair rr = ints(r, {T, heads}), e = empty({T, heads * hd});
  cpu()->ple_gather(tc, rr.c, e.c);
  gpu()->ple_gather(tg, rr.g, e.g);
  expect_close(e, 0, 0, "ple_gather from a host table");

  // Random W4A16 experts (NVFP4 layout): route 64 unit-variance tokens, top-2 of 8 experts with weights 1/2.
  const int64_t E = 8, I = 64, H = 128, tokens = 64, k = 2;
  const RoutedExperts re = gpu()->random_experts(E, I, H, 7);
  ASSERT_TRUE(re.packed) << "the CUDA backend makes W4A16 experts";
  EXPECT_EQ(re.packed->device_bytes(), E * int64_t((2 * I) * (H / 2 + H / 16 * 2 + 4) + H * (I / 2 + I / 16 * 2 + 4)));
  MoeWeights mw;
  mw.packed = re.packed;
  std::vector<int32_t> ids(size_t(tokens * k));
  std::vector<float> wts(size_t(tokens * k), 0.5f);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 3 + i / 2) % size_t(E));
  const auto u = normal(size_t(tokens * H), 9, 1.0f, false);
  Tensor out = gpu()->empty({tokens, H});
  gpu()->moe_experts(gpu()->upload(u.data(), DType::F32, {tokens, H}), gpu()->upload(ids.data(), DType::I32, {tokens, k}),
                     gpu()->upload(wts.data(), DType::F32, {tokens, k}), mw, out);
  const std::vector<float> o = host(*gpu(), out);
  double ss = 0;
  for (float x : o) {
    ASSERT_TRUE(std::isfinite(x));
    ss += double(x) * x;
  }
  // down(silu(gate) * up) of unit-variance inputs: E[silu(g) u]^2 ~ 0.36 per product, then two experts at 1/2: the
  // output variance is about 0.36 / 2; a wrong global scale would be off by orders of magnitude.
  const double var = ss / double(o.size());
  EXPECT_GT(var, 0.05);
  EXPECT_LT(var, 0.6);
}

// Batched decode over state slots (the CUDA backend's one-launch paths for a step of one token per sequence) against
// the CPU's per-sequence loop: 5 sequences in scrambled slots of a 7-slot pool with non-zero state, odd widths; then
// a mixed step (a prefill chunk among decodes, the per-sequence path on both). Also qsa_prepare_qk_batch at
// scattered positions and the PLE gather begun ahead (ple_gather_start / ple_gather_wait).
TEST_P(CudaOps, BatchedStepsOverStateSlots) {
  const GdnDims d{1, 3, 32, 24};
  const int64_t C = d.conv_dim(), nv = d.num_v_heads, K = 4, slots = 7, S = 4, H = 40, dil = 3;
  const std::vector<int32_t> slot_of = {3, 0, 6, 2, 5};
  const std::vector<int64_t> pos = {5, 0, 17, 3, 100};
  std::vector<std::vector<int32_t>> tables(slot_of.size());
  for (size_t i = 0; i < tables.size(); ++i)  // 7 blocks of 16 cover position 111; distinct per sequence
    for (int32_t b = 0; b < 7; ++b) tables[i].push_back(int32_t(i * 7) + b);
  auto step = [&](Ops& ops, const std::vector<int64_t>& tokens) {
    std::vector<StepSequence> seqs;
    for (size_t i = 0; i < slot_of.size(); ++i) seqs.push_back({tokens[i], pos[i], slot_of[i], tables[i]});
    return make_step_batch(ops, seqs, 16);
  };
  Pair conv_w = weight({C, K}, 60, 0.3f), a_log = weight({nv}, 61, 0.5f), dt_bias = weight({nv}, 62, 0.5f);
  Pair conv_pool = act({slots, K - 1, C}, 63), rec_pool = act({slots, nv, d.k_head_dim, d.v_head_dim}, 64, 0.1f);
  Pair ple_w = weight({S * H, K}, 65, 0.3f), ple_norm = weight({S * H}, 66, 0.2f);
  Pair ple_pool = act({slots, (K - 1) * dil, S * H}, 67);
  const GdnWeights wc{a_log.c, dt_bias.c}, wg{a_log.g, dt_bias.g};
  uint32_t seed = 700;
  for (const std::vector<int64_t>& tokens :
       {std::vector<int64_t>{1, 1, 1, 1, 1}, std::vector<int64_t>{1, 6, 1, 1, 1}}) {
    const std::string what = tokens[1] == 1 ? " (decode step)" : " (mixed step)";
    const StepBatch bc = step(*cpu(), tokens), bg = step(*gpu(), tokens);
    const int64_t T = bc.num_tokens;
    Pair qkv = act({T, C}, ++seed), a = act({T, nv}, ++seed), b = act({T, nv}, ++seed), o = empty({T, nv * 24});
    cpu()->gdn_conv_batch(qkv.c, conv_w.c, conv_pool.c, bc);
    gpu()->gdn_conv_batch(qkv.g, conv_w.g, conv_pool.g, bg);
    expect_close(qkv, kF32, kF32, "gdn_conv_batch" + what);
    expect_close(conv_pool, 0, 0, "gdn_conv_batch state pool" + what);
    cpu()->gdn_rule_batch(qkv.c, a.c, b.c, wc, d, rec_pool.c, bc, o.c);
    gpu()->gdn_rule_batch(qkv.g, a.g, b.g, wg, d, rec_pool.g, bg, o.g);
    expect_close(o, kF32, 1e-3, "gdn_rule_batch output" + what);
    expect_close(rec_pool, kF32, 1e-3, "gdn_rule_batch state pool" + what);
    Pair P = act({T, S * H}, ++seed), X = act({T, S * H}, ++seed);
    cpu()->ple_conv_add_batch(P.c, ple_norm.c, H, ple_w.c, dil, 1e-6, ple_pool.c, bc, X.c);
    gpu()->ple_conv_add_batch(P.g, ple_norm.g, H, ple_w.g, dil, 1e-6, ple_pool.g, bg, X.g);
    expect_close(X, kF32, kF32, "ple_conv_add_batch" + what);
    expect_close(ple_pool, kF32, kF32, "ple_conv_add_batch state pool" + what);
    // Query/key preparation at each token's own position (head dim 24, rotary 8, 3 query heads, 1 KV head).
    Pair qg = act({T, 3 * 48}, ++seed), k = act({T, 24}, ++seed), qn = weight({24}, ++seed, 0.2f),
         kn = weight({24}, ++seed, 0.2f), q = empty({T, 72}), gate = empty({T, 72});
    cpu()->qsa_prepare_qk_batch(qg.c, k.c, qn.c, kn.c, 1e-6, RopeParams{8, 10000.0}, bc, q.c, gate.c);
    gpu()->qsa_prepare_qk_batch(qg.g, k.g, qn.g, kn.g, 1e-6, RopeParams{8, 10000.0}, bg, q.g, gate.g);
    expect_close(q, kF32, kF32, "qsa_prepare_qk_batch q" + what);
    expect_close(k, kF32, kF32, "qsa_prepare_qk_batch k" + what);
    expect_close(gate, 0, 0, "qsa_prepare_qk_batch gate" + what);
  }
  // A PLE gather begun ahead equals the plain gather, also with work enqueued in between.
  const int64_t rows = 50, hd = 8, heads = 3, T = 5;
  std::vector<uint16_t> table(size_t(rows * hd));
  for (size_t i = 0; i < table.size(); ++i) table[i] = __half_as_ushort(__float2half(float(i % 97) / 97.0f - 0.5f));
  auto keep = std::make_shared<int>(0);
  PleTable tc, tg;
  tc.shards.push_back(cpu()->map_host_table(table.data(), DType::F16, {rows, hd}, keep));
  tg.shards.push_back(gpu()->map_host_table(table.data(), DType::F16, {rows, hd}, keep));
  tc.rows = tg.rows = rows;
  tc.head_dim = tg.head_dim = hd;
  std::vector<int64_t> r(size_t(T * heads));
  for (size_t i = 0; i < r.size(); ++i) r[i] = int64_t((i * 17 + 3) % size_t(rows));
  Pair e = empty({T, heads * hd});
  cpu()->ple_gather(tc, cpu()->upload(r.data(), DType::I64, {T, heads}), e.c);
  gpu()->ple_gather_start(tg, gpu()->upload(r.data(), DType::I64, {T, heads}), e.g);
  Pair busy = act({64, 64}, ++seed), busy_out = empty({64, 64}), busy_w = weight({64, 64}, ++seed);
  gpu()->linear(busy.g, busy_w.g, busy_out.g);
  gpu()->ple_gather_wait(e.g);
  expect_close(e, 0, 0, "ple_gather_start + ple_gather_wait");
  EXPECT_THROW(gpu()->ple_gather_wait(e.g), Error);  // nothing pending any more
}

// Sampling on the device through the ops interface: greedy rows are the argmax (lowest id on ties), top-k 1 too,
// and a draw is a function of (seed, offset); the CPU backend says it samples on the host.
TEST_P(CudaOps, SampleTokens) {
  const int64_t rows = 6, V = 1000;
  std::vector<float> l = normal(size_t(rows * V), 90, 2.0f, false);
  l[size_t(2 * V + 17)] = l[size_t(2 * V + 400)] = 100.f;  // a tie in row 2: the lower id wins
  std::copy_n(l.begin() + 4 * V, V, l.begin() + 5 * V);    // rows 4 and 5: the same logits and draw
  const Tensor logits = gpu()->upload(l.data(), DType::F32, {rows, V});
  std::vector<TokenSampling> p(static_cast<size_t>(rows));
  p[3].temperature = 0.8f;
  p[3].top_k = 1;
  p[4].temperature = 1.f;
  p[4].seed = 5;
  p[4].offset = 9;
  p[5] = p[4];
  const auto a = gpu()->sample_tokens(logits, p), b = gpu()->sample_tokens(logits, p);
  for (int64_t r : {0, 1, 2, 3})
    EXPECT_EQ(a[size_t(r)], std::max_element(l.begin() + r * V, l.begin() + (r + 1) * V) - (l.begin() + r * V))
        << "row " << r;
  EXPECT_EQ(a[2], 17);
  EXPECT_EQ(a, b) << "the same seeds and offsets drew differently";
  EXPECT_EQ(a[4], a[5]);
  EXPECT_TRUE(gpu()->samples_on_device());
  EXPECT_FALSE(cpu()->samples_on_device());
  EXPECT_THROW(cpu()->sample_tokens(cpu()->upload(l.data(), DType::F32, {rows, V}), p), Error);
  EXPECT_THROW(gpu()->sample_tokens(logits, std::span<const TokenSampling>(p.data(), 2)), Error);
}

// Bad input: a mismatched dtype is an Error naming the op; an out-of-vocabulary id is reported by the next download.
TEST_P(CudaOps, BadInputIsAnError) {
  Tensor x = gpu()->zeros({2, 8}), w32 = gpu()->zeros({4, 8}), y = gpu()->zeros({2, 4});
  try {
    gpu()->linear(x, w32, y);
    ADD_FAILURE() << "an F32 weight was accepted by linear";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear: weight"), std::string::npos) << e.what();
  }
  const std::vector<float> tv(16, 1.0f);
  Tensor table = gpu()->load_weight(tv.data(), DType::F32, {2, 8});
  const std::vector<int32_t> bad = {1, 7};
  Tensor out = gpu()->empty({2, 8});
  gpu()->embedding(table, gpu()->upload(bad.data(), DType::I32, {2}), out);
  std::vector<float> h(16);
  try {
    gpu()->download(out, h.data());
    ADD_FAILURE() << "token id 7 of a 2-row table was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token ids outside the vocabulary"), std::string::npos) << e.what();
  }
  gpu()->download(out, h.data());  // reported once, then clear
}

INSTANTIATE_TEST_SUITE_P(Activations, CudaOps,
                         ::testing::Values(ActivationPrecision::Fp16x2, ActivationPrecision::Fp16),
                         [](const ::testing::TestParamInfo<ActivationPrecision>& i) {
                           return std::string(i.param == ActivationPrecision::Fp16x2 ? "Fp16x2" : "Fp16");
                         });

}  // namespace
}  // namespace flashnext
