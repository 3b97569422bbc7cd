"""The HTTP service: the pipeline's generation runtime behind FastAPI.

    GET  /health      what is loaded (backend, precision, device, context limit)
    POST /generate    {"prompt": "..." | ["...", ...], "max_new_tokens": 32, "do_sample": false, ...}
                      -> {"completions": [...], "tokens": [[...]], "usage": {...}}
                      with "stream": true: server-sent events, one per step, then `event: done`

One backend holds one KV cache, so requests are served one at a time (a lock), each in a worker
thread so the event loop stays responsive; several prompts in one request are batched together."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator

from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field

from pipeline.errors import UserError
from pipeline.runtime.sampling import Sampling
from pipeline.runtime.session import Session

MAX_PROMPTS = 64  # one request's batch


class GenerateRequest(BaseModel):
    prompt: str | list[str]
    max_new_tokens: int = Field(32, ge=1)
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = Field(0, ge=0)
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stream: bool = False


def create_app(session: Session) -> FastAPI:
    app = FastAPI(title="gpt2-deploy", version="0.1.0")
    lock = threading.Lock()
    backend = session.backend

    def prepare(req: GenerateRequest) -> tuple[list[str], list[list[int]], Sampling]:
        prompts = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt)
        if not prompts or len(prompts) > MAX_PROMPTS:
            raise UserError(f"prompt: give 1 to {MAX_PROMPTS} prompts")
        ids = [session.encode(p) for p in prompts]
        sampling = Sampling(max_new_tokens=req.max_new_tokens, do_sample=req.do_sample, temperature=req.temperature,
                     top_k=req.top_k, top_p=req.top_p, repetition_penalty=req.repetition_penalty, seed=req.seed,
                     stop_tokens=(session.eos,))
        sampling.check()
        for i, p in enumerate(ids):
            if not p:
                raise UserError(f"prompt {i} is empty")
        session.generator().check_length(max(map(len, ids)), sampling.max_new_tokens)
        return prompts, ids, sampling

    def generate_locked(ids: list[list[int]], sampling: Sampling) -> list[list[int]]:
        with lock:
            return session.generator().generate(ids, sampling)

    def steps(ids: list[list[int]], sampling: Sampling) -> Iterator[list[int]]:
        with lock:
            for token in session.generator().stream(ids, sampling):
                yield token.tolist()

    @app.exception_handler(UserError)
    async def user_error(_, exc: UserError):
        return JSONResponse(status_code=400, content={"error": str(exc)})

    @app.get("/health")
    def health():
        return {"status": "ok", "backend": backend.name, "precision": backend.precision,
                "device": str(backend.device), "context": backend.n_positions}

    @app.post("/generate")
    async def generate(req: GenerateRequest):
        prompts, ids, sampling = prepare(req)
        if req.stream:
            return StreamingResponse(_events(steps(ids, sampling), session.decode), media_type="text/event-stream")
        started = time.perf_counter()
        rows = await asyncio.to_thread(generate_locked, ids, sampling)
        return {"completions": [session.decode(r) for r in rows], "tokens": rows,
                "usage": {"prompt_tokens": sum(map(len, ids)), "completion_tokens": sum(map(len, rows)),
                          "seconds": round(time.perf_counter() - started, 4)},
                "backend": backend.name, "precision": backend.precision}

    return app


def _events(steps: Iterator[list[int]], decode) -> Iterator[str]:
    """One server-sent event per step: the new token of every row and every row's text so far."""
    rows: list[list[int]] = []
    for step in steps:
        rows = rows or [[] for _ in step]
        for row, token in zip(rows, step):
            row.append(token)
        yield f"data: {json.dumps({'tokens': step, 'texts': [decode(r) for r in rows]})}\n\n"
    yield "event: done\ndata: {}\n\n"
