"""Checks `flashnext serve --speculative` on a device (stdlib only, for the GPU machine, which has no pip): the same
24 concurrent completions against a server without and one with speculation, token ids compared. A third of them
are greedy and a third seeded-sampled without anything the device sampler lacks (with --device cuda they sample on
the GPU: the verify rows' per-row device draws), a third greedy with logit_bias on a few tokens (host sampling;
their output repeats, so prompt-lookup drafts are accepted). Prints the spec_decode metrics and RESULT OK / MISMATCH;
exits 1 on a mismatch.

  python3 tools/check_spec_serve.py BIN MODEL_DIR [SPEC (default ngram:4)] [DEVICE (default cuda)] [serve args...]
"""
import concurrent.futures as cf, json, os, re, subprocess, sys, threading, time, urllib.error, urllib.request

BIN, MODEL = sys.argv[1], sys.argv[2]
SPEC = sys.argv[3] if len(sys.argv) > 3 else "ngram:4"
DEVICE = sys.argv[4] if len(sys.argv) > 4 else "cuda"
EXTRA = sys.argv[5:]

def start(*args):
    p = subprocess.Popen([BIN, "serve", "--device", DEVICE, "--model", MODEL, "--port", "0", "--max-model-len", "1024",
                          "--served-model-name", "tiny", *EXTRA, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    port = [None]; log = []
    ev = threading.Event()
    def rd():
        for line in p.stdout:
            log.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m: port[0] = int(m.group(1)); ev.set()
        ev.set()
    threading.Thread(target=rd, daemon=True).start()
    ev.wait(300)
    if port[0] is None: print("".join(log[-30:])); sys.exit(1)
    return p, f"http://127.0.0.1:{port[0]}", log

def post(url, body):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            out = json.loads(r.read())["choices"][0]
    except urllib.error.HTTPError as e:
        sys.exit(f"{url}: HTTP {e.code}: {e.read().decode()[:500]}")
    return [int(t.split(":")[1]) for t in out["logprobs"]["tokens"]]

def metrics(url):
    with urllib.request.urlopen(url + "/metrics") as r:
        return {l.rsplit(" ", 1)[0]: float(l.rsplit(" ", 1)[1]) for l in r.read().decode().splitlines() if l and not l.startswith("#")}

CONFIG = json.load(open(os.path.join(MODEL, "config.json")))
V = int(CONFIG.get("text_config", CONFIG).get("vocab_size", 151936))
def prompt(i):
    n = 3 + (i * 41) % 290
    head = [(1000 + 7919 * (i + 1) * (k + 3)) % V for k in range(8)]
    return [head[(k * 5 + k // 8) % 8] if k % 3 else (500 + 31 * k * (i + 1)) % V for k in range(n)]

reqs = []
for i in range(24):
    b = {"model": "tiny", "prompt": prompt(i), "max_tokens": 8 + (i * 13) % 40, "logprobs": 0, "return_tokens_as_token_ids": True, "ignore_eos": True}
    kind = i % 3
    if kind == 0: b["temperature"] = 0                                    # device greedy
    if kind == 1: b.update(temperature=0.8, top_p=0.95, seed=7 + i)       # device seeded
    if kind == 2: b.update(temperature=0, logit_bias={str((100 + 97 * (i + j)) % V): 40 for j in range(1 + i % 4)})  # host
    reqs.append(b)

res = {}
for name, args in (("plain", ()), ("spec", ("--speculative", SPEC))):
    p, url, log = start(*args)
    try:
        with cf.ThreadPoolExecutor(24) as pool:
            res[name] = list(pool.map(lambda b: post(url, b), reqs))
        time.sleep(0.5)
        res[name + "_metrics"] = {k: v for k, v in metrics(url).items() if "spec_decode" in k and k.startswith("flashnext")}
    finally:
        p.terminate(); p.wait(30)
bad = [i for i in range(24) if res["plain"][i] != res["spec"][i]]
print("kinds of mismatches (0 greedy dev, 1 seeded dev, 2 host biased):", [(i, i % 3) for i in bad])
print("spec metrics:", res["spec_metrics"])
print("RESULT", "OK" if not bad else "MISMATCH", SPEC, DEVICE)
sys.exit(1 if bad else 0)
