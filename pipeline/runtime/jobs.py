"""A scheduler's jobs (pipeline.runtime.scheduler) and the inbox it takes them from, apart from the
scheduler so that the serving engine's HTTP side names them without loading the backends."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline.runtime.sampling import Sampling


@dataclass(eq=False)  # identity: a job is found in lists by itself, never by its fields
class Job:
    """Prompts that run together (one HTTP request), their sampling, and where their tokens go:
    `deliver` gets each step's tokens, one per prompt (a prompt that has stopped gives pad_id), then
    None when all have stopped, or the exception that ended them."""
    prompts: list[list[int]]
    sampling: Sampling
    deliver: Callable[[object], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    ended: set[int] = field(default_factory=set)  # prompts the consumer needs no more of (a stop string)
    on_start: Callable[[], None] | None = None  # called as the job leaves the waiting ones

    def end(self, prompt: int) -> None:
        """Stop one prompt at the next step (its row leaves); the whole job once every prompt is ended."""
        self.ended.add(prompt)
        if len(self.ended) == len(self.prompts):
            self.cancelled.set()


class InboxClosed(Exception):
    """No job can come any more: the scheduler's loop ends."""


class Inbox:
    """Where a scheduler takes its jobs from: a queue that any thread submits to. The serving engine has
    its own (pipeline.engine_process.Commands), read by the scheduler's thread itself."""

    def __init__(self) -> None:
        self.queue: queue.Queue[Job | None] = queue.Queue()

    def submit(self, job: Job) -> None:
        self.queue.put_nowait(job)

    def close(self) -> None:
        """No job comes after this: the scheduler's loop ends once it has taken those before."""
        self.queue.put_nowait(None)

    def take(self, wait: bool) -> list[Job]:
        """The jobs that came since the last call; with wait, at least one (an inbox that no job can
        reach any more raises InboxClosed)."""
        jobs = [self.queue.get()] if wait else []
        while True:
            try:
                jobs.append(self.queue.get_nowait())
            except queue.Empty:
                break
        if None in jobs:  # closed: the jobs that came before it first, then the end, at every later take
            jobs = jobs[:jobs.index(None)]
            self.close()
            if not jobs:
                raise InboxClosed
        return jobs
