"""vLLM parity of `flashnext serve` at the HTTP level: unknown request fields (ignored and logged once; 400 under
--strict-requests), CORS (--allowed-origins, --allowed-methods, --allowed-headers, --allow-credentials), X-Request-Id,
GET /version, usage.prompt_tokens_details, and the vllm:* Prometheus metrics beside flashnext's own."""

from __future__ import annotations

import json
import re
import socket
import time

import openai
import pytest
import requests

from conftest import Server

# ignore_eos: every request runs to max_tokens (finish_reason "length"), whatever the random weights pick.
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 6,
        "temperature": 0, "ignore_eos": True}
COMPLETION = {"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
GOOD = "https://good.example"
LOCAL = "http://localhost:3000"
EVIL = "https://evil.example"
GENERATED_ID = re.compile(r"^[0-9a-f]{32}$")


@pytest.fixture(scope="module")
def lenient():
    """Default request handling (unknown fields ignored), CORS for two origins given as a comma list."""
    s = Server("--max-model-len", "1024", "--served-model-name", "tiny", "--allowed-origins", f"{GOOD}, {LOCAL}")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def strict():
    s = Server("--max-model-len", "1024", "--served-model-name", "tiny", "--strict-requests")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def guarded():
    """An API key, CORS lists given as JSON (vLLM's syntax), listed methods and headers, credentials allowed."""
    s = Server("--max-model-len", "1024", "--served-model-name", "tiny", "--api-key", "sekrit",
               "--allowed-origins", json.dumps([GOOD]), "--allowed-methods", json.dumps(["GET", "POST"]),
               "--allowed-headers", json.dumps(["Authorization", "X-Request-Id"]), "--allow-credentials")
    yield s
    s.stop()


def post(server, path, body, headers=None):
    return requests.post(server.url + path, data=json.dumps(body), timeout=60,
                         headers={"Content-Type": "application/json", **(headers or {})})


def wait_for_log(server, predicate, timeout=10.0) -> list[str]:
    """The server's log lines that satisfy `predicate`, once there is at least one (the log arrives through a pipe
    read by another thread)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [line for line in list(server.log) if predicate(line)]
        if lines or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def log_so_far(server) -> list[str]:
    """Every line the server has logged until now: a marker request's line arrives after all of them."""
    marker = f"marker-{time.monotonic_ns()}"
    requests.get(server.url + "/health", headers={"X-Request-Id": marker}, timeout=30)
    assert wait_for_log(server, lambda line: f"request_id={marker}" in line), "the marker line never arrived"
    return list(server.log)


# ---- unknown request fields ----------------------------------------------------------------------------------------

def test_unknown_fields_are_ignored_with_the_same_output(lenient):
    extra = {"foo_unknown": {"nested": [1, 2]}, "guided_decoding_backend": "xgrammar", "priority": 0}
    for path, body, key in [("/v1/chat/completions", CHAT, lambda r: r["choices"][0]["message"]),
                            ("/v1/completions", COMPLETION, lambda r: r["choices"][0]["text"])]:
        plain = post(lenient, path, body)
        with_extra = post(lenient, path, {**body, **extra})
        assert plain.status_code == 200 and with_extra.status_code == 200, with_extra.text
        assert key(with_extra.json()) == key(plain.json())
        assert with_extra.json()["usage"] == plain.json()["usage"]
        if path == "/v1/chat/completions":
            plain_chat = plain.json()
    stream = {**COMPLETION, "stream": True, "stream_options": {"include_usage": True, "nested_unknown": 1}}
    r = post(lenient, "/v1/completions", stream)
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n"), r.text
    usage = json.loads(r.text.split("data: ")[-2])["usage"]
    assert usage["completion_tokens"] == 6
    rf = post(lenient, "/v1/chat/completions", {**CHAT, "response_format": {"type": "text", "rf_unknown": 1}})
    assert rf.status_code == 200 and rf.json()["choices"][0]["message"] == plain_chat["choices"][0]["message"]
    tok = post(lenient, "/tokenize", {"prompt": "hello world", "unknown_tok": True})
    assert tok.status_code == 200 and tok.json()["tokens"] == post(lenient, "/tokenize", {"prompt": "hello world"}).json()["tokens"]
    detok = post(lenient, "/detokenize", {"tokens": tok.json()["tokens"], "unknown_detok": 1})
    assert detok.status_code == 200 and detok.json()["prompt"] == "hello world"


def test_each_unknown_field_is_logged_once_with_its_request(lenient):
    for i in range(3):
        r = post(lenient, "/v1/chat/completions", {**CHAT, "max_tokens": 1, "logged_once_field": i},
                 headers={"X-Request-Id": f"unknown-field-{i}"})
        assert r.status_code == 200, r.text
    r = post(lenient, "/v1/completions", {**COMPLETION, "max_tokens": 1, "logged_once_field": 1,
                                          "stream": True, "stream_options": {"logged_nested": 1}})
    assert r.status_code == 200
    log = log_so_far(lenient)
    lines = [line for line in log if '"logged_once_field"' in line]
    assert len(lines) == 1, lines
    assert lines[0].endswith('[warning] POST /v1/chat/completions request_id=unknown-field-0: ignoring unknown '
                             'request field "logged_once_field" (logged once)'), lines
    nested = [line for line in log if 'ignoring unknown request field "stream_options.logged_nested"' in line]
    assert len(nested) == 1, nested


def test_a_huge_unknown_field_name_is_logged_as_an_excerpt(lenient):
    big = "q" * 300_000
    r = post(lenient, "/v1/completions", {**COMPLETION, "max_tokens": 1, big: 1})
    assert r.status_code == 200, r.text[:300]
    lines = wait_for_log(lenient, lambda line: "ignoring unknown request field \"qqqq" in line)
    assert len(lines) == 1 and len(lines[0]) < 400, [line[:300] for line in lines]


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {**CHAT, "temprature": 0.5}, "temprature"),
    ("/v1/completions", {**COMPLETION, "foo": 1}, "foo"),
    ("/v1/completions", {**COMPLETION, "stream": True, "stream_options": {"include_usage": True, "bar": 1}},
     "stream_options.bar"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "text", "bogus": 1}}, "response_format.bogus"),
    ("/tokenize", {"prompt": "x", "baz": 1}, "baz"),
    ("/detokenize", {"tokens": [1], "qux": 1}, "qux"),
])
def test_strict_requests_answer_400_naming_the_field(strict, path, body, param):
    r = post(strict, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and f'unknown field "{param}"' in err["message"], err
    assert post(strict, "/v1/completions", {**COMPLETION, "max_tokens": 1}).status_code == 200


def test_strict_requests_quote_a_huge_unknown_name_as_an_excerpt(strict):
    r = post(strict, "/v1/chat/completions", {**CHAT, "z" * 300_000: 1})
    assert r.status_code == 400 and len(r.content) < 1000
    assert "unknown field" in r.json()["error"]["message"]


# ---- CORS ----------------------------------------------------------------------------------------------------------

def preflight(server, origin, method="POST", headers=None, path="/v1/chat/completions"):
    h = {"Origin": origin, "Access-Control-Request-Method": method}
    if headers is not None:
        h["Access-Control-Request-Headers"] = headers
    return requests.options(server.url + path, headers=h, timeout=30)


def test_cors_is_off_by_default(server):
    r = post(server, "/v1/completions", {**COMPLETION, "max_tokens": 1}, headers={"Origin": GOOD})
    assert r.status_code == 200
    assert not [h for h in r.headers if h.lower().startswith("access-control-")], r.headers
    p = preflight(server, GOOD)  # an OPTIONS request of a POST route: 405, as FastAPI (vLLM) without CORS answers it
    assert p.status_code == 405 and p.headers["Allow"] == "POST" and "Access-Control-Allow-Origin" not in p.headers


def test_preflight_for_an_allowed_origin(lenient):
    for origin in (GOOD, LOCAL):
        r = preflight(lenient, origin, headers="content-type, authorization")
        assert r.status_code == 200 and r.text == "OK"
        assert r.headers["Access-Control-Allow-Origin"] == origin
        assert r.headers["Vary"] == "Origin"
        assert r.headers["Access-Control-Allow-Methods"] == "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT"
        assert r.headers["Access-Control-Allow-Headers"] == "content-type, authorization"  # default "*": mirrored
        assert r.headers["Access-Control-Max-Age"] == "600"
        assert "Access-Control-Allow-Credentials" not in r.headers


def test_preflight_for_another_origin_is_refused(lenient):
    r = preflight(lenient, EVIL)
    assert r.status_code == 400
    assert "Access-Control-Allow-Origin" not in r.headers
    assert "disallowed CORS origin" in r.json()["error"]["message"]


def test_responses_to_an_allowed_origin_carry_cors_headers(lenient):
    ok = post(lenient, "/v1/completions", {**COMPLETION, "max_tokens": 1}, headers={"Origin": GOOD})
    assert ok.status_code == 200
    assert ok.headers["Access-Control-Allow-Origin"] == GOOD and ok.headers["Vary"] == "Origin"
    stream = post(lenient, "/v1/chat/completions", {**CHAT, "stream": True}, headers={"Origin": LOCAL})
    assert stream.status_code == 200 and stream.headers["Content-Type"].startswith("text/event-stream")
    assert stream.headers["Access-Control-Allow-Origin"] == LOCAL
    errors = [
        post(lenient, "/v1/chat/completions", {**CHAT, "temperature": "hot"}, headers={"Origin": GOOD}),  # 400
        requests.get(lenient.url + "/no/such/route", headers={"Origin": GOOD}, timeout=30),  # 404
        requests.post(lenient.url + "/v1/completions", data="x", timeout=30,  # 415, kept with CORS on
                      headers={"Origin": GOOD, "Content-Type": "text/plain"}),
    ]
    assert [r.status_code for r in errors] == [400, 404, 415]
    for r in errors:
        assert r.headers["Access-Control-Allow-Origin"] == GOOD, (r.status_code, r.headers)
    for get in ("/health", "/v1/models", "/metrics", "/version"):
        assert requests.get(lenient.url + get, headers={"Origin": GOOD}, timeout=30).headers[
            "Access-Control-Allow-Origin"] == GOOD


def test_responses_to_other_origins_carry_none(lenient):
    for headers in ({"Origin": EVIL}, {}):
        r = post(lenient, "/v1/completions", {**COMPLETION, "max_tokens": 1}, headers=headers)
        assert r.status_code == 200  # answered (CORS is enforced by browsers), but not readable by that page
        assert not [h for h in r.headers if h.lower().startswith("access-control-")], r.headers


def test_preflight_needs_no_api_key_and_errors_name_the_origin(guarded):
    r = preflight(guarded, GOOD, headers="authorization, x-request-id")
    assert r.status_code == 200, r.text
    assert r.headers["Access-Control-Allow-Origin"] == GOOD
    assert r.headers["Access-Control-Allow-Credentials"] == "true"
    assert r.headers["Access-Control-Allow-Methods"] == "GET, POST"
    assert r.headers["Access-Control-Allow-Headers"] == \
        "Accept, Accept-Language, Authorization, Content-Language, Content-Type, X-Request-Id"
    assert preflight(guarded, GOOD, method="DELETE").status_code == 400
    bad_header = preflight(guarded, GOOD, headers="authorization, x-custom")
    assert bad_header.status_code == 400 and "disallowed CORS headers" in bad_header.json()["error"]["message"]
    unauthorized = post(guarded, "/v1/completions", {**COMPLETION, "max_tokens": 1}, headers={"Origin": GOOD})
    assert unauthorized.status_code == 401
    assert unauthorized.headers["Access-Control-Allow-Origin"] == GOOD
    assert unauthorized.headers["Access-Control-Allow-Credentials"] == "true"
    ok = post(guarded, "/v1/completions", {**COMPLETION, "max_tokens": 1},
              headers={"Origin": GOOD, "Authorization": "Bearer sekrit"})
    assert ok.status_code == 200 and ok.headers["Access-Control-Allow-Origin"] == GOOD


# ---- X-Request-Id --------------------------------------------------------------------------------------------------

def test_request_id_is_echoed(lenient):
    r = post(lenient, "/v1/chat/completions", CHAT, headers={"X-Request-Id": "client-id-1"})
    assert r.status_code == 200 and r.headers["X-Request-Id"] == "client-id-1"
    s = post(lenient, "/v1/completions", {**COMPLETION, "stream": True}, headers={"X-Request-Id": "client-id-2"})
    assert s.status_code == 200 and s.headers["X-Request-Id"] == "client-id-2"
    e = post(lenient, "/v1/completions", {**COMPLETION, "max_tokens": 0}, headers={"X-Request-Id": "client-id-3"})
    assert e.status_code == 400 and e.headers["X-Request-Id"] == "client-id-3"
    h = requests.get(lenient.url + "/health", headers={"X-Request-Id": "client-id-4"}, timeout=30)
    assert h.headers["X-Request-Id"] == "client-id-4"
    # The request's log lines name it and the client's address: the generation's summary line and an error's line.
    done = wait_for_log(lenient, lambda line: "127.0.0.1 POST /v1/chat/completions 200 chatcmpl-" in line
                        and "request_id=client-id-1:" in line)
    assert len(done) == 1 and "completion=6" in done[0], done
    assert wait_for_log(lenient, lambda line: "127.0.0.1 POST /v1/completions 400" in line
                        and "request_id=client-id-3:" in line
                        and "max_tokens" in line)
    assert wait_for_log(lenient, lambda line: "GET /health 200 request_id=client-id-4" in line)


def test_request_id_is_generated_when_absent_or_unusable(lenient):
    ids = []
    for headers in ({}, {}, {"X-Request-Id": "x" * 129}, {"X-Request-Id": "has space"}, {"X-Request-Id": ""}):
        r = post(lenient, "/v1/completions", {**COMPLETION, "max_tokens": 1}, headers=headers)
        assert r.status_code == 200
        ids.append(r.headers["X-Request-Id"])
    assert all(GENERATED_ID.match(i) for i in ids), ids
    assert len(set(ids)) == len(ids)
    assert post(lenient, "/v1/completions", {**COMPLETION, "max_tokens": 1},
                headers={"X-Request-Id": "x" * 128}).headers["X-Request-Id"] == "x" * 128
    # A request the server cannot parse gets one too.
    with socket.create_connection(("127.0.0.1", lenient.port), timeout=10) as sock:
        sock.sendall(b"\x00\xff" * 50 + b"\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                break
            head += chunk
    assert head.startswith(b"HTTP/1.1 400") and re.search(rb"\r\nX-Request-Id: [0-9a-f]{32}\r\n", head), head


# ---- /version, usage -----------------------------------------------------------------------------------------------

def test_version(lenient):
    r = requests.get(lenient.url + "/version", timeout=30)
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/json"
    body = r.json()
    assert list(body) == ["version"]
    # git describe of the build: a tag or abbreviated commit, maybe -dirty ("unknown" outside a git checkout).
    assert re.fullmatch(r"[0-9A-Za-z._+-]+", body["version"]), body


def test_usage_has_prompt_tokens_details(lenient):
    client = openai.OpenAI(base_url=lenient.v1, api_key="unused", max_retries=0, timeout=120)
    chat = client.chat.completions.create(model="tiny", messages=CHAT["messages"], max_tokens=3, temperature=0)
    comp = client.completions.create(model="tiny", prompt="hello", max_tokens=3, temperature=0)
    for usage in (chat.usage, comp.usage):
        assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == 0
    chunks = list(client.chat.completions.create(model="tiny", messages=CHAT["messages"], max_tokens=3, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 0
    chunks = list(client.completions.create(model="tiny", prompt="hello", max_tokens=3, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 0
    raw = post(lenient, "/v1/completions", {**COMPLETION, "max_tokens": 2}).json()["usage"]
    assert raw["prompt_tokens_details"] == {"cached_tokens": 0}


# ---- vllm:* metrics ------------------------------------------------------------------------------------------------

VLLM_METRICS = {
    "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge", "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prompt_tokens_total": "counter", "vllm:generation_tokens_total": "counter",
    "vllm:request_success_total": "counter", "vllm:num_preemptions_total": "counter",
    "vllm:time_to_first_token_seconds": "histogram", "vllm:inter_token_latency_seconds": "histogram",
    "vllm:time_per_output_token_seconds": "histogram", "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram", "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
}
MODEL = '{model_name="tiny",engine="0"}'


def scrape(server) -> tuple[dict[str, str], dict[str, float]]:
    """(# TYPE of each metric, {series: value})."""
    text = requests.get(server.url + "/metrics", timeout=30).text
    types, values = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
        elif line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            values[key] = float(value)
    return types, values


def histogram(values: dict[str, float], name: str, labels: str = "") -> dict:
    """{"sum", "count", "buckets": {le: count}} of a histogram; `labels`: those before le, as rendered."""
    inner = labels[1:-1] + "," if labels else ""
    buckets = {}
    for key, v in values.items():
        m = re.fullmatch(re.escape(name) + r"_bucket\{" + re.escape(inner) + r'le="([^"]+)"\}', key)
        if m:
            buckets[m.group(1)] = v
    return {"sum": values[f"{name}_sum{labels}"], "count": values[f"{name}_count{labels}"], "buckets": buckets}


def test_vllm_metrics_match_flashnext_metrics(lenient):
    lenient.wait_idle()
    _, before = scrape(lenient)
    client = openai.OpenAI(base_url=lenient.v1, api_key="unused", max_retries=0, timeout=120)
    usages = []
    for i in range(3):  # ignore_eos: every request runs to max_tokens ("length")
        r = client.completions.create(model="tiny", prompt=f"count to {i}", max_tokens=4 + i, temperature=0,
                                      extra_body={"ignore_eos": True})
        usages.append(r.usage)
    r = client.chat.completions.create(model="tiny", messages=CHAT["messages"], max_tokens=5, temperature=0,
                                       extra_body={"ignore_eos": True})
    usages.append(r.usage)
    chunks = list(client.chat.completions.create(model="tiny", messages=CHAT["messages"], max_tokens=7, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    usages.append(chunks[-1].usage)
    n = len(usages)
    prompt_sum = sum(u.prompt_tokens for u in usages)
    completion_sum = sum(u.completion_tokens for u in usages)
    assert completion_sum == 4 + 5 + 6 + 5 + 7
    lenient.wait_idle()
    types, after = scrape(lenient)

    for name, kind in VLLM_METRICS.items():
        assert types.get(name) == kind, (name, types.get(name))
        series = [k for k in after if k.startswith(name) and k[len(name):len(name) + 1] in ("{", "_")]
        assert series and all('model_name="tiny"' in k for k in series), (name, series)

    def delta(key):
        return after[key] - before.get(key, 0)

    # Counters: the same values as flashnext's, and what the responses reported.
    assert after["vllm:generation_tokens_total" + MODEL] == after["flashnext_generation_tokens_total"]
    assert after["vllm:prompt_tokens_total" + MODEL] == after["flashnext_prompt_tokens_total"]
    assert delta("vllm:generation_tokens_total" + MODEL) == completion_sum
    assert delta("vllm:prompt_tokens_total" + MODEL) == prompt_sum
    success = {r: after[f'vllm:request_success_total{{model_name="tiny",engine="0",finished_reason="{r}"}}']
               for r in ("stop", "length", "abort")}
    flashnext_requests = {k: v for k, v in after.items() if k.startswith("flashnext_requests_total{")}
    assert sum(success.values()) == sum(flashnext_requests.values())
    assert success["length"] == sum(v for k, v in flashnext_requests.items() if 'finish_reason="length"' in k)
    assert delta('vllm:request_success_total{model_name="tiny",engine="0",finished_reason="length"}') == n
    assert after["vllm:num_preemptions_total" + MODEL] == after["flashnext_num_preemptions_total"]
    # Gauges, idle.
    for v, f in [("vllm:num_requests_running", "flashnext_num_requests_running"),
                 ("vllm:num_requests_waiting", "flashnext_num_requests_waiting"),
                 ("vllm:kv_cache_usage_perc", "flashnext_kv_cache_usage_perc")]:
        assert after[v + MODEL] == after[f] == 0, v
    # Histograms: one source, two names (buckets, sums and counts identical).
    for v, f in [("vllm:time_to_first_token_seconds", "flashnext_time_to_first_token_seconds"),
                 ("vllm:inter_token_latency_seconds", "flashnext_inter_token_latency_seconds"),
                 ("vllm:time_per_output_token_seconds", "flashnext_inter_token_latency_seconds"),
                 ("vllm:e2e_request_latency_seconds", "flashnext_e2e_request_latency_seconds"),
                 ("vllm:request_queue_time_seconds", "flashnext_request_queue_time_seconds"),
                 ("vllm:request_prompt_tokens", "flashnext_request_prompt_tokens"),
                 ("vllm:request_generation_tokens", "flashnext_request_generation_tokens")]:
        hv, hf = histogram(after, v, MODEL), histogram(after, f)
        assert hv == hf and hv["buckets"]["+Inf"] == hv["count"], v
    # ... and their counts and sums are those of the requests just made.
    hb = {name: histogram(before, name, MODEL) if f"{name}_count{MODEL}" in before else {"sum": 0, "count": 0}
          for name in VLLM_METRICS if VLLM_METRICS[name] == "histogram"}

    def hdelta(name, what):
        return histogram(after, name, MODEL)[what] - hb[name][what]

    assert hdelta("vllm:time_to_first_token_seconds", "count") == n
    assert hdelta("vllm:e2e_request_latency_seconds", "count") == n
    assert hdelta("vllm:request_queue_time_seconds", "count") == n  # each admitted once
    assert hdelta("vllm:inter_token_latency_seconds", "count") == completion_sum - n  # between tokens of a request
    assert hdelta("vllm:request_prompt_tokens", "count") == n
    assert hdelta("vllm:request_prompt_tokens", "sum") == prompt_sum
    assert hdelta("vllm:request_generation_tokens", "count") == n
    assert hdelta("vllm:request_generation_tokens", "sum") == completion_sum
    # Token-count buckets are vLLM's 1, 2, 5, ... up to max_model_len (1024).
    assert list(histogram(after, "vllm:request_prompt_tokens", MODEL)["buckets"]) == \
        ["1", "2", "5", "10", "20", "50", "100", "200", "500", "1000", "+Inf"]
