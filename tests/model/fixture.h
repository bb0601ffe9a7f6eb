// Test helpers: the reference fixtures (tests/data/fixtures/*/reference.safetensors, written by transformers
// models/qwen4_exp in float32) and shared models.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "loader/safetensors.h"
#include "model/qwen4_exp/model.h"

namespace flashnext::test {

inline std::string source_path(const std::string& rel) {
  return std::string(FLASHNEXT_SOURCE_DIR) + "/" + rel;
}

/// Bounds of the CPU backend (float32) against transformers' float32 reference (issue 20): about 10x the largest
/// error measured over the fixture's prompts, so that a kernel error a few times today's fails. Measured 2026-12-01 on
/// this commit's CPU backend (printed by the tests as `[ tiny-a ]` / `[ tiny-b ]` / `[ batch ]` lines):
///   tiny-a logits 2.59e-6 (long; 0.30e-6 .. 1.47e-6 for the others; the batched prefill the same), hidden states
///   7.27e-6 (long); tiny-b logits 1.91e-6 (chat2, last 4 rows); tiny-a prefilled in chunks 3.01e-6 (long).
/// Before: 1e-3 for all three, 400x above the error.
/// The reference's own cache-vs-full drift (reference.json ref_cache_vs_full_max_abs_diff) is 0.9e-6 .. 1.7e-6 for
/// tiny-a and 1.3e-6 .. 8.9e-6 for tiny-b: the scale of "exact" for a float32 engine.
inline constexpr double kTinyALogitTol = 2.5e-5;
inline constexpr double kTinyAHiddenTol = 7e-5;
inline constexpr double kTinyBLogitTol = 2e-5;

/// reference.safetensors of one fixture.
class Reference {
 public:
  explicit Reference(const std::string& fixture)
      : file_(source_path("tests/data/fixtures/" + fixture + "/reference.safetensors")) {}
  /// A reference.safetensors at an explicit path (e.g. the medium fixture, made outside the repository).
  struct AtPath {
    std::string path;
  };
  explicit Reference(const AtPath& at) : file_(at.path) {}
  const TensorView& view(const std::string& name) const {
    auto it = file_.tensors().find(name);
    if (it == file_.tensors().end()) throw std::runtime_error("reference tensor missing: " + name);
    return it->second;
  }
  bool has(const std::string& name) const { return file_.tensors().count(name) > 0; }
  std::vector<float> f32(const std::string& name) const {
    const TensorView& v = view(name);
    std::vector<float> out(size_t(v.numel()));
    convert_to_float(v.dtype, v.data, out.data(), out.size());
    return out;
  }
  std::vector<int64_t> i64(const std::string& name) const {
    const TensorView& v = view(name);
    if (v.dtype != DType::I64) throw std::runtime_error("reference tensor not int64: " + name);
    std::vector<int64_t> out(size_t(v.numel()));
    std::memcpy(out.data(), v.data, out.size() * 8);
    return out;
  }
  std::vector<int32_t> ids(const std::string& prompt) const {
    auto v = i64(prompt + ".input_ids");
    return std::vector<int32_t>(v.begin(), v.end());
  }

 private:
  SafetensorsFile file_;
};

/// One model per (path, MTP layer loaded) for the whole test binary (loading is the slow part); CPU backend.
inline Model& shared_model(const std::string& rel_dir, bool load_mtp = false) {
  static std::map<std::pair<std::string, bool>, std::unique_ptr<Model>> models;
  auto& m = models[{rel_dir, load_mtp}];
  if (!m) {
    ModelOptions o;
    o.load_mtp = load_mtp;
    m = Model::load(source_path(rel_dir), o);
  }
  return *m;
}

/// Largest |x| of an array.
inline double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

/// Largest |a - b| over two equally long arrays.
inline double max_abs_diff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

inline int64_t argmax(const float* row, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (row[i] > row[best]) best = i;
  }
  return best;
}

/// Top-1 minus top-2 of one logits row (how near a tie its argmax is).
inline double top2_gap(const float* row, int64_t n) {
  float a = -INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (row[i] > a) {
      b = a;
      a = row[i];
    } else if (row[i] > b) {
      b = row[i];
    }
  }
  return double(a) - double(b);
}

/// All logits [T * vocab] of `ids` fed to a fresh sequence in chunks of at most `chunk` tokens; `seq` (if given)
/// receives the sequence afterwards.
inline std::vector<float> forward_in_chunks(Model& model, const std::vector<int32_t>& ids, int64_t chunk,
                                            SequenceState* seq_out = nullptr) {
  SequenceState seq = model.new_sequence();
  std::vector<float> got;
  const int64_t T = int64_t(ids.size());
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = std::min(chunk, T - t0);
    const auto part = model.forward(seq, std::span<const int32_t>(ids.data() + t0, size_t(n)));
    got.insert(got.end(), part.begin(), part.end());
  }
  if (seq_out) *seq_out = std::move(seq);
  return got;
}

/// Greedy decode: prefill `prompt` then feed back the argmax `steps` times; returns the chosen ids.
inline std::vector<int64_t> greedy(Model& model, const std::vector<int32_t>& prompt, int steps) {
  SequenceState seq = model.new_sequence();
  const int64_t V = model.config().vocab_size;
  std::vector<float> logits = model.forward(seq, prompt, LogitsMode::Last);
  std::vector<int64_t> out;
  for (int s = 0; s < steps; ++s) {
    const int32_t next = int32_t(argmax(logits.data(), V));
    out.push_back(next);
    if (s + 1 < steps) logits = model.forward(seq, std::span<const int32_t>(&next, 1), LogitsMode::Last);
  }
  return out;
}

/// A verify forward of `ids` after what `seq` holds, keeping its state inputs (BatchItem::keep_inputs).
inline StateInputs verify_keeping(Model& m, SequenceState& seq, const std::vector<int32_t>& ids) {
  StateInputs kept;
  const BatchItem item{&seq, ids, LogitsMode::All, &kept};
  m.forward_batch({&item, 1});
  return kept;
}

/// The two ways to the state after the first `keep` tokens of `verify` fed after `prompt`: {replayed, fed}. Replayed:
/// a verify forward of all of `verify` that keeps its state inputs, the state from before it put back, and `keep`
/// tokens replayed (Model::replay_state); fed: the `keep` tokens fed as one forward.
inline std::pair<SequenceState, SequenceState> replayed_and_fed(Model& m, const std::vector<int32_t>& prompt,
                                                                const std::vector<int32_t>& verify, int64_t keep) {
  SequenceState a = m.new_sequence();
  m.forward(a, prompt, LogitsMode::Last);
  const Model::StateSnapshot before = m.snapshot_state(a);
  const StateInputs kept = verify_keeping(m, a, verify);
  EXPECT_TRUE(kept.kept());
  EXPECT_EQ(kept.start, int64_t(prompt.size()));
  EXPECT_EQ(kept.ids, verify);
  m.restore_state(a, before);
  m.replay_state(a, kept, keep);
  SequenceState b = m.new_sequence();
  m.forward(b, prompt, LogitsMode::Last);
  m.forward(b, std::span<const int32_t>(verify.data(), size_t(keep)), LogitsMode::Last);
  return {std::move(a), std::move(b)};
}

/// Every per-sequence state tensor of `s` (each rank's slot: GDN conv and recurrent, PLE conv), on the host.
inline std::vector<std::vector<float>> state_tensors(const Model& m, const SequenceState& s) {
  const Model::StateSnapshot snap = m.snapshot_state(s);  // alive while its tensors are read
  std::vector<std::vector<float>> out;
  for (const std::vector<Tensor>& rank : snap.tensors)
    for (const Tensor& t : rank) out.push_back(m.download(t));
  return out;
}

}  // namespace flashnext::test
