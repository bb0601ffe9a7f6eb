// Batched steps (Model::forward_batch): several sequences of different lengths in one step, prefill chunks and decode
// tokens mixed, in one paged cache pool with scrambled blocks, give each sequence what it gets alone.
#include <gtest/gtest.h>

#include "batched_greedy.h"
#include "core/error.h"
#include "fixture.h"

namespace flashnext::test {
namespace {

constexpr const char* kTinyA = "tests/data/fixtures/tiny-a/model";

// The batch test: 8 sequences of different lengths in one step give the same tokens as each alone.
TEST(BatchedSteps, EightSequencesGenerateWhatEachGeneratesAlone) {
  Model& model = shared_model(kTinyA);
  const auto prompts = tiny_a_batch_prompts();
  BatchPlan plan;
  plan.block_size = 16;
  plan.chunk = 40;                        // the 300- and 150-token prompts prefill over several steps ...
  plan.start = {0, 0, 1, 2, 0, 3, 1, 0};  // ... while others already decode
  const auto together = batched_greedy(model, prompts, 8, plan);
  ASSERT_EQ(together.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    BatchPlan solo = plan;
    solo.start.clear();
    const auto alone = batched_greedy(model, {prompts[i]}, 8, solo);
    EXPECT_EQ(together[i], alone[0]) << "prompt " << i << " (" << prompts[i].size() << " tokens)";
  }
  // Anchored to the reference: the five whole fixture prompts (1 to 300 tokens) give transformers' greedy ids.
  EXPECT_EQ(expect_prefix_of_reference(together, tiny_a_batch_reference_greedy()), 5);
}

// One batched prefill step: every sequence's logits equal those of its own forward (private cache, whole prompt).
TEST(BatchedSteps, BatchedPrefillLogitsEqualSingleSequenceLogits) {
  Model& model = shared_model(kTinyA);
  const auto prompts = tiny_a_batch_prompts();
  const int64_t V = model.config().vocab_size, bs = 8;
  int64_t blocks = 0;
  for (const auto& p : prompts) blocks += (int64_t(p.size()) + bs - 1) / bs;
  auto cache = model.new_cache(blocks, bs, int64_t(prompts.size()));
  std::vector<SequenceState> seqs;
  std::vector<BatchItem> items;
  int32_t next_block = int32_t(blocks);
  for (size_t i = 0; i < prompts.size(); ++i) {
    seqs.push_back(model.new_sequence(cache, int32_t(i)));
    for (int64_t b = 0; b < (int64_t(prompts[i].size()) + bs - 1) / bs; ++b)
      seqs.back().block_table.push_back(--next_block);
  }
  for (size_t i = 0; i < prompts.size(); ++i) items.push_back({&seqs[i], prompts[i], LogitsMode::All});
  std::vector<int64_t> rows;
  const auto got = model.download(model.forward_batch(items, &rows));
  for (size_t i = 0; i < prompts.size(); ++i) {
    SequenceState alone = model.new_sequence();
    const auto want = model.forward(alone, prompts[i]);
    ASSERT_EQ(want.size(), prompts[i].size() * size_t(V));
    EXPECT_LE(max_abs_diff(got.data() + rows[i] * V, want.data(), want.size()), 1e-5) << "prompt " << i;
    EXPECT_EQ(seqs[i].length, int64_t(prompts[i].size()));
  }
  // Anchored to the reference: the rows of the five whole fixture prompts are transformers' logits.
  Reference ref("tiny-a");
  const char* names[] = {"short", "eos_inside", "long", "single", "eos_first"};
  for (size_t i = 0; i < 5; ++i) {
    const auto want = ref.f32(std::string(names[i]) + ".logits");
    ASSERT_EQ(want.size(), prompts[i].size() * size_t(V)) << names[i];
    const double err = max_abs_diff(got.data() + rows[i] * V, want.data(), want.size());
    std::printf("[ batch    ] tiny-a %-10s batched prefill max |logit - reference| = %.3g (bound %.2g)\n", names[i],
                err, kTinyALogitTol);
    EXPECT_LE(err, kTinyALogitTol) << names[i];
  }
}

// The reference's greedy ids come out of a batched run too (tiny-a: 16 greedy tokens per prompt).
TEST(BatchedSteps, BatchedGreedyMatchesReference) {
  expect_tiny_a_batched_greedy_matches_reference(shared_model(kTinyA));
}

TEST(BatchedSteps, BadBatchesAreRejectedAndLeaveSequencesUnchanged) {
  Model& model = shared_model(kTinyA);
  auto cache = model.new_cache(8, 16, 2);
  SequenceState a = model.new_sequence(cache, 0), b = model.new_sequence(cache, 1);
  a.block_table = {0};
  b.block_table = {1};
  const std::vector<int32_t> ids = {1, 2, 3};
  const auto history_a = a.ple_history, history_b = b.ple_history;
  // The same sequence twice, and two sequences in one slot.
  SequenceState twin = model.new_sequence(cache, 1);
  twin.block_table = {2};
  EXPECT_THROW(model.forward_batch(std::vector<BatchItem>{{&b, ids}, {&twin, ids}}), Error);
  EXPECT_THROW(model.forward_batch(std::vector<BatchItem>{{&a, ids}, {&a, ids}}), Error);
  // A block table that does not cover the new tokens (17 positions need 2 blocks of 16).
  const std::vector<int32_t> long_ids(17, 5);
  try {
    model.forward_batch(std::vector<BatchItem>{{&a, ids}, {&b, long_ids}});
    ADD_FAILURE() << "a short block table was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("item 1"), std::string::npos) << e.what();
  }
  // A token outside the vocabulary: the error names the item.
  const std::vector<int32_t> bad = {int32_t(model.config().vocab_size)};
  try {
    model.forward_batch(std::vector<BatchItem>{{&a, ids}, {&b, bad}});
    ADD_FAILURE() << "a bad token id was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("item 1"), std::string::npos) << e.what();
  }
  // A block id outside the pool.
  b.block_table = {99};
  EXPECT_THROW(model.forward_batch(std::vector<BatchItem>{{&b, ids}}), Error);
  // Sequences of different pools, and a private-cache sequence in a batch.
  auto other = model.new_cache(1, 16, 1);
  SequenceState c = model.new_sequence(other, 0);
  c.block_table = {0};
  b.block_table = {1};
  EXPECT_THROW(model.forward_batch(std::vector<BatchItem>{{&a, ids}, {&c, ids}}), Error);
  SequenceState p = model.new_sequence();
  EXPECT_THROW(model.forward_batch(std::vector<BatchItem>{{&a, ids}, {&p, ids}}), Error);
  // A slot outside the pool.
  EXPECT_THROW(model.new_sequence(cache, 2), Error);
  // A KV block size that is not a multiple of the indexer block (indexer_compress_ratio 4).
  try {
    model.new_cache(8, 6, 1);
    ADD_FAILURE() << "a block size of 6 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("indexer_compress_ratio = 4"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a.length, 0);
  EXPECT_EQ(b.length, 0);
  EXPECT_EQ(a.ple_history, history_a);
  EXPECT_EQ(b.ple_history, history_b);
  // After all that, a valid batch still runs.
  const auto logits = model.forward_batch(std::vector<BatchItem>{{&a, ids}, {&b, ids}});
  EXPECT_EQ(logits.dim(0), 2);
  EXPECT_EQ(a.length, 3);
}

}  // namespace
}  // namespace flashnext::test
