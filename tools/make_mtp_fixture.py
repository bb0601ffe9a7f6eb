#!/usr/bin/env python3
"""A small qwen4_exp checkpoint WITH an MTP layer (mtp.*) and the MTP reference logits, in PyTorch.

transformers 5.17 does not build the MTP module (it ignores `mtp.*` on load), so the MTP layer is written here on
top of the transformers modules: its decoder layer (`Qwen4ExpTextDecoderLayer` of a QSA type, renumbered to layer
index num_hidden_layers as vLLM does), `Qwen4ExpTextGatedResidual` for the hyper-connections and the mixer,
`Qwen4ExpTextRMSNorm` for the pre-fc norms, its MoE block with fused experts. The wiring follows SGLang
(`Qwen4ExpForCausalLMMTP`) and vLLM (`nvidia/mtp.py`), as /work/shared/docs/ARTIFACTS.md 2.5 records it:
    e  = fc_embedding(ZC-RMSNorm(embed_tokens(next)))                      [T, H]
    h  = trunk wide residual BEFORE the final hyper_connection_mixer       [T, S*H]
    h  = ZC-RMSNorm over the FULL S*H width (pre_fc_norm_hidden [S*H], one group: SG/VL, not llama.cpp's grouping)
    X  = fc_hidden applied to each stream of h (shared weights), + e on every stream
    X  = decoder layer (QSA attention with its indexer over the MTP layer's own keys, own HC, own MoE)
    logits = lm_head(mtp.hyper_connection_mixer(X)); X (pre-mixer) feeds the next draft step.
The MTP position of row i is the trunk position of h_i (next = the token at i+1), as vLLM passes target positions.

Usage: python3 tools/make_mtp_fixture.py OUT_DIR      (writes OUT_DIR/model/ and OUT_DIR/reference.safetensors)
Shipped output: tests/data/fixtures/tiny-mtp (made with transformers 5.17.0, torch 2.x CPU, float32, eager).

Reference keys (float32 unless noted):
    prompt.input_ids [T] int64, prompt.next_ids [T] int64   (next_ids = input_ids[1:] + [argmax of the trunk's last row])
    prompt.trunk_logits [T, V]        trunk next-token logits (for a consistency check)
    prompt.trunk_wide [T, S*H]        the trunk's pre-mixer wide residual
    prompt.mtp_logits [T, V]          MTP logits for every position (prefill-style, no cache)
    draft.ids [D] int64               D chained greedy drafts from the last position: draft 1 = argmax mtp_logits[-1],
                                      draft k+1 from the MTP's own pre-mixer state of draft k and token draft k
    draft.logits [D, V]               the logits that chose each draft (row 0 = mtp_logits[-1])
"""
import copy
import json
import math
import os
import sys
import zlib

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import Qwen4ExpConfig, Qwen4ExpForConditionalGeneration
from transformers.masking_utils import create_causal_mask
from transformers.models.qwen4_exp import modeling_qwen4_exp as M

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import perturb, rope, vision_stub  # noqa: E402

TEXT = dict(vocab_size=512, hidden_size=32, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
            head_dim=16, rope_parameters=rope(10_000_000.0, 0.25, [1, 1, 0]),
            linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8,
            linear_num_key_heads=2, linear_num_value_heads=4,
            moe_intermediate_size=16, shared_expert_intermediate_size=16, num_experts=8, num_experts_per_tok=2,
            hc_count=4, hc_lowrank=8, ple_layer_ids=[2], ple_embed_dim=32, ple_conv_kernel_size=4,
            ngram_size=3, heads_per_ngram=2, ngram_vocab_size_base=500, make_ngram_vocab_size_divisible_by=128,
            seed=1234, split_ngram_parts=2,
            indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=8, indexer_budget=8,
            indexer_compress_ratio=4, max_position_embeddings=2048, eos_token_id=500, pad_token_id=501,
            bos_token_id=None, rms_norm_eps=1e-6, tie_word_embeddings=False,
            layer_types=["linear_attention"] * 3 + ["full_attention"])
PROMPT_LEN = 40
DRAFTS = 4


class Mtp(nn.Module):
    """mtp.*: the 31 tensors of ARTIFACTS.md 2.5 (one layer)."""

    def __init__(self, text_cfg):
        super().__init__()
        H, S = text_cfg.hidden_size, text_cfg.hc_count
        L = text_cfg.num_hidden_layers
        cfg = copy.deepcopy(text_cfg)
        cfg.layer_types = list(text_cfg.layer_types) + ["qwen_sparse_attention"]  # the MTP layer is index L
        cfg.num_hidden_layers = L + 1
        self.layer_idx = L
        self.pre_fc_norm_embedding = M.Qwen4ExpTextRMSNorm(H, eps=cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = M.Qwen4ExpTextRMSNorm(S * H, eps=cfg.rms_norm_eps)  # full width, no group
        self.fc_embedding = nn.Linear(H, H, bias=False)
        self.fc_hidden = nn.Linear(H, H, bias=False)
        self.layers = nn.ModuleList([M.Qwen4ExpTextDecoderLayer(cfg, L)])
        self.hyper_connection_mixer = M.Qwen4ExpTextGatedResidual(cfg, use_combine=False)
        assert self.layers[0].ple is None and self.layers[0].layer_type != "linear_attention"

    def forward(self, embed, wide, next_ids, position_embeddings, mask):
        """wide [1, T, S*H], next_ids [1, T] -> (pre-mixer X [1, T, S*H], u [1, T, H])."""
        T = next_ids.shape[1]
        S = wide.shape[-1] // self.fc_hidden.in_features
        e = self.fc_embedding(self.pre_fc_norm_embedding(embed(next_ids)))  # [1, T, H]
        h = self.pre_fc_norm_hidden(wide).unflatten(-1, (S, -1))  # [1, T, S, H]
        x = (self.fc_hidden(h) + e.unsqueeze(-2)).flatten(-2)
        x = self.layers[0](x, position_embeddings=position_embeddings, attention_mask=mask, conv_mask=None,
                           past_key_values=None, ple_input_ids=None)
        return x, self.hyper_connection_mixer(x)


def save_mtp_shard(mdir, mtp):
    """Adds the MTP layer `mtp` to the checkpoint in `mdir` (saved by save_pretrained) as the released checkpoints
    store it: mtp.* with top-level names and fused experts, bf16, in its own shard model-mtp.safetensors, listed in
    model.safetensors.index.json (made when save_pretrained wrote one file: that file becomes model-trunk), and
    text_config.mtp_num_hidden_layers = 1. Returns the tensors written."""
    mtp_sd = {f"mtp.{k}": v.to(torch.bfloat16).contiguous().cpu() for k, v in mtp.state_dict().items()}
    mtp_file = "model-mtp.safetensors"
    save_file(mtp_sd, os.path.join(mdir, mtp_file), metadata={"format": "pt"})
    index_path = os.path.join(mdir, "model.safetensors.index.json")
    if os.path.exists(index_path):
        index = json.load(open(index_path))
    else:  # a single file: rename it to a shard and make an index that lists both
        single = "model-trunk.safetensors"
        os.rename(os.path.join(mdir, "model.safetensors"), os.path.join(mdir, single))
        index = {"metadata": {}, "weight_map": {k: single for k in load_file(os.path.join(mdir, single))}}
    index["weight_map"].update({k: mtp_file for k in mtp_sd})
    json.dump(index, open(index_path, "w"), indent=2)
    conf_path = os.path.join(mdir, "config.json")
    conf = json.load(open(conf_path))
    conf["text_config"]["mtp_num_hidden_layers"] = 1
    json.dump(conf, open(conf_path, "w"), indent=2)
    return mtp_sd


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    cfg = Qwen4ExpConfig(text_config=TEXT, vision_config=vision_stub(TEXT["hidden_size"]), tie_word_embeddings=False)
    model = Qwen4ExpForConditionalGeneration(cfg)
    perturb(model, seed=zlib.crc32(b"tiny-mtp"))
    text_cfg = model.config.text_config
    mtp = Mtp(text_cfg)
    for p in mtp.parameters():  # the modules' own init may leave zeros; give everything a random value first
        nn.init.normal_(p)
    perturb(mtp, seed=zlib.crc32(b"tiny-mtp.mtp"))
    mdir = os.path.join(out, "model")
    model.to(torch.bfloat16).save_pretrained(mdir, max_shard_size="20MB")
    mtp_sd = save_mtp_shard(mdir, mtp)
    print("mtp tensors:", len(mtp_sd))

    # Reload the bf16 weights in float32: the numbers describe the checkpoint exactly.
    ref = Qwen4ExpForConditionalGeneration.from_pretrained(mdir, dtype=torch.float32, attn_implementation="eager")
    ref.eval()
    mtp_ref = Mtp(ref.config.text_config)
    mtp_ref.load_state_dict({k[4:]: v.float() for k, v in load_file(os.path.join(mdir, "model-mtp.safetensors")).items()})
    mtp_ref.eval()
    lm = ref.model.language_model

    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, TEXT["eos_token_id"], (PROMPT_LEN,), generator=g, dtype=torch.int64)
    captured = {}
    hook = lm.hyper_connection_mixer.register_forward_pre_hook(lambda mod, args: captured.__setitem__("wide", args[0]))
    with torch.no_grad():
        trunk = ref(input_ids=ids[None], use_cache=False)
    hook.remove()
    trunk_logits = trunk.logits[0].float()
    wide = captured["wide"].float()  # [1, T, S*H]
    nxt = int(trunk_logits[-1].argmax())
    next_ids = torch.cat([ids[1:], torch.tensor([nxt])])

    def run_mtp(wide_rows, next_rows):
        T = next_rows.numel()
        pos = torch.arange(T).view(1, 1, -1).expand(3, 1, -1)
        x0 = torch.zeros(1, T, TEXT["hidden_size"])
        pe = lm.rotary_emb(x0, pos)
        mask = create_causal_mask(config=mtp_ref.layers[0].self_attn.config, inputs_embeds=x0, attention_mask=None,
                                  past_key_values=None, position_ids=torch.arange(T)[None], allow_is_causal_skip=False)
        with torch.no_grad():
            x, u = mtp_ref(lm.embed_tokens, wide_rows, next_rows[None], pe, mask)
            return x, ref.lm_head(u)[0].float()

    x, mtp_logits = run_mtp(wide, next_ids)
    # Chained drafts: the MTP's own pre-mixer state of the last row feeds the next position (full recompute).
    drafts, draft_logits = [int(mtp_logits[-1].argmax())], [mtp_logits[-1]]
    rows, nexts, last_x = wide, next_ids, x[:, -1:]
    for _ in range(DRAFTS - 1):
        rows = torch.cat([rows, last_x], dim=1)
        nexts = torch.cat([nexts, torch.tensor([drafts[-1]])])
        x, lg = run_mtp(rows, nexts)
        last_x = x[:, -1:]
        drafts.append(int(lg[-1].argmax()))
        draft_logits.append(lg[-1])
    tensors = {
        "prompt.input_ids": ids, "prompt.next_ids": next_ids, "prompt.trunk_logits": trunk_logits.contiguous(),
        "prompt.trunk_wide": wide[0].contiguous(), "prompt.mtp_logits": mtp_logits.contiguous(),
        "draft.ids": torch.tensor(drafts, dtype=torch.int64), "draft.logits": torch.stack(draft_logits).contiguous(),
    }
    save_file(tensors, os.path.join(out, "reference.safetensors"))
    print("drafts", drafts, "mtp logits scale", float(mtp_logits.abs().max()))


if __name__ == "__main__":
    main()
