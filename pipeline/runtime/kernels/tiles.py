"""Tile and share tables for the decode kernels: which tiles, K splits, warps and pipeline depths
each product of a step takes, and how attention's cache walk is shared out, by shape and batch. They
are data chosen by measurement (each choice names the sweep that made it), kept apart from the kernels
so that a tuning change touches no kernel and a kernel change no table; probes replace these functions
on the module (tiles.linear_config = ...) and the launchers read them through it."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import triton


@dataclass(frozen=True)
class LinearConfig:
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    warps: int = 4
    stages: int = 3
    weights_left: bool = False  # the weights as the tensor-core product's left operand (_tile_product's W_LEFT)


def fixed_order(cfg: LinearConfig) -> LinearConfig:
    """cfg with each output's sum over K taken by one program: its terms then add in one order every run,
    where split-K's atomic adds land in any (deterministic serving: docs/design.md)."""
    return replace(cfg, split_k=1)


def head_normalized_apart(m: int) -> bool:
    """Whether the LM head over m rows takes them normalised by a launch of its own (layer_norm)
    rather than normalising in its tiles. Above 16 rows its tiles then take all rows at once (64 x
    128), reading each of the head's weights once, x in half the bytes and no norm arithmetic; at
    batch 8 that bought nothing, so up to 16 rows the tiles keep the norm (docs/journal/performance.md)."""
    return m > 16


def layer_norms_apart(m: int, width: int, narrow: bool = False) -> bool:
    """Whether the QKV and fc products over m rows take x normalised by a launch of their own
    (layer_norm), as the LM head does above 16 rows: above 16 rows from gpt2-medium's width up, from
    gpt2-large's for one-byte weights (narrow). Their tiles then read x in fp16 with no norm
    arithmetic, and 64-row tiles read each weight once: at 64 rows gpt2-large's fp16 step 2.08 -> 1.80
    ms and gpt2-xl's 3.92 -> 3.13, for two launches more a layer; gpt2-medium's 1.045-1.081 -> 1.019-1.020
    under deeper tiles (int8-wo lost 4% in one A/B, 0-5% faster in another); at 124M's width and at
    8 rows the fused norm was as fast or faster (docs/journal/performance.md, "the layer norms apart",
    "weight bytes in flight")."""
    return m > 16 and width >= (1280 if narrow else 1024)


def linear_config(m: int, n: int, k: int, residual: bool, narrow: bool = False, fp32: bool = False) -> LinearConfig:
    """Tile sizes for one fused linear, chosen by timing every GPT-2 124M shape at batch 1, 8 and 64
    on an H200 (docs/journal/decode_notes_h200.md has the sweeps), then the wider models' (1,024 to
    1,600: `width` below) product by product (docs/journal/performance.md, "tiles for the wider
    shapes"). A decode step's matrices are far too small to fill 132 multiprocessors with big tiles.
    One row (batch 1) takes row products: 4-8 output columns per program, 576 to 6,288 programs for
    GPT-2 124M, each loading its whole K slice at once, with fewer warps the longer the slice. More
    rows take narrow tensor-core tiles and, where the epilogue is a plain sum (the residual
    projections), split K, so that each launch runs 70 to 400 programs. narrow: one-byte weights
    (int8, fp8), whose tiles differ where their own sweep found better (_one_byte_config); fp32:
    four-byte operands, which keep the tiles whose stages fit in shared memory at four bytes."""
    width = n if residual else k  # the model's: the residual projections write it, the others read it
    wide = width >= 1024 and n <= 8192  # the LM head keeps its tiles at every width
    if wide and not residual and layer_norms_apart(m, width, narrow):  # all rows a tile: each weight read once
        if narrow or fp32:  # one-byte weights gained nothing from deeper tiles in the step; fp32's would not fit
            return LinearConfig(64, 32, 128 if k % 128 == 0 else 64, stages=4)
        # each program walks K a tile at a time, so the weight bytes in flight (about N x stages x BLOCK_K
        # x 2) set the pace: at 1,600 wide 128-wide K tiles (the last half masked) six deep with the weights
        # on the left hold 7.4 MB where 64-wide ones 4 deep held 2.5 (QKV alone 9.9 -> 7.9 us); at 1,024 six
        # stages hold 4.7 MB (3.1 at four); at 1,280, where four hold 3.9-5.2 MB, six lost 3% of the batch-64
        # step (docs/journal/performance.md, "weight bytes in flight")
        if k % 128:
            return LinearConfig(64, 64, 128, stages=6, weights_left=True)
        return LinearConfig(64, 32, 128, stages=6 if k < 1280 else 4)
    if narrow and (config := _one_byte_config(m, n, k, residual, wide)):
        return config
    if m == 1:
        if residual and wide:
            return LinearConfig(1, 8, 0, _row_split(k), warps=2 if k >= 5120 else 4)
        if residual:  # K slices of 64-256 (768 / 12, 3072 / 12): among the sweep's best for both projections
            split = max((s for s in (2, 3, 4, 6, 8, 12) if k % s == 0 and k // s >= 64), default=1)
            return LinearConfig(1, 8, 0, split)
        if wide:
            return LinearConfig(1, 4, 0, warps=1 if width >= 1280 else 2)
        return LinearConfig(1, 8, 0, warps=2) if n > 8192 else LinearConfig(1, 4, 0)
    block_k = min(128, triton.next_power_of_2(k))
    small = m <= 16
    if residual:
        if wide and small and width < 1600:  # at 8 rows 64-wide K tiles split up to 8 ways, 32 columns a tile
            return LinearConfig(16, 32, *_k_split(k, 64))
        block_k, split = _k_split(k, block_k)
        if small:
            return LinearConfig(16, 16, block_k, split, warps=4)
        return LinearConfig(64 if k > 1024 else 32, 32, block_k, split, warps=4)
    # above 16 rows, pipeline depths chosen inside the whole batch-64 greedy step, not per kernel: the
    # QKV and fc tiles 4 stages deep, the head 3, so that its programs fit in one wave (docs/journal/decode_notes_h200.md)
    if n > 8192:  # the LM head
        if head_normalized_apart(m):
            return LinearConfig(64, 128, 64, warps=4, stages=3)
        return LinearConfig(16, 256, 64, warps=8, stages=4)
    if small:
        return LinearConfig(16, 32, block_k, warps=4)
    if wide and k % 128:  # 1,600: K tiles that divide K, 32 rows a tile
        return LinearConfig(32, 128, 64, warps=4, stages=3)
    return LinearConfig(16, 128, block_k, warps=4, stages=4)


def _one_byte_config(m: int, n: int, k: int, residual: bool, wide: bool) -> LinearConfig | None:
    """Tiles for int8 / fp8 weights where their sweep at every width beat fp16's and the whole step
    agreed (docs/journal/performance.md, "one-byte weights"); None where fp16's are as good. The
    residual products: 128-wide K tiles split into whole tiles, 32 columns a tile (64 above 16 rows).
    Above 16 rows the QKV and fc products' 16 x 128 tiles four stages deep (below gpt2-large's width:
    from it up their norms go apart and all rows take one tile, layer_norms_apart(narrow)); at 2-16
    rows the LM head's 16 x 128 tiles (its 256-wide ones wait longer on the conversion). One row keeps
    fp16's: four warps a row product won alone and lost in the step (gpt2-xl 1.13 -> 1.28 ms)."""
    if m == 1:
        return None
    if n > 8192:
        return LinearConfig(16, 128, 64) if m <= 16 else None
    if residual:
        return LinearConfig(32 if wide and m > 16 else 16, 32 if m <= 16 else 64, *_k_split(k, 128))
    if m > 16:
        return LinearConfig(16, 128, 128 if k % 128 == 0 else 64, stages=4)
    return None


def _row_split(k: int) -> int:
    """K slices for a wide model's row product (each program loads its slice padded to a power of
    two): the fewest padded lanes, then the slice nearest 256 (1,024 -> 4, 4,096 -> 8, 1,280 -> 5,
    5,120 -> 5, 1,600 -> 8, 6,400 -> 8: the sweep's best)."""
    def cost(s: int) -> tuple[float, float]:
        return triton.next_power_of_2(k // s) / (k // s), abs(math.log2(k / s / 256))
    return min((s for s in (8, 5, 4, 2) if k % s == 0), key=cost, default=1)


def _k_split(k: int, block_k: int) -> tuple[int, int]:
    """The K tile and the most K slices (of 1-8) that cut K into whole tiles, the tile halved until
    one does: 768 and 3072 (124M) keep 128-wide tiles in 6 and 8 slices; gpt2-xl's 1600 takes 64-wide
    ones in 5. K with no such tile (odd) runs unsplit, masked."""
    while block_k >= 16:
        splits = [s for s in (8, 6, 5, 4, 3, 2, 1) if k % (s * block_k) == 0]
        if splits:
            return block_k, splits[0]
        block_k //= 2
    return min(128, triton.next_power_of_2(k)), 1


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot's input_precision for operands of this dtype: fp32 stays exact (its 1e-5 budget) rather
    than taking TF32; fp16 and bf16 ignore it."""
    return "ieee" if dtype == torch.float32 else "tf32"


@dataclass(frozen=True)
class AttentionConfig:
    splits: int  # programs per (row, head), each over its share of the filled slots
    warps: int
    block_t: int = 256  # slots per step of a program's walk over its share (at most)
    registers: int | None = None  # a cap per thread, where more programs per multiprocessor pay (ptxas' maxnreg)
    fetch_ahead: bool = True  # each next block requested while one is computed on, the first before the PDL wait


def attention_config(batch: int, heads: int, filled: bool = False) -> AttentionConfig:
    """Chosen by timing the whole decode step at batch 1, 8 and 64 on an H200 (docs/journal/decode_notes_h200.md),
    at 124M's 12 heads first, then at every shape (docs/journal/performance.md, "the layer norms apart"):
    a few rows leave most multiprocessors idle unless each head's cache walk is split, into one-warp
    programs at batch 1 (faster alone at every head count; gpt2-medium's step 8% faster). At batch 64
    the 3,072 one-warp programs fit the 132 multiprocessors at once only at 80 registers or fewer
    (25 a multiprocessor; uncapped the kernel takes 96, and a second wave costs 15 us a step); with
    20 and 25 heads (gpt2-large, gpt2-xl) 4 splits make 1.5-2 waves, and 2 splits were 2-4% faster
    a step (with 16, gpt2-medium's, 4-6% slower: 4 splits are 1.24 waves there). From 16 heads at 64
    rows, one program a (row, head) walking 32-slot blocks, each loaded where it is used (no block
    fetched ahead), took 6-9% off the step against those (gpt2-medium, large, xl; at 12 heads it was
    no faster alone); at 25 heads it reads the cache at 86% of a kernel that only reads those bytes
    (performance.md, "attention at 64 rows without its block fetched ahead").
    `filled` (the FILLED shares, the serving scheduler's): one-warp programs over 16-slot blocks, more
    of them the fewer the rows, and no cap: its walk needs 74-76 registers, and under a cap ptxas
    spills it (docs/journal/performance.md, "the FILLED attention without its register cap")."""
    if filled:
        return AttentionConfig(splits=16 if batch <= 4 else 8 if batch <= 16 else 4, warps=1, block_t=16)
    if batch <= 4:
        return AttentionConfig(splits=8, warps=1, block_t=32, registers=80)
    if batch <= 16:
        return AttentionConfig(splits=1, warps=8)
    if batch * heads <= 768:
        return AttentionConfig(splits=4, warps=1, block_t=16, registers=80)
    return AttentionConfig(splits=1, warps=1, block_t=32, fetch_ahead=False)


def attention_partials(batch: int, heads: int, head_dim: int, config: AttentionConfig | None = None) -> torch.Size:
    """The shape of decode_attention's partial buffer for this batch (fp32)."""
    return torch.Size((batch, heads, (config or attention_config(batch, heads=heads)).splits, head_dim + 2))


def argmax_partials(m: int, vocab: int, k: int, narrow: bool = False) -> int:
    """How many per-program maxima fused_linear(..., argmax=) writes per row for an LM head of this
    shape (narrow: over int8 or fp8 weights)."""
    return triton.cdiv(vocab, linear_config(m, vocab, k, residual=False, narrow=narrow).block_n)
