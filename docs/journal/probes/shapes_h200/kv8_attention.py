"""Would a one-byte KV cache pay at 64 rows (#50, #51)? At 64 rows attention is the largest share
of a step at every large shape (gpt2-xl 24.7 us a layer of 58, its cache read at 3.2 TB/s:
performance.md, "the layer norms apart"), and its bytes are the cache's.

decode_attention alone, as shipped (attention_config), at slot 191 of 256, batch 1 / 8 / 64, each
shape's heads, over caches in fp16, fp8 (e4m3) and int8: the kernel converts what it loads to fp32,
so it runs any of them unchanged (int8 here without the scales a real int8 cache needs: one more
multiply a slot on the score and on the probability, so this is its lower bound). Each timed in a
CUDA graph of 20 launches cycling through enough caches (>= 200 MB) that none is still in L2 -> us
a launch and the ratio to fp16's; and fp8's output against fp16's over the same caches (relative
error, random caches of unit scale).
python3 docs/journal/probes/shapes_h200/kv8_attention.py [preset ...]"""

import json
import os
import sys

import torch
from graph_timing import graph_us

from pipeline.runtime.kernels.decode_attention import decode_attention
from pipeline.runtime.kernels.tiles import attention_partials

HEADS = {"gpt2": 12, "gpt2-medium": 16, "gpt2-large": 20, "gpt2-xl": 25}
PRESETS = sys.argv[1:] or list(HEADS)
BATCHES = (1, 8, 64)
CACHES = {"fp16": torch.float16, "fp8": torch.float8_e4m3fn, "int8": torch.int8}
LENGTH, D, SLOT = 256, 64, 191


def attention(heads: int, batch: int, dtype: torch.dtype, repeats: int) -> tuple[float, torch.Tensor]:
    """(us a launch, the output over the first cache copy) for caches of dtype."""
    size = batch * heads * LENGTH * D * 2 * dtype.itemsize
    copies = max(1, -(-200_000_000 // size))
    generator = torch.Generator("cuda").manual_seed(0)
    unit = [(torch.randn(batch, heads, LENGTH, D, device="cuda", generator=generator),
             torch.randn(batch, heads, LENGTH, D, device="cuda", generator=generator)) for _ in range(copies)]
    if dtype == torch.int8:  # a stand-in of int8's range: the timing is what counts here
        caches = [tuple((c * 40).clamp(-127, 127).to(dtype) for c in pair) for pair in unit]
    else:
        caches = [tuple(c.to(dtype) for c in pair) for pair in unit]
    del unit
    q = torch.randn(batch, heads * D, device="cuda", generator=generator).half()
    out = torch.empty_like(q)
    mask = torch.ones(batch, LENGTH, dtype=torch.bool, device="cuda")
    slot = torch.tensor(SLOT, device="cuda")
    partial = torch.empty(attention_partials(batch, heads, D), device="cuda")
    arrivals = torch.zeros(batch, heads, dtype=torch.int32, device="cuda")

    def launch(i: int) -> None:
        decode_attention(q, *caches[i % copies], mask, slot, out, partial, arrivals)
    launch(0)
    first = out.float().clone()
    return graph_us(launch, 20, repeats), first


def main() -> None:
    rows = []
    for preset in PRESETS:
        for batch in BATCHES:
            times, outputs = {}, {}
            for name, dtype in CACHES.items():
                times[name], outputs[name] = attention(HEADS[preset], batch, dtype, repeats=50)
            error = ((outputs["fp8"] - outputs["fp16"]).norm() / outputs["fp16"].norm()).item()
            rows.append({"preset": preset, "batch": batch, **{f"{k}_us": round(v, 2) for k, v in times.items()},
                         "fp8_rel_error": error})
            print(f"{preset:12} b{batch:<3} fp16 {times['fp16']:7.2f} us  fp8 {times['fp8']:7.2f} "
                  f"({times['fp8'] / times['fp16']:.2f}x)  int8 {times['int8']:7.2f} "
                  f"({times['int8'] / times['fp16']:.2f}x)  fp8 error {error:.1e}", flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "kv8_attention.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
