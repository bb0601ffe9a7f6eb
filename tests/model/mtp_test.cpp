// The MTP layer (mtp.*) on the tiny-mtp fixture against the PyTorch reference of tools/make_mtp_fixture.py (the
// SGLang / vLLM wiring on top of transformers' modules), and the state snapshot / restore behind speculative
// rollback.
#include <gtest/gtest.h>

#include <cstdio>

#include "core/error.h"
#include "engine/speculative.h"
#include "fixture.h"

namespace flashnext::test {
namespace {

constexpr const char* kMtpModel = "tests/data/fixtures/tiny-mtp/model";
/// Bound of the MTP logits against the PyTorch reference. Issue 21 asks for 1e-3; measured 2026-12-02 on the CPU
/// backend: 1.56e-6 (prompt rows), 0.54e-6 (chained drafts), printed as `[ mtp ]`; the bound is ~15x that, the
/// same margin as kTinyALogitTol.
constexpr double kMtpLogitTol = 2.5e-5;

Model& mtp_model() {
  static std::unique_ptr<Model> m = [] {
    ModelOptions o;
    o.load_mtp = true;
    return Model::load(source_path(kMtpModel), o);
  }();
  return *m;
}

std::vector<int32_t> as_i32(const std::vector<int64_t>& v) {
  return {v.begin(), v.end()};
}

TEST(Mtp, LogitsMatchTheReference) {
  Reference ref("tiny-mtp");
  Model& model = mtp_model();
  ASSERT_TRUE(model.has_mtp());
  const auto ids = ref.ids("prompt");
  const auto next = as_i32(ref.i64("prompt.next_ids"));
  const int64_t T = int64_t(ids.size()), V = model.config().vocab_size, W = model.config().hc_width();
  SequenceState seq = model.new_sequence();
  Tensor wide;
  const BatchItem item{&seq, ids, LogitsMode::All};
  const std::vector<float> trunk = model.download(model.forward_batch({&item, 1}, nullptr, {}, &wide));
  ASSERT_EQ(wide.shape(), (Shape{T, W}));
  const double trunk_err = max_abs_diff(trunk.data(), ref.f32("prompt.trunk_logits").data(), trunk.size());
  const std::vector<float> wide_host = model.download(wide);
  const double wide_err = max_abs_diff(wide_host.data(), ref.f32("prompt.trunk_wide").data(), wide_host.size());
  EXPECT_LE(trunk_err, kTinyALogitTol);
  EXPECT_LE(wide_err, kTinyAHiddenTol);
  // The trunk's choice at the last position is the reference's next id there.
  EXPECT_EQ(argmax(trunk.data() + (T - 1) * V, V), next.back());

  Model::MtpOutput out = model.mtp_forward(seq, wide, next, LogitsMode::All);
  EXPECT_EQ(seq.mtp_length, T);
  const std::vector<float> got = model.download(out.logits), want = ref.f32("prompt.mtp_logits");
  ASSERT_EQ(got.size(), size_t(T * V));
  const double mtp_err = max_abs_diff(got.data(), want.data(), got.size());
  EXPECT_LE(mtp_err, kMtpLogitTol);

  // Chained drafts: the MTP layer's own pre-mixer state of the last row and the reference's draft token feed the
  // next position (its K/V cached from the rows before).
  const auto drafts = as_i32(ref.i64("draft.ids"));
  const std::vector<float> draft_logits = ref.f32("draft.logits");
  double draft_err = max_abs_diff(got.data() + (T - 1) * V, draft_logits.data(), size_t(V));
  Tensor state = out.wide.rows(T - 1, T);
  for (size_t k = 1; k < drafts.size(); ++k) {
    Model::MtpOutput d = model.mtp_forward(seq, state, {&drafts[k - 1], 1});
    const std::vector<float> row = model.download(d.logits);
    const float* want_row = draft_logits.data() + int64_t(k) * V;
    draft_err = std::max(draft_err, max_abs_diff(row.data(), want_row, size_t(V)));
    if (top2_gap(want_row, V) > 2 * kMtpLogitTol) {
      EXPECT_EQ(argmax(row.data(), V), drafts[k]) << "draft " << k;
    }
    state = d.wide;
  }
  EXPECT_LE(draft_err, kMtpLogitTol);
  std::printf("[ mtp ] trunk logits %.3g, pre-mixer wide %.3g, MTP logits %.3g, chained drafts %.3g\n", trunk_err,
              wide_err, mtp_err, draft_err);
}

// The MTP layer fed in chunks (its K/V and indexer keys cached between calls) equals one call over all rows.
TEST(Mtp, ChunkedEqualsWhole) {
  Reference ref("tiny-mtp");
  Model& model = mtp_model();
  const auto ids = ref.ids("prompt");
  const auto next = as_i32(ref.i64("prompt.next_ids"));
  const int64_t T = int64_t(ids.size()), V = model.config().vocab_size;
  SequenceState seq = model.new_sequence();
  Tensor wide;
  const BatchItem item{&seq, ids, LogitsMode::Last};
  model.forward_batch({&item, 1}, nullptr, {}, &wide);
  const std::vector<float> whole = model.download(model.mtp_forward(seq, wide, next).logits);
  seq.mtp_length = 0;  // the same positions again: the cache entries are overwritten
  std::vector<float> chunked;
  for (int64_t a = 0; a < T; a += 13) {
    const int64_t b = std::min(T, a + 13);
    const auto part = model.download(
        model.mtp_forward(seq, wide.rows(a, b), std::span<const int32_t>(next.data() + a, size_t(b - a))).logits);
    chunked.insert(chunked.end(), part.begin(), part.end());
  }
  ASSERT_EQ(chunked.size(), size_t(T * V));
  EXPECT_LE(max_abs_diff(chunked.data(), whole.data(), whole.size()), 1e-5);
  EXPECT_LE(max_abs_diff(chunked.data(), ref.f32("prompt.mtp_logits").data(), whole.size()), kMtpLogitTol);
}

// The MTP layer over several sequences of one cache pool in one step (the batched drafts of a server step): each
// sequence's logits and pre-mixer rows equal its own mtp_forward's bit for bit (CPU), with mixed logits modes; the
// chained greedy drafts of chain_mtp_drafts_batch equal chain_mtp_drafts per sequence, with different draft counts;
// the items are checked before anything runs. At TP 1, 2 and 4 (the stacked hidden rows handed to every rank).
void expect_batched_equals_one_by_one(Model& model) {
  Reference ref("tiny-mtp");
  const auto prompt = ref.ids("prompt");
  const int64_t bs = 16;
  const std::vector<int64_t> lengths{9, 23, 1};
  const std::vector<LogitsMode> modes{LogitsMode::All, LogitsMode::Last, LogitsMode::Last};
  const std::vector<int> max_drafts{3, 1, 4};
  auto cache = model.new_cache(12, bs, 3);
  std::vector<SequenceState> pooled, alone;
  std::vector<std::vector<int32_t>> ids, next;
  std::vector<Tensor> wide_pooled, wide_alone;
  int32_t block = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t n = lengths[i];
    ids.emplace_back(prompt.begin() + int64_t(i) * 3, prompt.begin() + int64_t(i) * 3 + n);
    next.emplace_back(ids[i].begin() + 1, ids[i].end());
    next[i].push_back(int32_t(5 + i));
    pooled.push_back(model.new_sequence(cache, int32_t(i)));
    for (int64_t b = 0; b < 4; ++b) pooled[i].block_table.push_back(block++);
    alone.push_back(model.new_sequence());
    for (auto* v : {&pooled, &alone}) {
      Tensor w;
      const BatchItem item{&(*v)[i], ids[i], LogitsMode::Last};
      model.forward_batch({&item, 1}, nullptr, {}, &w);
      (v == &pooled ? wide_pooled : wide_alone).push_back(w);
    }
  }
  std::vector<Model::MtpItem> items;
  for (size_t i = 0; i < lengths.size(); ++i) items.push_back({&pooled[i], wide_pooled[i], next[i], modes[i]});
  const std::vector<Model::MtpOutput> batched = model.mtp_forward_batch(items);
  ASSERT_EQ(batched.size(), lengths.size());
  std::vector<Model::MtpOutput> one;
  for (size_t i = 0; i < lengths.size(); ++i) {
    one.push_back(model.mtp_forward(alone[i], wide_alone[i], next[i], modes[i]));
    EXPECT_EQ(pooled[i].mtp_length, lengths[i]);
    const auto got = model.download(batched[i].logits), want = model.download(one[i].logits);
    ASSERT_EQ(got.size(), want.size()) << "sequence " << i;
    EXPECT_EQ(max_abs_diff(got.data(), want.data(), got.size()), 0) << "sequence " << i;
    const auto gw = model.download(batched[i].wide), ww = model.download(one[i].wide);
    ASSERT_EQ(gw.size(), size_t(lengths[i] * model.config().hc_width()));
    EXPECT_EQ(max_abs_diff(gw.data(), ww.data(), gw.size()), 0) << "sequence " << i;
  }
  std::vector<SequenceState*> seqs;
  for (auto& s : pooled) seqs.push_back(&s);
  const auto drafts = chain_mtp_drafts_batch(model, seqs, batched, max_drafts);
  for (size_t i = 0; i < lengths.size(); ++i) {
    EXPECT_EQ(drafts[i], chain_mtp_drafts(model, alone[i], one[i], max_drafts[i])) << "sequence " << i;
    EXPECT_EQ(drafts[i].size(), size_t(max_drafts[i]));
    EXPECT_EQ(pooled[i].mtp_length, lengths[i]);  // put back: draft positions are overwritten later
  }
  // Checked before anything runs: the failing item is named, and no sequence moved.
  const std::vector<int32_t> bad{1, 99999};
  std::vector<Model::MtpItem> twice{items[1], items[1]},
      bad_item{items[1], {&pooled[0], wide_pooled[0].rows(0, 2), bad}};
  for (const auto& [list, text] : {std::pair{&twice, "mtp_forward_batch: item 1: the same sequence as item 0"},
                                   std::pair{&bad_item, "mtp_forward_batch: item 1: token id 99999"}}) {
    try {
      model.mtp_forward_batch(*list);
      ADD_FAILURE() << "no error; expected: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  }
  for (size_t i = 0; i < lengths.size(); ++i) EXPECT_EQ(pooled[i].mtp_length, lengths[i]);
}

TEST(Mtp, BatchedEqualsOneByOne) {
  expect_batched_equals_one_by_one(mtp_model());
  for (int tp : {2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    ModelOptions o;
    o.load_mtp = true;
    o.tp = tp;
    expect_batched_equals_one_by_one(*Model::load(source_path(kMtpModel), o));
  }
}

TEST(Mtp, BadUseFailsClearly) {
  Reference ref("tiny-mtp");
  Model& model = mtp_model();
  const auto ids = ref.ids("prompt");
  SequenceState seq = model.new_sequence();
  Tensor wide;
  const BatchItem item{&seq, ids, LogitsMode::Last};
  model.forward_batch({&item, 1}, nullptr, {}, &wide);
  const std::vector<int32_t> two{1, 2}, bad{1, 99999};
  auto expect_error = [](const std::function<void()>& f, const std::string& text) {
    try {
      f();
      ADD_FAILURE() << "no error; expected: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_error([&] { model.mtp_forward(seq, wide, two); }, "hidden must be F32");
  expect_error([&] { model.mtp_forward(seq, wide.rows(0, 2), bad); }, "outside the vocabulary");
  EXPECT_EQ(seq.mtp_length, 0);
  // Trunk only: the same checkpoint without load_mtp has no MTP layer and no extra cache layer.
  std::unique_ptr<Model> trunk = Model::load(source_path(kMtpModel));
  EXPECT_FALSE(trunk->has_mtp());
  SequenceState s2 = trunk->new_sequence();
  EXPECT_EQ(int64_t(s2.cache->ranks[0].size()), trunk->config().num_hidden_layers);
  expect_error([&] { trunk->mtp_forward(s2, wide.rows(0, 2), two); }, "MTP layer is not loaded");
  // A checkpoint without mtp.* tensors: the error names them, before the trunk loads.
  ModelOptions o;
  o.load_mtp = true;
  expect_error([&] { Model::load(source_path("tests/data/fixtures/tiny-a/model"), o); }, "no mtp.* tensors");
}

// The MTP layer over 2 and 4 tensor-parallel ranks (its attention heads and every expert's intermediate split as a
// trunk layer's, the hidden rows handed to every rank): TP 1's MTP logits up to the order of the row-parallel sums
// (the TP bound of the trunk, 1e-5 of the largest logit), the reference's within kMtpLogitTol, and the same chained
// drafts.
TEST(Mtp, TensorParallelMatchesTp1AndTheReference) {
  Reference ref("tiny-mtp");
  Model& one = mtp_model();
  const auto ids = ref.ids("prompt");
  const auto next = as_i32(ref.i64("prompt.next_ids"));
  const int64_t V = one.config().vocab_size;
  auto mtp_logits = [&](Model& model, std::vector<int32_t>* drafts) {
    SequenceState seq = model.new_sequence();
    Tensor wide;
    const BatchItem item{&seq, ids, LogitsMode::All};
    model.forward_batch({&item, 1}, nullptr, {}, &wide);
    Model::MtpOutput out = model.mtp_forward(seq, wide, next, LogitsMode::All);
    std::vector<float> logits = model.download(out.logits);
    // Three greedy drafts chained from the last row.
    Tensor state = out.wide.rows(int64_t(ids.size()) - 1, int64_t(ids.size()));
    int32_t d = int32_t(argmax(logits.data() + (int64_t(ids.size()) - 1) * V, V));
    for (int k = 0; k < 3; ++k) {
      drafts->push_back(d);
      Model::MtpOutput o = model.mtp_forward(seq, state, {&d, 1});
      const std::vector<float> row = model.download(o.logits);
      logits.insert(logits.end(), row.begin(), row.end());
      d = int32_t(argmax(row.data(), V));
      state = o.wide;
    }
    return logits;
  };
  std::vector<int32_t> want_drafts;
  const std::vector<float> want = mtp_logits(one, &want_drafts);
  for (int tp : {2, 4}) {
    ModelOptions o;
    o.load_mtp = true;
    o.tp = tp;
    std::unique_ptr<Model> model = Model::load(source_path(kMtpModel), o);
    ASSERT_TRUE(model->has_mtp());
    std::vector<int32_t> drafts;
    const std::vector<float> got = mtp_logits(*model, &drafts);
    ASSERT_EQ(got.size(), want.size());
    const double rel = max_abs_diff(got.data(), want.data(), got.size()) / max_abs(want);
    const double ref_err = max_abs_diff(got.data(), ref.f32("prompt.mtp_logits").data(), ids.size() * size_t(V));
    std::printf("[ mtp ] tp %d: |MTP - TP1| / max|TP1| %.3g, prompt rows against the reference %.3g\n", tp, rel,
                ref_err);
    EXPECT_LE(rel, 1e-5) << "tp " << tp;
    EXPECT_LE(ref_err, kMtpLogitTol) << "tp " << tp;
    EXPECT_EQ(drafts, want_drafts) << "tp " << tp;
  }
}

// Snapshot, a detour of other tokens, restore, then the real tokens: the same logits, bit for bit, as feeding the
// real tokens directly (the KV written by the detour is overwritten; the recurrent state comes back).
TEST(Mtp, SnapshotRestoreUndoesADetour) {
  for (const char* dir : {kMtpModel, "tests/data/fixtures/tiny-a/model"}) {
    SCOPED_TRACE(dir);
    Model& model = shared_model(dir);
    const int64_t V = model.config().vocab_size;
    std::vector<int32_t> prompt;
    for (int i = 0; i < 23; ++i) prompt.push_back(int32_t((i * 37 + 11) % 400));
    const std::vector<int32_t> real{5, 77, 300, 12, 9, 41}, detour{100, 101, 102, 103, 104, 105, 106};
    SequenceState a = model.new_sequence(), b = model.new_sequence();
    model.forward(a, prompt, LogitsMode::Last);
    model.forward(b, prompt, LogitsMode::Last);
    const std::vector<float> direct = model.forward(a, real);
    const Model::StateSnapshot snap = model.snapshot_state(b);
    model.forward(b, detour);
    model.restore_state(b, snap);
    EXPECT_EQ(b.length, int64_t(prompt.size()));
    const std::vector<float> after = model.forward(b, real);
    ASSERT_EQ(after.size(), real.size() * size_t(V));
    EXPECT_EQ(max_abs_diff(after.data(), direct.data(), direct.size()), 0.0);
  }
}

}  // namespace
}  // namespace flashnext::test
