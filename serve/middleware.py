"""ASGI middleware in front of the routes: the body size cap and read timeout, and admission while
draining."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from serve.errors import error

# the routes that start generation: these count as in flight, and are refused while draining
WORK = frozenset({"/generate", "/batch_generate", "/v1/completions"})


class BodyLimit:
    """A request body over `limit` bytes gets 413, by its Content-Length before anything is read, or,
    for a body without one (chunked), as soon as what arrived passes the limit; one whose next part
    takes more than `timeout_s` to come gets 408 (slow clients held a connection, and a drain, for as
    long as they liked). The body is read here and handed on whole."""

    def __init__(self, app, limit: int, timeout_s: float, rejected: Callable[[str], None]):
        self.app, self.limit, self.timeout_s, self.rejected = app, limit, timeout_s, rejected

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await self.too_large(scope, receive, send)
        chunks, size, more = [], 0, True
        while more:
            try:
                message = await asyncio.wait_for(receive(), self.timeout_s)
            except TimeoutError:
                self.rejected("body_timeout")
                reply = error(408, f"the request body stopped arriving for {self.timeout_s:g} s; send it whole",
                              param="body")
                return await reply(scope, receive, send)
            if message["type"] != "http.request":  # the client left
                return
            chunks.append(message.get("body", b""))
            size, more = size + len(chunks[-1]), message.get("more_body", False)
            if size > self.limit:
                return await self.too_large(scope, receive, send)
        body = b"".join(chunks)

        async def replay():
            nonlocal body
            if body is None:
                return await receive()  # after the body: wait for the client's disconnect
            message, body = {"type": "http.request", "body": body, "more_body": False}, None
            return message

        await self.app(scope, replay, send)

    async def too_large(self, scope, receive, send):
        self.rejected("body_too_large")
        reply = error(413, f"the request body is over {self.limit} bytes; send a smaller one", param="body")
        await reply(scope, receive, send)


class Admission:
    """Counts the generation requests in flight (a streamed one until its last byte), and once
    `draining` is set refuses new ones with 503 while those in flight finish."""

    def __init__(self, app, rejected: Callable[[str], None]):
        self.app, self.rejected = app, rejected
        self.draining, self.in_flight = False, 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] not in WORK:
            return await self.app(scope, receive, send)
        if self.draining:
            self.rejected("draining")
            reply = error(503, "the server is shutting down; send the request to another replica", kind="server_busy",
                          headers={"Retry-After": "1"})
            return await reply(scope, receive, send)
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
