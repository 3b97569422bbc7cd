"""`gpt2-deploy loadtest URL`: what clients of a running `serve` measure. Streaming clients send
requests back to back (closed loop, `--concurrency`), or requests arrive at a Poisson rate (open
loop, `--rate`); time to first token, inter-token latency and end-to-end latency are measured at the
client, per request, and the throughput is the generated tokens the clients received per second.

Each concurrency (or rate) of a sweep runs for `--duration` seconds after `--warmup` seconds that
are not counted; requests in flight at the end run to completion and count towards latency only."""

from __future__ import annotations

import asyncio
import io
import random
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from pipeline.errors import UserError
from pipeline.progress import console

EVENT = 'data: {"tokens"'


@dataclass
class LoadSettings:
    url: str
    concurrency: list[int] = field(default_factory=lambda: [1, 8, 64])
    rate: float | None = None  # requests per second (open loop) instead of concurrency
    prompt_tokens: int = 128
    max_tokens: int = 128
    spread: float = 0.0  # prompt and output lengths uniform in [n(1 - spread), n(1 + spread)]
    ignore_eos: bool = True  # every request generates its full length
    duration_s: float = 15.0
    warmup_s: float = 2.0
    seed: int = 0


@dataclass
class Sample:
    ttft: float
    itls: list[float]
    e2e: float
    tokens: int


@dataclass
class Run:
    """What one load level recorded: arrival times of every token, finished requests, errors."""
    arrivals: list[float] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


def prompt_texts(count: int, tokens: int, spread: float, rng: random.Random) -> list[str]:
    """Held-out-like text of about `tokens` GPT-2 tokens each, cut from the embedded corpus."""
    from pipeline.data import embedded_corpus
    from pipeline.tokenizer import embedded_gpt2_tokenizer

    tokenizer = embedded_gpt2_tokenizer()
    ids = []
    for doc in embedded_corpus():
        ids += tokenizer(doc)["input_ids"]
        if len(ids) > 4 * tokens * (1 + spread) + 64:
            break
    texts = []
    for _ in range(count):
        n = lengths(tokens, spread, rng)
        start = rng.randrange(0, len(ids) - n)
        texts.append(tokenizer.decode(ids[start:start + n]))
    return texts


def lengths(n: int, spread: float, rng: random.Random) -> int:
    return max(1, round(n * (1 + spread * (2 * rng.random() - 1))))


async def one_request(client, settings: LoadSettings, prompt: str, rng: random.Random, run: Run) -> None:
    body = {"prompt": prompt, "max_new_tokens": lengths(settings.max_tokens, settings.spread, rng), "stream": True,
            "ignore_eos": settings.ignore_eos}
    started, marks = time.perf_counter(), []
    try:
        async with client.stream("POST", f"{settings.url}/generate", json=body) as reply:
            if reply.status_code != 200:
                await reply.aread()
                run.error(f"HTTP {reply.status_code}")
                return
            async for line in reply.aiter_lines():
                if line.startswith(EVENT):
                    marks.append(time.perf_counter())
                elif line.startswith("event: error"):
                    run.error("error event")
                    return
    except Exception as e:  # a refused or dropped connection is a result here, not a crash
        run.error(type(e).__name__)
        return
    if not marks:
        run.error("no tokens")
        return
    run.arrivals += marks
    run.samples.append(Sample(marks[0] - started, list(np.diff(marks)), time.perf_counter() - started, len(marks)))


async def closed_loop(settings: LoadSettings, clients: int, prompts: list[str], stop: float) -> Run:
    import httpx

    run, rng = Run(), random.Random(settings.seed)
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        async def client_loop() -> None:
            while time.perf_counter() < stop:
                await one_request(client, settings, prompts[rng.randrange(len(prompts))], rng, run)
        await asyncio.gather(*(client_loop() for _ in range(clients)))
    return run


async def open_loop(settings: LoadSettings, rate: float, prompts: list[str], stop: float) -> Run:
    import httpx

    run, rng = Run(), random.Random(settings.seed)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=httpx.Limits(max_connections=None)) as client:
        tasks = []
        while time.perf_counter() < stop:
            tasks.append(asyncio.create_task(one_request(client, settings, prompts[rng.randrange(len(prompts))], rng, run)))
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)
    return run


def percentiles(values: list[float], scale: float = 1e3) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None}
    return {f"p{q}": float(np.percentile(values, q)) * scale for q in (50, 90, 99)}


def summarise(run: Run, level: dict, window: tuple[float, float]) -> dict:
    begin, end = window
    counted = sum(begin <= t < end for t in run.arrivals)
    return {**level, "requests": len(run.samples), "errors": run.errors,
            "tokens_per_s": counted / (end - begin), "ttft_ms": percentiles([s.ttft for s in run.samples]),
            "itl_ms": percentiles([x for s in run.samples for x in s.itls]),
            "e2e_ms": percentiles([s.e2e for s in run.samples]),
            "tokens_per_request": float(np.mean([s.tokens for s in run.samples])) if run.samples else None}


def server_info(url: str) -> dict:
    import httpx
    try:
        return httpx.get(f"{url}/health", timeout=10).json()
    except (httpx.HTTPError, ValueError) as e:
        raise UserError(f"{url}: no gpt2-deploy server answers there ({type(e).__name__}); start one with "
                        "`gpt2-deploy serve`") from None


def loadtest(settings: LoadSettings) -> dict:
    import torch

    from pipeline.bench import environment

    server = server_info(settings.url)
    rng = random.Random(settings.seed)
    prompts = prompt_texts(64, settings.prompt_tokens, settings.spread, rng)
    levels = [{"rate": settings.rate}] if settings.rate else [{"concurrency": c} for c in settings.concurrency]
    rows = []
    for level in levels:
        begin = time.perf_counter() + settings.warmup_s
        stop = begin + settings.duration_s
        if settings.rate:
            run = asyncio.run(open_loop(settings, settings.rate, prompts, stop))
        else:
            run = asyncio.run(closed_loop(settings, level["concurrency"], prompts, stop))
        rows.append(summarise(run, level, (begin, stop)))
        r = rows[-1]
        console.print(f"loadtest {level}: {r['tokens_per_s']:,.0f} tokens/s, {r['requests']} requests, "
                      f"TTFT p50 {fmt(r['ttft_ms']['p50'])} ms, ITL p50 {fmt(r['itl_ms']['p50'], '.3f')} ms, "
                      f"errors {sum(r['errors'].values())}", highlight=False)
    return {"settings": asdict(settings), "server": server, "client": environment(torch.device("cpu")), "rows": rows}


def fmt(value, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def markdown(result: dict) -> str:
    st, server = result["settings"], result["server"]
    lines = [f"# Load test: {server.get('backend')} {server.get('precision')} on {server.get('device')}", "",
             f"{st['url']}; prompt ~{st['prompt_tokens']} tokens, {st['max_tokens']} new tokens"
             f"{' (EOS ignored)' if st['ignore_eos'] else ''}, spread {st['spread']}; {st['duration_s']:g} s per level "
             f"after {st['warmup_s']:g} s of warm-up; streaming clients", "",
             "| load | requests | errors | tokens/s | TTFT ms p50 / p90 / p99 | ITL ms p50 / p90 / p99 | end to end ms p50 / p90 / p99 |",
             "|---|---:|---:|---:|---|---|---|"]
    for r in result["rows"]:
        load = f"{r['concurrency']} clients" if "concurrency" in r else f"{r['rate']:g} req/s"
        trio = lambda d, spec=".1f": " / ".join(fmt(d[k], spec) for k in ("p50", "p90", "p99"))  # noqa: E731
        lines.append(f"| {load} | {r['requests']} | {sum(r['errors'].values())} | {r['tokens_per_s']:,.0f} | "
                     f"{trio(r['ttft_ms'])} | {trio(r['itl_ms'], '.3f')} | {trio(r['e2e_ms'], '.0f')} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    x = [r.get("concurrency", r.get("rate")) for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(x, [r["tokens_per_s"] for r in rows], marker="o")
    left.set(xlabel="clients" if "concurrency" in rows[0] else "requests/s", ylabel="generated tokens/s", xscale="log")
    for key, label in (("ttft_ms", "TTFT p50"), ("itl_ms", "ITL p50")):
        right.plot(x, [r[key]["p50"] for r in rows], marker="o", label=label)
    right.set(xlabel=left.get_xlabel(), ylabel="ms", xscale="log", yscale="log")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)


def write_reports(result: dict, folder) -> None:
    from pipeline.artifacts import (
        atomic_write_bytes,
        atomic_write_json,
        atomic_write_text,
    )

    atomic_write_json(folder / "loadtest.json", result)
    atomic_write_text(folder / "loadtest.md", markdown(result))
    buffer = io.BytesIO()
    plot(result, buffer)
    atomic_write_bytes(folder / "loadtest.png", buffer.getvalue())
    console.print(markdown(result), highlight=False, markup=False)
