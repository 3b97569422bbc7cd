"""Tiles for the decode step's four products a layer at gpt2-medium / large / xl widths (#50): each
(width, rows, product) timed alone, in a CUDA graph of 20 launches, under the tiles
linear_config picks now and under a grid of others -> one line each, the current time, the best
and its tiles. Random fp16 weights; the QKV product without its cache routing (the epilogue's
stores only); the LM head left out (its vocabulary is every shape's). The kernels are compiled
first by a pool of processes into Triton's cache, then timed by one.
python3 docs/journal/probes/shapes_h200/linear_sweep.py"""

import itertools
import multiprocessing
import os

WIDTHS = (1024, 1280, 1600)
ROWS = (1, 8, 64)
PRODUCTS = {"qkv": (3, 1, False), "proj": (1, 1, True), "fc": (4, 1, False), "fc2": (1, 4, True)}  # n, k in widths


def candidates(m: int, k: int, residual: bool):
    from pipeline.runtime.kernels.tiles import LinearConfig, linear_config
    yield linear_config(m, 0, k, residual)
    splits = [s for s in (1, 2, 4, 5, 8) if k % s == 0 and k // s >= 64] if residual else [1]
    if m == 1:
        for n, split in itertools.product((4, 8, 16), splits):
            for warps in (1, 2, 4) if split == 1 else (2, 4):
                yield LinearConfig(1, n, 0, split, warps)
        return
    # batch 8: both K tiles, 3 stages; batch 64: the widest K tile that divides K, deeper pipelines unsplit
    block_ms, block_ks = ((16,), (64, 128)) if m <= 16 else ((16, 32, 64), (128 if k % 128 == 0 else 64,))
    for bm, bn, bk, split, stages in itertools.product(block_ms, (32, 64, 128), block_ks, splits, (3, 4)):
        if (k % (split * bk) == 0 or split == 1) and (bk == 64 or k % 128 == 0) and (stages == 3 or (m > 16 and not residual)):
            yield LinearConfig(bm, bn, bk, split, 4, stages)


def jobs():
    for c, m, (name, (wn, wk, residual)) in itertools.product(WIDTHS, ROWS, PRODUCTS.items()):
        for cfg in dict.fromkeys(candidates(m, wk * c, residual)):
            yield c, m, name, cfg


def run(job, repeats: int = 0):
    """Launch one product under its tiles (compiling it); with repeats, its time a launch in us."""
    import torch

    from pipeline.runtime.kernels.linear_kernels import fused_linear
    c, m, name, cfg = job
    wn, wk, residual = PRODUCTS[name]
    n, k = wn * c, wk * c
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02
    x = torch.randn(m, k, device="cuda", dtype=torch.float16 if residual else torch.float32)  # as the step's inputs
    out = torch.zeros(m, n, device="cuda", dtype=torch.float32 if residual else torch.float16)
    options = dict(bias=torch.zeros(n, device="cuda", dtype=torch.float16), config=cfg, residual=residual)
    if not residual:
        options["ln"] = (w.float().sum(1), 1e-5)
    if name == "fc":
        options["gelu"] = True
    try:
        fused_linear(x, w, out, **options)
    except Exception as e:  # a tile the kernel refuses (shape rules) or cannot build
        return None if repeats else f"{type(e).__name__}"
    if not repeats:
        return "ok"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(20):
            fused_linear(x, w, out, **options)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (20 * repeats)


def main():
    todo = list(jobs())
    with multiprocessing.get_context("spawn").Pool(min(14, os.cpu_count() or 1)) as pool:
        built = pool.map(run, todo, chunksize=4)
    print(f"{len(todo)} kernels, {sum(b == 'ok' for b in built)} built")
    best = {}
    for job, b in zip(todo, built):
        if b != "ok":
            continue
        us = run(job, repeats=10)
        key = job[:3]
        best.setdefault(key, {"now": us, "all": []})["all"].append((us, job[3]))
    for (c, m, name), found in best.items():
        us, cfg = min(found["all"], key=lambda t: t[0])
        print(f"width {c} rows {m} {name}: now {found['now']:.2f} us, best {us:.2f} us {cfg}")


if __name__ == "__main__":
    main()
