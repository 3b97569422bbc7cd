"""gpt2-medium's 64 rows with the layer norms apart under deep K tiles (#50): at 1,024 wide the
norms stayed fused in the QKV and fc tiles (apart bought 1% under the 64-wide K tiles 4 deep,
layer_norms_apart); deep_tiles.py found weight bytes in flight pacing the apart tiles at 1,600.

Part 1, alone (weights cycled past L2): the QKV and fc products at 1,024 wide and 64 rows, fp16 and
int8, fused as shipped against apart (x normalised in fp16) under deep_tiles.py's grid, and the
layer_norm launch. Part 2, the greedy step of gpt2-medium at batch 64 (two rounds): shipped against
the norms apart at 1,024 wide under part 1's best apart tiles.
python3 docs/journal/probes/int8_h200/apart_deep.py"""

import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deep_tiles  # noqa: E402
import weights_left  # noqa: E402
from graph_timing import graph_us, open_triton, sweep_times  # noqa: E402

WIDTH, ROWS = 1024, 64


def jobs():
    from pipeline.runtime.kernels.tiles import linear_config
    for name, dtype in itertools.product(("qkv", "fc"), ("fp16", "int8")):
        n, k, _ = weights_left.shape(WIDTH, name)
        yield WIDTH, ROWS, name, dtype, linear_config(ROWS, n, k, False, dtype == "int8"), False
        for cfg in deep_tiles.deep_tiles(k, False):
            yield WIDTH, ROWS, name, dtype, cfg, True


def sweep() -> dict:
    """-> {(product, dtype): best apart tiles}, each line: fused shipped, best apart, the norm launch."""
    import torch

    from pipeline.runtime.kernels.linear_kernels import layer_norm
    x, normed = torch.randn(ROWS, WIDTH, device="cuda"), torch.empty(ROWS, WIDTH, device="cuda", dtype=torch.float16)
    norm = graph_us(lambda i: layer_norm(x, normed, 1e-5), 20, 20)
    found = {}
    for job, us in sweep_times(weights_left.run, list(jobs()), repeats=5).items():
        found.setdefault(job[2:4], []).append((us, job[4], job[5]))
    chosen = {}
    for (name, dtype), times in found.items():
        fused = next(us for us, _, apart in times if not apart)
        us, cfg, _ = min((t for t in times if t[2]), key=lambda t: t[0])
        chosen[name, dtype] = cfg
        print(f"width {WIDTH} rows {ROWS} {name} {dtype}: fused {fused:.2f} us, apart {us:.2f} + norm {norm:.2f} "
              f"{tuple(cfg.__dict__.values())}", flush=True)
    return chosen


def step(chosen: dict) -> None:
    import torch
    from step_ab import step_ms
    from transformers import GPT2Config, GPT2LMHeadModel

    from pipeline.config import PRESETS
    from pipeline.runtime.kernels import tiles as tile_tables
    from pipeline.runtime.static import triton_backend
    tiles, apart = tile_tables.linear_config, tile_tables.layer_norms_apart

    def apart_rule(m, width, narrow=False):
        return apart(m, width, narrow) or (m > 16 and width == WIDTH)

    def apart_tiles(m, n, k, residual, narrow=False, fp32=False):
        name = {3 * k: "qkv", 4 * k: "fc"}.get(n)
        if m > 16 and k == WIDTH and name and not residual:
            return chosen[name, "int8" if narrow else "fp16"]
        return tiles(m, n, k, residual, narrow, fp32)

    def use(linear, norms):
        tile_tables.linear_config, tile_tables.layer_norms_apart = linear, norms
        triton_backend.layer_norms_apart = norms

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = GPT2LMHeadModel(GPT2Config(**PRESETS["gpt2-medium"]["model"])).half().eval()
    model = model.cpu()
    for round_, precision in itertools.product((1, 2), ("fp16", "int8-wo")):
        for variant, rules in (("shipped", (tiles, apart)), ("apart, deep tiles", (apart_tiles, apart_rule))):
            use(*rules)
            backend = open_triton(model, precision)
            print(f"gpt2-medium {precision} {variant} {round_}: ms a step at batch 64: {step_ms(backend, 64):.3f}", flush=True)
            del backend
            torch.cuda.empty_cache()
    use(tiles, apart)


if __name__ == "__main__":
    step(sweep())
