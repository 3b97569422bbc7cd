"""serve --deterministic: 200 seeded requests, each sent alone and then beside 63 others, give the
same text every time (torch-compiled on the CPU, its rows computed row-local, through the real
server and its continuous scheduler)."""

import random
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.serve.conftest import start_server, stop_server

httpx = pytest.importorskip("httpx", reason="the [serve] extra is not installed")

REQUESTS, CLIENTS = 200, 64


def seeded_requests(model: str) -> list[dict]:
    """Token-id prompts of 1 to 40 tokens, 24 new tokens drawn at t 0.9 with top_p 0.95 or 1.0, each its own seed."""
    rng = random.Random(0)
    return [{"model": model, "prompt": [rng.randrange(50000) for _ in range(rng.randint(1, 40))], "max_tokens": 24,
             "temperature": 0.9, "top_p": 0.95 if i % 2 else 1.0, "seed": i} for i in range(REQUESTS)]


def test_seeded_requests_give_the_same_text_alone_and_beside_63_others(exported_run, tmp_path):
    _, run, _ = exported_run
    proc, url = start_server(run, tmp_path / "deterministic.log", "--deterministic", "--max-rows", str(CLIENTS),
                             pick=("--backend", "torch-compiled", "--precision", "fp32"))
    requests = seeded_requests(run.root.name)
    with (httpx.Client(base_url=url, timeout=300, limits=httpx.Limits(max_connections=CLIENTS)) as client,
          httpx.Client(base_url=url, timeout=30) as watcher):
        def text(body: dict) -> str:
            reply = client.post("/v1/completions", json=body)
            assert reply.status_code == 200, reply.text
            return reply.json()["choices"][0]["text"]

        def running() -> float:
            time.sleep(0.1)
            lines = watcher.get("/metrics").text.splitlines()
            return float(next(line for line in lines if line.startswith("gpt2deploy_requests_running")).split()[-1])

        alone = [text(body) for body in requests]
        with ThreadPoolExecutor(CLIENTS) as pool:  # 64 in flight: every request joins rows of others
            replies = pool.map(text, requests)
            seen = [running() for _ in range(20)]
            together = list(replies)
    assert stop_server(proc) == 0
    assert sum(a == b for a, b in zip(alone, together)) == REQUESTS
    assert len(set(alone)) > REQUESTS // 2  # the draws differ between seeds: the texts are not all one
    assert max(seen) > CLIENTS // 2  # and they did run together
