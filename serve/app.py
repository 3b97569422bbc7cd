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
from dataclasses import dataclass

from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field

from pipeline.errors import UserError
from pipeline.runtime.generate import Generator
from pipeline.runtime.sampling import Sampling

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


@dataclass
class Engine:
    """A loaded backend and its tokenizer."""
    backend: object
    tokenizer: object
    name: str
    precision: str


def load_engine(run, backend: str, precision: str, device) -> Engine:
    """Open the backend and tokenizer of a run folder, or say in one line why not."""
    from pipeline.runtime.backend import BackendUnavailable
    from pipeline.runtime.loader import open_backend
    from pipeline.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(run.checkpoint)
    try:
        opened = open_backend(run, backend, precision, device)
    except BackendUnavailable as e:
        raise UserError(f"--backend {backend} --precision {precision}: {e}") from None
    return Engine(opened, tokenizer, backend, precision)


def create_app(engine: Engine) -> FastAPI:
    app = FastAPI(title="gpt2-deploy", version="0.1.0")
    lock = threading.Lock()
    eos = engine.tokenizer.eos_token_id

    def prepare(req: GenerateRequest) -> tuple[list[str], list[list[int]], Sampling]:
        prompts = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt)
        if not prompts or len(prompts) > MAX_PROMPTS:
            raise UserError(f"prompt: give 1 to {MAX_PROMPTS} prompts")
        ids = [engine.tokenizer(p)["input_ids"] for p in prompts]
        s = Sampling(max_new_tokens=req.max_new_tokens, do_sample=req.do_sample, temperature=req.temperature,
                     top_k=req.top_k, top_p=req.top_p, repetition_penalty=req.repetition_penalty, seed=req.seed,
                     stop_tokens=(eos,))
        s.check()
        for i, p in enumerate(ids):
            if not p:
                raise UserError(f"prompt {i} is empty")
        Generator(engine.backend, eos).check_length(max(map(len, ids)), s.max_new_tokens)
        return prompts, ids, s

    def decode(row: list[int]) -> str:
        return engine.tokenizer.decode([t for t in row if t != eos])

    def generate_locked(ids: list[list[int]], s: Sampling) -> list[list[int]]:
        with lock:
            return Generator(engine.backend, eos).generate(ids, s)

    def steps(ids: list[list[int]], s: Sampling) -> Iterator[list[int]]:
        with lock:
            for token in Generator(engine.backend, eos).stream(ids, s):
                yield token.tolist()

    @app.exception_handler(UserError)
    async def user_error(_, exc: UserError):
        return JSONResponse(status_code=400, content={"error": str(exc)})

    @app.get("/health")
    def health():
        return {"status": "ok", "backend": engine.name, "precision": engine.precision,
                "device": str(engine.backend.device), "context": engine.backend.n_positions}

    @app.post("/generate")
    async def generate(req: GenerateRequest):
        prompts, ids, s = prepare(req)
        if req.stream:
            return StreamingResponse(_events(steps(ids, s), decode), media_type="text/event-stream")
        started = time.perf_counter()
        rows = await asyncio.to_thread(generate_locked, ids, s)
        return {"completions": [decode(r) for r in rows], "tokens": rows,
                "usage": {"prompt_tokens": sum(map(len, ids)), "completion_tokens": sum(map(len, rows)),
                          "seconds": round(time.perf_counter() - started, 4)},
                "backend": engine.name, "precision": engine.precision}

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
