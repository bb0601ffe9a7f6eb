// Launchers for the kernels that only the ops-interface backend (backend.h and its per-family files) needs: dtype conversions, and the
// float32-activation forms of the small ops whose layout or decomposition differs from the batched kernels (token
// embedding, GDN causal conv with a time-major state, PLE gate and conv, the QSA indexer's block keys and scores,
// selection expansion). No argument checks here: the op contracts and the family files check the tensors. Kernels are SM70-set and
// NVRTC-includable like the others (scripts/check-sm70.sh).
#pragma once

#include <cuda_fp16.h>

#include "ops/cuda/cuda_stdint.h"
#include "ops/torch_topk_order.h"
#ifndef __CUDACC_RTC__
#include <cuda_runtime_api.h>
#endif

namespace flashnext::cuda::detail {

/// Checkpoint dtypes the weight conversion reads.
enum WeightSrcType : int32_t { kSrcF16 = 0, kSrcBF16 = 1, kSrcF32 = 2 };

#ifndef __CUDACC_RTC__
/// Whether this build's kernels have the programmatic-launch wait in them on the current device (compiled for compute
/// capability 9.0+; kernel_attributes.h kernel_waits_for_dependencies, asked of the decode GEMV).
bool kernels_wait_for_dependencies();
#endif

/// Largest finite FP16 value.
constexpr float kF16Max = 65504.f;

/// Tokens up to which products take the decode GEMV (launch_gemv_f16w_f32x) instead of a tensor-core GEMM.
constexpr int kGemvMaxTokens = 8;
/// Projections of one input that one GEMV launch computes at most.
constexpr int kGemvMaxSegments = 8;
/// Weight rows per warp of the decode GEMV from 2 tokens on (their activation loads shared; one token, or a product of
/// fewer than 2,048 rows: one, launch_gemv_f16w_f32x).
constexpr int kGemvRows = 4;
/// The weights of one GEMV launch: segment s has FP16 weights w[s] [N_s, K], an optional FP16 bias[s] [N_s] and the
/// FP32 output y[s] [tokens, ldy[s]]; rows_end[s] = N_0 + ... + N_s.
struct GemvSegments {
  const __half* w[kGemvMaxSegments];
  const __half* bias[kGemvMaxSegments];
  float* y[kGemvMaxSegments];
  int64_t ldy[kGemvMaxSegments];
  int rows_end[kGemvMaxSegments];
  int groups_end[kGemvMaxSegments];  ///< set by launch_gemv_f16w_f32x: the warps' row groups up to segment s
  int count;
};

/// The weights of one 8-bit decode GEMV launch (launch_gemv_w8_f32x; W8A16, ops/ops.h W8Linear): segment s has codes
/// w[s] [N_s, K] (I8, or F8_E4M3 when fp8), float32 scales scale[s] [N_s, ceil(K / group[s])] (value = code *
/// scale), an optional FP16 bias[s] [N_s] and the FP32 output y[s] [tokens, ldy[s]]; rows_end[s] = N_0 + ... + N_s.
struct GemvSegments8 {
  const uint8_t* w[kGemvMaxSegments];
  const float* scale[kGemvMaxSegments];
  int group[kGemvMaxSegments];
  const __half* bias[kGemvMaxSegments];
  float* y[kGemvMaxSegments];
  int64_t ldy[kGemvMaxSegments];
  int rows_end[kGemvMaxSegments];
  int count;
  bool fp8;
};

/// Taps of the prefill conv kernels at most, rows a thread of them walks, and rows of one sequence at most
/// (launch_gdn_conv_f32 refuses more: cudaErrorInvalidValue; 65,535 runs, the grid's y limit).
constexpr int kGdnConvMaxTaps = 8, kGdnConvRun = 32, kGdnConvMaxRows = 65535 * kGdnConvRun;

#ifndef __CUDACC_RTC__  // host launchers
/// y[i] = fp16(x[i]) (round to nearest even) for i < n.
cudaError_t launch_f32_to_f16(const float* x, __half* y, int64_t n, cudaStream_t stream);
/// y[i] = float(x[i]).
/// One empty kernel (one warp): what a launch costs on its own.
cudaError_t launch_noop(cudaStream_t stream);
cudaError_t launch_f16_to_f32(const __half* x, float* y, int64_t n, cudaStream_t stream);
/// dst[i] = fp16(src[i]) for a checkpoint tensor of `src_type`; stats[0] += the number of values outside the FP16
/// range (|x| > 65504, infinities and NaN included), stats[1] = max(stats[1], bits of the largest finite |x|).
cudaError_t launch_weight_to_f16(const void* src, int src_type, __half* dst, int64_t n, uint32_t* stats,
                                 cudaStream_t stream);
/// out[t, r*H + j] = float(table[ids[t], j]) for r < reps; ids outside [0, V) give zeros and set *status.
cudaError_t launch_embedding_f32(const __half* table, int64_t vocab, int hidden, const int32_t* ids, int tokens,
                                 int reps, float* out, int32_t* status, cudaStream_t stream);
/// y[r, c] += bias[c] for r < rows, c < cols.
cudaError_t launch_add_bias(float* y, const __half* bias, int64_t rows, int cols, cudaStream_t stream);
/// y_s[t, n] = sum_k x[t, k] * w_s[n, k] (+ bias_s[n]) in float32 for tokens <= kGemvMaxTokens and every segment s of
/// `seg`: the FP16 weights read once in 16-byte vectors, FP32 activations x [tokens, K] (row stride ldx), FP32
/// outputs; a warp per row (one token, or fewer than 2,048 rows) or per kGemvRows rows (FLASHNEXT_CUDA_GEMV_ROWS=1:
/// always one), 1 to 8 warps per such group (split-K for products of few rows, up to FLASHNEXT_CUDA_GEMV_SPLIT). Needs
/// K % 8 == 0, every w and x row 16-byte aligned (cudaErrorInvalidValue for more tokens or segments; alignment is the
/// caller's check).
cudaError_t launch_gemv_f16w_f32x(const float* x, int64_t ldx, int K, const GemvSegments& seg, int tokens,
                                  cudaStream_t stream);
/// y_s[t, n] = sum_k x[t, k] * code_s[n, k] * scale_s[n, k / group_s] (+ bias_s[n]) in float32 for tokens <=
/// kGemvMaxTokens and every segment of `seg` (GemvSegments8): the codes read once in 16-byte vectors (16 weights) and
/// decoded exactly (int8 by a float bias trick, E4M3 through FP16 as e4m3 * 2^-8), the scale applied to each group's
/// partial sum (after the whole row where a group spans it); a warp per row, 1 to 8 warps a row (split-K) as
/// launch_gemv_f16w_f32x. Needs K % 16 == 0, every group a multiple of 16 (or K), 16-byte aligned code rows and x
/// rows (cudaErrorInvalidValue for more tokens or segments; alignment is the caller's check).
cudaError_t launch_gemv_w8_f32x(const float* x, int64_t ldx, int K, const GemvSegments8& seg, int tokens,
                                cudaStream_t stream);
/// dst[n, k] = fp16(code[n, k]) (exact for int8 and E4M3), or with `apply_scales` fp16(float(code[n, k]) *
/// scale[n, k / group]) (one rounding), for n < rows, k < cols; `scale` [rows, ceil(cols / group)]. The 8-bit weight
/// tile of a prefill product (the tensor cores then take it).
cudaError_t launch_w8_to_f16(const uint8_t* codes, bool fp8, const float* scale, int group, bool apply_scales,
                             int64_t rows, int cols, __half* dst, cudaStream_t stream);
/// y[t, n] = y[t, n] * scale[n] (+ bias[n]) for t < rows, n < cols (row stride ldy): the per-row scale of an 8-bit
/// weight applied after its product over the exact codes.
cudaError_t launch_scale_columns(float* y, int64_t rows, int cols, int64_t ldy, const float* scale, const __half* bias,
                                 cudaStream_t stream);
/// Whether launch_hc_read_decode takes these sizes: tokens <= kGemvMaxTokens, streams a power of two <= 8, hidden
/// and rank multiples of 8, tokens * rank floats of d within 48 KiB of shared memory.
bool hc_read_decode_supported(int tokens, int streams, int hidden, int rank);
/// Floats of scratch launch_hc_read_decode needs: the per-stream partial dots of the rank (+ inject) rows and the
/// per-stream square sums, tokens * streams * (rank + (inject ? streams : 0) + 1).
int64_t hc_read_decode_scratch(int tokens, int streams, int rank, bool inject);
/// hc_read for tokens <= kGemvMaxTokens in float32, two launches (cuda_ops_kernels.cu "Decode hyper-connection
/// read"): X [tokens, streams*hidden], norm_w [streams*hidden], down [rank, streams*hidden], up [streams*hidden, rank],
/// inject [streams, streams*hidden] or null; u [tokens, hidden], inj [tokens, streams] (unused without inject);
/// scratch: hc_read_decode_scratch floats. With add_out [tokens, hidden] and add_inj [tokens, streams] (both or
/// neither) the pending injection X += add_inj (x) add_out is read into the product and stored into X
/// (hc_inject_read). cudaErrorInvalidValue outside hc_read_decode_supported; every row must be 16-byte aligned (the
/// caller's check).
cudaError_t launch_hc_read_decode(float* X, const float* add_out, const float* add_inj, const __half* norm_w,
                                  const __half* down, const __half* up, const __half* inject, int tokens, int streams,
                                  int hidden, int rank, float eps, float* scratch, float* u, float* inj,
                                  cudaStream_t stream);
/// y[t, o] = sum_i x[t, i] * w[o, i] with FP32 inputs and accumulation over FP16 weights: for the narrow products
/// that decide discrete choices or gates (MoE router logits, shared_expert_gate). One warp per output.
cudaError_t launch_linear_f32_narrow(const float* x, const __half* w, float* y, int tokens, int in, int out,
                                     cudaStream_t stream);
/// The shared expert's down projection of a decode step (tokens 1..kGemvMaxTokens), activation and gate fused:
/// out[t, c] += sigmoid(gate_logit[t]) * sum_k down[c, k] * silu(g[t, k]) * up[t, k] (without `accumulate`: out[t, c]
/// = that term). g, up [tokens, inter] F32, down [hidden, inter] FP16 (inter % 8 == 0), out [tokens, hidden] F32;
/// every pointer 16-byte aligned.
cudaError_t launch_shared_down_decode(const float* g, const float* up, const __half* down, const float* gate_logit,
                                      int tokens, int inter, int hidden, float* out, bool accumulate,
                                      cudaStream_t stream);
/// out[t, c] += sigmoid(gate_logit[t]) * s[t, c] (the shared expert's gated add; without `accumulate` out[t, c] =
/// that term), [T, H] FP32.
cudaError_t launch_gated_accumulate(float* out, const float* s, const float* gate_logit, int tokens, int hidden,
                                    bool accumulate, cudaStream_t stream);
/// Causal depthwise conv + SiLU over a chunk of one sequence, in place: x[t, c] = silu(sum_k w[c, k] * in(t - (K-1)
/// + k, c)) with in(p) = x[p, c] (its value before the call) for p >= 0, else state[(K-1) + p, c]; then state
/// (time-major [K-1, C], oldest first) becomes the last K-1 inputs. x [T, C] FP32, w [C, K] FP16, K <=
/// kGdnConvMaxTaps, T <= kGdnConvMaxRows, halo: scratch of gdn_conv_halo_floats(T, C, K) floats (free again once the
/// stream has run the call). Source of the math: MODEL.md "Gated DeltaNet", the reference's causal_conv1d_fn.
cudaError_t launch_gdn_conv_f32(float* x, float* state, const __half* w, float* halo, int tokens, int channels,
                                int kernel, cudaStream_t stream);
/// Floats of launch_gdn_conv_f32's scratch for T tokens of C channels and K taps.
int64_t gdn_conv_halo_floats(int tokens, int channels, int kernel);
/// A causal depthwise conv over state slots for `batch` sequences: sequence b's rows seq_starts[b] .. seq_starts[b+1]
/// of in/out/add in order (seq_starts null: row b alone, a decode step), state pool [slots, (K-1)*dilation, channels]
/// F32 indexed by slots[b] (time-major, oldest first), shifted in place per row, so n rows equal n decode steps bit
/// for bit; a thread walks a sequence's rows (for few rows: decode, a speculative verify, its replay).
/// accumulate = false (GDN): out = silu(conv) (out may alias in); true (PLE): out += add + silu(conv).
cudaError_t launch_conv_slots(const float* in, const float* add, float* out, bool accumulate, float* state_pool,
                              const int32_t* slots, const int32_t* seq_starts, const __half* w, int batch, int channels,
                              int kernel, int dilation, cudaStream_t stream);
/// PLE gate per token: qn_b = ZC-RMSNorm(X_b; norm_query_b), s_b = (kn_b . qn_b) / sqrt(H),
/// s_b = sign(s_b) sqrt(max(|s_b|, 1e-6)), P[:, b] = sigmoid(s_b) * v. kn, X, P [T, S*H], v [T, H].
cudaError_t launch_ple_gate_f32(const float* kn, const float* v, const float* x, const __half* norm_query, int tokens,
                                int streams, int hidden, float eps, float* p, cudaStream_t stream);
/// PLE short conv and residual add: X[t, c] += P[t, c] + silu(sum_k w[c, k] * n(t - (K-1-k)*d, c)) with n(p) =
/// N[p, c] for p >= 0, else state[ctx + p, c] (ctx = (K-1)*d); then state [ctx, C] becomes the last ctx rows of
/// [state; N]. N is ZC-RMSNorm(P; norm_conv), computed by the caller.
cudaError_t launch_ple_conv_add_f32(const float* p, const float* n, const __half* w, int tokens, int channels,
                                    int kernel, int dilation, float* state, float* x, cudaStream_t stream);
/// A batch's paged indexer keys: token t belongs to sequence tok_seq[t] (row of the block tables [*, ld]) at
/// positions[t]; a KV block holds `page` positions (a multiple of the indexer block `block`); the raw key of
/// logical position p is row tables[s, p / page] * page + p % page of the raw key pool, the pooled key of indexer
/// block j row tables[s, j*block / page] * (page / block) + (j*block % page) / block of the pooled key pool.
struct QsaPagedIndex {
  const int32_t* tok_seq;
  const int32_t* positions;
  const int32_t* tables;
  int64_t ld;
  int page;
  int block;
};
/// The pooled key RoPE(ZC-RMSNorm(mean of the block's raw keys; k_norm), position j*block) of the indexer block j
/// that token t completes, for every token of the batch whose position p has (p + 1) % block == 0, from its raw
/// keys (already in the pool).
cudaError_t launch_qsa_pool_blocks_paged_f32(const QsaPagedIndex& pi, const float* key_pool, int tokens, int dim,
                                             const __half* k_norm, int rotary_dims, float theta, float eps,
                                             float* pooled_pool, cudaStream_t stream);
/// Indexer scores over the paged pooled keys: scores[(t - t0) * ld + j] = sum_h relu(qn_h(t) . key_j) / sqrt(dim)
/// for j < (positions[t]+1)/block. `tiled` (for steps with long runs of one sequence's rows: prefill): 32 rows x 64
/// keys a block sharing the keys through shared memory, where heads <= 8, dim % 4 == 0 and the pointers are 16-byte
/// aligned; otherwise a warp per key of one query.
cudaError_t launch_qsa_block_scores_paged_f32(const QsaPagedIndex& pi, const float* qn, int heads, int dim,
                                              const float* pooled_pool, int t0, int t1, float* scores, int64_t ld,
                                              bool tiled, cudaStream_t stream);
/// The indexer's top-k on the GPU, as torch.topk (CPU) chooses (ties included: ops/torch_topk_order.h): for every
/// token t in [t0, t1) whose position has more than top_blocks complete blocks, top[(t - t0) * top_blocks + i] receives
/// the chosen block indices of its scores row scores[(t - t0) * ld ...] (index order, or torch's order after a tie
/// across the k-th score). scratch: (t1 - t0) * ld items.
cudaError_t launch_qsa_topk_paged(const QsaPagedIndex& pi, const float* scores, int64_t ld, int top_blocks, int t0,
                                  int t1, ::flashnext::topk::Scored* scratch, int32_t* top, cudaStream_t stream);
/// The selected positions of every token t in [t0, t1) (its position from pi.positions): the tokens of its chosen
/// blocks (top, or every complete block when top is null), then its tail tokens, padded with -1 to `width`.
cudaError_t launch_qsa_expand_selection_paged(const QsaPagedIndex& pi, const int32_t* top, int top_blocks, int t0,
                                              int t1, int32_t* selected, int64_t width, cudaStream_t stream);
/// Packs the non-negative entries of each row of selected [T, n_sel] to the front of compact (same shape), in
/// order, with counts[t] their number. Entries >= rows are dropped and set *status.
cudaError_t launch_compact_selection(const int32_t* selected, int tokens, int n_sel, int64_t rows, int32_t* compact,
                                     int32_t* counts, int32_t* status, cudaStream_t stream);
// ---- FP16x2 activations: a float32 x enters a tensor-core product as hi = fp16(x) and lo = fp16(x - hi), rows of
// ---- one matrix [hi rows; lo rows], so that hi·W + lo·W is x·W to about 2^-22 relative (FP16 weights, FP32 sums).
/// x2[r, c] = hi(x[r, c]), x2[rows + r, c] = lo(x[r, c]) for x [rows, cols] FP32.
cudaError_t launch_split_f16x2(const float* x, __half* x2, int64_t rows, int cols, cudaStream_t stream);
/// y[r, c] = y2[r, c] + y2[rows + r, c] (+ bias[c] when bias is given): the product of a split input.
cudaError_t launch_sum_halves(const float* y2, float* y, int64_t rows, int cols, const __half* bias,
                              cudaStream_t stream);
/// y[i] = silu(g[i]) * up[i] (FP32).
cudaError_t launch_silu_mul_f32(const float* g, const float* up, float* y, int64_t n, cudaStream_t stream);
/// Routed experts with FP16x2 inputs (token slots sorted by expert with moe_align: offsets [E+1], sorted [slots]):
/// slot rows of expert e live in rows [2*off_e, 2*off_e + 2*n_e) of a [2*slots, width] matrix, hi rows first.
/// x2 rows of the sorted slots = split(u[token of the slot]).
cudaError_t launch_moe_gather_f16x2(const float* u, const int32_t* ids, const int32_t* sorted, const int32_t* offsets,
                                    int slots, int top_k, int hidden, __half* x2, cudaStream_t stream);
/// a2 = split(silu(g) * up) per sorted slot, g and up the (hi + lo) sums of g2, up2 [2*slots, inter] FP32.
cudaError_t launch_moe_act_f16x2(const float* g2, const float* up2, const int32_t* ids, const int32_t* sorted,
                                 const int32_t* offsets, int slots, int inter, __half* a2, cudaStream_t stream);
/// out[t, c] = sum_j weights[t, j] * (y2 hi + lo rows of slot t*k+j) (slots whose expert id was invalid skipped),
/// + shared[t, c] ([tokens, hidden] F32: the gated shared expert's term) when shared is not null.
cudaError_t launch_moe_combine_f16x2(const float* y2, const int32_t* ids, const int32_t* slot_row,
                                     const int32_t* offsets, const float* weights, int tokens, int top_k, int hidden,
                                     const float* shared, float* out, cudaStream_t stream);
/// Indexed row copy of `words` 32-bit words per row: gather (scatter false) dst[i] = src[rows[i]], scatter (true)
/// dst[rows[i]] = src[i], for i < n. A row id outside [0, limit) (limit = rows of the indexed side) is skipped and
/// ORs 1 into *status.
cudaError_t launch_copy_rows_indexed(const void* src, void* dst, const int32_t* rows, int64_t n, int64_t words,
                                     int64_t limit, bool scatter, int32_t* status, cudaStream_t stream);
#endif

}  // namespace flashnext::cuda::detail
