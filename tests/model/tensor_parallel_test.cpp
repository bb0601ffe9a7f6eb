// Tensor parallelism on the CPU oracle (issue 15): the model split over 2 and 4 ranks (threads of this process,
// parallel/communicator.h) gives the logits of TP 1 up to float rounding (the row-parallel sums add the ranks' partial
// dot products in another order) and the reference's, with the same greedy tokens; batched steps too. The sharding
// plan covers every head and column exactly once; degrees that the heads do not allow fail before loading.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <numeric>
#include <thread>

#include "batched_greedy.h"
#include "core/error.h"
#include "fixture.h"
#include "loader/sharding.h"
#include "model/qwen4_exp/cost.h"
#include "model/qwen4_exp/weights.h"
#include "parallel/communicator.h"
#include "parallel/rank_threads.h"

namespace flashnext::test {
namespace {

constexpr const char* kTinyA = "tests/data/fixtures/tiny-a/model";
constexpr const char* kTinyB = "models/tiny-b-random";
/// TP N against TP 1, relative to the largest |logit| of TP 1 (issue 15).
constexpr double kTpRelTol = 1e-5;
/// TP N against the reference (issue 15's bound; the measured errors are printed).
constexpr double kTpRefTol = 1e-3;

/// One model per (path, degree) for the whole test binary.
Model& tp_model(const std::string& dir, int tp) {
  if (tp == 1) return shared_model(dir);
  static std::map<std::pair<std::string, int>, std::unique_ptr<Model>> models;
  auto& m = models[{dir, tp}];
  if (!m) {
    ModelOptions o;
    o.tp = tp;
    m = Model::load(source_path(dir), o);
  }
  return *m;
}

// ------------------------------------------------------------------------------------------ collectives

TEST(CpuCommunicator, AllReduceSumsInRankOrderOnEveryRank) {
  for (int world : {1, 2, 3, 4}) {
    auto comms = make_cpu_communicators(world);
    RankThreads threads(world, comms);
    auto ops = make_cpu_ops(1);
    const int64_t n = 1001;  // not a multiple of the ranks: the slices differ in size
    std::vector<Tensor> t(static_cast<size_t>(world));
    std::vector<std::vector<float>> in(static_cast<size_t>(world), std::vector<float>(size_t(n)));
    for (int r = 0; r < world; ++r) {
      for (int64_t i = 0; i < n; ++i)  // magnitudes far apart, so that the order of the sum shows in the rounding
        in[size_t(r)][size_t(i)] = float((r % 2 ? -1 : 1) * std::pow(10.0, (i + 3 * r) % 9 - 4) * (1 + 0.37 * r));
      t[size_t(r)] = ops->upload(in[size_t(r)].data(), DType::F32, {n});
    }
    threads.run([&](int r) { comms[size_t(r)]->all_reduce_sum(t[size_t(r)]); });
    for (int r = 0; r < world; ++r) {
      std::vector<float> got(static_cast<size_t>(n));
      ops->download(t[size_t(r)], got.data());
      for (int64_t i = 0; i < n; ++i) {
        float want = in[0][size_t(i)];
        for (int k = 1; k < world; ++k) want += in[size_t(k)][size_t(i)];
        ASSERT_EQ(got[size_t(i)], want) << "world " << world << " rank " << r << " element " << i;
      }
    }
  }
}

TEST(CpuCommunicator, AllGatherColumnsPlacesUnevenWidthsInRankOrder) {
  const int world = 3;
  auto comms = make_cpu_communicators(world);
  RankThreads threads(world, comms);
  auto ops = make_cpu_ops(1);
  const int64_t rows = 3, widths[] = {2, 3, 1}, total = 6;
  std::vector<Tensor> in, out;
  for (int r = 0; r < world; ++r) {
    std::vector<float> v(size_t(rows * widths[r]));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < widths[r]; ++j) v[size_t(i * widths[r] + j)] = float(100 * r + 10 * i + j);
    in.push_back(ops->upload(v.data(), DType::F32, {rows, widths[r]}));
    out.push_back(ops->empty({rows, total}));
  }
  threads.run([&](int r) { comms[size_t(r)]->all_gather_columns(in[size_t(r)], out[size_t(r)]); });
  for (int r = 0; r < world; ++r) {
    std::vector<float> got(size_t(rows * total));
    ops->download(out[size_t(r)], got.data());
    for (int64_t i = 0; i < rows; ++i) {
      int64_t col = 0;
      for (int k = 0; k < world; ++k)
        for (int64_t j = 0; j < widths[k]; ++j, ++col)
          EXPECT_EQ(got[size_t(i * total + col)], float(100 * k + 10 * i + j)) << "rank " << r;
    }
  }
}

TEST(CpuCommunicator, AFailingRankReleasesTheOthersAndItsErrorIsReported) {
  const int world = 4;
  auto comms = make_cpu_communicators(world);
  RankThreads threads(world, comms);
  auto ops = make_cpu_ops(1);
  std::vector<Tensor> t;
  for (int r = 0; r < world; ++r) t.push_back(ops->zeros({8}));
  try {
    threads.run([&](int r) {
      if (r == 2) throw Error("rank 2 broke");
      comms[size_t(r)]->all_reduce_sum(t[size_t(r)]);  // would wait for rank 2 forever without the abort
    });
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "rank 2 broke");
  }
  // The group is usable again.
  threads.run([&](int r) { comms[size_t(r)]->all_reduce_sum(t[size_t(r)]); });
}

// ------------------------------------------------------------------------------------------ the sharding plan

/// Every index of [0, n) is held by exactly one rank among `ranges` (each rank's list of ranges).
void expect_partition(const std::vector<std::vector<IndexRange>>& ranges, int64_t n, const std::string& what) {
  std::vector<int> count(static_cast<size_t>(n), 0);
  for (const auto& rs : ranges)
    for (const IndexRange& r : rs)
      for (int64_t i = r.begin; i < r.end; ++i) {
        ASSERT_TRUE(i >= 0 && i < n) << what << ": index " << i << " outside [0, " << n << ")";
        ++count[size_t(i)];
      }
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(count[size_t(i)], 1) << what << ": index " << i;
}

// At the released geometry (GDN 16 key / 48 value heads, QSA 24 query / 2 KV heads, experts 640 wide) TP 2, 4 and 8
// split every head, channel and column exactly once; each rank's query heads use only its KV heads, and the KV heads
// are replicated where the ranks outnumber them.
// A rank that never reaches the collective the others wait in: the watchdog aborts the group after the timeout, the
// waiting rank leaves its collective, and the run throws the timeout (the cause), not "another rank failed". The
// group works again in the next run.
TEST(RankThreadsTimeout, AStepThatDoesNotFinishAbortsTheGroup) {
  auto comms = make_cpu_communicators(2);
  RankThreads threads(2, comms, 0.2);
  const std::vector<std::shared_ptr<Ops>> ops{make_cpu_ops(1), make_cpu_ops(1)};  // one per rank thread
  std::vector<float> v(8, 1.f);
  try {
    threads.run([&](int r) {
      if (r == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(600));  // no collective: rank 0 waits for it
        return;
      }
      Tensor t = ops[0]->upload(v.data(), DType::F32, {8});
      comms[0]->all_reduce_sum(t);
    });
    FAIL() << "the run returned although rank 1 never reached the collective";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did not finish within 0.2 s"), std::string::npos) << e.what();
  }
  std::vector<std::vector<float>> out(2);
  threads.run([&](int r) {
    Tensor t = ops[size_t(r)]->upload(v.data(), DType::F32, {8});
    comms[size_t(r)]->all_reduce_sum(t);
    out[size_t(r)].resize(8);
    ops[size_t(r)]->download(t, out[size_t(r)].data());
  });
  EXPECT_EQ(out[0], std::vector<float>(8, 2.f));
  EXPECT_EQ(out[1], std::vector<float>(8, 2.f));
}

TEST(TpPlan, ReleasedGeometryIsPartitionedExactly) {
  const ModelConfig cfg = load_config(source_path("models/release/config.json"));
  const int64_t H = cfg.hidden_size, D = cfg.head_dim, dk = cfg.linear_key_head_dim, dv = cfg.linear_value_head_dim;
  for (int world : {2, 4, 8}) {
    const TpPlan plan = TpPlan::make(cfg, world);
    std::vector<std::vector<IndexRange>> qkv, out_cols, q_rows, o_cols, moe_up, moe_down, vocab;
    for (int r = 0; r < world; ++r) {
      const RankShard& s = plan.rank(r);
      EXPECT_FALSE(s.gdn.idle() || s.attn.idle()) << "world " << world << " rank " << r;
      // Value head i uses key head i / (nv/nk), query head h KV head h / (nh/nkv): the rank holds them.
      const int64_t v_per_k = cfg.linear_num_value_heads / cfg.linear_num_key_heads;
      const int64_t q_per_kv = cfg.num_attention_heads / cfg.num_key_value_heads;
      for (int64_t i = s.gdn.heads.begin; i < s.gdn.heads.end; ++i)
        EXPECT_TRUE(i / v_per_k >= s.gdn.groups.begin && i / v_per_k < s.gdn.groups.end);
      for (int64_t h = s.attn.heads.begin; h < s.attn.heads.end; ++h)
        EXPECT_TRUE(h / q_per_kv >= s.attn.groups.begin && h / q_per_kv < s.attn.groups.end);
      if (world > cfg.num_key_value_heads) {
        EXPECT_EQ(s.attn.groups.size(), 1);  // replicated KV head
      }
      const ModelConfig rc = plan.rank_config(r);
      EXPECT_EQ(rc.linear_num_value_heads * world, cfg.linear_num_value_heads);
      EXPECT_EQ(rc.num_attention_heads * world, cfg.num_attention_heads);
      EXPECT_EQ(rc.moe_intermediate_size * world, cfg.moe_intermediate_size);
      const std::string L = "layers.0.";
      const TensorSplit sq = plan.split(r, L + "linear_attn.in_proj_qkv.weight", {cfg.gdn_conv_dim(), H});
      ASSERT_EQ(sq.split, Split::Rows);
      EXPECT_EQ(sq.shape({cfg.gdn_conv_dim(), H})[0], rc.gdn_conv_dim());
      qkv.push_back(sq.ranges);
      out_cols.push_back(plan.split(r, L + "linear_attn.out_proj.weight", {H, cfg.gdn_value_dim()}).ranges);
      q_rows.push_back(plan.split(r, "layers.3.self_attn.q_proj.weight", {2 * D * cfg.num_attention_heads, H}).ranges);
      o_cols.push_back(plan.split(r, "layers.3.self_attn.o_proj.weight", {H, D * cfg.num_attention_heads}).ranges);
      moe_up.push_back(plan.split(r, L + "mlp.experts.7.up_proj.weight", {cfg.moe_intermediate_size, H}).ranges);
      moe_down.push_back(plan.split(r, L + "mlp.experts.7.down_proj.weight", {H, cfg.moe_intermediate_size}).ranges);
      vocab.push_back(plan.split(r, "lm_head.weight", {cfg.vocab_size, H}).ranges);
      EXPECT_EQ(plan.split(r, L + "mlp.gate.weight", {cfg.num_experts, H}).split, Split::Replicated);
      EXPECT_EQ(plan.split(r, L + "attn_hyper_connection.hc_norm.weight", {cfg.hc_width()}).split, Split::Replicated);
    }
    const std::string w = " (tp " + std::to_string(world) + ")";
    expect_partition(qkv, cfg.gdn_conv_dim(), "in_proj_qkv rows" + w);
    expect_partition(out_cols, cfg.gdn_value_dim(), "out_proj columns" + w);
    expect_partition(q_rows, 2 * D * cfg.num_attention_heads, "q_proj rows" + w);
    expect_partition(o_cols, D * cfg.num_attention_heads, "o_proj columns" + w);
    expect_partition(moe_up, cfg.moe_intermediate_size, "expert up_proj rows" + w);
    expect_partition(moe_down, cfg.moe_intermediate_size, "expert down_proj columns" + w);
    expect_partition(vocab, cfg.vocab_size, "lm_head rows" + w);
    (void)dk, (void)dv;
  }
}

void expect_error_with(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    for (const std::string& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST(TpPlan, DegreesTheHeadsDoNotAllowFailNamingTheField) {
  const ModelConfig cfg = load_config(source_path("models/release/config.json"));
  expect_error_with([&] { TpPlan::make(cfg, 3); },
                    {"--tp 3", "16 GDN key heads", "linear_num_key_heads", "config.json"});
  expect_error_with([&] { TpPlan::make(cfg, 0); }, {"--tp must be >= 1"});
  // Before anything is loaded: tiny-a has 2 GDN key heads.
  ModelOptions o;
  o.tp = 3;
  expect_error_with([&] { Model::load(source_path(kTinyA), o); },
                    {"--tp 3", "2 GDN key heads", "linear_num_key_heads"});
}

// ------------------------------------------------------------------------------------------ the model under TP

struct TpCase {
  int tp;
  std::string prompt;
};
std::string case_name(const ::testing::TestParamInfo<TpCase>& i) {
  return "tp" + std::to_string(i.param.tp) + "_" + i.param.prompt;
}

class TpTinyA : public ::testing::TestWithParam<TpCase> {};

// Every hidden state and logit of a full-prompt forward against TP 1 and the reference; greedy decoding gives TP 1's
// and the reference's ids.
TEST_P(TpTinyA, LogitsAndGreedyMatchTp1AndReference) {
  const auto [tp, P] = GetParam();
  Reference ref("tiny-a");
  Model& one = tp_model(kTinyA, 1);
  Model& model = tp_model(kTinyA, tp);
  ASSERT_EQ(model.tp(), tp);
  const auto ids = ref.ids(P);
  SequenceState s1 = one.new_sequence(), sn = model.new_sequence();
  std::vector<std::vector<float>> hidden1;
  const std::vector<float> want =
      one.forward(s1, ids, LogitsMode::All, [&](int, const Tensor& h) { hidden1.push_back(one.download(h)); });
  double hidden_rel = 0;
  int hooks = 0;
  const std::vector<float> got = model.forward(sn, ids, LogitsMode::All, [&](int i, const Tensor& h) {
    ++hooks;
    const std::vector<float> v = model.download(h);
    ASSERT_EQ(v.size(), hidden1[size_t(i)].size()) << "hidden." << i;
    hidden_rel =
        std::max(hidden_rel, max_abs_diff(v.data(), hidden1[size_t(i)].data(), v.size()) / max_abs(hidden1[size_t(i)]));
  });
  EXPECT_EQ(hooks, int(hidden1.size()));
  ASSERT_EQ(got.size(), want.size());
  const double rel = max_abs_diff(got.data(), want.data(), got.size()) / max_abs(want);
  const std::vector<float> reference = ref.f32(P + ".logits");
  const double ref_err = max_abs_diff(got.data(), reference.data(), got.size());
  std::printf("[ tp       ] tiny-a tp %d %-10s |TP - TP1| / max|TP1|: logits %.3g, hidden %.3g; |TP - ref| %.3g\n", tp,
              P.c_str(), rel, hidden_rel, ref_err);
  EXPECT_LE(rel, kTpRelTol);
  EXPECT_LE(hidden_rel, kTpRelTol);
  EXPECT_LE(ref_err, kTpRefTol);
  const std::vector<int64_t> greedy_ref = ref.i64(P + ".greedy_ids");
  const std::vector<int64_t> g = greedy(model, ids, int(greedy_ref.size()));
  EXPECT_EQ(g, greedy(one, ids, int(greedy_ref.size())));
  EXPECT_EQ(g, greedy_ref);
}

INSTANTIATE_TEST_SUITE_P(Prompts, TpTinyA,
                         ::testing::Values(TpCase{2, "short"}, TpCase{2, "eos_inside"}, TpCase{2, "long"},
                                           TpCase{2, "single"}, TpCase{2, "eos_first"}, TpCase{4, "short"},
                                           TpCase{4, "eos_inside"}, TpCase{4, "long"}, TpCase{4, "single"},
                                           TpCase{4, "eos_first"}),
                         case_name);

class TpTinyB : public ::testing::TestWithParam<TpCase> {};

// tiny-b (151,936-row vocabulary, split over the ranks; 2 query heads and 1 KV head, so at TP 4 half the ranks sit
// QSA out): all logits against TP 1, the stored rows against the reference, greedy ids.
TEST_P(TpTinyB, LogitsAndGreedyMatchTp1AndReference) {
  const auto [tp, P] = GetParam();
  Reference ref("tiny-b");
  Model& one = tp_model(kTinyB, 1);
  Model& model = tp_model(kTinyB, tp);
  const auto ids = ref.ids(P);
  const int64_t T = int64_t(ids.size()), V = model.config().vocab_size;
  SequenceState s1 = one.new_sequence(), sn = model.new_sequence();
  const std::vector<float> want = one.forward(s1, ids), got = model.forward(sn, ids);
  ASSERT_EQ(got.size(), want.size());
  const double rel = max_abs_diff(got.data(), want.data(), got.size()) / max_abs(want);
  const auto last4 = ref.f32(P + ".logits_last4");
  const double ref_err = max_abs_diff(&got[size_t((T - 4) * V)], last4.data(), last4.size());
  std::printf("[ tp       ] tiny-b tp %d %-6s |TP - TP1| / max|TP1| %.3g; last 4 rows |TP - ref| %.3g\n", tp, P.c_str(),
              rel, ref_err);
  EXPECT_LE(rel, kTpRelTol);
  EXPECT_LE(ref_err, kTpRefTol);
  const auto ref_argmax = ref.i64(P + ".argmax");
  for (int64_t t = 0; t < T; ++t) EXPECT_EQ(argmax(&got[size_t(t * V)], V), ref_argmax[size_t(t)]) << P << " " << t;
  const std::vector<int64_t> greedy_ref = ref.i64(P + ".greedy_ids");
  EXPECT_EQ(greedy(model, ids, int(greedy_ref.size())), greedy_ref);
}

INSTANTIATE_TEST_SUITE_P(Prompts, TpTinyB,
                         ::testing::Values(TpCase{2, "chat0"}, TpCase{2, "chat2"}, TpCase{2, "code"},
                                           TpCase{4, "chat0"}, TpCase{4, "chat2"}, TpCase{4, "code"}),
                         case_name);

class TpBatched : public ::testing::TestWithParam<int> {};

// Batched steps under TP: the eight tiny-a prompts prefilled in chunks while others decode, in one paged pool with
// scrambled blocks, generate TP 1's ids; one batched prefill step gives TP 1's logits for every sequence.
TEST_P(TpBatched, BatchedStepsEqualTp1) {
  const int tp = GetParam();
  Model& one = tp_model(kTinyA, 1);
  Model& model = tp_model(kTinyA, tp);
  const auto prompts = tiny_a_batch_prompts();
  BatchPlan plan;
  plan.block_size = 16;
  plan.chunk = 40;
  plan.start = {0, 0, 1, 2, 0, 3, 1, 0};
  EXPECT_EQ(batched_greedy(model, prompts, 8, plan), batched_greedy(one, prompts, 8, plan));
  expect_tiny_a_batched_greedy_matches_reference(model);

  const int64_t V = model.config().vocab_size, bs = 8;
  int64_t blocks = 0;
  for (const auto& p : prompts) blocks += (int64_t(p.size()) + bs - 1) / bs;
  std::vector<float> logits[2];
  std::vector<int64_t> rows[2];
  Model* models[2] = {&one, &model};
  for (int m = 0; m < 2; ++m) {
    auto cache = models[m]->new_cache(blocks, bs, int64_t(prompts.size()));
    std::vector<SequenceState> seqs;
    std::vector<BatchItem> items;
    int32_t next_block = int32_t(blocks);
    for (size_t i = 0; i < prompts.size(); ++i) {
      seqs.push_back(models[m]->new_sequence(cache, int32_t(i)));
      for (int64_t b = 0; b < (int64_t(prompts[i].size()) + bs - 1) / bs; ++b)
        seqs.back().block_table.push_back(--next_block);
    }
    for (size_t i = 0; i < prompts.size(); ++i) items.push_back({&seqs[i], prompts[i], LogitsMode::All});
    logits[m] = models[m]->download(models[m]->forward_batch(items, &rows[m]));
  }
  EXPECT_EQ(rows[0], rows[1]);
  ASSERT_EQ(logits[0].size(), logits[1].size());
  const double rel = max_abs_diff(logits[0].data(), logits[1].data(), logits[0].size()) / max_abs(logits[0]);
  std::printf("[ tp       ] tiny-a tp %d batched prefill of 8 prompts |TP - TP1| / max|TP1| %.3g\n", tp, rel);
  EXPECT_LE(rel, kTpRelTol);
  (void)V;
}

// copy_sequence (n > 1 samples of one prompt) copies every rank's part of the state.
TEST_P(TpBatched, CopiedSequenceContinuesLikeTheOriginal) {
  const int tp = GetParam();
  Model& model = tp_model(kTinyA, tp);
  const auto prompts = tiny_a_batch_prompts();
  const std::vector<int32_t>& prompt = prompts[2];
  auto cache = model.new_cache(64, 16, 2);
  SequenceState a = model.new_sequence(cache, 0), b = model.new_sequence(cache, 1);
  for (int32_t i = 0; i < 20; ++i) a.block_table.push_back(i), b.block_table.push_back(63 - i);
  model.forward(a, prompt, LogitsMode::Last);
  model.copy_sequence(a, b);
  const int32_t next = 7;
  const auto la = model.forward(a, std::span<const int32_t>(&next, 1), LogitsMode::Last);
  const auto lb = model.forward(b, std::span<const int32_t>(&next, 1), LogitsMode::Last);
  EXPECT_EQ(la, lb);
}

INSTANTIATE_TEST_SUITE_P(Degrees, TpBatched, ::testing::Values(2, 4));

// ------------------------------------------------------------------------------------------ random weights under TP

/// The values of a weight tensor of the CPU backend.
std::vector<float> values(const Tensor& t) {
  return std::vector<float>(t.data_as<const float>(), t.data_as<const float>() + t.numel());
}

// Model::random over 2 and 4 ranks (`bench --tp`): rank 0 holds its shard's shapes, the replicated weights (router,
// hyper-connections, norms, PLE projections) are the values TP 1 makes from the same seed (so every rank, drawing
// the same seeds, holds them alike and routes alike), and the model runs: finite logits, the same on a second build.
// bench's per-GPU roofline (issue 15): under TP 2 step_cost counts what rank 0 moves. On tiny-a (2 KV heads, 6 GDN
// value heads, both split in two): the PLE rows a rank gathers are half of all of them; its weights and FLOPs are
// fewer (sharded projections, experts and lm_head; the hyper-connections and norms replicated); its caches lie
// strictly between half and all (K/V and GDN states split, the pooled indexer keys and the PLE conv state
// replicated). Of the growth of the caches with the context, the K/V share halves while the pooled-key share stays:
// a decode token at position 2 reads 3 K/V rows and 0 pooled keys, at position 6 (block 0 complete, the indexer
// budget of 8 tokens not reached: every earlier token selected) 7 rows and 1 pooled key.
TEST(TpStepCost, CountsOneRanksShare) {
  Model& one = tp_model(kTinyA, 1);
  Model& two = tp_model(kTinyA, 2);
  const ModelConfig& c = one.config();
  ASSERT_EQ(c.indexer_budget, 8);
  ASSERT_EQ(c.indexer_compress_ratio, 4);
  const StepWork w1{1, 2}, w2{1, 6};
  const StepCost a1 = step_cost(one, {&w1, 1}, 1), b1 = step_cost(two, {&w1, 1}, 1);
  const StepCost a2 = step_cost(one, {&w2, 1}, 1), b2 = step_cost(two, {&w2, 1}, 1);
  EXPECT_GT(a1.host_bytes, 0);
  EXPECT_DOUBLE_EQ(b1.host_bytes, a1.host_bytes / 2);
  EXPECT_LT(b1.weight_bytes, a1.weight_bytes);
  EXPECT_LT(b1.flops, a1.flops);
  EXPECT_LT(b1.cache_bytes, a1.cache_bytes);
  EXPECT_GT(b1.cache_bytes, a1.cache_bytes / 2);
  const double qsa = double(c.num_layers_of(LayerKind::QSA));
  const double kv = qsa * 4.0 * 2.0 * double(c.num_key_value_heads) * double(c.head_dim) * 4.0;  // 4 more rows
  const double pooled = qsa * 1.0 * double(c.indexer_head_dim) * 4.0;                            // 1 more key
  EXPECT_DOUBLE_EQ(a2.cache_bytes - a1.cache_bytes, kv + pooled);
  EXPECT_DOUBLE_EQ(b2.cache_bytes - b1.cache_bytes, kv / 2 + pooled);
}

TEST(TpRandomModel, ShardShapesReplicatedWeightsAndAStep) {
  const ModelConfig cfg = load_config(source_path(kTinyA));
  ModelOptions one;
  one.threads = 2;
  const auto m1 = Model::random(cfg, one, 7);
  for (int tp : {2, 4}) {
    ModelOptions o;
    o.tp = tp;
    o.threads = 2;
    const auto m = Model::random(cfg, o, 7);
    ASSERT_EQ(m->tp(), tp);
    const TpPlan plan = TpPlan::make(cfg, tp);
    const ModelWeights &w = m->weights(), &w1 = m1->weights();
    EXPECT_EQ(w.embed_tokens.dim(0), plan.rank(0).vocab.size() + 1) << "rank 0's vocabulary rows and the zero row";
    for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
      const LayerWeights &a = w.layers[size_t(l)], &b = w1.layers[size_t(l)];
      EXPECT_EQ(values(a.moe.router), values(b.moe.router)) << "TP " << tp << " layer " << l;
      EXPECT_EQ(values(a.attn_hc.norm), values(b.attn_hc.norm)) << "TP " << tp << " layer " << l;
      EXPECT_EQ(values(a.mlp_hc.up), values(b.mlp_hc.up)) << "TP " << tp << " layer " << l;
      EXPECT_EQ(a.moe.shared_gate_proj.dim(0), plan.rank(0).shared_inter.size()) << "TP " << tp << " layer " << l;
      if (a.ple) {
        EXPECT_EQ(values(a.ple->key_proj), values(b.ple->key_proj)) << "TP " << tp << " layer " << l;
        EXPECT_EQ(a.ple->rows_held.size(), plan.ple_rows(0, a.ple->hash.rows).size());
      }
    }
    const std::vector<int32_t> ids{5, 17, 3, 250, 9, 1, 77};
    SequenceState s = m->new_sequence();
    const std::vector<float> logits = m->forward(s, ids, LogitsMode::Last);
    ASSERT_EQ(int64_t(logits.size()), cfg.vocab_size);
    for (float v : logits) ASSERT_TRUE(std::isfinite(v)) << "TP " << tp;
    const auto again = Model::random(cfg, o, 7);
    SequenceState s2 = again->new_sequence();
    EXPECT_EQ(again->forward(s2, ids, LogitsMode::Last), logits) << "TP " << tp << ": the same seed, another build";
  }
}

}  // namespace
}  // namespace flashnext::test
