"""Tiles for one-byte weights (#51): each decode product of a layer and the LM head at every GPT-2
width (768 to 1,600) and 1 / 8 / 64 rows, timed alone under a grid of tiles with int8 weights, with
fp8 (e4m3) weights at 768 and 1,600 (1 and 64 rows), and with fp16 weights under the tiles linear_config picks (the
baseline). Each timing cycles through enough copies of the weights (>= 150 MB) that none is still in
the 50 MB L2 when it comes round again, as in a real step; a CUDA graph of those launches, replayed.
One line each: the dtype's time under linear_config's tiles, its best and those tiles, and fp16's.
(`artifacts/results/int8_h200/weight_sweep.txt` was made before linear_config had one-byte tiles
and before int8 was converted by its bits: "now" there is fp16's tiles, int8 by a convert a weight.)
python3 docs/journal/probes/int8_h200/weight_sweep.py"""

import itertools
import multiprocessing
import os

WIDTHS = (768, 1024, 1280, 1600)
FP8_WIDTHS = (768, 1600)
ROWS = (1, 8, 64)
VOCAB = 50257
# n, k in widths (the head's n is the vocabulary), residual
PRODUCTS = {"qkv": (3, 1, False), "proj": (1, 1, True), "fc": (4, 1, False), "fc2": (1, 4, True), "head": (0, 1, False)}


def shape(c: int, name: str) -> tuple[int, int, bool]:
    wn, wk, residual = PRODUCTS[name]
    return (wn * c if wn else VOCAB), wk * c, residual


def candidates(m: int, n: int, k: int, residual: bool, narrow: bool):
    from pipeline.runtime.kernels.tiles import LinearConfig, linear_config
    yield linear_config(m, n, k, residual, narrow)
    splits = [s for s in (1, 2, 4, 5, 6, 8) if k % s == 0 and k // s >= 64] if residual else [1]
    if m == 1:
        for bn, split, warps in itertools.product((4, 8, 16, 32), splits, (1, 2, 4)):
            if split == 1 or warps > 1:
                yield LinearConfig(1, bn, 0, split, warps)
        return
    block_ms = (16,) if m <= 16 else (16, 32, 64)
    block_ns = (32, 64, 128, 256) if n > 8192 else (32, 64, 128)
    block_ks = (64, 128) if m <= 16 else (128 if k % 128 == 0 else 64,)  # batch 64: the widest that divides K
    for bm, bn, bk, split, stages in itertools.product(block_ms, block_ns, block_ks, splits, (3, 4)):
        if k % (split * bk) == 0 and (stages == 3 or not residual):
            yield LinearConfig(bm, bn, bk, split, 4, stages)


def jobs():
    for c, m, name in itertools.product(WIDTHS, ROWS, PRODUCTS):
        n, k, residual = shape(c, name)
        yield c, m, name, "fp16", next(candidates(m, n, k, residual, False))
        for dtype in ("int8", "fp8") if c in FP8_WIDTHS and m != 8 else ("int8",):
            for cfg in dict.fromkeys(candidates(m, n, k, residual, True)):
                yield c, m, name, dtype, cfg


def run(job, repeats: int = 0):
    """Launch one product under its tiles (compiling it); with repeats, its time a launch in us."""
    import torch

    from pipeline.int8_weights import quantize_rows
    from pipeline.runtime.kernels.linear_kernels import fused_linear
    from pipeline.runtime.kernels.tiles import head_normalized_apart
    c, m, name, dtype, cfg = job
    n, k, residual = shape(c, name)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02
    scale = None
    if dtype != "fp16":
        w, scale = quantize_rows(w, torch.int8 if dtype == "int8" else torch.float8_e4m3fn)
    copies = max(1, -(-150 * 2**20 // w.nbytes)) if repeats else 1
    weights = [w] + [w.clone() for _ in range(copies - 1)]
    x = torch.randn(m, k, device="cuda", dtype=torch.float16 if residual else torch.float32)  # as the step's inputs
    options = dict(bias=torch.zeros(n, device="cuda", dtype=torch.float16), config=cfg, residual=residual, scale=scale)
    out = torch.zeros(m, n, device="cuda", dtype=torch.float32 if residual else torch.float16)
    if name == "head":  # as a greedy step's: the row maxima only
        partials = -(-n // cfg.block_n)
        options["argmax"] = (torch.empty(m, partials, device="cuda"),
                             torch.empty(m, partials, device="cuda", dtype=torch.int32))
        out = None
    if not residual and not (name == "head" and head_normalized_apart(m)):
        options["ln"] = (w.float().sum(1), 1e-5)
    if name == "fc":
        options["gelu"] = True
    try:
        fused_linear(x, w, out, **options)
    except Exception as e:  # a tile the kernel refuses (shape rules) or cannot build
        return None if repeats else f"{type(e).__name__}"
    if not repeats:
        return "ok"
    launches = max(20, copies)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(launches):
            fused_linear(x, weights[i % copies], out, **options)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (launches * repeats)


def main():
    todo = list(jobs())
    with multiprocessing.get_context("spawn").Pool(min(15, os.cpu_count() or 1)) as pool:
        built = pool.map(run, todo, chunksize=4)
    print(f"{len(todo)} kernels, {sum(b == 'ok' for b in built)} built")
    found = {}
    for job, b in zip(todo, built):
        if b == "ok":
            found.setdefault(job[:4], []).append((run(job, repeats=5), job[4]))
    for (c, m, name, dtype), times in found.items():
        if dtype == "fp16":
            continue
        fp16 = found.get((c, m, name, "fp16"), [(float("nan"), None)])[0][0]
        us, cfg = min(times, key=lambda t: t[0])
        print(f"width {c} rows {m} {name} {dtype}: now {times[0][0]:.2f} us, best {us:.2f} us, fp16 now {fp16:.2f} us "
              f"{cfg}", flush=True)


if __name__ == "__main__":
    main()
