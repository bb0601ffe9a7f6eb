// Test helper: greedy decoding of several prompts in batched steps (Model::forward_batch over one paged cache pool),
// shared by the CPU batch test and the CUDA end-to-end batch test.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "fixture.h"
#include "model/qwen4_exp/model.h"

namespace flashnext::test {

/// How batched_greedy schedules its sequences.
struct BatchPlan {
  int64_t block_size = 16;  ///< positions per KV block
  int64_t chunk = 1 << 30;  ///< longest prefill chunk fed in one step
  std::vector<int> start;   ///< step at which each prompt joins (empty: all at step 0)
};

/// The ids each prompt generates greedily (`steps` of them) when all prompts run together: one forward_batch per
/// step; a prompt joins at plan.start[i], is prefilled in chunks of at most plan.chunk tokens, then decodes one token
/// per step, so prefill and decode mix in one step. KV blocks are handed out in a scrambled order and slots in
/// reverse, so no sequence's cache is contiguous. With one prompt it is the same schedule for that prompt alone.
inline std::vector<std::vector<int64_t>> batched_greedy(Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                                        int steps, const BatchPlan& plan) {
  const size_t n = prompts.size();
  const int64_t V = model.config().vocab_size, bs = plan.block_size;
  int64_t blocks = 0;
  for (const auto& p : prompts) blocks += (int64_t(p.size()) + steps + bs - 1) / bs;
  std::vector<int32_t> free_blocks(static_cast<size_t>(blocks));
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  for (size_t i = 0; i < free_blocks.size(); ++i)  // a fixed scramble: stride 7 through the ids
    std::swap(free_blocks[i], free_blocks[(i * 7 + 3) % free_blocks.size()]);
  auto cache = model.new_cache(blocks, bs, int64_t(n) + 1);
  std::vector<SequenceState> seqs;
  for (size_t i = 0; i < n; ++i) seqs.push_back(model.new_sequence(cache, int32_t(n - i)));
  std::vector<std::vector<int64_t>> out(n);
  std::vector<size_t> fed(n, 0);
  for (int step = 0;; ++step) {
    std::vector<BatchItem> items;
    std::vector<size_t> who;
    std::vector<int32_t> last(n);
    for (size_t i = 0; i < n; ++i) {
      if (int(out[i].size()) == steps || (!plan.start.empty() && plan.start[i] > step)) continue;
      std::span<const int32_t> ids;
      if (fed[i] < prompts[i].size()) {
        const size_t len = std::min<size_t>(size_t(plan.chunk), prompts[i].size() - fed[i]);
        ids = std::span<const int32_t>(prompts[i].data() + fed[i], len);
        fed[i] += len;
      } else {
        last[i] = int32_t(out[i].back());
        ids = std::span<const int32_t>(&last[i], 1);
      }
      SequenceState& s = seqs[i];
      while (int64_t(s.block_table.size()) * bs < s.length + int64_t(ids.size())) {
        s.block_table.push_back(free_blocks.back());
        free_blocks.pop_back();
      }
      items.push_back({&s, ids, LogitsMode::Last});
      who.push_back(i);
    }
    if (items.empty()) break;
    std::vector<int64_t> rows;
    const std::vector<float> logits = model.download(model.forward_batch(items, &rows));
    for (size_t k = 0; k < who.size(); ++k) {
      const size_t i = who[k];
      if (fed[i] == prompts[i].size()) out[i].push_back(argmax(logits.data() + rows[k] * V, V));
    }
  }
  return out;
}

/// Eight prompts of different lengths (1 to 300 tokens) from the tiny-a fixture's prompts.
inline std::vector<std::vector<int32_t>> tiny_a_batch_prompts() {
  Reference ref("tiny-a");
  std::vector<std::vector<int32_t>> prompts;
  for (const char* p : {"short", "eos_inside", "long", "single", "eos_first"}) prompts.push_back(ref.ids(p));
  const auto long_ids = ref.ids("long");
  prompts.emplace_back(long_ids.begin() + 7, long_ids.begin() + 157);  // 150 tokens
  prompts.emplace_back(long_ids.begin(), long_ids.begin() + 64);
  prompts.emplace_back(long_ids.begin() + 200, long_ids.begin() + 205);
  return prompts;
}

/// For each prompt of tiny_a_batch_prompts(), the reference's greedy ids (P.greedy_ids: 16 tokens, 6 for "long")
/// where the prompt is a whole fixture prompt, and an empty list for the prompts cut from "long".
inline std::vector<std::vector<int64_t>> tiny_a_batch_reference_greedy() {
  Reference ref("tiny-a");
  std::vector<std::vector<int64_t>> want;
  for (const char* p : {"short", "eos_inside", "long", "single", "eos_first"})
    want.push_back(ref.i64(std::string(p) + ".greedy_ids"));
  want.resize(tiny_a_batch_prompts().size());
  return want;
}

/// Expects the first ids of `got[i]` to be the reference's greedy ids `want[i]` (as many as both have) for every
/// prompt that has reference ids; returns how many prompts were compared.
inline int expect_prefix_of_reference(const std::vector<std::vector<int64_t>>& got,
                                      const std::vector<std::vector<int64_t>>& want) {
  int compared = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    if (want[i].empty()) continue;
    const size_t n = std::min(got[i].size(), want[i].size());
    EXPECT_GE(n, size_t(1)) << "prompt " << i;
    EXPECT_EQ(std::vector<int64_t>(got[i].begin(), got[i].begin() + ptrdiff_t(n)),
              std::vector<int64_t>(want[i].begin(), want[i].begin() + ptrdiff_t(n)))
        << "prompt " << i << ": the batched greedy ids are not the reference's";
    ++compared;
  }
  return compared;
}

/// Runs the tiny-a prompts that have 16 reference greedy ids (all but the 300-token one) through batched_greedy
/// together (blocks of 4 positions, chunks of 7, joining one step apart) and expects the reference's ids.
inline void expect_tiny_a_batched_greedy_matches_reference(Model& model) {
  Reference ref("tiny-a");
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int64_t>> want;
  for (const char* p : {"short", "eos_inside", "single", "eos_first"}) {
    prompts.push_back(ref.ids(p));
    want.push_back(ref.i64(std::string(p) + ".greedy_ids"));
  }
  const auto got = batched_greedy(model, prompts, 16, BatchPlan{.block_size = 4, .chunk = 7, .start = {0, 1, 2, 3}});
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], want[i]) << "prompt " << i;
}

}  // namespace flashnext::test
