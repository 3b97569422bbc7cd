"""Where a triton fp16 greedy step goes at gpt2-medium / large / xl (#50), and attention's shares.

Part 1, the step: random weights, prompt 128, greedy steps replayed from the CUDA graph under
torch.profiler; each kernel named by its place in the layer (the fused linear before attention is
the QKV product, the three after it proj / fc / fc2, the one before the advance the LM head) ->
us a step per kind, their sum, and the step's wall time with programmatic dependent launch off
(so that each kernel's time is its own, not a wait on the one before) and on (as shipped).
Part 2, attention alone: decode_attention at slot 191 of 256 under a grid of AttentionConfig,
cycling through enough caches (>= 200 MB) that none is still in L2, in a CUDA graph of 20 launches
-> the shipped config's us, the best three.
Part 1 runs each precision of $PRECISIONS (default fp16; e.g. PRECISIONS=fp16,int8-wo), part 2 only
where $SWEEP is not 0.
python3 docs/journal/probes/shapes_h200/step_breakdown.py [preset ...]"""

import collections
import itertools
import os
import sys
import time

from graph_timing import graph_us, open_triton, sweep_times

PRESETS = sys.argv[1:] or ["gpt2-medium", "gpt2-large", "gpt2-xl"]
HEADS = {"gpt2": 12, "gpt2-medium": 16, "gpt2-large": 20, "gpt2-xl": 25}
BATCHES = (1, 8, 64)
PRECISIONS = os.environ.get("PRECISIONS", "fp16").split(",")
KINDS = ("qkv", "attention", "proj", "fc", "fc2", "head_ln", "head", "advance")


def breakdown(preset: str, precision: str) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from pipeline.config import PRESETS as SHAPES
    from pipeline.runtime.generate import Generator
    from pipeline.runtime.sampling import Sampling

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = GPT2LMHeadModel(GPT2Config(**SHAPES[preset].get("model", {}))).half().eval()
    model = model.cpu()
    for pdl in (False, True):
        backend = open_triton(model, precision)
        backend.pdl_capable = pdl
        for batch in BATCHES:
            prompts = torch.randint(0, 50000, (batch, 128)).numpy()
            generator = Generator(backend)
            steps = Sampling(max_new_tokens=64, stop_tokens=())
            generator.generate(prompts, steps)  # captures
            torch.cuda.synchronize()
            start = time.perf_counter()
            generator.generate(prompts, steps)
            torch.cuda.synchronize()
            wall = time.perf_counter() - start
            one = Sampling(max_new_tokens=1, stop_tokens=())
            start = time.perf_counter()
            generator.generate(prompts, one)
            torch.cuda.synchronize()
            step_us = (wall - (time.perf_counter() - start)) / 63 * 1e6
            line = f"{preset} {precision} b{batch} pdl {int(pdl)}: step {step_us:.1f} us"
            if not pdl:
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    generator.generate(prompts, steps)
                    torch.cuda.synchronize()
                line += "; " + kernel_shares(prof, backend.net.n_layer)
            print(line, flush=True)
        del backend
    del model
    torch.cuda.empty_cache()


def kernel_shares(prof, layers: int) -> str:
    """us a step per kind of decode launch, from the profiler's kernel records in start order."""
    names = {"_fused_linear_kernel": "linear", "_decode_attention_kernel": "attention",
             "_greedy_advance_kernel": "advance", "_layer_norm_kernel": "head_ln"}
    kernels = []
    for e in prof.events():
        kind = next((v for k, v in names.items() if k in e.name), None)
        if kind and e.device_type.name == "CUDA":
            kernels.append((e.time_range.start, kind, e.time_range.elapsed_us()))
    kernels.sort()
    total, since = collections.Counter(), 0
    for i, (_, kind, us) in enumerate(kernels):
        if kind == "linear":
            after = next((k for _, k, _ in kernels[i + 1:i + 2]), "advance")
            if after == "attention":
                kind = "qkv"
            elif after == "advance":
                kind = "head"
            else:
                kind = ("proj", "fc", "fc2")[min(since, 2)]
                since += 1
        elif kind == "attention":
            since = 0
        total[kind] += us
    steps = max(1, sum(1 for _, k, _ in kernels if k == "advance"))
    shares = " ".join(f"{k} {total[k] / steps:.1f}" for k in KINDS if total[k])
    per_layer = " ".join(f"{k} {total[k] / steps / layers:.2f}" for k in ("qkv", "attention", "proj", "fc", "fc2"))
    return f"kernels {sum(total.values()) / steps:.1f} us: {shares} | a layer: {per_layer}"


def configs(batch: int, heads: int):
    from pipeline.runtime.kernels.tiles import AttentionConfig, attention_config
    yield attention_config(batch, heads=heads)
    for splits, warps, block_t, registers in itertools.product((1, 2, 4, 8), (1, 2, 4), (16, 32, 64), (None, 80)):
        if registers is None or warps == 1:
            yield AttentionConfig(splits, warps, block_t, registers)


def jobs():
    for preset, batch in itertools.product(PRESETS, BATCHES):
        for cfg in dict.fromkeys(configs(batch, HEADS[preset])):
            yield HEADS[preset], batch, cfg


def attention_us(job, repeats: int = 0):
    """Launch attention under one config (compiling it); with repeats, its time a launch in us."""
    import torch

    from pipeline.runtime.kernels.decode_attention import decode_attention
    from pipeline.runtime.kernels.tiles import attention_partials
    heads, batch, cfg = job
    length, d = 256, 64
    size = batch * heads * length * d * 2 * 2
    copies = max(1, -(-200_000_000 // size)) if repeats else 1
    caches = [(torch.randn(batch, heads, length, d, device="cuda", dtype=torch.float16),
               torch.randn(batch, heads, length, d, device="cuda", dtype=torch.float16)) for _ in range(copies)]
    q = torch.randn(batch, heads * d, device="cuda", dtype=torch.float16)
    out = torch.empty_like(q)
    mask = torch.ones(batch, length, dtype=torch.bool, device="cuda")
    slot = torch.tensor(191, device="cuda")
    partial = torch.empty(attention_partials(batch, heads, d, cfg), device="cuda")
    arrivals = torch.zeros(batch, heads, dtype=torch.int32, device="cuda")

    def launch(i: int) -> None:
        decode_attention(q, *caches[i % copies], mask, slot, out, partial, arrivals, config=cfg)
    try:
        launch(0)
    except Exception as e:
        return None if repeats else type(e).__name__
    if not repeats:
        return "ok"
    return graph_us(launch, 20, repeats)


def sweep() -> None:
    times = collections.defaultdict(list)
    for job, us in sweep_times(attention_us, list(jobs()), repeats=20).items():
        times[job[:2]].append((us, job[2]))
    for (heads, batch), found in times.items():
        shipped, best = found[0][0], sorted(found, key=lambda f: f[0])[:3]
        print(f"attention {heads} heads b{batch}: shipped {shipped:.2f} us; best " +
              "; ".join(f"{us:.2f} {c.splits}/{c.warps}/{c.block_t}/{c.registers}" for us, c in best), flush=True)


if __name__ == "__main__":
    for preset, precision in itertools.product(PRESETS, PRECISIONS):
        breakdown(preset, precision)
    if os.environ.get("SWEEP") != "0":
        sweep()
