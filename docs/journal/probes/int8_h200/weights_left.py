"""The weights as the tensor-core product's left operand (LinearConfig.weights_left, #51): every decode
product of a layer and the LM head at every GPT-2 width, 8 and 64 rows, as the greedy step runs it
(the norms fused, or apart where layer_norms_apart / head_normalized_apart say), then the whole step.

Part 1, alone (weights cycled past the 50 MB L2): int8 weights under linear_config's tiles and under a
grid of weights-left tiles; fp16 under its tiles and, at 64 rows, the same grid. The best of each
goes to chosen.json in $OUT (or the folder given). Part 2, the greedy step (random weights,
step_ab.py's timing, two rounds): fp16 and int8-wo, each under linear_config and under the chosen tiles.
python3 docs/journal/probes/int8_h200/weights_left.py [sweep | step CHOSEN.json] [preset ...]"""

import itertools
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "shapes_h200"))
from graph_timing import graph_us, open_triton, sweep_times  # noqa: E402

WIDTHS = (768, 1024, 1280, 1600)
ROWS = (8, 64)
VOCAB = 50257
# n, k in widths (the head's n is the vocabulary), residual
PRODUCTS = {"qkv": (3, 1, False), "proj": (1, 1, True), "fc": (4, 1, False), "fc2": (1, 4, True), "head": (0, 1, False)}


def shape(c: int, name: str) -> tuple[int, int, bool]:
    wn, wk, residual = PRODUCTS[name]
    return (wn * c if wn else VOCAB), wk * c, residual


def product_of(n: int, k: int, residual: bool) -> str:
    if n > 8192:
        return "head"
    if residual:
        return "proj" if n == k else "fc2"
    return "qkv" if n == 3 * k else "fc"


def normalised_apart(m: int, c: int, name: str) -> bool:
    from pipeline.runtime.kernels.tiles import head_normalized_apart, layer_norms_apart
    return head_normalized_apart(m) if name == "head" else name in ("qkv", "fc") and layer_norms_apart(m, c)


def left_tiles(m: int, k: int, residual: bool):
    from pipeline.runtime.kernels.tiles import LinearConfig, _k_split
    block_k = 128 if k % 128 == 0 else 64
    splits = sorted({1, _k_split(k, block_k)[1]}) if residual else [1]
    for bm, bn, split, stages in itertools.product((16,) if m <= 16 else (32, 64), (64, 128), splits, (3, 4)):
        yield LinearConfig(bm, bn, block_k, split, 4, stages, weights_left=True)


def jobs():
    from pipeline.runtime.kernels.tiles import linear_config
    for c, m, name in itertools.product(WIDTHS, ROWS, PRODUCTS):
        n, k, residual = shape(c, name)
        for dtype in ("int8", "fp16"):
            yield c, m, name, dtype, linear_config(m, n, k, residual, dtype == "int8")
            if dtype == "int8" or m > 16:
                for cfg in left_tiles(m, k, residual):
                    yield c, m, name, dtype, cfg


def run(job, repeats: int = 0):
    """Launch one product as the step does (compiling it); with repeats, its time a launch in us. A
    sixth item in the job, where there is one, says whether x comes normalised apart."""
    import torch

    from pipeline.int8_weights import quantize_rows
    from pipeline.runtime.kernels.linear_kernels import fused_linear
    c, m, name, dtype, cfg, *apart = job
    n, k, residual = shape(c, name)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02
    sums, scale = w.float().sum(1), None
    if dtype == "int8":
        w, scale = quantize_rows(w)
    copies = max(1, -(-150 * 2**20 // w.nbytes)) if repeats else 1
    weights = [w] + [w.clone() for _ in range(copies - 1)]
    apart = apart[0] if apart else normalised_apart(m, c, name)
    x = torch.randn(m, k, device="cuda", dtype=torch.float16 if residual or apart else torch.float32)
    options = dict(bias=torch.zeros(n, device="cuda", dtype=torch.float16), config=cfg, residual=residual, scale=scale,
                   gelu=name == "fc", **({} if residual or apart else {"ln": (sums, 1e-5)}))
    out = torch.zeros(m, n, device="cuda", dtype=torch.float32 if residual else torch.float16)
    if name == "head":  # as a greedy step's: the row maxima only
        partials = -(-n // cfg.block_n)
        options["argmax"] = (torch.empty(m, partials, device="cuda"),
                             torch.empty(m, partials, device="cuda", dtype=torch.int32))
        out = None
    try:
        fused_linear(x, w, out, **options)
    except Exception as e:  # a tile the kernel refuses (shape rules) or cannot build
        return None if repeats else f"{type(e).__name__}"
    if not repeats:
        return "ok"
    return graph_us(lambda i: fused_linear(x, weights[i % copies], out, **options), max(20, copies), repeats)


def sweep(folder: str) -> None:
    found = {}
    for job, us in sweep_times(run, list(jobs()), repeats=5).items():
        found.setdefault(job[:4], []).append((us, job[4]))
    chosen = {}
    for (c, m, name, dtype), times in found.items():
        shipped, cfg = times[0]
        best, best_cfg = min(times, key=lambda t: t[0])
        fp16 = found[(c, m, name, "fp16")][0][0]
        chosen[f"{dtype} {c} {m} {name}"] = list(best_cfg.__dict__.values())
        print(f"width {c} rows {m} {name} {dtype}: shipped {shipped:.2f} us, best {best:.2f} {tuple(best_cfg.__dict__.values())}"
              f", fp16 shipped {fp16:.2f}", flush=True)
    with open(os.path.join(folder, "chosen.json"), "w") as f:
        json.dump(chosen, f, indent=0)


def step(chosen_path: str, presets: list[str]) -> None:
    import torch
    from step_ab import step_ms
    from transformers import GPT2Config, GPT2LMHeadModel

    from pipeline.config import PRESETS as SHAPES
    from pipeline.runtime.kernels import tiles as tile_tables
    from pipeline.runtime.kernels.tiles import LinearConfig
    with open(chosen_path) as f:
        chosen = json.load(f)
    shipped = tile_tables.linear_config

    def chosen_tiles(m, n, k, residual, narrow=False, fp32=False):
        name = product_of(n, k, residual)
        key = f"{'int8' if narrow else 'fp16'} {n if residual else k} {8 if m <= 16 else 64} {name}"
        return LinearConfig(*chosen[key]) if m > 1 and key in chosen else shipped(m, n, k, residual, narrow, fp32)

    for preset in presets:
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = GPT2LMHeadModel(GPT2Config(**SHAPES[preset].get("model", {}))).half().eval()
        model = model.cpu()
        for round_ in (1, 2):
            for precision, (rule_name, rule) in itertools.product(("fp16", "int8-wo"), (("shipped", shipped),
                                                                                      ("chosen", chosen_tiles))):
                tile_tables.linear_config = rule
                backend = open_triton(model, precision)
                times = [step_ms(backend, b) for b in (8, 64)]
                print(f"{preset} {precision} {rule_name} {round_}: ms a step at batch 8 / 64: "
                      + " / ".join(f"{t:.3f}" for t in times), flush=True)
                del backend
                torch.cuda.empty_cache()
        tile_tables.linear_config = shipped
        del model


if __name__ == "__main__":
    if sys.argv[1] == "sweep":
        sweep(sys.argv[2] if len(sys.argv) > 2 else os.environ.get("OUT", "."))
    else:
        step(sys.argv[2], sys.argv[3:] or ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"])
