"""What the sweeps here share: compiling their kernels in a pool, and a kernel's time a launch from a
CUDA graph of its launches replayed."""

import multiprocessing
import os

import torch


def graph_us(launch, launches: int, repeats: int) -> float:
    """launch(i) for i in range(launches) captured into one graph, replayed `repeats` times after one
    warm replay -> us a launch."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(launches):
            launch(i)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (launches * repeats)


def sweep_times(run, todo: list, repeats: int) -> dict:
    """Every job compiled by a pool of processes into Triton's cache (run(job) -> "ok" or why not),
    then those that built timed in this one -> {job: run(job, repeats)}."""
    with multiprocessing.get_context("spawn").Pool(min(15, os.cpu_count() or 1)) as pool:
        built = pool.map(run, todo, chunksize=4)
    print(f"{len(todo)} kernels, {sum(b == 'ok' for b in built)} built", flush=True)
    return {job: run(job, repeats=repeats) for job, b in zip(todo, built) if b == "ok"}
