// random_weights (weights.h): a random-weight model of any geometry, for `flashnext bench`.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "model/qwen4_exp/weights.h"
#include "ops/random_uniform.h"

namespace flashnext {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Makes each weight with its own seed (base seed + a running counter).
struct RandomGen {
  Ops& ops;
  uint64_t seed;

  Tensor uniform(const Shape& shape, float lo, float hi) { return ops.random_weight(shape, lo, hi, seed++); }
  /// A linear weight [out, in]: variance 1/in.
  Tensor linear(int64_t out, int64_t in) {
    const float a = std::sqrt(3.f / float(in));
    return uniform({out, in}, -a, a);
  }
  Tensor zc_norm(int64_t n) { return uniform({n}, -0.1f, 0.1f); }
  Tensor conv(int64_t channels, int64_t kernel) {
    const float a = std::sqrt(3.f / float(kernel));
    return uniform({channels, kernel}, -a, a);
  }
  HcWeights hc(int64_t S, int64_t H, int64_t R, bool inject) {
    HcWeights w{zc_norm(S * H), linear(R, S * H), linear(S * H, R), Tensor()};
    if (inject) w.inject = linear(S, S * H);
    return w;
  }
};

/// Fills `bytes` bytes at `p` with FP8 E4M3 codes of random sign and magnitude in [0.5, 1.875]: each byte is
/// 0x30 | (4 random bits) with a random sign bit, from one random_bits word per 8 bytes; `threads` threads.
void fill_fp8_table(uint8_t* p, int64_t bytes, uint64_t seed, int threads) {
  const int64_t words = bytes / 8;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([=] {
      const int64_t w0 = words * t / threads, w1 = words * (t + 1) / threads;
      for (int64_t w = w0; w < w1; ++w) {
        const uint64_t r = random_bits(seed, uint64_t(w));
        const uint64_t v = (r & 0x0F0F0F0F0F0F0F0Full) | 0x3030303030303030ull | ((r & 0x1010101010101010ull) << 3);
        std::memcpy(p + 8 * w, &v, 8);
      }
    });
  }
  for (std::thread& t : pool) t.join();
  for (int64_t i = words * 8; i < bytes; ++i) p[i] = 0x38;  // 1.0
}

}  // namespace

ModelWeights random_weights(const ModelConfig& cfg, Ops& ops, uint64_t seed, RandomWeightsReport* report,
                            const TpPlan* plan, int rank, bool with_mtp) {
  const auto t0 = std::chrono::steady_clock::now();
  RandomWeightsReport rep;
  const bool tp = plan && plan->world() > 1;
  const ModelConfig rc = tp ? plan->rank_config(rank) : cfg;  // the rank's heads and intermediate widths
  const IndexRange vocab = tp ? plan->rank(rank).vocab : IndexRange{0, cfg.vocab_size};
  const int64_t H = cfg.hidden_size, S = cfg.hc_count, W = cfg.hc_width(), R = cfg.hc_lowrank, V = vocab.size();
  const int64_t L = cfg.num_hidden_layers;

  // The PLE tables: host memory allocated (pinned, for the CUDA backend) and filled on another thread while the
  // device makes the other weights.
  struct PleJob {
    int64_t layer = 0;
    NgramHashParams hash;
    IndexRange held;  ///< the logical rows this rank holds
    HostTable table;  ///< those rows, then (when that is not all) the zero row that the other rows read
  };
  std::vector<PleJob> ple;
  for (int64_t l = 0; l < L; ++l)
    if (const int m = cfg.ple_index_of_layer(l); m >= 0) {
      const NgramHashParams h = ngram_hash_params(cfg, m);
      ple.push_back({l, h, tp ? plan->ple_rows(rank, h.rows) : IndexRange{0, h.rows}, {}});
    }
  rep.ple_fill_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  std::exception_ptr ple_error;
  std::thread ple_thread([&] {
    try {
      for (size_t i = 0; i < ple.size(); ++i) {
        auto t = std::chrono::steady_clock::now();
        const int64_t held = ple[i].held.size(), zero_rows = held < ple[i].hash.rows ? 1 : 0;
        ple[i].table = ops.host_table(DType::F8_E4M3, {held + zero_rows, cfg.ple_head_dim()});
        rep.ple_alloc_s += seconds_since(t);
        t = std::chrono::steady_clock::now();
        const int64_t bytes = int64_t(ple[i].table.table.nbytes()), zero_bytes = zero_rows * cfg.ple_head_dim();
        auto* p = static_cast<uint8_t*>(ple[i].table.host);
        fill_fp8_table(p, bytes - zero_bytes, seed ^ (0x5EED0000ull + i), rep.ple_fill_threads);
        std::memset(p + bytes - zero_bytes, 0, size_t(zero_bytes));  // FP8 E4M3 0x00 = 0.0
        rep.ple_fill_s += seconds_since(t);
        rep.ple_bytes += bytes;
      }
    } catch (...) {
      ple_error = std::current_exception();
    }
  });
  struct Join {
    std::thread& t;
    ~Join() {
      if (t.joinable()) t.join();
    }
  } join{ple_thread};

  RandomGen g{ops, seed};
  ModelWeights w;
  w.embed_tokens = g.uniform({V, H}, -std::sqrt(3.f), std::sqrt(3.f));
  w.lm_head = cfg.tie_word_embeddings ? w.embed_tokens : g.linear(V, H);
  if (tp) {  // the rank's vocabulary rows, then the zero row that the ids of other ranks read
    Tensor e = ops.zeros({V + 1, H}, w.embed_tokens.dtype());
    ops.copy_rows(w.embed_tokens, 0, e, 0, V);
    if (cfg.tie_word_embeddings) w.lm_head = e.rows(0, V);
    w.embed_tokens = std::move(e);
  }
  w.mixer = g.hc(S, H, R, false);
  const int64_t nk = rc.linear_num_key_heads, nv = rc.linear_num_value_heads, dk = cfg.linear_key_head_dim,
                dv = cfg.linear_value_head_dim;
  const int64_t nh = rc.num_attention_heads, nkv = rc.num_key_value_heads, D = cfg.head_dim;
  const int64_t E = cfg.num_experts, I = rc.moe_intermediate_size, Is = rc.shared_expert_intermediate_size;
  // Layer l's mixer, hyper-connections and MoE block (l = L: the MTP layer, a QSA layer).
  auto make_layer = [&](int64_t l, LayerKind kind) {
    const uint64_t layer_seed = seed + 1000 * uint64_t(l + 1);
    g.seed = layer_seed;
    LayerWeights lw;
    lw.kind = kind;
    lw.attn_hc = g.hc(S, H, R, true);
    lw.mlp_hc = g.hc(S, H, R, true);
    if (lw.kind == LayerKind::GatedDeltaNet && nv == 0) {
      // the rank sits this GDN layer out (loader/sharding.h): no weights
    } else if (lw.kind == LayerKind::GatedDeltaNet) {
      GdnLayerWeights& a = lw.gdn;
      a.in_proj_qkv = g.linear(2 * nk * dk + nv * dv, H);
      a.in_proj_z = g.linear(nv * dv, H);
      a.in_proj_b = g.linear(nv, H);
      a.in_proj_a = g.linear(nv, H);
      a.conv1d = g.conv(rc.gdn_conv_dim(), cfg.linear_conv_kernel_dim);
      a.norm = g.uniform({dv}, 0.9f, 1.1f);
      a.out_proj = g.linear(H, nv * dv);
      a.rule = GdnWeights{g.uniform({nv}, 0.f, std::log(16.f)), g.uniform({nv}, -6.9f, -2.3f)};
    } else if (nh > 0) {
      QsaLayerWeights& q = lw.qsa;
      q.q_proj = g.linear(nh * 2 * D, H);
      q.k_proj = g.linear(nkv * D, H);
      q.v_proj = g.linear(nkv * D, H);
      q.o_proj = g.linear(H, nh * D);
      if (cfg.attention_bias) {
        q.q_bias = g.uniform({nh * 2 * D}, -0.1f, 0.1f);
        q.k_bias = g.uniform({nkv * D}, -0.1f, 0.1f);
        q.v_bias = g.uniform({nkv * D}, -0.1f, 0.1f);
        q.o_bias = g.uniform({H}, -0.1f, 0.1f);
        if (tp && rank > 0) q.o_bias = Tensor();  // added once, by rank 0, before the sum
      }
      q.q_norm = g.zc_norm(D);
      q.k_norm = g.zc_norm(D);
      const int64_t ni = cfg.indexer_n_heads, Di = cfg.indexer_head_dim;
      Tensor qk = g.linear(ni * Di + Di, H);  // index_qk_proj, split as the loader splits it
      q.index_q_proj = qk.rows(0, ni * Di);
      q.index_k_proj = qk.rows(ni * Di, ni * Di + Di);
      q.index_q_norm = g.zc_norm(Di);
      q.index_k_norm = g.zc_norm(Di);
    }
    g.seed = layer_seed + 100;  // the same on every rank, whatever the mixer made
    lw.moe.router = g.linear(E, H);
    lw.moe.shared_expert_gate = g.linear(1, H);
    RoutedExperts r = ops.random_experts(E, I, H, g.seed);
    g.seed += 3;
    lw.moe.gate = std::move(r.gate);
    lw.moe.up = std::move(r.up);
    lw.moe.down = std::move(r.down);
    lw.moe.packed = std::move(r.packed);
    lw.moe.shared_gate_proj = g.linear(Is, H);
    lw.moe.shared_up_proj = g.linear(Is, H);
    lw.moe.shared_down_proj = g.linear(H, Is);
    return lw;
  };
  for (int64_t l = 0; l < L; ++l) {
    LayerWeights lw = make_layer(l, cfg.layer_types[size_t(l)]);
    g.seed = seed + 1000 * uint64_t(l + 1) + 200;
    if (cfg.ple_index_of_layer(l) >= 0) {
      PleLayerWeights p;
      const int64_t ped = cfg.ple_embed_dim;
      p.key_proj = g.linear(W, ped);
      p.value_proj = g.linear(H, ped);
      p.norm_key = g.zc_norm(W);
      p.norm_query = g.zc_norm(W);
      p.norm_conv = g.zc_norm(W);
      p.conv1d = g.conv(W, cfg.ple_conv_kernel_size);
      lw.ple = std::move(p);
    }
    w.layers.push_back(std::move(lw));
  }
  if (with_mtp) {  // the MTP layer (weights.h MtpWeights): its own norms, fc projections, mixer and QSA layer
    MtpWeights m;
    m.layer = make_layer(L, LayerKind::QSA);
    g.seed = seed + 1000 * uint64_t(L + 1) + 300;
    m.pre_fc_norm_embedding = g.zc_norm(H);
    m.pre_fc_norm_hidden = g.zc_norm(W);
    m.fc_embedding = g.linear(H, H);
    m.fc_hidden = g.linear(H, H);
    m.mixer = g.hc(S, H, R, false);
    w.mtp = std::move(m);
  }
  ops.synchronize();
  rep.weights_s = seconds_since(t0);
  ple_thread.join();
  if (ple_error) std::rethrow_exception(ple_error);
  for (PleJob& j : ple) {
    PleLayerWeights& p = *w.layers[size_t(j.layer)].ple;
    p.hash = j.hash;
    p.table.head_dim = cfg.ple_head_dim();
    p.table.rows = j.table.table.dim(0);
    p.rows_held = j.held;
    p.table.scale = 1.f;
    p.table.shards = {j.table.table};
  }
  rep.total_s = seconds_since(t0);
  if (report) *report = rep;
  return w;
}

}  // namespace flashnext
