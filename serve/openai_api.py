"""OpenAI's completions API, as the `openai` client and vLLM's users expect it:

    GET  /v1/models        the one model served
    POST /v1/completions   prompt (a string, a list of them, token ids or a list of id lists), max_tokens, temperature, top_p, seed, stop,
                           stream (+ stream_options.include_usage), echo, presence_penalty,
                           frequency_penalty; vLLM's extensions top_k, repetition_penalty, ignore_eos
                           and stream_options.continuous_usage_stats.
                           Ranges from pipeline.runtime.sampling.LIMITS, as every front door; n choices per prompt; logprobs (the
                           top 0-20 alternatives of each token, and the token's own), with echo
                           the prompt's too; echo with max_tokens 0 scores a prompt.

Streaming sends `data: {...}` chunks (each prompt's new text, its finish_reason on the last),
then `data: [DONE]`. Log-probabilities are computed once a choice is whole (scoring.py), so a
stream that asks for them sends each choice in one chunk at its end."""

from __future__ import annotations

import functools
import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from pipeline.errors import UserError
from pipeline.runtime.sampling import LIMITS, OPENAI_SETTINGS, Sampling
from pipeline.runtime.scoring import MAX_TOP, Scores
from pipeline.tokenizer import as_prompts, text_offsets
from serve.errors import UnknownModel, stream_error
from serve.streaming import Completion, Hub

MAX_STOP = 4  # stop strings per request, as OpenAI allows


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False  # a last chunk with the usage
    continuous_usage_stats: bool = False  # usage in every chunk (vLLM's extension)


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    model: str
    prompt: str | list[str] | list[int] | list[list[int]]  # texts, or token ids as OpenAI and vLLM take them
    max_tokens: int = Field(16, ge=0)  # 0: no new tokens (with echo: score the prompt), so not LIMITS' at least 1
    temperature: float = Field(1.0, **LIMITS["temperature"].bounds())
    top_p: float = Field(1.0, **LIMITS["top_p"].bounds())
    top_k: int = Field(-1, **LIMITS["top_k"].bounds())
    repetition_penalty: float = Field(1.0, **LIMITS["repetition_penalty"].bounds())
    presence_penalty: float = Field(0.0, **LIMITS["presence_penalty"].bounds())
    frequency_penalty: float = Field(0.0, **LIMITS["frequency_penalty"].bounds())
    seed: int | None = Field(None, **LIMITS["seed"].bounds())
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    echo: bool = False
    n: int = Field(1, ge=1)  # choices per prompt: each a row of its own, drawn on its own stream
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP)
    ignore_eos: bool = False
    user: str | None = None

    def prompts(self) -> list[str | list[int]]:
        return as_prompts(self.prompt)

    def stops(self) -> tuple[str, ...]:
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if len(stops) > MAX_STOP or not all(stops):
            raise UserError(f"stop: give at most {MAX_STOP} non-empty strings")
        return stops

    def sampling(self, eos: int) -> Sampling:
        """The sampling of the generated tokens (at least one: max_tokens 0 generates nothing, see completions)."""
        return Sampling.from_openai(max(self.max_tokens, 1), self.temperature, () if self.ignore_eos else (eos,),
                                    **{name: getattr(self, name) for name in OPENAI_SETTINGS})


def openai_routes(hub: Hub, model_name: str, created: int) -> APIRouter:
    router = APIRouter(prefix="/v1")

    @router.get("/models")
    def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "gpt2-deploy", "max_model_len": hub.context}]}

    @router.post("/completions")
    async def completions(req: CompletionRequest, request: Request):
        if req.model != model_name:
            raise UnknownModel(f"The model `{req.model}` does not exist; this server serves `{model_name}` (GET /v1/models)")
        if req.max_tokens == 0 and not req.echo:
            raise UserError("max_tokens: 0 generates nothing; give at least 1, or echo true to score the prompt",
                            param="max_tokens")
        sampling, stops, prompts = req.sampling(hub.eos), req.stops(), req.prompts()
        if len(prompts) * req.n > hub.max_prompts:
            raise UserError(f"n: {req.n} choices for each of {len(prompts)} prompts exceed the {hub.max_prompts} rows "
                            "this server runs for one request; lower n or send fewer prompts", param="n")
        ids = await hub.tokenize(prompts, sampling, "max_tokens", new_tokens=req.max_tokens)
        # the choices of a prompt are rows of their own, in OpenAI's order (prompt by prompt): each row of a
        # request draws on a stream of its own, so sampled choices differ and a seed repeats them all
        rows = [p for p in ids for _ in range(req.n)]
        completion = hub.start(rows, sampling, stops) if req.max_tokens else None
        reply = Reply(hub, completion, model_name, rows, [hub.text(p) for p in prompts for _ in range(req.n)] if req.echo else None,
                      req.n, req.logprobs)
        if req.stream:
            options = req.stream_options or StreamOptions()
            chunks = reply.chunks(options) if req.logprobs is None and completion else reply.whole_chunks(options)
            return StreamingResponse(chunks, media_type="text/event-stream")
        if completion:
            async for _ in completion.run(request):
                pass
        return reply.body(await reply.choices(), usage=True)

    return router


class Reply:
    """The completion's response bodies: whole, or as a stream of chunks. completion is None for a
    request that generates nothing (echo with max_tokens 0)."""

    def __init__(self, hub: Hub, completion: Completion | None, model: str, prompts: list[list[int]],
                 echo: list[str] | None, n: int = 1, logprobs: int | None = None):
        self.hub, self.completion, self.model, self.prompts, self.echo, self.n = hub, completion, model, prompts, echo, n
        self.logprobs = logprobs
        self.id, self.created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

    def echoed(self, index: int) -> str:
        return self.echo[index] if self.echo else ""

    def usage(self) -> dict:
        generated = self.completion.generated_tokens if self.completion else 0
        prompt = sum(map(len, self.prompts)) // self.n  # each prompt counted once, as OpenAI counts it
        return {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated}

    async def choices(self) -> list[dict]:
        """Every choice whole, with its log-probabilities where asked (once the completion has run)."""
        outputs = self.completion.rows if self.completion else [None] * len(self.prompts)
        generated = [row.scored_tokens() if row else [] for row in outputs]
        logprobs = [None] * len(outputs)
        if self.logprobs is not None:
            sequences = [p + g for p, g in zip(self.prompts, generated)]
            starts = [1 if self.echo else len(p) for p in self.prompts]
            scores = await self.hub.score(sequences, starts, self.logprobs)
            logprobs = [self.logprobs_of(i, seq, start, s) for i, (seq, start, s) in enumerate(zip(sequences, starts, scores))]
        return [{"index": i, "text": self.echoed(i) + (row.text if row else ""), "logprobs": logprobs[i],
                 "finish_reason": row.finish if row else "length"} for i, row in enumerate(outputs)]

    def logprobs_of(self, index: int, sequence: list[int], start: int, scores: Scores) -> dict:
        """OpenAI's logprobs object of one choice: its tokens (with echo the prompt's, the first of which
        has nothing before it to be scored by), each one's log-probability, its top alternatives (and
        itself, as OpenAI always includes the chosen token), and where each starts in prompt + text."""
        decode = functools.cache(lambda token: self.hub.tokenizer.decode([token]))  # each token's text once
        first = 0 if self.echo else start
        tokens = [decode(t) for t in sequence[first:]]
        offsets = text_offsets(self.hub.table, sequence)[first:]  # characters of prompt + text (OpenAI's)
        unscored = [None] if self.echo else []
        top = [{**{decode(t): v for t, v in alternatives}, decode(chosen): value}
               for chosen, value, alternatives in zip(sequence[start:], scores.token_logprobs, scores.top)]
        return {"tokens": tokens, "token_logprobs": unscored + scores.token_logprobs, "top_logprobs": unscored + top,
                "text_offset": offsets}

    async def whole_chunks(self, options: StreamOptions) -> AsyncIterator[bytes]:
        """A stream whose choices go whole, one chunk each at the end (log-probabilities are scored on
        whole choices; max_tokens 0 has nothing to wait for), then the usage if asked, then [DONE]."""
        try:
            if self.completion:
                async for _ in self.completion.run(None):
                    pass
            body = b"".join(self.chunk([choice], options.continuous_usage_stats) for choice in await self.choices())
        except Exception as e:  # the reply has started: the error goes as a chunk, then [DONE]
            body = f"data: {json.dumps(stream_error(e))}\n\n".encode()
        else:
            if options.include_usage:
                body += self.chunk([], True)
        yield body + b"data: [DONE]\n\n"

    def body(self, choices: list[dict], usage: bool) -> dict:
        body = {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": choices}
        if usage:
            body["usage"] = self.usage()
        return body

    async def chunks(self, options: StreamOptions) -> AsyncIterator[bytes]:
        """A chunk per prompt with new text or a finish, for each arrival of steps (so a chunk can carry
        several tokens' text), then the usage if asked, then [DONE]. An error after the reply has
        started is a chunk of its own."""
        rows, reported = self.completion.rows, [False] * len(self.completion.rows)
        last = b""  # the chunk that finishes every prompt, sent with the end: one write where it took three
        try:
            if self.echo:
                yield self.chunk([{"index": i, "text": p, "logprobs": None, "finish_reason": None}
                                  for i, p in enumerate(self.echo)], False)
            async for _ in self.completion.run(None):
                choices = []
                for i, row in enumerate(rows):
                    text = row.new_text()
                    if text or (row.finish and not reported[i]):
                        reported[i] = row.finish is not None
                        choices.append({"index": i, "text": text, "logprobs": None, "finish_reason": row.finish})
                if choices:
                    chunk = self.chunk(choices, options.continuous_usage_stats)
                    if all(reported):
                        last = chunk
                    else:
                        yield chunk
        except Exception as e:  # the reply has started: the error goes as a chunk, then [DONE]
            last += f"data: {json.dumps(stream_error(e))}\n\n".encode()
        else:
            if options.include_usage:
                last += self.chunk([], True)
        yield last + b"data: [DONE]\n\n"

    @functools.cached_property
    def head(self) -> bytes:
        """The body's JSON up to `"choices": `, the same in every chunk of the reply (its [] and } cut)."""
        return json.dumps(self.body([], False))[:-3].encode()

    def chunk(self, choices: list[dict], usage: bool) -> bytes:
        """`data: {body}` as json.dumps would write the body, its fixed head encoded once per reply."""
        tail = f", \"usage\": {json.dumps(self.usage())}}}" if usage else "}"
        return b"data: " + self.head + json.dumps(choices).encode() + tail.encode() + b"\n\n"
