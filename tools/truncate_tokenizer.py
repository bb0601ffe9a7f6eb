#!/usr/bin/env python3
"""Cuts a byte-level BPE tokenizer down to its first N ids, for fixtures with a small vocabulary (the `medium`
fixture has vocab_size 4096) that still need a tokenizer to be served.

Keeps the vocabulary entries with id < N and the merges whose result is among them (in a Qwen tokenizer.json the
ids after the 256 byte tokens follow the merge order, so these are the first N - 256 merges), drops the added
tokens above N, and copies tokenizer_config.json without added_tokens_decoder entries at or above N. The result
tokenizes any text (the byte tokens cover every input) with ids < N.

With --keep-added, the added tokens (<|im_start|>, <|im_end|>, <think>, ...) are kept instead, renumbered in their
order to the top ids [N - k, N), and the vocabulary keeps ids < N - k: a small vocabulary that still renders and
parses the chat template (the trained bundled model, tools/train_tiny.py).

  python3 tools/truncate_tokenizer.py models/tiny-b-random OUT_DIR 4096 [--keep-added]
"""
import json
import os
import sys


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--keep-added"]
    keep_added = len(args) != len(sys.argv) - 1
    if len(args) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    src, out, n = args[0], args[1], int(args[2])
    with open(os.path.join(src, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    model = tok["model"]
    if model.get("type") != "BPE":
        raise SystemExit(f"{src}/tokenizer.json: model type {model.get('type')}, expected BPE")
    renumber = {}  # old id -> new id of the kept added tokens
    if keep_added:
        added = sorted(tok.get("added_tokens", []), key=lambda t: t["id"])
        renumber = {t["id"]: n - len(added) + i for i, t in enumerate(added)}
        for t in added:
            t["id"] = renumber[t["id"]]
        tok["added_tokens"] = added
    limit = n - len(renumber)
    vocab = {s: i for s, i in model["vocab"].items() if i < limit}
    merges = []
    for m in model["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        if a in vocab and b in vocab and (a + b) in vocab:
            merges.append(m)
    model["vocab"] = vocab
    model["merges"] = merges
    if not keep_added:
        tok["added_tokens"] = [t for t in tok.get("added_tokens", []) if t["id"] < n]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    cfg_path = os.path.join(src, "tokenizer_config.json")
    if os.path.exists(cfg_path):
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
        if "added_tokens_decoder" in cfg:
            dec = cfg["added_tokens_decoder"]
            if keep_added:
                cfg["added_tokens_decoder"] = {str(renumber[int(k)]): v for k, v in dec.items() if int(k) in renumber}
            else:
                cfg["added_tokens_decoder"] = {k: v for k, v in dec.items() if int(k) < n}
        with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, ensure_ascii=False, indent=1)
    print(f"truncate_tokenizer: {len(vocab)} ids, {len(merges)} merges, {len(tok['added_tokens'])} added tokens -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
