"""Fixtures for the `flashnext serve` tests: start the server on a free loopback port with given options, wait
until it answers /health, give its base URL, and stop it (SIGTERM, then SIGKILL) when the test module ends.

The binary is $FLASHNEXT_BIN (default: build/flashnext of the source tree). The model is the bundled
models/tiny-b-random (random weights: the text is gibberish, but greedy output is deterministic).
$FLASHNEXT_TEST_SERVE_ARGS (e.g. "--tp 2") is added to every server's options, except where a test sets --tp itself:
scripts/test.sh runs the serving tests again with the model split over two tensor-parallel ranks.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("FLASHNEXT_BIN", ROOT / "build" / "flashnext"))
BUNDLED = ROOT / "models" / "tiny-b-random"
QWEN38_TEMPLATE = ROOT / "tests" / "data" / "tokenizers" / "qwen3.8" / "chat_template.jinja"


class Server:
    """One `flashnext serve` process."""

    def __init__(self, *args: str, model: Path = BUNDLED, env: dict | None = None, host: str = "127.0.0.1"):
        if not BIN.exists():
            pytest.fail(f"{BIN} does not exist: build the flashnext target or set FLASHNEXT_BIN")
        extra = shlex.split(os.environ.get("FLASHNEXT_TEST_SERVE_ARGS", ""))
        if "--tp" in args:
            extra = []
        cmd = [str(BIN), "serve", "--model", str(model), "--host", host, "--port", "0", *args, *extra]
        self.log: list[str] = []
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **(env or {})})
        port_found = threading.Event()
        self.port = None

        def reader():
            for line in self.proc.stdout:
                self.log.append(line.rstrip("\n"))
                m = re.search(r"listening on http://\S+:(\d+)", line)
                if m and self.port is None:
                    self.port = int(m.group(1))
                    port_found.set()
            port_found.set()

        self.reader = threading.Thread(target=reader, daemon=True)
        self.reader.start()
        if not port_found.wait(120) or self.port is None:
            self.stop()
            pytest.fail("the server did not start:\n" + "\n".join(self.log[-30:]))
        self.url = f"http://{host}:{self.port}"
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.1)
        self.stop()
        pytest.fail("the server never answered /health:\n" + "\n".join(self.log[-30:]))

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def metrics(self) -> dict[str, float]:
        """The /metrics samples as {name{labels}: value}."""
        text = requests.get(self.url + "/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out

    def wait_idle(self, timeout: float = 30) -> dict[str, float]:
        """Waits until no request runs or waits and no KV block or state slot is held; returns the metrics."""
        deadline = time.time() + timeout
        while True:
            m = self.metrics()
            idle = (m["flashnext_num_requests_running"] == 0 and m["flashnext_num_requests_waiting"] == 0
                    and m['flashnext_kv_cache_blocks{state="used"}'] == 0
                    and m['flashnext_state_slots{state="used"}'] == 0)
            if idle or time.time() > deadline:
                return m
            time.sleep(0.05)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(5)


@pytest.fixture(scope="module")
def server():
    """The bundled model with a small step budget, so that prefill chunking and mixed steps happen."""
    s = Server("--max-model-len", "1024", "--max-num-seqs", "32", "--max-num-batched-tokens", "256",
               "--served-model-name", "tiny")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def qwen38_model_dir():
    """The bundled model with the Qwen3.8 chat template (thinking opened by the generation prompt, Qwen3-Coder XML
    tool calls): a folder of links to the bundled files plus chat_template.jinja, which takes precedence."""
    d = Path(tempfile.mkdtemp(prefix="flashnext-qwen38-"))
    for f in BUNDLED.iterdir():
        (d / f.name).symlink_to(f)
    shutil.copy(QWEN38_TEMPLATE, d / "chat_template.jinja")
    yield d
    shutil.rmtree(d)
