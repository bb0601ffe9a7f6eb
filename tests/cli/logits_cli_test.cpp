// `flashnext logits` end to end: the .npy it writes and the greedy ids it prints, against the tiny-a reference
// (tests/data/fixtures/tiny-a/reference.safetensors, transformers float32).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/npy.h"
#include "loader/safetensors.h"

namespace {

using namespace flashnext;

// max |logit - reference| of the written .npy (eos_inside in chunks of 5): 10x the measured 1.19e-6 (2026-12-01; the
// CLI writes the CPU backend's float32 logits unchanged). Before: 1e-3.
constexpr double kLogitTol = 1.2e-5;

std::string src(const std::string& rel) {
  return std::string(FLASHNEXT_SOURCE_DIR) + "/" + rel;
}

// Runs a shell command; returns its stdout and sets the exit status.
std::string run(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  *status = ::pclose(p);
  return out;
}

std::string flashnext_bin() {
  return std::string(FLASHNEXT_BINARY_DIR) + "/flashnext";
}

std::vector<int64_t> i64(const SafetensorsFile& f, const std::string& name) {
  const TensorView& v = f.tensors().at(name);
  std::vector<int64_t> out(size_t(v.numel()));
  std::memcpy(out.data(), v.data, out.size() * 8);
  return out;
}

TEST(LogitsCli, WritesReferenceLogitsAndGreedyIds) {
  const SafetensorsFile ref(src("tests/data/fixtures/tiny-a/reference.safetensors"));
  const std::string P = "eos_inside";
  const auto ids = i64(ref, P + ".input_ids");
  const auto greedy = i64(ref, P + ".greedy_ids");
  const std::string out = ::testing::TempDir() + "/logits_cli_eos_inside.npy";
  const std::string cmd =
      fmt::format("'{}' logits --model '{}' --ids {} --out '{}' --chunk 5 --greedy {}", flashnext_bin(),
                  src("tests/data/fixtures/tiny-a/model"), fmt::join(ids, ","), out, greedy.size());
  int status = -1;
  const std::string printed = run(cmd, &status);
  ASSERT_EQ(status, 0) << cmd;
  EXPECT_EQ(printed, fmt::format("greedy: {}\n", fmt::join(greedy, ",")));
  const NpyArray a = read_npy(out);
  ASSERT_EQ(a.shape, (std::vector<int64_t>{int64_t(ids.size()), 1024}));
  const TensorView& want = ref.tensors().at(P + ".logits");
  ASSERT_EQ(want.dtype, DType::F32);
  const float* w = reinterpret_cast<const float*>(want.data);
  double max_diff = 0;
  for (int64_t i = 0; i < a.numel(); ++i) max_diff = std::max(max_diff, double(std::fabs(a.f32()[i] - w[i])));
  std::printf("[ logits   ] tiny-a %s in chunks of 5: max |logit - reference| %.3g (bound %.2g)\n", P.c_str(), max_diff,
              kLogitTol);
  EXPECT_LE(max_diff, kLogitTol);
}

// --tp 2 and --tp 4 (ranks as threads of the CLI process, prefilled in chunks of 5): the reference's logits within the
// same bound and its greedy ids.
TEST(LogitsCli, TensorParallelWritesReferenceLogitsAndGreedyIds) {
  const SafetensorsFile ref(src("tests/data/fixtures/tiny-a/reference.safetensors"));
  const std::string P = "long";
  const auto ids = i64(ref, P + ".input_ids");
  const auto greedy = i64(ref, P + ".greedy_ids");
  for (int tp : {2, 4}) {
    const std::string out = ::testing::TempDir() + fmt::format("/logits_cli_tp{}.npy", tp);
    const std::string cmd =
        fmt::format("'{}' logits --model '{}' --ids {} --out '{}' --chunk 5 --greedy {} --tp {}", flashnext_bin(),
                    src("tests/data/fixtures/tiny-a/model"), fmt::join(ids, ","), out, greedy.size(), tp);
    int status = -1;
    const std::string printed = run(cmd, &status);
    ASSERT_EQ(status, 0) << cmd;
    EXPECT_EQ(printed, fmt::format("greedy: {}\n", fmt::join(greedy, ","))) << "tp " << tp;
    const NpyArray a = read_npy(out);
    ASSERT_EQ(a.shape, (std::vector<int64_t>{int64_t(ids.size()), 1024}));
    const float* w = reinterpret_cast<const float*>(ref.tensors().at(P + ".logits").data);
    double max_diff = 0;
    for (int64_t i = 0; i < a.numel(); ++i) max_diff = std::max(max_diff, double(std::fabs(a.f32()[i] - w[i])));
    std::printf("[ logits   ] tiny-a %s --tp %d in chunks of 5: max |logit - reference| %.3g (bound %.2g)\n", P.c_str(),
                tp, max_diff, kLogitTol);
    EXPECT_LE(max_diff, kLogitTol) << "tp " << tp;
  }
}

// Speculative greedy decoding over two processes (`--speculative mtp:3 --tp 2 --nnodes 2`, the same command on both
// nodes): the MTP drafts, the verify steps and their rollbacks (state snapshots on both nodes) give the greedy ids of
// plain decoding in one process. A node started without the MTP layer is refused at the rendezvous.
TEST(LogitsCli, TwoProcessesDecodeSpeculativelyAsOne) {
  const std::string dir = ::testing::TempDir(), model = src("tests/data/fixtures/tiny-mtp/model");
  const int port = 20000 + int((::getpid() + 7919) % 20000);
  const std::string common =
      fmt::format("logits --model '{}' --ids 5,17,300,42,5,17,300 --greedy 24 --tp 2 --out '{}/spec.npy'", model, dir);
  int status = -1;
  const std::string plain = run(fmt::format("'{}' {}", flashnext_bin(), common), &status);
  ASSERT_EQ(status, 0);
  ASSERT_NE(plain.find("greedy: "), std::string::npos) << plain;
  auto pair = [&](const std::string& node0, const std::string& node1, int p) {
    return fmt::format(
        "( timeout 120 '{0}' {1} {2} --nnodes 2 --node-rank 1 --master-port {4} >/dev/null 2>'{5}/n1.err'; "
        "echo $? > '{5}/n1.status' ) & timeout 120 '{0}' {1} {3} --nnodes 2 --node-rank 0 --master-port {4} "
        "2>'{5}/n0.err'; s=$?; wait; exit $s",
        flashnext_bin(), common, node1, node0, p, dir);
  };
  const std::string spec = run(pair("--speculative mtp:3", "--speculative mtp:3", port), &status);
  ASSERT_EQ(status, 0) << run(fmt::format("cat '{}/n0.err' '{}/n1.err'", dir, dir), &status);
  EXPECT_EQ(spec, plain);
  EXPECT_EQ(run(fmt::format("cat '{}/n1.status'", dir), &status), "0\n");
  EXPECT_NE(run(fmt::format("cat '{}/n0.err'", dir), &status).find("speculative mtp:3: "), std::string::npos);
  run(pair("--speculative mtp:3", "", port + 1), &status);
  EXPECT_NE(status, 0);
  const std::string errors = run(fmt::format("cat '{}/n0.err' '{}/n1.err'", dir, dir), &status);
  EXPECT_NE(errors.find("was started with other settings than node 0"), std::string::npos) << errors;
  EXPECT_NE(errors.find("MTP layer"), std::string::npos) << errors;
}

// Two processes (`--tp 2 --nnodes 2`, node 1 started in the background, both on this machine over loopback): node 0
// writes the bits of --tp 2 in one process and the reference's greedy ids; node 1 ends with status 0 when node 0 is
// done. A node 0 whose other node never comes fails after FLASHNEXT_RENDEZVOUS_TIMEOUT naming it.
TEST(LogitsCli, TwoProcessesWriteTheLogitsOfOne) {
  const SafetensorsFile ref(src("tests/data/fixtures/tiny-a/reference.safetensors"));
  const std::string P = "long";
  const auto ids = i64(ref, P + ".input_ids");
  const auto greedy = i64(ref, P + ".greedy_ids");
  const std::string dir = ::testing::TempDir(), model = src("tests/data/fixtures/tiny-a/model");
  const int port = 20000 + int(::getpid() % 20000);
  const std::string common = fmt::format("logits --model '{}' --ids {} --chunk 5 --tp 2", model, fmt::join(ids, ","));
  int status = -1;
  const std::string one =
      run(fmt::format("'{}' {} --out '{}/tp2.npy' --greedy {}", flashnext_bin(), common, dir, greedy.size()), &status);
  ASSERT_EQ(status, 0);
  const std::string cmd = fmt::format(
      "( timeout 120 '{0}' {1} --out '{2}/node1.npy' --nnodes 2 --node-rank 1 --master-port {3} 2>'{2}/node1.err'; "
      "echo $? > '{2}/node1.status' ) & timeout 120 '{0}' {1} --out '{2}/node0.npy' --greedy {4} --nnodes 2 "
      "--node-rank 0 --master-port {3}; s=$?; wait; exit $s",
      flashnext_bin(), common, dir, port, greedy.size());
  const std::string printed = run(cmd, &status);
  ASSERT_EQ(status, 0) << cmd;
  EXPECT_EQ(printed, one);
  EXPECT_EQ(printed, fmt::format("greedy: {}\n", fmt::join(greedy, ",")));
  EXPECT_EQ(run(fmt::format("cat '{}/node1.status'", dir), &status), "0\n");
  EXPECT_NE(run(fmt::format("cat '{}/node1.err'", dir), &status).find("node 1 of 2: rank 1 of --tp 2 loaded"),
            std::string::npos);
  const NpyArray a = read_npy(dir + "/node0.npy"), b = read_npy(dir + "/tp2.npy");
  ASSERT_EQ(a.shape, b.shape);
  EXPECT_EQ(std::memcmp(a.f32(), b.f32(), size_t(a.numel()) * 4), 0) << "two processes differ from one";

  const std::string alone = run(fmt::format("FLASHNEXT_RENDEZVOUS_TIMEOUT=0.5 '{}' {} --out '{}/x.npy' --nnodes 2 "
                                            "--master-port {} 2>&1",
                                            flashnext_bin(), common, dir, port),
                                &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(alone.find("these nodes did not connect (all of their links): node 1 (rank 1)"), std::string::npos)
      << alone;
}

TEST(LogitsCli, BadInputFailsWithAMessage) {
  const std::string model = src("tests/data/fixtures/tiny-a/model");
  int status = -1;
  std::string out = run(fmt::format("'{}' logits --model '{}' --ids 1,99999 --out '{}/x.npy' 2>&1", flashnext_bin(),
                                    model, ::testing::TempDir()),
                        &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("token id 99999 at index 1 is outside the vocabulary [0, 1024)"), std::string::npos) << out;
  out = run(fmt::format("'{}' logits --model '{}' --ids 1,x --out '{}/x.npy' 2>&1", flashnext_bin(), model,
                        ::testing::TempDir()),
            &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("'x' is not a token id"), std::string::npos) << out;
  // A tensor-parallel degree the heads do not allow: named before anything is loaded.
  out = run(fmt::format("'{}' logits --model '{}' --ids 1,2 --tp 3 --out '{}/x.npy' 2>&1", flashnext_bin(), model,
                        ::testing::TempDir()),
            &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("--tp 3 does not fit the 2 GDN key heads (linear_num_key_heads"), std::string::npos) << out;
}

}  // namespace
