#!/usr/bin/env python3
"""Cross-checks the quantized fixtures (tests/data/quant) against the formats' own libraries from PyPI.

For every `dequant.<weight>` tensor of each fixture's reference.safetensors (the exact float32 values that
flashnext's CPU dequantizer produces: tests/quant/fixtures_test.cpp `DequantizedWeightsEqualTheScriptsBitForBit`
asserts that bit for bit), the weight is dequantized again from the checkpoint's own tensors by the format's library,
and the two are compared:

  compressed-tensors  ct-int4-sym-g32, ct-int4-asym-g32 (PackedQuantizationCompressor.decompress), ct-nvfp4
                      (NVFP4PackedCompressor.decompress), ct-w8a8-int8 and ct-fp8-channel (Int- /
                      FloatQuantizationCompressor.decompress); fp8-block through its block-strategy dequantize
                      (compressed-tensors has no reader for the `quant_method: fp8` layout itself)
  nvidia-modelopt     nvfp4-radixark, nvfp4-nvidia experts (NVFP4QTensor.dequantize), when it imports
  gptqmodel           gptq-int4-g32, lm_head included, and autoround-mixed-g32's 2-, 3-, 4- and 8-bit experts (its
                      pure-torch TorchLinear.dequantize_weight at each module's width, after its own v1 -> v2 qzeros
                      conversion; installs without a GPU with BUILD_CUDA_EXT=0)
  autoawq             awq-int4-g32, awq-int4-g128 (routed and shared experts): AutoAWQ's own unpacking
                      (awq/utils/packing_utils.py dequantize_gemm, and unpack_awq + reverse_awq_order for the
                      float32 form) and its packing: WQLinear_GEMM.from_linear repacks the weights from the unpacked
                      codes' fake-quantized FP16 values, scales and zero points, and the result must equal the
                      checkpoint's qweight / qzeros bit for bit. AutoAWQ 0.2.9's sdist is unpacked, not installed
                      (its package __init__ imports model code for transformers 4.x): AUTOAWQ_SRC names the unpacked
                      folder holding awq/, whose linear and packing modules import alone
  torch               every FP8 PLE table shard (torch.float8_e4m3fn -> float32 times the BF16 scale), as a
                      conversion independent of flashnext's C++ FP8 table, and the int8 ones (int8 -> float32 times
                      each row's group scales)

Each library runs in float32 (its dequantize with float32 scales; equal to flashnext's values to within 1 ulp, the
difference a product of the same scales in another order can make) and, where its own decompress path returns
another dtype (BF16, F16), also that way (compared bit for bit with flashnext's values rounded to that dtype).
Prints one line per tensor, a summary, and with --markdown the table of tests/data/quant/README.md; exits 1 when a
tensor differs.

    python3 tools/crosscheck_quant.py [--root tests/data/quant] [--markdown]
Needs: torch, safetensors, compressed-tensors, nvidia-modelopt, gptqmodel (pip), AutoAWQ's source (AUTOAWQ_SRC; see
tests/data/quant/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
import traceback
from pathlib import Path

import torch
from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[1]
FORMATS = ["nvfp4-radixark", "nvfp4-nvidia", "fp8-block", "ct-int4-sym-g32", "ct-int4-asym-g32", "ct-nvfp4",
           "gptq-int4-g32", "awq-int4-g32", "awq-int4-g128", "awq-int4-g32-ple-int8", "autoround-mixed-g32",
           "ct-w8a8-int8", "ct-fp8-channel"]


class Checkpoint:
    """The tensors of a safetensors checkpoint folder (sharded through model.safetensors.index.json)."""

    def __init__(self, folder: Path):
        self.folder = folder
        index = folder / "model.safetensors.index.json"
        if index.exists():
            self.where = json.loads(index.read_text())["weight_map"]
        else:
            self.where = {}
            for f in folder.glob("*.safetensors"):
                with safe_open(f, "pt") as s:
                    self.where.update({k: f.name for k in s.keys()})

    def has(self, name: str) -> bool:
        return name in self.where

    def get(self, name: str) -> torch.Tensor:
        with safe_open(self.folder / self.where[name], "pt") as s:
            return s.get_tensor(name)


def quant_config(model_dir: Path) -> dict:
    cfg = json.loads((model_dir / "config.json").read_text())
    q = cfg.get("quantization_config") or cfg.get("text_config", {}).get("quantization_config")
    hf = model_dir / "hf_quant_config.json"
    if q is None and hf.exists():
        q = json.loads(hf.read_text())
    return q or {}


def ulps(got: torch.Tensor, want: torch.Tensor) -> int:
    """Largest distance in units in the last place between two float32 tensors (0 = bit-equal)."""
    def ordered(x):  # float32 bits mapped to integers that are monotonic in the value
        i = x.contiguous().view(torch.int32).to(torch.int64)
        return torch.where(i < 0, -(i & 0x7FFFFFFF), i)
    return int((ordered(got) - ordered(want)).abs().max())


def compare(got: torch.Tensor, want: torch.Tensor) -> tuple[int, float, int]:
    """(max ulp distance in float32 (0: bit-equal), max |got - want|, number of differing elements) of two tensors
    of one dtype."""
    assert got.shape == want.shape, (got.shape, want.shape)
    g, w = got.float(), want.float()
    return ulps(g, w), float((g - w).abs().max()), int((g != w).sum())


def describe(u: int, d: float, n: int, total: int) -> str:
    if u == 0:
        return "bit-equal"
    return f"{n}/{total} elements differ, by at most {u} ulp ({d:.2g})"


# The float32 products of the libraries multiply the scales in another order than flashnext (e.g. code x (scale x
# scale_2) against (code x scale) x scale_2): both are correctly rounded products, so they may differ by one unit in
# the last place; any wrong code, nibble order, scale or zero point is off by far more.
MAX_ULPS = 1


# ------------------------------------------------------------------------------------------------ the libraries


def ct_scheme(q: dict):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    group = next(iter(q["config_groups"].values()))
    return QuantizationScheme(targets=group["targets"], weights=QuantizationArgs(**group["weights"]))


def ct_pack_quantized(ck: Checkpoint, module: str, q: dict):
    """compressed-tensors pack-quantized: (library path output, float32 output)."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    scheme = ct_scheme(q)
    sd = {k: ck.get(f"{module}.{k}") for k in ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point")
          if ck.has(f"{module}.{k}")}
    lib = PackedQuantizationCompressor.decompress(sd, scheme)["weight"]
    shape = torch.Size(sd["weight_shape"].tolist())
    zp = None
    if "weight_zero_point" in sd:
        zp = unpack_from_int32(sd["weight_zero_point"], 4, (shape[0], sd["weight_scale"].shape[-1]), packed_dim=0)
    x = unpack_from_int32(sd["weight_packed"], 4, shape)
    f32 = dequantize(x_q=x, scale=sd["weight_scale"].float(), zero_point=zp, args=scheme.weights, dtype=torch.float32)
    return lib, f32


def ct_eight_bit(ck: Checkpoint, module: str, q: dict):
    """compressed-tensors int-quantized / float-quantized (W8A8 INT8, FP8 channel or tensor): the library's
    IntQuantizationCompressor / FloatQuantizationCompressor.decompress with the arguments of the config group that
    targets the module (in the model dtype), and its dequantize with float32 scales."""
    import re

    from compressed_tensors.compressors import FloatQuantizationCompressor, IntQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    group = next(g for g in q["config_groups"].values()
                 if any(t == "Linear" or (t.startswith("re:") and re.match(t[3:], module)) for t in g["targets"]))
    scheme = QuantizationScheme(targets=group["targets"], weights=QuantizationArgs(**group["weights"]))
    sd = {k: ck.get(f"{module}.{k}") for k in ("weight", "weight_scale")}
    comp = FloatQuantizationCompressor if group["format"] == "float-quantized" else IntQuantizationCompressor
    lib = comp.decompress(dict(sd), scheme)["weight"]
    f32 = dequantize(x_q=sd["weight"].to(torch.float32), scale=sd["weight_scale"].float(), args=scheme.weights,
                     dtype=torch.float32)
    return lib, f32


def ct_nvfp4(ck: Checkpoint, module: str, q: dict):
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor

    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    scheme = ct_scheme(q)
    sd = {k: ck.get(f"{module}.{k}") for k in ("weight_packed", "weight_scale", "weight_global_scale")}
    lib = NVFP4PackedCompressor.decompress(dict(sd), scheme)["weight"]
    m, n = sd["weight_packed"].shape
    x = unpack_fp4_from_uint8(sd["weight_packed"], m, 2 * n, dtype=torch.float32)
    f32 = dequantize(x_q=x, scale=sd["weight_scale"].to(torch.float32), args=scheme.weights,
                     global_scale=sd["weight_global_scale"].to(torch.float32), dtype=torch.float32)
    return lib, f32


def ct_fp8_block(ck: Checkpoint, module: str, q: dict):
    """The `quant_method: fp8` block layout (E4M3 weight, BF16 weight_scale_inv per 128x128 block) through
    compressed-tensors' block-strategy dequantize."""
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    w, s = ck.get(f"{module}.weight"), ck.get(f"{module}.weight_scale_inv")
    args = QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="block",
                            block_structure=list(q["weight_block_size"]))
    lib = dequantize(x_q=w, scale=s, args=args)
    f32 = dequantize(x_q=w.float(), scale=s.float(), args=args, dtype=torch.float32)
    return lib, f32


def modelopt_nvfp4(ck: Checkpoint, module: str, q: dict):
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    packed, scale, scale_2 = (ck.get(f"{module}.{k}") for k in ("weight", "weight_scale", "weight_scale_2"))
    n, k2 = packed.shape
    qt = NVFP4QTensor(torch.Size([n, 2 * k2]), torch.float32, packed)
    out = qt.dequantize(dtype=torch.float32, scale=scale, double_scale=scale_2, block_sizes={-1: 16})
    return out, out


def gptq_int4(ck: Checkpoint, module: str, q: dict):
    """GPTQModel's pure-torch kernel (TorchLinear): the checkpoint's buffers loaded into the layer, converted from
    checkpoint_format gptq (v1: qzeros hold zero - 1) by GPTQModel's own v1 -> v2 conversion, then its
    dequantize_weight(). Its product is scales (F16) x (code - zero) in F16; the float32 form repeats that formula
    with F32 scales on the same unpacked codes."""
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    from gptqmodel.utils.model import convert_gptq_v1_to_v2_format_module

    bufs = {k: ck.get(f"{module}.{k}") for k in ("qweight", "qzeros", "scales", "g_idx")
            if ck.has(f"{module}.{k}")}  # AutoRound writes no g_idx: the layer's own is input / group
    k, n = bufs["qweight"].shape[0] * 32 // q["bits"], bufs["qweight"].shape[1]
    layer = TorchLinear(bits=q["bits"], group_size=q["group_size"], sym=q["sym"], desc_act=q["desc_act"],
                        in_features=k, out_features=n, bias=False)
    for name, v in bufs.items():
        getattr(layer, name).copy_(v)
    if q.get("checkpoint_format", "gptq") == "gptq":
        convert_gptq_v1_to_v2_format_module(layer, bits=q["bits"], pack_dtype=torch.int32)
    layer.post_init()
    lib = layer.dequantize_weight().T.contiguous()  # [K, N] -> the checkpoint's [N, K]
    layer.scales.data = layer.scales.data.float()
    f32 = layer.dequantize_weight().float().T.contiguous()
    return lib, f32


def autoround_gptq(ck: Checkpoint, module: str, q: dict):
    """AutoRound's auto_round:auto_gptq packing: GPTQ v1 at the module's own width and group (extra_config, else the
    top level), read by GPTQModel as gptq_int4 does."""
    layer = (q.get("extra_config") or {}).get(module, {})
    return gptq_int4(ck, module, {"bits": layer.get("bits", q["bits"]), "group_size": layer.get("group_size",
                                                                                                   q["group_size"]),
                                  "sym": layer.get("sym", q["sym"]), "desc_act": False, "checkpoint_format": "gptq"})


def autoawq_modules():
    """AutoAWQ's linear and packing modules, from AUTOAWQ_SRC (an unpacked autoawq sdist) or an installed `awq`,
    without running awq/__init__.py (which imports its model classes, written for transformers 4.x)."""
    if "awq" not in sys.modules:
        src = os.environ.get("AUTOAWQ_SRC")
        if src:
            pkg = types.ModuleType("awq")
            pkg.__path__ = [os.path.join(src, "awq")]
            sys.modules["awq"] = pkg
    from awq.modules.linear.gemm import WQLinear_GEMM
    from awq.utils import packing_utils
    return WQLinear_GEMM, packing_utils


class Mismatch(Exception):
    pass


def autoawq_gemm(ck: Checkpoint, module: str, q: dict):
    """AutoAWQ GEMM: (dequantize_gemm's F16 output, the float32 form of the same codes; AutoAWQ's repacking of
    them). Both outputs come back as the checkpoint's [N, K]."""
    WQLinear_GEMM, pu = autoawq_modules()
    qweight, qzeros, scales = (ck.get(f"{module}.{k}") for k in ("qweight", "qzeros", "scales"))
    group = q["group_size"] if q["group_size"] > 0 else qweight.shape[0]
    lib = pu.dequantize_gemm(qweight, qzeros, scales, q["bits"], group).T.contiguous()
    iw, iz = pu.unpack_awq(qweight, qzeros, q["bits"])
    iw, iz = pu.reverse_awq_order(iw, iz, q["bits"])
    iw, iz = torch.bitwise_and(iw, 15).to(torch.int64), torch.bitwise_and(iz, 15).to(torch.int64)  # [K, N], [G, N]
    s = scales.float()
    f32 = ((iw - iz.repeat_interleave(group, 0)).float() * s.repeat_interleave(group, 0)).T.contiguous()
    # Packing: from_linear rounds (w + zero * scale) / scale per input column back to codes and packs them.
    k, n = iw.shape
    linear = torch.nn.Linear(k, n, bias=False)
    linear.weight.data = lib.to(torch.float16)
    repacked = WQLinear_GEMM.from_linear(linear, q["bits"], group, scales=scales, zeros=iz.to(torch.float16))
    same_w = torch.equal(repacked.qweight, qweight)
    same_z = torch.equal(repacked.qzeros, qzeros)
    packing = ("AutoAWQ from_linear repacks qweight and qzeros bit for bit" if same_w and same_z else
               f"AutoAWQ from_linear repacking DIFFERS (qweight equal: {same_w}, qzeros equal: {same_z})")
    return lib, f32, (same_w and same_z, packing)


def fp8_table(ck: Checkpoint, shard: str, q: dict):
    w = ck.get(shard)
    if w.dtype == torch.int8:  # int8 table: the shard's own group scales, shard_K.weight_scale [rows, D / g]
        s = ck.get(shard + "_scale").to(torch.float32)
        out = w.to(torch.float32) * s.repeat_interleave(w.shape[1] // s.shape[1], dim=1)
        return out, out
    table = shard[: shard.index(".shard_")]
    s = ck.get(table + ".weight_scale")
    out = w.to(torch.float32) * s.to(torch.float32)
    return out, out


LIBRARY = {
    "ct-int4-sym-g32": ("compressed-tensors", ct_pack_quantized),
    "ct-int4-asym-g32": ("compressed-tensors", ct_pack_quantized),
    "ct-nvfp4": ("compressed-tensors", ct_nvfp4),
    "fp8-block": ("compressed-tensors (block dequantize)", ct_fp8_block),
    "nvfp4-radixark": ("nvidia-modelopt", modelopt_nvfp4),
    "nvfp4-nvidia": ("nvidia-modelopt", modelopt_nvfp4),
    "gptq-int4-g32": ("gptqmodel (TorchLinear)", gptq_int4),
    "awq-int4-g32": ("autoawq 0.2.9 (dequantize_gemm, from_linear)", autoawq_gemm),
    "awq-int4-g128": ("autoawq 0.2.9 (dequantize_gemm, from_linear)", autoawq_gemm),
    "awq-int4-g32-ple-int8": ("autoawq 0.2.9 (dequantize_gemm, from_linear)", autoawq_gemm),
    "autoround-mixed-g32": ("gptqmodel (TorchLinear)", autoround_gptq),
    "ct-w8a8-int8": ("compressed-tensors (IntQuantizationCompressor)", ct_eight_bit),
    "ct-fp8-channel": ("compressed-tensors (FloatQuantizationCompressor)", ct_eight_bit),
}


def version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version as v

    try:
        return v(dist)
    except PackageNotFoundError:
        return "not installed"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT / "tests" / "data" / "quant")
    ap.add_argument("--markdown", action="store_true", help="also print the README table")
    ap.add_argument("--verbose", action="store_true", help="print the traceback of a library that fails")
    a = ap.parse_args()
    print(f"torch {torch.__version__}, compressed-tensors {version('compressed-tensors')}, nvidia-modelopt "
          f"{version('nvidia-modelopt')}, gptqmodel {version('gptqmodel')}")
    rows, failed = [], 0
    for fmt in FORMATS:
        model = a.root / fmt / "model"
        ck, q = Checkpoint(model), quant_config(model)
        with safe_open(a.root / fmt / "reference.safetensors", "pt") as ref:
            keys = [k for k in ref.keys() if k.startswith("dequant.")]
            for key in keys:
                name = key[len("dequant."):]
                want = ref.get_tensor(key)
                is_table = ".ngram_embedding.shard_" in name
                lib_name, fn = ("torch (table dtype)", fp8_table) if is_table else LIBRARY[fmt]
                module = name[: -len(".weight")]
                try:
                    res = fn(ck, name if is_table else module, q)
                    lib, f32 = res[0], res[1]
                    extra = res[2] if len(res) > 2 else None
                except Exception as e:  # a library that cannot be installed or run here: reported, not hidden
                    msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
                    print(f"{fmt:17s} {name}: {lib_name}: NOT RUN ({msg})")
                    if a.verbose:
                        traceback.print_exc()
                    rows.append((fmt, name, lib_name, "not run", msg))
                    continue
                u32, d32, n32 = compare(f32.float(), want)
                total = want.numel()
                verdict = f"float32: {describe(u32, d32, n32, total)}"
                ok = u32 <= MAX_ULPS
                if lib.dtype != torch.float32:  # the library's own path, in its output dtype
                    ul, dl, nl = compare(lib, want.to(lib.dtype))
                    verdict += f"; library path ({str(lib.dtype).replace('torch.', '')}): {describe(ul, dl, nl, total)}"
                    ok = ok and ul == 0
                if extra is not None:  # a further check of the library's own (e.g. its packing)
                    verdict += f"; {extra[1]}"
                    ok = ok and extra[0]
                failed += not ok
                print(f"{fmt:17s} {name} {list(want.shape)}: {lib_name}: {verdict}")
                rows.append((fmt, name, lib_name, "equal" if ok else "DIFFERENT", verdict))
    if a.markdown:
        print("\n| fixture | tensor | library | result |\n| --- | --- | --- | --- |")
        for fmt, name, lib_name, _, verdict in rows:
            print(f"| `{fmt}` | `{name.replace('model.language_model.', '')}` | {lib_name} | {verdict} |")
    not_run = sum(r[3] == "not run" for r in rows)
    print(f"\n{len(rows)} tensors: {len(rows) - not_run - failed} equal, {failed} different, {not_run} not run")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
