// How a weight is stored in a checkpoint: one name shared by the loader (loader/quant.h, which parses and checks
// the formats and dequantizes them exactly) and the ops interface (ops/ops.h QuantMatrix, which backends repack).
#pragma once

#include <cstdint>

namespace flashnext {

/// How one weight is stored.
enum class QuantFormat : uint8_t {
  None,      ///< BF16 / F16 / F32
  Nvfp4,     ///< ModelOpt NVFP4: w = (e2m1 * e4m3 block scale) * weight_scale_2
  CtNvfp4,   ///< compressed-tensors nvfp4-pack-quantized: w = (e2m1 * e4m3 block scale) / weight_global_scale
  Fp8Block,  ///< FP8 E4M3 with a block weight_scale_inv
  CtInt4,    ///< compressed-tensors pack-quantized int4, symmetric or with packed zero points
  Gptq,      ///< GPTQ int4 (qweight / qzeros / scales / g_idx)
  Awq,       ///< AutoAWQ GEMM int4 (qweight / qzeros / scales, packed along the outputs in AWQ's nibble order)
  CtInt8,    ///< compressed-tensors int-quantized (W8A8 INT8 releases): I8 weight, one scale per row or tensor
  CtFp8,     ///< compressed-tensors float-quantized (FP8 releases): E4M3 weight, one scale per row or tensor
};

/// AutoAWQ's packing (QuantFormat::Awq): output 8j + m of a row sits in nibble kAwqNibble[m] (bits 4*kAwqNibble[m])
/// of int32 word j. AutoAWQ writes nibble i from output 8j + AWQ_ORDER[i], AWQ_ORDER = {0, 2, 4, 6, 1, 3, 5, 7}
/// (awq/modules/linear/gemm.py); this table is its inverse (AWQ_REVERSE_ORDER). qweight and qzeros alike.
inline constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

/// GPTQ's packing of b-bit values (b = 2, 3, 4, 8; QuantFormat::Gptq): a line of int32 words (a qweight column, a
/// qzeros row) is one little-endian bit stream, value i at bits b*i .. b*i + b - 1 (word j holds bits 32j .. 32j+31;
/// 3-bit values 10, 21 of every 32 cross a word boundary, as AutoGPTQ / GPTQModel pack them). `word(j)` returns word
/// j of the line; the result is value i, unsigned. The loader's dequantization and the CUDA repack both read it here.
template <class Word>
constexpr uint32_t gptq_packed_value(Word&& word, int bits, int64_t i) {
  const int64_t bit = int64_t(bits) * i, j = bit / 32, off = bit % 32;
  uint64_t v = uint32_t(word(j));
  if (off + bits > 32) v |= uint64_t(uint32_t(word(j + 1))) << 32;
  return uint32_t((v >> off) & ((uint64_t(1) << bits) - 1));
}

/// Whether the CUDA backend's W4A16 expert kernels hold a weight of format `f` (`bits` per value for GPTQ) as 4-bit
/// codes: NVFP4, int4, and GPTQ / AutoRound of 2, 3 or 4 bits (exact: ops/cuda/moe_w4a16.h). Blocks with other
/// weights: w4a16_planes.
constexpr bool w4a16_holds(QuantFormat f, int64_t bits) {
  return f == QuantFormat::Nvfp4 || f == QuantFormat::CtNvfp4 || f == QuantFormat::CtInt4 || f == QuantFormat::Awq ||
         (f == QuantFormat::Gptq && bits >= 2 && bits <= 4);
}

/// w4a16_planes' value for FP8 weights: one E4M3 byte a weight in the same kernels (W8A16, ops/cuda/moe_w4a16.h).
inline constexpr int kW4a16Fp8 = 3;

/// How the CUDA backend's W4A16 expert kernels hold a weight of format `f` (`bits` per value for GPTQ):
/// 1: as one matrix of 4-bit codes (w4a16_holds); 2: as two 4-bit planes, an 8-bit value q - z written as
/// 16 (q_hi - z_hi) + (q_lo - z_lo) over twice the inputs (8-bit GPTQ / AutoRound, compressed-tensors int8 channel
/// or tensor; exact: ops/cuda/moe_w4a16.h Int8Plain); kW4a16Fp8 (3): as FP8 bytes (compressed-tensors
/// float-quantized, the FP8 block format; ops/cuda/moe_w4a16.h Fp8Plain); 0: not at all (the FP16 path). A block of
/// routed experts takes the largest of 1 and 2 over its matrices (a 4-bit matrix in a block of planes has a zero
/// high plane), 3 when every matrix is FP8, else (a 0, or FP8 beside integers) FP16 as a whole.
constexpr int w4a16_planes(QuantFormat f, int64_t bits) {
  if (w4a16_holds(f, bits)) return 1;
  if (f == QuantFormat::CtFp8 || f == QuantFormat::Fp8Block) return kW4a16Fp8;
  return f == QuantFormat::CtInt8 || (f == QuantFormat::Gptq && bits == 8) ? 2 : 0;
}

/// Inputs per scale of an FP8 matrix of `cols` inputs held as FP8 bytes (kW4a16Fp8): the FP8 block format's
/// `block_cols` where a row holds several blocks, else 0 (one group a row; compressed-tensors' channel or tensor scale
/// is a row scale). The one rule of ops/cuda/weights_ops.cpp, `flashnext inspect` and the GPU tests.
constexpr int64_t w8a16_fp8_group(QuantFormat f, int64_t block_cols, int64_t cols) {
  return f == QuantFormat::Fp8Block && block_cols < cols ? block_cols : 0;
}
/// The start of a fold of w4a16_block_planes (a block with no matrix yet).
inline constexpr int kW4a16BlockStart = -1;
/// A block's holding (w4a16_planes; start from kW4a16BlockStart) with one more matrix of format `f` and `bits` folded
/// in: 0 once any matrix is 0; kW4a16Fp8 while every matrix is FP8; 0 for FP8 beside integer matrices (in either
/// order); else the largest of 1 and 2. The one rule of ops/cuda/weights_ops.cpp load_quantized_experts and
/// `flashnext inspect`.
constexpr int w4a16_block_planes(int block, QuantFormat f, int64_t bits) {
  const int p = w4a16_planes(f, bits);
  if (block == kW4a16BlockStart) return p;
  if (p == 0 || block == 0) return 0;
  if ((p == kW4a16Fp8) != (block == kW4a16Fp8)) return 0;
  return p > block ? p : block;
}

/// Whether a dense (linear) weight of format `f` can be held as 8-bit codes with float32 scales along its inputs
/// (ops/ops.h W8Linear; the CUDA backend's W8A16 products): compressed-tensors int8 and float per channel or tensor,
/// and the FP8 block format. The one rule of the loader (model/qwen4_exp/weights.cpp) and `flashnext inspect`.
constexpr bool w8_linear_holds(QuantFormat f) {
  return f == QuantFormat::CtInt8 || f == QuantFormat::CtFp8 || f == QuantFormat::Fp8Block;
}

/// A short name for reports and messages ("nvfp4-modelopt", "fp8-block", "int4-gptq", "int4-awq", ...).
constexpr const char* quant_format_name(QuantFormat f) {
  switch (f) {
    case QuantFormat::None:
      return "none";
    case QuantFormat::Nvfp4:
      return "nvfp4-modelopt";
    case QuantFormat::CtNvfp4:
      return "nvfp4-compressed-tensors";
    case QuantFormat::Fp8Block:
      return "fp8-block";
    case QuantFormat::CtInt4:
      return "int4-compressed-tensors";
    case QuantFormat::Gptq:
      return "int4-gptq";
    case QuantFormat::Awq:
      return "int4-awq";
    case QuantFormat::CtInt8:
      return "int8-compressed-tensors";
    case QuantFormat::CtFp8:
      return "fp8-compressed-tensors";
  }
  return "unknown";
}

}  // namespace flashnext
