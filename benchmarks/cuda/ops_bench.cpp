// bench_cuda: per-op timings of the baseline CUDA kernels at the released widths (hidden 2560, 4 HC streams of
// rank 320, GDN 16/48 heads of 128 with conv 4, QSA 24/2 heads of 256, ...). Prints one markdown table row per op
// with the time per call (CUDA events, mean of the timed calls after warm-up) and the achieved bandwidth (bytes the
// op must move at least) or arithmetic rate, against the ceilings of LIMITS.md: the device-to-device copy
// bandwidth measured at the start of the run and the FP16 tensor peak.
// Usage: bench_cuda [filter-substring]
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "bench_util.h"
#include "ops/cuda/blas.h"
#include "ops/cuda/buffer.h"
#include "ops/cuda/embedding.h"
#include "ops/cuda/gdn.h"
#include "ops/cuda/hc.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/norm.h"
#include "ops/cuda/ple.h"
#include "ops/cuda/qsa.h"
#include "ops/cuda/sampling.h"

using namespace flashnext::cuda;
using flashnext::cuda::bench::time_ms;

namespace {

double g_copy_gbs = 0;                // measured device-to-device copy bandwidth (read + write), GB/s
constexpr double kFp16Peak = 790e12;  // H200 FP16/BF16 tensor GEMM as measured (LIMITS.md: 770-800 TFLOP/s)
const char* g_filter = nullptr;

// bytes: minimum bytes moved; flops: arithmetic (0 when the op is bandwidth-bound by nature).
void report(const std::string& op, const std::string& shape, const std::function<void()>& fn, double bytes,
            double flops, int iters = 50) {
  if (g_filter && op.find(g_filter) == std::string::npos) return;
  const double ms = time_ms(fn, iters);
  const double gbs = bytes / (ms * 1e-3) / 1e9;
  std::printf("| %s | %s | %.1f | %.0f GB/s (%.0f%% of copy)", op.c_str(), shape.c_str(), ms * 1e3, gbs,
              100.0 * gbs / g_copy_gbs);
  if (flops > 0) {
    const double tf = flops / (ms * 1e-3) / 1e12;
    std::printf(" | %.2f TFLOP/s (%.1f%% of measured GEMM)", tf, 100.0 * tf * 1e12 / kFp16Peak);
  } else {
    std::printf(" | -");
  }
  std::printf(" |\n");
  std::fflush(stdout);
}

template <class T>
DeviceArray<T> filled(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<T> h(n);
  for (auto& x : h) x = T(d(rng));
  return to_device(h, "bench input");
}

DeviceArray<__half> halfs(size_t n, float lo = -1.f, float hi = 1.f, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<__half> h(n);
  for (auto& x : h) x = __float2half(d(rng));
  return to_device(h, "bench input");
}

void bench_norm_hc() {
  const int S = 4, H = 2560, R = 320, W = S * H;
  Blas blas;
  for (int T : {1, 64, 4096}) {
    auto x = halfs(size_t(T) * W, -2, 2), y = halfs(size_t(T) * W);
    auto w = halfs(W, -0.1f, 0.1f);
    report(
        "zc_rmsnorm (HC grouped)", "T=" + std::to_string(T) + " x 4x2560",
        [&] { zc_rmsnorm(x.get(), W, y.get(), W, w.get(), W, T, W, H, 1e-6f, nullptr); }, 2.0 * T * W * 2, 0);
    auto wd = halfs(size_t(R) * W, -0.01f, 0.01f), wu = halfs(size_t(W) * R, -0.05f, 0.05f);
    auto wi = halfs(size_t(S) * W, -0.01f, 0.01f);
    auto u = halfs(size_t(T) * H);
    DeviceArray<float> inj(size_t(T) * S, "inject");
    HcWorkspace ws(T, S, H, R);
    HcWeights wt{w.get(), wd.get(), wu.get(), wi.get(), S, H, R, 1e-6f};
    const double wbytes = (2.0 * R * W + S * W + W) * 2;
    const double abytes = T * (2.0 * W * 2 /*x read, N write*/ + 2.0 * W * 2 /*N, m read*/ + 2.0 * W /*m write*/);
    report(
        "hc_read (norm+mix+inject w)", "T=" + std::to_string(T),
        [&] { hc_read(blas, wt, x.get(), T, nullptr, nullptr, u.get(), inj.get(), ws, nullptr); }, wbytes + abytes,
        2.0 * T * (2.0 * R * W + S * W));
    auto yv = halfs(size_t(T) * H);
    report(
        "hc_inject", "T=" + std::to_string(T), [&] { hc_inject(x.get(), yv.get(), inj.get(), T, S, H, nullptr); },
        T * (2.0 * W * 2 + H * 2), 0);
  }
}

void bench_gdn() {
  const GdnDims d{16, 48, 128, 128};
  const int C = d.conv_channels(), K = 4;
  auto alog = filled<float>(d.nv, -2, 1, 3), dtb = filled<float>(d.nv, -1, 1, 4);
  auto w = halfs(size_t(C) * K);
  for (int B : {1, 32}) {
    auto x = halfs(size_t(B) * C), y = halfs(size_t(B) * C);
    auto cst = halfs(size_t(B) * C * (K - 1));
    std::vector<int32_t> sl(B);
    for (int i = 0; i < B; ++i) sl[i] = i;
    auto slots = to_device(sl);
    report(
        "gdn_conv_update", "B=" + std::to_string(B),
        [&] { gdn_conv_update(x.get(), C, B, cst.get(), slots.get(), w.get(), y.get(), C, C, K, nullptr); },
        2.0 * B * C * (2 + 2 * (K - 1)) + 2.0 * C * K, 0);
    auto ab = halfs(size_t(B) * d.nv, -2, 2);
    DeviceArray<float> st(size_t(B) * d.nv * d.dk * d.dv, "state");
    cudaMemset(st.get(), 0, st.size() * 4);
    auto out = halfs(size_t(B) * d.nv * d.dv);
    report(
        "gdn_recurrent_step (fp32 state)", "B=" + std::to_string(B),
        [&] {
          gdn_recurrent_step(y.get(), C, ab.get(), ab.get(), d.nv, alog.get(), dtb.get(), st.get(), slots.get(), B, d,
                             out.get(), d.nv * d.dv, nullptr);
        },
        2.0 * B * d.nv * d.dk * d.dv * 4 + 2.0 * B * (C + d.nv * d.dv), 0);
  }
  for (int T : {512, 4096}) {
    auto x = halfs(size_t(T) * C), y = halfs(size_t(T) * C);
    auto cst = halfs(size_t(C) * (K - 1));
    auto slots = to_device(std::vector<int32_t>{0});
    auto cu = to_device(std::vector<int32_t>{0, T});
    report(
        "gdn_conv_prefill", "T=" + std::to_string(T),
        [&] {
          gdn_conv_prefill(x.get(), C, cu.get(), 1, T, cst.get(), slots.get(), w.get(), y.get(), C, C, K, nullptr);
        },
        2.0 * T * C * 2, 0);
    auto ab = halfs(size_t(T) * d.nv, -2, 2);
    DeviceArray<float> st(size_t(d.nv) * d.dk * d.dv, "state");
    cudaMemset(st.get(), 0, st.size() * 4);
    auto out = halfs(size_t(T) * d.nv * d.dv);
    // FLOPs of the chunked form per token and value head: W·S, q·S, k^T·v_new (3 * 2*dk*dv) + intra-chunk terms.
    const double flops = double(T) * d.nv * (3.0 * 2 * d.dk * d.dv + 2.0 * 32 * (2 * d.dk + d.dv + d.dk));
    report(
        "gdn_chunked_prefill (fp32)", "T=" + std::to_string(T),
        [&] {
          gdn_chunked_prefill(y.get(), C, ab.get(), ab.get(), d.nv, alog.get(), dtb.get(), st.get(), slots.get(),
                              cu.get(), 1, d, out.get(), d.nv * d.dv, nullptr);
        },
        double(T) * (C + 2 * d.nv + d.nv * d.dv) * 2, flops, 5);
    auto z = halfs(size_t(T) * d.nv * d.dv), nw = halfs(d.dv, 0.5f, 1.5f);
    report(
        "gated_rmsnorm (GDN out)", "T=" + std::to_string(T),
        [&] {
          gated_rmsnorm(out.get(), d.nv * d.dv, z.get(), d.nv * d.dv, out.get(), d.nv * d.dv, nw.get(), T, d.nv, d.dv,
                        1e-6f, nullptr);
        },
        3.0 * T * d.nv * d.dv * 2, 0);
  }
}

void bench_qsa_norm() {
  for (int T : {1, 4096}) {
    auto q = halfs(size_t(T) * 24 * 512), qo = halfs(size_t(T) * 24 * 256), w = halfs(256, -0.1f, 0.1f);
    std::vector<int32_t> p(T);
    for (int i = 0; i < T; ++i) p[i] = i;
    auto pos = to_device(p);
    report(
        "head_norm_rope (QSA q)", "T=" + std::to_string(T),
        [&] {
          head_norm_rope(q.get(), 24 * 512, 512, qo.get(), 24 * 256, 256, w.get(), pos.get(), T, 24, 256, 64, 1e7f,
                         1e-6f, nullptr);
        },
        2.0 * T * 24 * 256 * 2, 0);
  }
}

// QSA at the released widths: one sequence with a 32K-token context in pages of 64, budget 2048 in blocks of 4.
void bench_qsa() {
  const int nh = 24, nkv = 2, D = 256, ni = 4, Di = 128, c = 4, P = 64, top = 512, ctx = 32768;
  const int pages = ctx / P;
  std::vector<int32_t> table(pages);
  for (int i = 0; i < pages; ++i) table[i] = (i * 7) % pages;  // scattered pages
  auto bt = to_device(table);
  auto kc = halfs(size_t(ctx) * nkv * D), vc = halfs(size_t(ctx) * nkv * D), kic = halfs(size_t(ctx) * Di),
       pc = halfs(size_t(ctx / c) * Di);
  QsaCache cache{kc.get(), vc.get(), kic.get(), pc.get(), bt.get(), pages, pages, P, nkv, D, Di, c};
  DeviceArray<int32_t> status(1, "status");
  cudaMemset(status.get(), 0, 4);
  auto knw = halfs(Di, -0.1f, 0.1f);
  const int ld_sel = top * c + c - 1;
  for (int T : {1, 8, 4096}) {
    std::vector<int32_t> seq(T, 0), pos(T);
    for (int t = 0; t < T; ++t) pos[t] = ctx - T + t;
    auto dseq = to_device(seq), dpos = to_device(pos);
    QsaBatch b{dseq.get(), dpos.get(), T, ctx};
    auto k = halfs(size_t(T) * nkv * D), ki = halfs(size_t(T) * Di);
    const std::string shape = "T=" + std::to_string(T) + " at 32K context";
    report(
        "qsa_cache_append (+pooled keys)", shape,
        [&] {
          qsa_cache_append(cache, b, k.get(), nkv * D, k.get(), nkv * D, ki.get(), Di, knw.get(), 64, 1e7f, 1e-6f,
                           status.get(), nullptr);
        },
        T * (2.0 * nkv * D * 2 * 2 + Di * 2 * 2), 0);
    auto qi = halfs(size_t(T) * ni * Di);
    DeviceArray<float> scores(qsa_scores_floats(cache, b), "scores");
    DeviceArray<int32_t> sel(size_t(T) * ld_sel, "sel"), cnt(T, "cnt");
    const double nb = ctx / c;
    report(
        "qsa_index_select (scores+top-k)", shape,
        [&] {
          qsa_index_select(cache, b, qi.get(), ni * Di, ni, top, scores.get(), sel.get(), ld_sel, cnt.get(),
                           status.get(), nullptr);
        },
        nb * Di * 2 + T * nb * 4 * 2 /*scores write+read*/, T * nb * ni * Di * 2.0);
    auto q = halfs(size_t(T) * nh * D), gate = halfs(size_t(T) * nh * D * 2);
    auto plan = qsa_attention_plan(T, nh, nkv, D, ld_sel);
    DeviceArray<float> partial(std::max<int64_t>(1, plan.partial_floats), "partial");
    auto out = halfs(size_t(T) * nh * D);
    report(
        "qsa_sparse_attention (" + std::to_string(plan.splits) + " splits)", shape,
        [&] {
          qsa_sparse_attention(cache, b, q.get(), nh * D, nh, sel.get(), ld_sel, cnt.get(), plan, gate.get() + D,
                               2 * nh * D, 2 * D, partial.get(), out.get(), nh * D, status.get(), nullptr);
        },
        T * (2051.0 * nkv * D * 2 * 2 + 2.0 * nh * D * 2 * 2), T * 2051.0 * nh * D * 4);
  }
}

DeviceArray<__half> constant_halfs(size_t n, uint8_t byte) {  // large weights: a constant pattern, fast to make
  DeviceArray<__half> d(n, "bench weights");
  cudaMemset(d.get(), byte, n * 2);
  return d;
}

// MoE at the released widths: 512 FP16 experts of width 640, top-10, hidden 2560, shared expert of width 640.
void bench_moe() {
  const int E = 512, H = 2560, I = 640, k = 10;
  auto gu = constant_halfs(size_t(E) * 2 * I * H, 0x1c), dn = constant_halfs(size_t(E) * H * I, 0x1c);
  auto router = halfs(size_t(E) * H, -0.02f, 0.02f);
  auto sg = halfs(size_t(I) * H, -0.02f, 0.02f), su = halfs(size_t(I) * H, -0.02f, 0.02f),
       sd = halfs(size_t(H) * I, -0.02f, 0.02f), sgl = halfs(H, -0.02f, 0.02f);
  Blas blas;
  for (int T : {1, 64, 4096}) {
    const std::string shape = "T=" + std::to_string(T);
    auto u = halfs(size_t(T) * H);
    DeviceArray<float> logits(size_t(T) * E, "logits"), w(size_t(T) * k, "w"), sgate(T, "sgate");
    DeviceArray<int32_t> ids(size_t(T) * k, "ids");
    report(
        "router GEMM + moe_router_topk (fp32)", shape,
        [&] {
          blas.linear(u.get(), T, H, router.get(), E, logits.get(), OutType::F32, E, nullptr, "router");
          moe_router_topk(logits.get(), E, T, E, k, true, ids.get(), w.get(), nullptr);
        },
        E * H * 2.0 + T * (H * 2.0 + E * 4.0 * 2), 2.0 * T * E * H);
    MoeWorkspace ws(T, k, E, H, I);
    auto out = halfs(size_t(T) * H), sh = halfs(size_t(T) * H);
    blas.linear(u.get(), T, H, router.get(), E, logits.get(), OutType::F32, E, nullptr, "router");
    moe_router_topk(logits.get(), E, T, E, k, true, ids.get(), w.get(), nullptr);
    const auto hids = download(ids.get(), size_t(T) * k);
    const double experts_touched = double(std::set<int32_t>(hids.begin(), hids.end()).size());
    report(
        "moe_routed (grouped FP16 WMMA, " + std::to_string(int(experts_touched)) + " experts hit)", shape,
        [&] {
          moe_routed(MoeExperts{gu.get(), dn.get(), E, H, I}, u.get(), H, T, ids.get(), w.get(), sh.get(), sgate.get(),
                     out.get(), H, ws, nullptr);
        },
        experts_touched * 3.0 * I * H * 2, double(T) * k * 2.0 * 3 * I * H);
    SharedExpertWorkspace sws(T, I);
    report(
        "moe_shared (cuBLAS)", shape,
        [&] {
          moe_shared(blas, SharedExpert{sg.get(), su.get(), sd.get(), sgl.get(), H, I}, u.get(), T, sh.get(),
                     sgate.get(), sws, nullptr);
        },
        3.0 * I * H * 2, 2.0 * T * 3 * I * H);
  }
}

// PLE: 16 heads x 160 per token from a 4 GiB FP8 table (pinned host, read through UVA; and in device memory),
// gating and dilated conv at 4 x 2560.
void bench_ple() {
  const int heads = 16, dim = 160, S = 4, H = 2560, W = S * H;
  const int64_t rows_total = (int64_t(4) << 30) / dim;
  PinnedMemory host(size_t(rows_total) * dim, "bench PLE table");
  std::memset(host.host(), 0x38, host.bytes());
  DeviceMemory dev(size_t(rows_total) * dim, "bench PLE table");
  cudaMemset(dev.get(), 0x38, dev.bytes());
  PleTable th({host.device()}, rows_total, rows_total, dim, PleTableType::F8E4M3, 1.f);
  PleTable td({dev.get()}, rows_total, rows_total, dim, PleTableType::F8E4M3, 1.f);
  for (int T : {1, 64, 4096}) {
    std::mt19937_64 rng(T);
    std::vector<int64_t> rows(size_t(T) * heads);
    for (auto& r : rows) r = int64_t(rng() % uint64_t(rows_total));
    auto drows = to_device(rows);
    DeviceArray<__half> e(size_t(T) * heads * dim, "e");
    const std::string shape = "T=" + std::to_string(T);
    report(
        "ple_gather (FP8 table, pinned host UVA)", shape,
        [&] { ple_gather(th, drows.get(), T, heads, e.get(), nullptr, nullptr); }, double(T) * heads * dim, 0, 20);
    report(
        "ple_gather (FP8 table, device)", shape,
        [&] { ple_gather(td, drows.get(), T, heads, e.get(), nullptr, nullptr); }, double(T) * heads * dim, 0);
    auto key = halfs(size_t(T) * W), x = halfs(size_t(T) * W), v = halfs(size_t(T) * H), nw = halfs(W, -0.1f, 0.1f);
    auto p = halfs(size_t(T) * W), pn = halfs(size_t(T) * W);
    report(
        "ple_gate (3 grouped norms + gate)", shape,
        [&] {
          ple_gate(key.get(), v.get(), x.get(), nw.get(), nw.get(), nw.get(), T, S, H, 1e-6f, p.get(), pn.get(),
                   nullptr);
        },
        T * (4.0 * W * 2 + H * 2), 0);
    auto st = halfs(size_t(9) * W), cw = halfs(size_t(W) * 4);
    auto cu = to_device(std::vector<int32_t>{0, T});
    auto slot = to_device(std::vector<int32_t>{0});
    report(
        "ple_conv (dilated, + residual)", shape,
        [&] { ple_conv(x.get(), p.get(), pn.get(), cu.get(), 1, T, st.get(), slot.get(), cw.get(), W, 4, 3, nullptr); },
        T * (4.0 * W * 2), 0);
  }
}

void bench_head_and_sampling() {
  const int H = 2560, V = 248320;
  auto w = constant_halfs(size_t(V) * H, 0x1c);
  Blas blas;
  for (int T : {1, 8, 256}) {
    auto h = halfs(size_t(T) * H);
    DeviceArray<float> logits(size_t(T) * V, "logits");
    const std::string shape = "T=" + std::to_string(T);
    report(
        "lm_head (cuBLAS, FP32 logits)", shape,
        [&] { lm_head(blas, h.get(), T, H, w.get(), V, logits.get(), V, nullptr); },
        double(V) * H * 2 + double(T) * V * 4, 2.0 * T * V * H);
    auto lg = filled<float>(size_t(T) * V, -10, 10, 5);
    DeviceArray<int32_t> tok(T, "tokens");
    for (auto [name, sp] : std::vector<std::pair<std::string, SamplingParams>>{
             {"greedy", SamplingParams{0.f, 0, 1.f, 0.f, 1, 0}},
             {"T=0.7 top-k 50", SamplingParams{0.7f, 50, 1.f, 0.f, 1, 0}},
             {"T=0.7 top-p 0.9 min-p 0.05", SamplingParams{0.7f, 0, 0.9f, 0.05f, 1, 0}}}) {
      auto params = to_device(std::vector<SamplingParams>(T, sp));
      report(
          "sample_tokens (" + name + ")", shape,
          [&] { sample_tokens(lg.get(), V, T, V, params.get(), tok.get(), nullptr); }, double(T) * V * 4, 0);
    }
  }
  auto table = constant_halfs(size_t(V) * H, 0x1c);
  for (int T : {1, 4096}) {
    std::vector<int32_t> ids(T);
    for (int i = 0; i < T; ++i) ids[i] = (i * 7919) % V;
    auto dids = to_device(ids);
    DeviceArray<__half> x(size_t(T) * 4 * H, "x");
    report(
        "embed_tokens (x4 streams)", "T=" + std::to_string(T),
        [&] { embed_tokens(table.get(), V, H, dids.get(), T, 4, x.get(), nullptr, nullptr); }, T * 5.0 * H * 2, 0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) g_filter = argv[1];
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "bench_cuda: no CUDA GPU\n");
    return 1;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  g_copy_gbs = bench::measure_copy_gbs();
  std::printf("bench_cuda on %s: device-to-device copy %.0f GB/s (read + write)\n\n", prop.name, g_copy_gbs);
  std::printf("| op | shape | us/call | bandwidth | arithmetic |\n| --- | --- | --- | --- | --- |\n");
  try {
    bench_norm_hc();
    bench_gdn();
    bench_qsa_norm();
    bench_qsa();
    bench_moe();
    bench_ple();
    bench_head_and_sampling();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda: %s\n", e.what());
    return 1;
  }
  return 0;
}
