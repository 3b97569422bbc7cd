"""In front of the routes: the request head's read timeout (in uvicorn's HTTP protocol), and ASGI
middleware for the body size cap and read timeout, and admission while draining."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from serve.errors import error, error_body

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


class HeadTimeout(HttpToolsProtocol):
    """uvicorn's httptools protocol that answers 408 and closes a connection whose request line and
    headers have not arrived whole `timeout_s` after the connection opened or the request began:
    uvicorn has no such limit, and a client sending a header byte a second held its connection (and a
    drain) for as long as it liked. Between requests uvicorn's keep-alive timeout does the same."""
    timeout_s = 10.0
    head_timer: asyncio.TimerHandle | None = None

    @classmethod
    def after(cls, timeout_s: float) -> type[HeadTimeout]:
        """The protocol class uvicorn is given (it makes one instance per connection)."""
        return type(cls.__name__, (cls,), {"timeout_s": timeout_s})

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        self.start_head_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.start_head_timer()

    def on_headers_complete(self) -> None:
        self.stop_head_timer()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop_head_timer()
        super().connection_lost(exc)

    def start_head_timer(self) -> None:
        if self.head_timer is None:
            self.head_timer = self.loop.call_later(self.timeout_s, self.head_too_slow)

    def stop_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def head_too_slow(self) -> None:
        self.head_timer = None
        if self.transport.is_closing():
            return
        body = json.dumps(error_body(f"the request line and headers did not arrive whole within {self.timeout_s:g} s; "
                                     "send them at once")).encode()
        self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(body), body))
        self.transport.close()
