// CPU backend: MoE router (softmax + torch.topk), routed experts and the gated shared expert.
#include "ops/contract/moe.h"

#include <algorithm>
#include <cstring>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/topk.h"

namespace flashnext::cpu {

void CpuOps::moe_router_topk(const Tensor& u, const Tensor& router, bool norm_topk_prob, const Tensor& ids,
                             const Tensor& weights) {
  const auto [T, H, E, k] = contract::moe_router_topk(kCpu, u, router, ids, weights);
  std::vector<float> logits(static_cast<size_t>(T * E));
  matmul_nt(fp(u), T, u.dim(1), fp(router), E, logits.data());
  std::vector<std::pair<float, int64_t>> queue;
  std::vector<int64_t> top(static_cast<size_t>(k));
  for (int64_t t = 0; t < T; ++t) {
    float* p = &logits[t * E];
    const float mx = *std::max_element(p, p + E);
    float sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += p[e] = std::exp(p[e] - mx);
    for (int64_t e = 0; e < E; ++e) p[e] /= sum;
    torch_topk(p, E, k, queue, top.data());
    float total = 0;
    for (int64_t j = 0; j < k; ++j) total += p[top[j]];
    for (int64_t j = 0; j < k; ++j) {
      ids.data_as<int32_t>()[t * k + j] = int32_t(top[j]);
      mp(weights)[t * k + j] = norm_topk_prob ? p[top[j]] / total : p[top[j]];
    }
  }
}

void CpuOps::moe_experts(const Tensor& u, const Tensor& ids, const Tensor& weights, const MoeWeights& w,
                         const Tensor& out, const Tensor& shared) {
  const char* op = "moe_experts";
  const auto [T, H, k, E, I] = contract::moe_experts(kCpu, u, ids, weights, w, out, shared);
  FN_CHECK(!w.packed, "{}: the packed experts ({}) were made by another backend; the CPU takes stacked experts", op,
           w.packed->format());
  const int32_t* id = ids.data_as<const int32_t>();
  // Group the (token, slot) pairs by expert, run each expert on its tokens (in parallel over experts), then sum
  // the k weighted slot outputs of every token in slot order.
  std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(E));
  for (int64_t i = 0; i < T * k; ++i) {
    FN_CHECK(id[i] >= 0 && id[i] < E, "{}: expert id {} out of range [0, {})", op, id[i], E);
    by_expert[size_t(id[i])].push_back(i);
  }
  std::vector<float> slots(static_cast<size_t>(T * k * H));
  pool_.parallel_for(E, 1, [&](int64_t e0, int64_t e1) {
    std::vector<float> g(static_cast<size_t>(I)), up(static_cast<size_t>(I));
    for (int64_t e = e0; e < e1; ++e) {
      const float* wg = fp(w.gate) + e * I * H;
      const float* wu = fp(w.up) + e * I * H;
      const float* wd = fp(w.down) + e * H * I;
      for (int64_t i : by_expert[size_t(e)]) {
        const float* x = fp(u) + (i / k) * H;
        for (int64_t r = 0; r < I; ++r) g[r] = silu(dot(x, wg + r * H, H)) * dot(x, wu + r * H, H);
        float* y = &slots[i * H];
        for (int64_t c = 0; c < H; ++c) y[c] = dot(g.data(), wd + c * I, I);
      }
    }
  });
  for (int64_t t = 0; t < T; ++t) {
    float* o = mp(out) + t * H;
    std::fill(o, o + H, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const float wt = fp(weights)[t * k + j];
      const float* y = &slots[(t * k + j) * H];
      for (int64_t c = 0; c < H; ++c) o[c] += y[c] * wt;
    }
    if (shared.defined())
      for (int64_t c = 0; c < H; ++c) o[c] += fp(shared)[t * H + c];
  }
}

void CpuOps::moe_shared_expert(const Tensor& u, const MoeWeights& w, const Tensor& out) {
  const auto [T, H, Is] = contract::moe_shared_expert(kCpu, u, w, out);
  std::vector<float> g(static_cast<size_t>(T * Is)), up(static_cast<size_t>(T * Is)), y(static_cast<size_t>(T * H)),
      gate(static_cast<size_t>(T));
  matmul_nt(fp(u), T, H, fp(w.shared_gate_proj), Is, g.data());
  matmul_nt(fp(u), T, H, fp(w.shared_up_proj), Is, up.data());
  for (size_t i = 0; i < g.size(); ++i) g[i] = silu(g[i]) * up[i];
  matmul_nt(g.data(), T, Is, fp(w.shared_down_proj), H, y.data());
  matmul_nt(fp(u), T, H, fp(w.shared_expert_gate), 1, gate.data());
  for (int64_t t = 0; t < T; ++t) {
    const float s = sigmoid(gate[t]);
    for (int64_t c = 0; c < H; ++c) mp(out)[t * H + c] += s * y[t * H + c];
  }
}

}  // namespace flashnext::cpu
