"""The next token of many rows at once, on the device, each row by its own settings: one pass of
batched work over the step's logits, no host round trip, so a step that samples can be captured in a
CUDA graph like a greedy one.

Each row's settings live in a SamplingTable (tensors of per-row parameters at fixed addresses, and
the counts of the tokens each row has produced, for the penalties). The choice, for one row:
  1. penalties: the repetition penalty (CTRL's rule) on tokens of the prompt and the output, then
     the frequency and presence penalties (OpenAI's) on tokens of the output;
  2. greedy (temperature 0): the argmax, the first on ties, as torch.argmax;
  3. sampled: p = softmax(logits / temperature), restricted to the tokens that are both in the top k
     and in the top-p nucleus of p (the smallest set of the likeliest tokens whose mass reaches
     top_p). No sort: a token x is drawn from p over the tokens above a pivot by the inverse CDF in
     vocabulary order, and kept if fewer than k tokens are likelier and their mass is below top_p;
     else the pivot rises to x and another is drawn. Every token at or below a rejected one is out
     of the set too, so what is kept is distributed exactly as p restricted to the set (rejection
     sampling), in a round or two for the settings users send (FlashInfer's sampling kernels work
     the same way).
The uniform numbers come from Philox4x32-10 keyed by the request's seed, counting (position of the
token, the prompt's index in its request, round): a seeded request draws the same numbers alone or
in any batch. `sample` runs a Triton kernel on a GPU (kernels/sampling_kernels.py, the same
arithmetic) and torch elsewhere."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.runtime.sampling_table import BLOCK, ROUNDS, SamplingTable

MASK32 = 0xFFFFFFFF
PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)


def philox(key: tuple[np.ndarray, np.ndarray], counter: tuple[np.ndarray, ...]) -> np.ndarray:
    """Philox4x32-10 (Salmon et al., Random123): key 2 x uint32, counter 4 x uint32, each as uint64 arrays
    holding values below 2^32 -> the first of its four output words. A product of two 32-bit words
    fits in 64 bits, so each is exact. numpy on the host: a handful of rows costs a few dozen
    microseconds, where torch's per-op dispatch made it half a millisecond a draw on a CPU
    (docs/journal/performance.md, "The CPU's sampled rows")."""
    k0, k1 = key
    c0, c1, c2, c3 = counter
    for _ in range(10):
        p0, p1 = PHILOX_M[0] * c0, PHILOX_M[1] * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & MASK32
        k0, k1 = (k0 + PHILOX_W[0]) & MASK32, (k1 + PHILOX_W[1]) & MASK32
    return c0


def uniform(seed: torch.Tensor, position: torch.Tensor, stream: torch.Tensor, draw: int) -> torch.Tensor:
    """A number in (0, 1) for each row [n] f32 on seed's device: the top 24 bits of Philox(seed;
    position, stream, draw, 0), in float32 as the kernel computes it."""
    device = seed.device
    seed, position, stream = (t.cpu().numpy().astype(np.int64).view(np.uint64) for t in (seed, position, stream))
    word = philox((seed & MASK32, seed >> 32),
                  (position & MASK32, stream & MASK32, np.full_like(position, draw), np.zeros_like(position)))
    number = ((word >> 8).astype(np.float32) + np.float32(0.5)) * np.float32(2.0 ** -24)
    return torch.from_numpy(number).to(device)


def sample(logits: torch.Tensor, table: SamplingTable, positions: torch.Tensor, rows: torch.Tensor | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """The next token of each row of logits [n, V] (fp32) -> [n] int64 (into `out` when given): row i
    by table row rows[i] (i without rows), drawing at positions[i] + 1 (positions [n] or [n, 1]: the
    position of each row's last token). Counts each penalised row's pick. On a GPU two Triton launches."""
    positions = positions.reshape(-1)
    if logits.is_cuda:
        from pipeline.runtime.kernels.sampling_kernels import sample_rows
        return sample_rows(logits, table, positions, rows, out)
    token = sample_reference(logits, table, positions, rows)
    if out is not None:
        out.copy_(token)
        token = out
    return token


def sample_rows_alone(logits: torch.Tensor, table: SamplingTable, positions: torch.Tensor) -> torch.Tensor:
    """`sample` of each row of logits [n, V] by table row i, each sampled row alone: its sums over the
    vocabulary are then split the same way in any batch (a batch's reduction splits a lone row over
    threads, where several rows each take one). Greedy rows go together: the penalties are elementwise
    and an argmax is exact, in any batch."""
    positions = positions.reshape(-1)
    rows = torch.arange(len(logits), device=logits.device)
    token = torch.empty(len(logits), dtype=torch.long, device=logits.device)
    drawn = table.floats[:len(logits), 0] > 0  # temperature
    greedy = rows[~drawn]
    if len(greedy):
        token[greedy] = sample(logits[greedy], table, positions[greedy], greedy)
    for i in rows[drawn].tolist():
        token[i] = sample(logits[i:i + 1], table, positions[i:i + 1], rows[i:i + 1])[0]
    return token


def sample_reference(logits: torch.Tensor, table: SamplingTable, positions: torch.Tensor,
                     rows: torch.Tensor | None = None) -> torch.Tensor:
    """`sample` in torch ops, row by row alike (a CPU's, and the kernel's reference)."""
    index = rows if rows is not None else torch.arange(len(logits), device=logits.device)
    floats, ints = table.floats[index], table.ints[index]
    temperature, top_p, repetition, presence, frequency = floats.unbind(1)
    top_k, seed, stream, penalized = ints.unbind(1)
    scores = logits.float()
    if bool(penalized.any()):  # a dozen passes over the vocabulary: only when a row asks for penalties
        scores = penalize(scores, table.counts[index], table.prompt[index], repetition, presence, frequency,
                          penalized.bool())
    if bool((temperature > 0).any()):
        token = draw(scores, temperature, top_k, top_p, seed, stream, positions.reshape(-1) + 1)
        token = torch.where(token < 0, scores.argmax(-1), token) if bool((token < 0).any()) else token
    else:
        token = scores.argmax(-1)
    picked = penalized.bool()
    if bool(picked.any()):
        table.counts.index_put_((index[picked], token[picked]), torch.ones_like(token[picked], dtype=torch.int32),
                                accumulate=True)
    return token


def penalize(logits: torch.Tensor, counts: torch.Tensor, prompt: torch.Tensor, repetition: torch.Tensor,
             presence: torch.Tensor, frequency: torch.Tensor, penalized: torch.Tensor) -> torch.Tensor:
    """logits [n, V] with each penalised row's penalties applied (module docstring, step 1)."""
    seen = (counts > 0) | prompt
    rep = repetition[:, None]
    out = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
    out = out - frequency[:, None] * counts - presence[:, None] * (counts > 0)
    return torch.where(penalized[:, None], out, logits)


def draw(scores: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, seed: torch.Tensor,
         stream: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """A token drawn for each row from softmax(scores / temperature) within its top-k and top-p set, by
    the rejection rounds of the module docstring -> [n], -1 for a row of temperature 0 and one that no
    round accepted. The vocabulary is taken in blocks of BLOCK, as the kernel takes it: a draw finds its
    block from the blocks' masses, then its token by that block's CDF. A CPU's sampled step is bound by
    the passes over the whole vocabulary, so there are no more of them than a round needs: none tests
    the first round's pivot (-inf keeps every token), the likelier tokens are counted only where a row
    has a top_k, and masked sums multiply by the mask (the same sums as torch.where's, 4x faster)."""
    n, vocab = scores.shape
    size = min(BLOCK, vocab)  # a vocabulary within one block is that block (its padding adds nothing)
    blocks = -(-vocab // size)
    inverse = torch.where(temperature > 0, 1.0 / temperature, torch.ones_like(temperature))
    s = scores.new_empty(n, blocks * size)
    s[:, vocab:] = float("-inf")
    torch.mul(scores, inverse[:, None], out=s[:, :vocab])
    s = s.view(n, blocks, size)  # [n, blocks, size]
    block_top = s.amax(-1)  # amax: max(-1) also finds the indices, ten times the time
    top = block_top.amax(-1)
    block_mass = (s - block_top[..., None]).exp_().sum(-1) * torch.exp(block_top - top[:, None])
    total = block_mass.sum(-1)
    weights = (s - top[:, None, None]).exp_()
    filtered = (top_k > 0) | (top_p < 1)
    counted = bool((top_k > 0).any())
    rows, columns = torch.arange(n, device=scores.device), torch.arange(size, device=scores.device)
    pivot = torch.full((n,), float("-inf"), device=scores.device)
    token = torch.full((n,), -1, dtype=torch.long, device=scores.device)
    done = temperature <= 0  # greedy rows: their argmax is taken apart
    for round_ in range(ROUNDS):
        if round_ > 0:
            block_mass = (weights * (s > pivot[:, None, None])).sum(-1)
        mass = block_mass.sum(-1)
        target = uniform(seed, position, stream, round_) * mass
        prefix = block_mass.cumsum(-1)
        # the first block whose prefix passes the target (rounding may leave it short: the last with mass)
        filled = block_mass > 0
        block = torch.where((prefix > target[:, None]) & filled, torch.arange(blocks, device=scores.device), blocks).amin(-1)
        last = torch.where(filled, torch.arange(blocks, device=scores.device), -1).amax(-1)
        block = torch.where(block < blocks, block, last).clamp(min=0)
        before = (prefix - block_mass)[rows, block]
        inside = s[rows, block] > pivot[:, None]  # [n, size]
        cdf = torch.where(inside, weights[rows, block], 0.0).cumsum(-1) + before[:, None]
        hit = (cdf > target[:, None]) & inside
        x = torch.where(hit, columns, size).amin(-1)
        x = torch.where(x < size, x, torch.where(inside, columns, -1).amax(-1)).clamp(min=0)
        at = s[rows, block, x]
        above = s > at[:, None, None]
        likelier = torch.count_nonzero(above, (1, 2)) if counted else top_k
        accept = ~filtered | (((top_k <= 0) | (likelier < top_k))
                              & ((weights * above).sum((1, 2)) < top_p * total))
        token = torch.where(~done & accept, block * size + x, token)
        done |= accept
        if bool(done.all()):
            break
        pivot = torch.where(done, pivot, at)
    return token
