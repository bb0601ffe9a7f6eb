// The registry's tables (op_cases.h): the shapes of every test and perf case, and the comparison with the oracle.
#include "op_cases.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <set>

#include "op_builders.h"

namespace flashnext::opcases {

const char* family_name(OpFamily f) {
  switch (f) {
    case OpFamily::Memory:
      return "memory";
    case OpFamily::Dense:
      return "dense";
    case OpFamily::Hc:
      return "hc";
    case OpFamily::Gdn:
      return "gdn";
    case OpFamily::Qsa:
      return "qsa";
    case OpFamily::Moe:
      return "moe";
    case OpFamily::Ple:
      return "ple";
    case OpFamily::Sampling:
      return "sampling";
  }
  return "?";
}

namespace {

// The released geometry (models/release/config.json) and its tensor-parallel shards: TP2 halves the head counts and
// intermediate sizes, TP4 quarters them (the 2 KV heads and the indexer's single key head are then replicated).
constexpr int64_t kH = 2560, kS = 4, kR = 320, kHeadDim = 256, kRotary = 64, kBudget = 2048, kBlock = 4;
constexpr int64_t kNi = 4, kDi = 128, kE = 512, kTopK = 10, kInter = 640, kV = 248320, kPleHeads = 16, kPleHd = 160;
const GdnDims kGdn{16, 48, 128, 128}, kGdnTp2{8, 24, 128, 128}, kGdnTp4{4, 12, 128, 128};

StepPlan plan(std::vector<int64_t> context, std::vector<std::vector<int64_t>> steps, int64_t page = 16) {
  StepPlan p;
  p.context = std::move(context);
  p.steps = std::move(steps);
  p.page = page;
  return p;
}

/// 5 sequences in scrambled slots at scattered positions: a decode step, and a mixed step (a prefill chunk among
/// decodes).
StepPlan decode_step_5() {
  return plan({5, 0, 17, 3, 100}, {{1, 1, 1, 1, 1}});
}
StepPlan mixed_step_5() {
  return plan({5, 0, 17, 3, 100}, {{1, 6, 1, 1, 1}});
}
/// A 70-token prefill (across GDN's 64-token chunk) and three decode steps with the state carried.
StepPlan prefill_then_decode() {
  return plan({0}, {{70}, {1}, {1}, {1}});
}
/// Prefill chunks of several sequences in one step, then a decode step of all of them.
StepPlan chunks_3() {
  return plan({0, 10, 3}, {{65, 7, 1}, {1, 1, 1}});
}

void add_memory(std::vector<OpCase>& v) {
  v.push_back(copy_rows_case(10, 7, 2, 5, 4));
  v.push_back(copy_rows_case(5, 3, 0, 0, 0));
  v.push_back(copy_rows_case(64, 130, 0, 0, 64));
  for (int64_t n : {0, 7, 130}) v.push_back(gather_rows_case(200, 33, n));
  for (int64_t n : {0, 7, 130}) v.push_back(scatter_rows_case(300, 65, n));
  v.push_back(scatter_rows_case(64, kNi * kDi, 64));
  v.push_back(fill_zero_case(9, 33, 2, 7));
  v.push_back(fill_zero_case(4, 130, 0, 4));
  v.push_back(random_weight_case({37, 129}, -0.75f, 1.25f));
  v.push_back(random_weight_case({3, 5, 64}, -0.05f, 0.05f));
}

void add_dense(std::vector<OpCase>& v) {
  v.push_back(embedding_case(50, 256, 23, 4));
  v.push_back(embedding_case(50, 256, 0, 4));
  v.push_back(embedding_case(97, 40, 1, 1));
  v.push_back(embedding_case(97, 40, 7, 3));
  v.push_back(embedding_case(4096, kH, 3, kS));
  for (int64_t T : {0, 1, 7, 65, 130}) {
    v.push_back(linear_case(T, 200, 130, false));
    v.push_back(linear_case(T, 200, 130, true));
  }
  // Decode-sized products (the CUDA GEMV up to 8 rows with inputs a multiple of 8) and the paths beside them.
  for (int64_t K : {264, 258})
    for (int64_t T : {1, 2, 5, 8, 9}) v.push_back(linear_case(T, K, 200, true));
  v.push_back(linear_case(7, kH, kGdnTp2.conv_dim(), false));  // TP2 in_proj_qkv
  v.push_back(linear_case(9, kH, kGdnTp4.conv_dim(), false));  // TP4 in_proj_qkv
  v.push_back(linear_case(1, 12 * kHeadDim, kH, false));       // TP2 o_proj
  v.push_back(linear_case(3, kH, 12 * 2 * kHeadDim, true));    // TP2 q_proj (with attention_bias)
  for (int64_t T : {0, 1, 4, 8, 11}) v.push_back(linear_group_case(T, 136, {200, 24, 8}, {false, true, false}));
  // The CUDA GEMV takes 4 rows per warp from 2 tokens on where a launch has 2,048 rows or more: segments whose rows
  // leave a partial group (1, 2 or 3 rows), and the same shapes below that size (one row a warp).
  for (int64_t T : {2, 3, 6}) {
    v.push_back(linear_group_case(T, 136, {2049, 3, 1, 6}, {true, false, true, false}));
    v.push_back(linear_group_case(T, 136, {203, 5, 1, 2}, {true, false, true, false}));
  }
  v.push_back(linear_case(4, 264, 2051, true));
  v.push_back(linear_case(4, 264, 201, true));
  // Prefill chunks of 2,048 rows and more (CUDA FP16x2: the halves' products summed by cuBLAS in place), with and
  // without a bias, and a group whose halves are made once.
  v.push_back(linear_case(2049, 72, 40, true));
  v.push_back(linear_case(2048, 72, 40, false));
  v.push_back(linear_group_case(2050, 136, {200, 24, 8}, {false, true, false}));
  // GDN projections at TP4 (qkv | z | b | a) and QSA's at TP2 (q | k | v | index q | index k).
  v.push_back(linear_group_case(5, kH, {kGdnTp4.conv_dim(), 12 * 128, 12, 12}, {}));
  v.push_back(linear_group_case(1, kH, {12 * 2 * kHeadDim, kHeadDim, kHeadDim, kNi * kDi, kDi}, {}));
  // 8-bit weights (W8A16): the 8-bit GEMV (K % 16 == 0, groups of 16s; up to 32 rows in launches of 8), the FP16
  // tiles of prefill (one tile, and several of 4,096 rows at 1,024 inputs), one scale a row or FP8 blocks with a
  // partial last block, a mixed group.
  for (int64_t T : {0, 1, 3, 8, 9, 33}) {
    v.push_back(linear_w8_case(T, 96, 130, DType::I8, 96, T == 3));
    v.push_back(linear_w8_case(T, 160, 7, DType::F8_E4M3, 160, T == 9));
    v.push_back(linear_w8_case(T, 160, 70, DType::F8_E4M3, 64, T == 1));
  }
  for (int64_t T : {1, 5}) v.push_back(linear_w8_case(T, 200, 33, DType::I8, 200, true));  // K % 16 != 0: tiles
  v.push_back(linear_w8_case(2, 200, 33, DType::F8_E4M3, 128, false));
  v.push_back(linear_w8_case(40, 1024, 4200, DType::I8, 1024, true));       // two FP16 tiles
  v.push_back(linear_w8_case(33, 1024, 4200, DType::F8_E4M3, 128, false));  // two tiles of 8 block scales a row
  v.push_back(linear_w8_case(27, 4096, 300, DType::F8_E4M3, 4096, false));  // the GEMV in 4 launches
  for (int64_t T : {1, 4, 11}) {
    v.push_back(linear_group_w8_case(T, 96, {200, 24, 8}, DType::I8, 96, false));
    v.push_back(linear_group_w8_case(T, 96, {200, 24, 8}, DType::F8_E4M3, 32, T == 4));
  }
  for (int64_t T : {1, 33}) {
    v.push_back(moe_shared_expert_w8_case(T, 256, 96, DType::I8));
    v.push_back(moe_shared_expert_w8_case(T, 256, 96, DType::F8_E4M3));
  }
  v.push_back(zc_rms_norm_case(19, 4 * 640, 4 * 640, 640, false));  // grouped: one weight row, groups of H
  v.push_back(zc_rms_norm_case(19, 4 * 640, 128, 128, true));       // per head, in place
  v.push_back(zc_rms_norm_case(7, 3 * 40, 120, 40, false));
  v.push_back(zc_rms_norm_case(0, 256, 256, 64, false));
  v.push_back(zc_rms_norm_case(3, kS * kH, kS * kH, kH, true));  // the PLE key norm at the released width
  for (GateAct a : {GateAct::Silu, GateAct::Sigmoid}) v.push_back(gated_rms_norm_case(19, 6, 128, a));
  v.push_back(gated_rms_norm_case(1, 12, 128, GateAct::Sigmoid));  // TP4 value heads
  v.push_back(gated_rms_norm_case(0, 6, 128, GateAct::Sigmoid));
  v.push_back(gated_rms_norm_case(7, 3, 24, GateAct::Silu));
}

void add_hc(std::vector<OpCase>& v) {
  for (bool inject : {true, false}) {
    v.push_back(hc_read_case(21, 4, 256, 64, inject));
    for (int64_t T : {1, 3, 8}) {
      v.push_back(hc_read_case(T, 3, 40, 24, inject));
      v.push_back(hc_read_case(T, 4, 64, 320, inject));  // the released rank
    }
    v.push_back(hc_read_case(1, 2, 40, 24, inject));   // decode kernels: 16-lane groups, a partial row block
    v.push_back(hc_read_case(5, 8, 16, 32, inject));   // 8 streams: 4-lane groups
    v.push_back(hc_read_case(1, kS, kH, kR, inject));  // the released width at one token
    v.push_back(hc_read_case(9, 3, 40, 24, inject));  // past the decode kernels' 8 rows
    v.push_back(hc_read_case(0, 4, 64, 32, inject));
    v.push_back(hc_read_case(2, kS, kH, kR, inject));  // released width
    v.push_back(hc_read_case(33, kS, kH, kR, inject));  // released width, the prefill kernels
    v.push_back(hc_read_case(11, 2, 30, 24, inject));   // prefill mix without vector loads (H not a multiple of 4)
    // The tensor-core prefill kernels (SM80+): 2 and 4 streams, token tiles of 64 cut short, column tiles past H,
    // row tiles of 192 past R + S.
    v.push_back(hc_read_case(70, 2, 192, 64, inject));
    v.push_back(hc_read_case(45, 4, 64, 128, inject));
    v.push_back(hc_read_case(130, 4, 64, 320, inject));
    for (float x : {7e4f, 1e-3f}) v.push_back(hc_read_case(70, 4, 64, 64, inject, Weights::HostFp16, x));
  }
  for (bool inject : {true, false}) {
    for (int64_t T : {1, 3, 8}) {
      v.push_back(hc_inject_read_case(T, 3, 40, 24, inject));
      v.push_back(hc_inject_read_case(T, 4, 64, 320, inject));
    }
    v.push_back(hc_inject_read_case(1, 2, 40, 24, inject));
    v.push_back(hc_inject_read_case(4, 8, 16, 32, inject));
    v.push_back(hc_inject_read_case(9, 3, 40, 24, inject));  // past the decode kernels: inject, then read
    v.push_back(hc_inject_read_case(70, 2, 192, 64, inject));  // the tensor-core prefill kernels, injection folded in
    v.push_back(hc_inject_read_case(33, kS, kH, kR, inject));
    v.push_back(hc_inject_read_case(0, 4, 64, 32, inject));
    v.push_back(hc_inject_read_case(2, kS, kH, kR, inject));
  }
  v.push_back(hc_inject_case(21, 4, 256));
  v.push_back(hc_inject_case(0, 4, 256));
  v.push_back(hc_inject_case(1, kS, kH));
  v.push_back(hc_inject_case(7, 3, 40));
}

void add_gdn(std::vector<OpCase>& v) {
  const GdnDims d{2, 4, 128, 128}, odd{1, 3, 32, 24};
  for (const StepPlan& p : {one_sequence(1), one_sequence(7), one_sequence(65, 9), prefill_then_decode(), chunks_3()})
    v.push_back(gdn_conv_batch_case(d, 4, p));
  for (const StepPlan& p : {decode_step_5(), mixed_step_5()}) v.push_back(gdn_conv_batch_case(odd, 4, p));
  v.push_back(gdn_conv_batch_case(kGdnTp4, 4, plan({0, 40}, {{65, 1}})));
  v.push_back(gdn_conv_batch_case(odd, 4, plan({40, 9, 0}, {{4, 4, 1}, {2, 1, 9}, {16, 1, 17}})));
  // The CUDA backend's in-place prefill conv walks runs of 32 rows: 100 rows make 4 runs, the last partial, each but
  // the first starting from the halo of the run before; a step of 1, 2 and 70 rows sends 1 and 2 rows (fewer than
  // the K - 1 = 3 state rows) through the same kernels; K = 2 and 6 other window lengths.
  v.push_back(gdn_conv_batch_case(odd, 4, one_sequence(100, 5)));
  v.push_back(gdn_conv_batch_case(odd, 4, plan({3, 0, 50}, {{1, 2, 70}, {33, 1, 1}})));
  v.push_back(gdn_conv_batch_case(odd, 2, one_sequence(65, 1)));
  v.push_back(gdn_conv_batch_case(odd, 6, plan({0, 7}, {{40, 3}, {20, 18}})));
  // K = 1 (no state, no halo), K = 8 (the kernels' most taps) with a sequence of exactly K - 1 rows, and 296 channels
  // (a second block of 40 past the first 256).
  const GdnDims wide{1, 3, 40, 72};
  v.push_back(gdn_conv_batch_case(odd, 1, one_sequence(45, 2)));
  v.push_back(gdn_conv_batch_case(wide, 8, plan({9, 0}, {{7, 70}, {33, 7}})));
  v.push_back(gdn_conv_batch_case(wide, 4, plan({0, 5}, {{3, 97}})));
  for (int64_t T : {1, 7, 63, 64, 65, 130}) v.push_back(gdn_rule_batch_case(d, one_sequence(T, T == 1 ? 5 : 0)));
  // The CUDA backend's recurrence over few rows (up to 16 per sequence; 17 takes the chunked form): speculative
  // verify steps of 1 + K rows and their replays, several sequences with the state carried.
  for (int64_t T : {16, 17}) v.push_back(gdn_rule_batch_case(d, one_sequence(T, 3)));
  v.push_back(gdn_rule_batch_case(odd, plan({40, 9, 0}, {{4, 4, 1}, {2, 1, 9}, {1, 1, 1}})));
  v.push_back(gdn_rule_batch_case(d, prefill_then_decode()));
  v.push_back(gdn_rule_batch_case(d, chunks_3()));
  for (const StepPlan& p : {decode_step_5(), mixed_step_5()}) v.push_back(gdn_rule_batch_case(odd, p));
  v.push_back(gdn_rule_batch_case(kGdnTp4, plan({0, 40}, {{65, 1}})));
  v.push_back(gdn_rule_batch_case(kGdnTp2, decode_batch(3, 17)));
  // The chunked form's tensor-core walk: 3 and 5 tiles of 16 key dims, value columns cut at dv = 48 and 24 (a block
  // of 64, warps of 16), sequences of 1-3 chunks over two steps, one of 16 chunks; a state past FP16's range (its
  // power-of-two scaling); dk = 20 (not a multiple of 16: float32 FMAs).
  v.push_back(gdn_rule_batch_case({2, 4, 48, 48}, plan({0, 10, 3}, {{130, 40, 17}, {70, 1, 20}})));
  v.push_back(gdn_rule_batch_case(d, one_sequence(100), Weights::HostFp16, 1e5f));
  v.push_back(gdn_rule_batch_case({1, 2, 80, 24}, plan({0, 5}, {{129, 64}})));  // 5 key tiles, a warp's columns cut
  v.push_back(gdn_rule_batch_case({1, 2, 128, 128}, one_sequence(1000), Weights::HostFp16, 1.f));  // 16 chunks
  v.push_back(gdn_rule_batch_case({1, 2, 20, 40}, one_sequence(70)));
  // The mixer's conv, rule and norm in one op. The CUDA backend runs steps of few rows as one recurrence launch with
  // the norm in it (the last block of each (slot, value head) normalises its rows) and the conv folded in where the
  // launch fits one wave of the folded kernel (the last block of each key head's value heads writes its q/k conv
  // state): the released heads for one sequence over three steps (folded) and for 16 sequences over two (the conv
  // apart, many waves); several sequences of several rows (speculative verifies: 4 slices a head), dv = 24 and 72
  // (one and three slices, the last partial), K = 1, 2 and 8, no norm (a replay), both activations; the 16/17-row
  // boundary, a prefill then decode, and a chunked prefill (the ops in order).
  const std::optional<GateAct> sig = GateAct::Sigmoid, silu = GateAct::Silu, no_norm;
  v.push_back(gdn_mix_batch_case(kGdn, 4, plan({40}, {{1}, {1}, {1}}), sig));
  v.push_back(gdn_mix_batch_case(
      kGdn, 4, plan(std::vector<int64_t>(16, 40), {std::vector<int64_t>(16, 1), std::vector<int64_t>(16, 1)}), sig));
  for (const auto& act : {sig, silu}) v.push_back(gdn_mix_batch_case(d, 4, decode_batch(3, 17), act));
  v.push_back(gdn_mix_batch_case(d, 4, plan({0, 5, 17}, {{9, 4, 1}, {1, 1, 1}}), silu));
  v.push_back(gdn_mix_batch_case(odd, 4, plan({40, 9, 0}, {{4, 4, 1}, {2, 1, 9}, {1, 1, 1}}), sig));
  v.push_back(gdn_mix_batch_case({1, 3, 40, 72}, 4, plan({5, 0}, {{1, 9}, {1, 1}, {1, 0}}), sig));
  v.push_back(gdn_mix_batch_case(odd, 1, plan({3, 0}, {{2, 5}, {1, 1}}), sig));
  v.push_back(gdn_mix_batch_case(odd, 2, plan({3, 0}, {{2, 5}, {1, 1}}), silu));
  v.push_back(gdn_mix_batch_case({1, 3, 40, 72}, 8, plan({9, 2}, {{3, 7}, {1, 1}}), sig));
  v.push_back(gdn_mix_batch_case(d, 4, plan({0, 5, 17}, {{9, 4, 1}, {1, 1, 1}}), no_norm));
  for (int64_t T : {16, 17}) v.push_back(gdn_mix_batch_case(d, 4, one_sequence(T, 3), sig));
  v.push_back(gdn_mix_batch_case(d, 4, prefill_then_decode(), sig));
  v.push_back(gdn_mix_batch_case(d, 4, one_sequence(100, 3), silu));
}

void add_qsa(std::vector<OpCase>& v) {
  for (const StepPlan& p : {one_sequence(60), one_sequence(1, 4095), decode_step_5(), mixed_step_5()})
    v.push_back(qsa_prepare_qk_batch_case(8, 2, kHeadDim, kRotary, p));
  v.push_back(qsa_prepare_qk_batch_case(3, 1, 24, 8, mixed_step_5()));
  v.push_back(qsa_prepare_qk_batch_case(12, 1, kHeadDim, kRotary, one_sequence(7, 100)));  // TP2
  v.push_back(qsa_prepare_qk_batch_case(6, 1, kHeadDim, kRotary, decode_batch(3, 9)));     // TP4

  // Indexer (budget 16 = 4 blocks of 4): 3 sequences over 5 steps in scrambled 8-position KV blocks; one
  // sequence whose context crosses the budget (positions 18..21: 4 complete blocks, then 5); torch.topk's ties of
  // all-zero queries over 1,100 positions (heap selection past 64 * k blocks).
  v.push_back(qsa_indexer_select_batch_case(
      2, 128, 16, 4, plan({0, 0, 0}, {{3, 2, 1}, {20, 7, 1}, {1, 1, 1}, {5, 1, 7}, {1, 30, 1}}, 8), 0));
  v.push_back(qsa_indexer_select_batch_case(2, 128, 16, 4, plan({0}, {{18}, {1}, {1}, {1}, {1}}, 8), 0));
  v.push_back(qsa_indexer_select_batch_case(2, 64, 16, 4, plan({0}, {{1100}}, 8), 3));
  v.push_back(qsa_indexer_select_batch_case(2, 64, 16, 4, plan({0, 0}, {{40, 3}, {1, 1}}, 8), 2));
  // Prefill chunks of 70 and 33 rows (the tiled scores: 32 rows a block, one block across the two sequences), 3 heads
  // of dim 20 (a partial chunk of 32 dims).
  v.push_back(qsa_indexer_select_batch_case(3, 20, 16, 4, plan({0, 0}, {{70, 33}}, 8), 0));
  // Rows of more than 2,048 complete blocks (blocks of 2 over a 4,200-token prefill and a decode: the top-k kernel's
  // radix passes read the row again instead of holding it in registers, for the prefill's queries past position
  // 4,096), every 7th query zero (ties, the decode's query among them).
  v.push_back(qsa_indexer_select_batch_case(2, 64, 16, 2, plan({0}, {{4200}, {1}}, 8), 7));
  // Released indexer (4 heads of 128, budget 2048 = 512 blocks): a 2047-token prefill, then decodes at positions
  // 2047 .. 2051 (512 complete blocks at 2047, 513 at 2051); every 5th query zero (ties).
  v.push_back(
      qsa_indexer_select_batch_case(kNi, kDi, kBudget, kBlock, plan({0}, {{2047}, {1}, {1}, {1}, {1}, {1}}, 16), 5));

  for (const StepPlan& p : {one_sequence(60), one_sequence(1), decode_step_5(), mixed_step_5()})
    v.push_back(sparse_attention_batch_case(8, 2, kHeadDim, 16, 4, p));
  v.push_back(sparse_attention_batch_case(3, 1, 24, 16, 4, mixed_step_5()));
  // TP2 heads at the released budget: contexts just below and above 2048 positions.
  v.push_back(sparse_attention_batch_case(12, 1, kHeadDim, kBudget, kBlock, plan({2046, 2100}, {{1, 1}})));
  // Decode splits of the selection and their combine: one query over 4,099 selected positions, 129 splits (the
  // combine's groups take more than one round of loads), head dim 24 (a partial block of combined columns); beside a
  // query of 11 positions (its splits past the first saw nothing); one query over 8,447 positions, 264 splits (a
  // thread of the combine takes two splits' (m, l)).
  v.push_back(sparse_attention_batch_case(3, 1, 24, 4096, 4, plan({4200}, {{1}})));
  v.push_back(sparse_attention_batch_case(3, 1, 24, 4096, 4, plan({4200, 10}, {{1, 1}})));
  v.push_back(sparse_attention_batch_case(2, 1, 16, 8444, 4, plan({8600}, {{1}})));
  // Prefill chunks (on SM80+ GPUs the tile-union kernel, groups of consecutive queries over their selections'
  // union): sequences of 65, 7 and 1 rows (full and partial groups); 3 heads a KV head at head dim 24; the released
  // heads over a 37-query chunk whose contexts cross the budget (positions 2030 .. 2066).
  v.push_back(sparse_attention_batch_case(8, 2, kHeadDim, 16, 4, plan({0, 10, 3}, {{65, 7, 1}})));
  v.push_back(sparse_attention_batch_case(3, 1, 24, 16, 4, plan({0, 40}, {{20, 17}})));
  v.push_back(sparse_attention_batch_case(24, 2, kHeadDim, kBudget, kBlock, plan({2030}, {{37}})));
}

void add_moe(std::vector<OpCase>& v) {
  v.push_back(moe_router_topk_case(33, 256, 16, 4, true));
  v.push_back(moe_router_topk_case(1, 256, 16, 4, false));
  v.push_back(moe_router_topk_case(0, 256, 16, 4, true));
  v.push_back(moe_router_topk_case(7, kH, kE, kTopK, true));  // released router
  for (int64_t T : {0, 1, 33}) v.push_back(moe_experts_case(T, 256, 64, 16, 4));
  v.push_back(moe_experts_case(3, kH, kInter / 4, 12, kTopK));  // TP4 intermediate
  for (QuantFormat q : {QuantFormat::Nvfp4, QuantFormat::CtInt4, QuantFormat::Gptq})
    for (int64_t T : {1, 9}) v.push_back(moe_quantized_experts_case(q, T, 256, 64, 8, 4));
  v.push_back(moe_quantized_experts_case(QuantFormat::Nvfp4, 2, kH, kInter / 2, 10, kTopK));  // TP2
  // Decode GEMV rows whose 32-input chunks do not fill the tensor-core kernels' 4-chunk super-chunks (7 chunks of
  // hidden; expert widths of 1.5 and 3 chunks), one and two tokens.
  v.push_back(moe_quantized_experts_case(QuantFormat::Nvfp4, 1, 224, 48, 8, 4));
  v.push_back(moe_quantized_experts_case(QuantFormat::CtInt4, 2, 224, 96, 8, 4));
  for (int64_t T : {0, 1, 33}) v.push_back(moe_shared_expert_case(T, 256, 96));
  v.push_back(moe_shared_expert_case(2, kH, kInter / 2));
  // The shared expert begun ahead and added by the routed experts: decode rows (the CUDA backend's branch stream)
  // and a prefill chunk, over dense and NVFP4 experts (the W4A16 GEMV's and GEMM's combines).
  for (int64_t T : {0, 1, 8, 33}) v.push_back(moe_experts_case(T, 256, 64, 16, 4, Weights::HostFp16, true));
  for (int64_t T : {1, 5, 40}) v.push_back(moe_quantized_experts_case(QuantFormat::Nvfp4, T, 256, 64, 8, 4, true));
}

void add_ple(std::vector<OpCase>& v) {
  v.push_back(ple_gather_case(9, 4, 16, 90, DType::BF16, 2, TableSource::MapHost));
  v.push_back(ple_gather_case(9, 4, 16, 90, DType::F16, 1, TableSource::MapHost));
  v.push_back(ple_gather_case(5, 3, 16, 40, DType::F32, 1, TableSource::MapHost));
  v.push_back(ple_gather_case(5, 3, 16, 40, DType::F8_E4M3, 2, TableSource::MapHost));
  // int8 tables with group scales (W8A16 PLE): equal and uneven shards (the CUDA backend merges the latter), the
  // three scale dtypes, group = head_dim and the released head_dim 160 with group 32.
  v.push_back(ple_gather_case(9, 4, 16, 90, DType::I8, 2, TableSource::MapHost, false, 8, DType::F16));
  v.push_back(ple_gather_case(5, 3, 16, 40, DType::I8, 3, TableSource::MapHost, false, 4, DType::BF16));
  v.push_back(ple_gather_case(5, 3, 16, 40, DType::I8, 1, TableSource::MapHost, true, 16, DType::F32));
  v.push_back(ple_gather_case(7, 16, 160, 300, DType::I8, 2, TableSource::MapHost, false, 32, DType::F16));
  v.push_back(ple_gather_case(5, 3, 16, 40, DType::F8_E4M3, 1, TableSource::HostTable));
  v.push_back(ple_gather_case(5, 3, 16, 40, DType::BF16, 3, TableSource::HostTable));
  v.push_back(ple_gather_case(0, 4, 16, 90, DType::BF16, 1, TableSource::MapHost));
  v.push_back(ple_gather_case(5, 3, 8, 50, DType::F16, 1, TableSource::MapHost, true));
  v.push_back(ple_gather_case(5, 3, 16, 40, DType::F8_E4M3, 1, TableSource::HostTable, true));
  v.push_back(ple_gather_case(7, kPleHeads, kPleHd, 4096, DType::F8_E4M3, 2, TableSource::HostTable));
  for (int64_t T : {0, 1, 9}) v.push_back(ple_gate_case(T, 4, 128));
  v.push_back(ple_gate_case(3, kS, kH));
  v.push_back(ple_conv_add_batch_case(4, 128, 4, 3, plan({0}, {{9}, {1}, {1}})));
  for (const StepPlan& p : {decode_step_5(), mixed_step_5()}) v.push_back(ple_conv_add_batch_case(4, 40, 4, 3, p));
  v.push_back(ple_conv_add_batch_case(kS, kH, 4, 3, plan({0, 12}, {{7, 1}})));
  // Verify-like steps (the CUDA backend walks up to 16 rows a sequence in one launch), then 17 rows (per sequence).
  v.push_back(ple_conv_add_batch_case(4, 40, 4, 3, plan({40, 9, 0}, {{4, 4, 1}, {2, 1, 9}, {16, 1, 17}})));
}

std::vector<OpCase> make_test_cases() {
  std::vector<OpCase> v;
  add_memory(v);
  add_dense(v);
  add_hc(v);
  add_gdn(v);
  add_qsa(v);
  add_moe(v);
  add_ple(v);
  v.push_back(sample_tokens_case(6, 1000));
  v.push_back(sample_tokens_case(3, kV));
  std::set<std::string> names;
  for (const OpCase& c : v) FN_CHECK(names.insert(c.name).second, "op_cases: case '{}' listed twice", c.name);
  return v;
}

/// copy_rows of `rows` x 1024 F32 zeros (rows * 4 KiB read and written).
OpCase copy_reference(int64_t rows) {
  OpCase c = copy_rows_case(rows, 1024, 0, 0, rows);
  c.name = fmt::format("copy_rows/reference/{}MiB", rows * 4096 / (1 << 20));
  c.reference = Reference::Copy;
  c.build = [rows](Ops& ops, uint64_t) {
    Tensor src = ops.zeros({rows, 1024}), dst = ops.empty({rows, 1024});
    return OpRun{[=, &ops] { ops.copy_rows(src, 0, dst, 0, rows); }, [] { return std::vector<OpOutput>{}; }};
  };
  return c;
}

OpCase gemm_reference(int64_t n) {
  OpCase c = linear_case(n, n, n, false, Weights::DeviceRandom);
  c.name = "linear/reference/" + c.name.substr(std::string("linear/").size());
  c.reference = Reference::Gemm;
  return c;
}

}  // namespace

const std::vector<OpCase>& test_cases() {
  static const std::vector<OpCase> cases = make_test_cases();
  return cases;
}

std::vector<OpCase> perf_cases(bool small) {
  std::vector<OpCase> v;
  if (small) {
    v.push_back(copy_reference(16384));  // 64 MiB
    v.push_back(gemm_reference(1024));
    for (const OpCase& c : test_cases()) v.push_back(c);
    return v;
  }
  const Weights dev = Weights::DeviceRandom;
  const int64_t SH = kS * kH, Iq = 24 * 2 * kHeadDim;
  v.push_back(copy_reference(262144));  // 1 GiB
  v.push_back(gemm_reference(8192));
  for (int64_t T : {1, 8, 64, 4096}) {
    const bool decode = T <= 64;
    // Decode: T sequences of one token each; prefill: one chunk. Attention contexts end at 8192 positions.
    const StepPlan rec = decode ? decode_batch(T, 1000) : one_sequence(T);
    const StepPlan attn = decode ? decode_batch(T, 8191) : one_sequence(T, 8192 - T);
    v.push_back(embedding_case(kV, kH, T, kS, dev));
    v.push_back(hc_read_case(T, kS, kH, kR, true, dev));
    v.push_back(hc_read_case(T, kS, kH, kR, false, dev));
    v.push_back(hc_inject_case(T, kS, kH));
    v.push_back(hc_inject_read_case(T, kS, kH, kR, true, dev));
    v.push_back(linear_group_case(T, kH, {kGdn.conv_dim(), 48 * 128, 48, 48}, {}, dev));
    v.push_back(gdn_conv_batch_case(kGdn, 4, rec, dev));
    v.push_back(gdn_rule_batch_case(kGdn, rec, dev));
    v.push_back(gated_rms_norm_case(T, 48, 128, GateAct::Sigmoid, dev));
    v.push_back(linear_case(T, 48 * 128, kH, false, dev));  // GDN out_proj (QSA's o_proj has the same shape)
    if (T == 1 || T == 8 || T == 4096) {                    // the same in 8 bits (W8A16: W8A8 INT8 and FP8 releases)
      v.push_back(linear_group_w8_case(T, kH, {kGdn.conv_dim(), 48 * 128, 48, 48}, DType::I8, kH, false));
      v.push_back(linear_group_w8_case(T, kH, {kGdn.conv_dim(), 48 * 128, 48, 48}, DType::F8_E4M3, 128, false));
      v.push_back(linear_w8_case(T, 48 * 128, kH, DType::I8, 48 * 128, false));
    }
    v.push_back(linear_group_case(T, kH, {Iq, 2 * kHeadDim, 2 * kHeadDim, kNi * kDi, kDi}, {}, dev));
    v.push_back(qsa_prepare_qk_batch_case(24, 2, kHeadDim, kRotary, attn, dev));
    v.push_back(scatter_rows_case(T * 16 + 4096, 2 * kHeadDim, T));  // a step's K rows into the paged cache
    v.push_back(qsa_indexer_select_batch_case(kNi, kDi, kBudget, kBlock, attn, 0, dev));
    v.push_back(sparse_attention_batch_case(24, 2, kHeadDim, kBudget, kBlock, attn));
    v.push_back(moe_router_topk_case(T, kH, kE, kTopK, true, dev));
    v.push_back(moe_random_experts_case(T, kH, kInter, kE, kTopK));
    v.push_back(moe_random_experts_case(T, kH, kInter, kE, kTopK, true));  // with the shared expert beside
    v.push_back(moe_experts_case(T, kH, kInter, kE, kTopK, dev));
    v.push_back(moe_shared_expert_case(T, kH, kInter, dev));
    v.push_back(ple_gather_case(T, kPleHeads, kPleHd, 1 << 20, DType::F8_E4M3, 1, TableSource::HostTable));
    v.push_back(linear_group_case(T, kH, {SH, kH}, {}, dev));  // PLE key / value projections
    v.push_back(zc_rms_norm_case(T, SH, SH, kH, true, dev));
    v.push_back(ple_gate_case(T, kS, kH, dev));
    v.push_back(ple_conv_add_batch_case(kS, kH, 4, 3, rec, dev));
    v.push_back(gather_rows_case(T + 64, kH, T));  // the rows of the last tokens before the final norm
    if (decode) {
      v.push_back(linear_case(T, kH, kV, false, dev));  // lm_head
      v.push_back(sample_tokens_case(T, kV));
    }
  }
  return v;
}

// ---------------------------------------------------------------- comparison

namespace {

std::string compare_one(const OpOutput& w, const OpOutput& g, bool bitwise, Precision precision) {
  if (w.values.size() != g.values.size() || w.ints.size() != g.ints.size())
    return fmt::format("{}: {} elements, the oracle has {}", w.name, g.values.size() + g.ints.size(),
                       w.values.size() + w.ints.size());
  if (bitwise || w.compare == Compare::Exact) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < w.values.size(); ++i) {
      const bool same = bitwise ? std::bit_cast<uint32_t>(w.values[i]) == std::bit_cast<uint32_t>(g.values[i])
                                : w.values[i] == g.values[i];
      if (!same && bad++ == 0) first = i;
    }
    if (bad)
      return fmt::format("{}: {} of {} values differ; first at {}: {} vs the oracle's {}", w.name, bad, w.values.size(),
                         first, g.values[first], w.values[first]);
    for (size_t i = 0; i < w.ints.size(); ++i)
      if (w.ints[i] != g.ints[i] && bad++ == 0) first = i;
    if (bad)
      return fmt::format("{}: {} of {} integers differ; first at {}: {} vs the oracle's {}", w.name, bad, w.ints.size(),
                         first, g.ints[first], w.ints[first]);
    return "";
  }
  if (w.compare == Compare::RowSets) {
    const size_t width = size_t(w.row_width), rows = width ? w.ints.size() / width : 0;
    size_t bad = 0, first = 0;
    for (size_t r = 0; r < rows; ++r) {
      auto set_of = [&](const std::vector<int32_t>& v) {
        std::vector<int32_t> s;
        for (size_t j = 0; j < width; ++j)
          if (v[r * width + j] >= 0) s.push_back(v[r * width + j]);
        std::sort(s.begin(), s.end());
        return s;
      };
      if (set_of(w.ints) != set_of(g.ints) && bad++ == 0) first = r;
    }
    if (bad)
      return fmt::format("{}: {} of {} rows select other positions than the oracle; first: row {}", w.name, bad, rows,
                         first);
    return "";
  }
  const Bound b = precision == Precision::Fp16x2 ? w.fp16x2 : w.fp16;
  double scale = 0;
  for (float x : w.values) scale = std::max(scale, double(std::fabs(x)));
  if (scale == 0) scale = 1;
  size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < w.values.size(); ++i) {
    const double err = std::fabs(double(g.values[i]) - double(w.values[i]));
    const double allowed = b.abs * scale + b.rel * std::fabs(double(w.values[i]));
    const double ratio = err == 0 ? 0.0 : (allowed > 0 ? err / allowed : INFINITY);
    if (!(ratio <= 1.0)) ++bad;  // NaN too
    if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
  }
  if (bad)
    return fmt::format(
        "{}: {} of {} values outside {} x scale {:.3g} + {} x |oracle|; worst at {}: {} vs the oracle's {}", w.name,
        bad, w.values.size(), b.abs, scale, b.rel, worst, g.values[worst], w.values[worst]);
  return "";
}

}  // namespace

std::string compare_outputs(const std::vector<OpOutput>& want, const std::vector<OpOutput>& got, bool bitwise,
                            Precision precision) {
  if (want.size() != got.size()) return fmt::format("{} outputs, the oracle has {}", got.size(), want.size());
  std::string msg;
  for (size_t i = 0; i < want.size(); ++i) {
    const std::string m = compare_one(want[i], got[i], bitwise, precision);
    if (!m.empty()) msg += (msg.empty() ? "" : "\n") + m;
  }
  return msg;
}

}  // namespace flashnext::opcases
