// QSA kernels against CPU loops of MODEL.md's indexer and attention. Paged caches with shuffled pages, several
// sequences per batch, chunked prefill (blocks completed across steps) then decode, contexts below, at and above
// the budget. Tolerances: pooled block keys atol 3e-3 rtol 4e-3 (FP16 roundings at the reference's points);
// attention outputs atol 2e-3 rtol 1e-2 (FP16 output, FP32 softmax). Selections are checked exactly for their
// shape (counts, whole aligned blocks, the tail, increasing positions) and for being a top-k under the CPU scores:
// every selected block scores at least every unselected one, up to 1e-4 relative (the GPU sums in another order,
// so near-ties may legitimately fall either way; exact ties are tested on given scores in SelectTieRule).
#include "ops/cuda/qsa.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "cuda_test_util.h"

namespace flashnext::cuda::test {
namespace {

float r16(float x) {
  return __half2float(__float2half_rn(x));
}

struct QsaConfig {
  int heads, kv_heads, dim, idx_heads, idx_dim, rotary, block, page_size, top_blocks;
  std::vector<int> contexts;
  int check_every;  // check attention for every n-th prefill token (1 = all); decode tokens always
};

class QsaPipeline : public ::testing::TestWithParam<QsaConfig> {};

TEST_P(QsaPipeline, AppendSelectAttendMatchReference) {
  const QsaConfig& cf = GetParam();
  const int nseq = int(cf.contexts.size());
  const int kvw = cf.kv_heads * cf.dim, qw = cf.heads * cf.dim, G = cf.heads / cf.kv_heads;
  const float theta = 1e7f, eps = 1e-6f;
  int max_ctx = *std::max_element(cf.contexts.begin(), cf.contexts.end());
  // Host mirror of the sequences: per position K, V, raw indexer key.
  std::vector<std::vector<float>> K(nseq), V(nseq), KI(nseq);
  for (int s = 0; s < nseq; ++s) {
    K[s] = rand_f16_values(size_t(cf.contexts[s]) * kvw, 100 + s, -1.f, 1.f);
    V[s] = rand_f16_values(size_t(cf.contexts[s]) * kvw, 200 + s, -1.f, 1.f);
    KI[s] = rand_f16_values(size_t(cf.contexts[s]) * cf.idx_dim, 300 + s, -1.f, 1.f);
  }
  auto knw = rand_f16_values(cf.idx_dim, 400, -0.3f, 0.3f);
  // Pages: shuffled physical ids.
  const int table_ld = (max_ctx + cf.page_size - 1) / cf.page_size;
  int num_pages = 3;
  for (int c : cf.contexts) num_pages += (c + cf.page_size - 1) / cf.page_size;
  std::vector<int32_t> perm(num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(7);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> table(size_t(nseq) * table_ld, -1);
  int next = 0;
  for (int s = 0; s < nseq; ++s)
    for (int lp = 0; lp * cf.page_size < cf.contexts[s]; ++lp) table[size_t(s) * table_ld + lp] = perm[next++];
  auto dtable = to_device(table);
  const size_t tok_slots = size_t(num_pages) * cf.page_size;
  DeviceArray<__half> kc(tok_slots * kvw, "k"), vc(tok_slots * kvw, "v"), kic(tok_slots * cf.idx_dim, "ki"),
      pc(tok_slots / cf.block * cf.idx_dim, "pooled");
  QsaCache cache{kc.get(),  vc.get(),     kic.get(),   pc.get(), dtable.get(), table_ld,
                 num_pages, cf.page_size, cf.kv_heads, cf.dim,   cf.idx_dim,   cf.block};
  auto dknw = dev_half(knw);
  DeviceArray<int32_t> status(1, "status");
  cudaMemset(status.get(), 0, 4);

  // Reference pooled key of block j of sequence s.
  auto ref_pooled = [&](int s, int j) {
    std::vector<float> m(cf.idx_dim), out(cf.idx_dim);
    double ss = 0;
    for (int d = 0; d < cf.idx_dim; ++d) {
      float acc = 0;
      for (int r = 0; r < cf.block; ++r) acc += KI[s][size_t(j * cf.block + r) * cf.idx_dim + d];
      m[d] = r16(acc / cf.block);
      ss += double(m[d]) * m[d];
    }
    const float rs = 1.f / std::sqrt(float(ss / cf.idx_dim) + eps);
    for (int d = 0; d < cf.idx_dim; ++d) m[d] = r16(m[d] * rs * (1.f + knw[d]));
    out = m;
    for (int i = 0; i < cf.rotary / 2; ++i) {
      float c, sn;
      rope_cs(i, cf.rotary, theta, int64_t(j) * cf.block, &c, &sn);
      out[i] = m[i] * c - m[i + cf.rotary / 2] * sn;
      out[i + cf.rotary / 2] = m[i + cf.rotary / 2] * c + m[i] * sn;
    }
    return out;
  };
  std::vector<std::vector<std::vector<float>>> pooled(nseq);
  for (int s = 0; s < nseq; ++s)
    for (int j = 0; j < cf.contexts[s] / cf.block; ++j) pooled[s].push_back(ref_pooled(s, j));

  // Steps: [0, a), [a, ctx-1), [ctx-1] (decode), with a chosen so that a block straddles the first two steps.
  std::vector<std::array<int, 2>> ranges[3];
  for (int s = 0; s < nseq; ++s) {
    const int ctx = cf.contexts[s];
    const int a = std::min(ctx - 1, ctx / 2 + (cf.block > 1 ? 1 : 0));
    ranges[0].push_back({0, a});
    ranges[1].push_back({a, ctx - 1});
    ranges[2].push_back({ctx - 1, ctx});
  }
  const int ld_sel = cf.top_blocks * cf.block + cf.block - 1;
  for (int step = 0; step < 3; ++step) {
    std::vector<int32_t> tseq, tpos;
    for (int s = 0; s < nseq; ++s)
      for (int p = ranges[step][s][0]; p < ranges[step][s][1]; ++p) {
        tseq.push_back(s);
        tpos.push_back(p);
      }
    const int T = int(tseq.size());
    if (T == 0) continue;
    std::vector<float> kin(size_t(T) * kvw), vin(size_t(T) * kvw), kiin(size_t(T) * cf.idx_dim);
    int ctx_max = 0;
    for (int t = 0; t < T; ++t) {
      std::copy_n(&K[tseq[t]][size_t(tpos[t]) * kvw], kvw, &kin[size_t(t) * kvw]);
      std::copy_n(&V[tseq[t]][size_t(tpos[t]) * kvw], kvw, &vin[size_t(t) * kvw]);
      std::copy_n(&KI[tseq[t]][size_t(tpos[t]) * cf.idx_dim], cf.idx_dim, &kiin[size_t(t) * cf.idx_dim]);
      ctx_max = std::max(ctx_max, tpos[t] + 1);
    }
    auto dseq = to_device(tseq), dpos = to_device(tpos);
    auto dk = dev_half(kin), dv = dev_half(vin), dki = dev_half(kiin);
    QsaBatch batch{dseq.get(), dpos.get(), T, ctx_max};
    qsa_cache_append(cache, batch, dk.get(), kvw, dv.get(), kvw, dki.get(), cf.idx_dim, dknw.get(), cf.rotary, theta,
                     eps, status.get(), nullptr);
    // Indexer queries, attention queries and gates of this step.
    auto qi = rand_f16_values(size_t(T) * cf.idx_heads * cf.idx_dim, 500 + step, -1.f, 1.f);
    auto q = rand_f16_values(size_t(T) * qw, 600 + step, -1.f, 1.f);
    auto gate = rand_f16_values(size_t(T) * qw * 2, 700 + step, -3.f, 3.f);  // q_proj layout [T, heads, 2D]
    auto dqi = dev_half(qi), dq = dev_half(q), dgate = dev_half(gate);
    DeviceArray<float> scores(qsa_scores_floats(cache, batch), "scores");
    DeviceArray<int32_t> sel(size_t(T) * ld_sel, "selected"), counts(T, "counts");
    qsa_index_select(cache, batch, dqi.get(), cf.idx_heads * cf.idx_dim, cf.idx_heads, cf.top_blocks, scores.get(),
                     sel.get(), ld_sel, counts.get(), status.get(), nullptr);
    const int max_sel = std::min(ctx_max, cf.top_blocks * cf.block + cf.block - 1);
    auto plan = qsa_attention_plan(T, cf.heads, cf.kv_heads, cf.dim, max_sel);
    DeviceArray<float> partial(std::max<int64_t>(1, plan.partial_floats), "partial");
    DeviceArray<__half> out(size_t(T) * qw, "out");
    // gate half of head h starts at h*2D + D
    qsa_sparse_attention(cache, batch, dq.get(), qw, cf.heads, sel.get(), ld_sel, counts.get(), plan,
                         dgate.get() + cf.dim, 2 * qw, 2 * cf.dim, partial.get(), out.get(), qw, status.get(), nullptr);
    sync();
    EXPECT_NO_THROW(qsa_check_status(status.get(), nullptr));
    auto hsel = download(sel.get(), sel.size());
    auto hcnt = download(counts.get(), T);
    auto hout = host_half(out.get(), out.size());
    std::vector<float> got, want;
    int checked = 0;
    for (int t = 0; t < T; ++t) {
      const int s = tseq[t], p = tpos[t];
      const int nb = (p + 1) / cf.block, k = std::min(cf.top_blocks, nb), tail = p + 1 - nb * cf.block;
      ASSERT_EQ(hcnt[t], k * cf.block + tail) << "count, step " << step << " token " << t;
      const int32_t* st = &hsel[size_t(t) * ld_sel];
      std::set<int> blocks;
      for (int i = 0; i < k; ++i) {
        const int j = st[i * cf.block] / cf.block;
        for (int r = 0; r < cf.block; ++r) ASSERT_EQ(st[i * cf.block + r], j * cf.block + r) << "whole block";
        if (i > 0) {
          ASSERT_GT(j, st[(i - 1) * cf.block] / cf.block) << "increasing blocks";
        }
        ASSERT_LT(j, nb);
        blocks.insert(j);
      }
      for (int i = 0; i < tail; ++i) ASSERT_EQ(st[k * cf.block + i], nb * cf.block + i) << "tail";
      const bool decode = step == 2;
      if (!decode && t % cf.check_every != 0) continue;
      ++checked;
      if (k < nb) {  // top-k validity under the CPU scores
        std::vector<double> sc(nb);
        for (int j = 0; j < nb; ++j) {
          double acc = 0;
          for (int h = 0; h < cf.idx_heads; ++h) {
            double dot = 0;
            for (int d = 0; d < cf.idx_dim; ++d)
              dot += double(qi[(size_t(t) * cf.idx_heads + h) * cf.idx_dim + d]) * pooled[s][j][d];
            acc += std::max(dot, 0.0);
          }
          sc[j] = acc / std::sqrt(double(cf.idx_dim));
        }
        double min_in = 1e300, max_out = -1e300;
        for (int j = 0; j < nb; ++j) {
          if (blocks.count(j)) {
            min_in = std::min(min_in, sc[j]);
          } else {
            max_out = std::max(max_out, sc[j]);
          }
        }
        EXPECT_GE(min_in, max_out - 1e-4 * (1 + std::fabs(max_out))) << "not a top-k, step " << step << " token " << t;
      }
      // Attention over the GPU's selection.
      for (int h = 0; h < cf.heads; ++h) {
        const int g = h / G;
        const int n = hcnt[t];
        std::vector<double> w(n);
        double mx = -1e300;
        for (int i = 0; i < n; ++i) {
          double dot = 0;
          for (int d = 0; d < cf.dim; ++d)
            dot += double(q[size_t(t) * qw + h * cf.dim + d]) * K[s][size_t(st[i]) * kvw + g * cf.dim + d];
          w[i] = dot / std::sqrt(double(cf.dim));
          mx = std::max(mx, w[i]);
        }
        double l = 0;
        for (auto& x : w) l += (x = std::exp(x - mx));
        for (int d = 0; d < cf.dim; ++d) {
          double o = 0;
          for (int i = 0; i < n; ++i) o += w[i] * V[s][size_t(st[i]) * kvw + g * cf.dim + d];
          const float gt = gate[size_t(t) * 2 * qw + h * 2 * cf.dim + cf.dim + d];
          want.push_back(float(o / l) * sigmoid(gt));
          got.push_back(hout[size_t(t) * qw + h * cf.dim + d]);
        }
      }
    }
    EXPECT_GT(checked, 0);
    expect_close(got, want, 2e-3f, 1e-2f,
                 "attention step " + std::to_string(step) + " (" + std::to_string(plan.splits) + " splits)");
  }
  // Pooled block keys at their physical places.
  auto hp = host_half(pc.get(), pc.size());
  std::vector<float> got, want;
  for (int s = 0; s < nseq; ++s)
    for (int j = 0; j < cf.contexts[s] / cf.block; ++j) {
      const int pos = j * cf.block;
      const int64_t row = int64_t(table[size_t(s) * table_ld + pos / cf.page_size]) * cf.page_size + pos % cf.page_size;
      const int64_t prow = row / cf.page_size * (cf.page_size / cf.block) + (row % cf.page_size) / cf.block;
      for (int d = 0; d < cf.idx_dim; ++d) {
        got.push_back(hp[size_t(prow) * cf.idx_dim + d]);
        want.push_back(pooled[s][j][d]);
      }
    }
  expect_close(got, want, 3e-3f, 4e-3f, "pooled block keys");
}

INSTANTIATE_TEST_SUITE_P(
    Configs, QsaPipeline,
    ::testing::Values(
        // budget 32 blocks x 4 = 128 tokens; contexts below, at and above it
        QsaConfig{6, 2, 64, 2, 32, 16, 4, 16, 32, {9, 128, 131, 300}, 1},
        // released head widths (24/2 heads of 256, indexer 4 x 128, rotary 64, budget 2048 in blocks of 4)
        QsaConfig{24, 2, 256, 4, 128, 64, 4, 64, 512, {2047, 2052, 2600}, 97},
        // a TP4 rank: 6 query heads on one KV head
        QsaConfig{6, 1, 256, 4, 128, 64, 4, 32, 16, {40, 200}, 3},
        // widths near 1: one head per KV head, blocks of one token, tiny dims
        QsaConfig{3, 3, 8, 1, 4, 2, 1, 4, 5, {1, 5, 12}, 1}));

TEST(QsaSelect, TieRuleHigherScoreThenLowerBlock) {
  // One query at position 43 (11 complete blocks of 4, tail 43..43 -> 44 = 11*4: no tail) and one at 45 (tail 44,45).
  std::vector<float> sc = {1, 3, 3, 2, 3, 0, 3, 1, 2, 3, 0.5f, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7};
  auto dsc = to_device(sc);
  auto dpos = to_device(std::vector<int32_t>{43, 45});
  const int block = 4, top = 3, ld = top * block + block - 1;
  DeviceArray<int32_t> sel(2 * ld, "sel"), cnt(2, "cnt");
  qsa_select_from_scores(dsc.get(), 11, dpos.get(), 2, block, top, sel.get(), ld, cnt.get(), nullptr);
  sync();
  auto hs = download(sel.get(), 2 * ld);
  auto hc = download(cnt.get(), 2);
  // Query 0: the 3's are blocks 1, 2, 4, 6, 9: the three lowest are taken.
  EXPECT_EQ(hc[0], 12);
  std::vector<int32_t> want0;
  for (int j : {1, 2, 4})
    for (int r = 0; r < 4; ++r) want0.push_back(j * 4 + r);
  EXPECT_EQ(std::vector<int32_t>(hs.begin(), hs.begin() + 12), want0);
  // Query 1: 11 equal scores: blocks 0, 1, 2, then the tail 44, 45.
  EXPECT_EQ(hc[1], 14);
  std::vector<int32_t> want1 = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 44, 45};
  EXPECT_EQ(std::vector<int32_t>(hs.begin() + ld, hs.begin() + ld + 14), want1);
}

TEST(QsaSelect, LargeContextMatchesSort) {
  // 8191 complete blocks (32K context), top 512, many duplicate scores: exact against a stable CPU sort.
  const int nb = 8191, top = 512, block = 4, p = nb * block + 2, ld = top * block + block - 1;
  std::mt19937 rng(9);
  std::vector<float> sc(nb);
  for (auto& x : sc) x = float(rng() % 2000) * 0.01f;  // ties everywhere
  auto dsc = to_device(sc);
  auto dpos = to_device(std::vector<int32_t>{p});
  DeviceArray<int32_t> sel(ld, "sel"), cnt(1, "cnt");
  qsa_select_from_scores(dsc.get(), nb, dpos.get(), 1, block, top, sel.get(), ld, cnt.get(), nullptr);
  sync();
  std::vector<int> order(nb);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sc[a] > sc[b]; });
  std::vector<int> chosen(order.begin(), order.begin() + top);
  std::sort(chosen.begin(), chosen.end());
  std::vector<int32_t> want;
  for (int j : chosen)
    for (int r = 0; r < block; ++r) want.push_back(j * block + r);
  for (int i = nb * block; i <= p; ++i) want.push_back(i);
  auto hs = download(sel.get(), ld);
  EXPECT_EQ(download(cnt.get(), 1)[0], int(want.size()));
  EXPECT_EQ(std::vector<int32_t>(hs.begin(), hs.begin() + want.size()), want);
}

TEST(QsaCache, BadBlockTableIsReportedNotFollowed) {
  const int P = 8, pages = 2, kv = 1, D = 16, Di = 8;
  std::vector<int32_t> table = {0, 5};  // page 5 does not exist
  auto dt = to_device(table);
  DeviceArray<__half> kc(pages * P * kv * D, "k"), vc(pages * P * kv * D, "v"), kic(pages * P * Di, "ki"),
      pc(pages * P / 4 * Di, "p");
  QsaCache cache{kc.get(), vc.get(), kic.get(), pc.get(), dt.get(), 2, pages, P, kv, D, Di, 4};
  auto seq = to_device(std::vector<int32_t>{0, 0}), pos = to_device(std::vector<int32_t>{3, 9});
  QsaBatch b{seq.get(), pos.get(), 2, 10};
  auto x = dev_half(std::vector<float>(2 * D, 0.5f));
  auto w = dev_half(std::vector<float>(Di, 0.f));
  DeviceArray<int32_t> status(1, "status");
  cudaMemset(status.get(), 0, 4);
  qsa_cache_append(cache, b, x.get(), D, x.get(), D, x.get(), D, w.get(), 4, 1e7f, 1e-6f, status.get(), nullptr);
  EXPECT_THROW(qsa_check_status(status.get(), nullptr), Error);
}

}  // namespace
}  // namespace flashnext::cuda::test
