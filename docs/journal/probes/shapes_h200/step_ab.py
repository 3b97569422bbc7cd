"""The triton fp16 decode step of gpt2-medium / large / xl (random weights) under two tile rules in
one process, alternated twice: `linear_config` of the tree before (unpacked in .ab/old by
`git archive <commit> pipeline | tar -x -C .ab/old`) and of this one -> ms a greedy step at batch
1 / 8 / 64 (prompt 128, 128 steps of CUDA-graph replays, after a warm-up generation).
python3 docs/journal/probes/shapes_h200/step_ab.py [preset ...]
With --int8 first: the int8-wo step instead, under fp16's tiles and under the one-byte weights' own
(linear_config's narrow); with --int8-vs-fp16, the fp16 step against the int8-wo one under this
tree's tiles (neither needs an old tree); with --attention, fp16 under the attention shares before
the walk that loads each block where it is used (batch x heads > 768 at 64 rows: 4 splits up to
1,024, else 2, each fetching one 16-slot block ahead) and under attention_config as it is."""

import importlib.util
import sys
import time

import torch
from graph_timing import open_triton
from transformers import GPT2Config, GPT2LMHeadModel

from pipeline.config import PRESETS
from pipeline.runtime.generate import Generator
from pipeline.runtime.kernels import tiles as tile_tables
from pipeline.runtime.sampling import Sampling
from pipeline.runtime.static import triton_backend
from pipeline.runtime.static.triton_backend import TritonBackend

GREEDY = Sampling(max_new_tokens=128, stop_tokens=())


def step_ms(backend: TritonBackend, batch: int) -> float:
    prompts = torch.randint(0, 50000, (batch, 128)).numpy()
    generator = Generator(backend)
    generator.generate(prompts, GREEDY)  # captures this batch's graphs
    torch.cuda.synchronize()
    start = time.perf_counter()
    generator.generate(prompts, GREEDY)
    torch.cuda.synchronize()
    whole = time.perf_counter() - start
    one = Sampling(max_new_tokens=1, stop_tokens=())
    start = time.perf_counter()
    generator.generate(prompts, one)  # the prefill alone, taken off
    torch.cuda.synchronize()
    return (whole - (time.perf_counter() - start)) / 127 * 1e3


def main() -> None:
    # each variant: (precision, tile rule); the rules are linear_config's, swapped in by name
    mode = sys.argv[1] if sys.argv[1:2] in (["--int8"], ["--int8-vs-fp16"], ["--attention"]) else None
    tiles = tile_tables.linear_config
    shares = tile_tables.attention_config
    if mode == "--attention":
        def by_hand(batch, heads, filled=False):
            if filled or batch <= 16:
                return shares(batch, heads, filled)
            return tile_tables.AttentionConfig(4 if batch * heads <= 1024 else 2, 1, 16, 80)
        variants = {"by hand": ("fp16", tiles, by_hand), "loaded where used": ("fp16", tiles, shares)}
    elif mode == "--int8":
        variants = {"fp16 tiles": ("int8-wo", lambda m, n, k, residual, narrow=False, fp32=False:
                                   tiles(m, n, k, residual, fp32=fp32), shares),
                    "one-byte tiles": ("int8-wo", tiles, shares)}
    elif mode == "--int8-vs-fp16":
        variants = {"fp16": ("fp16", tiles, shares), "int8-wo": ("int8-wo", tiles, shares)}
    else:
        spec = importlib.util.spec_from_file_location("old_kernels", ".ab/old/pipeline/runtime/kernels/tile_tables.py")
        old = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = old  # dataclasses look their module up
        spec.loader.exec_module(old)
        # an older tree's rule takes no fp32 (the current kernels' fused_linear passes it)
        variants = {"old": ("fp16", lambda *a, fp32=False, **kw: old.linear_config(*a, **kw), shares),
                    "new": ("fp16", tiles, shares)}
    for preset in sys.argv[1 + bool(mode):] or ["gpt2-medium", "gpt2-large", "gpt2-xl"]:
        shape = PRESETS[preset].get("model", {})  # gpt2: the defaults
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = GPT2LMHeadModel(GPT2Config(**shape)).half().eval()
        model = model.cpu()  # the backends take a loaded (host) model and copy what they need
        for round_ in (1, 2):
            for name, (precision, rule, attention) in variants.items():
                tile_tables.linear_config = rule  # fused_linear reads the module's name at each call
                tile_tables.attention_config = triton_backend.attention_config = attention
                backend = open_triton(model, precision)
                times = [step_ms(backend, b) for b in (1, 8, 64)]
                print(f"{preset} {name} {round_}: ms a step at batch 1 / 8 / 64: " + " / ".join(f"{t:.3f}" for t in times),
                      flush=True)
                del backend
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
