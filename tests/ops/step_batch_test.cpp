// The step metadata (ops/step_batch.h): plan_step_batch's words, the context bucket of recorded decode steps, and
// bind_step_batch's views of a larger upload (Tensor::bytes_as), on the CPU backend. Expected values are written out
// from the layout the header documents.
#include "ops/step_batch.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ops/ops.h"

namespace flashnext {
namespace {

std::vector<int32_t> ints(Ops& ops, const Tensor& t) {
  std::vector<int32_t> v(size_t(t.numel()));
  ops.download(t, v.data());
  return v;
}

// Two sequences, block size 4: a prefill chunk of 3 tokens at positions 5..7 (blocks 9, 2) and one decode token at
// position 0 (block 6); block tables longer than needed are cut to the blocks that the step's positions reach.
const std::vector<int32_t> kTable0 = {9, 2, 11}, kTable1 = {6, 3};
std::vector<StepSequence> two_sequences() {
  return {StepSequence{3, 5, 4, kTable0}, StepSequence{1, 0, 1, kTable1}};
}

TEST(StepBatch, PlanWordsFollowTheLayout) {
  StepBatch b;
  const std::vector<int32_t> words = plan_step_batch(b, two_sequences(), 4);
  EXPECT_EQ(b.num_seqs, 2);
  EXPECT_EQ(b.num_tokens, 4);
  EXPECT_EQ(b.max_context, 8);
  EXPECT_EQ(b.max_blocks, 2);
  const std::vector<int32_t> want = {
      5,         6,         7,         0,          // positions
      0,         0,         0,         1,          // token_seq
      2 * 4 + 1, 2 * 4 + 2, 2 * 4 + 3, 6 * 4 + 0,  // slot_mapping: table[p / 4] * 4 + p % 4
      9,         2,         6,         -1,         // block_tables [2, 2], -1 past a table's needed blocks
      0,         3,         4,                     // seq_starts
      4,         1};                               // slots
  EXPECT_EQ(words, want);
}

TEST(StepBatch, ContextBucketRoundsMaxContextAndWidensTheTables) {
  StepBatch b;
  const std::vector<int32_t> words = plan_step_batch(b, two_sequences(), 4, 16);
  EXPECT_EQ(b.max_context, 16);  // 8 rounded up to the bucket
  EXPECT_EQ(b.max_blocks, 4);    // the blocks of 16 positions
  const std::vector<int32_t> want = {5, 6, 7, 0, 0, 0, 0, 1, 9, 10, 11, 24, 9, 2, -1, -1, 6, -1, -1, -1,  // stride 4
                                     0, 3, 4, 4, 1};
  EXPECT_EQ(words, want);
  // A bucket the context already fills leaves it as it is.
  StepBatch c;
  (void)plan_step_batch(c, two_sequences(), 4, 8);
  EXPECT_EQ(c.max_context, 8);
  EXPECT_EQ(c.max_blocks, 2);
  EXPECT_THROW(plan_step_batch(c, two_sequences(), 4, -1), Error);
}

TEST(StepBatch, BindViewsASectionOfOneUpload) {
  auto ops = make_cpu_ops();
  StepBatch b;
  const std::vector<int32_t> words = plan_step_batch(b, two_sequences(), 4);
  // The words after 8 bytes of something else, as a step's one byte buffer holds them.
  std::vector<uint8_t> bytes(8 + words.size() * 4 + 8, 0xee);
  std::memcpy(bytes.data() + 8, words.data(), words.size() * 4);
  const Tensor all = ops->upload(bytes.data(), DType::U8, {int64_t(bytes.size())});
  bind_step_batch(b, all.bytes_as(8, DType::I32, {int64_t(words.size())}));
  EXPECT_EQ(ints(*ops, b.positions), (std::vector<int32_t>{5, 6, 7, 0}));
  EXPECT_EQ(ints(*ops, b.slot_mapping), (std::vector<int32_t>{9, 10, 11, 24}));
  EXPECT_EQ(b.block_tables.shape(), (Shape{2, 2}));
  EXPECT_EQ(ints(*ops, b.block_tables), (std::vector<int32_t>{9, 2, 6, -1}));
  EXPECT_EQ(ints(*ops, b.slots), (std::vector<int32_t>{4, 1}));
  // Too few words for the step: an error naming them.
  try {
    bind_step_batch(b, all.bytes_as(8, DType::I32, {int64_t(words.size()) - 1}));
    ADD_FAILURE() << "a short metadata buffer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("metadata words"), std::string::npos) << e.what();
  }
}

TEST(StepBatch, BytesAsChecksRangeAndAlignment) {
  auto ops = make_cpu_ops();
  const std::vector<int64_t> v = {7, -3};
  std::vector<uint8_t> bytes(24, 0);
  std::memcpy(bytes.data() + 8, v.data(), 16);
  const Tensor t = ops->upload(bytes.data(), DType::U8, {24});
  const Tensor w = t.bytes_as(8, DType::I64, {2});
  std::vector<int64_t> got(2);
  ops->download(w, got.data());
  EXPECT_EQ(got, v);
  EXPECT_EQ(w.data(), static_cast<uint8_t*>(t.data()) + 8);
  EXPECT_THROW(t.bytes_as(16, DType::I64, {2}), Error);  // past the end
  EXPECT_THROW(t.bytes_as(6, DType::I32, {1}), Error);   // misaligned
  EXPECT_THROW(t.bytes_as(-4, DType::I32, {1}), Error);  // before the start
  EXPECT_NO_THROW(t.bytes_as(16, DType::I32, {2}));      // up to the end
}

}  // namespace
}  // namespace flashnext
