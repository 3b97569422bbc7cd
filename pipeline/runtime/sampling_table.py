"""A batch's sampling settings on the device, one row per sequence: what the sampler (sampler.py,
torch), its Triton kernels (kernels/sampling_kernels.py) and the backends that hold a table all read.
Its own room so that each of them imports it and none imports another for it."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from pipeline.runtime.batch import send
from pipeline.runtime.sampling import Sampling

ROUNDS = 32  # draws a row may take; past them it takes its argmax (always in the kept set)
BLOCK = 2048  # the vocabulary is walked in blocks: each block's maximum and mass first, then one block's CDF
# the table's columns
FLOATS = ("temperature", "top_p", "repetition", "presence", "frequency")
INTS = ("top_k", "seed", "stream", "penalized")
# a row's first draw, as the sampler's first launch leaves it for the second (tokens as floats: exact below 2^24)
DRAW = ("checked", "at", "drawn", "argmax", "top", "total")

@dataclass
class SamplingTable:
    """Per-row sampling settings on the device. floats [R, 5] f32 (FLOATS: temperature 0 for greedy),
    ints [R, 4] int64 (INTS: top_k 0 for off, seed, stream = the prompt's index in its request,
    penalized 0/1), counts [R, V] int32 (how often each token was picked), prompt [R, V] bool (which
    tokens the prompt holds). A row's counts and prompt marks are read only where it is penalized.
    partials [R, blocks, 3] f32, draws [R, DRAW] f32 and arrivals [R] int32 (zero between launches):
    the kernel's scratch, each block's maximum, mass and argmax merged by the row's last program to
    arrive, and the row's first draw (DRAW's fields) that the acceptance launch checks."""
    floats: torch.Tensor
    ints: torch.Tensor
    counts: torch.Tensor
    prompt: torch.Tensor
    partials: torch.Tensor
    draws: torch.Tensor
    arrivals: torch.Tensor

    @classmethod
    def new(cls, rows: int, vocab: int, device: torch.device) -> SamplingTable:
        return cls(torch.zeros(rows, len(FLOATS), device=device), torch.zeros(rows, len(INTS), dtype=torch.long, device=device),
                   torch.zeros(rows, vocab, dtype=torch.int32, device=device),
                   torch.zeros(rows, vocab, dtype=torch.bool, device=device),
                   torch.zeros(rows, -(-vocab // BLOCK), 3, device=device), torch.zeros(rows, len(DRAW), device=device),
                   torch.zeros(rows, dtype=torch.int32, device=device))

    def first(self, rows: int) -> SamplingTable:
        """The first `rows` rows, as views (a row-count bucket of a larger batch)."""
        return SamplingTable(self.floats[:rows], self.ints[:rows], self.counts[:rows], self.prompt[:rows],
                             self.partials[:rows], self.draws[:rows], self.arrivals[:rows])

    def fill(self, rows: list[int], settings: list[tuple[Sampling, int]], prompts) -> None:
        """Rows `rows` take settings [(sampling, stream)] and, where penalised, their prompt's marks
        (prompts[i]: row i's ids) and zero counts: two copies to the device, whatever the count. An
        unseeded request draws a seed here; its prompts share it."""
        seeds, floats, ints = {}, [], []
        for row, (s, stream) in zip(rows, settings):
            if s.seed is None and id(s) not in seeds:
                seeds[id(s)] = random.getrandbits(63)
            floats.append([0.0 if s.greedy else s.temperature, s.top_p, s.repetition_penalty, s.presence_penalty,
                           s.frequency_penalty])
            ints.append([row, s.top_k, s.seed if s.seed is not None else seeds[id(s)], stream, int(s.penalized)])
        device = self.floats.device
        ints_in = send(torch.tensor(ints, dtype=torch.long), device)
        where = ints_in[:, 0]
        self.floats.index_copy_(0, where, send(torch.tensor(floats, dtype=torch.float32), device))
        self.ints.index_copy_(0, where, ints_in[:, 1:])
        marked = [i for i, (s, _) in enumerate(settings) if s.penalized]
        if marked:
            penalized = send(torch.tensor([rows[i] for i in marked]), device)
            self.counts.index_fill_(0, penalized, 0)
            self.prompt.index_fill_(0, penalized, False)
            pairs = send(torch.tensor([[rows[i], int(t)] for i in marked for t in prompts[i]]), device)
            self.prompt[pairs[:, 0], pairs[:, 1]] = True

    def move(self, to: int, frm: int) -> None:
        """Row `frm`'s settings and history into row `to` (the serving scheduler's compaction)."""
        for t in (self.floats, self.ints, self.counts, self.prompt):
            t[to].copy_(t[frm])
