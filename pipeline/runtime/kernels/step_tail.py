"""The tail of a decode step, shared by the greedy step (its own launch, greedy_advance) and the
sampled one (the sampling kernels' last program): the picked token becomes the row's next input, the
row's position and slot advance, and the step's shared counters move on, so that one captured graph
serves every step with no host work between them."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait


@triton.jit
def row_inputs(row, step_ptr, start_ptr, position_ptr, advance_ptr, wpe_ptr, POSITIONS, C: tl.constexpr,
                BLOCK_C: tl.constexpr, EMBED: tl.constexpr):
    """What a step's tail (advance_row) reads that the step does not write, loaded first so that the
    loads wait together: (step, start, the row's next position, its position embedding, the columns)."""
    step = tl.load(step_ptr)
    start = tl.load(start_ptr)
    position = tl.load(position_ptr + row) + tl.load(advance_ptr + row)
    c = tl.arange(0, BLOCK_C)
    e = tl.zeros([BLOCK_C], dtype=tl.float32)
    if EMBED:  # past the last position nothing runs the step: any row in range will do
        e = tl.load(wpe_ptr + tl.minimum(position, POSITIONS - 1) * C + c, mask=c < C, other=0.0).to(tl.float32)
    return step, start, position, e, c


@triton.jit
def advance_row(row, token, step, start, position, e, c, token_ptr, tokens_ptr, row_stride, step_stride, step_ptr,
                 position_ptr, start_ptr, slot_mask_ptr, arrivals_ptr, wte_ptr, x_ptr, B, T, C: tl.constexpr,
                 EMBED: tl.constexpr):
    """A step's tail for one row once its token is picked: the token becomes the row's next input and
    tokens[row, step]; the row's position advances and its slot (start) is marked real for the steps
    after it (attention counts a query's own slot unmarked). The last row to arrive advances the
    shared start and step (every row has read them by then). EMBED: also the next step's input
    x[row] = wte[token] + wpe[position] (fp32, as _embed_kernel), so that the next step starts with
    its first layer rather than a launch of its own; x's last reader, the LM head, has completed."""
    tl.store(token_ptr + row, token)
    tl.store(tokens_ptr + row * row_stride + step * step_stride, token)
    if EMBED:
        e += tl.load(wte_ptr + token * C + c, mask=c < C, other=0.0).to(tl.float32)
        tl.store(x_ptr + row * C + c, e, mask=c < C)
    tl.store(position_ptr + row, position)
    tl.store(slot_mask_ptr + row * T + start, 1)
    if tl.atomic_add(arrivals_ptr, 1, sem="acq_rel") == B - 1:
        tl.store(start_ptr, start + 1)
        tl.store(step_ptr, step + 1)
        tl.store(arrivals_ptr, 0)


@triton.jit
def _greedy_advance_kernel(best_ptr, best_index_ptr, token_ptr, tokens_ptr, row_stride, step_stride, step_ptr, position_ptr,
                           advance_ptr, start_ptr, slot_mask_ptr, arrivals_ptr, wte_ptr, wpe_ptr, x_ptr, B, T, POSITIONS,
                           PARTIALS: tl.constexpr, BLOCK: tl.constexpr, C: tl.constexpr, BLOCK_C: tl.constexpr,
                           EMBED: tl.constexpr, PDL: tl.constexpr):
    """For one row: the argmax of its logits from the LM head's per-program maxima (the first
    column on ties, as torch.argmax), then the step's tail (advance_row)."""
    row = tl.program_id(0)
    i = tl.arange(0, BLOCK)
    step, start, position, e, c = row_inputs(row, step_ptr, start_ptr, position_ptr, advance_ptr, wpe_ptr, POSITIONS,
                                              C, BLOCK_C, EMBED)
    if PDL:
        gdc_wait()
    best = tl.load(best_ptr + row * PARTIALS + i, mask=i < PARTIALS, other=float("-inf"))
    column = tl.load(best_index_ptr + row * PARTIALS + i, mask=i < PARTIALS, other=0)
    token = tl.sum(tl.where(i == tl.argmax(best, 0, tie_break_left=True), column, 0), 0).to(tl.int64)
    advance_row(row, token, step, start, position, e, c, token_ptr, tokens_ptr, row_stride, step_stride, step_ptr,
                 position_ptr, start_ptr, slot_mask_ptr, arrivals_ptr, wte_ptr, x_ptr, B, T, C, EMBED)


def greedy_advance(best: torch.Tensor, best_index: torch.Tensor, token: torch.Tensor, tokens: torch.Tensor,
                   step: torch.Tensor, position: torch.Tensor, advance: torch.Tensor, start: torch.Tensor,
                   slot_mask: torch.Tensor, arrivals: torch.Tensor,
                   embedding: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, pdl: bool = False) -> None:
    """The greedy step's tail in one launch (see _greedy_advance_kernel). best / best_index [B, P] from
    fused_linear(..., argmax=); token / position / advance [B, 1]; tokens [B, N]; step [1]; start a scalar;
    slot_mask [B, T] bool; arrivals an int32 counter, zero between launches; embedding = (wte, wpe,
    x [B, C] fp32): write the next step's input as embed() would; pdl as fused_linear."""
    batch, partials = best.shape
    wte, wpe, x = embedding if embedding is not None else (best, best, best)  # stand-ins when not EMBED
    c = x.shape[1] if embedding is not None else 1
    _greedy_advance_kernel[(batch,)](best, best_index, token, tokens, tokens.stride(0), tokens.stride(1), step, position, advance,
                                     start, slot_mask, arrivals, wte, wpe, x, batch, slot_mask.shape[1], wpe.shape[0],
                                     PARTIALS=partials, BLOCK=triton.next_power_of_2(partials), C=c,
                                     BLOCK_C=triton.next_power_of_2(c), EMBED=embedding is not None, PDL=pdl,
                                     launch_pdl=pdl)
