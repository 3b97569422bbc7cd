"""Decode attention: one query per (row, head) against the static cache with an online softmax,
reading only the slots up to the step's slot (the filled part of the cache), whatever the cache
length; at small batch each (row, head) is split over several programs whose last one merges them.
The shares are tiles.attention_config's."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from pipeline.runtime.kernels import tiles
from pipeline.runtime.kernels.tiles import AttentionConfig, attention_partials


@triton.jit
def _cache_block(k_cache_ptr, v_cache_ptr, slot_mask_ptr, cache, row, t, wanted, T: tl.constexpr, D: tl.constexpr):
    """The keys, values and slot-mask entries of slots t of one (row, head), those wanted only (zero elsewhere)."""
    offsets = cache + t[:, None] * D + tl.arange(0, D)[None, :]
    keys = tl.load(k_cache_ptr + offsets, mask=wanted[:, None], other=0.0)
    values = tl.load(v_cache_ptr + offsets, mask=wanted[:, None], other=0.0)
    return keys, values, tl.load(slot_mask_ptr + row * T + t, mask=wanted, other=0)


@triton.jit
def _online_softmax(keys, values, live, q, m_i, l_i, acc):
    """One block of slots into the running max m_i, sum l_i and weighted values acc (fp32)."""
    s = tl.where(live, tl.sum(keys.to(tl.float32) * q[None, :], 1), float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    p = tl.exp(s - m_new)
    alpha = tl.exp(m_i - m_new)
    return m_new, l_i * alpha + tl.sum(p, 0), acc * alpha + tl.sum(p[:, None] * values.to(tl.float32), 0)


@triton.jit
def _finish_attention(acc, m_i, l_i, out_ptr, partial_ptr, arrivals_ptr, row, head, d, H: tl.constexpr,
                      D: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr):
    """A program's running max, sum and weighted values into out[row, head]: directly, or through
    partial, the last of the (row, head)'s SPLITS programs to arrive merging them all."""
    out = out_ptr + row * H * D + head * D + d
    if SPLITS == 1:
        tl.store(out, (acc / l_i).to(out_ptr.dtype.element_ty))
    else:
        pair = row * H + head
        mine = partial_ptr + (pair * SPLITS + tl.program_id(2)) * (D + 2)
        tl.store(mine + d, acc)
        tl.store(mine + D + tl.arange(0, 1), m_i)
        tl.store(mine + D + 1 + tl.arange(0, 1), l_i)
        tl.debug_barrier()  # every thread's stores above come before the release below
        if tl.atomic_add(arrivals_ptr + pair, 1, sem="acq_rel") == SPLITS - 1:
            tl.debug_barrier()  # and the acquire before any thread's loads of the others' partials
            tl.store(arrivals_ptr + pair, 0)
            i = tl.arange(0, BLOCK_S)
            parts = partial_ptr + (pair * SPLITS + i) * (D + 2)
            m = tl.load(parts + D, mask=i < SPLITS, other=-float("inf"))
            weight = tl.exp(m - tl.max(m, 0))
            total = tl.sum(tl.load(parts + D + 1, mask=i < SPLITS, other=0.0) * weight, 0)
            values = tl.load(parts[:, None] + d[None, :], mask=(i < SPLITS)[:, None], other=0.0)
            tl.store(out, (tl.sum(values * weight[:, None], 0) / total).to(out_ptr.dtype.element_ty))


@triton.jit
def _decode_attention_kernel(q_ptr, k_cache_ptr, v_cache_ptr, slot_mask_ptr, slot_ptr, first_ptr, out_ptr,
                             partial_ptr, arrivals_ptr, cache_row_stride, cache_head_stride, scale,
                             T: tl.constexpr, H: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr,
                             SHARE: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, FILLED: tl.constexpr,
                             ANCHORED: tl.constexpr, FETCH_AHEAD: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr):
    """out[row, head] = softmax(q . k[t] * scale over live slots t) . v, for t <= slot whose
    slot_mask is set (the query's own slot always counts): only the filled part of the cache is read.

    The slots before the step's were written by earlier steps, so a program requests its first
    block of them before it waits for the launch before (which writes q and the step's own slot),
    and each block's successor while it computes on the block: the cache streams in rather than
    arriving one dependent block at a time (FETCH_AHEAD). The own slot starts the online softmax.
    Without FETCH_AHEAD each block is loaded where it is used, all after the wait: fewer registers
    a program, and at 64 rows of 16 heads or more the faster walk (attention_config).

    SPLITS > 1 (flash-decoding): program_id(2) takes the slots [share * i, share * (i + 1)) and
    leaves its running max, sum and weighted values in partial [B, H, SPLITS, D + 2]; the last of a
    (row, head)'s programs to finish, counted in arrivals [B, H] (left zeroed), merges them, so the
    merge costs no launch. Shares are fixed slices of the cache (SHARE): a program past the step's
    slot has nothing to do, but every load's alignment and the walk's length are known at compile
    time (equal parts of the filled slots measured 3-10% slower per step where the cache is mostly
    filled). FILLED: shares of the row's filled slots, from its first (first_ptr [B]: no slot before
    it is live) up to the step's, in whole blocks, for a cache much wider than its filled part (the
    serving scheduler's, whose rows of all ages share one column), where fixed slices left one
    program a (row, head) to walk every filled slot, and without splits walked the whole cache's
    blocks (masked) to its end (docs/journal/performance.md). ANCHORED (with FILLED): the blocks and
    shares start at the row's first slot itself rather than at its block's start, so they group the
    row's slots alike wherever in the cache they sit (deterministic serving: docs/design.md)."""
    if PDL and EARLY:
        gdc_launch_dependents()
    row = tl.program_id(0)
    head = tl.program_id(1)
    d = tl.arange(0, D)
    slot = tl.load(slot_ptr)
    if FILLED and ANCHORED:
        base = tl.load(first_ptr + row)
        share = tl.cdiv(slot + 1 - base, SPLITS * BLOCK_T) * BLOCK_T
        lo = base + tl.program_id(2) * share
    elif FILLED:  # whole blocks, so every share starts block-aligned
        base = tl.load(first_ptr + row) // BLOCK_T * BLOCK_T
        share = tl.cdiv(slot + 1 - base, SPLITS * BLOCK_T) * BLOCK_T
        lo = tl.multiple_of(base + tl.program_id(2) * share, BLOCK_T)
    else:
        share = SHARE
        lo = tl.program_id(2) * SHARE
    cache = row * cache_row_stride + head * cache_head_stride
    end = tl.minimum(lo + share, slot)  # this share's slots before the step's own
    if FETCH_AHEAD:
        t = lo + tl.arange(0, BLOCK_T)
        earlier = t < end
        k_next, v_next, real_next = _cache_block(k_cache_ptr, v_cache_ptr, slot_mask_ptr, cache, row, t, earlier, T, D)
    if PDL:
        gdc_wait()
    q = tl.load(q_ptr + row * H * D + head * D + d).to(tl.float32) * scale
    has_own = (slot >= lo) & (slot < lo + share)  # this program's share holds the step's own slot
    own = cache + slot * D + d
    # has_own as a vector: Triton's interpreter refuses a scalar mask
    has_own_d = (tl.zeros_like(d) + slot >= lo) & (tl.zeros_like(d) + slot < lo + share)
    k_own = tl.load(k_cache_ptr + own, mask=has_own_d, other=0.0).to(tl.float32)
    acc = tl.load(v_cache_ptr + own, mask=has_own_d, other=0.0).to(tl.float32)
    # -1e30 rather than -inf where the own slot is not here: a block with no live slot then adds
    # exp(-inf) = 0, never inf - inf
    m_i = tl.where(has_own, tl.sum(k_own * q, 0), -1e30) + tl.zeros((1,), tl.float32)
    l_i = tl.where(has_own, 1.0, 0.0) + tl.zeros((1,), tl.float32)
    if FETCH_AHEAD:
        for _ in range(tl.cdiv(share, BLOCK_T)):
            keys, values, live = k_next, v_next, earlier & (real_next != 0)
            t += BLOCK_T
            earlier = t < end
            k_next, v_next, real_next = _cache_block(k_cache_ptr, v_cache_ptr, slot_mask_ptr, cache, row, t, earlier,
                                                     T, D)
            m_i, l_i, acc = _online_softmax(keys, values, live, q, m_i, l_i, acc)
    else:
        for start in range(lo, end, BLOCK_T):
            t = start + tl.arange(0, BLOCK_T)
            keys, values, real = _cache_block(k_cache_ptr, v_cache_ptr, slot_mask_ptr, cache, row, t, t < end, T, D)
            m_i, l_i, acc = _online_softmax(keys, values, (t < end) & (real != 0), q, m_i, l_i, acc)
    if PDL and not EARLY:
        gdc_launch_dependents()
    _finish_attention(acc, m_i, l_i, out_ptr, partial_ptr, arrivals_ptr, row, head, d, H, D, SPLITS, BLOCK_S)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mask: torch.Tensor,
                     slot: torch.Tensor, out: torch.Tensor, partial: torch.Tensor, arrivals: torch.Tensor,
                     config: AttentionConfig | None = None, pdl: bool = False, early: bool = False,
                     first: torch.Tensor | None = None, anchored: bool = False) -> None:
    """q/out [B, H * D]; caches [B, H, T, D] contiguous; slot_mask [B, T]; slot a device scalar;
    partial fp32 of attention_partials(...) and arrivals int32 [B, H] zeros, the split programs'
    meeting place (see _decode_attention_kernel). config overrides the tuned one; pdl and early as
    fused_linear; first, each row's first filled slot [B] int64 (at most slot): the shares split
    each row's filled slots from there rather than the cache (its FILLED); anchored (with first): from
    that slot itself, not its block's start (its ANCHORED)."""
    if anchored and first is None:
        raise ValueError("anchored shares start at each row's first slot: pass first")
    batch, heads, length, head_dim = k_cache.shape
    cfg = config or tiles.attention_config(batch, filled=first is not None, heads=heads)
    needed = attention_partials(batch, heads, head_dim, cfg)
    if partial.shape != needed:
        raise ValueError(f"partial is {tuple(partial.shape)}; this batch and config need {tuple(needed)}")
    share = triton.cdiv(length, cfg.splits)
    _decode_attention_kernel[(batch, heads, cfg.splits)](
        q, k_cache, v_cache, slot_mask, slot, slot if first is None else first, out, partial, arrivals,
        k_cache.stride(0), k_cache.stride(1),
        head_dim ** -0.5, T=length, H=heads, D=head_dim,
        BLOCK_T=min(cfg.block_t, triton.next_power_of_2(share)), SHARE=share, SPLITS=cfg.splits,
        BLOCK_S=triton.next_power_of_2(cfg.splits), FILLED=first is not None, ANCHORED=anchored,
        FETCH_AHEAD=cfg.fetch_ahead, PDL=pdl, EARLY=early,
        launch_pdl=pdl, num_warps=cfg.warps,
        **({"maxnreg": cfg.registers} if cfg.registers else {}))
