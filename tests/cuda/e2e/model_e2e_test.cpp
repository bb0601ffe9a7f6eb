// End to end on the GPU: the qwen4_exp model on the CUDA backend (make_cuda_ops) against transformers' float32
// reference fixtures: tests/data/fixtures/tiny-a and tiny-b, and the `medium` fixture (released per-layer widths,
// 4 layers, a 3,000-token prompt) that tools/make_fixtures.py builds on the GPU machine; its folder is given by the
// environment variable FLASHNEXT_MEDIUM_FIXTURE (scripts/gpu-e2e.sh sets it).
//
// Acceptance (issue 5, bounds tightened by issue 20): at every prompt position the argmax equals the reference's,
// except near-ties (the reference's top-2 gap below 1e-2, each one printed); greedy sequences equal; every logit
// within a fixture's bound x the reference scale (the largest |logit| of the reference over the prompt). Each bound
// is about 10x the ratio measured on the H200 (docs/BENCHMARKS.md, fp16x2, runs of 2026-11-30 and later), so a
// kernel error a few times larger than today's fails:
//   tiny-a (also in chunks) 1.4e-6 measured (3.2e-6 / 2.25) -> 1.5e-5; tiny-b 1.0e-6 (2.3e-6 / 2.3) -> 1e-5;
//   medium short 4.1e-6 (9.4e-6 / 2.27) -> 4e-5; medium long 5.6e-3 (1.43e-2 / 2.53: one near-tied routing choice of
//   layer 1 flips, docs/BENCHMARKS.md) -> 2e-2 kept (10x would loosen the former bound; 3.6x headroom).
// Every check prints an `E2E:` line with its figures (max |logit error|, scale, ratio, bound, near-ties), and the
// hidden states of each layer print `E2E-HIDDEN:` lines (diagnostics for a failure: which layer drifts first).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_model_options.h"
#include "model/batched_greedy.h"
#include "model/fixture.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/nccl_communicator.h"
#include "parallel/staged_communicator.h"

namespace flashnext::test {
namespace {

// Bounds on max |logit - reference| / reference scale, from the measured ratios above.
constexpr double kTinyATol = 1.5e-5;
constexpr double kTinyBTol = 1e-5;
constexpr double kMediumShortTol = 4e-5;
constexpr double kMediumLongTol = 2e-2;
constexpr double kNearTie = 1e-2;  // reference top-2 gap below which an argmax difference is tolerated

/// reference.safetensors at an explicit path.
struct RefFile : Reference {
  explicit RefFile(const std::string& path) : Reference(AtPath{path}) {}
};

std::string medium_dir() {
  const char* d = std::getenv("FLASHNEXT_MEDIUM_FIXTURE");
  if (!d || !*d) {
    ADD_FAILURE() << "FLASHNEXT_MEDIUM_FIXTURE is not set: build the fixture with `python3 tools/make_fixtures.py OUT "
                     "medium` and point the variable at OUT/medium (scripts/gpu-e2e.sh does both)";
    return "";
  }
  return d;
}

/// One GPU model per (folder, PLE placement, activation precision) for the whole binary.
Model& gpu_model(const std::string& dir, PleTablePlacement placement = PleTablePlacement::Host,
                 ActivationPrecision act = ActivationPrecision::Fp16x2) {
  static std::map<std::string, std::unique_ptr<Model>> models;
  auto& m = models[dir + (placement == PleTablePlacement::Host ? "#host" : "#device") +
                   (act == ActivationPrecision::Fp16x2 ? "#fp16x2" : "#fp16")];
  if (!m) {
    m = Model::load(dir, gpu_model_options(CudaOpsOptions{placement, act}));
  }
  return *m;
}

/// Argmax check of one position: equal, or a near-tie of the reference (counted and listed in `ties`).
void check_argmax(const std::string& what, int64_t t, int64_t got, int64_t want, double ref_gap, int& near_ties,
                  std::string& ties) {
  if (got == want) return;
  if (ref_gap < kNearTie) {
    ++near_ties;
    ties += fmt::format(" [position {}: cuda {} vs reference {}, reference top-2 gap {:.2e}]", t, got, want, ref_gap);
    return;
  }
  ADD_FAILURE() << what << " position " << t << ": argmax " << got << ", reference " << want << " (reference top-2 gap "
                << ref_gap << ")";
}

/// Full logits [T, V] against the reference's: the acceptance criteria, and one E2E line.
void check_logits(const std::string& what, const std::vector<float>& got, const std::vector<float>& want, int64_t T,
                  int64_t V, const std::vector<int64_t>& ref_argmax, double tol) {
  ASSERT_EQ(got.size(), size_t(T * V)) << what;
  ASSERT_EQ(want.size(), size_t(T * V)) << what;
  double max_abs = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    max_abs = std::max(max_abs, double(std::fabs(got[i] - want[i])));
    scale = std::max(scale, double(std::fabs(want[i])));
  }
  int near_ties = 0;
  std::string ties;
  for (int64_t t = 0; t < T; ++t) {
    check_argmax(what, t, argmax(&got[size_t(t * V)], V), ref_argmax[size_t(t)], top2_gap(&want[size_t(t * V)], V),
                 near_ties, ties);
  }
  EXPECT_LE(max_abs, tol * scale) << what << ": ratio " << max_abs / scale << ", bound " << tol;
  std::printf(
      "E2E: %s: T=%lld max|dlogit| %.3e, reference scale %.3f, ratio %.2e (bound %.1e); near-tie argmax "
      "differences %d%s\n",
      what.c_str(), (long long)T, max_abs, scale, max_abs / scale, tol, near_ties, ties.c_str());
}

/// Prints max |hidden - reference| per layer (E2E-HIDDEN lines) during one forward; returns the logits.
std::vector<float> forward_with_hidden(Model& model, const RefFile& ref, const std::string& what, const std::string& P,
                                       const std::vector<int32_t>& ids) {
  SequenceState seq = model.new_sequence();
  return model.forward(seq, ids, LogitsMode::All, [&](int i, const Tensor& h) {
    const std::vector<float> g = model.download(h), w = ref.f32(P + ".hidden." + std::to_string(i));
    if (g.size() != w.size()) {
      ADD_FAILURE() << what << " hidden." << i << ": " << g.size() << " values, reference " << w.size();
      return;
    }
    double err = 0, scale = 0;
    for (size_t j = 0; j < g.size(); ++j) {
      err = std::max(err, double(std::fabs(g[j] - w[j])));
      scale = std::max(scale, double(std::fabs(w[j])));
    }
    std::printf("E2E-HIDDEN: %s hidden.%d max|d| %.3e (max|ref| %.3f)\n", what.c_str(), i, err, scale);
  });
}

/// Greedy continuation against the reference's `P.greedy_ids`, through prefill + single-token decode steps.
void check_greedy(Model& model, const RefFile& ref, const std::string& what, const std::string& P) {
  const std::vector<int64_t> want = ref.i64(P + ".greedy_ids");
  const std::vector<int64_t> got = greedy(model, ref.ids(P), int(want.size()));
  EXPECT_EQ(got, want) << what << " greedy";
  std::printf("E2E: %s greedy %zu tokens: %s\n", what.c_str(), want.size(), got == want ? "equal" : "DIFFERENT");
}

// ------------------------------------------------------------------------------------------------ tiny-a

constexpr const char* kTinyA = "tests/data/fixtures/tiny-a/model";

class TinyA : public ::testing::TestWithParam<std::string> {};

TEST_P(TinyA, LogitsMatchReference) {
  const std::string P = GetParam();
  RefFile ref(source_path("tests/data/fixtures/tiny-a/reference.safetensors"));
  Model& model = gpu_model(source_path(kTinyA));
  const auto ids = ref.ids(P);
  const int64_t T = int64_t(ids.size()), V = model.config().vocab_size;
  const std::vector<float> logits = forward_with_hidden(model, ref, "tiny-a " + P, P, ids);
  check_logits("tiny-a " + P, logits, ref.f32(P + ".logits"), T, V, ref.i64(P + ".argmax"), kTinyATol);
}

TEST_P(TinyA, GreedyMatchesReference) {
  const std::string P = GetParam();
  RefFile ref(source_path("tests/data/fixtures/tiny-a/reference.safetensors"));
  check_greedy(gpu_model(source_path(kTinyA)), ref, "tiny-a " + P, P);
}

INSTANTIATE_TEST_SUITE_P(Prompts, TinyA, ::testing::Values("short", "eos_inside", "long", "single", "eos_first"));

// Tensor parallelism on the CUDA backend, every rank on GPU 0 (a CudaOps and stream each) and the collectives staged
// through host memory (parallel/staged_communicator.h): the kernels over the ranks' shard geometries (fewer GDN and
// QSA heads, expert and vocabulary slices; at TP 4 ranks that sit a tiny-a GDN layer out) meet TP 1's bounds against
// the reference, and greedy ids are the reference's.
Model& gpu_model_tp(const std::string& dir, int tp) {
  static std::map<std::string, std::unique_ptr<Model>> models;
  auto& m = models[dir + "#tp" + std::to_string(tp)];
  if (!m) {
    ModelOptions o;
    o.tp = tp;
    o.rank_ops = [](int) { return make_cuda_ops(0); };
    o.communicators = [](const std::vector<std::shared_ptr<Ops>>& ops) { return make_staged_communicators(ops); };
    m = Model::load(dir, o);
  }
  return *m;
}

class TinyATp : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(TinyATp, LogitsAndGreedyMatchReference) {
  const auto& [tp, P] = GetParam();
  RefFile ref(source_path("tests/data/fixtures/tiny-a/reference.safetensors"));
  Model& model = gpu_model_tp(source_path(kTinyA), tp);
  const auto ids = ref.ids(P);
  const int64_t T = int64_t(ids.size()), V = model.config().vocab_size;
  SequenceState seq = model.new_sequence();
  const std::vector<float> logits = model.forward(seq, ids);
  const std::string what = fmt::format("tiny-a TP {} {}", tp, P);
  check_logits(what, logits, ref.f32(P + ".logits"), T, V, ref.i64(P + ".argmax"), kTinyATol);
  check_greedy(model, ref, what, P);
}

INSTANTIATE_TEST_SUITE_P(Degrees, TinyATp,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Values("short", "long", "single")));

// Tensor parallelism over NCCL, rank r on GPU r (issue 16: needs a machine with at least as many GPUs as ranks;
// scripts/gpu-bench.sh runs MultiGpu* only there, and a run with too few GPUs fails rather than passes).
class MultiGpuTinyATpNccl : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(MultiGpuTinyATpNccl, LogitsAndGreedyMatchReference) {
  const auto& [tp, P] = GetParam();
  ASSERT_GE(cuda_device_count(), tp) << "TP " << tp << " over NCCL needs " << tp << " GPUs";
  static std::map<int, std::unique_ptr<Model>> models;
  auto& m = models[tp];
  if (!m) {
    ModelOptions o;
    o.tp = tp;
    o.rank_ops = [](int r) { return make_cuda_ops(r); };
    o.communicators = [](const std::vector<std::shared_ptr<Ops>>& ops) { return make_nccl_communicators(ops); };
    m = Model::load(source_path(kTinyA), o);
  }
  RefFile ref(source_path("tests/data/fixtures/tiny-a/reference.safetensors"));
  const auto ids = ref.ids(P);
  const int64_t T = int64_t(ids.size()), V = m->config().vocab_size;
  SequenceState seq = m->new_sequence();
  const std::vector<float> logits = m->forward(seq, ids);
  const std::string what = fmt::format("tiny-a TP {} over NCCL {}", tp, P);
  check_logits(what, logits, ref.f32(P + ".logits"), T, V, ref.i64(P + ".argmax"), kTinyATol);
  check_greedy(*m, ref, what, P);
}

INSTANTIATE_TEST_SUITE_P(Degrees, MultiGpuTinyATpNccl,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Values("short", "long", "single")));

// A decode step allocates nothing once the step arena has grown to its demand (ops.h begin_step, ENGINE.md
// "Memory"): every activation and op scratch of steps 4..11 is carved from the arena, none from the pool.
TEST(StepArena, DecodeStepsTakeNoPoolMemoryOnceWarm) {
  RefFile ref(source_path("tests/data/fixtures/tiny-a/reference.safetensors"));
  // Steps that run plainly (a replayed step runs no op on the host: StepGraphs below).
  const std::unique_ptr<Model> plain = Model::load(
      source_path(kTinyA),
      gpu_model_options(CudaOpsOptions{PleTablePlacement::Host, ActivationPrecision::Fp16x2, /*step_graphs=*/false}));
  Model& model = *plain;
  SequenceState seq = model.new_sequence();
  const auto ids = ref.ids("long");
  std::vector<float> logits = model.forward(seq, ids, LogitsMode::Last);
  const int64_t V = model.config().vocab_size;
  auto decode = [&] {
    const int32_t next = int32_t(std::max_element(logits.end() - V, logits.end()) - (logits.end() - V));
    logits = model.forward(seq, std::vector<int32_t>{next}, LogitsMode::Last);
  };
  for (int i = 0; i < 3; ++i) decode();
  const CudaMemoryCounters before = cuda_memory_counters(model.ops());
  for (int i = 0; i < 8; ++i) decode();
  const CudaMemoryCounters after = cuda_memory_counters(model.ops());
  EXPECT_EQ(after.steps - before.steps, 8);
  EXPECT_EQ(after.step_pool_allocations, before.step_pool_allocations) << "pool allocations inside decode steps";
  EXPECT_GE(after.arena_tensors - before.arena_tensors, 8 * 20) << "activations not taken from the arena";
  EXPECT_GT(after.arena_bytes, 0);
}

// The FP16-activation path (ActivationPrecision::Fp16): not reference-exact by design. FP16 rounding at the GEMM
// inputs flips near-tied MoE routing and indexer choices (tiny-a "long", position 190 on: logits off by 0.15, and
// one argmax off by a 0.029 reference gap at position 89, on the H200, 2026-11-30). Bounded two ways (issue 20):
// - before the first known flip (every position of the short prompts, positions 0..88 of "long": the argmax
//   difference at 89 needs a logit error of at least half its 0.029 gap, which rounding alone cannot make), within
//   kFp16PreFlipTol x the scale: 10x the largest measured ratio, 8.6e-4 (tiny-a short; long 0..88: 7.1e-4; H200,
//   2026-12-01, scripts/gpu-bench.sh), about 18x FP16's unit roundoff (2^-11 = 4.9e-4);
// - over the whole prompt, within kFp16Tol x the scale: 2x the measured 6.7e-2 (0.15 / 2.25, tiny-a long), i.e.
//   about one flipped routing choice; and at most one argmax difference beyond the near-tie rule per 100 positions.
constexpr double kFp16PreFlipTol = 9e-3;
constexpr double kFp16Tol = 1.4e-1;
constexpr int64_t kFp16FirstFlip = 89;  // tiny-a long: the first position a flipped choice is known to reach

TEST(TinyAFp16, StaysCloseToReference) {
  RefFile ref(source_path("tests/data/fixtures/tiny-a/reference.safetensors"));
  Model& model = gpu_model(source_path(kTinyA), PleTablePlacement::Host, ActivationPrecision::Fp16);
  const int64_t V = model.config().vocab_size;
  for (const char* P : {"short", "eos_inside", "long", "single", "eos_first"}) {
    const auto ids = ref.ids(P);
    const int64_t T = int64_t(ids.size());
    SequenceState seq = model.new_sequence();
    const std::vector<float> got = model.forward(seq, ids), want = ref.f32(std::string(P) + ".logits");
    const auto ref_argmax = ref.i64(std::string(P) + ".argmax");
    ASSERT_EQ(got.size(), want.size()) << P;
    const int64_t pre = std::min(T, kFp16FirstFlip);
    double max_abs = 0, pre_abs = 0, scale = 0;
    bool finite = true;
    for (size_t i = 0; i < got.size(); ++i) {
      finite = finite && std::isfinite(got[i]);
      const double d = std::fabs(double(got[i]) - double(want[i]));
      max_abs = std::max(max_abs, d);
      if (int64_t(i) < pre * V) pre_abs = std::max(pre_abs, d);
      scale = std::max(scale, double(std::fabs(want[i])));
    }
    int near_ties = 0, other = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (argmax(&got[size_t(t * V)], V) == ref_argmax[size_t(t)]) continue;
      ++(top2_gap(&want[size_t(t * V)], V) < kNearTie ? near_ties : other);
    }
    EXPECT_TRUE(finite) << P;
    EXPECT_LE(other, (T + 99) / 100) << P << ": argmax differences beyond near-ties";
    EXPECT_LE(pre_abs, kFp16PreFlipTol * scale) << P << " positions 0.." << pre - 1 << ": ratio " << pre_abs / scale;
    EXPECT_LE(max_abs, kFp16Tol * scale) << P << ": ratio " << max_abs / scale;
    std::printf(
        "E2E-FP16: tiny-a %s: T=%lld max|dlogit| %.3e, reference scale %.3f, ratio %.2e (bound %.1e); positions "
        "0..%lld ratio %.2e (bound %.1e); argmax differences: %d near-tie, %d other\n",
        P, (long long)T, max_abs, scale, max_abs / scale, kFp16Tol, (long long)(pre - 1), pre_abs / scale,
        kFp16PreFlipTol, near_ties, other);
  }
}

// Chunked prefill on the GPU (state carried across calls: GDN conv/recurrent, PLE history and conv, QSA caches and
// the indexer over earlier chunks) meets the same criteria.
TEST(TinyAChunked, LongPromptInChunks) {
  RefFile ref(source_path("tests/data/fixtures/tiny-a/reference.safetensors"));
  Model& model = gpu_model(source_path(kTinyA));
  const auto ids = ref.ids("long");
  const int64_t T = int64_t(ids.size()), V = model.config().vocab_size;
  for (int64_t chunk : {int64_t(1), int64_t(7), int64_t(64)}) {
    const std::vector<float> got = forward_in_chunks(model, ids, chunk);
    check_logits("tiny-a long, chunks of " + std::to_string(chunk), got, ref.f32("long.logits"), T, V,
                 ref.i64("long.argmax"), kTinyATol);
  }
}

// Batched steps (issue 5's batch test): 8 sequences of different lengths in one step, prefill chunks and decode
// tokens mixed, in one paged cache with scrambled blocks, give the same tokens as each alone; and the reference's
// greedy ids.
TEST(TinyABatch, EightSequencesGenerateWhatEachGeneratesAlone) {
  Model& model = gpu_model(source_path(kTinyA));
  const auto prompts = tiny_a_batch_prompts();
  BatchPlan plan{.block_size = 16, .chunk = 40, .start = {0, 0, 1, 2, 0, 3, 1, 0}};
  const auto together = batched_greedy(model, prompts, 8, plan);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto alone = batched_greedy(model, {prompts[i]}, 8, BatchPlan{.block_size = 16, .chunk = 40, .start = {}});
    EXPECT_EQ(together[i], alone[0]) << "prompt " << i << " (" << prompts[i].size() << " tokens)";
  }
  // Anchored to the reference: the five whole fixture prompts give transformers' greedy ids.
  EXPECT_EQ(expect_prefix_of_reference(together, tiny_a_batch_reference_greedy()), 5);
  std::printf(
      "E2E: tiny-a batch of %zu sequences (1..300 tokens, mixed prefill/decode): compared with each alone and, for "
      "the 5 whole fixture prompts, with the reference's greedy ids\n",
      prompts.size());
}

TEST(TinyABatch, BatchedGreedyMatchesReference) {
  expect_tiny_a_batched_greedy_matches_reference(gpu_model(source_path(kTinyA)));
}

// ------------------------------------------------------------------------------------------------ tiny-b

constexpr const char* kTinyB = "models/tiny-b-random";

class TinyB : public ::testing::TestWithParam<std::string> {};

// The reference keeps the top 32 logits of every position and the last 4 rows in full.
TEST_P(TinyB, LogitsMatchReference) {
  const std::string P = GetParam();
  RefFile ref(source_path("tests/data/fixtures/tiny-b/reference.safetensors"));
  Model& model = gpu_model(source_path(kTinyB));
  const auto ids = ref.ids(P);
  const int64_t T = int64_t(ids.size()), V = model.config().vocab_size;
  SequenceState seq = model.new_sequence();
  const std::vector<float> logits = model.forward(seq, ids);
  ASSERT_EQ(logits.size(), size_t(T * V));
  const auto top_ids = ref.i64(P + ".top32_ids");
  const auto top_vals = ref.f32(P + ".top32_logits");
  const auto last4 = ref.f32(P + ".logits_last4");
  const auto ref_argmax = ref.i64(P + ".argmax");
  double max_abs = 0, scale = 0;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < 32; ++j) {
      const size_t r = size_t(t * 32 + j);
      max_abs = std::max(max_abs, double(std::fabs(logits[size_t(t * V + top_ids[r])] - top_vals[r])));
      scale = std::max(scale, double(std::fabs(top_vals[r])));
    }
  }
  for (int64_t i = 0; i < 4 * V; ++i) {
    max_abs = std::max(max_abs, double(std::fabs(logits[size_t((T - 4) * V + i)] - last4[size_t(i)])));
    scale = std::max(scale, double(std::fabs(last4[size_t(i)])));
  }
  int near_ties = 0;
  std::string ties;
  for (int64_t t = 0; t < T; ++t) {
    const double gap = double(top_vals[size_t(t * 32)]) - double(top_vals[size_t(t * 32 + 1)]);
    check_argmax("tiny-b " + P, t, argmax(&logits[size_t(t * V)], V), ref_argmax[size_t(t)], gap, near_ties, ties);
  }
  EXPECT_LE(max_abs, kTinyBTol * scale) << P << ": ratio " << max_abs / scale << ", bound " << kTinyBTol;
  std::printf(
      "E2E: tiny-b %s: T=%lld max|dlogit| %.3e over the reference's top-32 and last 4 rows, reference "
      "scale %.3f, ratio %.2e (bound %.1e); near-tie argmax differences %d%s\n",
      P.c_str(), (long long)T, max_abs, scale, max_abs / scale, kTinyBTol, near_ties, ties.c_str());
}

TEST_P(TinyB, GreedyMatchesReference) {
  const std::string P = GetParam();
  RefFile ref(source_path("tests/data/fixtures/tiny-b/reference.safetensors"));
  check_greedy(gpu_model(source_path(kTinyB)), ref, "tiny-b " + P, P);
}

INSTANTIATE_TEST_SUITE_P(Prompts, TinyB, ::testing::Values("chat0", "chat2", "code"));

// The PLE table in GPU memory gives the logits of the pinned-host table (same kernels, other memory).
TEST(TinyBPleDevice, SameLogitsAsHostTable) {
  RefFile ref(source_path("tests/data/fixtures/tiny-b/reference.safetensors"));
  const auto ids = ref.ids("chat0");
  Model& host = gpu_model(source_path(kTinyB), PleTablePlacement::Host);
  Model& dev = gpu_model(source_path(kTinyB), PleTablePlacement::Device);
  SequenceState s1 = host.new_sequence(), s2 = dev.new_sequence();
  const auto a = host.forward(s1, ids, LogitsMode::Last), b = dev.forward(s2, ids, LogitsMode::Last);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_LE(max_abs_diff(a.data(), b.data(), a.size()), 1e-5);
}

// Programmatic dependent launch (kernel_attributes.h `launch`): a kernel may be scheduled while the one ahead of it
// runs, and waits in pdl_begin() for its results. Any kernel reading or writing before that wait would race; the
// kernels are deterministic, so the logits of a prefill and of decode steps must be bit for bit those of plain
// launches. On a GPU below compute capability 9.0 both runs are plain launches and the test says so.
TEST(ProgrammaticLaunch, SameLogitsAsPlainLaunches) {
  const bool pdl = cuda_programmatic_launch(0);
  std::printf("E2E: programmatic dependent launch %s on GPU 0\n", pdl ? "on" : "not available (both runs plain)");
  for (const char* fixture : {"tiny-a", "tiny-b"}) {
    const bool a = std::string(fixture) == "tiny-a";
    RefFile ref(source_path(fmt::format("tests/data/fixtures/{}/reference.safetensors", fixture)));
    Model& model = gpu_model(source_path(a ? kTinyA : kTinyB));
    const int64_t V = model.config().vocab_size;
    const auto ids = ref.ids(a ? "long" : "chat0");
    auto run = [&](bool programmatic) {
      set_cuda_programmatic_launch(programmatic);
      SequenceState seq = model.new_sequence();
      std::vector<float> all = model.forward(seq, ids, LogitsMode::All);
      std::vector<float> last(all.end() - V, all.end());
      for (int step = 0; step < 12; ++step) {
        const int32_t next = int32_t(std::max_element(last.begin(), last.end()) - last.begin());
        last = model.forward(seq, std::vector<int32_t>{next}, LogitsMode::Last);
        all.insert(all.end(), last.begin(), last.end());
      }
      return all;
    };
    const std::vector<float> with = run(true), plain = run(false), again = run(true);
    set_cuda_programmatic_launch(pdl);  // as it was (FLASHNEXT_CUDA_PDL=0 stays off)
    ASSERT_EQ(with.size(), plain.size());
    EXPECT_EQ(0, std::memcmp(with.data(), plain.data(), with.size() * sizeof(float)))
        << fixture << ": logits differ between programmatic and plain launches (max |d| "
        << max_abs_diff(with.data(), plain.data(), with.size()) << ")";
    EXPECT_EQ(0, std::memcmp(with.data(), again.data(), with.size() * sizeof(float)))
        << fixture << ": two runs with programmatic launches differ";
  }
}

// Recorded decode steps (CUDA graphs, docs/ENGINE.md "CUDA graphs"): a shape's first decode step runs plainly, its
// second is recorded and replayed, the later ones are replayed with their own inputs. The replays run the kernels
// of a plain step (the indexer's top-k kernels included, which skip queries that take every block), so greedy
// decoding gives the logits of a model that records nothing, bit for bit: from a 2-token prompt (the first bucket,
// positions below the indexer's top-k threshold of 11 included, and a private cache that grows: a new pool, a new
// shape) and from a 1,000-token prompt across the bucket boundary at 1,024 positions (warm-up, recording, replays).
// Models: the tiny configurations with random W4A16 experts (Model::random, the released checkpoints' expert path,
// FP32 activations), and the tiny fixtures with FP16 activations (their FP16 experts in the grouped WMMA kernels).
// With FP16x2 activations the fixtures' FP16 experts wait for the host (per-expert cuBLAS products): the op refuses
// while recording, so each shape's recording fails and its steps run plainly, with the same logits.
void expect_replays_equal_plain(const char* what, Model& recorded, Model& plain, bool records) {
  const int64_t V = recorded.config().vocab_size;
  for (const int64_t prompt : {int64_t(2), int64_t(1000)}) {
    std::vector<int32_t> ids(static_cast<size_t>(prompt));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 7919 + 13) % uint64_t(V));
    constexpr int kSteps = 40;
    auto run = [&](Model& model) {
      SequenceState seq = model.new_sequence();
      std::vector<float> last = model.forward(seq, ids, LogitsMode::Last), all = last;
      for (int step = 0; step < kSteps; ++step) {
        const int32_t next = int32_t(std::max_element(last.begin(), last.end()) - last.begin());
        last = model.forward(seq, std::vector<int32_t>{next}, LogitsMode::Last);
        all.insert(all.end(), last.begin(), last.end());
      }
      return all;
    };
    const Model::StepGraphStats before = recorded.step_graph_stats();
    const std::vector<float> with = run(recorded), without = run(plain);
    const Model::StepGraphStats after = recorded.step_graph_stats();
    const int64_t n_plain = after.plain - before.plain, captured = after.captured - before.captured,
                  replayed = after.replayed - before.replayed, failed = after.failed - before.failed;
    std::printf("E2E: %s, %lld-token prompt, %d decode steps: %lld plain, %lld recorded, %lld replayed, %lld failed\n",
                what, (long long)prompt, kSteps, (long long)n_plain, (long long)captured, (long long)replayed,
                (long long)failed);
    EXPECT_EQ(plain.step_graph_stats().replayed, 0) << what;
    if (records) {
      EXPECT_EQ(failed, 0) << what << ": a recording failed (its warning says why)";
      EXPECT_EQ(n_plain + replayed, kSteps) << what;
      EXPECT_GE(captured, prompt == 2 ? 1 : 2) << what;
      EXPECT_GE(replayed, kSteps - 8) << what;
    } else {
      EXPECT_EQ(replayed, 0) << what;
      EXPECT_EQ(n_plain, kSteps) << what;
      EXPECT_GE(failed, 1) << what << ": the recording of a step that waits for the host did not fail";
    }
    ASSERT_EQ(with.size(), without.size());
    EXPECT_EQ(0, std::memcmp(with.data(), without.data(), with.size() * sizeof(float)))
        << what << ", " << prompt << "-token prompt: logits of replayed steps differ from plain steps (max |d| "
        << max_abs_diff(with.data(), without.data(), with.size()) << ")";
  }
}

TEST(StepGraphs, ReplayedDecodeStepsEqualPlainSteps) {
  for (const char* fixture : {"tiny-a", "tiny-b"}) {
    const std::string dir = source_path(std::string(fixture) == "tiny-a" ? kTinyA : kTinyB);
    auto options = [](bool graphs, ActivationPrecision act) {
      return gpu_model_options(CudaOpsOptions{PleTablePlacement::Host, act, graphs});
    };
    const ModelConfig cfg = load_config(dir);
    const auto random_on = Model::random(cfg, options(true, ActivationPrecision::Fp16x2), 11);
    const auto random_off = Model::random(cfg, options(false, ActivationPrecision::Fp16x2), 11);
    expect_replays_equal_plain(fmt::format("{} random W4A16", fixture).c_str(), *random_on, *random_off, true);
    const auto fp16_on = Model::load(dir, options(true, ActivationPrecision::Fp16));
    const auto fp16_off = Model::load(dir, options(false, ActivationPrecision::Fp16));
    expect_replays_equal_plain(fmt::format("{} fp16", fixture).c_str(), *fp16_on, *fp16_off, true);
    const auto fp16x2_on = Model::load(dir, options(true, ActivationPrecision::Fp16x2));
    const auto fp16x2_off = Model::load(dir, options(false, ActivationPrecision::Fp16x2));
    expect_replays_equal_plain(fmt::format("{} fp16x2, FP16 experts", fixture).c_str(), *fp16x2_on, *fp16x2_off, false);
  }
}

// ------------------------------------------------------------------------------------------------ medium

class Medium : public ::testing::TestWithParam<std::string> {};

TEST_P(Medium, LogitsMatchReference) {
  const std::string P = GetParam(), dir = medium_dir();
  if (dir.empty()) return;
  RefFile ref(dir + "/reference.safetensors");
  Model& model = gpu_model(dir + "/model");
  const auto ids = ref.ids(P);
  const int64_t T = int64_t(ids.size()), V = model.config().vocab_size;
  const std::vector<float> logits = forward_with_hidden(model, ref, "medium " + P, P, ids);
  check_logits("medium " + P, logits, ref.f32(P + ".logits"), T, V, ref.i64(P + ".argmax"),
               P == "short" ? kMediumShortTol : kMediumLongTol);
}

TEST_P(Medium, GreedyMatchesReference) {
  const std::string P = GetParam(), dir = medium_dir();
  if (dir.empty()) return;
  RefFile ref(dir + "/reference.safetensors");
  check_greedy(gpu_model(dir + "/model"), ref, "medium " + P, P);
}

INSTANTIATE_TEST_SUITE_P(Prompts, Medium, ::testing::Values("short", "long"));

TEST(MediumChunked, LongPromptInChunksOf1000) {
  const std::string dir = medium_dir();
  if (dir.empty()) return;
  RefFile ref(dir + "/reference.safetensors");
  Model& model = gpu_model(dir + "/model");
  const auto ids = ref.ids("long");
  const int64_t T = int64_t(ids.size()), V = model.config().vocab_size, chunk = 1000;
  const std::vector<float> got = forward_in_chunks(model, ids, chunk);
  check_logits("medium long, chunks of 1000", got, ref.f32("long.logits"), T, V, ref.i64("long.argmax"),
               kMediumLongTol);
}

// 8 sequences cut from the 3,000-token prompt (lengths 5 to 3,000: some above the QSA budget of 2,048, so the
// indexer's top-k runs over paged keys), batched with mixed prefill and decode, against each alone.
TEST(MediumBatch, EightSequencesGenerateWhatEachGeneratesAlone) {
  const std::string dir = medium_dir();
  if (dir.empty()) return;
  RefFile ref(dir + "/reference.safetensors");
  Model& model = gpu_model(dir + "/model");
  const auto ids = ref.ids("long");
  std::vector<std::vector<int32_t>> prompts;
  for (size_t len :
       {size_t(5), size_t(3000), size_t(700), size_t(2100), size_t(64), size_t(2500), size_t(1), size_t(333)})
    prompts.emplace_back(ids.begin(), ids.begin() + std::min(len, ids.size()));
  BatchPlan plan{.block_size = 16, .chunk = 512, .start = {0, 0, 1, 0, 2, 1, 3, 0}};
  const auto together = batched_greedy(model, prompts, 4, plan);
  int equal = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto alone = batched_greedy(model, {prompts[i]}, 4, BatchPlan{.block_size = 16, .chunk = 512, .start = {}});
    EXPECT_EQ(together[i], alone[0]) << "prompt " << i << " (" << prompts[i].size() << " tokens)";
    equal += together[i] == alone[0];
  }
  // Anchored to the reference: prompt 1 is the whole 3,000-token prompt, whose greedy ids the reference has.
  std::vector<std::vector<int64_t>> want(prompts.size());
  want[1] = ref.i64("long.greedy_ids");
  EXPECT_EQ(expect_prefix_of_reference(together, want), 1);
  std::printf("E2E: medium batch of %zu sequences (1..3000 tokens, mixed prefill/decode): %d of %zu equal alone\n",
              prompts.size(), equal, prompts.size());
}

}  // namespace
}  // namespace flashnext::test
