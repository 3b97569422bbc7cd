"""Tiles for the layer-norm products (QKV, fc) at 8 and 64 rows, now that their tiles may split K
and gather the slices before the epilogue (fused_linear's slices): each (width, rows, product) timed
alone at every GPT-2 width under linear_config's tiles and a grid of others, split and unsplit, fp16
weights (and int8 at 64 rows), cycling through enough copies of the weights (>= 150 MB) that none is
still in the 50 MB L2 when it comes round again -> one line each, and the best tiles as JSON
(argument 1, default /tmp/gather_best.json) for gather_ab.py.
python3 docs/journal/probes/shapes_h200/gather_sweep.py [out.json]
Runs on the tree of commit 80b455b: the gathering did not win and was taken out again
(docs/journal/performance.md, "the layer norms apart")."""

import itertools
import json
import sys

from graph_timing import graph_us, sweep_times

WIDTHS = (768, 1024, 1280, 1600)
ROWS = (8, 64)
PRODUCTS = {"qkv": 3, "fc": 4}  # n in widths; k is the width


def candidates(m: int, n: int, k: int, narrow: bool):
    from pipeline.runtime.kernels.triton_kernels import LinearConfig, linear_config
    yield linear_config(m, n, k, False, narrow)
    if m <= 16:
        grid = itertools.product((16,), (32, 64, 128), (64, 128), (1, 2, 3, 4, 5, 6, 8), (3,))
    else:
        grid = itertools.product((32, 64), (32, 64, 128), (128 if k % 128 == 0 else 64,), (1, 2, 3, 4, 5, 6, 8), (3, 4))
    for bm, bn, bk, split, stages in grid:
        if k % (split * bk) == 0:
            yield LinearConfig(bm, bn, bk, split, 4, stages)


def jobs():
    for c, m, name in itertools.product(WIDTHS, ROWS, PRODUCTS):
        for dtype in ("fp16", "int8") if m > 16 else ("fp16",):
            for cfg in dict.fromkeys(candidates(m, PRODUCTS[name] * c, c, dtype == "int8")):
                yield c, m, name, dtype, cfg


def run(job, repeats: int = 0):
    """Launch one product under its tiles (compiling it); with repeats, its time a launch in us."""
    import torch

    from pipeline.runtime.kernels.triton_kernels import fused_linear, gather_workspace, quantize_rows
    c, m, name, dtype, cfg = job
    n, k = PRODUCTS[name] * c, c
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02
    sums, scale = w.float().sum(1), None
    if dtype == "int8":
        w, scale = quantize_rows(w)
    copies = max(1, -(-150 * 2**20 // w.nbytes)) if repeats else 1
    weights = [w] + [w.clone() for _ in range(copies - 1)]
    x = torch.randn(m, k, device="cuda")  # the residual stream, fp32
    elements, tiles = gather_workspace(m, n, k, config=cfg)
    slices = (torch.empty(max(1, elements), device="cuda"), torch.zeros(max(1, tiles), device="cuda", dtype=torch.int32))
    options = dict(bias=torch.zeros(n, device="cuda", dtype=torch.float16), config=cfg, scale=scale,
                   ln=(sums, 1e-5), gelu=name == "fc", slices=slices)
    out = torch.zeros(m, n, device="cuda", dtype=torch.float16)
    try:
        fused_linear(x, w, out, **options)
    except Exception as e:  # a tile the kernel refuses (shape rules) or cannot build
        return None if repeats else f"{type(e).__name__}"
    if not repeats:
        return "ok"
    return graph_us(lambda i: fused_linear(x, weights[i % copies], out, **options), max(20, copies), repeats)


def main():
    found = {}
    for job, us in sweep_times(run, list(jobs()), repeats=5).items():
        found.setdefault(job[:4], []).append((us, job[4]))
    best = {}
    for (c, m, name, dtype), times in found.items():
        us, cfg = min(times, key=lambda t: t[0])
        unsplit = min((t for t in times if t[1].split_k == 1), key=lambda t: t[0])
        best[f"{c} {m} {name} {dtype}"] = [cfg.block_m, cfg.block_n, cfg.block_k, cfg.split_k, cfg.warps, cfg.stages]
        print(f"width {c} rows {m} {name} {dtype}: now {times[0][0]:.2f} us, best unsplit {unsplit[0]:.2f}, "
              f"best {us:.2f} us {tuple(best[f'{c} {m} {name} {dtype}'])}", flush=True)
    with open(sys.argv[1] if len(sys.argv) > 1 else "/tmp/gather_best.json", "w") as f:
        json.dump(best, f)


if __name__ == "__main__":
    main()
