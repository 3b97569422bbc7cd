"""The HTTP side: uvicorn with a drain, in this process or in several HTTP processes that share one
listening socket and relay one engine (serve.http_processes), as vLLM's API servers do: one event
loop at a full core was the limit at 64 streaming clients (docs/journal/performance.md, "Serving").

The drain: on SIGTERM (or Ctrl-C) /ready turns false and new generation requests get 503 while
those in flight finish, for at most `drain_s`; then the server stops and the process exits 0. A
second signal stops it at once. With several HTTP processes this process supervises: it passes
each signal on as an order to every HTTP process (they keep the signals blocked for life and read
the orders each tick, so a signal sent to the whole process group, as systemd sends it, counts once,
not twice), and exits once all have (non-zero if one failed). From the line saying it is ready, a
signal that comes before the handlers are in place is kept for them, so a signal during start-up
drains too, not kills."""

from __future__ import annotations

import asyncio
import errno
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from ctypes import c_int
from multiprocessing.connection import wait
from pathlib import Path

import uvicorn
from prometheus_client import multiprocess

from pipeline.config import ServeConfig
from pipeline.cores import usable_cores
from pipeline.engine_process.messages import EngineSpec
from pipeline.engine_process.parent import EngineProcess
from pipeline.errors import UserError
from pipeline.progress import console
from pipeline.tokenizer import load_tokenizer
from serve.app import Service, create_service
from serve.middleware import HeadTimeout

# with a GPU, 8: each process relays its streams in smaller bunches than 4 did (docs/journal/performance.md)
GPU_HTTP_PROCESSES = 8
FORCED_CLOSE_S = 5  # after the drain: what uvicorn still gives open connections before closing them
BACKLOG = 2048  # uvicorn's own default: connections the kernel holds until a process accepts them
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def serve_run(spec: EngineSpec, checkpoint: Path, settings: ServeConfig, name: str, docs: bool) -> int:
    """`gpt2-deploy serve`: the engine process and the HTTP processes in front of it, until a stop
    signal or a dead engine; the exit code (0 after a drain)."""
    tokenizer, count = load_tokenizer(checkpoint), http_process_count(settings, spec.device)
    with listen(settings) as sock, EngineProcess(spec, tokenizer.eos_token_id, count) as engine:
        heard = hold_stop_signals()  # a client may stop the server as soon as it reads the line below
        console.print(f"serve: {spec.backend} {spec.precision} from {spec.run} on http://{settings.host}:{settings.port} "
                      f"(ready in {engine.info['startup_s']:.1f} s, {count} HTTP process{'es' if count > 1 else ''})",
                      markup=False)
        if count == 1:
            return serve_here(engine, sock, tokenizer, settings, name, docs, heard)
        return serve_in_processes(engine, sock, count, checkpoint, settings, name, docs, heard)


def http_process_count(settings: ServeConfig, device: str) -> int:
    """serve.http_processes, or by the device where it is 0: one event loop keeps up with a CPU's
    engine, not with a GPU's (at most half the cores: the engine needs its own)."""
    if settings.http_processes:
        return settings.http_processes
    return min(GPU_HTTP_PROCESSES, max(1, usable_cores() // 2)) if device.startswith("cuda") else 1


class DrainingServer(uvicorn.Server):
    """`orders`: an HTTP process of several, whose stop signals stay blocked: it counts the supervisor's
    stop orders instead (the first drains, the second stops at once), and drains by itself if the
    supervisor is gone. A SIGTERM to the whole process group (systemd's stop) reached it twice, itself
    and forwarded, and the second cut its streams (docs/journal/performance.md, "Found on the way")."""

    def __init__(self, config: uvicorn.Config, service: Service, drain_s: float,
                 orders: c_int | None = None, heard: list[int] | None = None):
        super().__init__(config)
        self.service, self.drain_s, self.drain_started = service, drain_s, None
        self.engine_lost = False  # the engine process stopped: this server drains and exits 1
        self.orders, self.obeyed, self.supervisor, self.heard = orders, 0, os.getppid(), heard or []
        logging.getLogger("uvicorn.error").addFilter(self.quiet_when_forced)

    def quiet_when_forced(self, record: logging.LogRecord) -> bool:
        """A request cut by a stop at once is not the app's error: uvicorn logged each with a traceback."""
        return not (self.force_exit and record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError))

    def handle_exit(self, sig, frame) -> None:
        # uvicorn's own handler stops at once and re-raises the signal afterwards (exit 143)
        if self.drain_started is None:
            self.drain_started = time.monotonic()
            self.service.admission.draining = True
        else:
            self.should_exit = self.force_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        # uvicorn's handlers are in place: take what came before them
        for sig in self.heard:
            self.handle_exit(sig, None)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        if self.force_exit:
            # uvicorn skips the app's lifespan then, whose task, cancelled as the loop closed, was logged as
            # a failed shutdown with a traceback; this app's lifespan ends at once
            await self.lifespan.shutdown()

    async def on_tick(self, counter: int) -> bool:
        if not self.engine_lost and not self.service.engine.alive:
            # nothing can run here any more: a process supervisor restarts the server on the non-zero exit
            self.engine_lost = True
            print(f"serve: the engine process stopped; stopping (exit 1) [pid {os.getpid()}]", file=sys.stderr,
                  flush=True)
            self.handle_exit(signal.SIGTERM, None)
        if self.orders is not None:
            while self.obeyed < self.orders.value:
                self.obeyed += 1
                self.handle_exit(signal.SIGTERM, None)
            if self.drain_started is None and os.getppid() != self.supervisor:
                self.handle_exit(signal.SIGTERM, None)
        if self.drain_started is not None and (self.service.admission.in_flight == 0
                                               or time.monotonic() - self.drain_started > self.drain_s):
            self.should_exit = True
        return await super().on_tick(counter)


def hold_stop_signals() -> list[int]:
    """-> the stop signals heard from now until the server's own handlers take over. A handler, not
    a blocked mask: by then the process has other threads, and one of them would take a signal blocked
    in this one only (its default action ends the process)."""
    heard = []
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda sig, _: heard.append(sig))
    return heard


def listen(settings: ServeConfig) -> socket.socket:
    """The listening socket, bound before the engine starts: a port in use is a one-line error at once,
    not one after the start-up (uvicorn and every HTTP process take this socket)."""
    try:
        return socket.create_server((settings.host, settings.port), backlog=BACKLOG)
    except OSError as e:
        reason = os.strerror(e.errno) if e.errno and e.errno > 0 else (e.strerror or str(e))  # gaierror: negative
        if e.errno == errno.EADDRINUSE:
            raise UserError(f"--port {settings.port}: cannot listen on {settings.host}:{settings.port} ({reason}); "
                            "choose another port or stop what holds it") from None
        # an address that is not this machine's, or no address at all (a name that does not resolve)
        raise UserError(f"--host {settings.host}: cannot listen there ({reason}); give an address of this machine, "
                        "e.g. 127.0.0.1 or 0.0.0.0") from None


def run_http(service: Service, settings: ServeConfig, sock: socket.socket,
             orders: c_int | None = None, heard: list[int] | None = None) -> int:
    """Serve until stopped -> the exit code: 1 where the engine process stopped under it."""
    config = uvicorn.Config(service.asgi, host=settings.host, port=settings.port, log_level="warning",
                            timeout_graceful_shutdown=FORCED_CLOSE_S, backlog=BACKLOG,
                            http=HeadTimeout.after(settings.header_timeout_s))
    server = DrainingServer(config, service, settings.drain_s, orders, heard)
    try:
        server.run(sockets=[sock])
    finally:
        service.engine.close()
    return int(server.engine_lost)


def serve_here(engine: EngineProcess, sock: socket.socket, tokenizer, settings: ServeConfig, model_name: str,
               docs: bool, heard: list[int]) -> int:
    """One HTTP process: this one. -> the exit code"""
    return run_http(create_service(engine.channels[0], engine.info, engine.waiting, tokenizer, settings, model_name, docs),
             settings, sock, heard=heard)


def http_main(channel: tuple, info: dict, waiting, sock: socket.socket, checkpoint: Path, settings: ServeConfig,
              model_name: str, docs: bool, orders: c_int) -> None:
    """An HTTP process of several: its own app and tokenizer, on the shared socket, its stop signals
    blocked (inherited from serve_in_processes) for the supervisor's orders."""
    sys.exit(run_http(create_service(channel, info, waiting, load_tokenizer(checkpoint), settings, model_name, docs),
                      settings, sock, orders))


def serve_in_processes(engine: EngineProcess, sock: socket.socket, count: int, checkpoint: Path, settings: ServeConfig,
                       model_name: str, docs: bool, heard: list[int]) -> int:
    """`count` HTTP processes on the listening socket, each with its channel to the engine; their
    metrics are summed through files in a folder of their own. -> the exit code."""
    metrics = tempfile.mkdtemp(prefix="gpt2deploy-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics  # read as the HTTP processes import prometheus-client
    context = multiprocessing.get_context("spawn")
    # stop orders given, read by the HTTP processes each tick; no lock: one writer, and a reader killed
    # holding it would leave the supervisor's signal handler waiting for ever
    orders = context.Value("i", 0, lock=False)
    processes = [context.Process(target=http_main, name=f"http-{i}",
                                 args=(engine.channels[i], engine.info, engine.waiting, sock, checkpoint, settings,
                                       model_name, docs, orders))
                 for i in range(count)]

    def stop_all(*_) -> None:
        orders.value += 1

    # the HTTP processes inherit the blocked signals and keep them so, and one sent here meanwhile waits
    # for stop_all
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        try:
            for process in processes:
                process.start()
            engine.release()
            signal.signal(signal.SIGTERM, stop_all)
            signal.signal(signal.SIGINT, stop_all)
            if heard:
                stop_all()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        running, failed = list(processes), False
        while running:
            ended = wait([p.sentinel for p in running])
            for process in [p for p in running if p.sentinel in ended]:
                process.join()
                running.remove(process)
                multiprocess.mark_process_dead(process.pid)  # its live gauges leave the sums
                if process.exitcode and not failed:  # one failed or was killed: the whole server stops at once
                    failed = True
                    print(f"serve: HTTP process {process.name} (pid {process.pid}) ended with exit code "
                          f"{process.exitcode}; stopping the server (exit 1)", file=sys.stderr, flush=True)
                    stop_all()
                    stop_all()  # the second order stops at once: a server short of a process is not to be drained
        return int(failed)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
        shutil.rmtree(metrics, ignore_errors=True)
