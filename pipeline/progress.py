"""Progress bars for long work: one look and the user knows it is moving and how fast. Where the
output is not a terminal (a log file, CI), a bar would print only its final state, so a plain line
says how far the work is at most every LOG_EVERY_S seconds instead."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

T = TypeVar("T")
# messages stay one line whatever the width; tables get room when output goes to a file or pipe
console = Console(stderr=True, soft_wrap=True, width=None if sys.stderr.isatty() else 160)
LOG_EVERY_S = 10.0


def _bar() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[status]}"),
                    console=console, transient=False)


@contextlib.contextmanager
def progress_task(description: str, total: int | None, visible: bool = True) -> Iterator["Task"]:
    """A bar whose status text the caller sets, e.g. `task.advance(1, status="loss 3.2")`; lines in a
    log; nothing where not `visible` (ranks other than 0 of a distributed run)."""
    if not visible:
        yield HiddenTask()
        return
    if not console.is_terminal:
        task = LoggedTask(description, total)
        yield task
        task.log(final=True)
        return
    with _bar() as bar:
        yield Task(bar, bar.add_task(description, total=total, status=""))


class Task:
    def __init__(self, bar: Progress, task_id):
        self._bar, self._id = bar, task_id

    def advance(self, n: int = 1, status: str | None = None) -> None:
        fields = {} if status is None else {"status": status}
        self._bar.update(self._id, advance=n, **fields)


class HiddenTask:
    def advance(self, n: int = 1, status: str | None = None) -> None:
        pass


class LoggedTask:
    """Task's interface for output that is not a terminal: one line per LOG_EVERY_S, and one at the end."""

    def __init__(self, description: str, total: int | None):
        self.description, self.total, self.done, self.status = description, total, 0, ""
        self.started = self.logged = time.monotonic()

    def advance(self, n: int = 1, status: str | None = None) -> None:
        self.done += n
        self.status = self.status if status is None else status
        if time.monotonic() - self.logged >= LOG_EVERY_S:
            self.log()

    def log(self, final: bool = False) -> None:
        if final and self.logged == self.started and self.done == 0:
            return  # nothing happened: no line
        self.logged = time.monotonic()
        of = f"/{self.total}" if self.total else ""
        elapsed = time.strftime("%H:%M:%S", time.gmtime(self.logged - self.started))
        console.print(f"{self.description}: {self.done}{of} {elapsed} {self.status}".rstrip(), highlight=False,
                      markup=False)


def progress(items: Iterable[T], total: int | None, description: str) -> Iterator[T]:
    with progress_task(description, total) as task:
        for item in items:
            yield item
            task.advance()
