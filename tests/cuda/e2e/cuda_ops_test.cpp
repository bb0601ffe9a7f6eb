// What the CUDA backend (make_cuda_ops) does beyond the op values, which the op-case registry (tests/ops, run
// with FLASHNEXT_TEST_BACKEND=cuda) compares with the CPU oracle: FP16 weight conversion and its range error, the
// random weights and host tables of `flashnext bench`, device sampling, bad input reported by the kernels (sparse
// attention's selections included), and the gated delta rule's few-row steps equal to decode steps bit for bit.
#include "ops/cuda/cuda_ops.h"

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "ops/cuda/qsa_kernels.h"
#include "ops/ops.h"
#include "ops/step_batch.h"

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

Pair empty(const Shape& s, DType dt = DType::F32) {
  return {cpu()->empty(s, dt), gpu()->empty(s, dt)};
}
template <class T>
Pair ints(const std::vector<T>& v, const Shape& s) {
  const DType dt = sizeof(T) == 4 ? DType::I32 : DType::I64;
  return {cpu()->upload(v.data(), dt, s), gpu()->upload(v.data(), dt, s)};
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

class CudaOps : public ::testing::TestWithParam<ActivationPrecision> {
 protected:
  void SetUp() override { g_mode = GetParam(); }
};

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
  gpu()->moe_experts(gpu()->upload(u.data(), DType::F32, {tokens, H}),
                     gpu()->upload(ids.data(), DType::I32, {tokens, k}),
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

// A GDN layer's state ops (the causal conv, then the gated delta rule, then its output norm) in a step whose sequences
// feed a few rows each (a speculative verify of 1 + K rows, its replay) walk each sequence's rows in order: the
// outputs and both states equal those of feeding the rows as decode steps, one row per step, bit for bit (what makes
// greedy speculative decoding on the GPU give the plain tokens exactly). Two sequences in slots 2 and 0 feed 4 and 9
// rows in one step, then the same rows one decode step at a time from the same states: through the ops one by one
// (conv, rule, norm), and through gdn_mix_batch (one launch with the conv and the norm folded in), which gives the
// same bits as the ops one by one.
TEST_P(CudaOps, GdnFewRowsEqualDecodeStepsBitForBit) {
  Ops& g = *gpu();
  // The released heads' shape at a small scale with K = 4; dv = 72 (three slices, the last partial) with K = 8; dk = 20
  // (fewer than a warp of q and k threads) with K = 1 (no conv state).
  for (const auto& [d, K] :
       {std::pair{GdnDims{2, 4, 128, 128}, int64_t(4)}, std::pair{GdnDims{1, 3, 40, 72}, int64_t(8)},
        std::pair{GdnDims{1, 3, 20, 24}, int64_t(1)}}) {
    SCOPED_TRACE(
        fmt::format("nk {} nv {} dk {} dv {} K {}", d.num_k_heads, d.num_v_heads, d.k_head_dim, d.v_head_dim, K));
    const int64_t nv = d.num_v_heads, C = d.conv_dim(), rows[2] = {4, 9}, T = rows[0] + rows[1];
    const int64_t ov = nv * d.v_head_dim;
    const std::vector<float> alog = normal(size_t(nv), 1, 0.5f, true), dtb = normal(size_t(nv), 2, 0.5f, true),
                             cw = normal(size_t(C * K), 7, 0.5f, true);
    const GdnWeights w{g.load_weight(alog.data(), DType::F32, {nv}), g.load_weight(dtb.data(), DType::F32, {nv})};
    const Tensor conv_w = g.load_weight(cw.data(), DType::F32, {C, K});
    const std::vector<float> qkv = normal(size_t(T * C), 3, 1.f, false), a = normal(size_t(T * nv), 4, 2.f, false),
                             b = normal(size_t(T * nv), 5, 2.f, false),
                             s0 = normal(size_t(3 * nv * d.k_head_dim * d.v_head_dim), 6, 0.1f, false),
                             c0 = normal(size_t(3 * (K - 1) * C), 8, 1.f, false),
                             z = normal(size_t(T * ov), 9, 2.f, false),
                             nw = normal(size_t(d.v_head_dim), 10, 0.5f, true);
    const Tensor norm_w = g.load_weight(nw.data(), DType::F32, {d.v_head_dim});
    const std::vector<int32_t> tables[2] = {{0}, {1}};  // one KV block each (a step's sequences write their own)
    const int32_t slots[2] = {2, 0};
    const int64_t starts[2] = {0, rows[0]}, pos0[2] = {7, 0};
    struct Run {
      Tensor state, conv;
      std::vector<float> o;
    };
    const auto fresh = [&] {
      return Run{g.upload(s0.data(), DType::F32, {3, nv, d.k_head_dim, d.v_head_dim}),
                 g.upload(c0.data(), DType::F32, {3, K - 1, C}), std::vector<float>(size_t(T * ov))};
    };
    // Rows `src` of the inputs fed as one step of `seqs`; their outputs written to the same rows of run.o.
    const auto feed = [&](Run& run, const std::vector<StepSequence>& seqs, const std::vector<int64_t>& src, bool mix) {
      const int64_t n = int64_t(src.size());
      std::vector<float> q1, a1, b1, z1;
      for (int64_t r : src) {
        q1.insert(q1.end(), qkv.begin() + r * C, qkv.begin() + (r + 1) * C);
        a1.insert(a1.end(), a.begin() + r * nv, a.begin() + (r + 1) * nv);
        b1.insert(b1.end(), b.begin() + r * nv, b.begin() + (r + 1) * nv);
        z1.insert(z1.end(), z.begin() + r * ov, z.begin() + (r + 1) * ov);
      }
      const StepBatch batch = make_step_batch(g, seqs, 16);
      Tensor x = g.upload(q1.data(), DType::F32, {n, C}), o = g.empty({n, ov});
      const Tensor ta = g.upload(a1.data(), DType::F32, {n, nv}), tb = g.upload(b1.data(), DType::F32, {n, nv});
      const GdnOutputNorm norm{g.upload(z1.data(), DType::F32, {n, ov}), norm_w, 1e-6, GateAct::Sigmoid};
      if (mix) {
        g.gdn_mix_batch(x, conv_w, run.conv, ta, tb, w, d, run.state, batch, norm, o);
      } else {
        g.gdn_conv_batch(x, conv_w, run.conv, batch);
        g.gdn_rule_batch(x, ta, tb, w, d, run.state, batch, o);
        g.gated_rms_norm(o, norm.z, norm.weight, norm.eps, norm.act, o);
      }
      const std::vector<float> h = host(g, o);
      for (int64_t k = 0; k < n; ++k) std::copy_n(h.begin() + k * ov, ov, run.o.begin() + src[size_t(k)] * ov);
    };
    std::vector<int64_t> all(static_cast<size_t>(T));
    for (int64_t r = 0; r < T; ++r) all[size_t(r)] = r;
    Run first;  // the ops one by one in one step: what every other run must equal
    for (const bool mix : {false, true}) {
      SCOPED_TRACE(mix ? "gdn_mix_batch" : "the ops one by one");
      const CudaMemoryCounters before = cuda_memory_counters(g);
      Run step = fresh(), decode = fresh();
      feed(step, {{rows[0], pos0[0], slots[0], tables[0]}, {rows[1], pos0[1], slots[1], tables[1]}}, all, mix);
      for (int64_t i = 0; i < rows[1]; ++i) {  // both sequences while both have rows left, then the longer one alone
        std::vector<StepSequence> seqs;
        std::vector<int64_t> src;
        for (int s : {0, 1})
          if (i < rows[s]) {
            seqs.push_back({1, pos0[s] + i, slots[s], tables[s]});
            src.push_back(starts[s] + i);
          }
        feed(decode, seqs, src, mix);
      }
      // Every gdn_mix_batch launch here (a few blocks) folded its conv in: the step and the 9 decode steps.
      EXPECT_EQ(cuda_memory_counters(g).gdn_conv_folded - before.gdn_conv_folded, mix ? 1 + rows[1] : 0);
      EXPECT_EQ(cuda_memory_counters(g).gdn_conv_apart, before.gdn_conv_apart);
      if (!mix) first = step;
      for (const Run* r : {&decode, &step}) {
        EXPECT_EQ(0, std::memcmp(first.o.data(), r->o.data(), first.o.size() * sizeof(float))) << "outputs differ";
        for (const auto& [what, x, y] : {std::tuple{"recurrent state", &first.state, &r->state},
                                         std::tuple{"conv state", &first.conv, &r->conv}}) {
          const std::vector<float> hx = host(g, *x), hy = host(g, *y);
          EXPECT_EQ(0, std::memcmp(hx.data(), hy.data(), hx.size() * sizeof(float))) << what << " differs";
        }
      }
      EXPECT_NE(s0, host(g, step.state));  // the step moved the states of slots 2 and 0
      if (K > 1) {
        EXPECT_NE(c0, host(g, step.conv));
      }
    }
  }
}

// Sparse attention's kernels (per-query, and tile-union on SM80+: QsaAttentionKernel) skip a selected position after
// its query, which no indexer selects, and report it at the next synchronisation; every output is that of the
// selection without it, bit for bit. A 20-row prefill of one sequence (4 query heads, 1 KV head, head dim
// 64): query t selects positions 0 and t, query 5 also position 9.
TEST_P(CudaOps, SparseAttentionReportsAPositionAfterItsQuery) {
  constexpr int64_t T = 20, nh = 4, D = 64, W = 3;
  const std::vector<int32_t> table = {0, 1};
  const std::vector<float> qv = normal(size_t(T * nh * D), 11, 1.f, false), kv = normal(size_t(32 * D), 12, 1.f, false),
                           vv = normal(size_t(32 * D), 13, 1.f, false), gv = normal(size_t(T * nh * D), 14, 1.f, false);
  std::vector<int32_t> clean(size_t(T * W), -1);
  for (int64_t t = 0; t < T; ++t) {
    clean[size_t(t * W)] = 0;
    if (t > 0) clean[size_t(t * W + 1)] = int32_t(t);
  }
  std::vector<int32_t> bad = clean;
  bad[size_t(5 * W + 2)] = 9;
  for (QsaAttentionKernel kernel : {QsaAttentionKernel::PerQuery, QsaAttentionKernel::TileUnion}) {
    CudaOpsOptions o{PleTablePlacement::Host, GetParam()};
    o.qsa_attention = kernel;
    const std::shared_ptr<Ops> ops = make_cuda_ops(0, o);
    Ops& g = *ops;
    const StepSequence seq{T, 0, 0, table};
    const StepBatch batch = make_step_batch(g, {&seq, 1}, 16);
    const Tensor q = g.upload(qv.data(), DType::F32, {T, nh, D}), gate = g.upload(gv.data(), DType::F32, {T, nh, D});
    const Tensor k = g.upload(kv.data(), DType::F32, {32, 1, D}), v = g.upload(vv.data(), DType::F32, {32, 1, D});
    const auto run = [&](const std::vector<int32_t>& sel) {
      Tensor out = g.empty({T, nh, D});
      g.sparse_attention_batch(q, k, v, g.upload(sel.data(), DType::I32, {T, W}), gate, 1.0 / std::sqrt(double(D)),
                               batch, out);
      return out;
    };
    const std::vector<float> want = host(g, run(clean));
    const Tensor out = run(bad);
    std::vector<float> got(size_t(T * nh * D));
    const std::string name = kernel == QsaAttentionKernel::PerQuery ? "per-query" : "tile-union";
    try {
      g.download(out, got.data());
      ADD_FAILURE() << name << ": position 9 selected by the query at position 5 was not reported";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("sparse_attention: cache indices outside the cache"), std::string::npos)
          << name << ": " << e.what();
    }
    g.download(out, got.data());  // reported once, then clear
    for (int64_t t = 0; t < T; ++t)
      EXPECT_EQ(0, std::memcmp(want.data() + t * nh * D, got.data() + t * nh * D, sizeof(float) * nh * D))
          << name << ": query " << t;
  }
}

// The tile-union attention launched in batches of groups over one scratch (what sparse_attention_batch does when a
// step's groups would take more than its scratch bound) writes what one launch of every group writes, bit for bit:
// sequences of 37 and 20 rows (5 + 3 groups of 8), released head geometry, each query selecting random positions.
TEST(CudaQsaTileUnion, GroupBatchesEqualOneLaunch) {
  namespace detail = cuda::detail;
  const int64_t rows[2] = {37, 20}, pos0[2] = {50, 0}, T = rows[0] + rows[1], nh = 24, nkv = 2, D = 256, W = 40;
  const detail::QsaUnionPlan plan = [] {
    const std::shared_ptr<Ops> keep = gpu();  // the device current, the kernel's attributes known
    return detail::qsa_union_plan(24, 2, 256);
  }();
  if (cuda_device_info(0).major < 8) GTEST_SKIP() << "the tile-union kernel is SM80+ (mma.sync)";
  ASSERT_EQ(plan.qpc, 8) << "8 queries of 12 heads a block on an SM80+ GPU";
  Ops& g = *gpu();
  const std::vector<int32_t> tables[2] = {{0, 1, 2, 3, 4, 5}, {6, 7}};
  const StepSequence seqs[2] = {{rows[0], pos0[0], 0, tables[0]}, {rows[1], pos0[1], 1, tables[1]}};
  const StepBatch batch = make_step_batch(g, seqs, 16);
  const int64_t pool_rows = 8 * 16;
  const std::vector<float> qv = normal(size_t(T * nh * D), 21, 1.f, false),
                           kv = normal(size_t(pool_rows * nkv * D), 22, 1.f, false),
                           vv = normal(size_t(pool_rows * nkv * D), 23, 1.f, false),
                           gv = normal(size_t(T * nh * D), 24, 1.f, false);
  // Compact selections: query t at position p takes up to W distinct random positions of 0..p.
  std::vector<int32_t> sel(size_t(T * W), -1), counts(static_cast<size_t>(T));
  std::mt19937 rng(25);
  for (int s = 0, t = 0; s < 2; ++s)
    for (int64_t i = 0; i < rows[s]; ++i, ++t) {
      std::vector<int32_t> all(size_t(pos0[s] + i + 1));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      const size_t n = std::min<size_t>(all.size(), size_t(W));
      std::copy_n(all.begin(), n, sel.begin() + t * W);
      counts[size_t(t)] = int32_t(n);
    }
  const Tensor q = g.upload(qv.data(), DType::F32, {T, nh, D}), gate = g.upload(gv.data(), DType::F32, {T, nh, D});
  const Tensor k = g.upload(kv.data(), DType::F32, {pool_rows, nkv, D});
  const Tensor v = g.upload(vv.data(), DType::F32, {pool_rows, nkv, D});
  const Tensor sel_d = g.upload(sel.data(), DType::I32, {T, W}), counts_d = g.upload(counts.data(), DType::I32, {T});
  const int groups = 5 + 3;
  const int64_t words_ld = 128, list_ld = 8 * W;
  const Tensor words = g.zeros({groups * nkv, words_ld}, DType::I32),
               lists = g.zeros({groups * nkv, list_ld, 2}, DType::I32);
  const Tensor status = g.zeros({1}, DType::I32);
  std::vector<float> first;
  for (int batch_groups : {groups, 3, 1}) {
    const Tensor out = g.zeros({T, nh, D});
    std::vector<float> sync(1);
    g.download(g.zeros({1}), sync.data());  // the backend's stream has made the tensors
    const detail::QsaPaging pg{static_cast<const int32_t*>(batch.block_tables.data()), batch.max_blocks, 8, 16};
    ASSERT_EQ(
        cudaSuccess,
        detail::launch_qsa_union_attention(
            plan, static_cast<const float*>(q.data()), nh * D, static_cast<const int32_t*>(batch.seq_starts.data()), 2,
            groups, static_cast<const int32_t*>(batch.positions.data()), static_cast<const int32_t*>(sel_d.data()), W,
            static_cast<const int32_t*>(counts_d.data()), pg, static_cast<const float*>(k.data()),
            static_cast<const float*>(v.data()), int(nh), int(nkv), int(D), static_cast<const float*>(gate.data()),
            nh * D, D, static_cast<float*>(out.data()), nh * D, static_cast<uint32_t*>(words.data()), words_ld,
            static_cast<uint2*>(lists.data()), list_ld, batch_groups, static_cast<int32_t*>(status.data()), nullptr));
    ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
    const std::vector<float> got = host(g, out);
    EXPECT_EQ(host_as<int32_t>(g, status)[0], 0) << batch_groups << " groups a launch: an index error";
    if (first.empty()) {
      first = got;
      size_t zeros = 0;
      for (float x : got) zeros += x == 0.f;
      EXPECT_LT(zeros, got.size() / 100) << "rows left unwritten";
    } else {
      EXPECT_EQ(0, std::memcmp(first.data(), got.data(), got.size() * sizeof(float)))
          << batch_groups << " groups a launch";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Activations, CudaOps,
                         ::testing::Values(ActivationPrecision::Fp16x2, ActivationPrecision::Fp16),
                         [](const ::testing::TestParamInfo<ActivationPrecision>& i) {
                           return std::string(i.param == ActivationPrecision::Fp16x2 ? "Fp16x2" : "Fp16");
                         });

}  // namespace
}  // namespace flashnext
