"""The triton greedy step of each shape (random weights) as shipped and with gather_sweep.py's best
tiles for the QKV and fc products (split K gathered where they won) and attention's shares from
step_breakdown.py's sweep (one-warp programs at 1-16 rows; above 16, as many of 4 / 2 / 1 splits as
keep batch x heads x splits programs in one wave of 3,300), fp16 and int8-wo, alternated twice in
one process -> ms a greedy step at batch 1 / 8 / 64 (step_ab.py's timing).
python3 docs/journal/probes/shapes_h200/gather_ab.py best.json [preset ...]"""

import json
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from pipeline.config import PRESETS
from pipeline.runtime.kernels import triton_kernels
from pipeline.runtime.kernels.triton_kernels import AttentionConfig, LinearConfig
from pipeline.runtime.static import triton_backend
from pipeline.runtime.static.triton_backend import TritonBackend

sys.path.insert(0, "docs/journal/probes/shapes_h200")  # step_ab beside this file
from step_ab import step_ms  # noqa: E402

with open(sys.argv[1]) as f:
    BEST = {key: LinearConfig(*value) for key, value in json.load(f).items()}
SHIPPED_TILES, SHIPPED_SHARES = triton_kernels.linear_config, triton_kernels.attention_config


def swept_tiles(m, n, k, residual, narrow=False):
    product = {3 * k: "qkv", 4 * k: "fc"}.get(n)
    key = f"{k} {8 if m <= 16 else 64} {product} {'int8' if narrow else 'fp16'}"
    if residual or m == 1 or key not in BEST:
        return SHIPPED_TILES(m, n, k, residual, narrow)
    return BEST[key]


def shares_for(heads):
    def shares(batch, filled=False):
        if filled:
            return SHIPPED_SHARES(batch, filled)
        if batch <= 16:
            return AttentionConfig(splits=8, warps=1, block_t=32 if batch <= 4 else 64, registers=80)
        splits = next((s for s in (4, 2) if batch * heads * s <= 3300), 1)
        return AttentionConfig(splits=splits, warps=1, block_t=16, registers=80)
    return shares


def use(tiles, shares):
    triton_kernels.linear_config = tiles
    triton_kernels.attention_config = triton_backend.attention_config = shares


for preset in sys.argv[2:] or ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"]:
    shape = PRESETS[preset].get("model", {})
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = GPT2LMHeadModel(GPT2Config(**shape)).half().eval()
    model = model.cpu()
    heads = model.config.n_head
    for round_ in (1, 2):
        for precision in ("fp16", "int8-wo"):
            for name, (tiles, shares) in {"shipped": (SHIPPED_TILES, SHIPPED_SHARES),
                                          "new": (swept_tiles, shares_for(heads))}.items():
                use(tiles, shares)
                backend = TritonBackend(model, precision, "cuda")
                times = [step_ms(backend, b) for b in (1, 8, 64)]
                print(f"{preset} {precision} {name} {round_}: " + " / ".join(f"{t:.3f}" for t in times), flush=True)
                del backend
                torch.cuda.empty_cache()
    use(SHIPPED_TILES, SHIPPED_SHARES)
    del model
