"""The decode attention kernel alone, one layer of GPT-2 124M's shape (12 heads of 64), fp16: GPU us
per call (200 calls captured in a CUDA graph, best of 3 replays) with fixed shares over an offline-sized cache (256
slots) against FILLED shares (each row's from its first slot) over caches of 256 and 2,048 slots,
the step at slot 200 and every slot before it live. From the repository root on a GPU:
`PYTHONPATH=. python docs/journal/probes/serve_h200_row_first_slot/attention_filled_probe.py`"""
import torch

from pipeline.runtime.kernels.decode_attention import decode_attention
from pipeline.runtime.kernels.tiles import attention_config, attention_partials

H, D, SLOT = 12, 64, 200
dev = torch.device("cuda")


def gpu_us(fn, n=200):
    """Captured as one CUDA graph of n calls: launched one by one, the host's launch sets the pace."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            fn()
    best = float("inf")
    for _ in range(3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b) / n * 1e3)
    return best


def main():
    for rows in (1, 8, 64):
        q = torch.randn(rows, H * D, device=dev, dtype=torch.float16)
        out = torch.empty_like(q)
        partial = torch.zeros(attention_partials(rows, H, D), device=dev)
        arrivals = torch.zeros(rows, H, dtype=torch.int32, device=dev)
        slot = torch.tensor(SLOT, device=dev)
        cfg = attention_config(rows, heads=H)
        line = [f"rows {rows:2d} (splits {cfg.splits}, block {cfg.block_t}):"]
        for length, first_at in ((256, None), (256, 0), (2048, 0), (2048, 56), (2048, 128)):
            k, v = (torch.randn(rows, H, length, D, device=dev, dtype=torch.float16) for _ in range(2))
            mask = torch.zeros(rows, length, dtype=torch.bool, device=dev)
            mask[:, :SLOT] = True
            first = None if first_at is None else torch.full((rows,), first_at, dtype=torch.long, device=dev)
            us = gpu_us(lambda: decode_attention(q, k, v, mask, slot, out, partial, arrivals, first=first))
            line.append(f"{length} slots {'fixed' if first is None else f'FILLED from {first_at}'} {us:.2f}")
        print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
