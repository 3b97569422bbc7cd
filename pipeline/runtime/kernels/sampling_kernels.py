"""The device sampler (pipeline.runtime.sampler) as one Triton launch: the same arithmetic as
sampler.sample_reference, the numbers from Triton's own Philox, keyed and counted as there.

A program per (row, block of BLOCK logits) reads its block once, penalises and scales it, and leaves
the block's maximum, first argmax and mass (at the block's maximum); the row's last program to arrive
(an atomic count, as decode attention merges its splits) merges them: the argmax for a greedy row; for
a sampled one, the block where the draw lands from the blocks' masses, then that block's CDF, one
block read. Whether the draw is kept (fewer than top_k likelier tokens, their mass below top_p) reads
only the blocks whose maximum lies above it, and leaves each block's mass above the draw: the masses
a rejected draw's next round lands by. So a step reads each row's logits about once, spread over the GPU, where a program a row
walking the vocabulary three times took 74 us at batch 1 (docs/journal/performance.md). With `advance` (the
triton backend's sampled step) the last program then does the greedy step's tail
(triton_kernels._advance_row)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.random import philox

from pipeline.runtime.kernels.triton_kernels import _advance_row, _row_inputs
from pipeline.runtime.sampler import BLOCK, FLOATS, INTS, ROUNDS, SamplingTable


@triton.jit
def _scores(logits_row, counts_row, prompt_row, cols, V, penalized, repetition, presence, frequency):
    """A block of one row's logits (fp32, -inf past the vocabulary) with the row's penalties applied."""
    inside = cols < V
    s = tl.load(logits_row + cols, mask=inside, other=float("-inf")).to(tl.float32)
    if penalized != 0:
        count = tl.load(counts_row + cols, mask=inside, other=0)
        seen = (count > 0) | (tl.load(prompt_row + cols, mask=inside, other=0) != 0)
        s = tl.where(seen, tl.where(s > 0, s / repetition, s * repetition), s)
        s = s - frequency * count.to(tl.float32) - presence * (count > 0).to(tl.float32)
        s = tl.where(inside, s, float("-inf"))
    return s


@triton.jit
def _uniform(seed, position, stream, draw):
    """sampler.uniform: the top 24 bits of Philox(seed; position, stream, draw, 0) -> (0, 1)."""
    word, _, _, _ = philox(seed, position.to(tl.int32), stream.to(tl.int32), draw, 0)
    return ((word >> 8).to(tl.float32) + 0.5) * 5.9604644775390625e-08


# strides and sizes vary by caller (a prefill's rows, a bucket's): one compiled kernel serves them all
@triton.jit(do_not_specialize=["logits_stride", "V", "row_stride", "step_stride", "B", "T", "POSITIONS"])
def _sample_kernel(logits_ptr, logits_stride, rows_ptr, positions_ptr, floats_ptr, ints_ptr, counts_ptr, prompt_ptr,
                   partials_ptr, row_arrivals_ptr, out_ptr, V, tokens_ptr, row_stride, step_stride, step_ptr, advance_ptr,
                   start_ptr, slot_mask_ptr, arrivals_ptr, wte_ptr, wpe_ptr, x_ptr, B, T, POSITIONS,
                   ROWS: tl.constexpr, ROUNDS: tl.constexpr, BLOCK: tl.constexpr, BLOCKS: tl.constexpr,
                   NF: tl.constexpr, NI: tl.constexpr, ADVANCE: tl.constexpr, C: tl.constexpr, BLOCK_C: tl.constexpr):
    row = tl.program_id(0)
    block = tl.program_id(1)
    r = row
    if ROWS:
        r = tl.load(rows_ptr + row)
    temperature = tl.load(floats_ptr + r * NF)
    repetition = tl.load(floats_ptr + r * NF + 2)
    presence = tl.load(floats_ptr + r * NF + 3)
    frequency = tl.load(floats_ptr + r * NF + 4)
    penalized = tl.load(ints_ptr + r * NI + 3)
    logits_row = logits_ptr + row * logits_stride
    counts_row = counts_ptr + r * V
    prompt_row = prompt_ptr + r * V
    cols0 = tl.arange(0, BLOCK)
    sampled = temperature > 0
    inverse = tl.where(sampled, 1.0 / tl.where(sampled, temperature, 1.0), 1.0)

    # this block: its maximum, first argmax and mass at its maximum (a greedy row needs no mass)
    cols = block * BLOCK + cols0
    s = _scores(logits_row, counts_row, prompt_row, cols, V, penalized, repetition, presence, frequency) * inverse
    block_top = tl.max(s, 0)
    mine = partials_ptr + (row * BLOCKS + block) * 3
    tl.store(mine, block_top)
    tl.store(mine + 1, tl.sum(tl.where(sampled, tl.exp(s - block_top), 0.0), 0))
    tl.store(mine + 2, (tl.argmax(s, 0, tie_break_left=True) + block * BLOCK).to(tl.float32))  # exact below 2^24
    tl.debug_barrier()  # every thread's stores above come before the release below
    if tl.atomic_add(row_arrivals_ptr + row, 1, sem="acq_rel") == BLOCKS - 1:
        tl.debug_barrier()  # and the acquire before any thread's loads of the others' partials
        tl.store(row_arrivals_ptr + row, 0)
        j = tl.arange(0, triton.next_power_of_2(BLOCKS))
        parts = partials_ptr + (row * BLOCKS + j) * 3
        tops = tl.load(parts, mask=j < BLOCKS, other=float("-inf"))
        best = tl.argmax(tops, 0, tie_break_left=True)  # the first block holding the maximum: its first argmax
        token = tl.sum(tl.where(j == best, tl.load(parts + 2, mask=j < BLOCKS, other=0.0), 0.0), 0).to(tl.int64)
        if sampled:
            top = tl.max(tops, 0)
            masses = tl.load(parts + 1, mask=j < BLOCKS, other=0.0) * tl.exp(tops - top)
            total = tl.sum(masses, 0)
            top_p = tl.load(floats_ptr + r * NF + 1)
            top_k = tl.load(ints_ptr + r * NI)
            seed = tl.load(ints_ptr + r * NI + 1)
            stream = tl.load(ints_ptr + r * NI + 2)
            position = tl.load(positions_ptr + row) + 1  # the picked token's
            filtered = (top_k > 0) | (top_p < 1.0)
            pivot = float("-inf")
            draw = 0
            done = tl.full([], 0, tl.int1)
            while (draw < ROUNDS) & (done == 0):
                target = _uniform(seed, position, stream, draw) * tl.sum(masses, 0)
                # the block the draw lands in (rounding may leave every prefix short: the last with mass)
                prefix = tl.cumsum(masses, 0)
                filled = masses > 0
                at_block = tl.min(tl.where((prefix > target) & filled, j, BLOCKS), 0)
                at_block = tl.where(at_block < BLOCKS, at_block, tl.max(tl.where(filled, j, -1), 0))
                at_block = tl.maximum(at_block, 0)
                before = tl.sum(tl.where(j == at_block, prefix - masses, 0.0), 0)
                # that block's CDF, over the tokens above the pivot
                cols = at_block * BLOCK + cols0
                s = _scores(logits_row, counts_row, prompt_row, cols, V, penalized, repetition, presence, frequency) * inverse
                kept = s > pivot
                hit = (tl.cumsum(tl.where(kept, tl.exp(s - top), 0.0), 0) + before > target) & kept
                x = tl.min(tl.where(hit, cols0, BLOCK), 0)
                x = tl.where(x < BLOCK, x, tl.max(tl.where(kept, cols0, -1), 0))
                x = tl.maximum(x, 0)
                at = tl.sum(tl.where(cols0 == x, s, 0.0), 0)
                accept = filtered == 0
                if filtered:  # kept if fewer than top_k tokens are likelier and their mass is below top_p
                    count = 0
                    above_masses = tl.zeros_like(masses)  # each block's mass above the draw: a rejection's next masses
                    for b in range(0, BLOCKS):
                        if tl.load(partials_ptr + (row * BLOCKS + b) * 3) > at:
                            cols = b * BLOCK + cols0
                            s = _scores(logits_row, counts_row, prompt_row, cols, V, penalized, repetition, presence,
                                        frequency) * inverse
                            above = s > at
                            count += tl.sum(above.to(tl.int32), 0)
                            above_masses = tl.where(j == b, tl.sum(tl.where(above, tl.exp(s - top), 0.0), 0),
                                                    above_masses)
                    accept = ((top_k <= 0) | (count < top_k)) & (tl.sum(above_masses, 0) < top_p * total)
                    masses = above_masses  # a rejected draw's next is from the tokens above it
                    pivot = at
                token = tl.where(accept, (at_block * BLOCK + x).to(tl.int64), token)
                done = accept
                draw += 1
        if penalized != 0:
            tl.atomic_add(counts_row + token, 1)
        if ADVANCE:
            step, start, next_position, e, c = _row_inputs(row, step_ptr, start_ptr, positions_ptr, advance_ptr, wpe_ptr,
                                                           POSITIONS, C, BLOCK_C, True)
            _advance_row(row, token, step, start, next_position, e, c, out_ptr, tokens_ptr, row_stride, step_stride,
                         step_ptr, positions_ptr, start_ptr, slot_mask_ptr, arrivals_ptr, wte_ptr, x_ptr, B, T, C, True)
        else:
            tl.store(out_ptr + row, token)


def sample_rows(logits: torch.Tensor, table: SamplingTable, positions: torch.Tensor, rows: torch.Tensor | None = None,
                out: torch.Tensor | None = None, advance: dict | None = None) -> torch.Tensor:
    """sampler.sample on a GPU: logits [n, V] (rows contiguous), positions [n] -> tokens [n] int64, into `out`.
    advance: the triton backend's step tail, {token [B, 1], tokens [B, N], step, advance, start,
    slot_mask, arrivals, wte, wpe, x} as triton_kernels.greedy_advance takes them; then `positions` is the
    slot's position [B, 1], advanced in place, and the token goes to `token`."""
    n, vocab = logits.shape
    if advance is None:
        out = out if out is not None else torch.empty(n, dtype=torch.long, device=logits.device)
        a = dict(tokens=out, step=out, advance=out, start=out, slot_mask=out, arrivals=out, wte=logits, wpe=logits,
                 x=logits)  # stand-ins, unread without ADVANCE
        c = 1
    else:
        a = advance
        out, c = a["token"], a["x"].shape[1]
    blocks = table.partials.shape[1]
    _sample_kernel[(n, blocks)](logits, logits.stride(0), rows if rows is not None else positions, positions, table.floats,
                         table.ints, table.counts, table.prompt.view(torch.uint8), table.partials, table.arrivals, out,
                         vocab, a["tokens"],
                         a["tokens"].stride(0), a["tokens"].stride(-1), a["step"], a["advance"], a["start"],
                         a["slot_mask"], a["arrivals"], a["wte"], a["wpe"], a["x"], n,
                         a["slot_mask"].shape[-1], a["wpe"].shape[0],
                         ROWS=rows is not None, ROUNDS=ROUNDS, BLOCK=BLOCK, BLOCKS=blocks, NF=len(FLOATS), NI=len(INTS),
                         ADVANCE=advance is not None, C=c, BLOCK_C=triton.next_power_of_2(c))
    return out if advance is None else out.view(-1)
