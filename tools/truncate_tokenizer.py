#!/usr/bin/env python3
"""Cuts a byte-level BPE tokenizer down to its first N ids, for fixtures with a small vocabulary (the `medium`
fixture has vocab_size 4096) that still need a tokenizer to be served.

Keeps the vocabulary entries with id < N and the merges whose result is among them (in a Qwen tokenizer.json the
ids after the 256 byte tokens follow the merge order, so these are the first N - 256 merges), drops the added
tokens above N, and copies tokenizer_config.json without added_tokens_decoder entries at or above N. The result
tokenizes any text (the byte tokens cover every input) with ids < N.

  python3 tools/truncate_tokenizer.py models/tiny-b-random OUT_DIR 4096
"""
import json
import os
import sys


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(os.path.join(src, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    model = tok["model"]
    if model.get("type") != "BPE":
        raise SystemExit(f"{src}/tokenizer.json: model type {model.get('type')}, expected BPE")
    vocab = {s: i for s, i in model["vocab"].items() if i < n}
    merges = []
    for m in model["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        if a in vocab and b in vocab and (a + b) in vocab:
            merges.append(m)
    model["vocab"] = vocab
    model["merges"] = merges
    tok["added_tokens"] = [t for t in tok.get("added_tokens", []) if t["id"] < n]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    cfg_path = os.path.join(src, "tokenizer_config.json")
    if os.path.exists(cfg_path):
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
        if "added_tokens_decoder" in cfg:
            cfg["added_tokens_decoder"] = {k: v for k, v in cfg["added_tokens_decoder"].items() if int(k) < n}
        with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, ensure_ascii=False, indent=1)
    print(f"truncate_tokenizer: {len(vocab)} ids, {len(merges)} merges, {len(tok['added_tokens'])} added tokens -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
