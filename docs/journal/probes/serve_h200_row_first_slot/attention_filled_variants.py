"""Diagnostic variants of the decode attention kernel's FILLED path, built by patching its source
(GPU us per call, one layer of GPT-2 124M's shape, 200 calls in a CUDA graph, best of 3; every slot up
to 200 live, each row's first slot 0): unroll4, the walk a static loop of 4 blocks (masked past the
share); share_const, FILLED's share the compile-time SHARE of the fixed path (right only where that
covers the span, as here); both. From the repository root on a GPU:
`PYTHONPATH=. python docs/journal/probes/serve_h200_row_first_slot/attention_filled_variants.py`"""
import importlib.util
import inspect
import pathlib

import torch
import triton
from attention_filled_probe import gpu_us  # beside this file

from pipeline.runtime.kernels import decode_attention as tk

PATCHES = {
    "unroll4": [("for _ in range(tl.cdiv(share, BLOCK_T)):", "for _ in tl.static_range(4):")],
    "share_const": [("share = tl.cdiv(slot + 1 - base, SPLITS * BLOCK_T) * BLOCK_T", "share = SHARE")],
    "both": [("for _ in range(tl.cdiv(share, BLOCK_T)):", "for _ in tl.static_range(4):"),
             ("share = tl.cdiv(slot + 1 - base, SPLITS * BLOCK_T) * BLOCK_T", "share = SHARE")],
}
HEADER = ("import triton\nimport triton.language as tl\nfrom triton.language.extra.cuda import gdc_launch_dependents, gdc_wait\n"
          "from pipeline.runtime.kernels.decode_attention import _cache_block\n\n")
H, D, SLOT = 12, 64, 200
dev = torch.device("cuda")


def patched_kernels():
    """The kernel's source with each variant's patches, as a module of kernel_<variant> functions."""
    src, body = inspect.getsource(tk._decode_attention_kernel.fn), []
    for name, subs in PATCHES.items():
        s = src.replace("def _decode_attention_kernel(", f"def kernel_{name}(")
        for a, b in subs:
            assert a in s, (name, a)
            s = s.replace(a, b)
        body.append(s)
    path = pathlib.Path("/tmp/attn_variants.py")
    path.write_text(HEADER + "\n\n".join(body))
    spec = importlib.util.spec_from_file_location("attn_variants", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def launch(kernel, q, k, v, mask, slot, first, out, partial, arrivals, cfg, filled):
    """One launch of `kernel` (the decode attention's signature) -> Triton's compiled kernel."""
    batch, heads, length, head_dim = k.shape
    share = triton.cdiv(length, cfg.splits)
    return kernel[(batch, heads, cfg.splits)](
        q, k, v, mask, slot, first, out, partial, arrivals, k.stride(0), k.stride(1), head_dim ** -0.5,
        T=length, H=heads, D=head_dim, BLOCK_T=min(cfg.block_t, triton.next_power_of_2(share)), SHARE=share,
        SPLITS=cfg.splits, BLOCK_S=triton.next_power_of_2(cfg.splits), FILLED=filled, PDL=False, EARLY=False,
        num_warps=cfg.warps, **({"maxnreg": cfg.registers} if cfg.registers else {}))


def main():
    mod = patched_kernels()
    for rows in (64, 8):
        cfg = tk.tiles.attention_config(rows, heads=H)
        q = torch.randn(rows, H * D, device=dev, dtype=torch.float16)
        partial = torch.zeros(tk.attention_partials(rows, H, D), device=dev)
        arrivals = torch.zeros(rows, H, dtype=torch.int32, device=dev)
        slot = torch.tensor(SLOT, device=dev)
        first = torch.zeros(rows, dtype=torch.long, device=dev)
        k, v = (torch.randn(rows, H, 256, D, device=dev, dtype=torch.float16) for _ in range(2))
        mask = torch.zeros(rows, 256, dtype=torch.bool, device=dev); mask[:, :SLOT] = True
        ref = torch.empty_like(q)
        launch(tk._decode_attention_kernel, q, k, v, mask, slot, slot, ref, partial, arrivals, cfg, False)
        line = [f"rows {rows} (splits {cfg.splits}, block {cfg.block_t}), 256 slots, first 0:"]
        for name, kern, filled in (("fixed", tk._decode_attention_kernel, False), ("filled", tk._decode_attention_kernel, True),
                                   ("filled unroll4", mod.kernel_unroll4, True), ("filled share_const", mod.kernel_share_const, True),
                                   ("filled both", mod.kernel_both, True)):
            if rows == 8 and "unroll" in name or rows == 8 and name == "filled both":
                continue  # 8 rows: one split of one 256-slot block; the static loop of 4 does not apply
            out = torch.empty_like(q)
            f = slot if not filled else first
            us = gpu_us(lambda: launch(kern, q, k, v, mask, slot, f, out, partial, arrivals, cfg, filled))
            err = (out.float() - ref.float()).abs().max().item()
            line.append(f"{name} {us:.2f} (max diff {err:.1e})")
        print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
