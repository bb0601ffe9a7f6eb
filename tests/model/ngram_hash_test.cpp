// PLE hash parameters (src/ple/ngram_hash) against the buffers the reference stored in the fixture checkpoints
// (`ple.ple_embedding.{layer_multipliers, ngram_heads_vocab_sizes, ngram_heads_offsets}`), for every PLE layer.
#include "ple/ngram_hash.h"

#include <gtest/gtest.h>

#include "fixture.h"
#include "loader/config.h"

namespace flashnext::test {
namespace {

std::vector<int64_t> i64(const Checkpoint& ck, const std::string& name) {
  const TensorView& v = ck.get(name);
  EXPECT_EQ(v.dtype, DType::I64) << name;
  std::vector<int64_t> out(size_t(v.numel()));
  std::memcpy(out.data(), v.data, out.size() * 8);
  return out;
}

void check_model(const std::string& dir) {
  const ModelConfig cfg = load_config(source_path(dir));
  const Checkpoint ck(source_path(dir));
  ASSERT_FALSE(cfg.ple_layer_ids.empty());
  for (size_t m = 0; m < cfg.ple_layer_ids.size(); ++m) {
    const std::string p = fmt::format("model.language_model.layers.{}.ple.ple_embedding.", cfg.ple_layer_ids[m] - 1);
    const NgramHashParams h = ngram_hash_params(cfg, int(m));
    EXPECT_EQ(h.multipliers, i64(ck, p + "layer_multipliers")) << dir << " PLE layer " << m;
    EXPECT_EQ(h.moduli, i64(ck, p + "ngram_heads_vocab_sizes")) << dir << " PLE layer " << m;
    EXPECT_EQ(h.offsets, i64(ck, p + "ngram_heads_offsets")) << dir << " PLE layer " << m;
    // The table height is the padded row count.
    int64_t rows = 0;
    for (int64_t k = 0;; ++k) {
      const TensorView* s = ck.find(p + fmt::format("ngram_embedding.shard_{}.weight", k));
      if (!s) break;
      rows += s->shape[0];
    }
    EXPECT_EQ(rows, h.rows) << dir << " PLE layer " << m;
  }
}

TEST(NgramHash, TinyAParamsEqualStoredBuffers) {
  check_model("tests/data/fixtures/tiny-a/model");
}
TEST(NgramHash, TinyBParamsEqualStoredBuffers) {
  check_model("models/tiny-b-random");
}

// Boundary rules by hand for ngram_size 3 (tok_1 = previous token, tok_2 = the one before), boundary token B:
// a boundary strictly before t cuts the context; t itself may be B and still sees its predecessors.
TEST(NgramHash, BoundaryRules) {
  const ModelConfig cfg = load_config(source_path("tests/data/fixtures/tiny-a/model"));
  const NgramHashParams h = ngram_hash_params(cfg, 0);
  const int64_t B = h.boundary_token, H = h.heads();
  // Expected row of head i for the n-gram (t0, t1, t2) with n = 2 (heads 0..1) or 3 (heads 2..3).
  auto row = [&](int64_t i, int64_t t0, int64_t t1, int64_t t2) {
    const int64_t n = i < h.heads_per_ngram ? 2 : 3;
    uint64_t mix = uint64_t(t0) * uint64_t(h.multipliers[0]) ^ uint64_t(t1) * uint64_t(h.multipliers[1]);
    if (n == 3) mix ^= uint64_t(t2) * uint64_t(h.multipliers[2]);
    int64_t r = int64_t(mix) % h.moduli[size_t(i)];
    if (r < 0) r += h.moduli[size_t(i)];
    return h.offsets[size_t(i)] + r;
  };
  const std::vector<int64_t> history = {B, B};
  const std::vector<int64_t> ids = {5, 6, B, 7, 8};
  std::vector<int64_t> out(ids.size() * size_t(H));
  h.rows_for(history, ids, out.data());
  // Expected (tok_0, tok_1, tok_2) per position.
  const int64_t want[5][3] = {{5, B, B}, {6, 5, B}, {B, 6, 5}, {7, B, B}, {8, 7, B}};
  for (size_t t = 0; t < ids.size(); ++t) {
    for (int64_t i = 0; i < H; ++i) {
      EXPECT_EQ(out[t * size_t(H) + size_t(i)], row(i, want[t][0], want[t][1], want[t][2]))
          << "t " << t << " head " << i;
    }
  }
}

}  // namespace
}  // namespace flashnext::test
