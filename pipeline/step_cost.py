"""What a decode step must cost, beside what it took, for every bench row: the bytes the step must read
(each weight once at its precision's width, and every row's KV cache up to its position), the time
those take at the device's measured copy bandwidth (the memory floor), and how many device operations
(kernels, copies, fills) the step launches. A step far from its floor with many launches is
launch-bound, not memory-bound (docs/journal/performance.md, "The step against its memory floor")."""

from __future__ import annotations

import dataclasses
import time

import torch

from pipeline.model import synchronize
from pipeline.runtime.backend import Backend
from pipeline.runtime.batch import Prompts
from pipeline.runtime.generate import Generator
from pipeline.runtime.sampling import Sampling

WEIGHT_BYTES = {"fp32": 4, "fp16": 2, "int8": 1, "int8-wo": 1}  # a weight's width as each precision stores it
COPY_BYTES = 1 << 30  # the buffer copy_bandwidth times: far larger than any cache of the device
COUNTED_STEPS = (4, 20)  # device_ops_per_step: two generations, whose difference leaves the prefill out


def copy_bandwidth(device: torch.device, repeats: int = 10) -> float:
    """Bytes a second a device-to-device copy moves (read plus written), the best of `repeats`: what the
    device's memory reaches in practice, a little under the data sheet's figure."""
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t = time.perf_counter()
            dst.copy_(src)
            seconds = time.perf_counter() - t
        best = min(best, seconds)
    return 2 * COPY_BYTES / best


def step_read_bytes(model: dict, precision: str, device: torch.device, rows: int, context: float) -> float:
    """What one decode step of `rows` rows must read at a mean `context` positions: every weight once at
    its stored width (of the position table a step reads one row, so it is left out; biases, norms and
    int8 scales, under 0.2% of the weights, are counted at the weights' width), and each row's keys and
    values of every layer, fp16 on a GPU except for fp32 rows, fp32 on a CPU."""
    weights = (model["parameters"] - model["context"] * model["hidden"]) * WEIGHT_BYTES[precision]
    width = 2 if device.type == "cuda" and precision != "fp32" else 4
    cache = 2 * model["layers"] * rows * context * model["hidden"] * width
    return weights + cache


def device_ops_per_step(backend: Backend, prompts: Prompts, sampling: Sampling, device: torch.device) -> float | None:
    """Device operations one decode step launches (kernels, copies and fills, those in CUDA graphs too),
    counted by the profiler over two generations of COUNTED_STEPS tokens: their difference is decode
    steps only. One generation runs first, uncounted: a graph captured inside the count (its warm-up
    runs, its recording) would be counted instead of its replays. None on a CPU, where nothing is launched."""
    if device.type != "cuda":
        return None

    def generate(steps: int) -> None:
        for _ in Generator(backend).stream(prompts, dataclasses.replace(sampling, max_new_tokens=steps)):
            pass
        synchronize(device)

    generate(COUNTED_STEPS[-1])
    counts = []
    for steps in COUNTED_STEPS:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            generate(steps)
        counts.append(sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA))
    return (counts[1] - counts[0]) / (COUNTED_STEPS[1] - COUNTED_STEPS[0])


def step_cost(row_decode_ms: float, read_bytes: float, bandwidth: float) -> dict:
    """A row's read figures: MB a step must read, the bandwidth its step time achieves, the floor (that
    read at the copy bandwidth) and the share of the floor the step reaches (1.0: memory-bound)."""
    floor_ms = read_bytes / bandwidth * 1e3
    return {"step_read_mb": read_bytes / 1e6, "read_gbps": read_bytes / row_decode_ms / 1e6,
            "floor_ms": floor_ms, "of_floor": floor_ms / row_decode_ms}
