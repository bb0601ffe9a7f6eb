#include "ops/cuda/hc.h"

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/hc_kernels.h"

namespace flashnext::cuda {

HcWorkspace::HcWorkspace(int max_tokens, int streams, int hidden, int rank)
    : max_tokens_(max_tokens),
      streams_(streams),
      hidden_(hidden),
      rank_(rank),
      n_(size_t(max_tokens) * streams * hidden, "hc normed residual"),
      down_(size_t(max_tokens) * rank, "hc low-rank down"),
      act_(size_t(max_tokens) * rank, "hc low-rank act"),
      up_(size_t(max_tokens) * streams * hidden, "hc mix logits") {
  FN_CHECK(max_tokens > 0 && streams > 0 && hidden > 0 && rank > 0, "HcWorkspace: bad sizes T={} S={} H={} rank={}",
           max_tokens, streams, hidden, rank);
}

void hc_read(Blas& blas, const HcWeights& wt, __half* x, int tokens, const __half* y_prev, const float* w_prev,
             __half* u_out, float* inject_out, HcWorkspace& ws, cudaStream_t stream) {
  FN_CHECK(wt.streams >= 1 && wt.streams <= detail::kHcMaxStreams, "hc_read: hc_count {} is outside 1..{}", wt.streams,
           detail::kHcMaxStreams);
  FN_CHECK(wt.hidden >= 1 && wt.rank >= 1, "hc_read: bad hidden {} / rank {}", wt.hidden, wt.rank);
  FN_CHECK(wt.norm_w && wt.w_down && wt.w_up, "hc_read: missing hc_norm / input_mix weights");
  FN_CHECK(tokens >= 0 && tokens <= ws.max_tokens_, "hc_read: {} tokens exceed the workspace's {}", tokens,
           ws.max_tokens_);
  FN_CHECK(ws.streams_ == wt.streams && ws.hidden_ == wt.hidden && ws.rank_ == wt.rank,
           "hc_read: workspace sized for S={} H={} rank={}, weights have S={} H={} rank={}", ws.streams_, ws.hidden_,
           ws.rank_, wt.streams, wt.hidden, wt.rank);
  FN_CHECK(x && u_out, "hc_read: null residual or output");
  FN_CHECK(!wt.w_inject || inject_out, "hc_read: block_inject_weight given but no inject output");
  FN_CHECK((y_prev == nullptr) == (w_prev == nullptr), "hc_read: a pending inject needs both y and w");
  if (tokens == 0) return;
  const int width = wt.streams * wt.hidden;
  FN_CUDA_CHECK(detail::launch_hc_norm(x, y_prev, w_prev, wt.norm_w, wt.w_inject, ws.n_.get(), inject_out, tokens,
                                       wt.streams, wt.hidden, wt.eps, stream),
                "hc_read norm");
  blas.linear(ws.n_.get(), tokens, width, wt.w_down, wt.rank, ws.down_.get(), OutType::F32, wt.rank, stream,
              "hc_read input_mix_weight_down");
  FN_CUDA_CHECK(detail::launch_hc_act(ws.down_.get(), ws.act_.get(), tokens, wt.rank, wt.streams, stream),
                "hc_read silu");
  blas.linear(ws.act_.get(), tokens, wt.rank, wt.w_up, width, ws.up_.get(), OutType::F16, width, stream,
              "hc_read input_mix_weight_up");
  FN_CUDA_CHECK(detail::launch_hc_mix(ws.up_.get(), ws.n_.get(), u_out, tokens, wt.streams, wt.hidden, stream),
                "hc_read mix");
}

void hc_inject(__half* x, const __half* y, const float* w, int tokens, int streams, int hidden, cudaStream_t stream) {
  FN_CHECK(tokens >= 0 && streams >= 1 && hidden >= 1, "hc_inject: bad shape T={} S={} H={}", tokens, streams, hidden);
  FN_CHECK(x && y && w, "hc_inject: null pointer");
  FN_CUDA_CHECK(detail::launch_hc_inject(x, y, w, tokens, streams, hidden, stream), "hc_inject");
}

}  // namespace flashnext::cuda
