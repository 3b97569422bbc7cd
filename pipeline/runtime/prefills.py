"""The serving scheduler's prefills: joining prompts run apart from the running rows, in a cache of
their own (views of it per join bucket of rows), each prompt left-padded to one of a few width
buckets, so that every prompt shape is captured at start-up (warm_up) and none on a request's path."""

from __future__ import annotations

import torch

from pipeline.runtime.admission import JOIN_ROWS
from pipeline.runtime.batch import left_pad
from pipeline.runtime.rows import ROW_BUCKETS
from pipeline.runtime.static.static_backend import PREFILL_GRAPHS, CacheSlot, StaticCacheBackend


class Prefills:
    def __init__(self, backend: StaticCacheBackend, max_rows: int, pad_id: int, exact: bool = False):
        """exact: each prompt is prefilled at its own length, padded to no bucket (row-local serving,
        which prefills one prompt at a time: a prompt's prefill is then the same alone or under load)."""
        self.backend, self.pad_id, self.exact = backend, pad_id, exact
        joins = sorted({b for b in ROW_BUCKETS if b < min(JOIN_ROWS, max_rows)} | {min(JOIN_ROWS, max_rows)})
        cache = backend.new_slot(joins[-1], backend.n_positions)
        self.slots = {b: backend.new_slot(b, backend.n_positions, rows_of=cache) for b in joins}
        per_graph = -(-backend.n_positions // PREFILL_GRAPHS)  # at most PREFILL_GRAPHS widths, each a multiple of 16
        step = -(-per_graph // 16) * 16
        self.widths = sorted({min(w, backend.n_positions) for w in range(step, backend.n_positions + step, step)})

    def width_of(self, prompts: list[list[int]]) -> int:
        """The width bucket the longest of the prompts is padded to."""
        longest = max(map(len, prompts))
        return longest if self.exact else next(w for w in self.widths if w >= longest)

    def run(self, prompts: list[list[int]], width: int) -> tuple[torch.Tensor, CacheSlot]:
        """Prefill up to JOIN_ROWS prompts, left-padded to `width`, in the join bucket's slot (as many rows
        as the bucket: the extra ones repeat the first prompt), whose slot marks then hold the prompts'
        attention mask. -> (last-token logits [len(prompts), V], the slot)"""
        joined = len(prompts)
        bucket = min(b for b in self.slots if b >= joined)
        batch = left_pad(prompts + prompts[:1] * (bucket - joined), self.pad_id, self.backend.device, width)
        self.backend.bind(self.slots[bucket], 0)
        return self.backend.prefill(batch)[:joined, -1], self.slots[bucket]

    def warm_up(self) -> None:
        """Capture the prefill graph of every join bucket and width, largest first (they share one memory pool)."""
        for width in [] if self.exact else reversed(self.widths):
            for rows in reversed(self.slots):
                self.run([[0]] * rows, width)
