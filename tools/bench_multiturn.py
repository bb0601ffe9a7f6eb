#!/usr/bin/env python3
"""Multi-turn chat benchmark for an OpenAI-compatible server (`flashnext serve`, vLLM, SGLang): time to first
token (TTFT) of each turn of a conversation whose history grows, the measure that prefix caching improves (turn N
re-sends turns 1..N-1). Standard library only.

Each conversation: a system message, then --turns user messages of --user-words seeded random words each; after
each user message the assistant's streamed reply (--output-len tokens, greedy, ignore_eos) is appended to the
history. Conversations run one after another (concurrency 1), so TTFT is the prefill of the turn's prompt.
  TTFT          = first chunk with content - request sent
  prompt_tokens, cached_tokens = the last chunk's usage (stream_options.include_usage;
                  usage.prompt_tokens_details.cached_tokens, 0 without a prefix cache)

  python3 tools/bench_multiturn.py --url http://127.0.0.1:8000 --conversations 4 --turns 8
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import time
from urllib.parse import urlparse

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu river stone cloud paper glass light "
         "north south east west green blue amber silver copper iron maple cedar").split()


def chat_turn(url: str, model: str, messages: list[dict], output_len: int, api_key: str | None) -> dict:
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
    body = {"model": model, "messages": messages, "max_tokens": output_len, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=headers)
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    ttft, text, usage = None, [], {}
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            raise RuntimeError(chunk["error"]["message"])
        if chunk.get("usage"):
            usage = chunk["usage"]
        for ch in chunk.get("choices", []):
            piece = ch.get("delta", {}).get("content") or ""
            if piece:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                text.append(piece)
    conn.close()
    details = usage.get("prompt_tokens_details") or {}
    return {"ttft": ttft if ttft is not None else float("nan"), "text": "".join(text),
            "prompt_tokens": usage.get("prompt_tokens", 0), "cached_tokens": details.get("cached_tokens", 0)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None, help="model name (default: the first of /v1/models)")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--user-words", type=int, default=120, help="words per user message")
    ap.add_argument("--output-len", type=int, default=32, help="tokens per assistant reply")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON object per turn instead of a table")
    args = ap.parse_args()
    model = args.model
    if model is None:
        u = urlparse(args.url)
        conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=60)
        conn.request("GET", "/v1/models")
        model = json.loads(conn.getresponse().read())["data"][0]["id"]
    rng = random.Random(args.seed)
    per_turn: list[list[dict]] = [[] for _ in range(args.turns)]
    for c in range(args.conversations):
        messages = [{"role": "system", "content": f"Conversation {c}: answer briefly."}]
        for t in range(args.turns):
            messages.append({"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(args.user_words))})
            r = chat_turn(args.url, model, messages, args.output_len, args.api_key)
            messages.append({"role": "assistant", "content": r["text"]})
            per_turn[t].append(r)
    if not args.json:
        print(f"{'turn':>4} {'prompt tok':>10} {'cached tok':>10} {'TTFT median ms':>15} {'TTFT mean ms':>13}")
    for t, rs in enumerate(per_turn):
        row = {"turn": t + 1,
               "prompt_tokens": statistics.mean(r["prompt_tokens"] for r in rs),
               "cached_tokens": statistics.mean(r["cached_tokens"] for r in rs),
               "ttft_median_ms": 1000 * statistics.median(r["ttft"] for r in rs),
               "ttft_mean_ms": 1000 * statistics.mean(r["ttft"] for r in rs)}
        if args.json:
            print(json.dumps(row))
        else:
            print(f"{row['turn']:>4} {row['prompt_tokens']:>10.0f} {row['cached_tokens']:>10.0f} "
                  f"{row['ttft_median_ms']:>15.1f} {row['ttft_mean_ms']:>13.1f}")


if __name__ == "__main__":
    main()
