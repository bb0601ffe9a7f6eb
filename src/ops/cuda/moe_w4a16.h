// W4A16 routed experts on the GPU (issue 6; MODEL.md "MoE block", same contract as moe_routed in moe.h): 4-bit
// expert weights (NVFP4 or int4) repacked once at load into one layout, FP16 activations, FP32 accumulation, SM70
// instructions (WMMA / half2 arithmetic; scripts/check-sm70.sh), with an SM80+ tensor-core decode GEMV beside them.
//
// Sources (formats of src/loader/quant.h; here as plain host arrays, so fn_cuda does not depend on the loader):
//   NVFP4   codes E2M1 (sign bit 3, magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}), two per byte, element 2j in the low
//           nibble; one E4M3 byte per 16 inputs; an F32 global scale that multiplies (ModelOpt weight_scale_2) or
//           divides (compressed-tensors weight_global_scale):  w = (e2m1 * e4m3) * g   or   (e2m1 * e4m3) / g
//   int4    one value q in 0..15 per input, a float scale per group of `group` inputs, an optional zero point z in
//           0..16 per group (absent: z = 8):  w = (q - z) * s. GPTQ, AutoAWQ and compressed-tensors packings are
//           unpacked to this form by unpack_gptq / unpack_awq / unpack_ct_int4 below.
//   int8    (W8A16) one value q in 0..255 per input, w = (q - z) * s (8-bit GPTQ / AutoRound, compressed-tensors
//           int8 with z = 128), held as two int4 planes over the inputs repeated twice: int8_planes below; the
//           kernels are those of int4 (MoeW4A16Experts::planes), the bytes one per weight.
//   FP8     (W8A16) one E4M3 byte per input (OCP FN, bias 7), a float scale per group of `group` inputs and an
//           optional float scale per row: w = e4m3(q) * s_group * s_row (compressed-tensors float-quantized: one
//           group, the channel or tensor scale; the FP8 block format: groups of block_cols inputs, each row the
//           scale of its block of rows). Fp8Plain below.
//
// Repacked layout (W4Packed; E experts of a logical [rows, cols] matrix, cols a multiple of 8):
//   codes   uint32 [E][rows][wpr], wpr = 4 * ceil(cols / 32) (rows padded to 16 bytes with code 0); word i holds
//           inputs 8i..8i+7 with nibble n holding input 8i + {0, 2, 4, 6, 1, 3, 5, 7}[n] (the kernels' decode order)
//   scales  FP16 [E][rows][groups], groups = ceil(8 * wpr / group) (padding groups hold 0): NVFP4: the E4M3 scale
//           (exact in FP16); int4: s * 2^-p with the row's power of two p chosen so that max |s| * 2^-p lies in
//           [2^10, 2^11) (exact; repacking throws Error when a scale would not be)
//   zeros   uint8 [E][rows][groups] (int4 with zero points only)
//   global  F32 [E][rows]: NVFP4 the source's global scale (a divisor for compressed-tensors), int4 2^p
// FP8 matrices (W4Format::Fp8) hold one byte per input in the same words: codes uint32 [E][rows][wpr], wpr =
// 4 * ceil(cols / 16) (16-byte rows), word i holding inputs 4i..4i+3 in bytes 0..3; `fscales` F32 [E][rows][groups]
// (groups = ceil(4 * wpr / group)) instead of the FP16 scales, no zeros. The kernels decode a byte to FP16 exactly as
// e4m3(q) * 2^-8 (the 7 magnitude bits one place right of their E4M3 position: kernels file), so with s' = fscale and
// G = global: w = (e4m3(q) * 2^-8) * s' * G, where s' = s_group * 2^-p with the row's power of two p placing the
// largest |s'| in [2^14, 2^15) and G = 2^(8 + p) * s_row: the FP16 product (e4m3(q) * 2^-8) * s' stays below
// 1.75 * 2^15 < 65504. compressed-tensors' channel or tensor scale is a row scale (its groups 1: s' = 2^14).
// Repacking is lossless: W4Packed::unpack returns, bit for bit, the float32 values of the formulas above
// (NVFP4: float(e2m1 * e4m3) then one multiply or divide by g; int4: float(q - z) * s; FP8: e4m3(q) times the
// group's (and row's) scale, one multiply).
//
// What the kernels compute (per expert row n, input vector x in FP16):
//   GEMV path (decode)  per token slot (no grouping pass; the down kernel also combines each token's slots), G_n the
//                       row's global multiply (or divide) in FP32. FP32-FMA kernels (every GPU): y_n = G_n( sum over
//                       code words of (sum_8 float(v_k) * float(x_k)) * float(scale16) ), the products and sums in
//                       FP32, v = e2m1 (NVFP4) or q - z (int4) exact: exact weights, FP32 accumulation. Tensor-core
//                       kernels (mma.sync m16n8k16, compute capability 8.0+; NVFP4 and int4 groups of 32k): the
//                       GEMM path's weights w16 with FP32 accumulation, y_n = G_n(sum_k w16_k * x_k).
//   GEMM path (prefill) tensor cores on FP16 weights w16 = fp16(v * scale16) with FP32 accumulation, then G_n in
//                       FP32: mma.sync m16n8k16 with the weights decoded into registers (compute capability 8.0+;
//                       NVFP4 and int4 groups of 32k), else WMMA m16n16k16 from shared memory (every GPU). NVFP4: w16
//                       is exact (e2m1 * e4m3 has <= 6 significant bits, |value| in 2^-10..2688). int4: w16 is
//                       (q - z) * s * 2^-p rounded once to FP16 (relative error <= 2^-11).
//   FP8                 FP32-FMA GEMV and WMMA GEMM only (w4_gemv_tensor_cores / w4_gemm_tensor_cores are false):
//                       GEMV y_n = G_n( sum over words of (sum_4 float(v_k) * float(x_k)) * s'_g ), v = e4m3 * 2^-8
//                       exact; GEMM w16 = fp16(float(v) * s'_g): exact where the group scales are powers of two
//                       (compressed-tensors: s' = 2^14, v has 4 significant bits), else rounded (the float32
//                       product, then FP16: relative error about 2^-11 for |w16| >= 2^-14, the FP8 block format; a
//                       weight more than about 2^28 below its row's largest falls below FP16's range).
//   Then, as moe_routed: h = fp16(silu(gate) * up), each slot's output fp16(weight * down(h)), the top_k slots of a
//   token summed in FP32 in slot order (+ the gated shared expert), rounded to the output type.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "ops/cuda/buffer.h"
#include "ops/cuda/moe_w4a16_kernels.h"

namespace flashnext::cuda {

enum class W4Format : uint8_t { Nvfp4, Int4, Fp8 };

/// One NVFP4 weight of one expert, [rows, cols] logical (host pointers, row-major, checkpoint layout).
struct Nvfp4Source {
  int64_t rows = 0, cols = 0;
  const uint8_t* packed = nullptr;  ///< [rows, cols/2] E2M1 codes, element 2j in the low nibble of byte j
  const uint8_t* scales = nullptr;  ///< [rows, ceil(cols/16)] E4M3 bytes (linear, not swizzled)
  float global = 1.f;               ///< weight_scale_2 (multiplier) or weight_global_scale (divisor)
  bool global_is_divisor = false;   ///< true for compressed-tensors nvfp4-pack-quantized
};

/// One int4 weight of one expert in plain form (host pointers, row-major).
struct Int4Source {
  int64_t rows = 0, cols = 0;
  int64_t group = 0;                ///< inputs per scale (a multiple of 8), 0: one group spans cols
  const uint8_t* q = nullptr;       ///< [rows, cols] one value 0..15 per byte
  const float* scales = nullptr;    ///< [rows, ceil(cols/group)] exact float copies of the checkpoint scales
  const uint8_t* zeros = nullptr;   ///< [rows, ceil(cols/group)] zero points 0..16, or null (symmetric: z = 8)
  const float* row_scale = nullptr;  ///< [rows] or null (1): a float32 factor of each row, kept in its global scale
};

/// An int4 weight unpacked from a checkpoint packing (owns the arrays; source() views them).
struct Int4Plain {
  int64_t rows = 0, cols = 0, group = 0;
  std::vector<uint8_t> q, zeros;  ///< zeros empty when symmetric
  std::vector<float> scales;
  Int4Source source() const { return {rows, cols, group, q.data(), scales.data(), zeros.empty() ? nullptr : zeros.data()}; }
};

/// GPTQ of `bits` = 2, 3 or 4 (quant.h): qweight I32 [cols*bits/32, rows] (column n a little-endian bit stream,
/// input k at bits bits*k..), qzeros I32 [ceil(cols/group), rows*bits/32] (each row a bit stream of the outputs'
/// zero points), scales [ceil(cols/group), rows] as float; z = zero + 1 (v1, `gptq`) or the zero (`gptq_v2`).
/// Values of 2 and 3 bits are held as 4-bit codes with their zero points (q <= 7, z <= 8): exact. group 0: one
/// group. Only g_idx[k] == k/group is meaningful (the caller checks g_idx). Throws Error for other widths, or rows
/// or cols not multiples of 8 and of 32/gcd(bits, 32).
Int4Plain unpack_gptq(const int32_t* qweight, const int32_t* qzeros, const float* scales, int64_t rows, int64_t cols,
                      int64_t group, bool gptq_v2, int bits = 4);

/// AutoAWQ GEMM int4 (quant.h): qweight I32 [cols, rows/8], packed along the outputs: output 8j+m of input row k at
/// bits 4*{0, 4, 1, 5, 2, 6, 3, 7}[m] of word j (AutoAWQ's AWQ_ORDER inverted); qzeros I32 [cols/group, rows/8]
/// packed the same way (z = the nibble) or null (zero_point false: z = 8, zeros left empty); scales
/// [cols/group, rows] as float. group 0: one group. Throws Error for rows not a multiple of 8 or a group that does
/// not divide cols.
Int4Plain unpack_awq(const int32_t* qweight, const int32_t* qzeros, const float* scales, int64_t rows, int64_t cols,
                     int64_t group);

/// compressed-tensors pack-quantized int4 (quant.h): weight_packed I32 [rows, ceil(cols/8)] (input k at bits
/// 4*(k%8) of word k/8, stored +8), weight_scale [rows, ceil(cols/group)] as float, optional weight_zero_point I32
/// [ceil(rows/8), ceil(cols/group)] (row n at bits 4*(n%8), +8). w = (nibble - 8) - (zp - 8) = nibble - zp:
/// q = nibble, z = zp nibble (8 when symmetric: zeros left empty).
Int4Plain unpack_ct_int4(const int32_t* weight_packed, const int32_t* zero_point, const float* scales, int64_t rows,
                         int64_t cols, int64_t group);

/// An 8-bit integer weight in plain form (W8A16 through two 4-bit planes, int8_planes): w = (q - z) * s.
struct Int8Plain {
  int64_t rows = 0, cols = 0, group = 0;  ///< group: inputs per scale (0: one group spans cols)
  std::vector<uint8_t> q;                 ///< [rows, cols] values 0..255
  std::vector<uint16_t> zeros;            ///< [rows, ceil(cols/group)] zero points 0..256, or empty (z = 128)
  std::vector<float> scales;              ///< [rows, ceil(cols/group)] exact float copies of the checkpoint scales
};

/// An FP8 E4M3 weight in plain form: w = e4m3(q) * scales[row, k / group] (* row_scale[row] where given).
struct Fp8Plain {
  int64_t rows = 0, cols = 0, group = 0;  ///< group: inputs per scale (0: one group spans cols)
  std::vector<uint8_t> q;                 ///< [rows, cols] E4M3 bytes (NaN codes 0x7F / 0xFF refused by set_rows)
  std::vector<float> scales;              ///< [rows, ceil(cols/group)] exact float copies of the checkpoint scales
  std::vector<float> row_scale;           ///< [rows] or empty (1): a second factor of each row
};

/// compressed-tensors float-quantized (quant.h CtFp8): E4M3 `weight` [rows, cols] with one scale per row (`per_row`,
/// scales [rows]) or one for the tensor (scales [1]): one group of scale 1, the scale a row scale (exact on every
/// path, the GEMM's FP16 weights included).
Fp8Plain unpack_ct_fp8(const uint8_t* weight, const float* scales, bool per_row, int64_t rows, int64_t cols);

/// The FP8 block format (quant.h Fp8Block): E4M3 `weight` [rows, cols], weight_scale_inv [ceil(rows/block_rows),
/// ceil(cols/block_cols)] as float: groups of block_cols inputs, row n the scales of its block n / block_rows.
/// Throws Error for non-positive block sizes.
Fp8Plain unpack_fp8_block(const uint8_t* weight, const float* scales, int64_t rows, int64_t cols, int64_t block_rows,
                          int64_t block_cols);

/// Rows [r0, r0 + rows) and columns [c0, c0 + cols) of an FP8 plain weight with groups of `group` inputs, as
/// slice_int4 (exact under the same conditions).
Fp8Plain slice_fp8(const Fp8Plain& p, int64_t r0, int64_t rows, int64_t c0, int64_t cols, int64_t group);

/// GPTQ / AutoRound of 8 bits (quant.h; the packing of unpack_gptq with bits 8: qweight I32 [cols/4, rows], qzeros
/// I32 [ceil(cols/group), rows/4], scales [ceil(cols/group), rows] as float); z = zero + 1 (v1) or the zero (v2).
/// Throws Error for rows or cols not multiples of 8.
Int8Plain unpack_gptq_int8(const int32_t* qweight, const int32_t* qzeros, const float* scales, int64_t rows,
                           int64_t cols, int64_t group, bool gptq_v2);

/// compressed-tensors int-quantized (quant.h CtInt8): signed int8 `weight` [rows, cols], one scale per row
/// (`per_row`, scales [rows]) or one for the tensor (scales [1]); symmetric: q = weight + 128, z = 128.
Int8Plain unpack_ct_int8(const int8_t* weight, const float* scales, bool per_row, int64_t rows, int64_t cols);

/// A 4-bit weight as an 8-bit one (q and z unchanged: its high plane is zero), for a block that mixes widths.
Int8Plain int8_from_int4(const Int4Plain& p);

/// The two 4-bit planes of `p` as one int4 matrix [rows, 2 * cols] over the inputs repeated twice (x, x): columns
/// [0, cols) the high plane, q >> 4 with zero point z >> 4 (0..16) and scale 16 s; columns [cols, 2 cols) the low
/// plane, q & 15 with zero point z & 15 and scale s, so that 16 (q_hi - z_hi) + (q_lo - z_lo) = q - z: exact. With
/// one group per row the scales become 16 and 1 and *row_scale receives each row's s (W4Packed keeps it in the row's
/// float32 global scale, times a power of two: exact for any float s of a normal range); otherwise row_scale is
/// cleared and the group scales must meet W4Packed's FP16 rule (with the high plane's 16 s, a row's scales may span
/// 2^20 rather than 2^24). The groups of the result: p.group, or cols when 0 or larger (a group never spans both
/// planes). Throws Error for a group that does not divide cols.
Int4Plain int8_planes(const Int8Plain& p, std::vector<float>* row_scale);

/// Rows [r0, r0 + rows) and columns [c0, c0 + cols) of `p` (a tensor-parallel rank's slice) with groups of `group`
/// inputs (0: one group over the slice's columns), each holding the scale and zero point of the source group it lies
/// in: exact when `group` divides c0 and cols and the source's group (0: all of p.cols) is a multiple of it. Throws
/// Error for a slice outside p or a group that does not fit.
Int4Plain slice_int4(const Int4Plain& p, int64_t r0, int64_t rows, int64_t c0, int64_t cols, int64_t group);
/// The same for an 8-bit weight.
Int8Plain slice_int8(const Int8Plain& p, int64_t r0, int64_t rows, int64_t c0, int64_t cols, int64_t group);

/// Host-side repacked weights of `experts` experts of a logical [rows, cols] matrix (layout above). Fill every
/// expert's rows with set_rows (several calls may fill row ranges of one expert, e.g. gate rows 0..I-1 and up rows
/// I..2I-1 of a fused gate_up [2I, H] from two checkpoint tensors, each with its own global scale), then upload.
class W4Packed {
 public:
  /// format; group: 16 for NVFP4, the int4 group size (multiple of 8) or 0 for one group over cols; with_zeros: int4
  /// with zero points. Throws Error for cols not a positive multiple of 8 or a bad group.
  W4Packed(W4Format format, int experts, int rows, int cols, int group, bool with_zeros);

  /// Rows [row0, row0 + src.rows) of expert `expert` from an NVFP4 source (format Nvfp4; src.cols == cols). Throws
  /// Error for mismatched shapes, an E4M3 NaN scale, or a divisor/multiplier kind different from earlier rows.
  void set_rows(int expert, int row0, const Nvfp4Source& src);
  /// The same from an int4 source (format Int4; src.group equal to the matrix's; src.row_scale multiplies the
  /// rows' global scales). Throws Error for q > 15, zero points > 16, zero points given to a matrix made without
  /// them, a non-finite scale or row scale, or a scale that FP16 cannot hold exactly after the row's power-of-two
  /// shift.
  void set_rows(int expert, int row0, const Int4Source& src);
  /// The same from an FP8 plain weight (format Fp8; src.group equal to the matrix's). Throws Error for arrays that do
  /// not fit the shape, an E4M3 NaN code, a non-finite scale or row scale, or a scale or row scale that does not
  /// survive the row's power-of-two shift exactly (scales of a row spanning more than float32's range).
  void set_rows(int expert, int row0, const Fp8Plain& src);

  /// The exact float32 values of expert `expert`, row-major [rows, cols] (what the checkpoint formulas give).
  std::vector<float> unpack(int expert) const;

  /// Bytes the kernels read for one expert (codes + scales + zeros + global).
  size_t expert_bytes() const;

  W4Format format;
  int experts, rows, cols, group, wpr, groups;
  bool has_zeros;
  bool divide = false;  ///< NVFP4 global scales are divisors
  std::vector<uint32_t> codes;
  std::vector<__half> scales;
  std::vector<uint8_t> zeros;
  std::vector<float> global;
  std::vector<float> fscales;  ///< FP8: F32 [E][rows][groups] (the FP16 `scales` stay empty)

 private:
  int divide_known_ = 0;  // 0: no NVFP4 rows yet, 1: multiplier, 2: divisor
};

/// A W4Packed matrix stack in device memory.
class W4DeviceMatrix {
 public:
  W4DeviceMatrix() = default;
  /// Uploads `p` (synchronous). Throws Error when device memory runs out.
  explicit W4DeviceMatrix(const W4Packed& p);
  /// NVFP4-layout experts of a logical [rows, cols] matrix with pseudo-random weights made on the device
  /// (Ops::random_experts; no host copy): every code a random E2M1 value (4 random bits, ops/random_uniform.h's
  /// random_bits), every block scale 1, every row's global multiplier `global`. Enqueued on `stream`. Throws Error
  /// for cols not a positive multiple of 8 and when device memory runs out.
  static W4DeviceMatrix random_nvfp4(int experts, int rows, int cols, float global, uint64_t seed,
                                     cudaStream_t stream);
  /// The kernels' view.
  const detail::W4Mat& view() const { return view_; }
  /// Bytes the kernels read for one expert (as W4Packed::expert_bytes).
  size_t expert_bytes() const {
    return size_t(view_.rows) * (size_t(view_.wpr) * 4 +
                                 size_t(view_.groups) * (view_.fp8     ? 4
                                                         : view_.zeros ? 3
                                                                       : 2) +
                                 4);
  }
  int experts = 0;
  W4Format format = W4Format::Int4;

 private:
  DeviceArray<uint32_t> codes_;
  DeviceArray<__half> scales_;
  DeviceArray<uint8_t> zeros_;
  DeviceArray<float> global_;
  DeviceArray<float> fscales_;
  detail::W4Mat view_;
};

/// Routed experts: gate_up [E, 2I, H] (gate rows 0..I-1, then up rows) and down [E, H, I]; H and I multiples of 8.
/// planes 2: 8-bit experts as two 4-bit planes (int8_planes): the matrices hold [E, 2I, 2H] and [E, H, 2I] and
/// read their inputs twice over (moe_w4a16_routed repeats u and h into the workspace).
struct MoeW4A16Experts {
  const W4DeviceMatrix* gate_up = nullptr;
  const W4DeviceMatrix* down = nullptr;
  int experts = 0, hidden = 0, inter = 0;
  int planes = 1;
};

/// Scratch for moe_w4a16_routed, for up to max_tokens tokens with top_k slots each: the grouping of slots by expert
/// (offsets [E+1], sorted_slots / slot_row [max_tokens*top_k], tiles [max_tiles] of the GEMM or of the grouped GEMV
/// (ceil(slots / detail::kW4GroupSlots) + min(E, slots), the most either takes), num_tiles, the expert-id
/// status word), the activations h [slots, I] and expert outputs ys [slots, H] (FP16), the GEMV path's
/// completion counters `done` [max_tokens, detail::w4_gemv_down_row_blocks(hidden, 2 * inter)] (zero between
/// calls), and for experts of two planes the repeated inputs u2 [max_tokens, 2H] and h2 [slots, 2I].
class MoeW4A16Workspace {
 public:
  MoeW4A16Workspace(int max_tokens, int top_k, int experts, int hidden, int inter, int planes = 1);
  int max_tokens, top_k, experts, hidden, inter, planes, max_tiles;
  DeviceArray<int32_t> offsets, sorted_slots, slot_row, tile_expert, tile_row, num_tiles, status;
  DeviceArray<__half> h, ys, u2, h2;
  DeviceArray<int32_t> done;
};

/// Which kernels compute the experts: GEMV (per token slot; for few tokens per expert) or the GEMM (64-slot tiles over
/// the slots grouped by expert; prefill). Auto picks per launch, without a device round trip. Gemv runs the
/// tensor-core GEMV where detail::w4_gemv_tensor_cores allows it and FLASHNEXT_CUDA_W4_GEMV is not `fma`, else the
/// FP32-FMA GEMV (a lane group per 1-2 outputs, every GPU); GemvFma forces the latter (tests, benchmarks).
/// GemvGrouped groups the slots by expert first and runs the tensor-core GEMV with up to kW4GroupSlots slots of one
/// expert as the MMA's columns (each expert's weights read once per 8 of its slots instead of once per slot; four
/// launches: grouping, gate/up, down, combine), bit for bit Gemv's result; where detail::w4_gemv_grouped does not
/// allow it, Gemv runs. Gemm runs the mma.sync GEMM where detail::w4_gemm_tensor_cores allows it and
/// FLASHNEXT_CUDA_W4_GEMM is not `wmma`, else the WMMA GEMM (every GPU); GemmWmma forces the latter.
enum class W4Path : uint8_t { Auto, Gemv, GemvFma, Gemm, GemmWmma, GemvGrouped };

/// Auto's choice: GEMV when there are at most kW4GemvMaxSlots slots (tokens * top_k) and the mean number of slots
/// per touched expert, tokens * top_k / min(E, tokens * top_k), is at most kW4GemvMaxMeanX2 / 2; else the GEMM; where
/// the GEMV would run on the FP32 FMAs (tensor_core_gemv false: SM70, FLASHNEXT_CUDA_W4_GEMV=fma, int4 groups not a
/// multiple of 32) the Fma limits. The GEMV reads an expert's weights once per slot, the GEMM once per 64-slot tile
/// but at a lower rate. From bench_moe_w4a16 on the H100 (512 experts, top-10, 2026-12-06; us, NVFP4 and int4 g32):
/// tensor-core GEMV / mma.sync GEMM 318 / 625 and 391 / 796 at 32 tokens, 587 / 891 and 729 / 1,153 at 64, 1,151 /
/// 1,151 and 1,413 / 1,509 at 128 (2.5 slots an expert), 2,258 / 1,277 and 2,783 / 1,638 at 256; FP32-FMA GEMV /
/// WMMA GEMM 548 / 865 and 890 / 825 at 32 tokens, 1,042 / 1,267 and 1,687 / 1,188 at 64 (the H200's 2026-11-30
/// figures put that crossover at 16-64 tokens: the Fma limits).
/// Where the GEMV is picked and the grouped tensor-core GEMV can run (grouped_gemv), Auto takes GemvGrouped when the
/// slots are at least kW4GroupMinMeanX4 / 4 times the experts uniform routing touches, E * (1 - (1 - k/E)^tokens)
/// (the weights it reads fewer times than the per-slot GEMV; its grouping and combine launches cost about two small
/// kernels). moe_w4a16_auto_path passes grouped_gemv only where a grouped block's shared memory is at most
/// kW4GroupAutoSmem bytes (46 KB + 3 KB at the released hidden 2,560: 4 blocks an SM of an H100; wider rows would
/// leave 1-2), and FLASHNEXT_CUDA_W4_GEMV=grouped makes it take the grouped GEMV wherever the GEMV is picked and it
/// can run, =ungrouped never (read once; for before/after measurements).
constexpr int kW4GemvMaxMeanX2 = 5;
constexpr int kW4GemvMaxSlots = 1280;
constexpr int kW4GemvFmaMaxMeanX2 = 4;
constexpr int kW4GemvFmaMaxSlots = 160;
constexpr int kW4GroupMinMeanX4 = 5;
constexpr size_t kW4GroupAutoSmem = 64 * 1024;
W4Path moe_w4a16_pick_path(int tokens, int top_k, int experts, bool tensor_core_gemv, bool grouped_gemv = false);
struct MoeW4A16Experts;
/// What W4Path::Auto runs for these experts: moe_w4a16_pick_path with whether both matrices' GEMVs would run on the
/// tensor cores (moe_w4a16_gemv_tensor_cores and detail::w4_gemv_tensor_cores of each) and whether the grouped GEMV
/// can (detail::w4_gemv_grouped of each).
W4Path moe_w4a16_auto_path(const MoeW4A16Experts& w, int tokens, int top_k);
/// Whether W4Path::Gemv runs the tensor-core GEMV on the current device for NVFP4 and int4 groups of 32k inputs
/// (compiled for it and not turned off by FLASHNEXT_CUDA_W4_GEMV=fma), rather than the FP32-FMA one.
bool moe_w4a16_gemv_tensor_cores();

/// out[t] = sum_j weights[t,j] * down_{ids[t,j]}( silu(gate(u_t)) * up(u_t) )  (+ shared[t] when `shared` is given:
/// the gated shared expert's term [tokens, H] FP32, added last). u [tokens, H] FP16 with row stride ldu (a multiple
/// of 8); ids / weights [tokens, top_k] (router output); out [tokens, H] with row stride ldo. With `shared_ready` the
/// stream waits for that event before the launch that reads `shared` (the shared expert computed on another stream
/// meanwhile). Arithmetic as in the file comment. An expert id outside [0, E) is dropped and reported by
/// moe_w4a16_check_status. Throws Error for mismatched shapes, workspace or null pointers.
void moe_w4a16_routed(const MoeW4A16Experts& w, const __half* u, int64_t ldu, int tokens, const int32_t* ids,
                      const float* weights, const float* shared, cudaEvent_t shared_ready, __half* out, int64_t ldo,
                      MoeW4A16Workspace& ws, cudaStream_t stream, W4Path path = W4Path::Auto);
/// The same with an FP32 output (the ops interface's float32 MoE output).
void moe_w4a16_routed(const MoeW4A16Experts& w, const __half* u, int64_t ldu, int tokens, const int32_t* ids,
                      const float* weights, const float* shared, cudaEvent_t shared_ready, float* out, int64_t ldo,
                      MoeW4A16Workspace& ws, cudaStream_t stream, W4Path path = W4Path::Auto);

/// Whether moe_w4a16_routed takes FP32 activations for `tokens` tokens here: where Auto picks the tensor-core GEMV
/// (decode; grouped or not) for one plane, whose gate/up kernels round them to FP16 as they stage them.
bool moe_w4a16_routed_takes_f32(const MoeW4A16Experts& w, int tokens, int top_k);
/// moe_w4a16_routed (W4Path::Auto) with FP32 activations u [tokens, H] (row stride ldu a multiple of 8, rows 16-byte
/// aligned): the same result as on an FP16 copy of u, without making the copy. Throws Error where
/// moe_w4a16_routed_takes_f32 is false.
void moe_w4a16_routed(const MoeW4A16Experts& w, const float* u, int64_t ldu, int tokens, const int32_t* ids,
                      const float* weights, const float* shared, cudaEvent_t shared_ready, float* out, int64_t ldo,
                      MoeW4A16Workspace& ws, cudaStream_t stream);

/// Throws Error if a routed call met expert ids outside [0, E) (waits for the stream).
void moe_w4a16_check_status(MoeW4A16Workspace& ws, cudaStream_t stream);

}  // namespace flashnext::cuda
