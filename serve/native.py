"""This project's own generation API:

    POST /generate        {"prompt": "..." | ["...", ...] | [id, ...] | [[id, ...], ...], "max_new_tokens": 32, "do_sample": false, ...}
                          -> {"completions": [...], "tokens": [[...]], "finish_reasons": [...], "usage": {...}}
                          with "stream": true: server-sent events `data: {"tokens": [[...]], "text": [...]}`,
                          each prompt's new tokens and the text they add, then `event: done`
    POST /batch_generate  {"prompts": ["...", ...], ...} -> {"results": [{"text", "tokens", "finish_reason"}], "usage"}"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from pipeline.runtime.sampling import LIMITS, OPENAI_SETTINGS, Sampling
from pipeline.tokenizer import as_prompts
from serve.errors import stream_error
from serve.streaming import Completion, Hub


class GenerateSettings(BaseModel):
    # strict: "yes" is not a bool nor true an int; NaN and Infinity are not numbers; unknown fields are errors
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    # the ranges are pipeline.runtime.sampling.LIMITS, every front door's
    max_new_tokens: int = Field(32, **LIMITS["max_new_tokens"].bounds())
    do_sample: bool = False
    temperature: float = Field(1.0, **LIMITS["temperature"].bounds())
    top_k: int = Field(0, **LIMITS["top_k"].bounds())
    top_p: float = Field(1.0, **LIMITS["top_p"].bounds())
    repetition_penalty: float = Field(1.0, **LIMITS["repetition_penalty"].bounds())
    presence_penalty: float = Field(0.0, **LIMITS["presence_penalty"].bounds())
    frequency_penalty: float = Field(0.0, **LIMITS["frequency_penalty"].bounds())
    seed: int | None = Field(None, **LIMITS["seed"].bounds())
    ignore_eos: bool = False  # generate max_new_tokens whatever comes (vLLM's extension, for load tests)

    def sampling(self, eos: int) -> Sampling:
        return Sampling(max_new_tokens=self.max_new_tokens, do_sample=self.do_sample, temperature=self.temperature,
                        stop_tokens=() if self.ignore_eos else (eos,),
                        **{name: getattr(self, name) for name in OPENAI_SETTINGS})


class GenerateRequest(GenerateSettings):
    prompt: str | list[str] | list[int] | list[list[int]]  # texts, or token ids
    stream: bool = False


class BatchGenerateRequest(GenerateSettings):
    prompts: list[str] | list[list[int]]


def native_routes(hub: Hub) -> APIRouter:
    router, engine = APIRouter(), hub.engine.info

    async def start(texts: list[str | list[int]], settings: GenerateSettings) -> Completion:
        sampling = settings.sampling(hub.eos)
        ids = await hub.tokenize(texts, sampling, "max_new_tokens")
        return hub.start(ids, sampling)

    def usage(completion: Completion, started: float) -> dict:
        return {"prompt_tokens": completion.prompt_tokens,
                "completion_tokens": completion.generated_tokens,
                "seconds": round(time.perf_counter() - started, 4)}

    @router.post("/generate")
    async def generate(req: GenerateRequest, request: Request):
        started = time.perf_counter()
        completion = await start(as_prompts(req.prompt), req)
        if req.stream:
            # a streaming reply learns of a departed client when it sends: run is then closed
            return StreamingResponse(events(completion), media_type="text/event-stream")
        async for _ in completion.run(request):
            pass
        rows = completion.rows
        return {"completions": [r.text for r in rows], "tokens": [r.tokens for r in rows],
                "finish_reasons": [r.finish for r in rows], "usage": usage(completion, started),
                "backend": engine["backend"], "precision": engine["precision"]}

    @router.post("/batch_generate")
    async def batch_generate(req: BatchGenerateRequest, request: Request):
        started = time.perf_counter()
        completion = await start(req.prompts, req)
        async for _ in completion.run(request):
            pass
        return {"results": [{"text": r.text, "tokens": r.tokens, "finish_reason": r.finish} for r in completion.rows],
                "usage": usage(completion, started), "backend": engine["backend"], "precision": engine["precision"]}

    return router


async def events(completion: Completion) -> AsyncIterator[str]:
    """One server-sent event per arrival of steps: each prompt's new tokens and the text they add;
    then `done`, or `error` once the reply has started."""
    try:
        async for _ in completion.run(None):
            rows = completion.rows
            yield f"data: {json.dumps({'tokens': [r.new_tokens() for r in rows], 'text': [r.new_text() for r in rows]})}\n\n"
    except Exception as e:  # the reply has started: the error goes as an event, then done
        yield f"event: error\ndata: {json.dumps({'error': {**stream_error(e)['error'], 'type': type(e).__name__}})}\n\n"
        return
    yield "event: done\ndata: {}\n\n"
