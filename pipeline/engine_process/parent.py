"""The HTTP side of the engine process: EngineProcess starts the child (pipeline.engine_process.child) and waits
until it is ready; each HTTP process's EngineClient submits jobs through its channel and hands each
job what arrives for it (the messages: pipeline.engine_process.messages)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline.engine_process.child import engine_main
from pipeline.engine_process.messages import STARTED, Cancel, End, EngineSpec, Failed, Score, Submit
from pipeline.errors import UserError
from pipeline.runtime.sampling import Sampling

START_TIMEOUT_S = 900  # the child opens the backend and captures every graph before it answers


class EngineStopped(RuntimeError):
    """The engine process has stopped: nothing can run here any more (503; the server exits)."""


class QueueFull(Exception):
    """The waiting queue is at its cap."""


@dataclass(eq=False)
class RemoteJob:
    """A request's prompts as the parent sees them: `deliver` gets what the child sends for it;
    cancel and end are passed on to the child's scheduler."""
    id: int
    prompts: list[list[int]]
    sampling: Sampling
    deliver: Callable[[object], None]
    send: Callable[[Cancel | End], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    ended: set[int] = field(default_factory=set)
    started: bool = False

    def cancel(self) -> None:
        if not self.cancelled.is_set():
            self.cancelled.set()
            self.send(Cancel(self.id))

    def end(self, prompt: int) -> None:
        """Stop one prompt (its row leaves at the child's next step); the whole job once all are ended."""
        if prompt not in self.ended:
            self.ended.add(prompt)
            if len(self.ended) == len(self.prompts):
                self.cancel()
            else:
                self.send(End(self.id, prompt))


@contextlib.contextmanager
def stop_signals_held():
    """SIGINT and SIGTERM held back until the block ends, then acted on as they would have been: a stop
    raised inside Process.start() cut the child's arguments short, and the child printed a traceback."""
    heard: list[int] = []
    stops = (signal.SIGINT, signal.SIGTERM)
    # signals reach the main thread only; a handler set outside Python (Triton's stub embeds it) is None
    # here and could not be put back
    if threading.current_thread() is not threading.main_thread() or any(signal.getsignal(s) is None for s in stops):
        yield
        return
    previous = {sig: signal.signal(sig, lambda sig, _: heard.append(sig)) for sig in stops}
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
            word = first.recv()
        except EOFError:
            code = self.process.join(5) or self.process.exitcode
            raise UserError(f"the engine process exited while starting (exit code {code})") from None
        if isinstance(word, Failed):
            raise UserError(word.detail)
        return word.info

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

    def send(self, message: Submit | Score | Cancel | End) -> None:
        """To the engine; once it is gone (a broken pipe) nothing is sent and `alive` says so: its jobs
        learn of it as the result pipe ends (read)."""
        try:
            self.commands.send(message)
        except OSError:
            self.alive = False

    def submit(self, prompts: list[list[int]], sampling: Sampling, deliver: Callable[[object], None]) -> RemoteJob:
        """A generation job: `deliver` gets each step's tokens, then None or the exception that ended it."""
        return self.enqueue(prompts, sampling, deliver, lambda id: Submit(id, prompts, sampling))

    def score(self, sequences: list[list[int]], starts: list[int], top: int, deliver: Callable[[object], None]) -> RemoteJob:
        """A scoring job (pipeline.runtime.scoring): `deliver` gets a tuple of Scores, one per sequence, or
        the exception. The engine runs it between two steps of the batch."""
        return self.enqueue(sequences, None, deliver, lambda id: Score(id, sequences, starts, top))

    def enqueue(self, prompts: list[list[int]], sampling: Sampling | None, deliver: Callable[[object], None],
                message: Callable[[int], Submit | Score]) -> RemoteJob:
        if not self.alive:
            raise EngineStopped("the engine process has stopped; the server is stopping")
        with self.waiting.get_lock():
            if self.waiting.value >= self.queue_cap:
                raise QueueFull
            self.waiting.value += 1
        job = RemoteJob(next(self.ids), prompts, sampling, deliver, self.send)
        self.jobs[job.id], self.unstarted = job, self.unstarted + 1
        self.report_load()
        self.send(message(job.id))
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
        if item == STARTED or (changed and not job.started):
            job.started, self.unstarted = True, self.unstarted - 1
            self.started(1)
        if changed and item != STARTED:
            del self.jobs[job_id]
        if changed:
            self.report_load()
        if item != STARTED:
            job.deliver(item)


