"""A real `gpt2-deploy serve` in its own process on a loopback port, for the serve tests."""

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import MICRO

httpx = pytest.importorskip("httpx", reason="the [serve] extra is not installed")
pytest.importorskip("fastapi", reason="the [serve] extra is not installed")
STARTUP_S = 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LAUNCHED: list[subprocess.Popen] = []  # every server started, for no_server_outlives_its_test


def launch_server(run, log: Path, *options: str, own_group: bool = False,
                  pick: tuple[str, ...] = ("--backend", "ort", "--precision", "fp32")) -> tuple[subprocess.Popen, int]:
    """`gpt2-deploy serve` on the micro model in its own process, started: (process, port); with
    `own_group`, in a process group of its own, as a service manager starts it; `pick`: the backend
    options (none: serve's own choice)."""
    port = _free_port()
    cmd = [sys.executable, "-m", "pipeline.cli", "serve", "--artifacts", str(run.root.parent), "--run", run.root.name,
           "--device", "cpu", *pick, "--port", str(port), "--set", "model.n_positions=256", *options]
    for s in MICRO:
        cmd += ["--set", s]
    LAUNCHED.append(subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True,
                                     start_new_session=own_group))
    return LAUNCHED[-1], port


@pytest.fixture(autouse=True)
def no_server_outlives_its_test():
    """A server a test started is stopped when the test ends, also when it failed before stopping it
    (it held its processes, and the cores, through the rest of the run); a module's shared server,
    started before the test, is its fixture's to stop."""
    before = len(LAUNCHED)
    yield
    for proc in LAUNCHED[before:]:
        if proc.poll() is None:
            proc.terminate()  # drains and stops its HTTP and engine processes
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    del LAUNCHED[before:]


def start_server(run, log: Path, *options: str, own_group: bool = False, **pick):
    """launch_server's server; (process, url) once /health answers."""
    proc, port = launch_server(run, log, *options, own_group=own_group, **pick)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited: {log.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.5)
    proc.kill()
    pytest.fail("server did not answer /health in time")


def stop_server(proc) -> int:
    proc.terminate()
    return proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server(exported_run, tmp_path_factory):
    _, run, _ = exported_run
    proc, url = start_server(run, tmp_path_factory.mktemp("serve") / "server.log")
    yield url, run
    stop_server(proc)


@pytest.fixture(scope="module")
def tight_server(exported_run, tmp_path_factory):
    """One request waiting at most, one second a request, 4 KiB bodies."""
    _, run, _ = exported_run
    proc, url = start_server(run, tmp_path_factory.mktemp("serve") / "tight.log", "--queue", "1", "--timeout", "1",
                             "--max-body", "4096")
    yield url
    stop_server(proc)



LONG = {"prompt": ["The module"] * 64, "max_new_tokens": 240}  # about 0.9 s of work for the micro model on 2 CPU cores
