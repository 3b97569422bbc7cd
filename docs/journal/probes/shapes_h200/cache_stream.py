"""How fast can anything read decode attention's bytes at 64 rows (#50)? attention_mma.py found
neither tensor cores nor a walk without its block fetched ahead much faster than the shipped attention (1.7-1.9 TB/s at
64 rows), and kv8_attention.py one-byte caches no faster: so is it the reading itself?

A kernel that only reads what attention reads, slots 0..190 of every (row, head) of 256-slot fp16
caches, and ORs the bits (integer work at full rate, nothing converted), one program a (row, head)
per split, in a CUDA graph of 20 launches over caches cycled past L2 -> us a launch and TB/s, at
gpt2-xl's 25 heads and 64 rows.
python3 docs/journal/probes/shapes_h200/cache_stream.py"""

import itertools

import torch
import triton
import triton.language as tl
from graph_timing import graph_us

HEADS, BATCH, LENGTH, D, FILLED = 25, 64, 256, 64, 191


@triton.jit
def _read_kernel(k_ptr, v_ptr, out_ptr, FILLED: tl.constexpr, T: tl.constexpr, D: tl.constexpr,
                 BLOCK_T: tl.constexpr, SHARE: tl.constexpr, STAGES: tl.constexpr):
    pair = tl.program_id(0)
    lo = tl.program_id(1) * SHARE
    hi = tl.minimum(lo + SHARE, FILLED)
    d = tl.arange(0, D)
    bits = tl.zeros((BLOCK_T, D), tl.int16)
    for start in tl.range(lo, hi, BLOCK_T, num_stages=STAGES):
        t = start + tl.arange(0, BLOCK_T)
        offsets = pair * T * D + t[:, None] * D + d[None, :]
        inside = (t < hi)[:, None]
        bits |= tl.load(k_ptr + offsets, mask=inside, other=0) | tl.load(v_ptr + offsets, mask=inside, other=0)
    tl.store(out_ptr + pair * tl.num_programs(1) + tl.program_id(1), tl.reduce_or(tl.reduce_or(bits, 1), 0))


def main() -> None:
    size = BATCH * HEADS * LENGTH * D * 2 * 2
    copies = -(-200_000_000 // size)
    caches = [(torch.randint(-1000, 1000, (BATCH * HEADS, LENGTH, D), dtype=torch.int16, device="cuda"),
               torch.randint(-1000, 1000, (BATCH * HEADS, LENGTH, D), dtype=torch.int16, device="cuda"))
              for _ in range(copies)]
    read = BATCH * HEADS * FILLED * D * 2 * 2
    for splits, block_t, warps, stages in itertools.product((1, 2, 4), (16, 32, 64), (1, 4), (1, 2, 3)):
        out = torch.empty(BATCH * HEADS * splits, dtype=torch.int16, device="cuda")
        share = LENGTH // splits

        def launch(i: int) -> None:
            k, v = caches[i % copies]
            _read_kernel[(BATCH * HEADS, splits)](k, v, out, FILLED=FILLED, T=LENGTH, D=D, BLOCK_T=min(block_t, share),
                                                   SHARE=share, STAGES=stages, num_warps=warps)
        us = graph_us(launch, 20, 20)
        print(f"regions splits {splits} block {block_t} warps {warps} stages {stages}: {us:6.2f} us "
              f"{read / us / 1e6:.2f} TB/s", flush=True)


if __name__ == "__main__":
    main()
