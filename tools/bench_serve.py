#!/usr/bin/env python3
"""Load generator for an OpenAI-compatible server (`flashnext serve`, vLLM, SGLang): streaming /v1/completions
requests from C concurrent clients, reporting throughput, time to first token (TTFT), inter-token latency (ITL) and
end-to-end latency percentiles, in the spirit of vLLM's `benchmark_serving.py` (standard library only).

Each request: a prompt of --input-len random token ids (seeded, distinct per request), --output-len generated
tokens (ignore_eos, so every request generates exactly that many), greedy, no logprobs. Generated tokens are
counted from the usage of the last chunk (stream_options.include_usage).
  TTFT  = first chunk with text - request sent
  ITL   = gap between consecutive chunks with text (as vLLM's benchmark measures it; a token whose text is an
          incomplete UTF-8 character sends no chunk, so its gap is merged with the next one)
  E2E   = last byte - request sent
  output throughput = all generated tokens / wall time of the run (first request sent to last finished)

  python3 tools/bench_serve.py --url http://127.0.0.1:8000 --concurrency 1 8 32 --num-requests 64
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import threading
import time
from urllib.parse import urlparse


def percentile(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def one_request(url, model: str, prompt: list[int], output_len: int, api_key: str | None) -> dict:
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
    body = {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers=headers)
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    ttft, last, itl, tokens = None, None, [], 0
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            raise RuntimeError(chunk["error"]["message"])
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        choices = chunk.get("choices") or []
        if not choices or not choices[0].get("text"):
            continue
        now = time.perf_counter()
        if ttft is None:
            ttft = now - t0
        else:
            itl.append(now - last)
        last = now
    end = time.perf_counter()
    conn.close()
    return {"ttft": ttft, "itl": itl, "e2e": end - t0, "tokens": tokens, "start": t0, "end": end}


def run_level(args, concurrency: int) -> dict:
    rng = random.Random(args.seed * 1000 + concurrency)
    lo = min(1000, args.vocab_size // 4)
    prompts = [[rng.randrange(lo, args.vocab_size) for _ in range(args.input_len)] for _ in range(args.num_requests)]
    results, errors, lock = [], [], threading.Lock()
    it = iter(prompts)

    def worker():
        while True:
            with lock:
                prompt = next(it, None)
            if prompt is None:
                return
            try:
                r = one_request(args.url, args.model, prompt, args.output_len, args.api_key)
                with lock:
                    results.append(r)
            except Exception as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(str(e))

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"concurrency {concurrency}: {len(errors)} requests failed, first: {errors[0]}")
    ttft = [r["ttft"] * 1e3 for r in results]
    itl = [x * 1e3 for r in results for x in r["itl"]]
    e2e = [r["e2e"] * 1e3 for r in results]
    out_tokens = sum(r["tokens"] for r in results)
    return {
        "concurrency": concurrency, "requests": len(results), "input_len": args.input_len,
        "output_len": args.output_len, "wall_s": wall, "output_tok_s": out_tokens / wall,
        "total_tok_s": (out_tokens + args.input_len * len(results)) / wall, "req_s": len(results) / wall,
        "ttft_ms_p50": percentile(ttft, 50), "ttft_ms_p99": percentile(ttft, 99),
        "itl_ms_p50": percentile(itl, 50), "itl_ms_p99": percentile(itl, 99),
        "e2e_ms_p50": percentile(e2e, 50), "e2e_ms_mean": statistics.fmean(e2e),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None, help="model name (default: the first of /v1/models)")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--num-requests", type=int, default=64, help="requests per concurrency level")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab-size", type=int, default=150000,
                    help="prompt ids are drawn from [min(1000, vocab/4), vocab) (default 150000, for Qwen vocabularies)")
    ap.add_argument("--json", action="store_true", help="print one JSON object per level instead of a table")
    args = ap.parse_args()
    if args.model is None:
        u = urlparse(args.url)
        conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=30)
        conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {args.api_key}"} if args.api_key else {})
        args.model = json.loads(conn.getresponse().read())["data"][0]["id"]
    # Warm-up (first-touch allocations, caches), not measured.
    one_request(args.url, args.model, [1000] * args.input_len, 4, args.api_key)
    rows = [run_level(args, c) for c in args.concurrency]
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return
    print(f"model {args.model}, {args.num_requests} requests per level, input {args.input_len} tokens, "
          f"output {args.output_len} tokens (greedy, ignore_eos)")
    print("| concurrency | output tok/s | total tok/s | req/s | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | E2E p50 (ms) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['concurrency']} | {r['output_tok_s']:.1f} | {r['total_tok_s']:.1f} | {r['req_s']:.2f} | "
              f"{r['ttft_ms_p50']:.1f} / {r['ttft_ms_p99']:.1f} | {r['itl_ms_p50']:.2f} / {r['itl_ms_p99']:.2f} | "
              f"{r['e2e_ms_p50']:.0f} |")


if __name__ == "__main__":
    main()
