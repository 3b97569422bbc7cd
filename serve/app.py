"""The HTTP service: the pipeline's generation runtime behind FastAPI.

    GET  /health      what is loaded (backend, precision, device, context limit)
    POST /generate    {"prompt": "..." | ["...", ...], "max_new_tokens": 32, "do_sample": false, ...}
                      -> {"completions": [...], "tokens": [[...]], "usage": {...}}
                      with "stream": true: server-sent events, one per step with each row's new
                      token and new text, then `event: done`

One scheduler thread owns the backend and runs the requests waiting in a bounded queue
(pipeline.runtime.scheduler): continuously batched on the static-cache backends (torch-compiled,
triton), one at a time on the others. The event loop never tokenises or waits on the device: it
only hands requests over and relays their tokens. A request whose client goes away, or that
outlives its time limit, is cancelled: its rows leave the batch at the next step."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from pipeline.errors import UserError
from pipeline.runtime.sampling import Sampling
from pipeline.runtime.scheduler import (
    ContinuousScheduler,
    Job,
    QueueFull,
    make_scheduler,
)
from pipeline.runtime.session import Session

DISCONNECT_POLL_S = 0.25


class TimedOut(Exception):
    """A request ran past Limits.timeout_s (504)."""


@dataclass(frozen=True)
class Limits:
    max_prompts: int = 64  # one request's batch
    max_rows: int = 64  # rows a continuously batched backend runs at once (all requests together)
    body_bytes: int = 1 << 20  # larger request bodies get 413 before they are read whole
    queue: int = 64  # requests waiting to start beyond this many get 429
    timeout_s: float = 120.0  # a request still running after this is cancelled (504)


class GenerateRequest(BaseModel):
    # strict: "yes" is not a bool nor true an int; NaN and Infinity are not numbers; unknown fields are errors
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    prompt: str | list[str]
    max_new_tokens: int = Field(32, ge=1)
    do_sample: bool = False
    temperature: float = Field(1.0, ge=0)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stream: bool = False
    ignore_eos: bool = False  # generate max_new_tokens whatever comes (vLLM's extension, for load tests)


def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
          headers: dict | None = None) -> JSONResponse:
    """An error shaped like OpenAI's; the message is made safe to encode whatever the request held."""
    safe = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return JSONResponse(status_code=status, headers=headers,
                        content={"error": {"message": safe, "type": kind, "param": param, "code": None}})


class BodyLimit:
    """ASGI middleware: a request body over `limit` bytes gets 413, by its Content-Length before
    anything is read, or, for a body without one (chunked), as soon as what arrived passes the limit;
    such a body is read here and handed on whole."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_large = error(413, f"the request body is over {self.limit} bytes; send a smaller one", param="body")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            if not length.isdigit() or int(length) > self.limit:
                return await too_large(scope, receive, send)
            return await self.app(scope, receive, send)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left
                return
            chunks.append(message.get("body", b""))
            size, more = size + len(chunks[-1]), message.get("more_body", False)
            if size > self.limit:
                return await too_large(scope, receive, send)
        body = b"".join(chunks)

        async def replay():
            nonlocal body
            if body is None:
                return await receive()  # after the body: wait for the client's disconnect
            message, body = {"type": "http.request", "body": body, "more_body": False}, None
            return message

        await self.app(scope, replay, send)


class Relay:
    """Hands what the scheduler thread delivers to the event loop's queues with one wake-up of the loop
    for all that arrived since the last (call_soon_threadsafe per item wakes it once per row a step)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.lock, self.pending, self.scheduled = loop, threading.Lock(), [], False

    def put(self, results: asyncio.Queue, item: object) -> None:
        with self.lock:
            self.pending.append((results, item))
            if self.scheduled:
                return
            self.scheduled = True
        self.loop.call_soon_threadsafe(self.flush)

    def flush(self) -> None:
        with self.lock:
            pending, self.pending, self.scheduled = self.pending, [], False
        for results, item in pending:
            results.put_nowait(item)


def create_app(session: Session, limits: Limits = Limits(), docs: bool = False, continuous: bool = True) -> FastAPI:
    app = FastAPI(title="gpt2-deploy", version="0.1.0", docs_url="/docs" if docs else None, redoc_url=None,
                  openapi_url="/openapi.json" if docs else None)
    app.add_middleware(BodyLimit, limit=limits.body_bytes)
    backend = session.backend
    scheduler = make_scheduler(backend, session.eos, limits.max_rows, limits.queue, continuous)
    # a continuously batched request runs all its prompts at once: more than the rows would never start
    batched = isinstance(scheduler, ContinuousScheduler)
    max_prompts = min(limits.max_prompts, limits.max_rows) if batched else limits.max_prompts
    scheduler.start()
    relays: dict[asyncio.AbstractEventLoop, Relay] = {}

    def prepare(req: GenerateRequest) -> tuple[list[list[int]], Sampling]:
        """Tokens and sampling of a request, or a UserError; run off the event loop (tokenising takes time)."""
        prompts = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt)
        if not 1 <= len(prompts) <= max_prompts:
            raise UserError(f"prompt: give 1 to {max_prompts} prompts")
        ids = [session.encode(p, f"prompt {i}") for i, p in enumerate(prompts)]
        sampling = Sampling(max_new_tokens=req.max_new_tokens, do_sample=req.do_sample, temperature=req.temperature,
                            top_k=req.top_k, top_p=req.top_p, repetition_penalty=req.repetition_penalty,
                            seed=req.seed, stop_tokens=() if req.ignore_eos else (session.eos,))
        sampling.check()
        for i, p in enumerate(ids):
            if not p:
                raise UserError(f"prompt {i} is empty")
        session.generator().check_length(max(map(len, ids)), sampling.max_new_tokens)
        return ids, sampling

    def submit(ids: list[list[int]], sampling: Sampling) -> tuple[Job, asyncio.Queue]:
        """Queue a job for the scheduler (QueueFull when the queue is at its cap), before any reply starts."""
        loop, results = asyncio.get_running_loop(), asyncio.Queue()
        relay = relays.setdefault(loop, Relay(loop))
        job = Job(ids, sampling, lambda item: relay.put(results, item))
        scheduler.submit(job)
        return job, results

    async def steps(job: Job, results: asyncio.Queue, request: Request | None) -> AsyncIterator[list[list[int]]]:
        """The job's steps as the scheduler delivers them, all that have arrived at a time (a reply then
        writes them at once). The job is cancelled when the consumer stops (a streaming reply whose
        client left), when `request`'s client leaves (looked at every DISCONNECT_POLL_S), or when the
        time limit passes."""
        deadline = time.monotonic() + limits.timeout_s
        polled = time.monotonic()
        try:
            while True:
                now = time.monotonic()
                if now > deadline:
                    raise TimedOut
                if request is not None and now - polled > DISCONNECT_POLL_S:
                    polled = now
                    if await request.is_disconnected():
                        return
                try:
                    item = await asyncio.wait_for(results.get(), timeout=min(DISCONNECT_POLL_S, deadline - now))
                except asyncio.TimeoutError:
                    continue
                arrived = [item]
                while not results.empty():
                    arrived.append(results.get_nowait())
                done = next((i for i, x in enumerate(arrived) if x is None or isinstance(x, Exception)), None)
                if arrived[:done]:
                    yield arrived[:done]
                if done is not None:
                    if isinstance(arrived[done], Exception):
                        raise arrived[done]
                    return
        finally:
            job.cancelled.set()

    @app.exception_handler(UserError)
    async def user_error(_, exc: UserError):
        return error(400, str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_, exc: RequestValidationError):
        # the fields and what is wrong with them, never the values: those may not even be encodable
        problems = ["{}: {}".format(".".join(str(p) for p in e["loc"] if p != "body") or "body", e["msg"])
                    for e in exc.errors()]
        first = exc.errors()[0]["loc"] if exc.errors() else ()
        return error(422, "; ".join(problems), param=".".join(str(p) for p in first if p != "body") or None)

    @app.exception_handler(QueueFull)
    async def queue_full(_, exc: QueueFull):
        return error(429, f"{limits.queue} requests are already waiting; retry shortly", kind="rate_limit_error",
                     headers={"Retry-After": "1"})

    @app.exception_handler(TimedOut)
    async def timed_out(_, exc: TimedOut):
        return error(504, f"the request ran past the server's limit of {limits.timeout_s:g} s and was stopped",
                     kind="timeout_error")

    @app.exception_handler(Exception)
    async def internal(_, exc: Exception):
        return error(500, f"internal error ({type(exc).__name__}); the server log has the details", kind="server_error")

    @app.get("/health")
    def health():
        return {"status": "ok", "backend": backend.name, "precision": backend.precision,
                "device": str(backend.device), "context": backend.n_positions}

    @app.post("/generate")
    async def generate(req: GenerateRequest, request: Request):
        ids, sampling = await asyncio.to_thread(prepare, req)
        job, results = submit(ids, sampling)
        if req.stream:
            # a streaming reply learns of a departed client when it sends: steps is then closed
            return StreamingResponse(events(steps(job, results, None), session.decode),
                                     media_type="text/event-stream")
        started = time.perf_counter()
        rows: list[list[int]] = [[] for _ in ids]
        async for arrived in steps(job, results, request):
            for step in arrived:
                for row, token in zip(rows, step):
                    row.append(token)
        rows = [row[:next((i + 1 for i, t in enumerate(row) if t == session.eos), len(row))] for row in rows]
        return {"completions": [session.decode(r) for r in rows], "tokens": rows,
                "usage": {"prompt_tokens": sum(map(len, ids)), "completion_tokens": sum(map(len, rows)),
                          "seconds": round(time.perf_counter() - started, 4)},
                "backend": backend.name, "precision": backend.precision}

    return app


async def events(steps: AsyncIterator[list[list[int]]], decode: Callable[[list[int]], str]) -> AsyncIterator[str]:
    """One server-sent event per step, each row's new token and the text it adds, the steps that
    arrived together written at once; then `done`."""
    rows: list[TextDelta] = []
    try:
        async for arrived in steps:
            rows = rows or [TextDelta(decode) for _ in arrived[0]]
            yield "".join(f"data: {json.dumps({'tokens': step, 'text': [row.add(t) for row, t in zip(rows, step)]})}\n\n"
                          for step in arrived)
    except (UserError, TimedOut) as e:  # the reply has started: the error goes in the stream
        yield f"event: error\ndata: {json.dumps({'error': {'message': str(e), 'type': type(e).__name__}})}\n\n"
        return
    yield "event: done\ndata: {}\n\n"


class TextDelta:
    """The text each new token adds, from decoding a few tokens rather than the whole row (vLLM's
    incremental detokenisation): the tokens from `prefix` on decode to the text already sent plus
    the new text. A token that ends inside a multi-byte character adds nothing until the token
    that completes it."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode, self.tokens, self.prefix, self.read = decode, [], 0, 0

    def add(self, token: int) -> str:
        self.tokens.append(token)
        sent = self.decode(self.tokens[self.prefix:self.read])
        text = self.decode(self.tokens[self.prefix:])
        if len(text) <= len(sent) or text.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.tokens)
        return text[len(sent):]
