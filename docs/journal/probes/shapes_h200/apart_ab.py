"""The QKV and fc products at 8 and 64 rows over x normalised by a launch of its own (as the LM head
above 16 rows) against the layer norm fused into their tiles, then the whole greedy step A/B.

Part 1, alone (fp16 and int8 weights, every GPT-2 width, weights cycled past the 50 MB L2): the
shipped fused product (fp32 x, its norm in the tiles), the best tiles over fp16 x with no norm, and
the layer_norm launch. Part 2, the step (random weights, step_ab.py's timing, alternated twice):
shipped; attention's shares from step_breakdown.py's sweep (one-warp programs at 1-16 rows; above
16 as many of 4 / 2 / 1 splits as keep batch x heads x splits in one wave of 3,300 programs); and
those shares with the norms apart wherever part 1 found the two apart products and two norm
launches faster than the two fused products, under part 1's best tiles.
python3 docs/journal/probes/shapes_h200/apart_ab.py [preset ...]
Run on the tree of commit 80b455b, where "shipped" was the rules before this probe's findings."""

import itertools
import os
import sys

from graph_timing import graph_us, open_triton, sweep_times

WIDTHS = (768, 1024, 1280, 1600)
ROWS = (8, 64)
PRODUCTS = {"qkv": 3, "fc": 4}  # n in widths; k is the width


def candidates(m: int, k: int):
    from pipeline.runtime.kernels.tiles import LinearConfig
    if m <= 16:
        grid = itertools.product((16,), (32, 64, 128), (64, 128), (3,))
    else:
        grid = itertools.product((16, 32, 64), (32, 64, 128), (128 if k % 128 == 0 else 64,), (3, 4))
    for bm, bn, bk, stages in grid:
        yield LinearConfig(bm, bn, bk, 1, 4, stages)


def jobs():
    from pipeline.runtime.kernels.tiles import linear_config
    for c, m, name in itertools.product(WIDTHS, ROWS, PRODUCTS):
        for dtype in ("fp16", "int8"):
            yield c, m, name, dtype, True, linear_config(m, PRODUCTS[name] * c, c, False, dtype == "int8")
            for cfg in candidates(m, c):
                yield c, m, name, dtype, False, cfg


def run(job, repeats: int = 0):
    """Launch one product (fused: its norm in the tiles, fp32 x; else fp16 x, no norm) under its
    tiles, compiling it; with repeats, its time a launch in us."""
    import torch

    from pipeline.int8_weights import quantize_rows
    from pipeline.runtime.kernels.linear_kernels import fused_linear
    c, m, name, dtype, fused, cfg = job
    n, k = PRODUCTS[name] * c, c
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02
    sums, scale = w.float().sum(1), None
    if dtype == "int8":
        w, scale = quantize_rows(w)
    copies = max(1, -(-150 * 2**20 // w.nbytes)) if repeats else 1
    weights = [w] + [w.clone() for _ in range(copies - 1)]
    x = torch.randn(m, k, device="cuda", dtype=torch.float32 if fused else torch.float16)
    options = dict(bias=torch.zeros(n, device="cuda", dtype=torch.float16), config=cfg, scale=scale,
                   gelu=name == "fc", **({"ln": (sums, 1e-5)} if fused else {}))
    out = torch.zeros(m, n, device="cuda", dtype=torch.float16)
    try:
        fused_linear(x, w, out, **options)
    except Exception as e:  # a tile the kernel refuses (shape rules) or cannot build
        return None if repeats else f"{type(e).__name__}"
    if not repeats:
        return "ok"
    return graph_us(lambda i: fused_linear(x, weights[i % copies], out, **options), max(20, copies), repeats)


def norm_us(m: int, c: int) -> float:
    import torch

    from pipeline.runtime.kernels.linear_kernels import layer_norm
    x, out = torch.randn(m, c, device="cuda"), torch.empty(m, c, device="cuda", dtype=torch.float16)
    layer_norm(x, out, 1e-5)
    return graph_us(lambda i: layer_norm(x, out, 1e-5), 20, 20)


def sweep():
    """-> {(width, rows, dtype): (apart pays, {product: best apart tiles})}."""
    found = {}
    for job, us in sweep_times(run, list(jobs()), repeats=5).items():
        found.setdefault(job[:5], []).append((us, job[5]))
    chosen = {}
    for c, m, dtype in itertools.product(WIDTHS, ROWS, ("fp16", "int8")):
        norm = norm_us(m, c)
        fused = {p: found[(c, m, p, dtype, True)][0][0] for p in PRODUCTS}
        apart = {p: min(found[(c, m, p, dtype, False)], key=lambda t: t[0]) for p in PRODUCTS}
        pays = sum(a[0] for a in apart.values()) + 2 * norm < sum(fused.values())
        chosen[(c, m, dtype)] = (pays, {p: a[1] for p, a in apart.items()})
        print(f"width {c} rows {m} {dtype}: fused qkv {fused['qkv']:.2f} fc {fused['fc']:.2f} | apart qkv "
              f"{apart['qkv'][0]:.2f} fc {apart['fc'][0]:.2f} + norm {norm:.2f} x 2 | "
              f"{'apart' if pays else 'fused'} {tuple(apart['qkv'][1].__dict__.values())} "
              f"{tuple(apart['fc'][1].__dict__.values())}", flush=True)
    return chosen


def step_ab(chosen, presets):
    import torch
    from step_ab import step_ms
    from transformers import GPT2Config, GPT2LMHeadModel

    from pipeline.config import PRESETS as SHAPES
    from pipeline.runtime.kernels import tiles as tile_tables
    from pipeline.runtime.kernels.tiles import AttentionConfig
    from pipeline.runtime.static import triton_backend
    tiles, shares, apart = tile_tables.linear_config, tile_tables.attention_config, tile_tables.layer_norms_apart

    def rows(m):
        return 8 if m <= 16 else 64

    def apart_rule(m, width, narrow=False):
        return m > 1 and chosen[(width, rows(m), current[0])][0]

    def apart_tiles(m, n, k, residual, narrow=False, fp32=False):
        product = {3 * k: "qkv", 4 * k: "fc"}.get(n)
        if m > 1 and product and not residual and apart_rule(m, k):
            return chosen[(k, rows(m), current[0])][1][product]
        return tiles(m, n, k, residual, narrow, fp32)

    def shares_for(heads):
        def rule(batch, filled=False, heads=heads):
            if filled:
                return shares(batch, filled, heads)
            if batch <= 16:
                return AttentionConfig(splits=8, warps=1, block_t=32 if batch <= 4 else 64, registers=80)
            return AttentionConfig(next((s for s in (4, 2) if batch * heads * s <= 3300), 1), 1, 16, 80)
        return rule

    def use(linear, attention, norms):
        tile_tables.linear_config, tile_tables.layer_norms_apart = linear, norms
        triton_backend.layer_norms_apart = norms
        tile_tables.attention_config = triton_backend.attention_config = attention

    current = ["fp16"]
    for preset in presets:
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = GPT2LMHeadModel(GPT2Config(**SHAPES[preset].get("model", {}))).half().eval()
        model = model.cpu()
        variants = {"shipped": (tiles, shares, apart), "shares": (tiles, shares_for(model.config.n_head), apart),
                    "shares+apart": (apart_tiles, shares_for(model.config.n_head), apart_rule)}
        for round_ in (1, 2):
            for precision in ("fp16", "int8-wo"):
                current[0] = "int8" if precision == "int8-wo" else "fp16"
                for name, rules in variants.items():
                    use(*rules)
                    backend = open_triton(model, precision)
                    times = [step_ms(backend, b) for b in (1, 8, 64)]
                    print(f"{preset} {precision} {name} {round_}: " + " / ".join(f"{t:.3f}" for t in times), flush=True)
                    del backend
                    torch.cuda.empty_cache()
        use(tiles, shares, apart)
        del model


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # step_ab beside this file
    step_ab(sweep(), sys.argv[1:] or ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"])
