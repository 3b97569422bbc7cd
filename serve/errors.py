"""Errors as clients of OpenAI's API expect them: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from pipeline.engine_process.parent import EngineStopped
from pipeline.errors import UserError


class TimedOut(Exception):
    """A request ran past the server's time limit (504)."""


def stream_error(e: Exception) -> dict:
    """What a stream that has started sends for the error that ended it: a request's own fault, a time
    limit, the engine gone, or anything else (named, never its traceback)."""
    if isinstance(e, TimedOut):
        return error_body(str(e), "timeout_error")
    if isinstance(e, EngineStopped):
        return error_body(str(e), "server_error", code="engine_stopped")
    if isinstance(e, UserError):
        return error_body(str(e))
    return error_body(f"internal error ({type(e).__name__}); the server log has the details", "server_error")


class UnknownModel(Exception):
    """A /v1 request named a model this server does not serve (404)."""


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error object; the message made safe to encode whatever the request held."""
    safe = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return {"error": {"message": safe, "type": kind, "param": param, "code": code}}


def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
          code: str | None = None, headers: dict | None = None) -> JSONResponse:
    """An error reply shaped like OpenAI's."""
    return JSONResponse(status_code=status, headers=headers, content=error_body(message, kind, param, code))
