// Every case of the op-case registry (op_cases.h) on the backend under test against a separate float32 CPU backend,
// the oracle. The backend is chosen by the environment:
//   FLASHNEXT_TEST_BACKEND=cpu|cuda     (default cpu; cuda needs a build with the CUDA backend)
//   FLASHNEXT_TEST_PRECISION=fp16x2|fp16 (the CUDA backend's activation precision; default: FLASHNEXT_CUDA_ACTIVATIONS,
//                                         else fp16x2)
// CPU against CPU (same thread count) must agree bitwise; another backend within each output's bound for its
// precision (exactly for integer outputs, as sets for QSA selections).
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>

#include "core/error.h"
#include "op_cases.h"
#include "ops/ops.h"
#ifdef FLASHNEXT_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace flashnext::opcases {
namespace {

/// The backend under test, made once; `error` says why there is none.
struct Backend {
  std::shared_ptr<Ops> ops;
  bool is_cpu = true;
  Precision precision = Precision::Fp16x2;
  std::string error;
};

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

Backend make_backend() {
  Backend b;
  const std::string kind = env("FLASHNEXT_TEST_BACKEND");
  const std::string prec = env("FLASHNEXT_TEST_PRECISION");
  if (!prec.empty() && prec != "fp16x2" && prec != "fp16") {
    b.error = "FLASHNEXT_TEST_PRECISION must be fp16x2 or fp16, got '" + prec + "'";
    return b;
  }
  if (kind.empty() || kind == "cpu") {
    b.ops = make_cpu_ops(0);
    return b;
  }
  if (kind != "cuda") {
    b.error = "FLASHNEXT_TEST_BACKEND must be cpu or cuda, got '" + kind + "'";
    return b;
  }
#ifdef FLASHNEXT_HAVE_CUDA
  try {
    CudaOpsOptions o = CudaOpsOptions::from_env();
    if (!prec.empty()) o.activations = prec == "fp16" ? ActivationPrecision::Fp16 : ActivationPrecision::Fp16x2;
    b.ops = make_cuda_ops(0, o);
    b.is_cpu = false;
    b.precision = o.activations == ActivationPrecision::Fp16 ? Precision::Fp16 : Precision::Fp16x2;
  } catch (const Error& e) {
    b.error = std::string("FLASHNEXT_TEST_BACKEND=cuda: ") + e.what();
  }
#else
  b.error = "FLASHNEXT_TEST_BACKEND=cuda, but this build has no CUDA backend (configure with FLASHNEXT_CUDA=ON)";
#endif
  return b;
}

Backend& backend() {
  static Backend b = make_backend();
  return b;
}

/// The oracle: its own CPU instance, with the thread count of the CPU under test (0: hardware concurrency).
Ops& oracle() {
  static std::shared_ptr<Ops> ops = make_cpu_ops(0);
  return *ops;
}

/// A seed from the case's name (FNV-1a), so that adding a case leaves the others' inputs alone.
uint64_t seed_of(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  return h;
}

class BackendOps : public ::testing::TestWithParam<size_t> {};

TEST_P(BackendOps, MatchesCpuOracle) {
  const OpCase& c = test_cases()[GetParam()];
  Backend& b = backend();
  ASSERT_TRUE(b.error.empty()) << b.error;
  if (c.needs_device_sampling && !b.ops->samples_on_device()) {
    // What ops.h promises of a backend that samples on the host: sample_tokens is an Error, not garbage.
    const Tensor logits = b.ops->zeros({1, 4});
    const TokenSampling p{};
    EXPECT_THROW(b.ops->sample_tokens(logits, {&p, 1}), Error);
    return;
  }
  const uint64_t seed = seed_of(c.name);
  OpRun want_run = c.build(oracle(), seed);
  want_run.run();
  const std::vector<OpOutput> want = want_run.outputs();
  OpRun got_run = c.build(*b.ops, seed);
  got_run.run();
  const std::vector<OpOutput> got = got_run.outputs();
  ASSERT_FALSE(want.empty()) << c.name << ": a case without outputs checks nothing";
  for (const OpOutput& o : want) {  // finite inputs give finite outputs: the oracle's values mean something
    size_t bad = 0;
    for (float x : o.values) bad += !std::isfinite(x);
    EXPECT_EQ(bad, 0u) << c.name << ": the oracle's " << o.name << " has non-finite values";
  }
  EXPECT_EQ(compare_outputs(want, got, b.is_cpu, b.precision), "")
      << c.name << " on " << b.ops->name() << (b.is_cpu ? " (bitwise)" : "");
}

std::string test_name(const ::testing::TestParamInfo<size_t>& info) {
  std::string out;
  for (char ch : test_cases()[info.param].name) {
    if (std::isalnum(static_cast<unsigned char>(ch)))
      out += ch;
    else if (ch == '/' || ch == '|')
      out += '_';
    else if (ch == ',')
      out += 'x';
    else if (ch == '-')
      out += 'm';
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Registry, BackendOps, ::testing::Range(size_t(0), test_cases().size()), test_name);

// The registry has cases of every family and every op the model calls (the list below is what
// src/model/qwen4_exp/*.cpp and the engine's device sampler call).
TEST(OpRegistry, CoversEveryProductionOp) {
  const char* ops[] = {"copy_rows/",
                       "fill_zero/",
                       "gather_rows/",
                       "scatter_rows/",
                       "embedding/",
                       "linear/",
                       "linear_group/",
                       "zc_rms_norm/",
                       "gated_rms_norm/",
                       "hc_read/",
                       "hc_inject/",
                       "gdn_conv_batch/",
                       "gdn_rule_batch/",
                       "gdn_mix_batch/",
                       "hc_inject_read/",
                       "qsa_prepare_qk_batch/",
                       "qsa_indexer_select_batch/",
                       "sparse_attention_batch/",
                       "moe_router_topk/",
                       "moe_experts/dense/",
                       "moe_experts/nvfp4/",
                       "moe_experts/ct-int4",
                       "moe_experts/gptq",
                       "moe_shared_expert/",
                       "ple_gather/",
                       "ple_gate/",
                       "ple_conv_add_batch/",
                       "sample_tokens/",
                       "random_weight/",
                       "/ahead"};
  for (const char* op : ops) {
    int n = 0;
    for (const OpCase& c : test_cases())
      n += op[0] == '/' ? c.name.find(op) != std::string::npos : c.name.rfind(op, 0) == 0;
    EXPECT_GT(n, 0) << "no case of " << op;
  }
}

// The comparison fails outside the bound and passes inside it (so that a registry run can fail).
TEST(OpRegistry, ComparisonFailsOutsideTheBound) {
  OpOutput want;
  want.name = "y";
  want.values = {1.f, -2.f, 0.f};
  want.fp16x2 = {1e-4, 1e-4};
  want.fp16 = {1e-2, 1e-2};
  OpOutput got = want;
  got.values[1] = -2.f + 3e-4f;  // allowed: 1e-4 x 2 (the scale) + 1e-4 x 2 = 4e-4
  EXPECT_EQ(compare_outputs({want}, {got}, false, Precision::Fp16x2), "");
  EXPECT_NE(compare_outputs({want}, {got}, true, Precision::Fp16x2), "") << "bitwise accepted a difference";
  got.values[1] = -2.f + 1e-3f;
  EXPECT_NE(compare_outputs({want}, {got}, false, Precision::Fp16x2), "");
  EXPECT_EQ(compare_outputs({want}, {got}, false, Precision::Fp16), "");
  got.values[2] = NAN;
  EXPECT_NE(compare_outputs({want}, {got}, false, Precision::Fp16), "") << "NaN accepted";

  OpOutput sel;
  sel.name = "selected";
  sel.compare = Compare::RowSets;
  sel.row_width = 3;
  sel.ints = {4, 0, -1, 1, 2, 3};
  OpOutput reordered = sel;
  reordered.ints = {0, 4, -1, 3, 1, 2};
  EXPECT_EQ(compare_outputs({sel}, {reordered}, false, Precision::Fp16x2), "");
  reordered.ints[5] = 5;
  EXPECT_NE(compare_outputs({sel}, {reordered}, false, Precision::Fp16x2), "");
}

}  // namespace
}  // namespace flashnext::opcases
