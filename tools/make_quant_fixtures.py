#!/usr/bin/env python3
"""Quantized qwen4_exp fixtures: the tiny-a model (tests/data/fixtures/tiny-a) in every quantized on-disk format
flashnext reads, with reference logits computed by transformers from the dequantized weights.

Runs where `torch` (CPU is enough), `transformers` (5.17, with models/qwen4_exp) and `safetensors` are installed.

For each format the weights that the real release quantizes are quantized with the format's rules (docs
ARTIFACTS.md section 3) and written in its exact layout (tensor names, dtypes, shapes, config.json
`quantization_config`, ModelOpt's hf_quant_config.json, file naming). The reference model is tiny-a loaded in
float32 with exactly those weights replaced by dequant(quant(w)); transformers is never asked to load the
quantized checkpoint itself. Dequantization here is written independently of flashnext's C++ (loader/quant.cpp)
and in the same float32 operation order, so both give the same bits:

  NVFP4 ModelOpt          (e2m1(code) * e4m3(weight_scale[n, k/16])) * weight_scale_2
  NVFP4 compressed-tensors (e2m1(code) * e4m3(weight_scale[n, k/16])) / weight_global_scale
  FP8 block               e4m3(w) * weight_scale_inv[n/128, k/128]  (BF16 scales, partial blocks by ceil)
  int4 pack-quantized     (q - zp) * weight_scale[n, k/g]            (BF16 scales; q, zp signed int4)
  GPTQ int4 (v1)          (q - (qzero + 1)) * scales[k/g, n]         (F16 scales)
  AutoAWQ GEMM int4       (q - qzero) * scales[k/g, n]               (F16 scales; q, qzero 0..15)
  GPTQ / AutoRound b-bit  (q - (qzero + 1)) * scales[k/g, n]         (b = 2, 3, 4, 8; bit-stream packing)
  W8A8 int8 / FP8 channel q * weight_scale[n] (or the tensor's one)  (compressed-tensors int-/float-quantized)
  PLE FP8 table           e4m3(row) * weight_scale                   (one BF16 scalar)
  PLE int8 table          q[r, c] * weight_scale[r, c/g]             (per shard F16 group scales, symmetric)

Usage: python3 tools/make_quant_fixtures.py [OUT_DIR] [FORMAT ...]
OUT_DIR defaults to tests/data/quant; with no FORMAT every one of FORMATS is written.

Every format starts from tiny-a except `awq-int4-g128`: tiny-a's widths (hidden 64, experts 32) are smaller than
its group, so it starts from `tiny-a-wide`, tiny-a's config with hidden, expert and shared-expert widths 128, built
here with tools/make_fixtures.py's own build() (random weights, perturbed, saved in bf16 and reloaded in float32).

Output per format, in OUT_DIR/FORMAT/:
  model/                  the quantized checkpoint (config.json, generation_config.json, safetensors shards, index,
                          hf_quant_config.json for ModelOpt)
  reference.safetensors   P.input_ids [T] I64, P.logits [T, V] F32, P.argmax [T] I64 for P in PROMPTS (and
                          P.greedy_ids [S] I64 where the format asks for S greedy steps), and
                          `dequant.<checkpoint weight name>` F32 [N, K] for a few quantized weights (the exact values)
  reference.json          format, what is quantized, and how far the logits moved from the unquantized tiny-a
"""
import json
import math
import os
import shutil
import sys

import numpy as np
import torch
from safetensors.torch import load_file, save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = os.path.join(ROOT, "tests", "data", "fixtures", "tiny-a")
PROMPTS = ["short", "eos_inside"]
TP = "model.language_model."
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
FP8_MAX = 448.0

# ---------------------------------------------------------------------------------------------------------- packing


def pack_nibbles_u8(codes):
    """[N, K] codes 0..15 -> U8 [N, K/2], element 2j in the low nibble."""
    c = codes.to(torch.uint8)
    return (c[:, 0::2] | (c[:, 1::2] << 4)).contiguous()


def pack_int32(values, dim):
    """Unsigned 4-bit values (0..15) packed 8 per int32 along `dim` (0 or 1), element i at bits 4*i; the packed
    dimension is padded with zeros to a multiple of 8 (compressed-tensors pack_to_int32, GPTQ)."""
    v = values.to(torch.int64).numpy().astype(np.uint32)
    if dim == 0:
        v = v.T
    rows, cols = v.shape
    pad = (-cols) % 8
    v = np.pad(v, ((0, 0), (0, pad)))
    v = v.reshape(rows, -1, 8)
    packed = np.zeros(v.shape[:2], dtype=np.uint32)
    for i in range(8):
        packed |= v[:, :, i] << np.uint32(4 * i)
    out = torch.from_numpy(packed.view(np.int32).copy())
    return out.T.contiguous() if dim == 0 else out


def pack_bits(values, dim, bits):
    """Unsigned `bits`-bit values packed along `dim` (0 or 1) as GPTQ does for 2, 3, 4 and 8 bits: each line along
    `dim` is one little-endian bit stream over its int32 words, value i at bits bits*i .. bits*i + bits - 1 (for 3
    bits, 32 values fill 3 words and values 10 and 21 cross a word boundary: AutoGPTQ / GPTQModel pack)."""
    v = values.to(torch.int64).numpy().astype(np.uint64)
    if dim == 0:
        v = v.T
    rows, cols = v.shape
    assert (cols * bits) % 32 == 0, (cols, bits)
    words = np.zeros((rows, cols * bits // 32 + 1), dtype=np.uint64)  # one spare word for the carry
    for i in range(cols):
        bit = bits * i
        j, off = bit // 32, bit % 32
        x = v[:, i] << np.uint64(off)
        words[:, j] |= x & np.uint64(0xFFFFFFFF)
        words[:, j + 1] |= x >> np.uint64(32)
    out = torch.from_numpy(words[:, :-1].astype(np.uint32).view(np.int32).copy())
    return out.T.contiguous() if dim == 0 else out


def e2m1_round(x):
    """Nearest E2M1 code (sign in bit 3) of float32 `x` (values beyond 6 saturate)."""
    mags = E2M1[:8]
    idx = (x.abs().unsqueeze(-1) - mags).abs().argmin(-1)
    return idx | ((x < 0) & (idx > 0)).to(torch.int64) << 3


# AutoAWQ GEMM (awq/modules/linear/gemm.py WQLinear_GEMM.from_linear): nibble i of output word j holds output
# 8j + AWQ_ORDER[i]. Written here from that definition; tools/crosscheck_quant.py compares it with AutoAWQ's own
# packing and unpacking.
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def pack_awq(values):
    """[R, C] values 0..15 -> I32 [R, C/8] packed along dim 1 in AWQ order (C a multiple of 8)."""
    v = values.to(torch.int64).numpy().astype(np.uint32)
    rows, cols = v.shape
    assert cols % 8 == 0
    v = v.reshape(rows, cols // 8, 8)
    packed = np.zeros((rows, cols // 8), dtype=np.uint32)
    for i, out in enumerate(AWQ_ORDER):
        packed |= v[:, :, out] << np.uint32(4 * i)
    return torch.from_numpy(packed.view(np.int32).copy())


# ------------------------------------------------------------------------------------------------- quantizers
# Each returns ({suffix: tensor stored next to the weight's module}, dequantized float32 [N, K]).


def q_nvfp4_modelopt(w):
    w = w.float()
    n, k = w.shape
    scale_2 = (w.abs().max() / (6.0 * FP8_MAX)).float()
    blocks = w.reshape(n, k // 16, 16)
    block_scale = (blocks.abs().amax(-1) / 6.0 / scale_2).to(torch.float8_e4m3fn)
    denom = (block_scale.float() * scale_2).unsqueeze(-1)
    codes = e2m1_round(torch.where(denom > 0, blocks / denom, torch.zeros_like(blocks))).reshape(n, k)
    deq = (E2M1[codes].reshape(n, k // 16, 16) * block_scale.float().unsqueeze(-1)).reshape(n, k) * scale_2
    input_scale = torch.tensor(4.0 / (6.0 * FP8_MAX), dtype=torch.float32)  # activations: unused by W4A16
    return {"weight": pack_nibbles_u8(codes), "weight_scale": block_scale, "weight_scale_2": scale_2.reshape(()),
            "input_scale": input_scale.reshape(())}, deq


def q_nvfp4_ct(w):
    w = w.float()
    n, k = w.shape
    global_scale = (6.0 * FP8_MAX / w.abs().max()).float().reshape(1)
    blocks = w.reshape(n, k // 16, 16)
    block_scale = (blocks.abs().amax(-1) / 6.0 * global_scale).to(torch.float8_e4m3fn)
    denom = (block_scale.float() / global_scale).unsqueeze(-1)
    codes = e2m1_round(torch.where(denom > 0, blocks / denom, torch.zeros_like(blocks))).reshape(n, k)
    deq = (E2M1[codes].reshape(n, k // 16, 16) * block_scale.float().unsqueeze(-1)).reshape(n, k) / global_scale
    return {"weight_packed": pack_nibbles_u8(codes), "weight_scale": block_scale, "weight_global_scale": global_scale,
            "weight_shape": torch.tensor([n, k], dtype=torch.int64)}, deq


def q_fp8_block(w, bn=128, bk=128):
    w = w.float()
    n, k = w.shape
    sn, sk = math.ceil(n / bn), math.ceil(k / bk)
    scale_inv = torch.zeros(sn, sk)
    for i in range(sn):
        for j in range(sk):
            amax = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk].abs().max()
            scale_inv[i, j] = amax / FP8_MAX if amax > 0 else 1.0
    scale_inv = scale_inv.to(torch.bfloat16)
    full = scale_inv.float().repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    q = (w / full).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return {"weight": q, "weight_scale_inv": scale_inv}, q.float() * full


def q_int4_ct(w, group, symmetric):
    """compressed-tensors minmax observer, strategy group, int4 range [-8, 7], BF16 scales."""
    w = w.float()
    n, k = w.shape
    g = w.reshape(n, k // group, group)
    if symmetric:
        scale = (g.abs().amax(-1) / 7.5).to(torch.bfloat16)
        zp = torch.zeros(n, k // group, dtype=torch.int64)
    else:
        lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)
        scale = ((hi - lo) / 15.0).to(torch.bfloat16)
        zp = (-8 - torch.round(lo / scale.float())).clamp(-8, 7).to(torch.int64)
    s = scale.float().unsqueeze(-1)
    q = (torch.round(g / s) + zp.unsqueeze(-1)).clamp(-8, 7).to(torch.int64)
    deq = ((q - zp.unsqueeze(-1)).float() * s).reshape(n, k)
    out = {"weight_packed": pack_int32(q.reshape(n, k) + 8, dim=1), "weight_scale": scale,
           "weight_shape": torch.tensor([n, k], dtype=torch.int64)}
    if not symmetric:
        out["weight_zero_point"] = pack_int32(zp + 8, dim=0)
    return out, deq


def q_gptq_bits(w, group, bits, sym):
    """GPTQ of `bits` bits as AutoRound exports it (packing_format auto_round:auto_gptq, v1: qzeros store zero - 1),
    F16 scales. Symmetric: zero 2^(bits-1), scale = 2 max|w| / (2^bits - 1). Asymmetric: scale = max(max - min,
    1e-5) / (2^bits - 1), zero = clamp(-round(min / scale), 1, 2^bits - 1) (at least 1: v1 cannot store zero 0).
    q = clamp(round(w / scale) + zero, 0, 2^bits - 1). qweight [K*bits/32, N], qzeros [K/g, N*bits/32]."""
    w = w.float()
    n, k = w.shape
    top = 2 ** bits - 1
    g = w.reshape(n, k // group, group)
    if sym:
        scale = (2.0 * g.abs().amax(-1) / top).clamp(min=1e-5).to(torch.float16)
        zero = torch.full(scale.shape, 2 ** (bits - 1), dtype=torch.int64)
    else:
        lo, hi = g.amin(-1), g.amax(-1)
        scale = ((hi - lo).clamp(min=1e-5) / top).to(torch.float16)
        zero = (-torch.round(lo / scale.float())).clamp(1, top).to(torch.int64)
    s = scale.float().unsqueeze(-1)
    q = (torch.round(g / s) + zero.unsqueeze(-1)).clamp(0, top).to(torch.int64)
    deq = ((q - zero.unsqueeze(-1)).float() * s).reshape(n, k)
    return {"qweight": pack_bits(q.reshape(n, k).T, 0, bits), "qzeros": pack_bits((zero - 1).T, 1, bits),
            "scales": scale.T.contiguous(), "g_idx": (torch.arange(k) // group).to(torch.int32)}, deq


# AutoRound mixed-bit fixture: per layer of tiny-a, the routed experts' width and symmetry (extra_config entries),
# None for a layer the config keeps unquantized (bits 16); every other layer takes the top-level 4 bits, symmetric.
AUTOROUND_LAYERS = {0: (2, False), 1: (3, False), 2: (8, True), 4: (2, True), 5: None}


def autoround_experts(layer):
    spec = AUTOROUND_LAYERS.get(layer, (4, True))
    if spec is None:
        return None
    return lambda w: q_gptq_bits(w, 32, spec[0], spec[1])


def autoround_config(cfg):
    t = cfg["text_config"]
    extra = {}
    for layer, spec in AUTOROUND_LAYERS.items():
        for e in range(t["num_experts"]):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                m = f"{TP}layers.{layer}.mlp.experts.{e}.{proj}"
                extra[m] = {"bits": 16, "data_type": "float"} if spec is None else \
                    {"bits": spec[0], "group_size": 32, "sym": spec[1]}
    return {"quant_method": "auto-round", "bits": 4, "group_size": 32, "sym": True, "data_type": "int",
            "packing_format": "auto_round:auto_gptq", "block_name_to_quantize": f"{TP}layers",
            "extra_config": extra, "iters": 0, "autoround_version": "0.9.0"}


def q_w8(w, fp8, per_tensor=False):
    """compressed-tensors int-quantized / float-quantized weights (the W8A8 INT8 and FP8 releases' weights),
    symmetric, one BF16 scale per output row [N, 1] (strategy channel) or one for the tensor [1] (strategy tensor):
    int8 scale = max|w| / 127, q = clamp(round(w / scale), -128, 127); FP8 scale = max|w| / 448, q = E4M3(w /
    scale). Stored as `weight` I8 / F8_E4M3 [N, K] and `weight_scale`."""
    w = w.float()
    amax = w.abs().amax() if per_tensor else w.abs().amax(-1, keepdim=True)
    scale = (amax.clamp(min=1e-8) / (FP8_MAX if fp8 else 127.0)).to(torch.bfloat16)
    s = scale.float()
    if fp8:
        q = (w / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    else:
        q = torch.round(w / s).clamp(-128, 127).to(torch.int8)
    return {"weight": q.contiguous(), "weight_scale": scale.reshape(1) if per_tensor else scale.contiguous()}, \
        q.float() * s


def w8_dense_linears(cfg):
    """The dense linears a W8A8 release quantizes besides the experts: every Linear of the attention / GDN mixers and
    the shared expert (router, shared expert gate, PLE projections, hyper-connections and lm_head stay BF16)."""
    return [m for m in non_expert_linears(cfg)
            if m != "lm_head" and not m.endswith((".mlp.gate", ".shared_expert_gate")) and ".ple." not in m]


W8_IGNORE = ["lm_head", "re:.*mlp\\.gate$", "re:.*shared_expert_gate$", "re:.*hyper_connection.*", "re:.*\\.ple\\..*",
             "re:.*visual.*", "re:.*mtp.*"]


def w8_config(fp8):
    fmt = "float-quantized" if fp8 else "int-quantized"
    kind = "float" if fp8 else "int"
    act = {"num_bits": 8, "type": kind, "symmetric": True, "strategy": "token", "dynamic": True}
    groups = {"group_0": {"targets": ["Linear"], "format": fmt, "input_activations": act, "output_activations": None,
                          "weights": {"num_bits": 8, "type": kind, "symmetric": True, "strategy": "channel",
                                      "group_size": None, "dynamic": False, "observer": "minmax"}}}
    if fp8:  # the mixers and the shared expert per tensor (a second group), the routed experts per channel
        groups["group_0"]["targets"] = ["re:.*mlp\\.experts\\..*"]
        groups["group_1"] = json.loads(json.dumps(groups["group_0"]))
        groups["group_1"]["targets"] = ["re:.*(linear_attn|self_attn|shared_expert)\\..*"]
        groups["group_1"]["weights"]["strategy"] = "tensor"
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
            "config_groups": groups, "ignore": W8_IGNORE, "kv_cache_scheme": None, "sparsity_config": {},
            "version": "0.12.2"}


def q_awq(w, group):
    """AutoAWQ's zero-point quantizer (awq/quantize/quantizer.py pseudo_quantize_tensor, zero_point true, without
    the activation-aware scale search, which only changes the weights fed to it): per group of `group` inputs,
    scale = max(max - min, 1e-5) / 15 (F16), zero = clamp(-round(min / scale), 0, 15), q = clamp(round(w / scale) +
    zero, 0, 15). Stored as AutoAWQ GEMM: qweight [K, N/8], qzeros [K/g, N/8], scales F16 [K/g, N]."""
    w = w.float()
    n, k = w.shape
    g = w.reshape(n, k // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo).clamp(min=1e-5) / 15.0).to(torch.float16)  # [N, G]
    s = scale.float()
    zero = (-torch.round(lo / s)).clamp(0, 15).to(torch.int64)
    q = (torch.round(g / s.unsqueeze(-1)) + zero.unsqueeze(-1)).clamp(0, 15).to(torch.int64)
    deq = ((q - zero.unsqueeze(-1)).float() * s.unsqueeze(-1)).reshape(n, k)
    return {"qweight": pack_awq(q.reshape(n, k).T), "qzeros": pack_awq(zero.T),
            "scales": scale.T.contiguous()}, deq


def q_ple_fp8(shards):
    """FP8 E4M3 table shards with one BF16 scalar multiplier for the whole table."""
    amax = max(float(s.float().abs().max()) for s in shards)
    scale = torch.tensor([amax / FP8_MAX], dtype=torch.bfloat16)
    q = [(s.float() / scale.float()).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn) for s in shards]
    return q, scale, [x.float() * scale.float() for x in q]


def q_ple_int8(shards, group):
    """int8 table shards with F16 group scales per shard, row and group of `group` columns (W8A16, symmetric):
    scale = max(|w| over the group, 1e-8) / 127 in F16, q = clamp(round(w / scale), -127, 127); value = q * scale.
    Stored as `shard_K.weight` I8 [rows, D] and `shard_K.weight_scale` F16 [rows, D / group]."""
    q, scales, d = [], [], []
    for s in shards:
        r, c = s.shape
        g = s.float().reshape(r, c // group, group)
        sc = (g.abs().amax(-1).clamp(min=1e-8) / 127.0).to(torch.float16)  # [rows, groups]
        qi = torch.round(g / sc.float().unsqueeze(-1)).clamp(-127, 127).to(torch.int8)
        q.append(qi.reshape(r, c).contiguous())
        scales.append(sc.contiguous())
        d.append((qi.float() * sc.float().unsqueeze(-1)).reshape(r, c))
    return q, scales, d


# ------------------------------------------------------------------------------------------------ formats
RADIXARK_IGNORE = ["model.embed_tokens", "mtp.*", "model.mtp.*", "*.self_attn.*", "*.linear_attn.*", "*.mlp.gate*",
                   "*.mlp.shared_expert.*", "*.mlp.shared_expert_gate*", "*hyper_connection*", "*.ple.*",
                   "model.visual.*", "model.language_model.embed_tokens", "lm_head"]
MODELOPT_PRODUCER = {"name": "modelopt", "version": "0.46.0"}
GPTQ_DYNAMIC = {f"-:{p}": {} for p in [r".*linear_attn.*", r".*self_attn.*", r".*hyper_connection.*", r".*visual.*",
                                       r".*shared_expert.*", r".*\.ple\..*", r".*embed.*", r".*fc_hidden.*",
                                       r".*layers\.48\..*", r".*\.gate$"]}


def non_expert_linears(cfg):
    t = cfg["text_config"]
    out = ["lm_head"]
    for i, kind in enumerate(t["layer_types"]):
        p = f"{TP}layers.{i}."
        if kind == "linear_attention":
            out += [p + "linear_attn." + x for x in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")]
        else:
            out += [p + "self_attn." + x for x in ("q_proj", "k_proj", "v_proj", "o_proj", "indexer.index_qk_proj")]
        out += [p + "mlp.gate", p + "mlp.shared_expert_gate"]
        out += [p + "mlp.shared_expert." + x for x in ("gate_proj", "up_proj", "down_proj")]
        if i + 1 in t["ple_layer_ids"]:
            out += [p + "ple.key_proj", p + "ple.value_proj"]
    return out


# AutoAWQ quantizes every Linear of a decoder layer except modules_to_not_convert (substrings of module names):
# here the routed and the shared experts are quantized, everything else is kept.
AWQ_NOT_CONVERT = ["linear_attn", "self_attn", "mlp.gate", "shared_expert_gate", "hyper_connection", ".ple.",
                   "visual", "mtp"]


def awq_config(group):
    return {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm",
            "modules_to_not_convert": AWQ_NOT_CONVERT}


def shared_expert_linears(cfg):
    t = cfg["text_config"]
    return [f"{TP}layers.{i}.mlp.shared_expert.{x}" for i in range(t["num_hidden_layers"])
            for x in ("gate_proj", "up_proj", "down_proj")]


def ct_config(cfg, fmt, weights, ignore):
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                          "output_activations": None, "format": fmt}},
            "ignore": ignore, "kv_cache_scheme": None, "sparsity_config": {}, "version": "0.12.2"}


def int4_weights(group, symmetric):
    return {"num_bits": 4, "type": "int", "symmetric": symmetric, "strategy": "group", "group_size": group,
            "dynamic": False, "actorder": None, "observer": "minmax", "block_structure": None}


FORMATS = {
    # RadixArk/Qwen3.8-Flash-Next-NVFP4 (ARTIFACTS.md 3.1): ModelOpt NVFP4 routed experts, FP8 PLE table, its file
    # families (model-bf16-*, model-plefp8-*, layer-LLLLL-experts-AAAA-BBBB).
    "nvfp4-radixark": dict(experts=q_nvfp4_modelopt, ple_fp8=True, naming="radixark",
                           quantization_config=lambda c: {
                               "quant_method": "modelopt", "quant_algo": "NVFP4", "producer": MODELOPT_PRODUCER,
                               "config_groups": {"group_0": {
                                   "targets": ["Linear"],
                                   "weights": {"num_bits": 4, "type": "float", "group_size": 16, "dynamic": False},
                                   "input_activations": {"num_bits": 4, "type": "float", "group_size": 16,
                                                         "dynamic": False}}},
                               "ignore": RADIXARK_IGNORE},
                           hf_quant=lambda c: {"producer": MODELOPT_PRODUCER, "quantization": {
                               "quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                               "exclude_modules": RADIXARK_IGNORE}},
                           text_extra={"ple_embedding_dtype": "float8_e4m3fn"}),
    # nvidia/Qwen3.8-Flash-Next-NVFP4 (3.2): MIXED_PRECISION with quantized_layers per expert block and the table.
    "nvfp4-nvidia": dict(experts=q_nvfp4_modelopt, ple_fp8=True, naming="standard",
                         quantization_config=lambda c: {
                             "quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                             "producer": MODELOPT_PRODUCER, "kv_cache_quant_algo": None,
                             "quantized_layers": nvidia_layers(c),
                             "ignore": ["lm_head", "model.language_model.embed_tokens", "model.visual*", "mtp*",
                                        "*.self_attn*", "*.linear_attn*", "*.mlp.gate", "*.shared_expert*",
                                        "*hyper_connection*"]},
                         hf_quant=lambda c: {"producer": MODELOPT_PRODUCER, "quantization": {
                             "quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None,
                             "quantized_layers": nvidia_layers(c),
                             "exclude_modules": ["lm_head", "model.language_model.embed_tokens", "model.visual*"]}},
                         text_extra={}),
    # Qwen/Qwen3.8-Flash-Next-FP8 (3.3): E4M3 routed experts with BF16 128x128 weight_scale_inv, FP8 PLE table.
    "fp8-block": dict(experts=q_fp8_block, ple_fp8=True, naming="standard",
                      quantization_config=lambda c: {
                          "quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
                          "weight_per_tensor": False, "act_per_tensor": False,
                          "modules_to_not_convert": non_expert_linears(c) + ["model.language_model.embed_tokens"],
                          "modules_to_convert": ["ple.ple_embedding.ngram_embedding"]},
                      hf_quant=None, text_extra={}),
    # compressed-tensors W4A16 pack-quantized, symmetric group 32 (BF16 PLE, like the AWQ/W4A16 community releases).
    "ct-int4-sym-g32": dict(experts=lambda w: q_int4_ct(w, 32, True), ple_fp8=False, naming="standard",
                            quantization_config=lambda c: ct_config(c, "pack-quantized", int4_weights(32, True),
                                                                    non_expert_linears(c)),
                            hf_quant=None, text_extra={}),
    # compressed-tensors int4 group 32 asymmetric with packed zero points and an FP8 PLE table (3.4, leoncca-like).
    "ct-int4-asym-g32": dict(experts=lambda w: q_int4_ct(w, 32, False), ple_fp8=True, naming="standard",
                             quantization_config=lambda c: ct_config(c, "pack-quantized", int4_weights(32, False),
                                                                     non_expert_linears(c)),
                             hf_quant=None, text_extra={}),
    # compressed-tensors nvfp4-pack-quantized (weight_global_scale is the reciprocal of ModelOpt's weight_scale_2).
    "ct-nvfp4": dict(experts=q_nvfp4_ct, ple_fp8=False, naming="standard",
                     quantization_config=lambda c: ct_config(
                         c, "nvfp4-pack-quantized",
                         {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group",
                          "group_size": 16, "dynamic": False, "observer": "minmax"}, non_expert_linears(c)),
                     hf_quant=None, text_extra={}),
    # GPTQ int4 as AutoRound exports it (3.4 azampatti): sym, desc_act false, lm_head quantized too, `dynamic`
    # exclusions, FP8 PLE table; group 32 because tiny-a's widths are 32 and 64.
    # W8A8 releases (issue 22), read weight-only: INT8 per channel everywhere (experts, mixers, shared expert);
    # FP8 per channel on the experts and per tensor on the mixers and the shared expert. PLE table BF16 / FP8.
    "ct-w8a8-int8": dict(experts=lambda w: q_w8(w, False), dense=lambda w: q_w8(w, False), dense_of=w8_dense_linears,
                         ple_fp8=False, naming="standard", quantization_config=lambda c: w8_config(False),
                         hf_quant=None, text_extra={}, greedy=8, fp16_weights=True, fp16_exact=(".mlp.experts.",)),
    "ct-fp8-channel": dict(experts=lambda w: q_w8(w, True), dense=lambda w: q_w8(w, True, per_tensor=True),
                           dense_of=w8_dense_linears, ple_fp8=True, naming="standard",
                           quantization_config=lambda c: w8_config(True), hf_quant=None, text_extra={}, greedy=8,
                           fp16_weights=True, fp16_exact=(".mlp.experts.",)),
    # AutoRound mixed bits (issue 22): routed experts of 2, 3, 4 and 8 bits by layer (AUTOROUND_LAYERS), one layer
    # left BF16 by extra_config, FP8 PLE table.
    "autoround-mixed-g32": dict(experts_of=autoround_experts, ple_fp8=True, naming="standard",
                                quantization_config=autoround_config, hf_quant=None, text_extra={}, greedy=8),
    "gptq-int4-g32": dict(experts=lambda w: q_gptq_bits(w, 32, 4, True), lm_head=lambda w: q_gptq_bits(w, 32, 4, True),
                          ple_fp8=True,
                          naming="standard",
                          quantization_config=lambda c: {
                              "quant_method": "gptq", "bits": 4, "group_size": 32, "sym": True, "desc_act": False,
                              "lm_head": True, "checkpoint_format": "gptq", "true_sequential": False,
                              "damp_percent": 0.01, "dynamic": GPTQ_DYNAMIC, "provider": "auto-round",
                              "autoround_version": "0.9.0"},
                          hf_quant=None, text_extra={}),
    # AutoAWQ GEMM (3.4 cyankiwi / leoncca: group 32 with zero points; wtdcode: group 128): routed and shared
    # experts, BF16 PLE table.
    "awq-int4-g32": dict(experts=lambda w: q_awq(w, 32), dense=lambda w: q_awq(w, 32), dense_of=shared_expert_linears,
                         ple_fp8=False, naming="standard", quantization_config=lambda c: awq_config(32),
                         hf_quant=None, text_extra={}, greedy=8),
    # The V100 production layout (issue 22): AutoAWQ g32 experts with the PLE table baked to int8 with group scales
    # (W8A16; group 32 in the release, 8 here: tiny-a's table rows have 16 columns).
    "awq-int4-g32-ple-int8": dict(experts=lambda w: q_awq(w, 32), dense=lambda w: q_awq(w, 32),
                                  dense_of=shared_expert_linears, ple_fp8=False, ple_int8=8, naming="standard",
                                  quantization_config=lambda c: awq_config(32), hf_quant=None, text_extra={},
                                  greedy=8),
    "awq-int4-g128": dict(experts=lambda w: q_awq(w, 128), dense=lambda w: q_awq(w, 128),
                          dense_of=shared_expert_linears, ple_fp8=False, naming="standard",
                          quantization_config=lambda c: awq_config(128), hf_quant=None, text_extra={},
                          base="tiny-a-wide", greedy=8),
}

# Bases other than tiny-a: tiny-a's config with other widths, built by tools/make_fixtures.py (same perturbation).
WIDE = {"hidden_size": 128, "moe_intermediate_size": 128, "shared_expert_intermediate_size": 128}


def nvidia_layers(cfg):
    t = cfg["text_config"]
    layers = {f"{TP}layers.{i}.mlp.experts": {"quant_algo": "NVFP4", "group_size": 16}
              for i in range(t["num_hidden_layers"])}
    for lid in t["ple_layer_ids"]:
        layers[f"{TP}layers.{lid - 1}.ple.ple_embedding.ngram_embedding"] = {"quant_algo": "FP8"}
    layers["mtp.layers.0.mlp.experts"] = {"quant_algo": "FP8_PB_WO", "group_size": 128}
    return layers


# ------------------------------------------------------------------------------------------------ writing


def file_for(name, naming, cfg):
    """The shard a tensor goes to, by the release's file naming."""
    t = cfg["text_config"]
    if naming == "standard":
        return "model-00001-of-00002.safetensors" if not name.startswith("model.visual.") else \
            "model-00002-of-00002.safetensors"
    # RadixArk: routed experts in layer-LLLLL-experts-AAAA-BBBB (half of the experts per file here), the FP8 table
    # in model-plefp8-0000K (scale in the last), everything else in model-bf16-00001.
    if ".mlp.experts." in name:
        layer = int(name.split(".layers.")[1].split(".")[0])
        e = int(name.split(".mlp.experts.")[1].split(".")[0])
        per = t["num_experts"] // 2
        a = (e // per) * per
        return f"layer-{layer:05d}-experts-{a:04d}-{a + per - 1:04d}.safetensors"
    if ".ngram_embedding." in name:
        if name.endswith("weight_scale"):
            return "model-plefp8-00001.safetensors"
        return "model-plefp8-00000.safetensors"
    return "model-bf16-00001.safetensors"


def write_checkpoint(mdir, tensors, naming, cfg):
    os.makedirs(mdir, exist_ok=True)
    files = {}
    for name, t in tensors.items():
        files.setdefault(file_for(name, naming, cfg), {})[name] = t.contiguous()
    weight_map, total = {}, 0
    for f, ts in sorted(files.items()):
        save_file(ts, os.path.join(mdir, f), metadata={"format": "pt"})
        os.chmod(os.path.join(mdir, f), 0o644)
        for n, t in ts.items():
            weight_map[n] = f
            total += t.numel() * t.element_size()
    with open(os.path.join(mdir, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, fh, indent=2)


def base_tensors(base=BASE):
    out = {}
    mdir = os.path.join(base, "model")
    for f in sorted(os.listdir(mdir)):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(mdir, f)))
    return out


def reference_model(base=BASE):
    from transformers import Qwen4ExpForConditionalGeneration
    m = Qwen4ExpForConditionalGeneration.from_pretrained(os.path.join(base, "model"), dtype=torch.float32,
                                                         attn_implementation="eager")
    m.eval()
    return m


def logits_fp16_weights(model, ids, exact=()):
    """The reference's logits with every weight rounded to FP16, as the CUDA backend stores them (the PLE table
    excepted: it stays as stored and is converted in float32; so do the weights whose names contain a string of
    `exact`: int8 and FP8 routed experts, which the CUDA backend holds exactly, as two 4-bit planes and as FP8
    bytes). For formats whose weights FP16 does not hold exactly (8-bit codes times 16-bit scales need up to 20
    significant bits): the GPU tests hold the GPU to these logits and report the distance to the exact ones."""
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "ngram_embedding" not in n and not any(e in n for e in exact):
                p.copy_(p.half().float())
        lg = logits_of(model, ids)
        for n, p in model.named_parameters():
            p.copy_(saved[n])
    return lg


def wide_base(out_root):
    """tiny-a-wide (WIDE widths) in OUT_ROOT/.tiny-a-wide/model, built by tools/make_fixtures.py's build()."""
    import copy
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_fixtures
    spec = copy.deepcopy(make_fixtures.CONFIGS["tiny-a"])
    spec["text"].update(WIDE)
    out = os.path.join(out_root, ".tiny-a-wide")
    shutil.rmtree(out, ignore_errors=True)
    make_fixtures.build("tiny-a-wide", spec, out)
    # Newer transformers save tiny-a's qwen_sparse_attention layers as `indexed_attention` (and read both alike: main()
    # checks that this transformers reproduces tiny-a's reference from tiny-a's own config); keep tiny-a's names.
    cfg_path = os.path.join(out, "model", "config.json")
    with open(cfg_path) as fh:
        cfg = json.load(fh)
    with open(os.path.join(BASE, "model", "config.json")) as fh:
        tiny = json.load(fh)["text_config"]["layer_types"]
    wide = cfg["text_config"]["layer_types"]
    assert len(wide) == len(tiny) and all(w == t or w == "indexed_attention" for w, t in zip(wide, tiny)), wide
    cfg["text_config"]["layer_types"] = tiny
    with open(cfg_path, "w") as fh:
        json.dump(cfg, fh, indent=2)
    return out


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=ids[None], use_cache=False).logits[0].float()


def build(name, spec, out_root, base, ref_in, base_dir=BASE):
    with open(os.path.join(base_dir, "model", "config.json")) as fh:
        cfg = json.load(fh)
    t = cfg["text_config"]
    E, L = t["num_experts"], t["num_hidden_layers"]
    tensors = dict(base)
    deq = {}  # checkpoint weight name -> dequantized float32

    for layer in range(L):
        quantize = spec["experts_of"](layer) if "experts_of" in spec else spec["experts"]
        if quantize is None:
            continue
        for e in range(E):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                key = f"{TP}layers.{layer}.mlp.experts.{e}.{proj}.weight"
                stored, d = quantize(base[key])
                del tensors[key]
                for suffix, v in stored.items():
                    tensors[key[:-len("weight")] + suffix] = v
                deq[key] = d
    for key in [m + ".weight" for m in spec.get("dense_of", lambda c: [])(cfg)]:
        stored, d = spec["dense"](base[key])
        del tensors[key]
        for suffix, v in stored.items():
            tensors[key[:-len("weight")] + suffix] = v
        deq[key] = d
    if "lm_head" in spec:
        stored, d = spec["lm_head"](base["lm_head.weight"])
        del tensors["lm_head.weight"]
        for suffix, v in stored.items():
            tensors["lm_head." + suffix] = v
        deq["lm_head.weight"] = d
    ple_tables = {}
    if spec["ple_fp8"]:
        for lid in t["ple_layer_ids"]:
            p = f"{TP}layers.{lid - 1}.ple.ple_embedding.ngram_embedding."
            keys = [p + f"shard_{k}.weight" for k in range(t["split_ngram_parts"])]
            q, scale, d = q_ple_fp8([base[k] for k in keys])
            for k, v, dv in zip(keys, q, d):
                tensors[k] = v
                deq[k] = dv
            tensors[p + "weight_scale"] = scale
            ple_tables[lid - 1] = torch.cat(d, 0)
    if spec.get("ple_int8"):
        for lid in t["ple_layer_ids"]:
            p = f"{TP}layers.{lid - 1}.ple.ple_embedding.ngram_embedding."
            keys = [p + f"shard_{k}.weight" for k in range(t["split_ngram_parts"])]
            q, scales, d = q_ple_int8([base[k] for k in keys], spec["ple_int8"])
            for k, v, sc, dv in zip(keys, q, scales, d):
                tensors[k] = v
                tensors[k + "_scale"] = sc  # shard_K.weight_scale
                deq[k] = dv
            ple_tables[lid - 1] = torch.cat(d, 0)

    out = os.path.join(out_root, name)
    shutil.rmtree(out, ignore_errors=True)
    mdir = os.path.join(out, "model")
    cfg_q = json.loads(json.dumps(cfg))
    cfg_q["quantization_config"] = spec["quantization_config"](cfg)
    cfg_q["text_config"].update(spec["text_extra"])
    write_checkpoint(mdir, tensors, spec["naming"], cfg)
    with open(os.path.join(mdir, "config.json"), "w") as fh:
        json.dump(cfg_q, fh, indent=2)
    shutil.copy(os.path.join(base_dir, "model", "generation_config.json"), mdir)
    if spec["hf_quant"]:
        with open(os.path.join(mdir, "hf_quant_config.json"), "w") as fh:
            json.dump(spec["hf_quant"](cfg), fh, indent=2)

    # Reference: tiny-a in float32, the quantized weights replaced by their exact dequantized values.
    model = reference_model(base_dir)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for layer in range(L):
            ex = f"model.language_model.layers.{layer}.mlp.experts."
            I = t["moe_intermediate_size"]
            for e in range(E):
                k = f"{TP}layers.{layer}.mlp.experts.{e}."
                if k + "gate_proj.weight" not in deq:  # a layer the format keeps unquantized
                    continue
                params[ex + "gate_up_proj"][e, :I] = deq[k + "gate_proj.weight"]
                params[ex + "gate_up_proj"][e, I:] = deq[k + "up_proj.weight"]
                params[ex + "down_proj"][e] = deq[k + "down_proj.weight"]
        if "lm_head.weight" in deq:
            params["lm_head.weight"].copy_(deq["lm_head.weight"])
        for key in [m + ".weight" for m in spec.get("dense_of", lambda c: [])(cfg)]:
            params[key].copy_(deq[key])
        for layer, table in ple_tables.items():
            params[f"model.language_model.layers.{layer}.ple.ple_embedding.ngram_embedding.weight"].copy_(table)

    ref, meta = {}, {"format": name, "base": spec.get("base", "tests/data/fixtures/tiny-a"), "prompts": {},
                     "quantization_config": cfg_q["quantization_config"],
                     "quantized": sorted({"routed experts" if ".mlp.experts." in k else
                                          "shared experts" if ".mlp.shared_expert." in k else
                                          ("PLE table (int8)" if spec.get("ple_int8") else "PLE table (FP8)")
                                          if ".ngram_embedding." in k else k for k in deq})}
    for p in PROMPTS:
        ids = ref_in[f"{p}.input_ids"]
        lg = logits_of(model, ids)
        ref[f"{p}.input_ids"] = ids
        ref[f"{p}.logits"] = lg.contiguous()
        if spec.get("fp16_weights"):
            ref[f"{p}.logits_fp16_weights"] = logits_fp16_weights(model, ids, spec.get("fp16_exact", ())).contiguous()
        ref[f"{p}.argmax"] = lg.argmax(-1).to(torch.int64)
        if spec.get("greedy"):  # prefill + single-token decode steps through the reference's own cache
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import make_fixtures
            ref[f"{p}.greedy_ids"], _ = make_fixtures.greedy(model, ids, spec["greedy"])
        unq = ref_in[f"{p}.logits"]  # the unquantized base's logits
        meta["prompts"][p] = {"length": int(ids.numel()),
                              f"max_abs_diff_vs_unquantized_{spec.get('base', 'tiny-a').replace('-', '_')}":
                                  float((lg - unq).abs().max()),
                              "argmax_changed_positions": int((lg.argmax(-1) != unq.argmax(-1)).sum())}
    # A few exact dequantized weights for a model-free check of the C++ dequantization.
    picks = [f"{TP}layers.0.mlp.experts.0.gate_proj.weight", f"{TP}layers.0.mlp.experts.1.down_proj.weight",
             f"{TP}layers.7.mlp.experts.7.up_proj.weight", "lm_head.weight",
             f"{TP}layers.1.mlp.experts.2.down_proj.weight", f"{TP}layers.2.mlp.experts.3.gate_proj.weight",
             f"{TP}layers.0.linear_attn.in_proj_qkv.weight",
             f"{TP}layers.3.mlp.shared_expert.down_proj.weight"]
    if spec["ple_fp8"] or spec.get("ple_int8"):
        picks.append(f"{TP}layers.{t['ple_layer_ids'][0] - 1}.ple.ple_embedding.ngram_embedding.shard_0.weight")
    for k in picks:
        if k in deq:
            ref[f"dequant.{k}"] = deq[k].contiguous()
    save_file(ref, os.path.join(out, "reference.safetensors"))
    os.chmod(os.path.join(out, "reference.safetensors"), 0o644)
    meta["tensor_keys"] = sorted(ref)
    with open(os.path.join(out, "reference.json"), "w") as fh:
        json.dump(meta, fh, indent=1)
    print(name, json.dumps(meta["prompts"]))


def main():
    args = sys.argv[1:]
    out_root = args[0] if args else os.path.join(ROOT, "tests", "data", "quant")
    names = args[1:] or list(FORMATS)
    torch.manual_seed(0)
    base = base_tensors()
    ref_in = load_file(os.path.join(BASE, "reference.safetensors"))
    # The environment reproduces tiny-a's own reference before anything is quantized.
    model = reference_model()
    for p in PROMPTS:
        d = float((logits_of(model, ref_in[f"{p}.input_ids"]) - ref_in[f"{p}.logits"]).abs().max())
        assert d < 1e-4, f"this transformers/torch does not reproduce tiny-a's reference ({p}: {d})"
    wide = None
    for n in names:
        if FORMATS[n].get("base") == "tiny-a-wide":
            if wide is None:
                wide_dir = wide_base(out_root)
                wide_model = reference_model(wide_dir)
                # The wide base's own unquantized logits for tiny-a's prompts, as tiny-a's reference has them.
                wide_ref = dict(ref_in)
                for p in PROMPTS:
                    wide_ref[f"{p}.logits"] = logits_of(wide_model, ref_in[f"{p}.input_ids"])
                wide = (wide_dir, base_tensors(wide_dir), wide_ref)
            build(n, FORMATS[n], out_root, wide[1], wide[2], base_dir=wide[0])
        else:
            build(n, FORMATS[n], out_root, base, ref_in)
    if wide is not None:
        shutil.rmtree(wide[0], ignore_errors=True)


if __name__ == "__main__":
    main()
