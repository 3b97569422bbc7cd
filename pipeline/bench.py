"""`gpt2-deploy bench`: latency and throughput of every backend x precision x batch size, through
the one generation runtime, on the same prompts, in one process.

Method: each backend is opened once (load/compile/build time recorded apart), warmed up with a
full untimed generation per batch size, then timed over `repeats` generations:
- end to end, with one device synchronisation at the end (tokens/s comes from this);
- token by token with CUDA events (host clock on a CPU): time to first token, per-token p50/p90/p99;
- token by token with the host waiting for each token, as a streaming client does (p50 only).
Medians over repeats. Every row's speed-up is over eager PyTorch at the same precision (or the
closest float one, named in the row) and batch, measured in this same run."""

from __future__ import annotations

import gc
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from pipeline.artifacts import RunDir, package_versions
from pipeline.bench_report import write_reports
from pipeline.config import Config
from pipeline.data import heldout_blocks, prepare_data
from pipeline.progress import progress
from pipeline.runtime.backend import Backend, BackendUnavailable
from pipeline.runtime.batch import Prompts
from pipeline.runtime.generate import Generator
from pipeline.runtime.loader import open_backend
from pipeline.runtime.sampling import Sampling
from pipeline.tokenizer import load_tokenizer


@dataclass
class BenchSettings:
    batches: list[int] = field(default_factory=lambda: [1, 8, 64])
    prompt_tokens: int = 128
    new_tokens: int = 128
    repeats: int = 3
    pairs: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Row:
    backend: str
    precision: str
    batch: int
    status: str  # ok | skipped | error
    reason: str = ""
    ttft_ms: float | None = None
    decode_ms_p50: float | None = None
    decode_ms_p90: float | None = None
    decode_ms_p99: float | None = None
    decode_ms_p50_synced: float | None = None  # the host waiting for every token (a streaming client)
    e2e_ms: float | None = None
    tokens_per_s: float | None = None
    peak_memory_mib: float | None = None
    load_s: float | None = None  # open the backend: load weights, deserialise an engine, create a session
    warmup_s: float | None = None  # first generation at this batch: compilation, CUDA-graph capture, autotuning
    baseline: str = ""
    speedup_vs_eager: float | None = None


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_memory_mib(device: torch.device) -> float:
    """Memory in use on the device (all allocators: torch, ONNX Runtime, TensorRT), or the process RSS on a CPU."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return (total - free) / 2**20
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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


def time_generation(backend: Backend, prompts: Prompts, sampling: Sampling, repeats: int) -> dict:
    gen, device = Generator(backend), backend.device
    e2e, ttft, steps, synced = [], [], [], []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        for _ in gen.stream(prompts, sampling):
            pass
        synchronize(device)
        e2e.append(time.perf_counter() - start)
        marks = token_times(gen, prompts, sampling, device)
        ttft.append(marks[0])
        steps += list(np.diff(marks))
        synced += list(np.diff(synced_token_times(gen, prompts, sampling, device))) if device.type == "cuda" else []
    ms = np.array(steps) * 1e3
    e2e_s = statistics.median(e2e)
    return {"ttft_ms": statistics.median(ttft) * 1e3, "decode_ms_p50": float(np.percentile(ms, 50)),
            "decode_ms_p90": float(np.percentile(ms, 90)), "decode_ms_p99": float(np.percentile(ms, 99)),
            # on a CPU the host clock already waits for every token: the two medians are one
            "decode_ms_p50_synced": float(np.percentile(synced, 50)) * 1e3 if synced else float(np.percentile(ms, 50)),
            "e2e_ms": e2e_s * 1e3, "tokens_per_s": len(prompts) * sampling.max_new_tokens / e2e_s}


def environment(device: torch.device) -> dict:
    env = {"python": platform.python_version(), "platform": platform.platform(), "device": str(device),
           "packages": package_versions()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, compute_capability=f"{props.major}.{props.minor}",
                   gpu_memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda)
        try:
            import pynvml
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            env.update(driver=pynvml.nvmlSystemGetDriverVersion(),
                       sm_clock_mhz=pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                       max_sm_clock_mhz=pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM))
        except Exception as e:  # NVML is optional: without it the clocks are not readable
            env["clocks"] = f"unreadable ({type(e).__name__})"
    else:
        env["cpu_threads"] = torch.get_num_threads()
    return env


def bench(cfg: Config, run: RunDir, device: torch.device, settings: BenchSettings) -> dict:
    tokenizer = load_tokenizer(run.checkpoint)
    splits = prepare_data(cfg, run, tokenizer)
    blocks = heldout_blocks(splits, max(settings.batches), settings.prompt_tokens, "bench batch size", from_end=True)
    sampling = Sampling(max_new_tokens=settings.new_tokens)  # greedy, no stop tokens: every row generates new_tokens
    rows: list[Row] = []
    for name, precision in progress(settings.pairs, total=len(settings.pairs), description="bench"):
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        synchronize(device)
        start = time.perf_counter()
        try:
            backend = open_backend(run, name, precision, device)
        except BackendUnavailable as e:
            rows += [Row(name, precision, b, "skipped", str(e)) for b in settings.batches]
            continue
        synchronize(device)
        load_s = time.perf_counter() - start
        for batch in settings.batches:
            prompts = blocks[:batch]  # one array, as a tokenizer's batch: no Python ints to convert
            try:
                start = time.perf_counter()
                for _ in Generator(backend).stream(prompts, sampling):
                    pass
                synchronize(device)
                warmup_s = time.perf_counter() - start
                timed = time_generation(backend, prompts, sampling, settings.repeats)
            except Exception as e:  # one row failing (out of memory, a profile too small) keeps the others
                rows.append(Row(name, precision, batch, "error", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"))
                continue
            rows.append(Row(name, precision, batch, "ok", load_s=load_s, warmup_s=warmup_s,
                            peak_memory_mib=device_memory_mib(device), **timed))
        del backend
    add_speedups(rows, device)
    result = {"settings": {**asdict(settings), "pairs": [list(p) for p in settings.pairs]},
              "environment": environment(device), "rows": [asdict(r) for r in rows]}
    write_reports(result, run)
    return result


def add_speedups(rows: list[Row], device: torch.device) -> None:
    """Speed-up in tokens/s over eager PyTorch at the same precision and batch; int8 rows compare
    with the float precision a deployment would otherwise run (fp16 on a GPU, fp32 on a CPU)."""
    eager = {(r.precision, r.batch): r for r in rows if r.backend == "torch" and r.status == "ok"}
    fallback = "fp16" if device.type == "cuda" else "fp32"
    for r in rows:
        if r.status != "ok":
            continue
        base = eager.get((r.precision, r.batch)) or eager.get((fallback, r.batch))
        if base is not None:
            r.baseline = f"torch {base.precision}"
            r.speedup_vs_eager = r.tokens_per_s / base.tokens_per_s
