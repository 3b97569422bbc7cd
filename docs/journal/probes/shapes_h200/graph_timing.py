"""What the sweeps here share: compiling their kernels in a pool, a kernel's time a launch from a
CUDA graph of its launches replayed, and the triton backend opened on a model with no run folder."""

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


def open_triton(model, precision: str):
    """TritonBackend on the GPU over a (host) model; in int8-wo its weights as the int8-wo graph holds
    them (the folded model quantised per output: tests/export/test_int8.py), without writing the graph."""
    from pipeline.int8_weights import folded_model, quantize_rows
    from pipeline.runtime.static.triton_backend import TritonBackend
    int8 = None
    if precision == "int8-wo":
        folded = folded_model(model)
        products = {"qkv": lambda b: b.attn.c_attn, "proj": lambda b: b.attn.c_proj, "fc": lambda b: b.mlp.c_fc,
                    "fc2": lambda b: b.mlp.c_proj}
        int8 = {name: quantize_rows(torch.stack([of(b).weight.t() for b in folded.transformer.h]))
                for name, of in products.items()}
        int8["head"] = quantize_rows(folded.lm_head.weight)
    return TritonBackend(model, precision, "cuda", int8_weights=int8)
