"""The serving batch's rows: which request's prompt holds each cache row of the static cache, the
inputs every row bucket's graphs read, and every move of a row's keys and values (a join's copy in,
a leave, a compaction, a shift left). The scheduler (pipeline.runtime.scheduler) decides; this table
is the one place that touches the batch's cache and per-row inputs.

All rows write the same column at a step (the decode kernels take one slot for the batch), so a
joining prompt is placed to end at the current column, its row's earlier slots marked empty;
positions are per row, so that changes nothing of what a row computes. The column only grows while
rows run: when every row's first slot has moved SHIFT_COLUMNS or more to the right, the rows shift
left together, so attention reads little more than the rows hold."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.runtime.jobs import Job
from pipeline.runtime.static.static_backend import CacheSlot, StaticCacheBackend

SHIFT_COLUMNS = 64  # empty columns in front of every row that make the rows move left
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # decode graphs per row count: a step computes the bucket's rows


def layered(s: CacheSlot) -> list[torch.Tensor]:
    """The slot's cache as tensors [layers, B, H, T, D]: its one buffer, or each layer's alone."""
    return [s.layers] if s.layers is not None else [t[None] for t in s.cache]


@dataclass(eq=False)
class Row:
    """One prompt of a running job, in cache row `index`; its next input token and position live on the
    device (RowTable.tokens_in / positions_in), its sampling settings in the batch's SamplingTable."""
    job: Job
    prompt: int  # which of the job's prompts
    index: int  # its cache row
    first_slot: int  # the cache column of its first prompt token
    launched: int = 1  # tokens picked on the device (the join's prefill picks the first)
    generated: int = 0  # tokens the host has read and delivered
    stopped: bool = False  # nothing more is delivered (a stop token, its length, cancelled or ended)
    left: bool = False  # out of the cache's rows

    @property
    def unlaunched(self) -> int:
        """Tokens still to pick on the device before the row reaches its length."""
        return self.job.sampling.max_new_tokens - self.launched

    @property
    def sampled(self) -> bool:
        """Whether its tokens need the sampled step rather than the fused argmax (sampling or penalties)."""
        return not self.job.sampling.plain_greedy


class RowTable:
    """The batch's cache rows (`placed`: cache row -> its Row, None where free), the slot every row writes
    next (`column`), and the device inputs of every row: next token, position, `live` (the fused steps'
    advance: 0 keeps a free row at position 0) and first filled slot."""

    def __init__(self, backend: StaticCacheBackend, max_rows: int, one_bucket: bool = False):
        """one_bucket: every step computes all max_rows rows (row-local serving: a product's rows are then
        computed in one shape, whatever the load)."""
        self.backend, self.max_rows = backend, max_rows
        # room for a row of the longest job to start anywhere up to the model's context
        self.columns = 2 * backend.n_positions
        self.batch = backend.new_slot(max_rows, self.columns)
        # the cache as [layers, rows, H, T, D]: one copy for every layer where the backend keeps one buffer
        self.layers = layered(self.batch)
        sizes = sorted({b for b in ROW_BUCKETS if b < max_rows and not one_bucket} | {max_rows})
        self.buckets = {b: backend.new_slot(b, self.columns, rows_of=self.batch) for b in sizes}
        # the buckets' inputs are views of the batch's; free rows (a bucket's idle rows, computed for nothing)
        # hold position 0 and a departed row's token, and `live` 0 keeps them there
        self.tokens_in, self.positions_in, self.live = self.batch.token[:, 0], self.batch.position[:, 0], self.batch.advance[:, 0]
        self.live.zero_()
        # each row's first filled slot, from which its attention reads (0 for a free row): rows of all ages
        # share the column, and reading every row from column 0 slowed a full batch (docs/journal/performance.md)
        self.first_in = self.batch.first
        self.sampling = self.batch.sampling
        # a free cache row's sampling settings: plain greedy until a row that samples takes it (the table
        # starts zeroed: temperature 0, no penalties), so greedy joins write no settings
        self.plain_settings = [True] * max_rows
        # a row that leaves frees its cache row where it is (the next join fills it) rather than moving
        # another into it, which cost 27 copies a leave (docs/journal/performance.md)
        self.placed: list[Row | None] = []
        self.sampled = 0  # placed rows that sample (Row.sampled): while there are none, steps take the greedy graph
        self.column = 0

    @property
    def rows(self) -> list[Row]:
        """The running rows, in cache-row order."""
        return [r for r in self.placed if r is not None]

    def bucket(self, rows: int) -> int:
        """The smallest row bucket that holds this many cache rows."""
        return min(b for b in self.buckets if b >= rows)

    def clear(self) -> None:
        """Every row free (after a step failed)."""
        self.placed, self.column, self.sampled = [], 0, 0
        self.free(slice(None))

    def places(self, count: int) -> list[int]:
        """Cache rows for `count` joining prompts: free ones, the lowest first."""
        free = [i for i, r in enumerate(self.placed) if r is None]
        indices = (free + list(range(len(self.placed), self.max_rows)))[:count]
        self.placed += [None] * (max(indices) + 1 - len(self.placed))
        return indices

    def advance_column(self, column: int) -> None:
        """Running rows skip the columns up to `column` (a join whose prompts end there): those columns
        may hold marks of rows gone."""
        if self.placed and column > self.column:
            self.batch.slot_mask[:len(self.placed), self.column:column] = False
        self.column = max(self.column, column)

    def copy_in(self, into: torch.Tensor, prefilled: CacheSlot, width: int) -> None:
        """The first len(into) rows of a prefill's cache (prompts left-padded to `width`) into cache rows
        `into` [n] (device), ending at the current column, with their slot marks."""
        n, window = len(into), slice(self.column - width, self.column)
        for big, part in zip(self.layers, layered(prefilled)):
            big[:, :, :, window].index_copy_(1, into, part[:, :n, :, :width])
        marks = self.batch.slot_mask
        marks.index_fill_(0, into, False)
        marks[:, window].index_copy_(0, into, prefilled.slot_mask[:n, :width])

    def place(self, row: Row) -> None:
        self.placed[row.index] = row
        self.sampled += row.sampled

    def settings_to_write(self, rows: list[Row]) -> list[Row]:
        """Of joining rows, those whose sampling settings must be written: every sampled one, and a plain
        greedy one whose cache row holds another's settings. Marks what the rows will hold."""
        wanted = []
        for r in rows:
            if r.sampled or not self.plain_settings[r.index]:
                wanted.append(r)
            self.plain_settings[r.index] = not r.sampled
        return wanted

    def start(self, where: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, firsts: torch.Tensor) -> None:
        """Joined rows `where` [n] start from their first tokens at these positions and first slots."""
        self.tokens_in.index_copy_(0, where, tokens)
        self.positions_in.index_copy_(0, where, positions)
        self.first_in.index_copy_(0, where, firsts)
        self.live.index_fill_(0, where, 1)

    def leave(self, row: Row) -> None:
        """The row leaves the cache: its cache row is free where it is, for the next join, and rows move
        only where that lets a smaller row bucket run (compact)."""
        if row.left:
            return
        row.left = True
        self.sampled -= row.sampled
        self.placed[row.index] = None
        self.free(row.index)
        self.compact()
        if not self.placed:
            self.column = 0

    def free(self, index: int | slice) -> None:
        """Cache row `index` (or rows) computes for nothing from now on, at position 0, where `live` keeps
        it (a fused chunk still advances it within the chunk): from a departed row's last position it
        could pass the context."""
        for t in (self.positions_in, self.live, self.first_in):
            t[index].zero_()

    def compact(self) -> None:
        """Free cache rows at the end are dropped; while the running rows would fit a smaller row bucket
        than the cache rows they spread over, the last moves into the lowest free one (the columns it
        holds, its marks, next input and sampling settings): at a bucket's edge only, so a steady load
        moves nothing (docs/journal/performance.md)."""
        count = len(self.rows)
        while True:
            while self.placed and self.placed[-1] is None:
                self.placed.pop()
            if not self.placed or self.bucket(len(self.placed)) <= self.bucket(count):
                return
            hole, last = self.placed.index(None), self.placed.pop()
            held = slice(last.first_slot, self.column)
            for t in self.layers:
                t[:, hole, :, held].copy_(t[:, last.index, :, held])
            for t in (self.batch.slot_mask, self.tokens_in, self.positions_in, self.live, self.first_in):
                t[hole].copy_(t[last.index])
            if not (self.plain_settings[hole] and self.plain_settings[last.index]):
                self.sampling.move(hole, last.index)
                self.plain_settings[hole] = self.plain_settings[last.index]
            self.free(last.index)
            last.index, self.placed[hole] = hole, last

    def shift(self, force: bool) -> None:
        """Move every row left by the empty columns in front of all of them, when there are
        SHIFT_COLUMNS or more of them (or any, with force)."""
        rows = self.rows
        if not rows:
            self.column = 0
            return
        empty = min(r.first_slot for r in rows)
        if empty == 0 or (not force and empty < SHIFT_COLUMNS):
            return
        n, kept = len(self.placed), self.column - empty
        for t in self.layers:
            t[:, :n, :, :kept].copy_(t[:, :n, :, empty:self.column].clone())
        marks = self.batch.slot_mask
        marks[:n, :kept].copy_(marks[:n, empty:self.column].clone())
        self.first_in[:n].sub_(empty).clamp_(min=0)  # a free row's stays 0
        self.column = kept
        for r in rows:
            r.first_slot -= empty
