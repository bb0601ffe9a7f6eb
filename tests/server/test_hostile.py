"""Hostile input against `flashnext serve` (issue 18): deep JSON nesting in every field, huge and slow bodies, slow
and stalled headers, HTTP/1.0, pipelining, overflowing numbers, wrong Content-Types, a full queue, and clients that
vanish with and without streaming. Every test asserts the status and error type, and then that the server still
answers /health at once and gives a greedy request the same output as before the attack.

All traffic is on 127.0.0.1; every socket has a timeout and every loop a bound in count and time.
"""

from __future__ import annotations

import json
import re
import select
import socket
import threading
import time

import pytest
import requests

from conftest import Server

MAX_BODY = 400_000  # --max-request-bytes of the server under test
READ_TIMEOUT = 6  # --read-timeout: the margin /health has beside the stalled connections on a loaded machine
BODY_TIMEOUT = 3  # --body-timeout
KEEP_ALIVE = 5  # the server's keep-alive timeout: after answering 400 to a stalled request it waits this long
DEPTH = 64  # the server's JSON nesting limit (the body object is level 1)
REFERENCE = {"model": "tiny", "prompt": "The reference prompt", "max_tokens": 8, "temperature": 0}
LONG = {"model": "tiny", "prompt": "go on", "max_tokens": 2000, "temperature": 0, "ignore_eos": True}
ABORTED = 'flashnext_requests_total{endpoint="completions",finish_reason="abort"}'


@pytest.fixture(scope="module")
def hs():
    # --strict-requests: unknown fields get 400 (whose message must quote only an excerpt of a huge field name).
    s = Server("--strict-requests", "--max-model-len", "2048", "--max-num-seqs", "2", "--max-queued-requests", "2",
               "--max-num-batched-tokens", "256", "--served-model-name", "tiny", "--http-threads", "24",
               "--max-request-bytes", str(MAX_BODY), "--read-timeout", str(READ_TIMEOUT),
               "--body-timeout", str(BODY_TIMEOUT))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def reference(hs):
    """The greedy output of REFERENCE before any attack."""
    r = requests.post(hs.url + "/v1/completions", json=REFERENCE, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def assert_silent(sock: socket.socket):
    """The server has neither answered nor closed sock: the worker that reads it is still waiting on it."""
    timeout = sock.gettimeout()
    sock.setblocking(False)
    try:
        data = sock.recv(1, socket.MSG_PEEK)
        raise AssertionError("the server answered or closed a held connection: %r" % data)
    except BlockingIOError:
        pass
    finally:
        sock.settimeout(timeout)


def assert_healthy(server, reference, held=()):
    """/health answers and a greedy request gives the reference output. Connections in held must still be open and
    unanswered after /health answered, which shows /health was served beside them, not after they timed out (a logical
    check instead of a wall-clock bound, which a loaded CI machine breaks)."""
    assert requests.get(server.url + "/health", timeout=5).status_code == 200
    for s in held:
        assert_silent(s)
    r = requests.post(server.url + "/v1/completions", json=REFERENCE, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == reference


def assert_error(r, status, needle, error_type="invalid_request_error"):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["type"] == error_type, err
    assert needle in err["message"], err
    assert len(err["message"]) < 400, "an error message quoted the request"
    return err


def post_raw(server, path, data, content_type="application/json", timeout=30):
    return requests.post(server.url + path, data=data, headers={"Content-Type": content_type}, timeout=timeout)


def connect(server, timeout=10) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=timeout)


def read_response(sock: socket.socket, deadline_s=15.0, pending: bytearray | None = None) -> tuple[int, dict, bytes]:
    """Reads one HTTP response (Content-Length, chunked, or until close) within deadline_s. With `pending`, the bytes
    read past the response (those of the next pipelined one) are kept there, and it is read from first."""
    end = time.monotonic() + deadline_s
    buf = bytes(pending) if pending is not None else b""

    def more():
        nonlocal buf
        assert time.monotonic() < end, "response timed out"
        chunk = sock.recv(65536)
        buf += chunk
        return bool(chunk)

    def done(status, headers, body, rest):
        if pending is not None:
            pending[:] = rest
        return status, headers, body

    while b"\r\n\r\n" not in buf:
        assert more(), f"closed before the headers: {buf!r}"
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    buf = rest
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(buf) < n:
            assert more(), "closed inside the body"
        return done(status, headers, buf[:n], buf[n:])
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            while b"\r\n" not in buf:
                assert more(), "closed inside a chunk"
            size_line, buf = buf.split(b"\r\n", 1)
            size = int(size_line, 16)
            while len(buf) < size + 2:
                assert more(), "closed inside a chunk"
            body, buf = body + buf[:size], buf[size + 2:]
            if size == 0:
                return done(status, headers, body, buf)
    while more():  # delimited by close
        pass
    return done(status, headers, buf, b"")


def nest(n: int, kind: str = "[") -> str:
    if kind == "[":
        return "[" * n + "]" * n
    return '{"a":' * n + "1" + "}" * n


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
CHAT_FIELDS = ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
               "n", "stop", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
               "user", "stop_token_ids", "ignore_eos", "include_stop_str_in_output", "skip_special_tokens", "echo",
               "logprobs", "top_logprobs", "return_tokens_as_token_ids", "stream", "stream_options", "tools",
               "tool_choice", "parallel_tool_calls", "response_format", "chat_template_kwargs",
               "add_generation_prompt", "continue_final_message", "reasoning_effort", "metadata", "store",
               "service_tier"]
ENDPOINT_FIELDS = [("/v1/chat/completions", f, CHAT) for f in CHAT_FIELDS] + \
    [("/v1/completions", f, {"model": "tiny", "prompt": "hi", "max_tokens": 2})
     for f in ["prompt", "max_tokens", "temperature", "stop", "logprobs", "best_of", "suffix", "echo"]] + \
    [("/tokenize", f, {"prompt": "hi"}) for f in ["prompt", "messages", "tools", "chat_template_kwargs",
                                                  "add_generation_prompt", "return_token_strs"]] + \
    [("/detokenize", "tokens", {"tokens": [1]})]


def body_text(base: dict, field: str, value_text: str) -> str:
    """`base` with `field` set to the JSON text `value_text` (which json.dumps could not write at this depth)."""
    rest = {k: v for k, v in base.items() if k != field}
    head = json.dumps(rest)[:-1]
    return head + (", " if rest else "") + json.dumps(field) + ": " + value_text + "}"


def test_nesting_at_and_past_the_limit_in_every_field(hs, reference):
    for path, field, base in ENDPOINT_FIELDS:
        drop = {k: v for k, v in base.items() if k not in ("prompt", "messages", "tokens") or k == field}
        base_ = drop if field in ("prompt", "messages", "tokens") else base
        if path == "/tokenize" and field == "messages":
            base_ = {}
        # At the limit: parsed, then a 400 for the wrong type (its message quotes a short excerpt only).
        at = post_raw(hs, path, body_text(base_, field, nest(DEPTH - 1)))
        assert at.status_code == 400, (path, field, at.text)
        assert at.json()["error"]["type"] == "invalid_request_error"
        assert len(at.json()["error"]["message"]) < 400, (path, field)
        assert "deeper than" not in at.text
        # Past it, and the 60,000 levels (120 KB) that crashed the server, in arrays and objects.
        for value in (nest(DEPTH), nest(60000), nest(30000, "{")):
            assert_error(post_raw(hs, path, body_text(base_, field, value)), 400, f"deeper than {DEPTH} levels")
    # Never closed, and inside a tool call's arguments text.
    assert_error(post_raw(hs, "/tokenize", '{"prompt": ' + "[" * 100000), 400, "deeper than")
    args = {"model": "tiny", "max_tokens": 1, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": '{"x": ' + nest(50000) + "}"}}]}]}
    assert_error(post_raw(hs, "/v1/chat/completions", json.dumps(args)), 400, "deeper than")
    assert_healthy(hs, reference)


def test_prompts_too_long_in_bytes_are_refused_before_tokenizing():
    """A text of more bytes than max_model_len tokens can hold (here 64 tokens, a body limit of 4 MB) gets the byte
    check's 400 on every route that tokenizes text, before the tokenizer spends time on it; the server still serves."""
    s = Server("--max-model-len", "64", "--max-num-seqs", "1", "--served-model-name", "tiny",
               "--max-request-bytes", "4000000")
    try:
        long_text = "word " * 600_000  # 3 MB
        for path, body in (("/v1/completions", {"prompt": long_text, "max_tokens": 1}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": long_text}]}),
                           ("/tokenize", {"prompt": long_text}),
                           ("/tokenize", {"messages": [{"role": "user", "content": long_text}]})):
            err = assert_error(requests.post(s.url + path, json={"model": "tiny", **body}, timeout=60), 400,
                               "maximum context length")
            assert re.search(r"the prompt is \d+ bytes, more than 64 tokens", err["message"]), (path, err)
        assert requests.get(s.url + "/health", timeout=5).status_code == 200
        r = requests.post(s.url + "/tokenize", json={"model": "tiny", "prompt": "word " * 10}, timeout=30)
        assert r.status_code == 200 and r.json()["count"] > 0
    finally:
        s.stop()


@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                                   "repetition_penalty", "max_tokens", "top_k", "seed", "n", "logprobs"])
def test_overflowing_numbers(hs, reference, field):
    # The same fields through the three generation APIs (the Responses API names two of them differently and has
    # no n, logprobs or min_p-style extras under other names: those go as they are, and must get 400 as well).
    responses_name = {"max_tokens": "max_output_tokens", "logprobs": "top_logprobs"}
    bases = (("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2}, field),
             ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                       "max_tokens": 2}, field),
             ("/v1/responses", {"model": "tiny", "input": "hi", "max_output_tokens": 16},
              responses_name.get(field, field)))
    for path, base, name in bases:
        for text in ("1e309", "-1e309", "1" * 400):
            r = post_raw(hs, path, body_text({k: v for k, v in base.items() if k != name}, name, text))
            assert r.status_code == 400, (path, name, text, r.text)
            assert r.json()["error"]["type"] == "invalid_request_error", (path, name, r.text)
    assert_healthy(hs, reference)


def test_integer_limits_are_checked_without_wrapping(hs, reference):
    base = {"model": "tiny", "prompt": "hi"}
    assert_error(requests.post(hs.url + "/v1/completions", json={**base, "max_tokens": 2 ** 63}, timeout=30), 400,
                 "max_tokens must be <= 9223372036854775807, got 9223372036854775808")
    assert_error(requests.post(hs.url + "/v1/completions", json={**base, "max_tokens": 2 ** 64 - 1}, timeout=30),
                 400, "got 18446744073709551615")
    # 2^63 - 1 fits an int64, and prompt + max_tokens is compared without overflowing: a 400, not a long run.
    t = time.monotonic()
    err = assert_error(requests.post(hs.url + "/v1/completions", json={**base, "max_tokens": 2 ** 63 - 1},
                                     timeout=30), 400, "maximum context length is 2048 tokens")
    assert "9223372036854775808 tokens were requested" in err["message"]
    assert time.monotonic() - t < 2
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    for field in ("max_tokens", "max_completion_tokens"):
        assert_error(requests.post(hs.url + "/v1/chat/completions", json={**chat, field: 2 ** 63 - 1}, timeout=30),
                     400, "maximum context length")
    assert_error(requests.post(hs.url + "/detokenize", json={"tokens": [2 ** 64 - 1]}, timeout=30), 400,
                 "18446744073709551615 is outside")
    assert_error(requests.post(hs.url + "/v1/completions", json={**base, "prompt": [2 ** 63]}, timeout=30), 400,
                 "9223372036854775808")
    assert_healthy(hs, reference)


def test_huge_bodies_are_refused_before_they_are_read(hs, reference):
    # A declared Content-Length over the limit: 413 at once, without sending the body.
    with connect(hs) as s:
        s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 50000000\r\n\r\n")
        t = time.monotonic()
        status, headers, body = read_response(s, 5)
        assert status == 413 and time.monotonic() - t < 2
        assert headers.get("connection") == "close"
        err = json.loads(body)["error"]
        assert err["type"] == "invalid_request_error" and "--max-request-bytes" in err["message"]
    # The same through a normal client (which may see the connection closed while it still sends).
    try:
        r = post_raw(hs, "/tokenize", b'{"prompt": "' + b"a" * (MAX_BODY + 10) + b'"}')
        assert_error(r, 413, "--max-request-bytes")
    except requests.ConnectionError:
        pass
    # Chunked, with no length announced: refused as soon as it passes the limit (bounded sending).
    with connect(hs) as s:
        s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        piece = b"a" * 65536
        sent = 0
        try:
            while sent < 4 * MAX_BODY:
                s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
                sent += len(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            status, _, body = read_response(s, 5)
            assert status == 413, body
            assert json.loads(body)["error"]["type"] == "invalid_request_error"
        except (ConnectionResetError, BrokenPipeError):
            pass  # the reset can overtake the answer; the server must still be fine:
    # A body within the limit but too long to be a prompt: 400 before any generation.
    t = time.monotonic()
    assert_error(requests.post(hs.url + "/v1/completions", json={"prompt": "word " * 70000, "max_tokens": 1},
                               timeout=30), 400, "maximum context length")
    assert time.monotonic() - t < 10
    assert_healthy(hs, reference)


def test_slow_body_gets_408_and_does_not_block_others(hs, reference):
    body = json.dumps({"prompt": "x" * 50}).encode()
    with connect(hs) as s:
        s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body))
        t = time.monotonic()
        status = None
        for i in range(len(body)):  # a byte every 0.4 s: under the read timeout, never the whole body in time
            try:
                s.sendall(body[i:i + 1])
            except (BrokenPipeError, ConnectionResetError):
                break
            if i == 2:
                assert_healthy(hs, reference)  # others are served meanwhile
            s.settimeout(0.4)
            try:
                if s.recv(1, socket.MSG_PEEK):
                    break
            except socket.timeout:
                pass
            assert time.monotonic() - t < BODY_TIMEOUT + 6
        s.settimeout(10)
        status, _, out = read_response(s, 5)
        assert status == 408, out
        assert json.loads(out)["error"]["type"] == "invalid_request_error"
        assert time.monotonic() - t < BODY_TIMEOUT + 3
    assert_healthy(hs, reference)


def test_stalled_headers_and_bodies_are_closed_after_the_read_timeout(hs, reference):
    socks = []
    try:
        for i in range(12):  # half as many as the worker threads (waiting for their request, they hold none)
            s = connect(hs)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" if i % 2 else
                      b"POST /tokenize HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
            socks.append(s)
        assert_healthy(hs, reference, held=socks)  # while they hold their workers
        t = time.monotonic()
        bound = READ_TIMEOUT + KEEP_ALIVE + 3
        for s in socks:
            s.settimeout(bound)
            try:
                while s.recv(65536):  # the server closes it (a 400 answer may come first)
                    assert time.monotonic() - t < bound
            except ConnectionResetError:
                pass
        assert time.monotonic() - t < bound
    finally:
        for s in socks:
            s.close()
    assert_healthy(hs, reference)


def test_status_types_content_type_and_length(hs, reference):
    assert_error(post_raw(hs, "/v1/completions", json.dumps(REFERENCE), "text/plain"), 415, "application/json")
    assert_error(post_raw(hs, "/tokenize", "prompt=hi", "application/x-www-form-urlencoded"), 415,
                 "application/json")
    assert_error(post_raw(hs, "/tokenize", json.dumps({"prompt": "hi"}), "multipart/form-data; boundary=x"), 415,
                 "application/json")
    ok = post_raw(hs, "/tokenize", json.dumps({"prompt": "hi"}), "Application/JSON; charset=utf-8")
    assert ok.status_code == 200
    assert_error(requests.get(hs.url + "/v1/models?" + "a" * 9000, timeout=10), 414, "request line")
    with connect(hs) as s:  # a POST with neither Content-Length nor chunked encoding
        s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\r\n")
        status, _, body = read_response(s, 5)
        assert status == 411 and json.loads(body)["error"]["type"] == "invalid_request_error"
    assert_healthy(hs, reference)


def test_http10_gets_no_chunked_encoding(hs, reference):
    body = json.dumps(REFERENCE).encode()
    for stream in (False, True):
        data = json.dumps({**REFERENCE, "stream": stream}).encode() if stream else body
        with connect(hs) as s:
            s.sendall(b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
            status, headers, out = read_response(s, 30)
        assert status == 200
        assert "transfer-encoding" not in headers and headers.get("connection") == "close"
        if stream:
            events = [ln[6:] for ln in out.decode().split("\n") if ln.startswith("data: ")]
            assert events[-1] == "[DONE]"
            text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1] if json.loads(e)["choices"])
        else:
            text = json.loads(out)["choices"][0]["text"]
        assert text == reference
    # HTTP/1.0 GET and error answers are plain too.
    with connect(hs) as s:
        s.sendall(b"GET /health HTTP/1.0\r\n\r\n")
        status, headers, _ = read_response(s, 5)
        assert status == 200 and "transfer-encoding" not in headers
    # HTTP/1.0 with keep-alive asked for: answered with a length and kept open for the next request.
    with connect(hs) as s:
        for _ in range(2):
            s.sendall(b"GET /version HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            status, headers, out = read_response(s, 5)
            assert status == 200 and "transfer-encoding" not in headers and "version" in json.loads(out)
            assert headers.get("connection", "").lower() == "keep-alive"
    assert_healthy(hs, reference)


def test_keep_alive_serves_sequential_requests(hs, reference):
    with connect(hs) as s:
        for _ in range(3):
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, _ = read_response(s, 5)
            assert status == 200 and headers.get("connection") != "close"
        # A client's "Connection: close" is honoured: answered, then closed.
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status, headers, _ = read_response(s, 5)
        assert status == 200 and headers.get("connection") == "close"
        s.settimeout(5)
        assert s.recv(1) == b""
    assert_healthy(hs, reference)


def test_pipelined_requests_are_answered_in_order(hs, reference):
    body = json.dumps({"prompt": "pipelined"}).encode()
    post = (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(body), body))
    health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    version = b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n"
    for batch, expect in (([health, version], ["health", "version"]),
                          ([version, post, health], ["version", "tokenize", "health"])):
        with connect(hs) as s:
            s.sendall(b"".join(batch))  # two, then three requests in one send on one keep-alive connection
            got, pending = [], bytearray()
            for _ in batch:
                status, headers, out = read_response(s, 15, pending)
                assert status == 200, out
                assert headers.get("connection") != "close"
                if not out:
                    got.append("health")
                elif "version" in json.loads(out):
                    got.append("version")
                else:
                    assert json.loads(out)["tokens"], out
                    got.append("tokenize")
            assert got == expect
            assert not pending
            s.sendall(health)  # the connection still serves
            assert read_response(s, 10)[0] == 200
    assert_healthy(hs, reference)


def _wait(cond, timeout=20.0, what=lambda: ""):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out " + what()
        time.sleep(0.05)


def _load(server) -> tuple[int, int]:
    m = server.metrics()
    return int(m["flashnext_num_requests_running"]), int(m["flashnext_num_requests_waiting"])


def _open_long_request(server, stream: bool) -> socket.socket:
    data = json.dumps({**LONG, "stream": stream}).encode()
    s = connect(server)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    return s


@pytest.mark.parametrize("stream", [False, True])
def test_vanished_clients_free_their_slots_and_the_queue_answers_503(hs, reference, stream):
    before = hs.metrics().get(ABORTED, 0)
    socks = []
    try:
        for k in range(4):  # 2 running + 2 waiting: the queue is full
            socks.append(_open_long_request(hs, stream))
            # Each one admitted (or queued) before the next is sent: a request still waiting for a slot that
            # the engine has not given it yet would make the 4th find the queue full.
            want = (min(k + 1, 2), max(0, k - 1))
            _wait(lambda: _load(hs) == want, what=lambda: f"for request {k + 1}: (running, waiting) = {_load(hs)}")
        assert hs.metrics()["flashnext_num_requests_waiting"] == 2
        r = requests.post(hs.url + "/v1/completions", json=REFERENCE, timeout=30)
        err = assert_error(r, 503, "queue is full", "server_overloaded_error")
        assert r.headers.get("Retry-After") == "1", err
        t = time.monotonic()
    finally:
        for s in socks:
            s.shutdown(socket.SHUT_RDWR)
            s.close()
    # Each of the 2000-token requests (4 to 6 s) is cancelled within a few heartbeats of its client leaving: they end
    # as aborts (a request run to its end counts as "length"), well before they could have finished.
    m = hs.wait_idle(15)
    assert time.monotonic() - t < 8, m
    assert m["flashnext_num_requests_running"] == 0 and m["flashnext_num_requests_waiting"] == 0
    assert m['flashnext_kv_cache_blocks{state="used"}'] == 0 and m['flashnext_state_slots{state="used"}'] == 0
    # Each HTTP thread counts its abort when it lets go of the response, which may come just after the engine is idle.
    _wait(lambda: hs.metrics().get(ABORTED, 0) >= before + 4, 10)
    assert hs.metrics()[ABORTED] == before + 4
    assert_healthy(hs, reference)


def test_non_streaming_answer_is_valid_json_after_heartbeats(hs, reference):
    # A request that runs past several heartbeats: the leading whitespace keeps the body valid JSON.
    body = {**LONG, "max_tokens": 600}
    r = requests.post(hs.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] == 600
    assert_healthy(hs, reference)


def test_error_messages_quote_only_excerpts(hs, reference):
    big = "z" * 300_000
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    cases = [("/v1/chat/completions", {**chat, "model": big}, 404, "does not exist"),
             ("/v1/chat/completions", {**chat, big: 1}, 400, "unknown field"),
             ("/v1/chat/completions", {**chat, "messages": [{"role": big, "content": "x"}]}, 400, "must be one of"),
             ("/v1/chat/completions", {**chat, "tool_choice": big}, 400, "tool_choice must be"),
             ("/v1/chat/completions", {**chat, "messages": [{"role": "user", "content": [{"type": big}]}]}, 400,
              "not supported"),
             ("/tokenize", {"prompt": "x", "model": big}, 404, "does not exist"),
             ("/v1/completions", {"model": "tiny", "prompt": "x", "stop": [big, 5]}, 400, "must be a string")]
    for path, body, status, needle in cases:
        r = requests.post(hs.url + path, json=body, timeout=30)
        err = assert_error(r, status, needle,  # asserts a message under 400 characters
                           "not_found_error" if status == 404 else "invalid_request_error")
        assert len(r.content) < 1000 and len(err.get("param") or "") <= 200
    with connect(hs) as s:  # a garbage request line
        s.sendall(b"\x00\xff" * 2000 + b"\r\n\r\n")
        status, _, body = read_response(s, 10)
        assert status == 400 and json.loads(body)["error"]["type"] == "invalid_request_error"
    assert_healthy(hs, reference)


# ---- Slow headers and connection floods (a server with few worker threads and a small connection cap) ----------

SLOW_THREADS = 4  # --http-threads
SLOW_CAP = 16  # --max-connections
HEADER_TIMEOUT = 8  # --header-timeout: the margin /health has beside the trickling connections on a loaded machine
SLOW_READ_TIMEOUT = 3  # --read-timeout: a byte every ~0.5-1 s beats it, so only the header deadline closes them


@pytest.fixture(scope="module")
def slow():
    s = Server("--max-model-len", "512", "--max-num-seqs", "2", "--served-model-name", "tiny",
               "--http-threads", str(SLOW_THREADS), "--max-connections", str(SLOW_CAP),
               "--header-timeout", str(HEADER_TIMEOUT), "--read-timeout", str(SLOW_READ_TIMEOUT))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def slow_reference(slow):
    r = requests.post(slow.url + "/v1/completions", json=REFERENCE, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


class Trickler:
    """Sends one more header byte on each of its sockets every `period` s from a thread (bounded by `limit` s), so
    that no read timeout can close them: only the header deadline can."""

    def __init__(self, socks, period=0.5, limit=60.0):
        self.socks, self.period, self.limit = socks, period, limit
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        end = time.monotonic() + self.limit
        while not self.stop.wait(self.period) and time.monotonic() < end:
            for s in list(self.socks):
                try:
                    s.send(b"a")
                except OSError:  # closed by the server (after its 408) or by the test
                    pass

    def close(self):
        self.stop.set()
        self.thread.join(10)


def open_trickling(server, n):
    socks = []
    for _ in range(n):
        s = connect(server)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: ")  # a header that never ends
        socks.append(s)
    return socks


def test_header_trickle_is_closed_at_the_header_deadline(slow, slow_reference):
    with connect(slow) as s:
        t = time.monotonic()
        s.sendall(b"G")
        answered = closed = False
        sent = 1
        while time.monotonic() - t < HEADER_TIMEOUT + 10:
            if sent == 3:  # /health and a generation are served beside it, which is still open and unanswered
                assert_healthy(slow, slow_reference, held=[s])
            s.settimeout(1.0)
            try:
                if s.recv(1, socket.MSG_PEEK):
                    answered = True
                    break
            except socket.timeout:
                pass
            except ConnectionResetError:
                closed = True
                break
            try:  # one header byte a second: well within the 3 s read timeout, so only the deadline ends it
                s.send((b"ET /health HTTP/1.1\r\nX-Slow: " + b"a" * 100)[sent - 1:sent])
                sent += 1
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
        elapsed = time.monotonic() - t
        assert answered or closed, f"still open after {elapsed:.1f} s of trickling"
        assert elapsed >= HEADER_TIMEOUT - 0.5, f"closed after {elapsed:.1f} s, before the header deadline"
        assert elapsed < HEADER_TIMEOUT + 10
        if answered:
            s.settimeout(10)
            status, headers, body = read_response(s, 10)
            assert status == 408 and headers.get("connection") == "close", body
            err = json.loads(body)["error"]
            assert err["type"] == "invalid_request_error" and "--header-timeout" in err["message"], err
    assert_healthy(slow, slow_reference)


def test_header_flood_beyond_the_worker_threads_leaves_health_answering(slow, slow_reference):
    socks = open_trickling(slow, 3 * SLOW_THREADS)  # three times the worker threads, all in their headers
    trickler = Trickler(socks)
    try:
        # Answered while every flooding connection is still open and unanswered: they hold no worker thread.
        assert_healthy(slow, slow_reference, held=socks)
        for _ in range(3):
            assert requests.get(slow.url + "/health", timeout=5).status_code == 200
        for s in socks:
            assert_silent(s)
    finally:
        trickler.close()
        for s in socks:
            s.close()
    assert_healthy(slow, slow_reference)


def test_connections_over_the_cap_get_503(slow, slow_reference):
    extra = 3
    socks = open_trickling(slow, SLOW_CAP + extra)
    trickler = Trickler(socks)
    try:
        # The connections over the cap are answered at once; those within it stay open, waiting for their headers
        # (the deadline is HEADER_TIMEOUT s away).
        ready = set()
        end = time.monotonic() + 5
        while len(ready) < extra and time.monotonic() < end:
            readable, _, _ = select.select([s for s in socks if s not in ready], [], [], 0.5)
            ready.update(readable)
        assert extra <= len(ready) <= extra + 2, len(ready)  # +2: connections of earlier tests still closing
        for s in ready:
            s.settimeout(5)
            status, headers, body = read_response(s, 5)
            assert status == 503 and headers.get("retry-after") == "1" and headers.get("connection") == "close"
            err = json.loads(body)["error"]
            assert err["type"] == "server_overloaded_error" and "--max-connections" in err["message"], err
        for s in socks:
            if s not in ready:
                assert_silent(s)
    finally:
        trickler.close()
        for s in socks:
            s.close()
    # Once they are closed, the server answers again.
    _wait(lambda: requests.get(slow.url + "/health", timeout=5).status_code == 200, 15)
    assert_healthy(slow, slow_reference)
