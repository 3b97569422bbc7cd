"""uvicorn with a drain: on SIGTERM (or Ctrl-C) /ready turns false and new generation requests get
503 while those in flight finish, for at most `drain_s`; then the server stops and the process
exits 0. A second signal stops it at once."""

from __future__ import annotations

import time

import uvicorn

from serve.app import Service

FORCED_CLOSE_S = 5  # after the drain: what uvicorn still gives open connections before closing them


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, service: Service, drain_s: float):
        super().__init__(config)
        self.service, self.drain_s, self.drain_started = service, drain_s, None

    def handle_exit(self, sig, frame) -> None:
        # uvicorn's own handler stops at once and re-raises the signal afterwards (exit 143)
        if self.drain_started is None:
            self.drain_started = time.monotonic()
            self.service.admission.draining = True
        else:
            self.should_exit = self.force_exit = True

    async def on_tick(self, counter: int) -> bool:
        if self.drain_started is not None and (self.service.admission.in_flight == 0
                                               or time.monotonic() - self.drain_started > self.drain_s):
            self.should_exit = True
        return await super().on_tick(counter)


def serve_forever(service: Service, host: str, port: int, drain_s: float) -> None:
    config = uvicorn.Config(service.asgi, host=host, port=port, log_level="warning",
                            timeout_graceful_shutdown=FORCED_CLOSE_S)
    try:
        DrainingServer(config, service, drain_s).run()
    finally:
        service.engine.close()
