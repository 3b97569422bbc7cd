"""The HTTP service: the pipeline's generation runtime behind FastAPI.

    GET  /health                 alive, and what is loaded (backend, precision, device, context)
    GET  /ready                  200 once warmed up, 503 while draining (SIGTERM)
    GET  /metrics                Prometheus text format (serve.metrics)
    POST /generate, /batch_generate        this project's API (serve.native)
    GET  /v1/models, POST /v1/completions  OpenAI's (serve.openai_api)
    POST /tokenize, /detokenize, GET /tokenizer_info  the tokenizer, as vLLM's (serve.tokenizer_api)

The engine, a process of its own (pipeline.engine_process), owns the backend; one or more HTTP processes
(serve.server) each run this app over a channel to it. Its scheduler thread runs the
requests (pipeline.runtime.scheduler): continuously batched on the static-cache backends
(torch-compiled, triton), one at a time on the others; its graphs are captured before the app
exists. The event loop never waits on the device or tokenises a long prompt: it hands requests over and
relays their tokens. A request whose client goes away, or that outlives its time limit, is
cancelled: its rows leave the batch at the next step."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from pipeline.config import ServeConfig
from pipeline.engine_process.parent import EngineClient, EngineStopped, QueueFull
from pipeline.errors import UserError
from serve.errors import TimedOut, UnknownModel, error
from serve.metrics import ServeMetrics
from serve.middleware import Admission, BodyLimit
from serve.native import native_routes
from serve.openai_api import openai_routes
from serve.streaming import Hub
from serve.tokenizer_api import tokenizer_routes


@dataclass
class Service:
    asgi: object  # what the HTTP server runs: the app behind its middleware
    app: FastAPI
    admission: Admission  # draining switch and in-flight count
    engine: EngineClient


def create_service(channel: tuple, info: dict, waiting, tokenizer, settings: ServeConfig, model_name: str,
                   docs: bool = False) -> Service:
    """The app of one HTTP process over its channel to the engine, `waiting` the count of requests
    not yet started that every HTTP process shares (pipeline.engine_process.EngineProcess)."""
    # a request runs all its prompts at once: more than the rows, or than the runtime takes, would never start
    limits = [settings.max_prompts, info["runtime_max_rows"] or settings.max_prompts]
    if info["scheduler"] == "continuous":
        limits.append(settings.max_rows)
    max_prompts = min(limits)
    gpu = info["device"].startswith("cuda")
    metrics = ServeMetrics(int(info["device"].partition(":")[2] or 0) if gpu else None)
    engine = EngineClient(channel, info, settings.queue, waiting, metrics.load)
    hub = Hub(tokenizer, engine, max_prompts, settings.timeout_s, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(_):
        engine.attach(asyncio.get_running_loop())  # what the engine sends is read on the server's loop
        yield

    app = FastAPI(title="gpt2-deploy", version="0.1.0", docs_url="/docs" if docs else None, redoc_url=None,
                  openapi_url="/openapi.json" if docs else None, lifespan=lifespan)
    admission = Admission(app, metrics.reject)
    asgi = BodyLimit(admission, settings.max_body, settings.body_timeout_s, metrics.reject)

    @app.exception_handler(UserError)
    async def user_error(_, exc: UserError):
        metrics.requests.labels("invalid").inc()
        return error(400, str(exc), param=exc.param)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request, exc: RequestValidationError):
        # the fields and what is wrong with them, never the values: those may not even be encodable
        metrics.requests.labels("invalid").inc()
        errors = exc.errors()
        # OpenAI's API answers a bad body with 400; this project's own with 422, FastAPI's default
        status = 400 if request.url.path.startswith("/v1/") else 422
        if errors and errors[0]["type"] == "json_invalid":  # its place is a character position, not a field
            where = errors[0]["loc"][-1]
            why = (errors[0].get("ctx") or {}).get("error", "")
            return error(status, f"body: not valid JSON ({why} at character {where}); send a JSON object")
        problems = ["{}: {}".format(".".join(str(p) for p in e["loc"] if p != "body") or "body", e["msg"])
                    for e in errors]
        first = errors[0]["loc"] if errors else ()
        return error(status, "; ".join(problems), param=".".join(str(p) for p in first if p != "body") or None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc: StarletteHTTPException):
        # FastAPI's own refusals (a body it cannot parse: not UTF-8, nested too deep, an integer too
        # long to convert; an unknown path or method) in OpenAI's shape, not FastAPI's {"detail": ...}
        if exc.status_code == 400:
            metrics.requests.labels("invalid").inc()
            return error(400, "body: cannot be parsed as JSON (not UTF-8, nested too deep, or a number too long); "
                              "send a UTF-8 JSON object")
        kind = "NotFoundError" if exc.status_code == 404 else "invalid_request_error"
        return error(exc.status_code, str(exc.detail), kind=kind, headers=getattr(exc, "headers", None))

    @app.exception_handler(EngineStopped)
    async def engine_stopped(_, exc: EngineStopped):
        return error(503, str(exc), kind="server_error", code="engine_stopped")

    @app.exception_handler(UnknownModel)
    async def unknown_model(_, exc: UnknownModel):
        metrics.requests.labels("invalid").inc()
        return error(404, str(exc), kind="NotFoundError", param="model", code="model_not_found")

    @app.exception_handler(QueueFull)
    async def queue_full(_, exc: QueueFull):
        metrics.reject("queue_full")
        return error(429, f"{settings.queue} requests are already waiting; retry shortly", kind="rate_limit_error",
                     headers={"Retry-After": "1"})

    @app.exception_handler(TimedOut)
    async def timed_out(_, exc: TimedOut):
        return error(504, str(exc), kind="timeout_error")

    @app.exception_handler(Exception)
    async def internal(_, exc: Exception):
        return error(500, f"internal error ({type(exc).__name__}); the server log has the details", kind="server_error")

    @app.get("/health")
    def health():
        body = {"status": "ok" if engine.alive else "engine stopped", "model": model_name, **info,
                "max_rows": settings.max_rows, "max_prompts": max_prompts}
        return body if engine.alive else JSONResponse(status_code=503, content=body)

    @app.get("/ready")
    def ready():
        if admission.draining or not engine.alive:
            reason = "draining" if admission.draining else "the engine process stopped"
            return JSONResponse(status_code=503, content={"ready": False, "reason": reason})
        return {"ready": True}

    @app.get("/metrics")
    def prometheus():
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    app.include_router(native_routes(hub))
    app.include_router(openai_routes(hub, model_name, int(time.time())))
    app.include_router(tokenizer_routes(hub, model_name))
    return Service(asgi, app, admission, engine)
