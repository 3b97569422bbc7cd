"""Which waiting jobs join the serving batch, and when: the queue policy of the continuous scheduler.

While rows run, jobs that arrive gather for up to JOIN_EVERY steps (or until JOIN_ROWS prompts
wait) and join in one prefill: under load a prefill at nearly every step took most of the GPU's time
(docs/journal/performance.md). A job joins only where its prompts find free rows and every row, its own
and the running ones, can run to its end within the cache's columns."""

from __future__ import annotations

from collections.abc import Callable

from pipeline.runtime.jobs import Inbox, Job
from pipeline.runtime.rows import RowTable

JOIN_ROWS = 16  # prompts one prefill takes; more joining at a step run as several prefills
JOIN_EVERY = 8


class Admission:
    """The jobs taken from the inbox that wait for rows (`waiting`), and the steps launched since the
    first of them arrived (`held`)."""

    def __init__(self, inbox: Inbox, rows: RowTable, width_of: Callable[[list[list[int]]], int],
                 started: Callable[[Job], None], dropped: Callable[[Job], None]):
        self.inbox, self.rows, self.width_of, self.started, self.dropped = inbox, rows, width_of, started, dropped
        self.waiting: list[Job] = []
        self.held = 0

    def joining(self, wait: bool) -> list[Job]:
        """The jobs that join now (each told it started), as many as fit; waits for one when `wait` and
        none waits. Cancelled waiting jobs are dropped (told they started, which counts them out, and ended)."""
        self.waiting += self.inbox.take(wait and not self.waiting)
        for job in [j for j in self.waiting if j.cancelled.is_set()]:
            self.waiting.remove(job)
            self.dropped(job)
        prompts = sum(len(job.prompts) for job in self.waiting)
        if not prompts or (self.rows.placed and prompts < JOIN_ROWS and self.held < JOIN_EVERY):
            if not prompts:
                self.held = 0
            return []
        joining, free, width = [], self.rows.max_rows - len(self.rows.rows), 0
        for job in list(self.waiting):
            if len(job.prompts) <= free and self.fits(job, max(width, self.width_of(job.prompts)), joining):
                joining.append(job)
                self.waiting.remove(job)
                self.started(job)
                free, width = free - len(job.prompts), max(width, self.width_of(job.prompts))
        if not self.waiting:  # those still here wait for rows: they join as soon as rows free
            self.held = 0
        return joining

    def launched(self, steps: int) -> None:
        """Steps launched: jobs waiting to gather have waited that much longer."""
        if self.waiting:
            self.held += steps

    def due_in(self) -> int | None:
        """Steps until the gathering jobs are due to join (0 or less: past due, waiting for rows); None
        when none waits."""
        return JOIN_EVERY - self.held if self.waiting else None

    def fits(self, job: Job, width: int, joining: list[Job]) -> bool:
        """Whether the job, the jobs joining with it (prompts up to `width` tokens together) and every
        placed row can run to their end from the column they would start at (shifting the rows left
        first where that makes the room)."""
        for shifted in (False, True):
            if shifted:
                self.rows.shift(force=True)
            column = max(self.rows.column, width)
            needed = max([j.sampling.max_new_tokens for j in (job, *joining)]
                         + [r.unlaunched for r in self.rows.rows])
            if column + needed <= self.rows.columns:
                return True
        return False
