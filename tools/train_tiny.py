#!/usr/bin/env python3
"""Trains the bundled tiny qwen4_exp (models/tiny-fortunes) on the English text of Debian's `fortunes` packages.

The real architecture at a small size: 4 layers (3 Gated DeltaNet + 1 QSA with its block indexer, PLE read by
layer index 1 as in the released model: ple_layer_ids [2], one-indexed), 4-stream hyper-connections, 16 routed experts top-4 plus a shared expert, and an MTP layer
trained with the next-next-token loss; a 4,096-id vocabulary cut from the Qwen tokenizer with its added tokens
(tools/truncate_tokenizer.py --keep-added), so the chat template works. The trunk is transformers' own
`Qwen4ExpForConditionalGeneration`; the MTP layer is tools/make_mtp_fixture.py's `Mtp` (transformers 5.17 does not
build one). The QSA indexer gets no gradient (its top-k selects; the reference trains it with a separate loss) and
keeps its initial weights, as do the vision stub's.

Data: the fortune cookies of the `fortunes` and `fortunes-min` Debian packages (BSD licence; the files of
/usr/share/games/fortunes, without the ASCII-art files and a few topics; a cookie two files share kept once), one in
20 held out: half of them judge early stopping, the other half is the test text (heldout.txt). Each cookie is trained
on as raw text and as a chat answer to a request about its file's topic ("Tell me a joke about computers."), so that
`flashnext generate --prompt "..."` answers with a cookie-like text.

    python3 tools/train_tiny.py --text DIR --tokenizer TOKDIR --out OUT [--minutes 6] [--device cuda]

writes OUT/ (config.json, model*.safetensors with mtp.* in its own shard, tokenizer files, generation_config.json,
heldout.txt, perplexity.json: transformers' perplexity of the first --eval-tokens tokens of heldout.txt in windows of
--eval-ctx, from the saved bf16 weights in float32 on the CPU, and a greedy sample) and OUT/train_log.json.
--reference-only writes OUT/perplexity.json again from OUT's weights and heldout.txt (the models/tiny-fortunes of
2026-12-05 came from the first version of this script: PLE at layer 0, no deduplication, held-out cookies joined by
newlines only, no early stopping).
"""
import argparse
import json
import math
import os
import random
import shutil
import sys
import time

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from transformers import Qwen4ExpConfig, Qwen4ExpForConditionalGeneration
from transformers.masking_utils import create_causal_mask
from transformers.models.qwen4_exp import modeling_qwen4_exp as M

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import rope, vision_stub  # noqa: E402
from make_mtp_fixture import Mtp, save_mtp_shard  # noqa: E402

VOCAB = 4096
TEXT = dict(vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1,
            head_dim=64, rope_parameters=rope(10_000_000.0, 0.25, [3, 3, 2]),
            linear_conv_kernel_dim=4, linear_key_head_dim=64, linear_value_head_dim=64,
            linear_num_key_heads=2, linear_num_value_heads=4,
            moe_intermediate_size=64, shared_expert_intermediate_size=256, num_experts=16, num_experts_per_tok=4,
            hc_count=4, hc_lowrank=32, ple_layer_ids=[2], ple_embed_dim=64, ple_conv_kernel_size=4,
            ngram_size=3, heads_per_ngram=8, ngram_vocab_size_base=20000, make_ngram_vocab_size_divisible_by=128,
            seed=1234, split_ngram_parts=8,
            indexer_n_heads=4, indexer_kv_heads=1, indexer_head_dim=32, indexer_budget=256,
            indexer_compress_ratio=4, max_position_embeddings=4096, bos_token_id=None, rms_norm_eps=1e-6,
            tie_word_embeddings=False, layer_types=["linear_attention"] * 3 + ["qwen_sparse_attention"])
MAX_COOKIE = 1200
SKIP_FILES = {"art", "ascii-art", "translate-me", "ethnic", "drugs", "men-women", "politics", "debian", "perl"}
TOPICS = {  # file -> topics a request may name
    "computers": ["computers", "programming", "GPUs", "software", "hackers"], "linux": ["Linux", "computers"],
    "linuxcookie": ["Linux", "computers"], "science": ["science"], "food": ["food"], "love": ["love"],
    "work": ["work"], "sports": ["sports"], "kids": ["kids", "children"], "pets": ["pets", "cats and dogs"],
    "law": ["the law", "lawyers"], "medicine": ["medicine", "doctors"], "education": ["school", "education"],
    "literature": ["books", "literature"], "songs-poems": ["poems", "songs"], "people": ["people"],
    "wisdom": ["wisdom", "life"], "riddles": ["riddles"], "startrek": ["Star Trek", "space"],
    "magic": ["magic"], "news": ["the news"], "humorists": ["humor"], "definitions": ["words"],
}
GENERIC = ["Tell me a joke.", "Tell me something funny.", "Say something wise.", "Tell me a fortune.",
           "Give me a quote.", "Make me laugh.", "Tell me something."]
ABOUT = ["Tell me a joke about {}.", "Say something about {}.", "Tell me something about {}.",
         "What do you think about {}?", "Give me a quote about {}."]


def read_cookies(text_dir):
    """(file, cookie) pairs of every fortune file in text_dir, in name order, skipping SKIP_FILES and .dat files, and
    cookies longer than MAX_COOKIE characters; a cookie that two files share (or that differs only in case and
    spacing) is kept once, in its first file, so that no held-out cookie is also trained on."""
    out, seen, long = [], set(), 0
    for name in sorted(os.listdir(text_dir)):
        path = os.path.join(text_dir, name)
        if name in SKIP_FILES or "." in name or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        if text.endswith("\n%\n"):
            text = text[:-2]
        for c in text.split("\n%\n"):
            c = c.strip("\n").replace("\t", "    ").rstrip()
            key = " ".join(c.lower().split())
            if not c or key in seen:
                continue
            if len(c) > MAX_COOKIE:
                long += 1
                continue
            seen.add(key)
            out.append((name, c))
    print(f"train_tiny: {long} cookies longer than {MAX_COOKIE} characters left out", flush=True)
    return out


def held_out_text(cookies):
    """The text of held-out cookies as the raw training documents are: each followed by a newline and
    <|endoftext|> (both tokenizers read the special token's text as its id)."""
    return "".join(c + "\n<|endoftext|>" for _, c in cookies)


def encode_documents(tok, cookies, rng):
    """Token lists: each cookie as raw text (between <|endoftext|>) and as a chat answer."""
    docs = []
    for name, c in cookies:
        docs.append(tok.encode(c + "\n<|endoftext|>").ids)
        topics = TOPICS.get(name)
        req = rng.choice(ABOUT).format(rng.choice(topics)) if topics and rng.random() < 0.7 else rng.choice(GENERIC)
        chat = f"<|im_start|>user\n{req}<|im_end|>\n<|im_start|>assistant\n{c}<|im_end|>\n"
        docs.append(tok.encode(chat).ids)
    return docs


def batches(docs, seq_len, batch, rng):
    """Endless [batch, seq_len] LongTensors of shuffled documents packed end to end."""
    stream = []
    while True:
        order = list(range(len(docs)))
        rng.shuffle(order)
        for i in order:
            stream.extend(docs[i])
            while len(stream) >= batch * seq_len:
                yield torch.tensor(stream[: batch * seq_len]).view(batch, seq_len)
                del stream[: batch * seq_len]


def mtp_inputs(lm, mtp, T, B, device):
    pos = torch.arange(T, device=device).view(1, 1, -1).expand(3, B, -1)
    x0 = torch.zeros(B, T, lm.config.hidden_size, device=device)
    pe = lm.rotary_emb(x0, pos)
    mask = create_causal_mask(config=mtp.layers[0].self_attn.config, inputs_embeds=x0, attention_mask=None,
                              past_key_values=None, position_ids=torch.arange(T, device=device)[None].expand(B, -1),
                              allow_is_causal_skip=False)
    return pe, mask


def full_selection_indexer(original):
    """Qwen4ExpTextQSAIndexer.forward for training windows no longer than the token budget: every query then selects
    every token it sees (all its complete blocks fit the block top-k, the tail is always kept), so the selection mask
    is the visible mask itself. The reference computes it query by query in Python (seconds a batch); longer inputs
    go to the reference's own code."""

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_values):
        if past_key_values is not None or hidden_states.shape[1] > self.token_budget:
            return original(self, hidden_states, position_embeddings, attention_mask, past_key_values)
        visible = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
        if attention_mask.is_floating_point():
            return torch.where(visible, attention_mask.new_zeros(()), torch.finfo(attention_mask.dtype).min)
        return visible

    return forward


def forward_losses(model, mtp, ids):
    """Trunk next-token loss and MTP next-next-token loss of a [B, T] batch."""
    lm = model.model.language_model
    captured = {}
    hook = lm.hyper_connection_mixer.register_forward_pre_hook(lambda m, a: captured.__setitem__("wide", a[0]))
    try:
        out = model(input_ids=ids, labels=ids, use_cache=False)
    finally:
        hook.remove()
    B, T = ids.shape
    wide = captured["wide"][:, : T - 2]  # rows 0..T-3: (h_i, token i+1) -> token i+2
    pe, mask = mtp_inputs(lm, mtp, T - 2, B, ids.device)
    _, u = mtp(lm.embed_tokens, wide, ids[:, 1 : T - 1], pe, mask)
    mtp_logits = model.lm_head(u)
    mtp_loss = F.cross_entropy(mtp_logits.float().reshape(-1, mtp_logits.shape[-1]), ids[:, 2:].reshape(-1))
    return out.loss, mtp_loss


@torch.no_grad()
def perplexity(model, ids, ctx, device):
    """exp(mean NLL) over windows of ctx tokens, each token after a window's first scored (flashnext perplexity)."""
    total, n = 0.0, 0
    for w0 in range(0, len(ids) - 1, ctx):
        w = torch.tensor(ids[w0 : w0 + ctx], device=device)[None]
        if w.shape[1] < 2:
            break
        logits = model(input_ids=w, use_cache=False).logits[0].double()
        total += float(F.cross_entropy(logits[:-1], w[0, 1:], reduction="sum"))
        n += w.shape[1] - 1
    return math.exp(total / n), n


@torch.no_grad()
def greedy(model, ids, steps, eos, device):
    x = torch.tensor(ids, device=device)[None]
    out = []
    for _ in range(steps):
        nxt = int(model(input_ids=x, use_cache=False).logits[0, -1].argmax())
        out.append(nxt)
        if nxt == eos:
            break
        x = torch.cat([x, torch.tensor([[nxt]], device=device)], dim=1)
    return out


def write_reference(out, tok, held, train, im_end, args):
    """perplexity.json of the model folder `out`: transformers' figures from the saved weights as flashnext reads them
    (bf16 -> float32), with the reference's own indexer, on the CPU (float32 throughout: no TF32 in a GPU's matmuls
    and convolutions), over the first --eval-tokens tokens of out/heldout.txt."""
    dev = torch.device("cpu")
    ref = Qwen4ExpForConditionalGeneration.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    ref.to(dev).eval()
    with open(os.path.join(out, "heldout.txt"), encoding="utf-8") as f:
        held_ids = tok.encode(f.read()).ids[: args.eval_tokens]
    ppl, scored = perplexity(ref, held_ids, args.eval_ctx, dev)
    train_ids = tok.encode("".join(c + "\n" for _, c in train[:200])).ids[: args.eval_tokens]
    train_ppl, _ = perplexity(ref, train_ids, args.eval_ctx, dev)
    prompt = tok.encode("<|im_start|>user\nTell me a joke about GPUs.<|im_end|>\n<|im_start|>assistant\n").ids
    sample = greedy(ref, prompt, 64, im_end, dev)
    result = {
        "heldout_perplexity": ppl, "heldout_tokens_scored": scored, "eval_tokens": len(held_ids),
        "eval_ctx": args.eval_ctx, "train_text_perplexity": train_ppl, "greedy_prompt_ids": prompt,
        "greedy_ids": sample, "greedy_text": tok.decode(sample), "transformers_dtype": "float32 (from the bf16 files)",
        "device": str(dev), "torch": torch.__version__,
    }
    json.dump(result, open(os.path.join(out, "perplexity.json"), "w"), indent=2)
    return ppl, scored, train_ppl, result["greedy_text"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--text", required=True, help="folder of fortune files (/usr/share/games/fortunes)")
    ap.add_argument("--tokenizer", required=True, help="folder with the cut tokenizer.json + tokenizer_config.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=6.0, help="training time budget")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after N steps (0: the time budget only)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--eval-tokens", type=int, default=2048)
    ap.add_argument("--eval-ctx", type=int, default=512)
    ap.add_argument("--eval-every", type=int, default=50,
                    help="held-out loss every N steps; the weights of the best one are saved (early stopping); 0: no "
                         "held-out loss, the last weights are saved")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="a much smaller model (a quick check of this script)")
    ap.add_argument("--reference-only", action="store_true",
                    help="no training: write --out's perplexity.json again from its saved weights")
    args = ap.parse_args()
    dev = torch.device(args.device)
    torch.manual_seed(0)
    rng = random.Random(0)

    tok = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    im_end, endoftext = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    assert im_end is not None and endoftext is not None and tok.get_vocab_size() <= VOCAB, "tokenizer"
    cookies = read_cookies(args.text)
    # One cookie in 20 held out: the even ones judge early stopping (validation), the odd ones are the test text
    # (heldout.txt, perplexity.json), seen by neither the training nor the choice of the weights.
    valid = [c for i, c in enumerate(cookies) if i % 40 == 0]
    held = [c for i, c in enumerate(cookies) if i % 40 == 20]
    train = [c for i, c in enumerate(cookies) if i % 20 != 0]
    if args.reference_only:
        ppl, scored, train_ppl, text = write_reference(args.out, tok, held, train, im_end, args)
        print(f"train_tiny: held-out perplexity {ppl:.3f} over {scored} tokens (train text {train_ppl:.3f}); {text!r}")
        return
    docs = encode_documents(tok, train, rng)
    print(f"train_tiny: {len(cookies)} cookies ({len(held)} held out), {sum(map(len, docs))} training tokens a pass",
          flush=True)

    text = dict(TEXT, eos_token_id=im_end, pad_token_id=endoftext)
    if args.tiny:
        text.update(hidden_size=32, head_dim=16, rope_parameters=rope(10_000_000.0, 0.25, [1, 1, 0]),
                    linear_key_head_dim=8, linear_value_head_dim=8, moe_intermediate_size=16,
                    shared_expert_intermediate_size=16, hc_lowrank=8, ple_embed_dim=32, indexer_head_dim=8)
    cfg = Qwen4ExpConfig(text_config=text, vision_config=vision_stub(text["hidden_size"]), tie_word_embeddings=False)
    model = Qwen4ExpForConditionalGeneration(cfg).to(dev)
    mtp = Mtp(model.config.text_config).to(dev)
    for m in mtp.modules():  # the trunk's init for the MTP layer's linears and norms
        model.model.language_model._init_weights(m)
    indexer = M.Qwen4ExpTextQSAIndexer
    reference_indexer = indexer.forward
    indexer.forward = full_selection_indexer(reference_indexer)
    assert args.seq_len <= text["indexer_budget"], "--seq-len must not pass indexer_budget (full_selection_indexer)"
    torch.backends.cuda.matmul.allow_tf32 = True
    params = [p for p in list(model.parameters()) + list(mtp.parameters()) if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    n_params = sum(p.numel() for p in model.parameters()) + sum(p.numel() for p in mtp.parameters())
    print(f"train_tiny: {n_params / 1e6:.2f} M parameters (trunk + MTP, vision stub included)", flush=True)

    # Early stopping: the held-out loss of the first windows (as long as a training sequence, so the fast indexer path)
    # every --eval-every steps; the best weights are kept on the host and saved.
    held_eval = tok.encode(held_out_text(valid)).ids[: 8 * args.seq_len]
    held_eval = torch.tensor(held_eval[: len(held_eval) // args.seq_len * args.seq_len]).view(-1, args.seq_len)

    @torch.no_grad()
    def held_loss():
        model.eval()
        loss = float(model(input_ids=held_eval.to(dev), labels=held_eval.to(dev), use_cache=False).loss)
        model.train()
        return loss

    best = (float("inf"), 0, None)
    model.train()
    mtp.train()
    budget = args.minutes * 60.0
    t0 = time.time()
    log = []
    step = 0
    warmup = 100
    for ids in batches(docs, args.seq_len, args.batch, rng):
        elapsed = time.time() - t0
        frac = max(elapsed / budget, step / args.max_steps if args.max_steps else 0.0)
        if frac >= 1.0:
            if args.eval_every and best[1] != step:  # the last weights are a candidate too
                h = held_loss()
                log.append(dict(step=step, heldout_loss=h))
                if h < best[0]:
                    best = (h, step, ({k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
                                      {k: v.detach().cpu().clone() for k, v in mtp.state_dict().items()}))
            break
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
        for g in opt.param_groups:
            g["lr"] = lr
        ids = ids.to(dev)
        loss, mtp_loss = forward_losses(model, mtp, ids)
        opt.zero_grad(set_to_none=True)
        (loss + args.mtp_weight * mtp_loss).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        evaluate = args.eval_every and (step % args.eval_every == 0 or step == 1)
        if evaluate or step % 25 == 0 or step == 1:
            rec = dict(step=step, seconds=round(elapsed, 1), lr=lr, loss=float(loss), mtp_loss=float(mtp_loss))
            if evaluate:
                rec["heldout_loss"] = held_loss()
            log.append(rec)
            print(f"train_tiny: {rec}", flush=True)
            if evaluate and rec["heldout_loss"] < best[0]:
                state = ({k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
                         {k: v.detach().cpu().clone() for k, v in mtp.state_dict().items()})
                best = (rec["heldout_loss"], step, state)
    tokens_seen = step * args.batch * args.seq_len
    print(f"train_tiny: {step} steps, {tokens_seen} tokens in {time.time() - t0:.0f} s", flush=True)
    if best[2] is not None:
        print(f"train_tiny: the weights of step {best[1]} (held-out loss {best[0]:.3f}) are saved", flush=True)
        model.load_state_dict(best[2][0])
        mtp.load_state_dict(best[2][1])

    # Save as a released checkpoint would be: bf16, mtp.* in its own shard, mtp_num_hidden_layers = 1.
    out = args.out
    os.makedirs(out, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out, max_shard_size="20MB")
    save_mtp_shard(out, mtp)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(args.tokenizer, f), os.path.join(out, f))
    gen = {"eos_token_id": [im_end, endoftext], "pad_token_id": endoftext, "temperature": 0.7, "top_p": 0.9, "top_k": 40,
           "do_sample": True, "max_new_tokens": 128}
    json.dump(gen, open(os.path.join(out, "generation_config.json"), "w"), indent=2)
    with open(os.path.join(out, "heldout.txt"), "w", encoding="utf-8") as f:
        f.write(held_out_text(held))

    indexer.forward = reference_indexer
    ppl, scored, train_ppl, greedy_text = write_reference(out, tok, held, train, im_end, args)
    meta = dict(steps=step, saved_step=best[1] if best[2] is not None else step, tokens_seen=tokens_seen, seq_len=args.seq_len, batch=args.batch, lr=args.lr,
                mtp_weight=args.mtp_weight, minutes=args.minutes, parameters=n_params, cookies=len(cookies),
                heldout_cookies=len(held), train_tokens_per_pass=sum(map(len, docs)), torch=torch.__version__,
                log=log)
    json.dump(meta, open(os.path.join(out, "train_log.json"), "w"), indent=1)
    print(f"train_tiny: held-out perplexity {ppl:.3f} over {scored} tokens (train text {train_ppl:.3f})")
    print(f"train_tiny: greedy answer to 'Tell me a joke about GPUs.': {greedy_text!r}")


if __name__ == "__main__":
    main()
