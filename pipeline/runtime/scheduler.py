"""Serving many requests on one backend: one thread owns the backend and runs the jobs (requests)
that come to its inbox.

- ContinuousScheduler (the static-cache backends: torch-compiled, triton): continuous batching. At
  a step boundary waiting jobs join the running batch (their prefill runs apart, and its keys and
  values are copied into free rows; jobs arriving while rows run gather for a few steps, so that
  one prefill takes several), one decode step (or a chunk of greedy steps) advances every running
  row, and a finished or cancelled row leaves after it, its cache row free for the next join. Each
  row keeps its own position, sampling, seed, stop tokens and length, so greedy and sampled rows
  share a batch. Steps are pipelined: the host reads a step's tokens while the next step runs
  (ContinuousScheduler).
- SerialScheduler (every other backend): one job at a time through the Generator.

All rows of the static cache write the same column at a step (its decode kernels take one slot for
the batch), so a joining prompt is placed to end at the current column, its row's earlier slots
marked empty; positions are per row, so that changes nothing of what a row computes. The column
only grows while rows run: when every row's first slot has moved SHIFT_COLUMNS or more to the right,
the rows are shifted left together, so attention reads little more than the rows hold."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from pipeline.runtime.batch import left_pad, send
from pipeline.runtime.generate import Generator
from pipeline.runtime.jobs import Inbox, InboxClosed, Job
from pipeline.runtime.sampling import next_tokens
from pipeline.runtime.static.static_backend import (
    PREFILL_GRAPHS,
    CacheSlot,
    StaticCacheBackend,
)

SHIFT_COLUMNS = 64  # empty columns in front of every row that make the rows move left
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # decode graphs per row count: a step computes the bucket's rows
JOIN_ROWS = 16  # prompts one prefill takes; more joining at a step run as several prefills
# plain greedy rows run this many steps a launch (the greedy graph replayed back to back), each step's
# tokens read and delivered as it completes: the host's work per launch (joins, leaves, the launch itself)
# is paid once a chunk, where it was more than a step's GPU time at 64 rows; a chunk ends early where
# gathering jobs are due to join (docs/performance.md)
GREEDY_CHUNK = 8
# while rows run, jobs that arrive gather for up to this many steps (or until JOIN_ROWS prompts wait) and
# join in one prefill: under load a prefill at nearly every step took most of the GPU's time (docs/performance.md)
JOIN_EVERY = 8


def layered(s: CacheSlot) -> list[torch.Tensor]:
    """The slot's cache as tensors [layers, B, H, T, D]: its one buffer, or each layer's alone."""
    return [s.layers] if s.layers is not None else [t[None] for t in s.cache]


def no_flush() -> None:
    """The default consumer delivers each item as it comes: nothing to flush."""


class SchedulerBase:
    """The inbox and the thread; a subclass runs the jobs it takes (serve) and calls `started` as a job
    leaves the waiting ones (to run, or cancelled before it ran), also one the scheduler took from the
    inbox to wait for rows: the waiting-queue cap counts on it (serve.engine). `flush` is called once
    what a step delivered is all delivered: a consumer that batches deliveries sends them then."""

    def __init__(self, flush: Callable[[], None] = no_flush, inbox: Inbox | None = None):
        self.flush, self.inbox = flush, inbox or Inbox()
        self.thread = threading.Thread(target=self.serve, name="scheduler", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def submit(self, job: Job) -> None:
        self.inbox.submit(job)

    def started(self, job: Job) -> None:
        if job.on_start is not None:
            job.on_start()

    def serve(self) -> None:
        raise NotImplementedError


class SerialScheduler(SchedulerBase):
    """One job at a time, its prompts batched, through the Generator: for backends without
    control over single rows of their cache (torch, ort, trt)."""

    def __init__(self, generator: Generator, flush: Callable[[], None] = no_flush, inbox: Inbox | None = None):
        super().__init__(flush, inbox)
        self.generator = generator
        self.waiting: collections.deque[Job] = collections.deque()

    def serve(self) -> None:
        while True:
            try:
                self.waiting += self.inbox.take(wait=not self.waiting)
            except InboxClosed:
                return
            job = self.waiting.popleft()
            self.started(job)
            if not job.cancelled.is_set():
                self.run(job)
            self.flush()

    def run(self, job: Job) -> None:
        try:
            for token in self.generator.stream(job.prompts, job.sampling):
                self.waiting += self.inbox.take(wait=False)  # an inbox read by this thread learns of cancels here
                if job.cancelled.is_set():
                    break
                job.deliver(token.tolist())
                self.flush()
            job.deliver(None)
        except Exception as e:  # handed to the job that caused it; the scheduler goes on
            job.deliver(e)


@dataclass(eq=False)
class Row:
    """One prompt of a running job, in cache row `index` (ContinuousScheduler.placed); its next input
    token and position live on the device (ContinuousScheduler.tokens_in / positions_in)."""
    job: Job
    prompt: int  # which of the job's prompts
    index: int  # its cache row
    first_slot: int  # the cache column of its first prompt token
    random: torch.Generator | None
    seen: torch.Tensor | None  # prompt and picked ids on the device, for the repetition penalty
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
        """Whether its tokens are picked by Sampling on the host's launch rather than the greedy graph."""
        return self.job.sampling.do_sample or self.seen is not None


@dataclass
class Running:
    """A job's progress: each prompt's latest token (pad once stopped) and how many still run."""
    job: Job
    tokens: list[int]
    live: int


class HostBuffers:
    """Page-locked buffers of `size` token ids, each with two events, reused by the Readbacks, and the
    stream their copies run on. One buffer allocated and one event made per step took a tenth of the
    serving scheduler's host time at 64 clients; a copy on the compute stream held up every step by
    9 us, 5% of a step at one row (docs/performance.md)."""

    def __init__(self, size: int, device: torch.device):
        self.size, self.spare = size, []
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def take(self) -> tuple[torch.Tensor, torch.cuda.Event, torch.cuda.Event]:
        """(buffer, an event for the picked tokens, one for their copy)"""
        return self.spare.pop() if self.spare else (torch.empty(self.size, dtype=torch.long, pin_memory=True),
                                                    torch.cuda.Event(), torch.cuda.Event())

    def give(self, buffer: tuple[torch.Tensor, torch.cuda.Event, torch.cuda.Event]) -> None:
        self.spare.append(buffer)


class Readback:
    """One step's tokens picked on the device, copied to page-locked host memory on a stream of their own
    without waiting: the host reads them (tolist) after it has launched the next steps, so the device
    never waits for the host, nor the next step for the copy. What the copy reads is not rewritten before
    it has run: the tokens are held until read (the allocator's memory), and greedy chunks take two sets
    of columns in turn, a chunk launched only once the one two before it has been read (greedy_chunk)."""

    def __init__(self, rows: list[Row | None], tokens: torch.Tensor, buffers: HostBuffers):
        self.rows = rows  # the rows as they were placed when the tokens were picked (None: free): tokens [len(rows)]
        self.buffers, self.buffer, self.tokens = buffers, None, None
        if tokens.device.type == "cuda":
            self.buffer = pinned, picked, copied = buffers.take()
            self.host, self.tokens = pinned[:len(tokens)], tokens
            picked.record()
            buffers.stream.wait_event(picked)
            with torch.cuda.stream(buffers.stream):
                self.host.copy_(tokens, non_blocking=True)
                copied.record()
        else:  # the next step may rewrite what `tokens` views (a greedy chunk's buffer)
            self.host = tokens.clone()

    def tolist(self) -> list[int]:
        if self.buffer is None:
            return self.host.tolist()
        self.buffer[2].synchronize()
        tokens = self.host.tolist()
        self.buffers.give(self.buffer)  # read: the next step's copy may overwrite it
        self.tokens = None
        return tokens


class ContinuousScheduler(SchedulerBase):
    """Steps are pipelined: a step's tokens are picked on the device and fed to the next step there, and
    the host reads them only after launching that next step, so the host's per-step work (delivery,
    joins, leaves) overlaps the device's. A row that stops at a stop token is seen one step late and
    computes one step for nothing; a row that reaches its length leaves before it would."""

    def __init__(self, backend: StaticCacheBackend, pad_id: int, max_rows: int = 64,
                 flush: Callable[[], None] = no_flush, inbox: Inbox | None = None):
        super().__init__(flush, inbox)
        self.backend, self.pad_id, self.max_rows = backend, pad_id, max_rows
        # room for a row of the longest job to start anywhere up to the model's context
        self.columns = 2 * backend.n_positions
        self.batch = backend.new_slot(max_rows, self.columns)
        # the cache as [layers, rows, H, T, D]: one copy for every layer where the backend keeps one buffer
        self.layers = layered(self.batch)
        sizes = sorted({b for b in ROW_BUCKETS if b < max_rows} | {max_rows})
        self.buckets = {b: backend.new_slot(b, self.columns, rows_of=self.batch) for b in sizes}
        # each placed row's next input token and position, where every bucket's graphs read them (the
        # buckets' inputs are views of the batch's); free rows (a bucket's idle rows, computed for nothing)
        # hold position 0 and a departed row's token, and `live` 0 (the greedy step's advance) keeps them there
        self.tokens_in, self.positions_in, self.live = self.batch.token[:, 0], self.batch.position[:, 0], self.batch.advance[:, 0]
        self.live.zero_()
        # each cache row's first filled slot, from which its attention reads (0 for a free row): rows of all
        # ages share the column, and reading every row from column 0 made a step 21% slower at 64 rows
        # than in an offline cache (docs/performance.md)
        self.first_in = self.batch.first
        # prefills run into a cache of their own, views of it per row bucket, each prompt padded to a width
        # bucket: few prompt shapes, all captured at start-up (warm_up), none on a request's path
        joins = sorted({b for b in ROW_BUCKETS if b < min(JOIN_ROWS, max_rows)} | {min(JOIN_ROWS, max_rows)})
        prefill = backend.new_slot(joins[-1], backend.n_positions)
        self.prefill_slots = {b: backend.new_slot(b, backend.n_positions, rows_of=prefill) for b in joins}
        per_graph = -(-backend.n_positions // PREFILL_GRAPHS)  # at most PREFILL_GRAPHS widths, each a multiple of 16
        step = -(-per_graph // 16) * 16
        self.widths = sorted({min(w, backend.n_positions) for w in range(step, backend.n_positions + step, step)})
        # cache row -> its Row, None where free: a row that leaves frees its cache row where it is (the
        # next join fills it) rather than moving another into it, which cost 27 copies (docs/performance.md)
        self.placed: list[Row | None] = []
        self.sampled = 0  # placed rows that sample (Row.sampled): while there are none, steps take the greedy graph
        self.running: dict[Job, Running] = {}
        self.column = 0  # the slot every row writes next
        self.deferred: list[Job] = []  # taken from the inbox, waiting for rows or room
        self.held = 0  # steps launched while the deferred jobs gathered
        self.unread: list[Readback] = []  # picked on the device, not yet read by the host
        self.host_buffers = HostBuffers(max_rows, backend.device)
        self.chunk_columns = 0  # where the next greedy chunk writes its tokens (greedy_chunk)
        # a CPU computes a step as it is launched: nothing to overlap, and reading first delivers sooner
        self.overlap = backend.device.type == "cuda"

    @property
    def rows(self) -> list[Row]:
        """The running rows, in cache-row order."""
        return [r for r in self.placed if r is not None]

    # the loop ---------------------------------------------------------------------------------
    def serve(self) -> None:
        with torch.inference_mode():
            while True:
                try:
                    self.admit(wait=not self.placed and not self.unread)
                    self.step()
                except InboxClosed:
                    return
                except Exception as e:  # every running job learns of it; the scheduler goes on
                    for progress in self.running.values():
                        progress.job.deliver(e)
                    self.placed, self.running, self.column, self.unread, self.sampled = [], {}, 0, [], 0
                    self.positions_in.zero_()  # every row free now (leave's reason)
                    self.live.zero_()
                    self.first_in.zero_()
                self.flush()

    def warm_up(self) -> None:
        """Capture every row-count bucket's decode graph, its greedy graph where the backend has one, and
        the prefill graph of every join bucket and prompt width (largest first: they share one memory
        pool), now rather than on a job's path."""
        with torch.inference_mode():
            for size in self.buckets:
                self.decode(size)
                if self.backend.fused_greedy:
                    for _ in self.greedy_chunk(size, 1):
                        pass
            for width in reversed(self.widths):
                for rows in reversed(self.prefill_slots):
                    self.prefill([[0]] * rows, width)

    def width_of(self, prompts: list[list[int]]) -> int:
        """The width bucket the longest of the prompts is padded to."""
        longest = max(map(len, prompts))
        return next(w for w in self.widths if w >= longest)

    def prefill(self, prompts: list[list[int]], width: int) -> tuple[torch.Tensor, CacheSlot]:
        """Prefill up to JOIN_ROWS prompts, left-padded to `width`, in the join bucket's prefill slot
        (as many rows as the bucket: the extra ones repeat the first prompt), whose slot marks then hold
        the prompts' attention mask. -> (last-token logits [len(prompts), V], the slot)"""
        joined = len(prompts)
        bucket = min(b for b in self.prefill_slots if b >= joined)
        batch = left_pad(prompts + prompts[:1] * (bucket - joined), self.pad_id, self.backend.device, width)
        self.backend.slot, self.backend.length = self.prefill_slots[bucket], 0
        return self.backend.prefill(batch)[:joined, -1], self.prefill_slots[bucket]

    # joining ----------------------------------------------------------------------------------
    def admit(self, wait: bool) -> None:
        """Waiting jobs into free rows, as many as fit; waits for one when nothing runs. While rows
        run, jobs gather first: they join once JOIN_ROWS prompts wait or the first has waited
        JOIN_EVERY steps."""
        self.deferred += self.inbox.take(wait and not self.deferred)
        for job in [j for j in self.deferred if j.cancelled.is_set()]:
            self.deferred.remove(job)
            self.started(job)
        waiting = sum(len(job.prompts) for job in self.deferred)
        if not waiting or (self.placed and waiting < JOIN_ROWS and self.held < JOIN_EVERY):
            if not waiting:
                self.held = 0
            return
        joining, free, width = [], self.max_rows - len(self.rows), 0
        for job in list(self.deferred):
            if len(job.prompts) <= free and self.fits(job, max(width, self.width_of(job.prompts)), joining):
                joining.append(job)
                self.deferred.remove(job)
                self.started(job)
                free, width = free - len(job.prompts), max(width, self.width_of(job.prompts))
        if not self.deferred:  # those still here wait for rows: they join as soon as rows free
            self.held = 0
        if joining:
            try:
                self.join(joining)
            except Exception as e:  # those jobs learn of it; the running ones go on
                for r in [r for r in self.rows if r.job in joining]:
                    self.leave(r)
                for job in joining:
                    self.running.pop(job, None)
                    job.deliver(e)

    def fits(self, job: Job, width: int, joining: list[Job]) -> bool:
        """Whether the job, the jobs joining with it (prompts up to `width` tokens together) and every
        placed row can run to their end from the column they would start at (shifting the rows left
        first where that makes the room)."""
        for shifted in (False, True):
            if shifted:
                self.shift(force=True)
            column = max(self.column, width)
            needed = max([j.sampling.max_new_tokens for j in (job, *joining)]
                         + [r.unlaunched for r in self.rows])
            if column + needed <= self.columns:
                return True
        return False

    def join(self, jobs: list[Job]) -> None:
        """Prefill the jobs' prompts apart from the running rows, JOIN_ROWS at a time, copy their keys
        and values into free cache rows (the lowest first) so that every prompt ends at the current
        column, and pick each prompt's first token on the device (read with the next step's launch in
        flight)."""
        prompts = [(job, k, p) for job in jobs for k, p in enumerate(job.prompts)]
        column = max(self.column, max(self.width_of([p]) for _, _, p in prompts))
        if self.placed and column > self.column:
            # running rows skip the columns up to the new one: those columns may hold marks of rows gone
            self.batch.slot_mask[:len(self.placed), self.column:column] = False
        self.column = column
        for job in jobs:
            self.running[job] = Running(job, [self.pad_id] * len(job.prompts), len(job.prompts))
        free = [i for i, r in enumerate(self.placed) if r is None]
        indices = (free + list(range(len(self.placed), self.max_rows)))[:len(prompts)]
        self.placed += [None] * (max(indices) + 1 - len(self.placed))
        # each prompt's cache row, the first generated token's position (its prompt's length) and the row's
        # first filled slot, sent in one copy after the first prefill's launch, which then waits for no copy
        lengths = [len(p) for _, _, p in prompts]
        rows_in = torch.tensor([indices, lengths, [self.column - n for n in lengths]])
        where = positions = firsts = None
        picked, joined = [], []
        for start in range(0, len(prompts), JOIN_ROWS):
            chunk = prompts[start:start + JOIN_ROWS]
            width = self.width_of([p for _, _, p in chunk])
            logits, prefilled = self.prefill([p for _, _, p in chunk], width)
            if where is None:
                where, positions, firsts = send(rows_in, self.backend.device).unbind(0)
            into, window = where[start:start + len(chunk)], slice(self.column - width, self.column)
            for big, part in zip(self.layers, layered(prefilled)):
                big[:, :, :, window].index_copy_(1, into, part[:, :len(chunk), :, :width])
            marks = self.batch.slot_mask
            marks.index_fill_(0, into, False)
            marks[:, window].index_copy_(0, into, prefilled.slot_mask[:len(chunk), :width])
            rows = []
            for (job, k, prompt), index in zip(chunk, indices[start:]):
                s = job.sampling
                random = torch.Generator(self.backend.device).manual_seed(s.seed) if s.seed is not None else None
                seen = (torch.tensor([prompt], device=self.backend.device) if s.repetition_penalty != 1.0 else None)
                row = self.placed[index] = Row(job, k, index, self.column - len(prompt), random, seen)
                self.sampled += row.sampled
                rows.append(row)
            picked.append(self.pick(rows, logits))
            joined += rows
        tokens = torch.cat(picked) if len(picked) > 1 else picked[0]
        self.tokens_in.index_copy_(0, where, tokens)
        self.positions_in.index_copy_(0, where, positions)
        self.first_in.index_copy_(0, where, firsts)
        self.live.index_fill_(0, where, 1)
        self.unread.append(Readback(joined, tokens, self.host_buffers))  # one delivery: every prompt's first token

    # stepping ---------------------------------------------------------------------------------
    def step(self) -> None:
        """Launch the next step of every placed row from the current column (a greedy chunk when every
        row is plain greedy), then read and deliver what earlier steps and joins picked while it runs."""
        self.retire()
        if not self.overlap:
            self.read()
        launched = self.launch() if self.placed else []
        self.read()
        self.unread += launched
        self.shift(force=False)

    def read(self) -> None:
        """Deliver what was picked and not yet read, each step flushed to the consumer as soon as it is read."""
        for readback in self.unread:
            self.take(readback)
            self.flush()
        self.unread = []

    def retire(self) -> None:
        """Rows whose job was cancelled or ended stop and leave; rows whose every token is picked leave
        (their last tokens are delivered when read)."""
        for r in self.rows:
            if r.job.cancelled.is_set() or r.prompt in r.job.ended:
                self.stop(r)
                self.leave(r)
            elif r.unlaunched <= 0:
                self.leave(r)
        self.settle()

    def launch(self) -> list[Readback]:
        """One step, or a greedy chunk, of every placed row, its tokens picked and fed to the next step
        on the device, none read here -> a Readback per step. Free rows among them compute for nothing.
        Plain greedy rows take the backend's greedy graph, which advances the inputs itself: one replay
        a step and no other launch (docs/performance.md)."""
        n = len(self.placed)
        size = self.bucket(n)
        rows = list(self.placed)
        running = [r for r in rows if r is not None]
        if not self.sampled and self.backend.fused_greedy:
            count = self.chunk(running)
            # each step's Readback as it is launched: its tokens are read as soon as that step is done
            readbacks = [Readback(rows, tokens[:n], self.host_buffers) for tokens in self.greedy_chunk(size, count)]
        else:
            count = 1
            tokens = self.pick(rows, self.decode(size)[:n])
            self.tokens_in[:n].copy_(tokens)
            self.positions_in[:n].add_(self.live[:n])
            readbacks = [Readback(rows, tokens, self.host_buffers)]
        self.column += count
        if self.deferred:
            self.held += count
        for r in running:
            r.launched += count
        return readbacks

    def chunk(self, running: list[Row]) -> int:
        """Greedy steps to launch at once: GREEDY_CHUNK, no more than the longest row still needs, fewer
        where gathering jobs are due to join or a row would pass the context. A row that ends inside a
        chunk computes to its end for nothing (none of those tokens is delivered) and leaves after it."""
        count = min(GREEDY_CHUNK, self.columns - self.column, max(r.unlaunched for r in running))
        if self.deferred:  # due to join; or, past due, waiting for rows: one frees as the first row ends
            due = JOIN_EVERY - self.held
            count = min(count, due if due > 0 else min(r.unlaunched for r in running))
        for r in running:  # the chunk's last step takes position len(prompt) + launched + count - 2
            count = min(count, self.backend.n_positions + 1 - len(r.job.prompts[r.prompt]) - r.launched)
        return max(count, 1)

    def greedy_chunk(self, size: int, count: int) -> Iterator[torch.Tensor]:
        """`count` greedy steps of the bucket from the current column, each feeding its argmax to the
        next on the device (the backend's greedy graph), from and into tokens_in / positions_in: yields
        each step's tokens [size] as it is launched. Chunks write their tokens to two sets of columns in
        turn: the chunk after this one is launched before this one's copies are read (Readback)."""
        self.backend.slot, self.backend.length = self.buckets[size], self.column
        self.chunk_columns = GREEDY_CHUNK - self.chunk_columns
        return self.backend.greedy_in_place(count, self.chunk_columns)

    def decode(self, size: int) -> torch.Tensor:
        """The bucket's decode step (its graph on a GPU) at the current column, from tokens_in / positions_in
        -> logits [size, V]."""
        self.backend.slot = self.buckets[size]
        return self.backend.replay_decode(None, None, self.column)

    def pick(self, rows: list[Row | None], logits: torch.Tensor) -> torch.Tensor:
        """Each row's next token from its logits, by its own sampling, seed and history, on the device
        (no wait): -> [len(rows)] (argmax for a free row)."""
        tokens = logits.argmax(-1)
        for i, r in enumerate(rows):
            if r is None:
                continue
            if r.job.sampling.do_sample or r.seen is not None:
                tokens[i] = next_tokens(logits[i:i + 1], r.seen, r.job.sampling, r.random)[0]
            if r.seen is not None:
                r.seen = torch.cat([r.seen, tokens[i:i + 1, None]], 1)
        return tokens

    def take(self, readback: Readback) -> None:
        """A step's picked tokens, read: each row's token delivered, or the row's end (a stop token or
        its length). A row stopped meanwhile gets none."""
        touched = {}
        for r, token in zip(readback.rows, readback.tolist()):
            if r is None or r.stopped:
                continue
            s = r.job.sampling
            progress = touched[r.job] = self.running[r.job]
            progress.tokens[r.prompt] = token
            r.generated += 1
            if token in s.stop_tokens or r.generated >= s.max_new_tokens:
                self.stop(r)
                self.leave(r)
        for progress in touched.values():
            progress.job.deliver(progress.tokens)
            progress.tokens = [self.pad_id] * len(progress.tokens)  # a prompt that stopped gives pad from here on
        self.settle()

    def settle(self) -> None:
        """Requests none of whose rows runs any more are done."""
        for key in [k for k, p in self.running.items() if p.live == 0]:
            self.running.pop(key).job.deliver(None)

    def stop(self, row: Row) -> None:
        if not row.stopped:
            row.stopped = True
            progress = self.running.get(row.job)
            if progress is not None:
                progress.live -= 1

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

    def free(self, index: int) -> None:
        """Cache row `index` computes for nothing from now on, at position 0, where `live` keeps it (a
        greedy chunk still advances it within the chunk): from a departed row's last position it
        could pass the context."""
        self.positions_in[index].zero_()
        self.live[index].zero_()
        self.first_in[index].zero_()

    def compact(self) -> None:
        """Free cache rows at the end are dropped; while the running rows would fit a smaller row bucket
        than the cache rows they spread over, the last moves into the lowest free one (the columns it
        holds, its marks and next input): at a bucket's edge only, so a steady load moves nothing. A
        move cost 27 copies, 0.25 ms of host time a step at 64 rows when every leave moved a row
        (docs/performance.md)."""
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
            self.free(last.index)
            last.index, self.placed[hole] = hole, last

    def bucket(self, rows: int) -> int:
        """The smallest row bucket that holds this many cache rows."""
        return min(b for b in self.buckets if b >= rows)

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


def make_scheduler(backend, pad_id: int, max_rows: int = 64, continuous: bool = True,
                   flush: Callable[[], None] = no_flush, inbox: Inbox | None = None) -> SchedulerBase:
    """Continuous batching where the backend allows it (and `continuous`), else one job at a time."""
    if continuous and isinstance(backend, StaticCacheBackend):
        scheduler = ContinuousScheduler(backend, pad_id, max_rows, flush, inbox)
        scheduler.warm_up()
        return scheduler
    return SerialScheduler(Generator(backend, pad_id), flush, inbox)
