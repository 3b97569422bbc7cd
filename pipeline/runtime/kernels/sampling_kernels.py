"""The device sampler (pipeline.runtime.sampler) as two Triton launches: the same arithmetic as
sampler.sample_reference, the numbers from Triton's own Philox, keyed and counted as there.

The first launch, a program per (row, block of BLOCK logits), reads its block once, penalises and
scales it, and leaves the block's maximum, first argmax and mass (at the block's maximum); the row's
last program to arrive (an atomic count, as decode attention merges its splits) merges them: the
argmax for a greedy row; for a sampled one the first draw: the block where it lands from the blocks'
masses, then that block's CDF, one block read. The second launch, over the same programs, checks that
draw where top_k or top_p filter: each block above the drawn token counts its likelier tokens and
their mass, and the row's last program keeps the draw (fewer than top_k likelier, their mass below
top_p) or takes the next rounds itself from those masses, reading only blocks above each new draw.
So a step reads each row's logits about twice, spread over the GPU: the check by one program walking
every block took 28 us a row over an untrained model's flat logits (docs/journal/performance.md).
With `advance` (the triton backend's sampled step) the last program then does the greedy step's tail
(step_tail.advance_row)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
from triton.language.random import philox

from pipeline.runtime.kernels.step_tail import advance_row, row_inputs
from pipeline.runtime.sampling_table import BLOCK, DRAW, FLOATS, INTS, ROUNDS, SamplingTable


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


@triton.jit
def _row_settings(floats_ptr, ints_ptr, counts_ptr, prompt_ptr, rows_ptr, V, NF: tl.constexpr, NI: tl.constexpr,
                  ROWS: tl.constexpr):
    """This program's row in the table (through the row map with ROWS) and the settings every block reads."""
    r = tl.program_id(0)
    if ROWS:
        r = tl.load(rows_ptr + r)
    temperature = tl.load(floats_ptr + r * NF)
    sampled = temperature > 0
    inverse = tl.where(sampled, 1.0 / tl.where(sampled, temperature, 1.0), 1.0)
    return (r, sampled, inverse, tl.load(ints_ptr + r * NI + 3), tl.load(floats_ptr + r * NF + 2),
            tl.load(floats_ptr + r * NF + 3), tl.load(floats_ptr + r * NF + 4), counts_ptr + r * V, prompt_ptr + r * V)


@triton.jit
def _land(logits_row, counts_row, prompt_row, V, penalized, repetition, presence, frequency, inverse, masses, j, pivot,
          top, target, BLOCK: tl.constexpr, BLOCKS: tl.constexpr):
    """Where a draw of `target` (in the units of `masses`, each block's mass above `pivot`) lands:
    (its token, its scaled score). The block by the masses' prefix, then the token by that block's CDF
    (rounding may leave every prefix short: the last with mass)."""
    prefix = tl.cumsum(masses, 0)
    filled = masses > 0
    at_block = tl.min(tl.where((prefix > target) & filled, j, BLOCKS), 0)
    at_block = tl.where(at_block < BLOCKS, at_block, tl.max(tl.where(filled, j, -1), 0))
    at_block = tl.maximum(at_block, 0)
    before = tl.sum(tl.where(j == at_block, prefix - masses, 0.0), 0)
    cols0 = tl.arange(0, BLOCK)
    s = _scores(logits_row, counts_row, prompt_row, at_block * BLOCK + cols0, V, penalized, repetition, presence,
                frequency) * inverse
    kept = s > pivot
    hit = (tl.cumsum(tl.where(kept, tl.exp(s - top), 0.0), 0) + before > target) & kept
    x = tl.min(tl.where(hit, cols0, BLOCK), 0)
    x = tl.where(x < BLOCK, x, tl.max(tl.where(kept, cols0, -1), 0))
    x = tl.maximum(x, 0)
    return at_block * BLOCK + x, tl.sum(tl.where(cols0 == x, s, 0.0), 0)


@triton.jit
def _redraw(logits_row, counts_row, prompt_row, V, penalized, repetition, presence, frequency, inverse, masses, j, pivot,
            top, seed, position, stream, round_, BLOCK: tl.constexpr, BLOCKS: tl.constexpr):
    """A rejected draw's next (round `round_`'s uniform), from the tokens above `pivot` whose mass per
    block is `masses`: (its token, its scaled score, which is the next pivot)."""
    target = _uniform(seed, position, stream, round_) * tl.sum(masses, 0)
    return _land(logits_row, counts_row, prompt_row, V, penalized, repetition, presence, frequency, inverse, masses, j,
                 pivot, top, target, BLOCK, BLOCKS)


@triton.jit
def _above(logits_row, counts_row, prompt_row, block, V, penalized, repetition, presence, frequency, inverse, at, top,
           BLOCK: tl.constexpr):
    """One block's tokens scored above `at`: (how many, their mass relative to the row's top)."""
    s = _scores(logits_row, counts_row, prompt_row, block * BLOCK + tl.arange(0, BLOCK), V, penalized, repetition,
                presence, frequency) * inverse
    above = s > at
    return tl.sum(above.to(tl.int32), 0), tl.sum(tl.where(above, tl.exp(s - top), 0.0), 0)


# draws checked by launches over every block; a row rejected that often takes its later rounds alone
# (one rejection in 20 for top_p 0.95: at 64 rows most steps have one, docs/journal/performance.md)
CHECKS = 2

# strides and sizes vary by caller (a prefill's rows, a bucket's): one compiled kernel serves them all
@triton.jit(do_not_specialize=["logits_stride", "V"])
def _draw_kernel(logits_ptr, logits_stride, rows_ptr, positions_ptr, floats_ptr, ints_ptr, counts_ptr, prompt_ptr,
                 partials_ptr, draws_ptr, row_arrivals_ptr, V, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                 BLOCKS: tl.constexpr, NF: tl.constexpr, NI: tl.constexpr, ND: tl.constexpr, PDL: tl.constexpr):
    """The first launch: each block's partials, then the row's argmax and first draw into draws."""
    row = tl.program_id(0)
    block = tl.program_id(1)
    if PDL:
        gdc_wait()  # the logits are the launch before's
        gdc_launch_dependents()  # the check waits for all of this launch anyway
    r, sampled, inverse, penalized, repetition, presence, frequency, counts_row, prompt_row = _row_settings(
        floats_ptr, ints_ptr, counts_ptr, prompt_ptr, rows_ptr, V, NF, NI, ROWS)
    logits_row = logits_ptr + row * logits_stride
    s = _scores(logits_row, counts_row, prompt_row, block * BLOCK + tl.arange(0, BLOCK), V, penalized, repetition,
                presence, frequency) * inverse
    block_top = tl.max(s, 0)
    mine = partials_ptr + (row * BLOCKS + block) * 3
    tl.store(mine, block_top)
    tl.store(mine + 1, tl.sum(tl.where(sampled, tl.exp(s - block_top), 0.0), 0))  # a greedy row needs no mass
    tl.store(mine + 2, (tl.argmax(s, 0, tie_break_left=True) + block * BLOCK).to(tl.float32))  # exact below 2^24
    tl.debug_barrier()  # every thread's stores above come before the release below
    if tl.atomic_add(row_arrivals_ptr + row, 1, sem="acq_rel") == BLOCKS - 1:
        tl.debug_barrier()  # and the acquire before any thread's loads of the others' partials
        tl.store(row_arrivals_ptr + row, 0)
        j = tl.arange(0, triton.next_power_of_2(BLOCKS))
        parts = partials_ptr + (row * BLOCKS + j) * 3
        tops = tl.load(parts, mask=j < BLOCKS, other=float("-inf"))
        best = tl.argmax(tops, 0, tie_break_left=True)  # the first block holding the maximum: its first argmax
        argmax = tl.sum(tl.where(j == best, tl.load(parts + 2, mask=j < BLOCKS, other=0.0), 0.0), 0)
        draw = draws_ptr + row * ND
        tl.store(draw, 0.0)
        tl.store(draw + 2, argmax)
        tl.store(draw + 3, argmax)
        if sampled:
            top = tl.max(tops, 0)
            masses = tl.load(parts + 1, mask=j < BLOCKS, other=0.0) * tl.exp(tops - top)
            total = tl.sum(masses, 0)
            target = _uniform(tl.load(ints_ptr + r * NI + 1), tl.load(positions_ptr + row) + 1,
                              tl.load(ints_ptr + r * NI + 2), 0) * total
            token, at = _land(logits_row, counts_row, prompt_row, V, penalized, repetition, presence, frequency, inverse,
                              masses, j, float("-inf"), top, target, BLOCK, BLOCKS)
            filtered = (tl.load(ints_ptr + r * NI) > 0) | (tl.load(floats_ptr + r * NF + 1) < 1.0)
            tl.store(draw, filtered.to(tl.float32))
            tl.store(draw + 1, at)
            tl.store(draw + 2, token.to(tl.float32))
            tl.store(draw + 4, top)
            tl.store(draw + 5, total)


@triton.jit(do_not_specialize=["logits_stride", "V", "row_stride", "step_stride", "B", "T", "POSITIONS"])
def _check_kernel(logits_ptr, logits_stride, rows_ptr, positions_ptr, floats_ptr, ints_ptr, counts_ptr, prompt_ptr,
                  partials_ptr, draws_ptr, row_arrivals_ptr, out_ptr, V, tokens_ptr, row_stride, step_stride, step_ptr,
                  advance_ptr, start_ptr, slot_mask_ptr, arrivals_ptr, wte_ptr, wpe_ptr, x_ptr, B, T, POSITIONS,
                  ROWS: tl.constexpr, ROUNDS: tl.constexpr, BLOCK: tl.constexpr, BLOCKS: tl.constexpr,
                  NF: tl.constexpr, NI: tl.constexpr, ND: tl.constexpr, ADVANCE: tl.constexpr, C: tl.constexpr,
                  BLOCK_C: tl.constexpr, PDL: tl.constexpr, CHECK: tl.constexpr, FINAL: tl.constexpr):
    """Check launch CHECK (from 1), of draw CHECK - 1: each block's count and mass above a checked row's
    draw (into its partials' mass and argmax slots), then the row's last program keeps the draw or
    lands the next, which the next check launch checks; the FINAL launch takes the rounds after its
    own itself, one program walking the blocks above each draw, then picks and advances every row."""
    row = tl.program_id(0)
    block = tl.program_id(1)
    if PDL:
        gdc_wait()
        if not FINAL:
            gdc_launch_dependents()
    draw = draws_ptr + row * ND
    checked = tl.load(draw) != 0
    if checked | FINAL:  # rows already decided sit out every launch but the last
        r, sampled, inverse, penalized, repetition, presence, frequency, counts_row, prompt_row = _row_settings(
            floats_ptr, ints_ptr, counts_ptr, prompt_ptr, rows_ptr, V, NF, NI, ROWS)
        logits_row = logits_ptr + row * logits_stride
        at = tl.load(draw + 1)
        top = tl.load(draw + 4)
        mine = partials_ptr + (row * BLOCKS + block) * 3
        if checked:
            count = tl.full([], 0, tl.int32)
            mass = tl.full([], 0.0, tl.float32)
            if tl.load(mine) > at:  # a block wholly at or below the draw adds nothing
                count, mass = _above(logits_row, counts_row, prompt_row, block, V, penalized, repetition, presence,
                                     frequency, inverse, at, top, BLOCK)
            tl.store(mine + 1, mass)
            tl.store(mine + 2, count.to(tl.float32))
        tl.debug_barrier()
        if tl.atomic_add(row_arrivals_ptr + row, 1, sem="acq_rel") == BLOCKS - 1:
            tl.debug_barrier()
            tl.store(row_arrivals_ptr + row, 0)
            token = tl.load(draw + 2).to(tl.int64)
            if checked:
                j = tl.arange(0, triton.next_power_of_2(BLOCKS))
                parts = partials_ptr + (row * BLOCKS + j) * 3
                masses = tl.load(parts + 1, mask=j < BLOCKS, other=0.0)  # each block's mass above the draw
                count = tl.sum(tl.load(parts + 2, mask=j < BLOCKS, other=0.0), 0).to(tl.int32)
                top_k = tl.load(ints_ptr + r * NI)
                limit = tl.load(floats_ptr + r * NF + 1) * tl.load(draw + 5)
                done = ((top_k <= 0) | (count < top_k)) & (tl.sum(masses, 0) < limit)
                seed = tl.load(ints_ptr + r * NI + 1)
                stream = tl.load(ints_ptr + r * NI + 2)
                position = tl.load(positions_ptr + row) + 1
                if FINAL:
                    token = tl.where(done, token, tl.load(draw + 3).to(tl.int64))  # past every round: the argmax
                    round_ = CHECK
                    while (round_ < ROUNDS) & (done == 0):  # a rejected draw's next is from the tokens above it
                        drawn, pivot = _redraw(logits_row, counts_row, prompt_row, V, penalized, repetition, presence,
                                               frequency, inverse, masses, j, at, top, seed, position, stream, round_,
                                               BLOCK, BLOCKS)
                        at = pivot
                        count = tl.full([], 0, tl.int32)
                        masses = tl.zeros_like(masses)
                        for b in range(0, BLOCKS):
                            if tl.load(partials_ptr + (row * BLOCKS + b) * 3) > at:
                                n, m = _above(logits_row, counts_row, prompt_row, b, V, penalized, repetition, presence,
                                              frequency, inverse, at, top, BLOCK)
                                count += n
                                masses = tl.where(j == b, m, masses)
                        done = ((top_k <= 0) | (count < top_k)) & (tl.sum(masses, 0) < limit)
                        token = tl.where(done, drawn.to(tl.int64), token)
                        round_ += 1
                elif done:
                    tl.store(draw, 0.0)
                else:  # the next draw, from the tokens above this one, for the next launch to check
                    drawn, pivot = _redraw(logits_row, counts_row, prompt_row, V, penalized, repetition, presence,
                                           frequency, inverse, masses, j, at, top, seed, position, stream, CHECK,
                                           BLOCK, BLOCKS)
                    tl.store(draw + 1, pivot)
                    tl.store(draw + 2, drawn.to(tl.float32))
            if FINAL:
                if penalized != 0:
                    tl.atomic_add(counts_row + token, 1)
                if ADVANCE:
                    step, start, next_position, e, c = row_inputs(row, step_ptr, start_ptr, positions_ptr, advance_ptr,
                                                                   wpe_ptr, POSITIONS, C, BLOCK_C, True)
                    advance_row(row, token, step, start, next_position, e, c, out_ptr, tokens_ptr, row_stride,
                                 step_stride, step_ptr, positions_ptr, start_ptr, slot_mask_ptr, arrivals_ptr, wte_ptr,
                                 x_ptr, B, T, C, True)
                else:
                    tl.store(out_ptr + row, token)


def sample_rows(logits: torch.Tensor, table: SamplingTable, positions: torch.Tensor, rows: torch.Tensor | None = None,
                out: torch.Tensor | None = None, advance: dict | None = None, pdl: bool = False) -> torch.Tensor:
    """sampler.sample on a GPU: logits [n, V] (rows contiguous), positions [n] -> tokens [n] int64, into `out`.
    advance: the triton backend's step tail, {token [B, 1], tokens [B, N], step, advance, start,
    slot_mask, arrivals, wte, wpe, x} as step_tail.greedy_advance takes them; then `positions` is the
    slot's position [B, 1], advanced in place, and the token goes to `token`. pdl as fused_linear."""
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
    shared = (logits, logits.stride(0), rows if rows is not None else positions, positions, table.floats, table.ints,
              table.counts, table.prompt.view(torch.uint8), table.partials, table.draws, table.arrivals)
    sizes = dict(ROWS=rows is not None, BLOCK=BLOCK, BLOCKS=blocks, NF=len(FLOATS), NI=len(INTS), ND=len(DRAW), PDL=pdl,
                 launch_pdl=pdl)
    _draw_kernel[(n, blocks)](*shared, vocab, **sizes)
    for check in range(1, CHECKS + 1):
        _check_kernel[(n, blocks)](*shared, out, vocab, a["tokens"], a["tokens"].stride(0), a["tokens"].stride(-1),
                                   a["step"], a["advance"], a["start"], a["slot_mask"], a["arrivals"], a["wte"], a["wpe"],
                                   a["x"], n, a["slot_mask"].shape[-1], a["wpe"].shape[0], ROUNDS=ROUNDS,
                                   ADVANCE=advance is not None, C=c, BLOCK_C=triton.next_power_of_2(c), CHECK=check,
                                   FINAL=check == CHECKS, **sizes)
    return out if advance is None else out.view(-1)
