"""The engine process: the backend and its scheduler (pipeline.runtime.scheduler) in a child of its
own, reading every HTTP process's commands between its steps and sending what it delivers back, one
message a step (the messages: pipeline.engine_process.messages)."""

from __future__ import annotations

import functools
import signal
import traceback
from collections.abc import Callable
from multiprocessing import connection
from typing import TYPE_CHECKING

from pipeline.engine_process.messages import STARTED, Cancel, End, EngineSpec, Failed, Ready, Score, Submit
from pipeline.errors import UserError
from pipeline.runtime.jobs import InboxClosed, Job

if TYPE_CHECKING:  # the engine alone loads the model that scores
    from pipeline.runtime.scoring import Scorer


def engine_main(spec: EngineSpec, pad_id: int, channels: list[tuple]) -> None:
    """The child: open the backend, then run its scheduler in this thread, which reads the commands of
    every channel itself (Commands), until every HTTP process has gone."""
    import torch

    from pipeline.artifacts import RunDir
    from pipeline.cores import hold_torch_to_usable_cores
    from pipeline.machine import model_description
    from pipeline.runtime.scheduler import ContinuousScheduler, make_scheduler
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
        # the HTTP processes cap the queue (EngineClient): the engine takes whatever it is sent
        scheduler = make_scheduler(backend, pad_id, spec.max_rows, spec.continuous, outbox.flush,
                                   Commands([c for c, _ in channels], outbox, functools.partial(new_scorer, backend, run)),
                                   spec.deterministic)
    except Exception as e:  # a UserError names the option; anything else says what it was
        results[0].send(Failed(str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}"))
        return
    results[0].send(Ready({"backend": backend.name, "precision": backend.precision, "device": str(backend.device),
                               "context": backend.n_positions, "runtime_max_rows": backend.max_rows,
                               "shape": model_description(run.checkpoint),
                               "scheduler": "continuous" if isinstance(scheduler, ContinuousScheduler) else "serial",
                               "deterministic": spec.deterministic}))
    scheduler.serve()


def new_scorer(backend, run) -> Scorer:
    """The scorer, made at the first request that scores: the backend's own prefill where it has one,
    else a copy of the checkpoint's weights in eager PyTorch (most servers never score: no copy then),
    in the served precision's float type (what a GPU's fp16 and int8 backends compute activations in)."""
    import torch

    from pipeline.model import load_checkpoint
    from pipeline.runtime.scoring import Scorer, eager_logits

    if backend.own_scoring:
        return Scorer(backend.sequence_logits)
    half = backend.device.type == "cuda" and backend.precision != "fp32"
    model = load_checkpoint(run.checkpoint)
    return Scorer(eager_logits(model, backend.device, torch.float16 if half else torch.float32))


class Commands:
    """The scheduler's inbox in the engine: the HTTP processes' command pipes, read by the scheduler's own
    thread between its steps (a reader thread of their own added a wake-up to a lone request's path;
    docs/journal/performance.md). Jobs are told apart by (channel, id). `scorer` makes the Scorer, at the
    first Score."""

    def __init__(self, pipes: list, outbox: Outbox, scorer: Callable[[], Scorer]):
        self.open = {commands: index for index, commands in enumerate(pipes)}
        self.outbox, self.new_scorer, self.scorer = outbox, scorer, None
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
        key = (channel, message.id)
        if isinstance(message, Score):  # on the scheduler's thread, between two steps: the batch waits for it
            try:
                self.scorer = self.scorer or self.new_scorer()
                self.outbox.put(key, tuple(self.scorer.score(message.sequences, message.starts, message.top)))
            except Exception as e:  # noqa: BLE001 - the request gets it; the engine goes on
                self.outbox.put(key, e)
            self.outbox.flush()
        elif isinstance(message, Submit):
            job = self.jobs[key] = Job(message.prompts, message.sampling, self.outbox.deliverer(key, self.jobs))
            job.on_start = functools.partial(self.outbox.put, key, STARTED)
            jobs.append(job)
        elif isinstance(message, Cancel) and key in self.jobs:
            self.jobs[key].cancelled.set()
        elif isinstance(message, End) and key in self.jobs:
            self.jobs[key].end(message.prompt)


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
