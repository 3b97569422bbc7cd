"""SIGTERM drains: /ready turns false, new requests get 503, the request in flight runs to its end,
and the process exits 0."""

import json
import signal
import threading
import time

import pytest

from tests.serve.conftest import start_server

httpx = pytest.importorskip("httpx", reason="the [serve] extra is not installed")

DRAINING = {"prompt": ["The module"] * 16, "max_new_tokens": 200, "ignore_eos": True, "stream": True}


def test_sigterm_drains_in_flight_requests_and_exits_0(exported_run, tmp_path):
    _, run, _ = exported_run
    proc, url = start_server(run, tmp_path / "server.log")
    lines, started = [], threading.Event()

    def stream():
        with httpx.stream("POST", f"{url}/generate", json=DRAINING, timeout=60) as reply:
            for line in reply.iter_lines():
                if line:
                    lines.append(line)
                started.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert started.wait(30)
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    while httpx.get(f"{url}/ready", timeout=5).status_code != 503 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert httpx.get(f"{url}/ready", timeout=5).json() == {"ready": False, "reason": "draining"}
    refused = httpx.post(f"{url}/generate", json={"prompt": "hi", "max_new_tokens": 2}, timeout=10)
    assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
    assert reader.is_alive()  # the first request still runs
    reader.join(60)
    tokens = sum(len(row) for line in lines if line.startswith('data: {"tokens"')
                 for row in json.loads(line[6:])["tokens"])
    assert lines[-2:] == ["event: done", "data: {}"] and tokens == 16 * 200
    assert proc.wait(timeout=30) == 0, (tmp_path / "server.log").read_text()
