#!/usr/bin/env python3
"""A quantized fixture made by AutoRound itself (issue 22): tiny-a (tests/data/fixtures/tiny-a) quantized by the
`auto-round` package in its RTN mode (iters=0: round to nearest, no tuning, CPU), exported in its own format
(quant_method auto-round, packing_format auto_round:auto_gptq), with mixed widths per module through its
layer_config: layer 0's routed experts at 2 bits and layer 1's at 3 (asymmetric), layer 2's at 8, everything else
AutoRound quantizes at 4 bits, group 32, symmetric. The reference does not use flashnext's nor our fixture script's
dequantization: each quantized module's weight is GPTQModel's own (TorchLinear.dequantize_weight, float32 scales,
after its v1 -> v2 zero-point conversion), put into tiny-a in float32 and run by transformers.

    /tmp/venv/bin/python tools/make_autoround_fixture.py [OUT_DIR]       (default tests/data/quant/autoround-tool-rtn)
Needs: torch, transformers (with models/qwen4_exp), safetensors, auto-round, gptqmodel (BUILD_CUDA_EXT=0) from PyPI.
Output: OUT_DIR/model (AutoRound's export: config.json with quantization_config, quantization_config.json,
model.safetensors; its tokenizer files removed), OUT_DIR/reference.safetensors (P.input_ids, P.logits, P.argmax,
P.greedy_ids for P in short / eos_inside; `dequant.<module>.weight` for a few modules), OUT_DIR/reference.json.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import crosscheck_quant as cq  # noqa: E402  (GPTQModel's dequantization, as the cross-check uses it)
import make_fixtures  # noqa: E402
import make_quant_fixtures as mq  # noqa: E402

TP = "model.language_model."
LAYERS = {0: dict(bits=2, group_size=32, sym=False), 1: dict(bits=3, group_size=32, sym=False),
          2: dict(bits=8, group_size=32, sym=True)}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data", "quant", "autoround-tool-rtn")
    from auto_round import AutoRound
    from importlib.metadata import version
    from transformers import AutoTokenizer

    tmp = tempfile.mkdtemp()
    # AutoRound's calibration path wants a tokenizer even in RTN mode: the Qwen tokenizer cut to tiny-a's 1,024 ids.
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "truncate_tokenizer.py"),
                    os.path.join(ROOT, "models", "tiny-b-random"), os.path.join(tmp, "tok"), "1024", "--keep-added"],
                   check=True)
    tok = AutoTokenizer.from_pretrained(os.path.join(tmp, "tok"))
    model = mq.reference_model()
    E = model.config.text_config.num_experts
    layer_config = {f"{TP}layers.{layer}.mlp.experts.{e}.{p}": dict(spec) for layer, spec in LAYERS.items()
                    for e in range(E) for p in ("gate_proj", "up_proj", "down_proj")}
    ar = AutoRound(model, tokenizer=tok, bits=4, group_size=32, sym=True, iters=0, layer_config=layer_config,
                   disable_opt_rtn=True, nsamples=2, seqlen=16, device_map="cpu")
    ar.quantize_and_save(os.path.join(tmp, "ar"), format="auto_round")
    (exported,) = [os.path.join(tmp, "ar", d) for d in os.listdir(os.path.join(tmp, "ar"))]
    shutil.rmtree(out, ignore_errors=True)
    mdir = os.path.join(out, "model")
    shutil.copytree(exported, mdir)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if os.path.exists(os.path.join(mdir, f)):
            os.remove(os.path.join(mdir, f))
    shutil.rmtree(tmp)

    # Reference: tiny-a in float32 with GPTQModel's dequantization of every quantized module.
    with open(os.path.join(mdir, "config.json")) as fh:
        q = json.load(fh)["quantization_config"]
    ck = cq.Checkpoint(__import__("pathlib").Path(mdir))
    modules = sorted(n[: -len(".qweight")] for n in ck.where if n.endswith(".qweight"))
    model = mq.reference_model()
    params = dict(model.named_parameters())
    I = model.config.text_config.moe_intermediate_size
    deq = {}
    with torch.no_grad():
        for m in modules:
            _, w = cq.autoround_gptq(ck, m, q)
            deq[m + ".weight"] = w.float()
            if ".mlp.experts." in m:
                layer, e, proj = m.split("layers.")[1].split(".")[0], int(m.split("experts.")[1].split(".")[0]), \
                    m.split(".")[-1]
                ex = f"{TP}layers.{layer}.mlp.experts."
                if proj == "gate_proj":
                    params[ex + "gate_up_proj"][e, :I] = w
                elif proj == "up_proj":
                    params[ex + "gate_up_proj"][e, I:] = w
                else:
                    params[ex + "down_proj"][e] = w
            else:
                params[m + ".weight"].copy_(w)
    ref_in = load_file(os.path.join(mq.BASE, "reference.safetensors"))
    ref, meta = {}, {"format": "autoround-tool-rtn", "made_by": f"auto-round {version('auto-round')} (RTN, iters 0)",
                     "dequantized_by": f"gptqmodel {version('gptqmodel')} TorchLinear", "layers": LAYERS,
                     "quantized_modules": len(modules), "prompts": {}}
    for p in mq.PROMPTS:
        ids = ref_in[f"{p}.input_ids"]
        lg = mq.logits_of(model, ids)
        ref[f"{p}.input_ids"] = ids
        ref[f"{p}.logits"] = lg.contiguous()
        ref[f"{p}.argmax"] = lg.argmax(-1).to(torch.int64)
        ref[f"{p}.greedy_ids"], _ = make_fixtures.greedy(model, ids, 8)
        meta["prompts"][p] = {"length": int(ids.numel()),
                              "max_abs_diff_vs_unquantized_tiny_a": float((lg - ref_in[f"{p}.logits"]).abs().max())}
    for m in (f"{TP}layers.0.mlp.experts.0.gate_proj", f"{TP}layers.1.mlp.experts.2.down_proj",
              f"{TP}layers.2.mlp.experts.3.up_proj", f"{TP}layers.3.mlp.experts.4.gate_proj",
              f"{TP}layers.0.linear_attn.in_proj_qkv"):
        ref[f"dequant.{m}.weight"] = deq[m + ".weight"].contiguous()
    save_file(ref, os.path.join(out, "reference.safetensors"))
    meta["tensor_keys"] = sorted(ref)
    with open(os.path.join(out, "reference.json"), "w") as fh:
        json.dump(meta, fh, indent=1)
    print(json.dumps(meta["prompts"]))


if __name__ == "__main__":
    main()
