"""Why the one-byte weights' left-operand tiles, faster alone at 64 rows, did not shorten int8-wo's
greedy step (#51; performance.md, "weight bytes in flight"): the QKV and fc products at 64 rows under
the shipped tile and under weights-left tiles (64 x 64, 128-wide K tiles 4 or 6 deep, or 256-wide 3
deep; the norms then apart at every width), fp16 as shipped beside them. Each variant: the step at batch 64 with programmatic dependent
launch on (as shipped; step_ab.py's timing, two rounds), and once with it off under the profiler,
each kind of launch's own time a layer (step_breakdown.py's kernel_shares).
python3 docs/journal/probes/int8_h200/left_step.py [preset ...]"""

import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "shapes_h200"))
from graph_timing import open_triton  # noqa: E402
from step_ab import step_ms  # noqa: E402
from step_breakdown import kernel_shares  # noqa: E402

from pipeline.config import PRESETS  # noqa: E402
from pipeline.runtime.generate import Generator  # noqa: E402
from pipeline.runtime.kernels import tiles as tile_tables  # noqa: E402
from pipeline.runtime.kernels.tiles import LinearConfig  # noqa: E402
from pipeline.runtime.sampling import Sampling  # noqa: E402
from pipeline.runtime.static import triton_backend  # noqa: E402

SHIPPED, SHIPPED_APART = tile_tables.linear_config, triton_backend.layer_norms_apart
LEFT = {"left 128x4": LinearConfig(64, 64, 128, stages=4, weights_left=True),
        "left 128x6": LinearConfig(64, 64, 128, stages=6, weights_left=True),
        "left 256x3": LinearConfig(64, 64, 256, stages=3, weights_left=True)}


def rule(tile: LinearConfig | None):
    def tiles(m, n, k, residual, narrow=False, fp32=False):
        if tile and narrow and m > 16 and not residual and n <= 8192:  # QKV and fc at 64 rows
            return tile
        return SHIPPED(m, n, k, residual, narrow, fp32)
    return tiles


def profiled(model, precision: str) -> str:
    backend = open_triton(model, precision)
    backend.pdl_capable = False  # each launch's time its own
    prompts = torch.randint(0, 50000, (64, 128)).numpy()
    generator, steps = Generator(backend), Sampling(max_new_tokens=32, stop_tokens=())
    generator.generate(prompts, steps)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        generator.generate(prompts, steps)
        torch.cuda.synchronize()
    return kernel_shares(prof, backend.net.n_layer)


def main() -> None:
    variants = {"fp16": ("fp16", None), "int8 shipped": ("int8-wo", None)}
    variants.update({f"int8 {name}": ("int8-wo", tile) for name, tile in LEFT.items()})
    for preset in sys.argv[1:] or ["gpt2-medium", "gpt2-xl"]:
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = GPT2LMHeadModel(GPT2Config(**PRESETS[preset].get("model", {}))).half().eval()
        model = model.cpu()
        for round_ in (1, 2):
            for name, (precision, tile) in variants.items():
                tile_tables.linear_config = rule(tile)
                # a 64-row tile over normalised x, as fp16's from 1,024 wide: the fused norm's statistics
                # over 64 rows would not fit its registers
                triton_backend.layer_norms_apart = (lambda m, width, narrow=False: m > 16) if tile else SHIPPED_APART
                try:
                    backend = open_triton(model, precision)
                    line = f"{preset} {name} {round_}: b64 step {step_ms(backend, 64):.3f} ms"
                    del backend
                    if round_ == 1:
                        line += "; pdl off: " + profiled(model, precision)
                except Exception as e:  # a tile that does not fit shared memory: say so, go on
                    line = f"{preset} {name} {round_}: {type(e).__name__}: {str(e)[:120]}"
                print(line, flush=True)
                torch.cuda.empty_cache()
        tile_tables.linear_config, triton_backend.layer_norms_apart = SHIPPED, SHIPPED_APART
        del model


if __name__ == "__main__":
    main()
