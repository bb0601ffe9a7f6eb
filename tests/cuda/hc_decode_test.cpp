// The decode hyper-connection read (ops/cuda/cuda_ops_kernels.h launch_hc_read_decode, hc_down then hc_up) against
// a double-precision loop over MODEL.md's hyper-connection read (X' = X + the pending injection, rstd per stream,
// n = X' rstd (1 + hc_norm), d = silu(down . n / S), inj = 2 sigmoid(inject . n / S), u = mean over streams of
// sigmoid(up . d) n): u and the inject weights within 1e-5 of the output scale, the stored X' within 1e-6; outputs
// and scratch NaN before the launch, so that an element the kernels do not write shows. And the read as a decode step
// runs it: recorded into a CUDA graph and replayed three times, the same bits as three plain reads. Shapes: the
// released widths (4 streams, 2,560 hidden, rank 320) at 1 and 4 tokens, a thread with two down slices (hidden 2,568)
// and a lane with more up slices than it loads at once (rank 328), 1, 2 and 8 streams, 5 tokens, with and without
// inject rows and a pending injection.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "ops/cuda/cuda_ops_kernels.h"

namespace flashnext::cuda::test {
namespace {

struct HcShape {
  int T, S, H, R;
  bool inject, pending;
};

std::string shape_name(const testing::TestParamInfo<HcShape>& i) {
  const HcShape& s = i.param;
  std::ostringstream o;
  o << 'T' << s.T << "_S" << s.S << "_H" << s.H << "_R" << s.R << (s.inject ? "_inject" : "")
    << (s.pending ? "_pending" : "");
  return o.str();
}

// What one launch_hc_read_decode call leaves: u [T, H], inj [T, S] and X [T, S*H].
struct HcOutputs {
  std::vector<float> u, inj, X;
};

class HcReadDecode : public testing::TestWithParam<HcShape> {
 protected:
  void SetUp() override {
    const HcShape& p = GetParam();
    ASSERT_TRUE(detail::hc_read_decode_supported(p.T, p.S, p.H, p.R));
    const int W = p.S * p.H;
    X_ = rand_f16_values(size_t(p.T) * W, 1, -2.f, 2.f);
    norm_ = rand_f16_values(size_t(W), 2, -0.5f, 0.5f);
    down_ = rand_f16_values(size_t(p.R) * W, 3, -0.05f, 0.05f);
    up_ = rand_f16_values(size_t(W) * p.R, 4, -0.2f, 0.2f);
    inject_w_ = rand_f16_values(size_t(p.S) * W, 5, -0.05f, 0.05f);
    add_out_ = rand_f16_values(size_t(p.T) * p.H, 6, -1.f, 1.f);
    add_inj_ = rand_f16_values(size_t(p.T) * p.S, 7, 0.f, 2.f);
  }

  // The device copies of one call's operands; outputs and scratch start as NaN (0xFF bytes), so that an element a
  // launch does not write, or a partial it reads before it is written, shows.
  struct Operands {
    DeviceArray<float> X, add_out, add_inj, scratch, u, inj;
    DeviceArray<__half> norm, down, up, inject;
  };
  Operands operands() const {
    const HcShape& p = GetParam();
    Operands o{to_device(X_),
               to_device(add_out_),
               to_device(add_inj_),
               DeviceArray<float>(size_t(detail::hc_read_decode_scratch(p.T, p.S, p.R, p.inject)), "scratch"),
               DeviceArray<float>(size_t(p.T) * p.H, "u"),
               DeviceArray<float>(size_t(p.T) * p.S, "inj"),
               dev_half(norm_),
               dev_half(down_),
               dev_half(up_),
               dev_half(inject_w_)};
    for (DeviceArray<float>* a : {&o.scratch, &o.u, &o.inj})
      EXPECT_EQ(cudaMemset(a->get(), 0xFF, a->size() * sizeof(float)), cudaSuccess);
    return o;
  }
  cudaError_t launch(Operands& o, cudaStream_t stream) const {
    const HcShape& p = GetParam();
    return detail::launch_hc_read_decode(o.X.get(), p.pending ? o.add_out.get() : nullptr,
                                         p.pending ? o.add_inj.get() : nullptr, o.norm.get(), o.down.get(), o.up.get(),
                                         p.inject ? o.inject.get() : nullptr, p.T, p.S, p.H, p.R, 1e-6f,
                                         o.scratch.get(), o.u.get(), o.inj.get(), stream);
  }
  static HcOutputs outputs(const Operands& o) {
    return HcOutputs{download(o.u.get(), o.u.size()), download(o.inj.get(), o.inj.size()),
                     download(o.X.get(), o.X.size())};
  }
  // One call of launch_hc_read_decode on fresh copies of the inputs.
  HcOutputs run() {
    Operands o = operands();
    const cudaError_t err = launch(o, nullptr);
    EXPECT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
    sync();
    return outputs(o);
  }

  // MODEL.md's read in double: X' = X + add_inj (x) add_out, rstd per (token, stream), n = X' rstd (1 + norm),
  // d = silu(down . n / S), inj = 2 sigmoid(inject . n / S), u = mean_b sigmoid(up_b . d) n_b.
  HcOutputs reference() const {
    const HcShape& p = GetParam();
    const int W = p.S * p.H;
    HcOutputs r{std::vector<float>(size_t(p.T) * p.H), std::vector<float>(size_t(p.T) * p.S), X_};
    for (int t = 0; t < p.T; ++t) {
      std::vector<double> x(W), n(W), d(p.R);
      for (int b = 0; b < p.S; ++b) {
        double ss = 0;
        for (int j = 0; j < p.H; ++j) {
          const size_t k = size_t(b) * p.H + j;
          x[k] = double(X_[size_t(t) * W + k]) +
                 (p.pending ? double(add_inj_[size_t(t) * p.S + b]) * add_out_[size_t(t) * p.H + j] : 0.0);
          ss += x[k] * x[k];
        }
        const double rstd = 1.0 / std::sqrt(ss / p.H + 1e-6);
        for (int j = 0; j < p.H; ++j) {
          const size_t k = size_t(b) * p.H + j;
          n[k] = x[k] * rstd * (1.0 + norm_[k]);
        }
      }
      for (int k = 0; k < W; ++k) r.X[size_t(t) * W + k] = float(x[k]);
      auto dot_n = [&](const std::vector<float>& w, int row) {
        double a = 0;
        for (int k = 0; k < W; ++k) a += double(w[size_t(row) * W + k]) * n[k];
        return a / p.S;
      };
      for (int i = 0; i < p.R; ++i) {
        const double a = dot_n(down_, i);
        d[i] = a / (1.0 + std::exp(-a));
      }
      if (p.inject)
        for (int s = 0; s < p.S; ++s) r.inj[size_t(t) * p.S + s] = float(2.0 / (1.0 + std::exp(-dot_n(inject_w_, s))));
      for (int j = 0; j < p.H; ++j) {
        double acc = 0;
        for (int b = 0; b < p.S; ++b) {
          double m = 0;
          for (int i = 0; i < p.R; ++i) m += double(up_[(size_t(b) * p.H + j) * p.R + i]) * d[i];
          acc += n[size_t(b) * p.H + j] / (1.0 + std::exp(-m));
        }
        r.u[size_t(t) * p.H + j] = float(acc / p.S);
      }
    }
    return r;
  }

  std::vector<float> X_, norm_, down_, up_, inject_w_, add_out_, add_inj_;
};

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && differ++ == 0) first = i;
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << got.size() << " values differ; first at " << first
                        << ": " << got[first] << " against " << want[first];
}

// Largest |v| of a vector (the scale errors are measured against).
float scale_of(const std::vector<float>& v) {
  float m = 0.f;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

TEST_P(HcReadDecode, MatchesTheReference) {
  const HcShape& p = GetParam();
  const HcOutputs got = run();
  const HcOutputs ref = reference();
  const float us = scale_of(ref.u);
  ASSERT_GT(us, 0.f);
  expect_close(got.u, ref.u, 1e-5f * us, 0.f, "u against the double loop");
  if (p.inject) expect_close(got.inj, ref.inj, 1e-5f, 0.f, "inj against the double loop");
  expect_close(got.X, ref.X, 1e-6f * scale_of(ref.X), 0.f, "X' stored");
}

// Recorded into a CUDA graph on a stream of its own, the graph replayed three times back to back (a replay reads the
// X' the one before stored: with a pending injection each adds it once more), against the same three reads launched
// one after another.
TEST_P(HcReadDecode, RecordedAndReplayed) {
  const HcShape& p = GetParam();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  Operands plain = operands();
  for (int i = 0; i < 3; ++i) ASSERT_EQ(launch(plain, stream), cudaSuccess);
  Operands replayed = operands();
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const cudaError_t captured = launch(replayed, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(captured, cudaSuccess) << cudaGetErrorString(captured);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  const HcOutputs want = outputs(plain), got = outputs(replayed);
  expect_same_bits(got.u, want.u, "u after three replays");
  if (p.inject) expect_same_bits(got.inj, want.inj, "inj after three replays");
  expect_same_bits(got.X, want.X, "X' after three replays");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(Shapes, HcReadDecode,
                         testing::Values(HcShape{1, 4, 2560, 320, true, true}, HcShape{1, 4, 2560, 320, false, false},
                                         HcShape{4, 4, 2560, 320, true, true}, HcShape{2, 4, 2568, 328, true, false},
                                         HcShape{3, 8, 16, 32, true, true}, HcShape{2, 2, 40, 24, true, false},
                                         HcShape{1, 1, 64, 8, false, true}, HcShape{5, 4, 64, 32, true, true}),
                         shape_name);

}  // namespace
}  // namespace flashnext::cuda::test
