#include "ops/cuda/moe.h"

#include <algorithm>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/moe_kernels.h"

namespace flashnext::cuda {

void moe_router_topk(const float* logits, int64_t ld, int tokens, int experts, int top_k, bool norm_topk_prob,
                     int32_t* ids, float* weights, cudaStream_t stream) {
  FN_CHECK(experts >= 1 && experts <= detail::kMoeMaxExperts, "moe_router_topk: {} experts (1..{})", experts,
           detail::kMoeMaxExperts);
  FN_CHECK(top_k >= 1 && top_k <= std::min(experts, detail::kMoeMaxTopK),
           "moe_router_topk: top-k {} must be in 1..min(experts {}, {})", top_k, experts, detail::kMoeMaxTopK);
  FN_CHECK(tokens >= 0 && ld >= experts, "moe_router_topk: tokens {} / row stride {} (experts {})", tokens, ld,
           experts);
  FN_CHECK(tokens == 0 || (logits && ids && weights), "moe_router_topk: null pointer");
  FN_CUDA_CHECK(
      detail::launch_moe_router_topk(logits, ld, tokens, experts, top_k, norm_topk_prob, ids, weights, stream),
      "moe_router_topk");
}

MoeWorkspace::MoeWorkspace(int max_tokens_, int top_k_, int experts_, int hidden_, int inter_)
    : max_tokens(max_tokens_),
      top_k(top_k_),
      experts(experts_),
      hidden(hidden_),
      inter(inter_),
      max_tiles((max_tokens_ * top_k_ + detail::kMoeTileM - 1) / detail::kMoeTileM +
                std::min(experts_, max_tokens_ * top_k_)),
      offsets(size_t(experts_) + 1, "moe expert offsets"),
      sorted_slots(size_t(max_tokens_) * top_k_, "moe sorted slots"),
      slot_row(size_t(max_tokens_) * top_k_, "moe slot rows"),
      tile_expert(std::max(1, max_tiles), "moe tiles"),
      tile_row(std::max(1, max_tiles), "moe tiles"),
      num_tiles(1, "moe tile count"),
      status(1, "moe status"),
      h(size_t(max_tokens_) * top_k_ * inter_, "moe expert activations"),
      ys(size_t(max_tokens_) * top_k_ * hidden_, "moe expert outputs") {
  FN_CHECK(max_tokens > 0 && top_k > 0 && experts > 0 && hidden > 0 && inter > 0,
           "MoeWorkspace: bad sizes tokens={} top_k={} experts={} hidden={} inter={}", max_tokens, top_k, experts,
           hidden, inter);
  FN_CUDA_CHECK(cudaMemset(status.get(), 0, sizeof(int32_t)), "MoeWorkspace status");
}

void moe_routed(const MoeExperts& w, const __half* u, int64_t ldu, int tokens, const int32_t* ids, const float* weights,
                const __half* shared, const float* shared_gate, __half* out, int64_t ldo, MoeWorkspace& ws,
                cudaStream_t stream) {
  FN_CHECK(w.gate_up && w.down, "moe_routed: missing expert weights");
  FN_CHECK(w.experts >= 1 && w.experts <= detail::kMoeMaxExperts, "moe_routed: {} experts (1..{})", w.experts,
           detail::kMoeMaxExperts);
  FN_CHECK(w.hidden % 8 == 0 && w.inter % 8 == 0 && w.hidden > 0 && w.inter > 0,
           "moe_routed: hidden {} and expert width {} must be positive multiples of 8", w.hidden, w.inter);
  FN_CHECK(ws.experts == w.experts && ws.hidden == w.hidden && ws.inter == w.inter,
           "moe_routed: workspace made for E={} H={} I={}, weights have E={} H={} I={}", ws.experts, ws.hidden,
           ws.inter, w.experts, w.hidden, w.inter);
  FN_CHECK(tokens >= 0 && tokens <= ws.max_tokens, "moe_routed: {} tokens exceed the workspace's {}", tokens,
           ws.max_tokens);
  FN_CHECK(ldu >= w.hidden && ldu % 8 == 0 && ldo >= w.hidden, "moe_routed: row strides u {} / out {} (H {})", ldu, ldo,
           w.hidden);
  FN_CHECK(!shared || shared_gate, "moe_routed: the shared expert output needs its gate logits");
  if (tokens == 0) return;
  FN_CHECK(u && ids && weights && out, "moe_routed: null pointer");
  const int slots = tokens * ws.top_k;
  const int max_tiles = (slots + detail::kMoeTileM - 1) / detail::kMoeTileM + std::min(w.experts, slots);
  FN_CUDA_CHECK(
      detail::launch_moe_align(ids, slots, w.experts, ws.offsets.get(), ws.sorted_slots.get(), ws.slot_row.get(),
                               ws.tile_expert.get(), ws.tile_row.get(), ws.num_tiles.get(), ws.status.get(), stream),
      "moe_routed align");
  FN_CUDA_CHECK(detail::launch_moe_gate_up(u, ldu, ws.top_k, w.gate_up, w.hidden, w.inter, ws.offsets.get(),
                                           ws.sorted_slots.get(), ws.tile_expert.get(), ws.tile_row.get(),
                                           ws.num_tiles.get(), max_tiles, ws.h.get(), stream),
                "moe_routed gate_up");
  FN_CUDA_CHECK(detail::launch_moe_down(ws.h.get(), w.down, w.hidden, w.inter, ws.offsets.get(), ws.sorted_slots.get(),
                                        weights, ws.tile_expert.get(), ws.tile_row.get(), ws.num_tiles.get(), max_tiles,
                                        ws.ys.get(), stream),
                "moe_routed down");
  FN_CUDA_CHECK(detail::launch_moe_combine(ws.ys.get(), ws.slot_row.get(), tokens, ws.top_k, w.hidden, shared,
                                           shared_gate, out, ldo, stream),
                "moe_routed combine");
}

void detail::check_expert_status(const int32_t* status, int experts, const char* op, cudaStream_t stream) {
  FN_CUDA_CHECK(cudaStreamSynchronize(stream), op);
  int32_t v = 0;
  FN_CUDA_CHECK(cudaMemcpy(&v, status, sizeof v, cudaMemcpyDeviceToHost), op);
  FN_CHECK(v == 0, "{}: expert ids outside 0..{} were given; those slots were dropped", op, experts - 1);
}

void moe_check_status(MoeWorkspace& ws, cudaStream_t stream) {
  detail::check_expert_status(ws.status.get(), ws.experts, "moe_routed", stream);
}

SharedExpertWorkspace::SharedExpertWorkspace(int max_tokens_, int inter)
    : max_tokens(max_tokens_),
      g(size_t(max_tokens_) * inter, "shared expert gate"),
      u(size_t(max_tokens_) * inter, "shared expert up"),
      a(size_t(max_tokens_) * inter, "shared expert act") {}

void moe_shared(Blas& blas, const SharedExpert& w, const __half* x, int tokens, __half* out, float* gate_logit_out,
                SharedExpertWorkspace& ws, cudaStream_t stream) {
  FN_CHECK(w.gate && w.up && w.down && w.gate_logit && w.hidden > 0 && w.inter > 0,
           "moe_shared: missing shared expert weights or sizes");
  FN_CHECK(tokens >= 0 && tokens <= ws.max_tokens, "moe_shared: {} tokens exceed the workspace's {}", tokens,
           ws.max_tokens);
  if (tokens == 0) return;
  blas.linear(x, tokens, w.hidden, w.gate, w.inter, ws.g.get(), OutType::F16, w.inter, stream,
              "shared_expert.gate_proj");
  blas.linear(x, tokens, w.hidden, w.up, w.inter, ws.u.get(), OutType::F16, w.inter, stream, "shared_expert.up_proj");
  FN_CUDA_CHECK(detail::launch_silu_mul(ws.g.get(), ws.u.get(), w.inter, ws.a.get(), w.inter, tokens, w.inter, stream),
                "moe_shared silu");
  blas.linear(ws.a.get(), tokens, w.inter, w.down, w.hidden, out, OutType::F16, w.hidden, stream,
              "shared_expert.down_proj");
  blas.linear(x, tokens, w.hidden, w.gate_logit, 1, gate_logit_out, OutType::F32, 1, stream, "shared_expert_gate");
}

}  // namespace flashnext::cuda
