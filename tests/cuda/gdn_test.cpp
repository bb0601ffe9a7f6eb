// Gated DeltaNet kernels against CPU loops of the reference recurrence (MODEL.md; torch_recurrent_gated_delta_rule,
// causal_conv1d_fn / causal_conv1d_update). Tolerances: conv outputs atol 2e-3 rtol 4e-3 (one FP16 rounding);
// delta-rule outputs atol 3e-3 rtol 5e-3 and FP32 states atol 1e-4 rtol 1e-3 (FP32 arithmetic in another order,
// WY form for the chunked kernel; the reference loop runs in double).
#include "ops/cuda/gdn.h"

#include <gtest/gtest.h>

#include <numeric>

#include "cuda_test_util.h"

namespace flashnext::cuda::test {
namespace {

// Causal depthwise conv + silu over one sequence with a K-1 input state (oldest first); updates the state.
void ref_conv(const std::vector<float>& x, int T, int C, int K, const std::vector<float>& w, std::vector<float>& st,
              std::vector<float>& y) {
  y.assign(size_t(T) * C, 0.f);
  for (int c = 0; c < C; ++c) {
    std::vector<float> hist(st.begin() + size_t(c) * (K - 1), st.begin() + size_t(c + 1) * (K - 1));
    for (int t = 0; t < T; ++t) hist.push_back(x[size_t(t) * C + c]);
    for (int t = 0; t < T; ++t) {
      double acc = 0;
      for (int k = 0; k < K; ++k) acc += double(w[size_t(c) * K + k]) * hist[t + k];
      y[size_t(t) * C + c] = silu(float(acc));
    }
    for (int j = 0; j < K - 1; ++j) st[size_t(c) * (K - 1) + j] = hist[hist.size() - (K - 1) + j];
  }
}

TEST(GdnConv, PrefillVarlenAndDecodeMatchReference) {
  const int C = 70, K = 4;
  const std::vector<int> lens = {1, 2, 7, 40, 3};
  std::vector<int32_t> cu = {0};
  for (int l : lens) cu.push_back(cu.back() + l);
  const int T = cu.back(), nseq = int(lens.size()), nslots = 8;
  const std::vector<int32_t> slots = {5, 0, 7, 2, 3};
  auto x = rand_f16_values(size_t(T) * C, 31, -2.f, 2.f);
  auto w = rand_f16_values(size_t(C) * K, 32, -1.f, 1.f);
  auto st = rand_f16_values(size_t(nslots) * C * (K - 1), 33, -2.f, 2.f);
  auto dx = dev_half(x), dw = dev_half(w), dst = dev_half(st);
  auto dcu = to_device(cu);
  auto dslots = to_device(slots);
  DeviceArray<__half> dy(size_t(T) * C, "y");
  gdn_conv_prefill(dx.get(), C, dcu.get(), nseq, T, dst.get(), dslots.get(), dw.get(), dy.get(), C, C, K, nullptr);
  sync();
  std::vector<float> yref(size_t(T) * C), stref = st;
  for (int s = 0; s < nseq; ++s) {
    std::vector<float> xs(x.begin() + size_t(cu[s]) * C, x.begin() + size_t(cu[s + 1]) * C), ys;
    std::vector<float> ss(stref.begin() + size_t(slots[s]) * C * (K - 1),
                          stref.begin() + size_t(slots[s] + 1) * C * (K - 1));
    ref_conv(xs, lens[s], C, K, w, ss, ys);
    std::copy(ys.begin(), ys.end(), yref.begin() + size_t(cu[s]) * C);
    std::copy(ss.begin(), ss.end(), stref.begin() + size_t(slots[s]) * C * (K - 1));
  }
  expect_close(host_half(dy.get(), yref.size()), yref, 2e-3f, 4e-3f, "conv prefill output");
  expect_close(host_half(dst.get(), stref.size()), stref, 0.f, 0.f, "conv prefill state");

  // Decode: three more tokens per sequence, one step at a time, batch of all sequences.
  for (int step = 0; step < 3; ++step) {
    auto xt = rand_f16_values(size_t(nseq) * C, 40 + step, -2.f, 2.f);
    auto dxt = dev_half(xt);
    DeviceArray<__half> dyt(size_t(nseq) * C, "yt");
    gdn_conv_update(dxt.get(), C, nseq, dst.get(), dslots.get(), dw.get(), dyt.get(), C, C, K, nullptr);
    sync();
    std::vector<float> ytref(size_t(nseq) * C);
    for (int s = 0; s < nseq; ++s) {
      std::vector<float> xs(xt.begin() + size_t(s) * C, xt.begin() + size_t(s + 1) * C), ys;
      std::vector<float> ss(stref.begin() + size_t(slots[s]) * C * (K - 1),
                            stref.begin() + size_t(slots[s] + 1) * C * (K - 1));
      ref_conv(xs, 1, C, K, w, ss, ys);
      std::copy(ys.begin(), ys.end(), ytref.begin() + size_t(s) * C);
      std::copy(ss.begin(), ss.end(), stref.begin() + size_t(slots[s]) * C * (K - 1));
    }
    expect_close(host_half(dyt.get(), ytref.size()), ytref, 2e-3f, 4e-3f, "conv update output");
    expect_close(host_half(dst.get(), stref.size()), stref, 0.f, 0.f, "conv update state");
  }
}

TEST(GdnConv, RejectsBadArguments) {
  DeviceArray<__half> d(64, "d");
  DeviceArray<int32_t> s(4, "s");
  EXPECT_THROW(gdn_conv_update(d.get(), 4, 1, d.get(), s.get(), d.get(), d.get(), 4, 4, 9, nullptr), Error);
  EXPECT_THROW(gdn_conv_update(d.get(), 3, 1, d.get(), s.get(), d.get(), d.get(), 4, 4, 4, nullptr), Error);
}

// Inputs of one GDN step batch: conv output qkv [T, C], a, b [T, nv].
struct GdnInputs {
  std::vector<float> qkv, a, b;
};

GdnInputs make_inputs(const GdnDims& d, int T, uint32_t seed) {
  return {rand_f16_values(size_t(T) * d.conv_channels(), seed, -1.f, 1.f),
          rand_f16_values(size_t(T) * d.nv, seed + 1, -3.f, 3.f),
          rand_f16_values(size_t(T) * d.nv, seed + 2, -3.f, 3.f)};
}

// The reference recurrence for tokens [t0, t1) of `in` on state S [nv, dk, dv] (double); writes o [T, nv*dv].
void ref_delta_rule(const GdnDims& d, const GdnInputs& in, int t0, int t1, const std::vector<float>& a_log,
                    const std::vector<float>& dt_bias, std::vector<double>& S, std::vector<float>& o) {
  const int C = d.conv_channels();
  for (int t = t0; t < t1; ++t)
    for (int h = 0; h < d.nv; ++h) {
      const int kh = h / (d.nv / d.nk);
      const float* row = &in.qkv[size_t(t) * C];
      std::vector<double> q(d.dk), k(d.dk);
      double sq = 0, sk = 0;
      for (int i = 0; i < d.dk; ++i) {
        q[i] = row[kh * d.dk + i];
        k[i] = row[(d.nk + kh) * d.dk + i];
        sq += q[i] * q[i];
        sk += k[i] * k[i];
      }
      for (int i = 0; i < d.dk; ++i) {
        q[i] = q[i] / std::sqrt(sq + 1e-6) / std::sqrt(double(d.dk));
        k[i] = k[i] / std::sqrt(sk + 1e-6);
      }
      const double beta = 1 / (1 + std::exp(-double(in.b[size_t(t) * d.nv + h])));
      const double x = double(in.a[size_t(t) * d.nv + h]) + dt_bias[h];
      const double g = -std::exp(double(a_log[h])) * (x > 20 ? x : std::log1p(std::exp(x)));
      double* Sh = &S[size_t(h) * d.dk * d.dv];
      for (size_t e = 0; e < size_t(d.dk) * d.dv; ++e) Sh[e] *= std::exp(g);
      for (int j = 0; j < d.dv; ++j) {
        double kv = 0;
        for (int i = 0; i < d.dk; ++i) kv += Sh[size_t(i) * d.dv + j] * k[i];
        const double delta = beta * (row[2 * d.nk * d.dk + h * d.dv + j] - kv);
        double oj = 0;
        for (int i = 0; i < d.dk; ++i) {
          Sh[size_t(i) * d.dv + j] += k[i] * delta;
          oj += Sh[size_t(i) * d.dv + j] * q[i];
        }
        o[size_t(t) * d.nv * d.dv + h * d.dv + j] = float(oj);
      }
    }
}

struct GdnCase {
  GdnDims dims;
  std::vector<int> lens;  // prefill lengths of the sequences in one batch
};

class GdnDeltaRule : public ::testing::TestWithParam<GdnCase> {};

// Chunked prefill over several sequences with nonzero initial states, then two decode steps, against the recurrence.
TEST_P(GdnDeltaRule, ChunkedPrefillThenDecodeMatchRecurrence) {
  const auto& p = GetParam();
  const GdnDims& d = p.dims;
  const int nseq = int(p.lens.size()), nslots = nseq + 2;
  std::vector<int32_t> cu = {0}, slots(nseq);
  for (int s = 0; s < nseq; ++s) {
    cu.push_back(cu.back() + p.lens[s]);
    slots[s] = nslots - 1 - s;  // distinct slots, not in sequence order
  }
  const int T = cu.back();
  const size_t state_per = size_t(d.nv) * d.dk * d.dv;
  auto a_log = rand_f16_values(d.nv, 50, -2.f, 1.f), dt_bias = rand_f16_values(d.nv, 51, -1.f, 1.f);
  auto state0 = rand_f16_values(nslots * state_per, 52, -0.5f, 0.5f);
  auto in = make_inputs(d, T, 60);

  auto dqkv = dev_half(in.qkv), da = dev_half(in.a), db = dev_half(in.b);
  auto dalog = to_device(a_log), ddt = to_device(dt_bias), dstate = to_device(state0);
  auto dcu = to_device(cu), dslots = to_device(slots);
  DeviceArray<__half> dout(size_t(T) * d.nv * d.dv, "out");
  gdn_chunked_prefill(dqkv.get(), d.conv_channels(), da.get(), db.get(), d.nv, dalog.get(), ddt.get(), dstate.get(),
                      dslots.get(), dcu.get(), nseq, d, dout.get(), d.nv * d.dv, nullptr);
  sync();

  std::vector<double> S(state0.begin(), state0.end());
  std::vector<float> oref(size_t(T) * d.nv * d.dv);
  auto run_ref = [&](const GdnInputs& inp, int t0, int t1, int slot, std::vector<float>& o) {
    std::vector<double> Ss(S.begin() + slot * state_per, S.begin() + (slot + 1) * state_per);
    ref_delta_rule(d, inp, t0, t1, a_log, dt_bias, Ss, o);
    std::copy(Ss.begin(), Ss.end(), S.begin() + slot * state_per);
  };
  for (int s = 0; s < nseq; ++s) run_ref(in, cu[s], cu[s + 1], slots[s], oref);
  expect_close(host_half(dout.get(), oref.size()), oref, 3e-3f, 5e-3f, "chunked prefill output");
  expect_close(download(dstate.get(), S.size()), std::vector<float>(S.begin(), S.end()), 1e-4f, 1e-3f,
               "chunked prefill state");

  for (int step = 0; step < 2; ++step) {
    auto dec = make_inputs(d, nseq, 70 + 3 * step);
    auto dq = dev_half(dec.qkv), dda = dev_half(dec.a), ddb = dev_half(dec.b);
    DeviceArray<__half> dod(size_t(nseq) * d.nv * d.dv, "decode out");
    gdn_recurrent_step(dq.get(), d.conv_channels(), dda.get(), ddb.get(), d.nv, dalog.get(), ddt.get(), dstate.get(),
                       dslots.get(), nseq, d, dod.get(), d.nv * d.dv, nullptr);
    sync();
    std::vector<float> odref(size_t(nseq) * d.nv * d.dv);
    for (int s = 0; s < nseq; ++s) run_ref(dec, s, s + 1, slots[s], odref);
    expect_close(host_half(dod.get(), odref.size()), odref, 3e-3f, 5e-3f, "decode output");
    expect_close(download(dstate.get(), S.size()), std::vector<float>(S.begin(), S.end()), 1e-4f, 1e-3f,
                 "decode state");
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GdnDeltaRule,
                         ::testing::Values(GdnCase{{16, 48, 128, 128}, {33}},  // released widths, one chunk + 1
                                           GdnCase{{4, 12, 128, 128}, {1, 31, 32, 100}},  // TP4 rank; chunk edges
                                           GdnCase{{1, 1, 4, 3}, {5, 64, 2}},             // tiny dims, dv below a slice
                                           GdnCase{{2, 6, 64, 40}, {0, 70}},  // an empty sequence in the batch
                                           GdnCase{{1, 2, 1, 1}, {3}}));

// Prefill split into two chunked-prefill calls (as chunked prefill of a long prompt) equals one call.
TEST(GdnDeltaRule, SplitPrefillEqualsWhole) {
  const GdnDims d{2, 4, 128, 128};
  const int T = 75, cut = 37;
  auto in = make_inputs(d, T, 80);
  auto a_log = rand_f16_values(d.nv, 81, -2.f, 1.f), dt_bias = rand_f16_values(d.nv, 82, -1.f, 1.f);
  const size_t n_state = size_t(d.nv) * d.dk * d.dv;
  auto dqkv = dev_half(in.qkv), da = dev_half(in.a), db = dev_half(in.b);
  auto dalog = to_device(a_log), ddt = to_device(dt_bias);
  auto s1 = to_device(std::vector<float>(n_state, 0.f)), s2 = to_device(std::vector<float>(n_state, 0.f));
  auto slot = to_device(std::vector<int32_t>{0});
  auto cu_all = to_device(std::vector<int32_t>{0, T}), cu_a = to_device(std::vector<int32_t>{0, cut}),
       cu_b = to_device(std::vector<int32_t>{0, T - cut});
  const int C = d.conv_channels(), W = d.nv * d.dv;
  DeviceArray<__half> o1(size_t(T) * W, "o1"), o2(size_t(T) * W, "o2");
  gdn_chunked_prefill(dqkv.get(), C, da.get(), db.get(), d.nv, dalog.get(), ddt.get(), s1.get(), slot.get(),
                      cu_all.get(), 1, d, o1.get(), W, nullptr);
  gdn_chunked_prefill(dqkv.get(), C, da.get(), db.get(), d.nv, dalog.get(), ddt.get(), s2.get(), slot.get(), cu_a.get(),
                      1, d, o2.get(), W, nullptr);
  gdn_chunked_prefill(dqkv.get() + size_t(cut) * C, C, da.get() + cut * d.nv, db.get() + cut * d.nv, d.nv, dalog.get(),
                      ddt.get(), s2.get(), slot.get(), cu_b.get(), 1, d, o2.get() + size_t(cut) * W, W, nullptr);
  sync();
  expect_close(host_half(o2.get(), size_t(T) * W), host_half(o1.get(), size_t(T) * W), 2e-3f, 4e-3f, "split output");
  expect_close(download(s2.get(), n_state), download(s1.get(), n_state), 1e-5f, 1e-4f, "split state");
}

TEST(GdnDeltaRule, RejectsBadDims) {
  DeviceArray<__half> h(1024, "h");
  DeviceArray<float> f(1024, "f");
  DeviceArray<int32_t> i(4, "i");
  EXPECT_THROW(gdn_recurrent_step(h.get(), 1024, h.get(), h.get(), 8, f.get(), f.get(), f.get(), i.get(), 1,
                                  GdnDims{3, 8, 16, 16}, h.get(), 1024, nullptr),
               Error);  // 8 value heads over 3 key heads
  EXPECT_THROW(gdn_recurrent_step(h.get(), 1024, h.get(), h.get(), 8, f.get(), f.get(), f.get(), i.get(), 1,
                                  GdnDims{1, 1, 256, 16}, h.get(), 1024, nullptr),
               Error);  // dk above 128
}

}  // namespace
}  // namespace flashnext::cuda::test
