"""From the engine to a request's handler: a job's steps, as the event loop reads them from the
engine's pipe (pipeline.engine_process.EngineClient), turned into each prompt's tokens and text (stop tokens,
stop strings, length), and the request's timings and outcome recorded."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from fastapi import Request

from pipeline.engine_process.parent import EngineClient
from pipeline.errors import UserError
from pipeline.runtime.generate import check_length
from pipeline.runtime.sampling import Sampling
from pipeline.runtime.scoring import Scores
from pipeline.runtime.text_output import RowOutput
from pipeline.tokenizer import decoded, encode, token_bytes
from serve.errors import TimedOut
from serve.metrics import ServeMetrics

DISCONNECT_POLL_S = 0.25
# prompts of up to this many characters together are tokenised on the event loop: a worker thread costs
# more, waiting under load for the loop's GIL (docs/journal/performance.md, "Serving: eight HTTP processes")
INLINE_CHARS = 2048


class Completion:
    """One request's prompts in the scheduler. `run` applies the steps as they arrive to the rows
    (RowOutput) and yields after each arrival; the request's timings and outcome go to the metrics.
    Arrivals (`arrive`, on the event loop) wake `run` through a future, and a timer every
    DISCONNECT_POLL_S wakes it to look at the clock and the client: a queue awaited with a timeout
    per step cost a busy HTTP process a share of its time (docs/journal/performance.md)."""

    def __init__(self, hub: Hub, prompts: list[list[int]], sampling: Sampling, stop: tuple[str, ...]):
        self.loop, self.arrived, self.wake = asyncio.get_running_loop(), [], None
        self.hub, self.arrived_at = hub, time.perf_counter()
        self.prompt_tokens = sum(map(len, prompts))
        self.rows = [RowOutput(hub.table, sampling, stop) for _ in prompts]
        # QueueFull before any reply starts
        self.job = hub.engine.submit(prompts, sampling, self.arrive)

    def arrive(self, item: object) -> None:
        self.arrived.append(item)
        self.poke()

    def poke(self) -> None:
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)

    @property
    def generated_tokens(self) -> int:
        return sum(len(row.tokens) for row in self.rows)

    async def run(self, request: Request | None) -> AsyncIterator[None]:
        """Yields once the steps that arrived together are applied to the rows. The job is cancelled
        when the consumer stops early (a streaming reply whose client left), when `request`'s client
        leaves (looked at every DISCONNECT_POLL_S), or past the time limit (TimedOut)."""
        metrics, timeout = self.hub.metrics, self.hub.timeout_s
        deadline = self.arrived_at + timeout
        polled = last = time.perf_counter()
        outcome, first = "cancelled", True

        def tick() -> None:
            nonlocal timer
            self.poke()
            timer = self.loop.call_later(min(DISCONNECT_POLL_S, max(0.0, deadline - time.perf_counter())), tick)

        timer = None
        tick()  # nothing waits yet: this only starts the timer
        try:
            while True:
                if not self.arrived:
                    self.wake = self.loop.create_future()
                    await self.wake
                now = time.perf_counter()
                if now > deadline:
                    outcome = "timeout"
                    raise TimedOut(f"the request ran past the server's limit of {timeout:g} s and was stopped")
                if request is not None and now - polled > DISCONNECT_POLL_S:
                    polled = now
                    if await request.is_disconnected():
                        return
                arrived, self.arrived = self.arrived, []
                steps = [x for x in arrived if isinstance(x, list)]
                end = next((x for x in arrived if not isinstance(x, list)), "running")
                if steps:
                    if first:
                        metrics.ttft.observe(now - self.arrived_at)
                    for _ in range(len(steps) - first):
                        metrics.itl.observe((now - last) / len(steps))
                    first, last = False, now
                    live = [row.finish is None for row in self.rows]
                    for step in steps:
                        for row, token in zip(self.rows, step):
                            row.add(token)
                    for i, row in enumerate(self.rows):
                        if live[i] and row.finish is not None:
                            self.job.end(i)  # the engine drops a row that a stop string ended
                    yield
                if isinstance(end, Exception):
                    outcome = "invalid" if isinstance(end, UserError) else "error"
                    raise end
                if end is None or self.job.cancelled.is_set():  # the engine is done, or every row ended
                    for row in self.rows:  # rows the scheduler stopped without a stop token (cancelled)
                        if row.finish is None:
                            row.end("length")
                    outcome = "ok"
                    return
        finally:
            timer.cancel()
            self.job.cancel()
            metrics.requests.labels(outcome).inc()
            if outcome == "ok":
                metrics.e2e.observe(time.perf_counter() - self.arrived_at)
                metrics.prompt_tokens.inc(self.prompt_tokens)
                metrics.generated_tokens.inc(self.generated_tokens)


class Hub:
    """What the handlers share: the tokenizer, the engine, the limits and the metrics."""

    def __init__(self, tokenizer, engine: EngineClient, max_prompts: int, timeout_s: float, metrics: ServeMetrics):
        self.tokenizer, self.engine, self.metrics = tokenizer, engine, metrics
        self.max_prompts, self.timeout_s, self.context = max_prompts, timeout_s, engine.info["context"]
        self.table = token_bytes(tokenizer)

    @property
    def eos(self) -> int:
        return self.tokenizer.eos_token_id

    async def tokenize(self, prompts: list[str | list[int]], sampling: Sampling, length_option: str,
                       new_tokens: int | None = None) -> list[list[int]]:
        """`encode`, on the event loop for short prompts, on a worker thread for long ones."""
        if sum(map(len, prompts)) <= INLINE_CHARS:
            return self.encode(prompts, sampling, length_option, new_tokens)
        return await asyncio.to_thread(self.encode, prompts, sampling, length_option, new_tokens)

    def encode(self, prompts: list[str | list[int]], sampling: Sampling, length_option: str,
               new_tokens: int | None = None) -> list[list[int]]:
        """The prompts' tokens (a text tokenized, a list of ids taken as it is: a client that counts its
        own tokens, as lm-evaluation-harness does, must get exactly those scored), checked with the
        sampling (count, empty prompts, ids outside the vocabulary, context: the prompt and new_tokens,
        sampling's max_new_tokens unless given), or a UserError naming what to change."""
        if not 1 <= len(prompts) <= self.max_prompts:
            raise UserError(f"prompt: give 1 to {self.max_prompts} prompts")
        sampling.check()
        ids = [self.known_ids(p, f"prompt {i}") if isinstance(p, list) else encode(self.tokenizer, p, f"prompt {i}")
               for i, p in enumerate(prompts)]
        for i, p in enumerate(ids):
            if not p:
                raise UserError(f"prompt {i} is empty")
        check_length(max(map(len, ids)), sampling.max_new_tokens if new_tokens is None else new_tokens, self.context,
                     length_option)
        return ids

    def known_ids(self, ids: list[int], what: str, param: str = "prompt") -> list[int]:
        """ids, or a UserError naming `what` and the first one outside the vocabulary."""
        vocab = len(self.table)
        for j, t in enumerate(ids):
            if not 0 <= t < vocab:
                raise UserError(f"{what}: token {j} is {t}, not an id of this model's vocabulary [0, {vocab})", param=param)
        return ids

    def text(self, prompt: str | list[int]) -> str:
        """A prompt as echo returns it: a text as sent, token ids decoded."""
        return prompt if isinstance(prompt, str) else decoded(self.table, prompt)

    def start(self, prompts: list[list[int]], sampling: Sampling, stop: tuple[str, ...] = ()) -> Completion:
        return Completion(self, prompts, sampling, stop)

    async def score(self, sequences: list[list[int]], starts: list[int], top: int) -> list[Scores]:
        """Each sequence's log-probabilities from its start on (pipeline.runtime.scoring), computed by the engine."""
        arrived = asyncio.get_running_loop().create_future()
        self.engine.score(sequences, starts, top, lambda item: arrived.done() or arrived.set_result(item))
        try:
            item = await asyncio.wait_for(arrived, self.timeout_s)
        except TimeoutError:
            raise TimedOut(f"scoring ran past the server's limit of {self.timeout_s:g} s") from None
        if isinstance(item, Exception):
            raise item
        return list(item)
