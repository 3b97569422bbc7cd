"""`gpt2-deploy bench`: latency and throughput of every backend x precision x batch size, through
the one generation runtime, on the same prompts, in one process.

Method: every backend is opened (load/compile/build time recorded apart) and warmed up with a
full untimed generation per batch size; then `repeats` rounds each time one generation of every
(backend, batch), interleaved so that a load on the machine falls on all rows alike. Every figure
of a row comes from the same passes, each timed end to end with one device synchronisation at the
end (tokens/s) and token by token with CUDA events (the host clock on a CPU): time to first token,
per-token p50/p90/p99. A row reports the spread of its passes' tokens/s, and is flagged noisy when
that, or its baseline's, is over NOISY_SPREAD: its ratio then says little. On a GPU one more pass
has the host wait for every token, as a streaming client does (p50 only). Every row's speed-up is
over eager PyTorch at the same precision (or the closest float one, named in the row) and batch,
measured in this same run: the median over rounds of the row's pass over the baseline's pass of
that round, so that a slow spell of the machine weighs on both sides of a ratio (docs/journal/performance.md)."""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from pipeline.artifacts import RunDir
from pipeline.bench_report import write_reports
from pipeline.config import Config
from pipeline.data import heldout_blocks, prepare_data
from pipeline.machine import environment, model_description
from pipeline.model import synchronize
from pipeline.progress import progress
from pipeline.runtime.backend import Backend, BackendUnavailable
from pipeline.runtime.batch import Prompts
from pipeline.runtime.generate import Generator
from pipeline.runtime.loader import open_backend
from pipeline.runtime.sampling import Sampling
from pipeline.runtime.session import RowLocalRefused, make_row_local
from pipeline.step_cost import copy_bandwidth, device_ops_per_step, step_cost, step_read_bytes
from pipeline.tokenizer import load_tokenizer

NOISY_SPREAD = 0.15  # (max - min) / median of a row's passes' tokens/s beyond which its ratio says little


@dataclass
class BenchSettings:
    batches: list[int] = field(default_factory=lambda: [1, 8, 64])
    prompt_tokens: int = 128
    new_tokens: int = 128
    repeats: int = 3
    pairs: list[tuple[str, str]] = field(default_factory=list)
    # a sampled row beside each greedy one (temperature, top_p, top_k, seed), as completion users send
    sample: Sampling | None = None
    deterministic: bool = False  # every row computed row-local (session.make_row_local): what the mode costs


@dataclass
class Row:
    backend: str
    precision: str
    batch: int
    status: str  # ok | skipped | error
    decoding: str = "greedy"  # greedy | sampled (BenchSettings.sample)
    reason: str = ""
    ttft_ms: float | None = None
    decode_ms_p50: float | None = None
    decode_ms_p90: float | None = None
    decode_ms_p99: float | None = None
    decode_ms_p50_synced: float | None = None  # the host waiting for every token (a streaming client)
    e2e_ms: float | None = None
    tokens_per_s: float | None = None
    tokens_per_s_min: float | None = None  # the slowest and fastest of the row's passes
    tokens_per_s_max: float | None = None
    spread: float | None = None  # (max - min) / median of the passes' tokens/s
    pass_tokens_per_s: list[float] | None = None  # each pass's, in round order
    noisy: bool = False  # the row's spread, or its baseline's, is over NOISY_SPREAD
    # what the backend holds once warmed up at this batch (weights, caches, graphs, workspaces), less what
    # was in use before it opened: the bench keeps every backend open to alternate their rounds
    held_memory_mib: float | None = None
    load_s: float | None = None  # open the backend: load weights, deserialise an engine, create a session
    warmup_s: float | None = None  # first generation at this batch: compilation, CUDA-graph capture, autotuning
    baseline: str = ""
    speedup_vs_eager: float | None = None
    vs_greedy: float | None = None  # a sampled row's tokens/s over its greedy twin's, paired by round
    # pipeline.step_cost: device operations a decode step launches (GPU), what it must read, and the floor
    launches_per_step: float | None = None
    step_read_mb: float | None = None
    read_gbps: float | None = None  # step_read_mb over decode_ms_p50
    floor_ms: float | None = None  # step_read_mb at the device's copy bandwidth
    of_floor: float | None = None  # floor_ms over decode_ms_p50: 1.0 is memory-bound


def device_memory_mib(device: torch.device) -> float:
    """Memory in use now on the device (all allocators: torch, ONNX Runtime, TensorRT; torch's cache of
    freed blocks emptied first), or the process's resident memory on a CPU."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(device)
        return (total - free) / 2**20
    with open("/proc/self/statm") as statm:  # Linux: pages resident now (ru_maxrss is the peak of the whole run)
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def token_times(gen: Generator, prompts: Prompts, sampling: Sampling, device: torch.device) -> list[float]:
    """Seconds from the call to each token being ready. On a GPU: a CUDA event after each token,
    read once at the end, so the loop runs as generation does (the host never waits per token)."""
    if device.type != "cuda":  # the host clock: on a CPU it waits for every token anyway
        return synced_token_times(gen, prompts, sampling, device)
    start, marks = torch.cuda.Event(enable_timing=True), []
    start.record()
    for _ in gen.stream(prompts, sampling):
        marks.append(torch.cuda.Event(enable_timing=True))
        marks[-1].record()
    synchronize(device)
    return [start.elapsed_time(m) / 1e3 for m in marks]


def synced_token_times(gen: Generator, prompts: Prompts, sampling: Sampling, device: torch.device) -> list[float]:
    """As token_times, but the host waits for every token, as a client reading a stream does."""
    start, stamps = time.perf_counter(), []
    for _ in gen.stream(prompts, sampling):
        synchronize(device)
        stamps.append(time.perf_counter() - start)
    return stamps


def timed_pass(gen: Generator, prompts: Prompts, sampling: Sampling, device: torch.device) -> tuple[float, list[float]]:
    """One generation: seconds end to end (the host waits once, at the end) and each token's mark
    (token_times'), from the same pass."""
    synchronize(device)
    start = time.perf_counter()
    marks = token_times(gen, prompts, sampling, device)
    synchronize(device)
    return time.perf_counter() - start, marks


def summarise_passes(passes: list[tuple[float, list[float]]], tokens: int, synced: list[float]) -> dict:
    """A row's figures, all from the same passes: medians, per-token percentiles and the spread."""
    e2e = [p[0] for p in passes]
    rates = [tokens / t for t in e2e]
    ms = np.concatenate([np.diff(p[1]) for p in passes]) * 1e3
    median_rate = statistics.median(rates)
    return {"ttft_ms": statistics.median(p[1][0] for p in passes) * 1e3, "decode_ms_p50": float(np.percentile(ms, 50)),
            "decode_ms_p90": float(np.percentile(ms, 90)), "decode_ms_p99": float(np.percentile(ms, 99)),
            # on a CPU the host clock already waits for every token: the two medians are one
            "decode_ms_p50_synced": float(np.percentile(synced, 50)) * 1e3 if synced else float(np.percentile(ms, 50)),
            "e2e_ms": statistics.median(e2e) * 1e3, "tokens_per_s": median_rate,
            "tokens_per_s_min": min(rates), "tokens_per_s_max": max(rates),
            "spread": (max(rates) - min(rates)) / median_rate, "pass_tokens_per_s": rates}


def rounds(items: list, repeats: int) -> Iterator:
    """Each item once per round, `repeats` rounds, each starting one item later than the last."""
    for r in range(repeats):
        shift = r % len(items) if items else 0
        yield from items[shift:] + items[:shift]


def bench(cfg: Config, run: RunDir, device: torch.device, settings: BenchSettings) -> dict:
    tokenizer, model = load_tokenizer(run.checkpoint), model_description(run.checkpoint)
    splits = prepare_data(cfg, run, tokenizer)
    blocks = heldout_blocks(splits, max(settings.batches), settings.prompt_tokens, "bench batch size", from_end=True)
    # no stop tokens: every row generates new_tokens
    decodings = {"greedy": Sampling(max_new_tokens=settings.new_tokens)}
    if settings.sample is not None:
        decodings["sampled"] = settings.sample
    rows: list[Row] = []
    bandwidth = copy_bandwidth(device)
    opened: dict[tuple[str, str], Backend] = {}
    live: list[Row] = []  # rows warmed up, to be timed
    for name, precision in progress(settings.pairs, total=len(settings.pairs), description="bench: open, warm up"):
        gc.collect()
        synchronize(device)
        in_use = device_memory_mib(device)
        start = time.perf_counter()
        try:
            backend = open_backend(run, name, precision, device)  # its UserError (a stale graph) stops the bench
            if settings.deterministic:
                make_row_local(backend, max(settings.batches))
            opened[name, precision] = backend
        except (BackendUnavailable, RowLocalRefused) as e:
            rows += [Row(name, precision, b, "skipped", decoding=d, reason=str(e)) for b in settings.batches for d in decodings]
            continue
        synchronize(device)
        load_s = time.perf_counter() - start
        for batch in settings.batches:
            if backend.max_rows is not None and batch > backend.max_rows:
                rows += [Row(name, precision, batch, "skipped", decoding=d,
                             reason=f"{name} runs at most {backend.max_rows} rows at once") for d in decodings]
                continue
            for decoding, sampling in decodings.items():
                try:
                    start = time.perf_counter()
                    for _ in Generator(backend).stream(blocks[:batch], sampling):
                        pass
                    synchronize(device)
                    row = Row(name, precision, batch, "ok", decoding=decoding, load_s=load_s,
                              warmup_s=time.perf_counter() - start, held_memory_mib=device_memory_mib(device) - in_use,
                              launches_per_step=device_ops_per_step(backend, blocks[:batch], sampling, device))
                except Exception as e:  # one row failing (out of memory, a profile too small) keeps the others
                    row = Row(name, precision, batch, "error", decoding=decoding,
                              reason=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
                rows.append(row)
                live += [row] if row.status == "ok" else []
    passes: dict[int, list] = {id(row): [] for row in live}
    for row in progress(list(rounds(live, settings.repeats)), total=len(live) * settings.repeats,
                        description="bench: timed rounds"):
        # blocks[:batch]: one array, as a tokenizer's batch: no Python ints to convert
        gen, prompts = Generator(opened[row.backend, row.precision]), blocks[:row.batch]
        passes[id(row)].append(timed_pass(gen, prompts, decodings[row.decoding], device))
    for row in live:
        gen, prompts, sampling = Generator(opened[row.backend, row.precision]), blocks[:row.batch], decodings[row.decoding]
        synced = (list(np.diff(synced_token_times(gen, prompts, sampling, device))) if device.type == "cuda" else [])
        for key, value in summarise_passes(passes[id(row)], row.batch * sampling.max_new_tokens, synced).items():
            setattr(row, key, value)
        read = step_read_bytes(model, row.precision, device, row.batch, settings.prompt_tokens + settings.new_tokens / 2)
        for key, value in step_cost(row.decode_ms_p50, read, bandwidth).items():
            setattr(row, key, value)
    opened.clear()
    add_speedups(rows, device)
    result = {"settings": {**asdict(settings), "pairs": [list(p) for p in settings.pairs]},
              "model": model, "environment": {**environment(device), "copy_gbps": bandwidth / 1e9},
              "rows": [asdict(r) for r in rows]}
    write_reports(result, run)
    return result


def add_speedups(rows: list[Row], device: torch.device) -> None:
    """Speed-up in tokens/s over eager PyTorch at the same precision, batch and decoding; int8 rows
    compare with the float precision a deployment would otherwise run (fp16 on a GPU, fp32 on a CPU).
    A sampled row also gets its ratio to the same engine's greedy row."""
    ok = [r for r in rows if r.status == "ok"]
    eager = {(r.precision, r.batch, r.decoding): r for r in ok if r.backend == "torch"}
    greedy = {(r.backend, r.precision, r.batch): r for r in ok if r.decoding == "greedy"}
    fallback = "fp16" if device.type == "cuda" else "fp32"
    for r in ok:
        base = eager.get((r.precision, r.batch, r.decoding)) or eager.get((fallback, r.batch, r.decoding))
        if base is not None:
            r.baseline = f"torch {base.precision}"
            r.speedup_vs_eager = paired_ratio(r, base)
        twin = greedy.get((r.backend, r.precision, r.batch))
        if r.decoding != "greedy" and twin is not None:
            r.vs_greedy = paired_ratio(r, twin)
        r.noisy = max(r.spread or 0, (base.spread or 0) if base else 0) > NOISY_SPREAD


def paired_ratio(row: Row, base: Row) -> float:
    """The median over rounds of the row's tokens/s over the base's in the same round."""
    return statistics.median(mine / theirs for mine, theirs in zip(row.pass_tokens_per_s, base.pass_tokens_per_s))
