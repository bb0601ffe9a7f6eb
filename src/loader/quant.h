// Quantized checkpoints: the declared quantization (config.json `quantization_config`, ModelOpt's
// hf_quant_config.json), the storage format of every quantized weight of a WeightManifest, and exact dequantization
// to float32 (the CPU oracle every GPU repacking is tested against).
//
// Formats (docs ARTIFACTS.md 3; N = output rows, K = input columns of a logical [N, K] weight):
//   NVFP4, ModelOpt   `weight` U8 [N, K/2]: two E2M1 codes per byte, element 2j in the low nibble, 2j+1 in the high;
//                     `weight_scale` F8_E4M3 [N, K/16] (linear, not swizzled); `weight_scale_2` F32 scalar;
//                     `input_scale` F32 scalar (activations, unused by W4A16).
//                     w = (e2m1(code) * e4m3(weight_scale[n, k/16])) * weight_scale_2
//   NVFP4, compressed-tensors (`nvfp4-pack-quantized`)  the same codes and block scales in `weight_packed` /
//                     `weight_scale`, with `weight_global_scale` F32 = 1 / weight_scale_2 (a divisor):
//                     w = (e2m1(code) * e4m3(weight_scale[n, k/16])) / weight_global_scale
//   FP8 block (quant_method `fp8`)  `weight` F8_E4M3 [N, K]; `weight_scale_inv` BF16/F16/F32
//                     [ceil(N/bn), ceil(K/bk)] (the last block of a dimension may be partial):
//                     w = e4m3(weight[n, k]) * weight_scale_inv[n/bn, k/bk]
//   INT4 compressed-tensors (`pack-quantized`)  `weight_packed` I32 [N, K/8], element k at bits 4*(k%8) of word
//                     k/8, stored +8 (unsigned); `weight_scale` [N, ceil(K/g)]; asymmetric groups add
//                     `weight_zero_point` I32 [ceil(N/8), ceil(K/g)] packed the same way along dim 0 (row n at bits
//                     4*(n%8) of word row n/8, +8); `weight_shape` I64 [2] = [N, K].
//                     w = ((nibble - 8) - (zp_nibble - 8)) * weight_scale[n, k/g]   (zp term 0 when symmetric)
//   GPTQ, b bits      `qweight` I32 [K*b/32, N]: column n of it is one little-endian bit stream holding input k at
//   (b = 2, 3, 4, 8)  bits b*k..b*k+b-1 (b = 4: element k at bits 4*(k%8) of word row k/8; b = 3: 32 values in 3
//                     words, two of them crossing a word boundary); `qzeros` I32 [ceil(K/g), N*b/32], each row one bit
//                     stream of the outputs' zero points; `scales` F16 [ceil(K/g), N]; `g_idx` I32 [K].
//                     w = (q - z) * scales[k/g, n], z = zero + 1 (checkpoint_format `gptq`, v1) or the zero
//                     (`gptq_v2`). Only g_idx[k] == k/g (desc_act false) is supported. The bits come from the config:
//                     GPTQ `bits` and `dynamic` overrides, or AutoRound (quant_method `auto-round`, packing_format
//                     `auto_round:auto_gptq`, v1) `bits` and per-module `extra_config` (bits 16: unquantized).
//                     Sources: AutoGPTQ / GPTQModel QuantLinear.pack (the 3-bit word layout), vLLM AutoRoundConfig.
//   INT4 AutoAWQ GEMM (quant_method `awq`, version `gemm`; or `auto-round` with packing_format `auto_round:auto_awq`,
//                     4 bits, qzeros read where present and required where `sym` is false)
//                     `qweight` I32 [K, N/8], packed along the OUTPUTS: word j
//                     of input row k holds outputs 8j..8j+7, output 8j+m at bits 4*p(m), p = {0, 4, 1, 5, 2, 6, 3, 7}
//                     (AutoAWQ writes nibble i from output 8j + {0, 2, 4, 6, 1, 3, 5, 7}[i]: AWQ_ORDER, whose
//                     inverse is p); `qzeros` I32 [K/g, N/8] packed the same way, stored as is (no offset);
//                     `scales` F16 [K/g, N]. g divides K (group_size -1: g = K).
//                     w = (nibble - zero nibble) * scales[k/g, n]; zero_point false: no qzeros, zero 8 (vLLM
//                     moe_wna16's symmetric int4). Sources: AutoAWQ awq/modules/linear/gemm.py
//                     WQLinear_GEMM.from_linear (packing) and awq/utils/packing_utils.py dequantize_gemm (unpacking).
//   PLE table, FP8    `ngram_embedding.shard_K.weight` F8_E4M3 rows, one BF16 `ngram_embedding.weight_scale` [1]:
//                     row value = e4m3 * weight_scale.
//   PLE table, int8   `ngram_embedding.shard_K.weight` I8 [rows_K, D] with `ngram_embedding.shard_K.weight_scale`
//                     BF16/F16/F32 [rows_K, D/g] (symmetric, g = 32 in the W8A16 g32 tables of the V100 AWQ release;
//                     the layout of the FP8 table with the scale made per shard, row and group):
//                     value = q * weight_scale[r, c/g].
//   8-bit, compressed-tensors (`int-quantized`: W8A8 INT8 releases; `float-quantized`: FP8 ones)  `weight` I8 or
//                     F8_E4M3 [N, K], `weight_scale` BF16/F16/F32 [N, 1] (strategy channel) or one element (tensor),
//                     symmetric; an `input_scale` (static activations) is allowed and unused (weight-only):
//                     w = q * weight_scale[n]   (or the tensor's scale)
// Every product above is exact in float32 with BF16 / F16 scales except the final multiply by weight_scale_2 (one
// rounding), the compressed-tensors NVFP4 division (one rounding) and FP8 times a BF16 scale (up to 12 significant
// bits: exact too); F32 scales round once, the same on every backend. (compressed-tensors' own decompressor rounds int4
// products to the scale's dtype; transformers' Fp8Dequantize derives the block from the scale grid, which differs from
// n/bn only for partial blocks of a multi-block dimension, absent from the released shapes.)
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/quant_format.h"
#include "loader/config.h"
#include "loader/manifest.h"
#include "loader/safetensors.h"

namespace flashnext {

/// E2M1 (FP4) code -> float: bit 3 is the sign, bits 0-2 index the magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
float e2m1_to_float(uint8_t code);

/// One compressed-tensors config group (`config_groups.<name>`), its `weights` arguments.
struct CtGroup {
  std::string name;
  std::vector<std::string> targets;  ///< "Linear" (class) or "re:<regex>" (module names)
  std::string format;                ///< the group's own format, else the config's
  int64_t num_bits = 0;
  std::string type;        ///< "int" or "float"
  std::string strategy;    ///< "group", "channel", "tensor_group", ...
  int64_t group_size = 0;  ///< 0 for channel (one group spans K)
  bool symmetric = true;
};

/// One AutoRound `extra_config` entry, keyed by a module name or by a regex (a key with a regex metacharacter, matched
/// with re.search semantics; an exact name wins over regexes, and among regexes the first in key order applies: JSON
/// objects are read sorted): a module's own bits (16 or more: kept unquantized) and group size. Its `sym` is not
/// needed: the zero points are stored either way.
struct AutoRoundLayer {
  int64_t bits = 4;
  int64_t group_size = 0;  ///< 0: one group spans K
  bool sym = true;         ///< symmetric (no zero points needed); the config's `sym` unless the entry says
};

/// One GPTQModel `dynamic` rule: a module-name regex (Python re.match) that excludes modules (`-:`) or overrides
/// bits / group_size (`+:` or a bare pattern). An exclusion that matches wins over every override, and among
/// overrides the first in key order applies (JSON objects are read sorted, so file order is not kept).
struct GptqRule {
  std::string pattern;
  bool exclude = false;
  int64_t bits = 0, group_size = 0;  ///< 0: not overridden
};

/// The quantization a checkpoint declares. Built by read_quant_config; `method` empty means "none declared".
struct QuantConfig {
  std::string source;  ///< file(s) it was read from, for messages
  std::string method;  ///< quant_method: "modelopt", "fp8", "compressed-tensors", "gptq", "auto-round" or "awq"

  // modelopt
  std::string algo;                                                   ///< "NVFP4" or "MIXED_PRECISION"
  std::vector<std::pair<std::string, std::string>> quantized_layers;  ///< MIXED_PRECISION: module -> quant_algo
  std::vector<std::string> exclude_modules;                           ///< ModelOpt `exclude_modules` / `ignore`
  // NVFP4 block (16) or GPTQ / AWQ group size (-1 or 0 in the config: one group spans K, stored as 0)
  int64_t group_size = 0;
  // fp8
  int64_t block_rows = 0, block_cols = 0;  ///< weight_block_size
  // compressed-tensors
  std::string ct_format;  ///< top-level `format`
  std::vector<CtGroup> ct_groups;
  // gptq, auto-round (bits 2, 3, 4 or 8)
  int64_t bits = 0;
  bool desc_act = false;
  bool gptq_v2 = false;  ///< checkpoint_format "gptq_v2": zero points stored without the v1 "-1"
  std::vector<GptqRule> gptq_dynamic;
  std::map<std::string, AutoRoundLayer> auto_round_layers;  ///< AutoRound extra_config by module name
  bool auto_round_awq = false;  ///< AutoRound packing_format "auto_round:auto_awq": AutoAWQ GEMM tensors, 4 bits
  bool auto_round_sym = true;   ///< AutoRound `sym`
  // awq (bits and group_size above)
  bool awq_zero_point = true;            ///< `zero_point`: qzeros present; false: symmetric, zero 8
  std::vector<std::string> not_convert;  ///< `modules_to_not_convert`: module-name substrings kept unquantized
};

/// Parses the quantization of a model folder: `quantization_config` of config.json (top level, else inside
/// text_config) and, when present, hf_quant_config.json (ModelOpt; its `quantization` block wins, and a quant_algo
/// that disagrees with config.json is an error). Throws Error naming the file and field for an unknown
/// quant_method, quant_algo, compressed-tensors format or group, unsupported options (GPTQ or AWQ bits other than 4,
/// an AWQ version other than gemm or a backend other than autoawq, FP8 without weight_block_size, a non-null
/// kv_cache_quant_algo, activation ordering in compressed-tensors) and fields of the wrong type. Returns an empty
/// QuantConfig when nothing is declared.
QuantConfig read_quant_config(const std::string& model_dir);

/// Parses already-read documents (`hf_quant` may be null); `source` names them in messages.
QuantConfig parse_quant_config(const nlohmann::json& config, const nlohmann::json& hf_quant, const std::string& source);

/// One quantized weight: its format, geometry and the checkpoint tensors holding it.
struct QuantizedWeight {
  QuantFormat format = QuantFormat::None;
  std::string name;                          ///< logical weight name, e.g. "layers.0.mlp.experts.3.gate_proj.weight"
  int64_t rows = 0, cols = 0;                ///< logical [N, K]
  int64_t group = 0;                         ///< inputs per scale: 16 (NVFP4) or the int4 group size (0: all of K)
  int64_t block_rows = 0, block_cols = 0;    ///< FP8 block (bn, bk)
  bool gptq_v2 = false;                      ///< GPTQ zero points without the v1 offset
  int64_t bits = 4;                          ///< GPTQ: 2, 3, 4 or 8 bits per value
  const TensorView* data = nullptr;          ///< weight / weight_packed / qweight
  const TensorView* scale = nullptr;         ///< weight_scale / weight_scale_inv / scales
  const TensorView* global_scale = nullptr;  ///< weight_scale_2 / weight_global_scale (NVFP4)
  const TensorView* zero_point = nullptr;    ///< weight_zero_point / qzeros; null when symmetric (CT, AWQ)
  const TensorView* g_idx = nullptr;         ///< GPTQ g_idx, optional
  const TensorView* shape = nullptr;         ///< compressed-tensors weight_shape, optional
};

/// The storage format of `w` for reports: quant_format_name, with GPTQ's width ("int2-gptq", "int8-gptq", ...).
std::string weight_format_name(const QuantizedWeight& w);

/// Checks dtypes and shapes of every tensor of `w` against its format; throws Error naming the tensor, its file, the
/// shape or dtype found and the one expected (also for a missing scale, a GPTQ g_idx that is not k / group, a
/// compressed-tensors weight_shape that disagrees with [rows, cols], an AWQ group size that does not divide K).
void validate_quantized_weight(const QuantizedWeight& w);

/// The exact float32 values of `w` as a row-major [rows, cols] array (validates first).
std::vector<float> dequantize(const QuantizedWeight& w);

/// The float32 scales of an 8-bit weight that can be held as codes with scales (w8_linear_holds: CtInt8, CtFp8,
/// Fp8Block), row-major [rows, ceil(cols / *group)]: the row's (or the tensor's) scale with *group = cols, or the FP8
/// block's scale of the row's block with *group = block_cols (cols when one block spans the row). The codes are
/// w.data's bytes as they are. float(code) * scale reproduces `dequantize` exactly. Validates first; throws Error for
/// another format.
std::vector<float> w8_linear_scales(const QuantizedWeight& w, int64_t* group);

/// Whether logical weight `name` is a linear projection that the loader hands to the backend as 8-bit codes when its
/// format allows (w8_linear_holds): GDN in_proj_qkv / z / b / a and out_proj, QSA q / k / v / o_proj and the indexer's
/// index_qk_proj, the shared expert's gate / up / down_proj, the PLE key / value projections (MTP's stay BF16).
/// The list of model/qwen4_exp/weights.cpp's Loader::get_linear and of `flashnext inspect`'s GPU plan.
bool w8_linear_weight_name(std::string_view name);
/// Inputs per scale of an 8-bit weight held as codes with scales (w8_linear_holds): the FP8 block format's block_cols
/// where a row holds several blocks, else cols (one scale a row). The group w8_linear_scales returns.
inline int64_t w8_linear_group(const QuantizedWeight& w) {
  return w.format == QuantFormat::Fp8Block && w.block_cols < w.cols ? w.block_cols : w.cols;
}
/// Bytes the CUDA backend holds for an 8-bit linear weight: the codes and the float32 scales (rows * ceil(cols /
/// group)), `group` as w8_linear_group gives it.
inline int64_t w8_linear_bytes(int64_t rows, int64_t cols, int64_t group) {
  return rows * cols + 4 * rows * ((cols + group - 1) / group);
}

/// One FP8 PLE table shard [rows, dim] times the table's scalar `weight_scale` (BF16/F16/F32, one element), exact,
/// as row-major float32. Throws Error naming the tensors for a non-FP8 shard or a scale that is not one element.
std::vector<float> dequantize_ple_shard(const TensorView& shard, const TensorView& weight_scale);

/// An int8 PLE table shard `shard` I8 [rows, dim] with its group scales `scales` (`shard_K.weight_scale`, BF16 /
/// F16 / F32 [rows, dim / g]): checks both and returns g, the columns per scale. Throws Error naming the tensors for a
/// shard that is not I8, scales of another dtype or height, a column count g does not divide, or (check_values) a
/// non-finite scale.
/// The shapes and dtypes only, unless `check_values` (the manifest checks the values once; every scale is read).
int64_t ple_int8_group(const TensorView& shard, const TensorView& scales, bool check_values = false);

/// The int8 PLE shard's float32 values, row-major: q[r, c] * scales[r, c / g], one float32 multiply (exact for BF16
/// and F16 scales: 8 by at most 11 significant bits; F32 scales round once). Checks as ple_int8_group.
std::vector<float> dequantize_ple_shard_int8(const TensorView& shard, const TensorView& scales);

/// The FP8 PLE table's multiplier: `weight_scale` as float32 (exact), after the checks of dequantize_ple_shard on
/// `shard` (FP8) and the scale (one BF16/F16/F32 element); also a finite value. Backends keep the FP8 shards and
/// multiply each converted row by it (ops/ops.h PleTable::scale), which gives dequantize_ple_shard's values.
float ple_table_scale(const TensorView& shard, const TensorView& weight_scale);

/// Bytes the CUDA backend's W4A16 repacking (src/ops/cuda/moe_w4a16.h W4Packed::expert_bytes) holds for one
/// expert's [rows, cols] matrix: codes 4 bytes x 4*ceil(cols/32) words per row, per row ceil(32*ceil(cols/32) /
/// g) FP16 group scales (g = group, or cols when 0) plus as many uint8 zero points when `zeros`, and one F32 row
/// scale. Used by `flashnext inspect` for the GPU memory plan (the loader does not link the CUDA code).
int64_t w4a16_packed_bytes(int64_t rows, int64_t cols, int64_t group, bool zeros);
/// The same for an 8-bit matrix [rows, cols] held as two 4-bit planes (moe_w4a16.h int8_planes): [rows, 2 cols] with
/// zero points, groups of `group` inputs (0 or a row or more: one group a row of each plane).
int64_t w4a16_planes_packed_bytes(int64_t rows, int64_t cols, int64_t group);
/// The same for an FP8 matrix [rows, cols] held as FP8 bytes (moe_w4a16.h W4Format::Fp8): 4 bytes x 4*ceil(cols/16)
/// words per row, per row ceil(16*ceil(cols/16) / g) F32 group scales (g = group, or cols when 0), one F32 row scale.
int64_t w8a16_fp8_packed_bytes(int64_t rows, int64_t cols, int64_t group);

/// The quantization of one checkpoint: every quantized language-model weight of a manifest, matched against the
/// declared QuantConfig.
class QuantScheme {
 public:
  /// Finds every weight of `m` stored in a non-float form (or as packed companions without a `.weight`), decides
  /// its format from the tensors present, checks that `cfg` declares that format for the module (ModelOpt
  /// MIXED_PRECISION: its `quantized_layers` entry; compressed-tensors: a config group whose targets match) and
  /// takes the format's parameters from `cfg`, then validates every tensor (validate_quantized_weight). `qweight`
  /// is read as GPTQ, or as AutoAWQ GEMM when the config's quant_method is awq. Throws Error naming the tensor for:
  /// a quantized weight without a declared quantization, a format the config does not declare (also a module that
  /// AWQ's modules_to_not_convert or a GPTQ `-:` rule excludes), companions of two formats on one weight (or
  /// quantization companions on a float weight), AWQ qzeros missing under zero_point true (or present under
  /// false), FP8 weights with a per-tensor or per-channel `weight_scale` outside compressed-tensors, and every
  /// validation failure.
  /// Logical shapes come from `model` (loader/tensor_plan.h).
  static QuantScheme build(const QuantConfig& cfg, const ModelConfig& model, const WeightManifest& m);

  /// The quantized weight `name` (logical `....weight`), or nullptr when it is stored as a float tensor.
  const QuantizedWeight* find(const std::string& name) const;
  const std::map<std::string, QuantizedWeight>& weights() const { return weights_; }
  /// Number of quantized weights by component and format, e.g. {routed_experts: {nvfp4-modelopt: 192}}; the PLE
  /// table is listed as `fp8-scalar` per shard when stored in FP8 and as `int8-gG` per shard when stored in int8
  /// with group scales of G columns.
  std::map<std::string, std::map<std::string, int64_t>> summary() const { return summary_; }

 private:
  std::map<std::string, QuantizedWeight> weights_;
  std::map<std::string, std::map<std::string, int64_t>> summary_;
};

}  // namespace flashnext
