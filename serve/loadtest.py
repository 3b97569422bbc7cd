"""`gpt2-deploy loadtest URL`: what clients of a running `serve` (or any OpenAI-compatible server:
it speaks /v1/completions) measure. Streaming clients send requests back to back (closed loop,
`--concurrency`), or requests arrive at a Poisson rate (open loop, `--rate`); time to first token,
inter-token latency (the gap between stream chunks), time per output token and end-to-end latency
are measured at the client, per request, and the throughput is the generated tokens the clients
received per second.

Each concurrency (or rate) of a sweep runs for `--duration` seconds after `--warmup` seconds that
are not counted; requests in flight at the end run to completion and count towards latency only."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import random
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from pipeline.cores import usable_cores
from pipeline.errors import UserError
from pipeline.progress import console
from serve.load_report import fmt, percentiles

# past one core's worth of streams the clients, not the server, would set the figures: they spread over
# processes (docs/journal/performance.md, "Serving")
CLIENTS_PER_WORKER, RATE_PER_WORKER = 8, 50.0


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
    # sampling: requests that sample (a share of them) send these; the rest are greedy (temperature 0)
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    sampled_share: float = 1.0
    workers: int = 0  # client processes; 0 = one per CLIENTS_PER_WORKER clients (or RATE_PER_WORKER req/s), up to the cores
    triton_model: str | None = None  # Triton Inference Server's generate_stream of this model instead of /v1/completions
    lengths_file: str | None = None  # (prompt, output) token lengths, a pair a line, instead of the lengths above


@dataclass
class Sample:
    started: float  # perf_counter when the request was sent
    ttft: float
    itls: list[float]  # gaps between a request's stream chunks, as vLLM's benchmark counts them
    e2e: float
    tokens: int

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first."""
        return (self.e2e - self.ttft) / (self.tokens - 1) if self.tokens > 1 else None


@dataclass
class Run:
    """What one load level recorded: arrival times of every token, finished requests, errors."""
    arrivals: list[float] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, what: str, count: int = 1) -> None:
        self.errors[what] = self.errors.get(what, 0) + count

    def merge(self, other: Run) -> None:
        self.arrivals += other.arrivals
        self.samples += other.samples
        for what, count in other.errors.items():
            self.error(what, count)


Workload = list[tuple[str, int | None]]  # (prompt text, output tokens or None: drawn per request)
LENGTHS_KEPT = 512  # requests drawn from a lengths file: a sample of its pairs where it has more


def workload(settings: LoadSettings, rng: random.Random) -> Workload:
    """The requests clients pick from: (prompt text, output tokens, None to draw it per request). From
    the lengths file's pairs, else 64 prompts of `prompt_tokens` spread by `spread`."""
    if settings.lengths_file:
        pairs = read_lengths(settings.lengths_file)
        if len(pairs) > LENGTHS_KEPT:
            pairs = rng.sample(pairs, LENGTHS_KEPT)
        return list(zip(prompt_texts([p for p, _ in pairs], rng), [o for _, o in pairs]))
    counts = [lengths(settings.prompt_tokens, settings.spread, rng) for _ in range(64)]
    return [(text, None) for text in prompt_texts(counts, rng)]


def read_lengths(path: str) -> list[tuple[int, int]]:
    """A lengths file: one request a line, its prompt and output tokens as two whole numbers (spaces or
    a comma between); blank lines and lines from '#' are skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--lengths {path}: cannot read it ({type(e).__name__}); give a text file of "
                        "'prompt_tokens output_tokens' lines") from None
    pairs = []
    for number, line in enumerate(lines, 1):
        fields = line.split("#", 1)[0].replace(",", " ").split()
        if not fields:
            continue
        if len(fields) != 2 or not all(f.isdigit() and int(f) >= 1 for f in fields):
            raise UserError(f"--lengths {path}:{number}: {line.strip()!r} is not two whole numbers >= 1 "
                            "(prompt tokens, output tokens)")
        pairs.append((int(fields[0]), int(fields[1])))
    if not pairs:
        raise UserError(f"--lengths {path}: no 'prompt_tokens output_tokens' line in it")
    return pairs


def prompt_texts(counts: list[int], rng: random.Random) -> list[str]:
    """Held-out-like text of about counts[i] GPT-2 tokens each, cut from the embedded corpus."""
    from pipeline.data import embedded_corpus
    from pipeline.tokenizer import embedded_gpt2_tokenizer

    tokenizer = embedded_gpt2_tokenizer()
    ids = []
    for doc in embedded_corpus():
        ids += tokenizer(doc)["input_ids"]
        if len(ids) > 4 * max(counts) + 64:
            break
    texts = []
    for n in counts:
        start = rng.randrange(0, len(ids) - n)
        texts.append(tokenizer.decode(ids[start:start + n]))
    return texts


def lengths(n: int, spread: float, rng: random.Random) -> int:
    return max(1, round(n * (1 + spread * (2 * rng.random() - 1))))


def sampling_fields(settings: LoadSettings, rng: random.Random) -> dict:
    """A request's sampling: greedy, or (for sampled_share of the requests) the settings' temperature,
    top_p and top_k, unseeded as users send them."""
    if settings.temperature <= 0 or rng.random() >= settings.sampled_share:
        return {"temperature": 0}
    return {"temperature": settings.temperature, "top_p": settings.top_p, "top_k": settings.top_k}


def request_for(settings: LoadSettings, model: str, request: tuple[str, int | None],
                rng: random.Random) -> tuple[str, dict]:
    """(url, body) of one streaming request of the workload: OpenAI's /v1/completions, or Triton's
    generate_stream with TensorRT-LLM's names (pipeline.tritonserver.model), where top_k 0 is off."""
    prompt, max_tokens = request
    max_tokens, sampling = max_tokens or lengths(settings.max_tokens, settings.spread, rng), sampling_fields(settings, rng)
    if settings.triton_model:
        sampling["top_k"] = max(sampling.get("top_k", 0), 0)
        return (f"{settings.url}/v2/models/{settings.triton_model}/generate_stream",
                {"text_input": prompt, "max_tokens": max_tokens, **sampling, "stream": True, "ignore_eos": settings.ignore_eos})
    return (f"{settings.url}/v1/completions",
            {"model": model, "prompt": prompt, "max_tokens": max_tokens, **sampling, "stream": True,
             "ignore_eos": settings.ignore_eos, "stream_options": {"include_usage": True, "continuous_usage_stats": True}})


def tokens_after(chunk: dict, tokens: int) -> int:
    """The request's tokens once this chunk is in: Triton's output_ids (a list, or one id alone), or
    the usage an OpenAI chunk carries (one a chunk where a server sends none; its closing usage chunk
    adds none)."""
    if "output_ids" in chunk:
        ids = chunk["output_ids"]
        return tokens + (len(ids) if isinstance(ids, list) else 1)
    if not chunk["choices"]:
        return tokens
    return (chunk.get("usage") or {}).get("completion_tokens", tokens + 1)


async def one_request(client, settings: LoadSettings, model: str, request: tuple[str, int | None], rng: random.Random,
                      run: Run) -> None:
    """One streaming request (request_for), greedy or sampled (sampling_fields), its tokens counted as
    they come (tokens_after)."""
    url, body = request_for(settings, model, request, rng)
    started, marks, tokens = time.perf_counter(), [], 0
    try:
        async with client.post(url, json=body) as reply:
            if reply.status != 200:
                await reply.read()
                run.error(f"HTTP {reply.status}")
                return
            rest = b""
            async for data in reply.content.iter_any():
                now = time.perf_counter()  # chunks that came in one read arrived together
                lines = (rest + data).split(b"\n")
                rest = lines.pop()
                for line in lines:
                    if not line.startswith(b"data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        run.error("error in stream")
                        return
                    count = tokens_after(chunk, tokens)
                    if count > tokens:
                        run.arrivals += [now] * (count - tokens)
                        marks.append(now)
                        tokens = count
    except Exception as e:  # a refused or dropped connection is a result here, not a crash
        run.error(type(e).__name__)
        return
    if not marks:
        run.error("no tokens")
        return
    run.samples.append(Sample(started, marks[0] - started, list(np.diff(marks)), time.perf_counter() - started, tokens))


async def closed_loop(settings: LoadSettings, model: str, clients: int, prompts: Workload, stop: float,
                      rng: random.Random) -> Run:
    import aiohttp

    run = Run()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600),
                                     connector=aiohttp.TCPConnector(limit=clients + 8)) as client:
        async def client_loop() -> None:
            while time.perf_counter() < stop:
                await one_request(client, settings, model, prompts[rng.randrange(len(prompts))], rng, run)
        await asyncio.gather(*(client_loop() for _ in range(clients)))
    return run


async def open_loop(settings: LoadSettings, model: str, rate: float, prompts: Workload, stop: float,
                    rng: random.Random) -> Run:
    import aiohttp

    run = Run()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600),
                                     connector=aiohttp.TCPConnector(limit=0)) as client:
        tasks = []
        while time.perf_counter() < stop:
            prompt = prompts[rng.randrange(len(prompts))]
            tasks.append(asyncio.create_task(one_request(client, settings, model, prompt, rng, run)))
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)
    return run


def summarise(run: Run, level: dict, window: tuple[float, float]) -> dict:
    """Tokens/s from the tokens that arrived within the window; latencies of the requests sent within
    it (not the warm-up's, whose first requests all start at once, nor those sent after it)."""
    begin, end = window
    counted = sum(begin <= t < end for t in run.arrivals)
    samples = [s for s in run.samples if begin <= s.started < end]
    return {**level, "requests": len(samples), "errors": run.errors,
            "tokens_per_s": counted / (end - begin), "ttft_ms": percentiles([s.ttft for s in samples]),
            "itl_ms": percentiles([x for s in samples for x in s.itls]),
            "tpot_ms": percentiles([s.tpot for s in samples if s.tpot is not None]),
            "e2e_ms": percentiles([s.e2e for s in samples]),
            "tokens_per_request": float(np.mean([s.tokens for s in samples])) if samples else None}


def server_info(url: str, triton_model: str | None = None) -> dict:
    """The served model (/v1/models) and, from a gpt2-deploy server, what it runs (/health); Triton's
    model metadata for a Triton model."""
    import httpx
    if triton_model:
        try:
            return {"model": httpx.get(f"{url}/v2/models/{triton_model}", timeout=10).raise_for_status().json()["name"],
                    "server": "Triton Inference Server"}
        except (httpx.HTTPError, ValueError, KeyError) as e:
            raise UserError(f"{url}: no Triton model {triton_model!r} answers there ({type(e).__name__}); start one with "
                            "`gpt2-deploy triton-server`") from None
    try:
        models = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
        health = httpx.get(f"{url}/health", timeout=10)
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{url}: no OpenAI-compatible server answers there ({type(e).__name__}); start one with "
                        "`gpt2-deploy serve`") from None
    info = health.json() if health.status_code == 200 else {}
    return {**info, "model": models[0]["id"]}


def loadtest(settings: LoadSettings) -> dict:
    import torch

    from pipeline.machine import environment

    server = server_info(settings.url, settings.triton_model)
    rng = random.Random(settings.seed)
    prompts = workload(settings, rng)
    levels = [{"rate": settings.rate}] if settings.rate else [{"concurrency": c} for c in settings.concurrency]
    rows = []
    for level in levels:
        run, workers, window = run_level(settings, server["model"], level, prompts)
        rows.append({**summarise(run, level, window), "client_processes": workers})
        r = rows[-1]
        console.print(f"loadtest {level}: {r['tokens_per_s']:,.0f} tokens/s, {r['requests']} requests, "
                      f"TTFT p50 {fmt(r['ttft_ms']['p50'])} ms, ITL p50 {fmt(r['itl_ms']['p50'], '.3f')} ms, "
                      f"TPOT p50 {fmt(r['tpot_ms']['p50'], '.3f')} ms, "
                      f"errors {sum(r['errors'].values())}", highlight=False)
    return {"settings": asdict(settings), "server": server, "client": environment(torch.device("cpu")), "rows": rows}


def run_level(settings: LoadSettings, model: str, level: dict, prompts: Workload) -> tuple[Run, int, tuple[float, float]]:
    """One load level, its clients (or arrival rate) split over worker processes, started before the
    warm-up's clock runs (a process takes seconds to start where torch is large). perf_counter is the
    system's monotonic clock on Linux, so the workers' times compare with this process's window.
    -> (what was recorded, the processes, the measured window)"""
    load = level.get("concurrency") or level["rate"]
    per = CLIENTS_PER_WORKER if "concurrency" in level else RATE_PER_WORKER
    workers = max(1, min(settings.workers or -(-int(load) // int(per)) or 1, usable_cores()))
    if "concurrency" in level:
        workers = min(workers, level["concurrency"])
        shares = [{"concurrency": level["concurrency"] // workers + (i < level["concurrency"] % workers)}
                  for i in range(workers)]
    else:
        shares = [{"rate": level["rate"] / workers} for _ in range(workers)]
    def window() -> tuple[float, float]:
        begin = time.perf_counter() + settings.warmup_s
        return begin, begin + settings.duration_s

    if workers == 1:
        begin, stop = window()
        return client_worker(settings, model, shares[0], prompts, stop, settings.seed), 1, (begin, stop)
    run = Run()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(start_worker, [STARTED_S] * workers))
        begin, stop = window()
        jobs = [(settings, model, share, prompts, stop, settings.seed + i) for i, share in enumerate(shares)]
        for part in pool.map(client_worker, *zip(*jobs)):
            run.merge(part)
    return run, workers, (begin, stop)


STARTED_S = 0.5  # how long each process's first task holds it: long enough that every process gets one


def start_worker(hold_s: float) -> None:
    """A client process's first task: what the clients import, imported before the warm-up starts."""
    import aiohttp  # noqa: F401

    time.sleep(hold_s)


def client_worker(settings: LoadSettings, model: str, share: dict, prompts: Workload, stop: float, seed: int) -> Run:
    rng = random.Random(seed)
    if "rate" in share:
        return asyncio.run(open_loop(settings, model, share["rate"], prompts, stop, rng))
    return asyncio.run(closed_loop(settings, model, share["concurrency"], prompts, stop, rng))


