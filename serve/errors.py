"""Errors as clients of OpenAI's API expect them: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from fastapi.responses import JSONResponse


class TimedOut(Exception):
    """A request ran past the server's time limit (504)."""


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
