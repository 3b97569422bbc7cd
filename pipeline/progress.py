"""Progress bars for long work: one look and the user knows it is moving and how fast."""

from __future__ import annotations

import contextlib
import sys
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


def _bar() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[status]}"),
                    console=console, transient=False)


@contextlib.contextmanager
def progress_task(description: str, total: int | None) -> Iterator["Task"]:
    """A bar whose status text the caller sets, e.g. `task.advance(1, status="loss 3.2")`."""
    with _bar() as bar:
        yield Task(bar, bar.add_task(description, total=total, status=""))


class Task:
    def __init__(self, bar: Progress, task_id):
        self._bar, self._id = bar, task_id

    def advance(self, n: int = 1, status: str | None = None) -> None:
        fields = {} if status is None else {"status": status}
        self._bar.update(self._id, advance=n, **fields)


def progress(items: Iterable[T], total: int | None, description: str) -> Iterator[T]:
    with progress_task(description, total) as task:
        for item in items:
            yield item
            task.advance()
