"""FILLED decode attention under the shipped register cap and without (ptxas_registers.log: capped,
it spills), and configurations near the shipped ones: GPU us per call (one layer of GPT-2 124M's
shape over the serving scheduler's 2,048-slot cache, the step at slot 200, every row's first slot
0; 200 calls in a CUDA graph, best of 3) with the compiled kernel's registers and spills. From the
repository root on a GPU:
`PYTHONPATH=. python docs/journal/probes/filled_attention_registers/filled_registers_probe.py`"""
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "serve_h200_row_first_slot"))
from attention_filled_probe import gpu_us  # noqa: E402
from attention_filled_variants import launch  # noqa: E402

from pipeline.runtime.kernels.decode_attention import _decode_attention_kernel  # noqa: E402
from pipeline.runtime.kernels.tiles import AttentionConfig, attention_config  # noqa: E402

H, D, SLOT, LENGTH = 12, 64, 200, 2048
dev = torch.device("cuda")

CANDIDATES = {  # rows -> configurations tried besides the shipped one
    64: [AttentionConfig(4, 1, 16, 80), AttentionConfig(4, 1, 16), AttentionConfig(4, 1, 32), AttentionConfig(2, 1, 16),
         AttentionConfig(2, 1, 32), AttentionConfig(8, 1, 16), AttentionConfig(4, 2, 32)],
    8: [AttentionConfig(1, 8, 256), AttentionConfig(1, 4, 64), AttentionConfig(2, 4, 64), AttentionConfig(4, 2, 32),
        AttentionConfig(2, 2, 32), AttentionConfig(4, 1, 16), AttentionConfig(8, 1, 16)],
    1: [AttentionConfig(8, 2, 32), AttentionConfig(8, 1, 16), AttentionConfig(16, 1, 16), AttentionConfig(4, 2, 32)],
}


def main():
    for rows, configs in CANDIDATES.items():
        q = torch.randn(rows, H * D, device=dev, dtype=torch.float16)
        k, v = (torch.randn(rows, H, LENGTH, D, device=dev, dtype=torch.float16) for _ in range(2))
        mask = torch.zeros(rows, LENGTH, dtype=torch.bool, device=dev)
        mask[:, :SLOT] = True
        slot, first = torch.tensor(SLOT, device=dev), torch.zeros(rows, dtype=torch.long, device=dev)
        arrivals = torch.zeros(rows, H, dtype=torch.int32, device=dev)
        ref = None
        shipped = attention_config(rows, heads=H)
        for cfg in [shipped] + [c for c in configs if c != shipped]:
            out = torch.empty_like(q)
            partial = torch.zeros(rows, H, cfg.splits, D + 2, device=dev)
            call = lambda: launch(_decode_attention_kernel, q, k, v, mask, slot, first, out, partial, arrivals, cfg, True)  # noqa: E731
            compiled = call()
            us = gpu_us(call)
            ref = out.clone() if ref is None else ref
            err = (out.float() - ref.float()).abs().max().item()
            print(f"rows {rows:2d} splits {cfg.splits} warps {cfg.warps} block {cfg.block_t:3d} cap {cfg.registers or '-':>2}"
                  f"{' (shipped)' if cfg == shipped else '':10s}: {us:6.2f} us, {compiled.n_regs} registers, "
                  f"{compiled.n_spills} spilled, max diff {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
