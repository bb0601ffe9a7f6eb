// The CUDA backend's MoE ops: the router (float32 logits, softmax top-k on the GPU), routed experts (the W4A16
// grouped kernels of moe_w4a16.h for packed experts; per-expert cuBLAS products in FP16x2 or the WMMA grouped FP16
// kernels for stacked FP16 experts) and the gated shared expert.
#include <cuda_fp16.h>

#include <algorithm>
#include <exception>
#include <vector>

#include "ops/contract/moe.h"
#include "ops/cuda/backend.h"
#include "ops/cuda/moe_kernels.h"

namespace flashnext::cuda {

void CudaOps::moe_router_topk(const Tensor& u, const Tensor& router, bool norm_topk_prob, const Tensor& ids,
                              const Tensor& weights) {
  const char* op = "moe_router_topk";
  const auto [T, H, E, k] = contract::moe_router_topk(spec(), u, router, ids, weights);
  FN_CHECK(E <= detail::kMoeMaxExperts && k <= detail::kMoeMaxTopK,
           "{}: {} experts, top-{}: the kernel takes at most {} experts and top-{}", op, E, k, detail::kMoeMaxExperts,
           detail::kMoeMaxTopK);
  if (T == 0) return;
  Tensor logits = alloc({T, E}, DType::F32, "router logits");
  const Tensor rw[] = {router}, rl[] = {logits};
  // Float32-accurate either way: the decode GEMV, or the FP16x2 tensor-core product for more rows.
  if (!gemv_group(u, rw, rl, {}, "moe_router_topk logits"))
    product(u, router, logits, {}, "moe_router_topk logits", /*float32_inputs=*/true);
  FN_CUDA_CHECK(detail::launch_moe_router_topk(dp<const float>(logits), E, int(T), int(E), int(k), norm_topk_prob,
                                               dp<int32_t>(ids), dp<float>(weights), stream()),
                op);
}

void CudaOps::moe_experts(const Tensor& u, const Tensor& ids, const Tensor& weights, const MoeWeights& w,
                          const Tensor& out, const Tensor& shared) {
  const char* op = "moe_experts";
  // The shared expert begun on the branch stream, if it was: joined before the launch that reads `shared` (and, at
  // the latest, when this call returns or throws, checks included), its scratch released after that.
  PendingShared branch;
  if (shared.defined()) {
    auto it = std::find_if(pending_shared_.begin(), pending_shared_.end(),
                           [&](const PendingShared& p) { return p.shared.data() == shared.data(); });
    if (it != pending_shared_.end()) {
      branch = std::move(*it);
      pending_shared_.erase(it);
    }
  }
  struct Join {
    CudaOps& ops;
    PendingShared& p;
    ~Join() {
      if (ops.join_event(p.done) != cudaSuccess) cudaGetLastError();  // (the error is the step's; not kept)
    }
  } join{*this, branch};
  const auto [T, H, k, E, I] = contract::moe_experts(spec(), u, ids, weights, w, out, shared);
  const float* sh = shared.defined() ? dp<const float>(shared) : nullptr;
  if (w.packed) return moe_experts_w4a16(u, ids, weights, *w.packed, out, sh, branch.done);
  FN_CHECK(E <= detail::kMoeMaxExperts && H % 8 == 0 && I % 8 == 0,
           "{}: {} experts (1..{}), hidden {} and expert width {} (multiples of 8) exceed the kernel's limits", op, E,
           detail::kMoeMaxExperts, H, I);
  if (T == 0) return;
  FN_CUDA_CHECK(join_event(branch.done), op);  // the combine at the end reads `shared`
  moe_experts_f16(u, ids, weights, w, out, E, I, sh);
}

void CudaOps::moe_experts_f16(const Tensor& u, const Tensor& ids, const Tensor& weights, const MoeWeights& w,
                              const Tensor& out, int64_t E, int64_t I, const float* shared) {
  const char* op = "moe_experts";
  const int64_t T = u.dim(0), H = u.dim(1), k = ids.dim(1);
  const int t = to_int(T, op, "tokens"), slots = to_int(T * k, op, "slots");
  const int max_tiles = (slots + detail::kMoeTileM - 1) / detail::kMoeTileM + std::min<int>(int(E), slots);
  Tensor idx = alloc({E + 1 + 2 * int64_t(slots) + 2 * int64_t(max_tiles) + 1}, DType::I32, "moe routing");
  int32_t* offsets = dp<int32_t>(idx);
  int32_t* sorted = offsets + E + 1;
  int32_t* slot_row = sorted + slots;
  int32_t* tile_expert = slot_row + slots;
  int32_t* tile_row = tile_expert + max_tiles;
  int32_t* num_tiles = tile_row + max_tiles;
  FN_CUDA_CHECK(detail::launch_moe_align(dp<int32_t>(ids), slots, int(E), offsets, sorted, slot_row, tile_expert,
                                         tile_row, num_tiles, status(kStatusMoe), stream()),
                "moe_experts align");
  if (split()) {
    // Per expert, cuBLAS products over its sorted slots in FP16x2 (the expert counts come to the host).
    FN_CHECK(!recording_.active,
             "{}: FP16 experts with FP16x2 activations wait for the host (per-expert products): "
             "a step with them is not recorded",
             op);
    std::vector<int32_t> off(size_t(E + 1));
    FN_CUDA_CHECK(cudaMemcpyAsync(off.data(), offsets, off.size() * 4, cudaMemcpyDeviceToHost, stream()), op);
    FN_CUDA_CHECK(cudaStreamSynchronize(stream()), op);
    const int valid = off[size_t(E)];
    const int64_t rows2 = std::max<int64_t>(2 * int64_t(valid), 1);
    Tensor x2 = alloc({rows2, H}, DType::F16, "moe inputs"), a2 = alloc({rows2, I}, DType::F16, "moe activations");
    Tensor g2 = alloc({rows2, I}, DType::F32, "moe gate"), up2 = alloc({rows2, I}, DType::F32, "moe up");
    Tensor y2 = alloc({rows2, H}, DType::F32, "moe expert outputs");
    const int32_t* id = dp<int32_t>(ids);
    FN_CUDA_CHECK(detail::launch_moe_gather_f16x2(dp<const float>(u), id, sorted, offsets, valid, int(k), int(H),
                                                  dp<__half>(x2), stream()),
                  "moe_experts gather");
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = 2 * int64_t(off[size_t(e)]), m = 2 * int64_t(off[size_t(e + 1)] - off[size_t(e)]);
      if (m == 0) continue;
      blas_.linear(dp<__half>(x2) + r0 * H, int(m), int(H), dp<__half>(w.gate) + e * I * H, int(I),
                   dp<float>(g2) + r0 * I, OutType::F32, int(I), stream(), "experts gate_proj");
      blas_.linear(dp<__half>(x2) + r0 * H, int(m), int(H), dp<__half>(w.up) + e * I * H, int(I),
                   dp<float>(up2) + r0 * I, OutType::F32, int(I), stream(), "experts up_proj");
    }
    FN_CUDA_CHECK(detail::launch_moe_act_f16x2(dp<const float>(g2), dp<const float>(up2), id, sorted, offsets, valid,
                                               int(I), dp<__half>(a2), stream()),
                  "moe_experts act");
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = 2 * int64_t(off[size_t(e)]), m = 2 * int64_t(off[size_t(e + 1)] - off[size_t(e)]);
      if (m == 0) continue;
      blas_.linear(dp<__half>(a2) + r0 * I, int(m), int(I), dp<__half>(w.down) + e * H * I, int(H),
                   dp<float>(y2) + r0 * H, OutType::F32, int(H), stream(), "experts down_proj");
    }
    FN_CUDA_CHECK(detail::launch_moe_combine_f16x2(dp<const float>(y2), id, slot_row, offsets, dp<const float>(weights),
                                                   t, int(k), int(H), shared, dp<float>(out), stream()),
                  "moe_experts combine");
    return;
  }
  Tensor uh = half_copy(u, op);
  Tensor h = alloc({int64_t(slots), I}, DType::F16, "moe expert activations");
  Tensor ys = alloc({int64_t(slots), H}, DType::F16, "moe expert outputs");
  FN_CUDA_CHECK(detail::launch_moe_gate_up_split(dp<__half>(uh), H, int(k), dp<__half>(w.gate), dp<__half>(w.up), I,
                                                 int(H), int(I), offsets, sorted, tile_expert, tile_row, num_tiles,
                                                 max_tiles, dp<__half>(h), stream()),
                "moe_experts gate_up");
  FN_CUDA_CHECK(
      detail::launch_moe_down(dp<__half>(h), dp<__half>(w.down), int(H), int(I), offsets, sorted, dp<float>(weights),
                              tile_expert, tile_row, num_tiles, max_tiles, dp<__half>(ys), stream()),
      "moe_experts down");
  FN_CUDA_CHECK(
      detail::launch_moe_combine(dp<__half>(ys), slot_row, t, int(k), int(H), shared, dp<float>(out), H, stream()),
      "moe_experts combine");
}

void CudaOps::moe_experts_w4a16(const Tensor& u, const Tensor& ids, const Tensor& weights, const PackedExperts& packed,
                                const Tensor& out, const float* shared, cudaEvent_t shared_ready) {
  const char* op = "moe_experts";
  const auto* p = dynamic_cast<const CudaW4Experts*>(&packed);
  FN_CHECK(p && p->device == ctx_->device, "{}: the packed experts ({}) were not made by this backend (cuda:{})", op,
           packed.format(), ctx_->device);
  const int64_t T = u.dim(0), k = ids.dim(1);
  FN_CHECK(u.dim(1) == p->hidden, "{}: u {} does not fit W4A16 experts of hidden {}", op, u.str(), p->hidden);
  if (T == 0) return;
  MoeW4A16Workspace& ws =
      w4_workspace(to_int(T, op, "tokens"), to_int(k, op, "top_k"), p->experts, p->hidden, p->inter, p->planes);
  if (aligned16(u) && moe_w4a16_routed_takes_f32(p->view(), int(T), int(k))) {  // decode: no FP16 copy of u
    moe_w4a16_routed(p->view(), dp<const float>(u), p->hidden, int(T), dp<int32_t>(ids), dp<float>(weights), shared,
                     shared_ready, dp<float>(out), p->hidden, ws, stream());
    return;
  }
  Tensor uh = half_copy(u, op);
  moe_w4a16_routed(p->view(), dp<__half>(uh), p->hidden, int(T), dp<int32_t>(ids), dp<float>(weights), shared,
                   shared_ready, dp<float>(out), p->hidden, ws, stream());
}

void CudaOps::moe_shared_expert(const Tensor& u, const MoeWeights& w, const Tensor& out) {
  const auto [T, H, Is] = contract::moe_shared_expert(spec(), u, w, out);
  if (T == 0) return;
  shared_expert(u, w, out, /*accumulate=*/true, nullptr);
}

void CudaOps::moe_shared_expert_start(const Tensor& u, const MoeWeights& w, const Tensor& shared) {
  const auto [T, H, Is] = contract::moe_shared_expert(spec(), u, w, shared);
  if (T == 0) return;
  // On the branch stream only where every launch is one of the decode GEMV kernels (no cuBLAS, whose workspace
  // the main stream's products use meanwhile): FP16 weights, at most kGemvMaxTokens rows, 16-byte rows, FP16x2.
  const Tensor* read[] = {&u,     &w.shared_gate_proj, &w.shared_up_proj, &w.shared_expert_gate, &w.shared_down_proj,
                          &shared};
  bool branch = options_.moe_branch && split() && T <= detail::kGemvMaxTokens && H % 8 == 0 && Is % 8 == 0;
  for (const Tensor* t : read) branch = branch && !t->has_scales() && aligned16(*t);
  if (!branch) return shared_expert(u, w, shared, /*accumulate=*/false, nullptr);
  PendingShared p{u, shared, {}, nullptr};
  // The join's event made before the fork, so that after it only its record can fail.
  cudaError_t err = cudaEventCreateWithFlags(&p.done, cudaEventDisableTiming);
  if (err == cudaSuccess) err = fork_to(ctx_->branch);
  if (err != cudaSuccess && p.done) cudaEventDestroy(p.done);
  FN_CUDA_CHECK(err, "moe_shared_expert_start");
  on_branch_ = true;
  std::exception_ptr failed;
  try {
    shared_expert(u, w, shared, /*accumulate=*/false, &p.scratch);
  } catch (...) {
    failed = std::current_exception();
  }
  on_branch_ = false;
  // The branch ends in its event, also after a failure (joined at once then, so that no work is left unjoined).
  err = cudaEventRecord(p.done, ctx_->branch);
  if (failed || err != cudaSuccess) {
    if (err == cudaSuccess) {
      if (join_event(p.done) != cudaSuccess) cudaGetLastError();
    } else {
      cudaEventDestroy(p.done);  // not recorded: nothing to wait for; the error is reported below
    }
    if (failed) std::rethrow_exception(failed);
    FN_CUDA_CHECK(err, "moe_shared_expert_start");
  }
  pending_shared_.push_back(std::move(p));
}

void CudaOps::shared_expert(const Tensor& u, const MoeWeights& w, const Tensor& out, bool accumulate,
                            std::vector<Tensor>* scratch) {
  const char* op = "moe_shared_expert";
  const int64_t T = u.dim(0), H = u.dim(1), Is = w.shared_gate_proj.dim(0);
  const int t = to_int(T, op, "tokens"), h = to_int(H, op, "hidden"), is = to_int(Is, op, "width");
  Tensor s, logit = alloc({T}, DType::F32, "shared gate logit");  // s: the unfused paths' down_proj output
  bool gate_done = false;                                         // the gate logit computed with gate_proj / up_proj
  const bool w8 = w.shared_gate_proj.has_scales() || w.shared_up_proj.has_scales() || w.shared_down_proj.has_scales();
  if (split() || w8) {  // 8-bit weights: through product(), which applies their scales (either precision)
    Tensor g = alloc({T, Is}, DType::F32, "shared expert gate"), up = alloc({T, Is}, DType::F32, "shared expert up");
    // gate_proj, up_proj and shared_expert_gate read u: one decode GEMV launch when they qualify.
    const Tensor gu_w[3] = {w.shared_gate_proj, w.shared_up_proj, w.shared_expert_gate};
    const Tensor gu_y[3] = {g, up, logit.view({T, 1})};
    if (scratch) scratch->insert(scratch->end(), {g, up, logit});
    gate_done = gemv_group(u, gu_w, gu_y, {}, "shared_expert gate_proj/up_proj/shared_expert_gate");
    FN_CHECK(gate_done || !scratch, "{}: the branch stream's shared expert did not fit the decode GEMV", op);
    // 8-bit gate / up beside the FP16 gate logit: the two in one 8-bit GEMV launch, the logit below.
    const char* gu_what = "shared_expert gate_proj/up_proj";
    const bool gu_done = gate_done || (w8 && gemv_group(u, std::span(gu_w, 2), std::span(gu_y, 2), {}, gu_what));
    if (gate_done && !w.shared_down_proj.has_scales() && Is % 8 == 0 && aligned16(w.shared_down_proj) &&
        aligned16(out)) {
      // Decode: the activation, down projection and gated accumulation in one launch.
      FN_CUDA_CHECK(
          detail::launch_shared_down_decode(dp<const float>(g), dp<const float>(up), dp<__half>(w.shared_down_proj),
                                            dp<const float>(logit), t, is, h, dp<float>(out), accumulate, stream()),
          op);
      return;
    }
    if (!gu_done && w8) {
      product(u, w.shared_gate_proj, g, Tensor(), "shared_expert.gate_proj");
      product(u, w.shared_up_proj, up, Tensor(), "shared_expert.up_proj");
    } else if (!gu_done) {  // FP16x2: u's halves made once for both
      const Tensor u2 = split_halves(u, op);
      split_product(u2, w.shared_gate_proj, g, Tensor(), "shared_expert.gate_proj");
      split_product(u2, w.shared_up_proj, up, Tensor(), "shared_expert.up_proj");
    }
    FN_CUDA_CHECK(
        detail::launch_silu_mul_f32(dp<const float>(g), dp<const float>(up), dp<float>(g), g.numel(), stream()),
        "moe_shared_expert silu");
    s = alloc({T, H}, DType::F32, "shared expert out");
    product(g, w.shared_down_proj, s, Tensor(), "shared_expert.down_proj");
  } else {
    Tensor uh = half_copy(u, op);
    Tensor g = alloc({T, Is}, DType::F16, "shared expert gate"), up = alloc({T, Is}, DType::F16, "shared expert up");
    Tensor act = alloc({T, Is}, DType::F16, "shared expert act");
    blas_.linear(dp<__half>(uh), t, h, dp<__half>(w.shared_gate_proj), is, g.data(), OutType::F16, is, stream(),
                 "shared_expert.gate_proj");
    blas_.linear(dp<__half>(uh), t, h, dp<__half>(w.shared_up_proj), is, up.data(), OutType::F16, is, stream(),
                 "shared_expert.up_proj");
    FN_CUDA_CHECK(detail::launch_silu_mul(dp<__half>(g), dp<__half>(up), Is, dp<__half>(act), Is, t, is, stream()),
                  "moe_shared_expert silu");
    s = alloc({T, H}, DType::F32, "shared expert out");
    blas_.linear(dp<__half>(act), t, is, dp<__half>(w.shared_down_proj), h, s.data(), OutType::F32, h, stream(),
                 "shared_expert.down_proj");
  }
  if (!gate_done)
    FN_CUDA_CHECK(detail::launch_linear_f32_narrow(dp<const float>(u), dp<__half>(w.shared_expert_gate),
                                                   dp<float>(logit), t, h, 1, stream()),
                  "shared_expert_gate");
  FN_CUDA_CHECK(detail::launch_gated_accumulate(dp<float>(out), dp<const float>(s), dp<const float>(logit), t, h,
                                                accumulate, stream()),
                op);
}

MoeW4A16Workspace& CudaOps::w4_workspace(int tokens, int top_k, int experts, int hidden, int inter, int planes) {
  auto& ws = w4_workspaces_[{top_k, experts, hidden, inter, planes}];
  if (!ws || ws->max_tokens < tokens) {
    const int n = std::max(tokens, ws ? std::min(2 * ws->max_tokens, 1 << 16) : 64);
    ++memory_generation_;  // recorded steps that used the old one are stale (also if making the new one fails)
    ws.reset();
    ws = std::make_unique<MoeW4A16Workspace>(n, top_k, experts, hidden, inter, planes);
  }
  return *ws;
}

}  // namespace flashnext::cuda
