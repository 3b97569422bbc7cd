"""What crosses the pipes between the HTTP processes and the engine process, as named types. One
channel per HTTP process: a command pipe (HTTP -> engine: Submit, Score, Cancel, End) and a result
pipe (engine -> HTTP: first Ready or Failed, then lists of (job id, item) gathered while the
scheduler stepped, where an item is a step's tokens (a list), STARTED (the job left the queue),
None (done) or an exception)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from pipeline.runtime.sampling import Sampling

STARTED = "started"  # a job has left the queue: its first row joined the batch


@dataclass(frozen=True)
class EngineSpec:
    run: Path
    backend: str
    precision: str
    device: str
    max_rows: int
    continuous: bool
    deterministic: bool = False  # every request's tokens the same alone and under load (make_scheduler)


class Submit(NamedTuple):
    """A generation job: each prompt a row, all with one sampling."""
    id: int
    prompts: list[list[int]]
    sampling: Sampling


class Score(NamedTuple):
    """A scoring job (pipeline.runtime.scoring): each sequence's log-probabilities from `starts`, `top` alternatives."""
    id: int
    sequences: list[list[int]]
    starts: list[int]
    top: int


class Cancel(NamedTuple):
    id: int


class End(NamedTuple):
    """One prompt of a job stopped (its row leaves at the next step)."""
    id: int
    prompt: int


class Ready(NamedTuple):
    """The engine's first word on the first result pipe: what it runs."""
    info: dict


class Failed(NamedTuple):
    """The engine could not start: the one line to show."""
    detail: str
