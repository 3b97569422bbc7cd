"""The HTTP service, as a client meets it: a real uvicorn server in its own process on a loopback
port, real requests, answers checked against the runtime called directly."""

import json
import socket
import subprocess
import sys
import time

import pytest
import torch

from pipeline.runtime.generate import Generator
from pipeline.runtime.loader import open_backend
from pipeline.runtime.sampling import Sampling
from pipeline.tokenizer import load_tokenizer
from tests.conftest import MICRO

httpx = pytest.importorskip("httpx", reason="the [serve] extra is not installed")
pytest.importorskip("fastapi", reason="the [serve] extra is not installed")
STARTUP_S = 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(exported_run):
    cfg, run, _ = exported_run
    port = _free_port()
    cmd = [sys.executable, "-m", "pipeline.cli", "serve", "--artifacts", str(run.root.parent), "--run", run.root.name,
           "--device", "cpu", "--backend", "ort", "--precision", "fp32", "--port", str(port), "--set", "model.n_positions=256"]
    for s in MICRO:
        cmd += ["--set", s]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited: {proc.stdout.read()}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("server did not answer /health in time")
    yield url, run
    proc.terminate()
    proc.wait(timeout=30)


def test_health_says_what_is_loaded(server):
    url, _ = server
    body = httpx.get(f"{url}/health").json()
    assert body == {"status": "ok", "backend": "ort", "precision": "fp32", "device": "cpu", "context": 256}


def test_generate_matches_the_runtime(server):
    url, run = server
    prompts = ["Return the number of", "This module"]
    reply = httpx.post(f"{url}/generate", json={"prompt": prompts, "max_new_tokens": 6}, timeout=60)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    tok = load_tokenizer(run.checkpoint)
    local = Generator(open_backend(run, "ort", "fp32", torch.device("cpu")), tok.eos_token_id).generate(
        [tok(p)["input_ids"] for p in prompts], Sampling(max_new_tokens=6, stop_tokens=(tok.eos_token_id,)))
    assert body["tokens"] == local
    assert body["completions"] == [tok.decode([t for t in row if t != tok.eos_token_id]) for row in local]
    assert body["usage"]["completion_tokens"] == sum(map(len, local))


def test_seeded_sampling_repeats(server):
    url, _ = server
    request = {"prompt": "The", "max_new_tokens": 5, "do_sample": True, "temperature": 0.9, "top_p": 0.9, "seed": 4}
    first, second = (httpx.post(f"{url}/generate", json=request, timeout=60).json() for _ in range(2))
    assert first["tokens"] == second["tokens"]


def test_stream_sends_one_event_per_step_then_done(server):
    url, _ = server
    with httpx.stream("POST", f"{url}/generate", json={"prompt": "Return", "max_new_tokens": 4, "stream": True},
                      timeout=60) as reply:
        assert reply.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in reply.iter_lines() if line]
    data = [json.loads(line[6:]) for line in lines if line.startswith("data: {\"tokens\"")]
    assert 1 <= len(data) <= 4 and all(len(d["tokens"]) == 1 for d in data)
    assert lines[-2:] == ["event: done", "data: {}"]


@pytest.mark.parametrize("request_body, status, message", [
    ({"prompt": ""}, 400, "prompt 0 is empty"),
    ({"prompt": "hi", "top_p": 1.5}, 400, "--top-p 1.5"),
    ({"prompt": "hi", "do_sample": True, "temperature": 0}, 400, "must be > 0 when sampling"),
    ({"prompt": "hi", "max_new_tokens": 5000}, 400, "exceeds the model's context of 256"),
    ({"prompt": "hi", "max_new_tokens": 0}, 422, "greater than or equal to 1"),
    ({"text": "hi"}, 422, "prompt"),
])
def test_bad_requests_get_a_clear_error(server, request_body, status, message):
    url, _ = server
    reply = httpx.post(f"{url}/generate", json=request_body, timeout=30)
    assert reply.status_code == status and message in reply.text
