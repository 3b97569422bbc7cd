"""The engine in a process of its own: the backend and its scheduler (pipeline.runtime.scheduler)
run in a child process, the HTTP side in one or more others (serve.server), so the scheduler never
waits for the GIL while an event loop writes streams (docs/journal/performance.md, "Serving").

One channel per HTTP process. HTTP -> engine, one pipe: ("submit", id, prompts, sampling),
("score", id, sequences, starts, top), ("cancel", id), ("end", id, prompt). Engine -> HTTP, another: lists of (id, item) gathered while
the scheduler stepped, where item is a step's tokens, "started" (the job left the queue), None
(done) or an exception."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import multiprocessing
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing import connection
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import UserError
from pipeline.runtime.jobs import InboxClosed, Job
from pipeline.runtime.sampling import Sampling

if TYPE_CHECKING:  # the engine alone loads the model that scores
    from pipeline.runtime.scoring import Scorer

START_TIMEOUT_S = 900  # the child opens the backend and captures every graph before it answers


class EngineStopped(RuntimeError):
    """The engine process has stopped: nothing can run here any more (503; the server exits)."""


class QueueFull(Exception):
    """The waiting queue is at its cap."""


@dataclass(frozen=True)
class EngineSpec:
    run: Path
    backend: str
    precision: str
    device: str
    max_rows: int
    continuous: bool


@dataclass(eq=False)
class RemoteJob:
    """A request's prompts as the parent sees them: `deliver` gets what the child sends for it;
    cancel and end are passed on to the child's scheduler."""
    id: int
    prompts: list[list[int]]
    sampling: Sampling
    deliver: Callable[[object], None]
    send: Callable[[tuple], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    ended: set[int] = field(default_factory=set)
    started: bool = False

    def cancel(self) -> None:
        if not self.cancelled.is_set():
            self.cancelled.set()
            self.send(("cancel", self.id))

    def end(self, prompt: int) -> None:
        """Stop one prompt (its row leaves at the child's next step); the whole job once all are ended."""
        if prompt not in self.ended:
            self.ended.add(prompt)
            if len(self.ended) == len(self.prompts):
                self.cancel()
            else:
                self.send(("end", self.id, prompt))


@contextlib.contextmanager
def stop_signals_held():
    """SIGINT and SIGTERM held back until the block ends, then acted on as they would have been: a stop
    raised inside Process.start() cut the child's arguments short, and the child printed a traceback."""
    heard: list[int] = []
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    previous = {sig: signal.signal(sig, lambda sig, _: heard.append(sig)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    for sig in heard:
        signal.raise_signal(sig)


class EngineProcess:
    """Starts the engine process with one channel (a command pipe and a result pipe) per HTTP process
    and waits until it is ready: backend open, every graph captured. `channels[i]` is HTTP process
    i's end: (commands writer, results reader); `waiting` counts the jobs not yet started of all of
    them, in shared memory, so the queue cap holds whatever process a request reaches."""

    def __init__(self, spec: EngineSpec, pad_id: int, channels: int = 1):
        context = multiprocessing.get_context("spawn")  # CUDA cannot be used in a forked child
        self.waiting = context.Value("q", 0)
        self.channels, child_ends = [], []
        for _ in range(channels):
            commands_in, commands_out = context.Pipe(duplex=False)  # Pipe(duplex=False) -> (reader, writer)
            results_in, results_out = context.Pipe(duplex=False)
            self.channels.append((commands_out, results_in))
            child_ends.append((commands_in, results_out))
        self.process = context.Process(target=engine_main, args=(spec, pad_id, child_ends), name="engine", daemon=True)
        started = time.perf_counter()
        try:
            with stop_signals_held():
                self.process.start()
            for ends in child_ends:
                for end in ends:
                    end.close()
            self.info = {**self.wait_ready(), "startup_s": round(time.perf_counter() - started, 3)}
        except BaseException:  # a failed start, or Ctrl-C during it: the engine ignores SIGINT and SIGTERM
            if self.process.pid is not None:
                self.process.kill()
            raise

    def wait_ready(self) -> dict:
        """What the engine runs, once it is ready; a UserError if it fails or exits first."""
        first = self.channels[0][1]
        if not first.poll(START_TIMEOUT_S):
            raise UserError(f"the engine did not start in {START_TIMEOUT_S} s")
        try:
            kind, detail = first.recv()
        except EOFError:
            code = self.process.join(5) or self.process.exitcode
            raise UserError(f"the engine process exited while starting (exit code {code})") from None
        if kind == "failed":
            raise UserError(detail)
        return detail

    def release(self) -> None:
        """This process's copies of the channels closed, once HTTP processes hold theirs."""
        for ends in self.channels:
            for end in ends:
                end.close()

    def close(self) -> None:
        """The engine stops once every command pipe is closed (its jobs with it). It ignores SIGTERM
        (its parent drains first), so a process that exits without closing it would wait on it forever."""
        self.release()
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *_) -> None:
        self.close()


class EngineClient:
    """An HTTP process's side of one channel to the engine: submit jobs (QueueFull once `waiting`,
    the jobs of every HTTP process not yet started, is at the cap), and, once attached to the event
    loop, hand each job what arrives for it. The loop reads the result pipe itself: a reader thread
    handed every arrival over with a second wake-up, and took the GIL from the loop
    (docs/journal/performance.md). `on_load(waiting, running)` hears of every change of this process's counts
    (the metrics). Everything here runs on the one event loop."""

    def __init__(self, channel: tuple, info: dict, queue_cap: int, waiting,
                 on_load: Callable[[int, int], None] = lambda waiting, running: None):
        self.commands, self.results = channel
        self.info, self.queue_cap, self.waiting, self.on_load = info, queue_cap, waiting, on_load
        self.jobs: dict[int, RemoteJob] = {}
        self.unstarted, self.ids, self.alive = 0, itertools.count(), True

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the result pipe on `loop` whenever something arrives."""
        fd = self.results.fileno()
        loop.add_reader(fd, self.read, loop, fd)

    def report_load(self) -> None:
        """(jobs waiting to start, jobs running) to on_load."""
        self.on_load(self.unstarted, len(self.jobs) - self.unstarted)

    def close(self) -> None:
        self.commands.close()

    def send(self, message: tuple) -> None:
        """To the engine; once it is gone (a broken pipe) nothing is sent and `alive` says so: its jobs
        learn of it as the result pipe ends (read)."""
        try:
            self.commands.send(message)
        except OSError:
            self.alive = False

    def submit(self, prompts: list[list[int]], sampling: Sampling, deliver: Callable[[object], None]) -> RemoteJob:
        """A generation job: `deliver` gets each step's tokens, then None or the exception that ended it."""
        return self.enqueue(prompts, sampling, deliver, ("submit", sampling))

    def score(self, sequences: list[list[int]], starts: list[int], top: int, deliver: Callable[[object], None]) -> RemoteJob:
        """A scoring job (pipeline.runtime.scoring): `deliver` gets a tuple of Scores, one per sequence, or
        the exception. The engine runs it between two steps of the batch."""
        return self.enqueue(sequences, None, deliver, ("score", starts, top))

    def enqueue(self, prompts: list[list[int]], sampling: Sampling | None, deliver: Callable[[object], None],
                message: tuple) -> RemoteJob:
        if not self.alive:
            raise EngineStopped("the engine process has stopped; the server is stopping")
        with self.waiting.get_lock():
            if self.waiting.value >= self.queue_cap:
                raise QueueFull
            self.waiting.value += 1
        job = RemoteJob(next(self.ids), prompts, sampling, deliver, self.send)
        self.jobs[job.id], self.unstarted = job, self.unstarted + 1
        self.report_load()
        self.send((message[0], job.id, prompts, *message[1:]))
        if not self.alive:  # it never reached the engine
            self.arrive(job.id, EngineStopped("the engine process has stopped; the server is stopping"))
            raise EngineStopped("the engine process has stopped; the server is stopping")
        return job

    def started(self, jobs: int) -> None:
        with self.waiting.get_lock():
            self.waiting.value -= jobs

    def read(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        """Every message that has arrived, each item to its job; at the pipe's end (the engine has
        stopped) every job still here gets the error."""
        try:
            while self.results.poll():
                for job_id, item in self.results.recv():
                    self.arrive(job_id, item)
        except (EOFError, OSError):
            loop.remove_reader(fd)
            self.alive = False
            self.started(self.unstarted)
            jobs, self.jobs, self.unstarted = list(self.jobs.values()), {}, 0
            self.report_load()
            for job in jobs:
                job.deliver(EngineStopped("the engine process stopped; the server is stopping"))

    def arrive(self, job_id: int, item: object) -> None:
        job = self.jobs.get(job_id)
        if job is None:
            return
        changed = not isinstance(item, list)
        if item == "started" or (changed and not job.started):
            job.started, self.unstarted = True, self.unstarted - 1
            self.started(1)
        if changed and item != "started":
            del self.jobs[job_id]
        if changed:
            self.report_load()
        if item != "started":
            job.deliver(item)


def engine_main(spec: EngineSpec, pad_id: int, channels: list[tuple]) -> None:
    """The child: open the backend, then run its scheduler in this thread, which reads the commands of
    every channel itself (Commands), until every HTTP process has gone."""
    import torch

    from pipeline.artifacts import RunDir
    from pipeline.cores import hold_torch_to_usable_cores
    from pipeline.machine import model_description
    from pipeline.model import load_checkpoint
    from pipeline.runtime.scheduler import ContinuousScheduler, make_scheduler
    from pipeline.runtime.scoring import Scorer
    from pipeline.runtime.session import open_named_backend

    # the parent decides when the engine stops (it drains first): a Ctrl-C or SIGTERM sent to the whole
    # process group must not kill the requests in flight; the engine ends when the last command pipe closes
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    hold_torch_to_usable_cores()  # a spawned child: the command's setting did not come with it
    results, run = [r for _, r in channels], RunDir(spec.run)
    try:
        backend = open_named_backend(run, spec.backend, spec.precision, torch.device(spec.device))
        outbox = Outbox(results)
        # the served precision's float type: what a GPU's fp16 and int8 backends compute their activations in
        half = torch.device(spec.device).type == "cuda" and backend.precision != "fp32"
        scorer = Scorer(load_checkpoint(run.checkpoint), backend.device, torch.float16 if half else torch.float32)
        # the HTTP processes cap the queue (EngineClient): the engine takes whatever it is sent
        scheduler = make_scheduler(backend, pad_id, spec.max_rows, spec.continuous, outbox.flush,
                                   Commands([c for c, _ in channels], outbox, scorer))
    except Exception as e:  # a UserError names the option; anything else says what it was
        results[0].send(("failed", str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}"))
        return
    results[0].send(("ready", {"backend": backend.name, "precision": backend.precision, "device": str(backend.device),
                               "context": backend.n_positions, "runtime_max_rows": backend.max_rows,
                               "shape": model_description(run.checkpoint),
                               "scheduler": "continuous" if isinstance(scheduler, ContinuousScheduler) else "serial"}))
    scheduler.serve()


class Commands:
    """The scheduler's inbox in the engine: the HTTP processes' command pipes, read by the scheduler's own
    thread between its steps (a reader thread of their own added a wake-up to a lone request's path;
    docs/journal/performance.md). Jobs are told apart by (channel, id)."""

    def __init__(self, pipes: list, outbox: Outbox, scorer: Scorer):
        self.open = {commands: index for index, commands in enumerate(pipes)}
        self.outbox, self.scorer = outbox, scorer
        self.jobs: dict[tuple[int, int], Job] = {}

    def take(self, wait: bool) -> list[Job]:
        """The jobs submitted since the last call, cancels and ends applied to theirs; with wait, at least
        one (InboxClosed once every HTTP process has gone: their jobs are cancelled as each goes)."""
        jobs = []
        while self.open:
            ready = connection.wait(list(self.open), None if wait and not jobs else 0)
            if not ready:
                return jobs
            for commands in ready:
                self.receive(commands, jobs)
        if wait and not jobs:
            raise InboxClosed
        return jobs

    def receive(self, commands, jobs: list[Job]) -> None:
        """One command from the pipe; a new job goes to `jobs`."""
        channel = self.open[commands]
        try:
            message = commands.recv()
        except (EOFError, OSError):  # that HTTP process has gone: its jobs with it
            del self.open[commands]
            for (owner, _), job in self.jobs.items():
                if owner == channel:
                    job.cancelled.set()
            return
        key = (channel, message[1])
        if message[0] == "score":  # on the scheduler's thread, between two steps: the batch waits for it
            _, _, sequences, starts, top = message
            try:
                self.outbox.put(key, tuple(self.scorer.score(sequences, starts, top)))
            except Exception as e:  # noqa: BLE001 - the request gets it; the engine goes on
                self.outbox.put(key, e)
            self.outbox.flush()
        elif message[0] == "submit":
            _, _, prompts, sampling = message
            job = self.jobs[key] = Job(prompts, sampling, self.outbox.deliverer(key, self.jobs))
            job.on_start = functools.partial(self.outbox.put, key, "started")
            jobs.append(job)
        elif message[0] == "cancel" and key in self.jobs:
            self.jobs[key].cancelled.set()
        elif message[0] == "end" and key in self.jobs:
            self.jobs[key].end(message[2])


class Outbox:
    """What the scheduler delivers, sent to each HTTP process in one message per step: `put` only
    appends, `flush` (the scheduler's, once a step's deliveries are all in) sends them. The scheduler's
    thread sends: a sender thread took the GIL whenever the scheduler released it (each graph replay),
    and a pipe write per job and step cost the scheduler more than a step (docs/journal/performance.md)."""

    def __init__(self, results: list):
        self.results, self.pending = results, []

    def put(self, key: tuple[int, int], item: object) -> None:
        if isinstance(item, Exception) and not isinstance(item, UserError):
            traceback.print_exception(item)  # the server log has the details; the client gets its type
            item = RuntimeError(f"{type(item).__name__}: {item}")
        self.pending.append((key, item))

    def deliverer(self, key: tuple[int, int], jobs: dict) -> Callable[[object], None]:
        def deliver(item: object) -> None:
            if not isinstance(item, list):
                jobs.pop(key, None)
            self.put(key, item)
        return deliver

    def flush(self) -> None:
        """Everything put so far, one message to each HTTP process that has any."""
        by_channel: dict[int, list] = {}
        for (channel, job_id), item in self.pending:
            by_channel.setdefault(channel, []).append((job_id, item))
        self.pending = []
        for channel, items in by_channel.items():
            try:
                self.results[channel].send(items)
            except OSError:  # that HTTP process has gone; its jobs are cancelled as its commands end
                pass
