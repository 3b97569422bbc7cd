"""Would the serving scheduler's attention (FILLED shares: each row's filled slots from its first, in a
cache wider than the context) gain from the walk that loads each block where it is used, as the
offline shares did at 64 rows (#50)? Alone, yes: 4 splits of 16-slot blocks walked that way were 4-13%
faster than the shipped FILLED config at 12 / 16 / 20 / 25 heads, with the same output; served at
124M (filled_sitting.sh) it was not, so it was not shipped (performance.md, "the serving
scheduler's attention without its block fetched ahead").

decode_attention alone with `first` given, at 64 rows of 12 / 16 / 20 / 25 heads, a 2,048-slot cache
(the scheduler's width), the step at column 1,100 and each row's first slot 129-256 slots before it
(rows that joined at different times: a prompt of 128 and up to 128 tokens), every slot from there
live: the shipped FILLED config against the same shares walked with no block fetched ahead
(AttentionConfig.fetch_ahead False) at 1, 2 and 4 splits, 16- and 32-slot blocks. Each in a CUDA
graph of 20 launches over caches cycled past L2 (enough copies that their live slots pass 200 MB:
6-7 GB of caches) -> us a launch and the output's largest difference from the shipped config's.
python3 docs/journal/probes/shapes_h200/filled_walk.py"""

import itertools

import torch
from graph_timing import graph_us

from pipeline.runtime.kernels.decode_attention import decode_attention
from pipeline.runtime.kernels.tiles import AttentionConfig, attention_config, attention_partials

ROWS, LENGTH, D, COLUMN = 64, 2048, 64, 1100


def timed(heads: int, config: AttentionConfig, caches, q, mask, slot, first) -> tuple[float, torch.Tensor]:
    out = torch.empty_like(q)
    partial = torch.empty(attention_partials(ROWS, heads, D, config), device="cuda")
    arrivals = torch.zeros(ROWS, heads, dtype=torch.int32, device="cuda")

    def launch(i: int) -> None:
        decode_attention(q, *caches[i % len(caches)], mask, slot, out, partial, arrivals, config=config, first=first)
    launch(0)
    first_out = out.float().clone()
    return graph_us(launch, 20, 20), first_out


def main() -> None:
    generator = torch.Generator("cuda").manual_seed(0)
    first = COLUMN - 256 + torch.randint(0, 128, (ROWS,), device="cuda", generator=generator)
    mask = torch.arange(LENGTH, device="cuda")[None, :] >= first[:, None]
    slot = torch.tensor(COLUMN, device="cuda")
    for heads in (12, 16, 20, 25):
        read = ROWS * heads * (COLUMN + 1 - first.float().mean().item()) * D * 2 * 2  # the live slots' bytes
        caches = [tuple(torch.randn(ROWS, heads, LENGTH, D, device="cuda", generator=generator).half() for _ in "kv")
                  for _ in range(max(1, -(-200_000_000 // int(read))))]
        q = torch.randn(ROWS, heads * D, device="cuda", generator=generator).half()
        shipped = attention_config(ROWS, heads=heads, filled=True)
        base_us, base = timed(heads, shipped, caches, q, mask, slot, first)
        line = f"{heads} heads: shipped {base_us:.2f} us"
        for splits, block_t in itertools.product((1, 2, 4), (16, 32)):
            us, out = timed(heads, AttentionConfig(splits, 1, block_t, fetch_ahead=False), caches, q, mask, slot, first)
            line += f" | {splits}/{block_t} {us:.2f} ({(out - base).abs().max().item():.0e})"
        print(line, flush=True)
        del caches


if __name__ == "__main__":
    main()
