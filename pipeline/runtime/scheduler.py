"""Serving many requests on one backend: one thread owns the backend and runs the jobs (requests)
that come to its inbox.

- ContinuousScheduler (the static-cache backends: torch-compiled, triton): continuous batching. At
  a step boundary the admission policy (pipeline.runtime.admission) lets waiting jobs join: their
  prompts are prefilled apart, and the row table (pipeline.runtime.rows) copies their keys and values
  into free cache rows and holds every row's inputs and sampling settings. Then a chunk of fused
  steps (the backend's greedy graph while every row is plain greedy, its sampled graph else: one
  replay a token either way) advances every row, each step's tokens read back while later steps run
  (pipeline.runtime.readback); a row that finishes or is cancelled leaves after it, its cache row free
  for the next join.
- SerialScheduler (every other backend): one job at a time through the Generator."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pipeline.runtime.admission import JOIN_ROWS, Admission
from pipeline.runtime.batch import send
from pipeline.runtime.generate import Generator
from pipeline.runtime.jobs import Inbox, InboxClosed, Job
from pipeline.runtime.prefills import Prefills
from pipeline.runtime.readback import HostBuffers, Readback
from pipeline.runtime.rows import Row, RowTable
from pipeline.runtime.sampler import sample
from pipeline.runtime.static.static_backend import StaticCacheBackend

# rows run this many steps a launch (a fused step's graph replayed back to back), each step's tokens read
# and delivered as it completes: the host's work per launch (joins, leaves, the launch itself) is paid
# once a chunk, where it was more than a step's GPU time at 64 rows; a chunk ends early where gathering
# jobs are due to join (docs/journal/performance.md)
GREEDY_CHUNK = 8


def no_flush() -> None:
    """The default consumer delivers each item as it comes: nothing to flush."""


class SchedulerBase:
    """The inbox and the thread; a subclass runs the jobs it takes (serve) and calls `started` as a job
    leaves the waiting ones (to run, or cancelled before it ran), also one the scheduler took from the
    inbox to wait for rows: the waiting-queue cap counts on it (pipeline.engine_process). `flush` is called once
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

    def dropped(self, job: Job) -> None:
        """A job cancelled before it ran leaves the waiting ones, and ends: its consumer counts it done."""
        self.started(job)
        job.deliver(None)

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
            if job.cancelled.is_set():
                self.dropped(job)
            else:
                self.started(job)
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


@dataclass
class Running:
    """A job's progress: each prompt's latest token (pad once stopped) and how many still run."""
    job: Job
    tokens: list[int]
    live: int


class ContinuousScheduler(SchedulerBase):
    """Steps are pipelined: a step's tokens are picked on the device and fed to the next step there, and
    the host reads them only after launching that next step, so the host's per-step work (delivery,
    joins, leaves) overlaps the device's. A row that stops at a stop token is seen up to a chunk late
    and computes those steps for nothing; a row that reaches its length leaves before it would."""

    def __init__(self, backend: StaticCacheBackend, pad_id: int, max_rows: int = 64,
                 flush: Callable[[], None] = no_flush, inbox: Inbox | None = None):
        super().__init__(flush, inbox)
        self.backend, self.pad_id, self.max_rows = backend, pad_id, max_rows
        # a row-local backend (serve --deterministic): every row's tokens the same alone or under load, so
        # one shape of step for every load, and each prompt prefilled alone at its own length
        row_local = backend.row_local
        self.join_rows = 1 if row_local else JOIN_ROWS
        self.table = RowTable(backend, max_rows, one_bucket=row_local)
        self.prefills = Prefills(backend, max_rows, pad_id, exact=row_local)
        self.admission = Admission(self.inbox, self.table, self.prefills.width_of, self.started, self.dropped)
        self.running: dict[Job, Running] = {}
        self.unread: list[Readback] = []  # picked on the device, not yet read by the host
        self.host_buffers = HostBuffers(max_rows, backend.device)
        self.chunk_columns = 0  # where the next chunk writes its tokens (launch)
        # a CPU computes a step as it is launched: nothing to overlap, and reading first delivers sooner
        self.overlap = backend.device.type == "cuda"

    @property
    def rows(self) -> list[Row]:
        return self.table.rows

    # the loop ---------------------------------------------------------------------------------
    def serve(self) -> None:
        with torch.inference_mode():
            while True:
                try:
                    self.admit(wait=not self.table.placed and not self.unread)
                    self.step()
                except InboxClosed:
                    return
                except Exception as e:  # every running job learns of it; the scheduler goes on
                    for progress in self.running.values():
                        progress.job.deliver(e)
                    self.running, self.unread = {}, []
                    self.table.clear()
                self.flush()

    def warm_up(self) -> None:
        """Capture every row bucket's fused step graphs (greedy and sampled) and every prefill graph, now
        rather than on a job's path."""
        with torch.inference_mode():
            for slot in self.table.buckets.values():
                for sampled in (False, True):
                    self.backend.bind(slot, self.table.column)
                    for _ in self.backend.steps_in_place(1, 0, sampled):
                        pass
            self.prefills.warm_up()

    # joining ----------------------------------------------------------------------------------
    def admit(self, wait: bool) -> None:
        """The jobs the admission policy lets join, joined; if that fails, those jobs learn of it and the
        running ones go on."""
        joining = self.admission.joining(wait)
        if not joining:
            return
        try:
            self.join(joining)
        except Exception as e:
            for r in [r for r in self.table.rows if r.job in joining]:
                self.table.leave(r)
            for job in joining:
                self.running.pop(job, None)
                job.deliver(e)

    def join(self, jobs: list[Job]) -> None:
        """Prefill the jobs' prompts apart from the running rows, JOIN_ROWS at a time, copy their keys
        and values into free cache rows so that every prompt ends at the current column, and pick each
        prompt's first token on the device (read with the next step's launch in flight)."""
        prompts = [(job, k, p) for job in jobs for k, p in enumerate(job.prompts)]
        self.table.advance_column(max(self.prefills.width_of([p]) for _, _, p in prompts))
        column = self.table.column
        for job in jobs:
            self.running[job] = Running(job, [self.pad_id] * len(job.prompts), len(job.prompts))
        indices = self.table.places(len(prompts))
        rows = [Row(job, k, index, column - len(p)) for (job, k, p), index in zip(prompts, indices)]
        # each prompt's cache row, the first generated token's position (its prompt's length) and the row's
        # first filled slot, sent in one copy after the first prefill's launch, which then waits for no copy
        lengths = [len(p) for _, _, p in prompts]
        rows_in = torch.tensor([indices, lengths, [column - n for n in lengths]])
        where = positions = firsts = None
        picked = []
        for start in range(0, len(rows), self.join_rows):
            chunk = rows[start:start + self.join_rows]
            width = self.prefills.width_of([r.job.prompts[r.prompt] for r in chunk])
            logits, prefilled = self.prefills.run([r.job.prompts[r.prompt] for r in chunk], width)
            if where is None:
                where, positions, firsts = send(rows_in, self.backend.device).unbind(0)
                written = self.table.settings_to_write(rows)
                if written:
                    self.table.sampling.fill([r.index for r in written], [(r.job.sampling, r.prompt) for r in written],
                                             [r.job.prompts[r.prompt] for r in written])
            into = where[start:start + len(chunk)]
            self.table.copy_in(into, prefilled, width)
            if any(r.sampled for r in chunk):
                picked.append(sample(logits, self.table.sampling, positions[start:start + len(chunk)] - 1, rows=into))
            else:
                picked.append(logits.argmax(-1))
        for r in rows:
            self.table.place(r)
        tokens = torch.cat(picked) if len(picked) > 1 else picked[0]
        self.table.start(where, tokens, positions, firsts)
        self.unread.append(Readback(rows, tokens, self.host_buffers))  # one delivery: every prompt's first token

    # stepping ---------------------------------------------------------------------------------
    def step(self) -> None:
        """Launch the next chunk of every placed row from the current column, then read and deliver what
        earlier steps and joins picked while it runs."""
        self.retire()
        if not self.overlap:
            self.read()
        launched = self.launch() if self.table.placed else []
        self.read()
        self.unread += launched
        self.table.shift(force=False)

    def read(self) -> None:
        """Deliver what was picked and not yet read, each step flushed to the consumer as soon as it is read."""
        for readback in self.unread:
            self.take(readback)
            self.flush()
        self.unread = []

    def retire(self) -> None:
        """Rows whose job was cancelled or ended stop and leave; rows whose every token is picked leave
        (their last tokens are delivered when read)."""
        for r in self.table.rows:
            if r.job.cancelled.is_set() or r.prompt in r.job.ended:
                self.stop(r)
                self.table.leave(r)
            elif r.unlaunched <= 0:
                self.table.leave(r)
        self.settle()

    def launch(self) -> list[Readback]:
        """A chunk of fused steps of every placed row, each step's tokens picked and fed to the next on the
        device, none read here -> a Readback per step. Free rows among them compute for nothing. Plain
        greedy rows alone take the greedy graph (its argmax fused into the LM head), else every row takes
        the sampled graph (greedy rows in it: their argmax). Chunks write their tokens to two sets of
        columns in turn: the chunk after this one is launched before this one's copies are read (Readback)."""
        table = self.table
        rows = list(table.placed)
        n, running = len(rows), [r for r in rows if r is not None]
        count = self.chunk(running)
        self.backend.bind(table.buckets[table.bucket(n)], table.column)
        self.chunk_columns = GREEDY_CHUNK - self.chunk_columns
        # each step's Readback as it is launched: its tokens are read as soon as that step is done
        readbacks = [Readback(rows, tokens[:n], self.host_buffers)
                     for tokens in self.backend.steps_in_place(count, self.chunk_columns, sampled=table.sampled > 0)]
        table.column += count
        self.admission.launched(count)
        for r in running:
            r.launched += count
        return readbacks

    def chunk(self, running: list[Row]) -> int:
        """Steps to launch at once: GREEDY_CHUNK, no more than the longest row still needs, fewer where
        gathering jobs are due to join or a row would pass the context. A row that ends inside a chunk
        computes to its end for nothing (none of those tokens is delivered) and leaves after it."""
        count = min(GREEDY_CHUNK, self.table.columns - self.table.column, max(r.unlaunched for r in running))
        due = self.admission.due_in()
        if due is not None:  # due to join; or, past due, waiting for rows: one frees as the first row ends
            count = min(count, due if due > 0 else min(r.unlaunched for r in running))
        for r in running:  # the chunk's last step takes position len(prompt) + launched + count - 2
            count = min(count, self.backend.n_positions + 1 - len(r.job.prompts[r.prompt]) - r.launched)
        return max(count, 1)

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
                self.table.leave(r)
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


def make_scheduler(backend, pad_id: int, max_rows: int = 64, continuous: bool = True,
                   flush: Callable[[], None] = no_flush, inbox: Inbox | None = None,
                   deterministic: bool = False) -> SchedulerBase:
    """Continuous batching where the backend allows it (and `continuous`), else one job at a time.
    deterministic: every request's tokens the same alone and beside any others: a continuous backend's
    rows are computed row-local (StaticCacheBackend.make_row_local); one job at a time computes each
    request apart already."""
    if continuous and isinstance(backend, StaticCacheBackend):
        if deterministic:
            backend.make_row_local()
        scheduler = ContinuousScheduler(backend, pad_id, max_rows, flush, inbox)
        scheduler.warm_up()
        return scheduler
    return SerialScheduler(Generator(backend, pad_id), flush, inbox)
