"""Speculative decoding in `flashnext serve --speculative ngram:4`: 24 concurrent greedy requests (some opted out,
different prompt lengths, chunked prefill, streamed and not) give the token ids of a server without speculation;
stop strings end them alike; the spec_decode metrics move and agree with each other; request-level settings the
server cannot honour get 400 naming the field."""

from __future__ import annotations

import concurrent.futures as cf
import json

import openai
import pytest
import requests

from conftest import Server

ARGS = ("--max-model-len", "1024", "--max-num-seqs", "32", "--max-num-batched-tokens", "256",
        "--served-model-name", "tiny")


@pytest.fixture(scope="module")
def plain():
    s = Server(*ARGS)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def spec():
    s = Server(*ARGS, "--speculative", "ngram:4")
    yield s
    s.stop()


def make_prompt(i: int) -> list[int]:
    # 3 to ~290 tokens (some longer than the 256-token step: chunked prefill), with repeated pieces for prompt lookup.
    n = 3 + (i * 41) % 290
    head = [(1000 + 7919 * (i + 1) * (k + 3)) % 150000 for k in range(8)]
    return [head[(k * 5 + k // 8) % 8] if k % 3 else (500 + 31 * k * (i + 1)) % 150000 for k in range(n)]


def completion(server, prompt, max_tokens, extra=None, stream=False):
    body = {"model": "tiny", "prompt": prompt, "temperature": 0, "max_tokens": max_tokens, "logprobs": 0,
            "return_tokens_as_token_ids": True, "ignore_eos": True, "stream": stream, **(extra or {})}
    r = requests.post(server.v1 + "/completions", json=body, timeout=300, stream=stream)
    assert r.status_code == 200, r.text
    if not stream:
        out = r.json()["choices"][0]
        return [int(t.split(":")[1]) for t in out["logprobs"]["tokens"]], out["text"], out["finish_reason"]
    ids, text, finish = [], "", None
    for line in r.iter_lines():
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for c in chunk["choices"]:
            ids += [int(t.split(":")[1]) for t in (c.get("logprobs") or {}).get("tokens", [])]
            text += c["text"]
            finish = c.get("finish_reason") or finish
    return ids, text, finish


def test_concurrent_greedy_requests_match_the_server_without_speculation(plain, spec):
    n = 24
    prompts = [make_prompt(i) for i in range(n)]
    max_tokens = [8 + (i * 13) % 40 for i in range(n)]
    # Every fifth opts out, every seventh drafts at most 2, every third streams. The random-weight model never
    # repeats itself, so prompt lookup would find nothing to draft: half the requests bias the choice to a few
    # tokens (logit_bias; still the model's argmax among them), whose output then repeats: drafts are accepted and
    # rejected.
    extras = [{"speculative": False} if i % 5 == 0 else {"num_speculative_tokens": 2} if i % 7 == 0 else {}
              for i in range(n)]
    bias = [{"logit_bias": {str(100 + 97 * (i + j) % 1000): 40 for j in range(1 + i % 4)}} if i % 2 else {}
            for i in range(n)]
    streams = [i % 3 == 0 for i in range(n)]
    with cf.ThreadPoolExecutor(n) as pool:
        want = list(pool.map(lambda i: completion(plain, prompts[i], max_tokens[i], bias[i]), range(n)))
    before = spec.metrics()
    with cf.ThreadPoolExecutor(n) as pool:
        got = list(
            pool.map(lambda i: completion(spec, prompts[i], max_tokens[i], {**extras[i], **bias[i]}, streams[i]),
                     range(n)))
    for i in range(n):
        assert len(want[i][0]) == max_tokens[i]
        assert got[i] == want[i], f"request {i} (prompt {len(prompts[i])} tokens, {extras[i]})"
    m = spec.wait_idle()
    d = {k: m[k] - before.get(k, 0) for k in m if k.startswith("flashnext_spec_decode_") and "_total" in k}
    steps, drafted = d["flashnext_spec_decode_num_drafts_total"], d["flashnext_spec_decode_num_draft_tokens_total"]
    accepted, emitted = d["flashnext_spec_decode_num_accepted_tokens_total"], d[
        "flashnext_spec_decode_num_emitted_tokens_total"]
    assert steps > 0 and drafted >= steps and 0 < accepted < drafted
    assert d["flashnext_spec_decode_num_rollbacks_total"] > 0
    # Nothing cut a verify (max_tokens bounds the drafts, EOS ignored): one token per verify plus the accepted ones,
    # all of them among the tokens generated.
    assert emitted == steps + accepted
    assert emitted <= sum(max_tokens)
    assert d["flashnext_spec_decode_num_rollbacks_total"] <= steps
    per_pos = sum(v for k, v in d.items() if k.startswith("flashnext_spec_decode_num_accepted_tokens_per_pos_total"))
    assert per_pos == accepted
    total = m["flashnext_spec_decode_num_accepted_tokens_total"], m["flashnext_spec_decode_num_drafts_total"]
    assert m["flashnext_spec_decode_mean_accepted_length"] == pytest.approx(1 + total[0] / total[1])
    labels = '{model_name="tiny",engine="0"}'
    assert m["vllm:spec_decode_num_drafts_total" + labels] == m["flashnext_spec_decode_num_drafts_total"]
    assert m["vllm:spec_decode_num_accepted_tokens_total" + labels] == total[0]
    # The server without speculation reports zeros.
    assert plain.metrics()["flashnext_spec_decode_num_drafts_total"] == 0


def late_stop(text: str) -> str:
    """The substring of 3 to 6 characters (not blank) whose first occurrence in `text` is the latest."""
    best = (-1, "")
    for n in range(3, 7):
        for k in range(len(text) - n):
            sub = text[k:k + n]
            if sub.strip() and text.find(sub) == k and k > best[0]:
                best = (k, sub)
    return best[1]


def test_stop_strings_end_speculative_output_as_without_it(plain, spec):
    # Biased to three tokens (see above), so that the output repeats and verifies accept drafts before the stop
    # string, which is chosen to appear late.
    accepted_before_stop = 0
    for i in (8, 11, 12, 14):
        prompt = make_prompt(i)
        bias = {"logit_bias": {str(100 + 97 * (i + j) % 1000): 40 for j in range(3)}}
        ids, text, _ = completion(plain, prompt, 40, bias)
        stop = late_stop(text)
        want = completion(plain, prompt, 40, {"stop": [stop], **bias})
        assert want[2] == "stop" and len(want[0]) < len(ids) and stop not in want[1]
        before = spec.metrics()["flashnext_spec_decode_num_accepted_tokens_total"]
        assert completion(spec, prompt, 40, {"stop": [stop], **bias}) == want
        accepted_before_stop += spec.metrics()["flashnext_spec_decode_num_accepted_tokens_total"] > before
        assert completion(spec, prompt, 40, {"stop": [stop], **bias}, stream=True)[1:] == want[1:]
    assert accepted_before_stop >= 2


def test_chat_with_speculation_equals_chat_without(plain, spec):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "abc abc abc abc abc"}], "temperature": 0,
            "max_tokens": 30, "ignore_eos": True}
    a = requests.post(plain.v1 + "/chat/completions", json=body, timeout=300).json()
    b = requests.post(spec.v1 + "/chat/completions", json=body, timeout=300).json()
    assert b["choices"][0]["message"] == a["choices"][0]["message"]
    assert b["usage"] == a["usage"]


def error(server, extra):
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2, **extra}
    r = requests.post(server.v1 + "/completions", json=body, timeout=60)
    return r.status_code, r.json().get("error", {})


def test_request_settings_the_server_cannot_honour_are_400(plain, spec):
    status, e = error(spec, {"num_speculative_tokens": 5})
    assert status == 400 and e["param"] == "num_speculative_tokens"
    assert "more than this server drafts per step (--speculative ngram:4)" in e["message"]
    status, e = error(plain, {"num_speculative_tokens": 2})
    assert status == 400 and e["param"] == "num_speculative_tokens" and "runs without it" in e["message"]
    status, e = error(plain, {"speculative": True})
    assert status == 400 and e["param"] == "speculative" and "runs without it" in e["message"]
    status, e = error(spec, {"speculative": False, "num_speculative_tokens": 3})
    assert status == 400 and e["param"] == "num_speculative_tokens"
    status, e = error(spec, {"speculative": "yes"})
    assert status == 400 and e["param"] == "speculative"
    status, e = error(spec, {"num_speculative_tokens": -1})
    assert status == 400 and e["param"] == "num_speculative_tokens"
    # What every server can honour: opting out, and at most K drafts.
    assert error(plain, {"speculative": False})[0] == 200
    assert error(plain, {"num_speculative_tokens": 0})[0] == 200
    assert error(spec, {"num_speculative_tokens": 4, "speculative": True})[0] == 200
    client = openai.OpenAI(base_url=spec.v1, api_key="unused", max_retries=0, timeout=60)
    r = client.completions.create(model="tiny", prompt="hi", max_tokens=3, temperature=0,
                                  extra_body={"speculative": False})
    assert r.usage.completion_tokens <= 3


def test_mtp_drafts_over_two_nodes_keep_the_greedy_ids_and_acceptance():
    """`serve --speculative mtp:2 --tp 2 --nnodes 2` on the bundled trained model (its MTP layer drafts; issue 21):
    the greedy token ids of a server in one process without speculation, with drafts accepted. The counts are not
    one process's: over several nodes a rollback feeds the accepted tokens again (Model::replays_state), one process
    replays them and speculates again at once, so their verify steps fall on different positions."""
    import socket
    import subprocess

    from conftest import BIN, ROOT

    model = ROOT / "models" / "tiny-fortunes"
    prompts = ["Tell me a joke about GPUs.", "Say something wise.", "Tell me something about love."]

    def run(server):
        ids = []
        for p in prompts:
            body = {"model": "tiny", "messages": [{"role": "user", "content": p}], "temperature": 0,
                    "max_tokens": 40, "logprobs": True, "return_tokens_as_token_ids": True}
            r = requests.post(server.v1 + "/chat/completions", json=body, timeout=300)
            assert r.status_code == 200, r.text
            ids.append([int(t["token"].split(":")[1]) for t in r.json()["choices"][0]["logprobs"]["content"]])
        m = server.metrics()
        return ids, (m.get("flashnext_spec_decode_num_draft_tokens_total", 0),
                     m.get("flashnext_spec_decode_num_accepted_tokens_total", 0))

    args = ("--max-model-len", "512", "--served-model-name", "tiny")
    plain = Server(*args, model=model)
    try:
        want, _ = run(plain)
    finally:
        plain.stop()
    one = Server(*args, "--tp", "2", "--speculative", "mtp:2", model=model)
    try:
        got_one, counts_one = run(one)
    finally:
        one.stop()
    assert got_one == want
    assert counts_one[1] > 0, counts_one  # the trained MTP layer's drafts are accepted
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    nodes = ["--tp", "2", "--nnodes", "2", "--master-port", port, "--speculative", "mtp:2"]
    follower = subprocess.Popen([str(BIN), "serve", "--model", str(model), *nodes, "--node-rank", "1"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        leader = Server(*args, *nodes, model=model)
        try:
            got, counts = run(leader)
        finally:
            leader.stop()
        assert got == want
        assert 0 < counts[1] <= counts[0], counts  # drafts over the nodes are accepted too
        out, _ = follower.communicate(timeout=30)
        assert follower.returncode == 0, out
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait(20)
