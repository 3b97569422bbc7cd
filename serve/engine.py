"""The engine in a process of its own: the backend and its scheduler (pipeline.runtime.scheduler)
run in a child process, the HTTP side in the parent, so the scheduler never waits for the GIL
while the event loop writes streams (docs/performance.md, "Serving").

Parent -> child, one pipe: ("submit", id, prompts, sampling), ("cancel", id), ("end", id, prompt).
Child -> parent, another: lists of (id, item) gathered while the scheduler stepped, where item is a
step's tokens, "started" (the job left the queue), None (done) or an exception."""

from __future__ import annotations

import functools
import itertools
import multiprocessing
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.errors import UserError
from pipeline.runtime.sampling import Sampling
from pipeline.runtime.scheduler import QueueFull

START_TIMEOUT_S = 900  # the child opens the backend and captures every graph before it answers
SWITCH_INTERVAL_S = 2e-4  # the child's scheduler, command and sender threads hand the GIL over this often


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


class EngineClient:
    """Starts the engine process and talks to it: submit jobs (QueueFull past the cap on jobs not
    yet started), and a reader thread hands each job what arrives for it."""

    def __init__(self, spec: EngineSpec, pad_id: int, queue_cap: int):
        context = multiprocessing.get_context("spawn")  # CUDA cannot be used in a forked child
        self.commands, child_commands = context.Pipe(duplex=False)[::-1]
        child_results, self.results = context.Pipe(duplex=False)[::-1]
        # Pipe(duplex=False) -> (reader, writer): the parent writes commands and reads results
        self.process = context.Process(target=engine_main, args=(spec, pad_id, child_commands, child_results),
                                       name="engine", daemon=True)
        self.queue_cap, self.lock, self.send_lock = queue_cap, threading.Lock(), threading.Lock()
        self.jobs: dict[int, RemoteJob] = {}
        self.unstarted, self.ids, self.alive = 0, itertools.count(), True
        started = time.perf_counter()
        self.process.start()
        child_commands.close()
        child_results.close()
        if not self.results.poll(START_TIMEOUT_S):
            self.process.kill()
            raise UserError(f"the engine did not start in {START_TIMEOUT_S} s")
        try:
            kind, detail = self.results.recv()
        except EOFError:
            raise UserError(f"the engine process exited while starting (exit code {self.process.join(5) or self.process.exitcode})") from None
        if kind == "failed":
            self.process.join(5)
            raise UserError(detail)
        self.info = {**detail, "startup_s": round(time.perf_counter() - started, 3)}
        self.reader = threading.Thread(target=self.read, name="engine-reader", daemon=True)
        self.reader.start()

    @property
    def load(self) -> tuple[int, int]:
        """(jobs waiting to start, jobs running)"""
        with self.lock:
            return self.unstarted, len(self.jobs) - self.unstarted

    def close(self) -> None:
        """The engine stops once the command pipe closes (its jobs with it)."""
        self.commands.close()
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()

    def send(self, message: tuple) -> None:
        with self.send_lock:
            self.commands.send(message)

    def submit(self, prompts: list[list[int]], sampling: Sampling, deliver: Callable[[object], None]) -> RemoteJob:
        if not self.alive:
            raise RuntimeError("the engine process has stopped")
        with self.lock:
            if self.unstarted >= self.queue_cap:
                raise QueueFull
            job = RemoteJob(next(self.ids), prompts, sampling, deliver, self.send)
            self.jobs[job.id], self.unstarted = job, self.unstarted + 1
        self.send(("submit", job.id, prompts, sampling))
        return job

    def read(self) -> None:
        try:
            while True:
                for job_id, item in self.results.recv():
                    with self.lock:
                        job = self.jobs.get(job_id)
                        if job is None:
                            continue
                        if item == "started" or (not isinstance(item, list) and not job.started):
                            job.started, self.unstarted = True, self.unstarted - 1
                        if not isinstance(item, list) and item != "started":
                            del self.jobs[job_id]
                    if item != "started":
                        job.deliver(item)
        except (EOFError, OSError):
            self.alive = False
            with self.lock:
                jobs, self.jobs, self.unstarted = list(self.jobs.values()), {}, 0
            for job in jobs:
                job.deliver(RuntimeError("the engine process stopped"))


def engine_main(spec: EngineSpec, pad_id: int, commands, results) -> None:
    """The child: open the backend, start its scheduler, then run commands until the parent goes."""
    import sys

    import torch

    from pipeline.artifacts import RunDir
    from pipeline.runtime.scheduler import ContinuousScheduler, Job, make_scheduler
    from pipeline.runtime.session import open_named_backend

    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # the parent decides when the engine stops (it drains first): a Ctrl-C or SIGTERM sent to the whole
    # process group must not kill the requests in flight; the engine ends when the parent's pipe closes
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        backend = open_named_backend(RunDir(spec.run), spec.backend, spec.precision, torch.device(spec.device))
        # the parent caps the queue: the child takes whatever it is sent
        scheduler = make_scheduler(backend, pad_id, spec.max_rows, 1 << 30, spec.continuous)
    except Exception as e:  # a UserError names the option; anything else says what it was
        results.send(("failed", str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}"))
        results.close()
        return
    outbox = Outbox(results)
    results.send(("ready", {"backend": backend.name, "precision": backend.precision, "device": str(backend.device),
                            "context": backend.n_positions,
                            "scheduler": "continuous" if isinstance(scheduler, ContinuousScheduler) else "serial"}))
    scheduler.start()
    threading.Thread(target=outbox.run, name="sender", daemon=True).start()
    jobs: dict[int, Job] = {}
    while True:
        try:
            message = commands.recv()
        except (EOFError, OSError):  # the parent has gone
            return
        if message[0] == "submit":
            _, job_id, prompts, sampling = message
            job = jobs[job_id] = Job(prompts, sampling, outbox.deliverer(job_id, jobs))
            job.on_start = functools.partial(outbox.put, job_id, "started")
            scheduler.submit(job)
        elif message[0] == "cancel" and message[1] in jobs:
            jobs[message[1]].cancelled.set()
        elif message[0] == "end" and message[1] in jobs:
            jobs[message[1]].end(message[2])


class Outbox:
    """What the scheduler delivers, sent to the parent in one message per batch that gathered while
    the sender was busy: a pipe write per job and step would cost the scheduler thread more than a step."""

    def __init__(self, results):
        self.results, self.pending, self.ready = results, [], threading.Condition()

    def put(self, job_id: int, item: object) -> None:
        if isinstance(item, Exception) and not isinstance(item, UserError):
            traceback.print_exception(item)  # the server log has the details; the client gets its type
            item = RuntimeError(f"{type(item).__name__}: {item}")
        with self.ready:
            self.pending.append((job_id, item))
            self.ready.notify()

    def deliverer(self, job_id: int, jobs: dict) -> Callable[[object], None]:
        def deliver(item: object) -> None:
            if not isinstance(item, list):
                jobs.pop(job_id, None)
            self.put(job_id, item)
        return deliver

    def run(self) -> None:
        while True:
            with self.ready:
                while not self.pending:
                    self.ready.wait()
                batch, self.pending = self.pending, []
            self.results.send(batch)
