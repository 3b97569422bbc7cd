"""Errors as clients of OpenAI's API expect them: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from fastapi.responses import JSONResponse


class TimedOut(Exception):
    """A request ran past the server's time limit (504)."""


class UnknownModel(Exception):
    """A /v1 request named a model this server does not serve (404)."""


def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
          code: str | None = None, headers: dict | None = None) -> JSONResponse:
    """An error shaped like OpenAI's; the message is made safe to encode whatever the request held."""
    safe = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return JSONResponse(status_code=status, headers=headers,
                        content={"error": {"message": safe, "type": kind, "param": param, "code": code}})
