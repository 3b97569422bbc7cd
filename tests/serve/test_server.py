"""SIGTERM drains: /ready turns false, new requests get 503, the request in flight runs to its end,
and the process exits 0."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import MICRO
from tests.serve.conftest import STARTUP_S, launch_server, start_server, stop_server

httpx = pytest.importorskip("httpx", reason="the [serve] extra is not installed")

DRAINING = {"prompt": ["The module"] * 16, "max_new_tokens": 200, "ignore_eos": True, "stream": True}


@pytest.mark.parametrize("http_processes,to_group", [("1", False), ("2", True)],
                         ids=["to-the-server", "to-its-process-group"])
def test_sigterm_drains_in_flight_requests_and_exits_0(exported_run, tmp_path, http_processes, to_group):
    """Also a SIGTERM to the whole process group, as systemd stops a service, with two HTTP processes:
    each heard it once from the group and once from the supervisor, and the second cut the stream."""
    _, run, _ = exported_run
    proc, url = start_server(run, tmp_path / "server.log", "--http-processes", http_processes, own_group=to_group)
    lines, started = [], threading.Event()

    def stream():
        with httpx.stream("POST", f"{url}/generate", json=DRAINING, timeout=60) as reply:
            for line in reply.iter_lines():
                if line:
                    lines.append(line)
                started.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert started.wait(30)
    if to_group:
        os.killpg(proc.pid, signal.SIGTERM)
    else:
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    while httpx.get(f"{url}/ready", timeout=5).status_code != 503 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert httpx.get(f"{url}/ready", timeout=5).json() == {"ready": False, "reason": "draining"}
    refused = httpx.post(f"{url}/generate", json={"prompt": "hi", "max_new_tokens": 2}, timeout=10)
    assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
    assert reader.is_alive()  # the first request still runs
    reader.join(60)
    tokens = sum(len(row) for line in lines if line.startswith('data: {"tokens"')
                 for row in json.loads(line[6:])["tokens"])
    assert lines[-2:] == ["event: done", "data: {}"] and tokens == 16 * 200
    assert proc.wait(timeout=30) == 0, (tmp_path / "server.log").read_text()
    assert "Traceback" not in (tmp_path / "server.log").read_text()


def test_a_second_sigterm_stops_the_drain_at_once_without_a_traceback(exported_run, tmp_path):
    _, run, _ = exported_run
    log = tmp_path / "server.log"
    proc, url = start_server(run, log)
    started = threading.Event()

    def stream():
        try:
            with httpx.stream("POST", f"{url}/generate", json=DRAINING, timeout=60) as reply:
                for _ in reply.iter_lines():
                    started.set()
        except httpx.HTTPError:  # cut by the second signal
            pass

    reader = threading.Thread(target=stream)
    reader.start()
    assert started.wait(30)
    proc.send_signal(signal.SIGTERM)
    while httpx.get(f"{url}/ready", timeout=5).status_code != 503:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0, log.read_text()
    reader.join(30)
    assert "Traceback" not in log.read_text(), log.read_text()


def test_several_http_processes_relay_one_engine_sum_their_metrics_and_drain(exported_run, tmp_path):
    """Two HTTP processes on one socket: concurrent clients, each on a connection of its own, all get
    the tokens a request gets alone; every scrape, whichever process answers it, counts every
    request; SIGTERM to the supervisor drains both and it exits 0."""
    _, run, _ = exported_run
    proc, url = start_server(run, tmp_path / "server.log", "--http-processes", "2")
    ask = {"prompt": "The module", "max_new_tokens": 6, "ignore_eos": True}
    alone = httpx.post(f"{url}/generate", json=ask, timeout=60).json()["tokens"]
    replies = []
    threads = [threading.Thread(target=lambda: replies.append(httpx.post(f"{url}/generate", json=ask, timeout=60)))
               for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.status_code for r in replies] == [200] * 12
    assert all(r.json()["tokens"] == alone for r in replies)
    counts = {next(line for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines()
                   if line.startswith('gpt2deploy_requests_total{outcome="ok"}')) for _ in range(6)}
    assert counts == {'gpt2deploy_requests_total{outcome="ok"} 13.0'}
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, (tmp_path / "server.log").read_text()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=2)


@pytest.mark.parametrize("http_processes", ["1", "2"])
def test_a_sigterm_right_after_the_ready_line_drains_and_exits_0(exported_run, tmp_path, http_processes):
    """SIGTERM as soon as the server says it is ready, while its HTTP side is still starting
    (importing, loading the tokenizer): the signal waits until the handlers are in place, then the
    server drains and exits 0 without a traceback. It killed a process that had not started (exit
    1), and a SIGTERM before the supervisor's handler was in place killed the supervisor (-15)."""
    _, run, _ = exported_run
    log = tmp_path / "server.log"
    proc, _ = launch_server(run, log, "--http-processes", http_processes)
    deadline = time.monotonic() + STARTUP_S
    while "serve:" not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, log.read_text()
    assert "Traceback" not in log.read_text()


def _engine_pid(server: subprocess.Popen) -> int | None:
    """The server's engine process (spawned by multiprocessing), once it exists."""
    for child in Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split():
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                return int(child)
        except FileNotFoundError:
            pass
    return None


def _running(pid: int) -> bool:
    """Whether the process exists and has not exited (a zombie waits for a reaper only)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_sigterm_while_the_engine_starts_stops_it_too_and_exits_143(exported_run, tmp_path):
    """SIGTERM before the server is ready: the start-up ends as Ctrl-C ends it, one line and exit 143,
    and the engine process (which ignores SIGTERM) is gone too: it was left loading."""
    _, run, _ = exported_run
    log = tmp_path / "server.log"
    proc, _ = launch_server(run, log)
    deadline = time.monotonic() + STARTUP_S
    while (engine := _engine_pid(proc)) is None:
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143, log.read_text()
    assert "interrupted (SIGTERM)" in log.read_text() and "Traceback" not in log.read_text()
    deadline = time.monotonic() + 10
    while _running(engine) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(engine), f"engine process {engine} outlived the server"


def test_a_port_in_use_is_one_line_before_the_engine_starts(exported_run, tmp_path):
    _, run, _ = exported_run
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = [sys.executable, "-m", "pipeline.cli", "serve", "--artifacts", str(run.root.parent), "--run", run.root.name,
               "--device", "cpu", "--backend", "ort", "--precision", "fp32", "--port", str(port), "--http-processes", "2",
               *[x for s in MICRO for x in ("--set", s)]]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [f"error: --port {port}: cannot listen on 127.0.0.1:{port} "
                                                "(Address already in use); choose another port or stop what holds it"]


def engine_pid(server_pid: int) -> int:
    """The engine: the server's child process that multiprocessing spawned (not its resource tracker)."""
    children = Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
    for pid in map(int, children):
        if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    raise AssertionError(f"no engine process under {server_pid}: {children}")


@pytest.mark.parametrize("http_processes", ["1", "2"])
def test_a_killed_engine_ends_streams_with_an_error_fails_health_and_exits_1(exported_run, tmp_path, http_processes):
    """kill -9 of the engine under a running stream: the stream gets an error chunk then [DONE], /health
    and new requests answer 503 while the server stops, and it exits 1 within a bound (for a process
    supervisor to restart it), saying why in one line."""
    _, run, _ = exported_run
    proc, url = start_server(run, tmp_path / "server.log", "--http-processes", http_processes)
    lines = []

    def stream():
        with httpx.stream("POST", f"{url}/v1/completions", timeout=60,
                          json={"model": run.root.name, "prompt": ["The module"] * 16, "max_tokens": 200,
                                "ignore_eos": True, "stream": True}) as reply:
            lines.extend(line for line in reply.iter_lines() if line)

    client = threading.Thread(target=stream)
    client.start()
    time.sleep(1.0)  # the stream is running
    os.kill(engine_pid(proc.pid), signal.SIGKILL)
    statuses = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            statuses.append(httpx.get(f"{url}/health", timeout=2).status_code)
        except httpx.TransportError:  # stopped listening: it is on its way out
            break
        time.sleep(0.1)
    assert proc.wait(timeout=30) == 1
    client.join(timeout=30)
    assert lines and lines[-1] == "data: [DONE]", lines[-3:]
    error = json.loads(lines[-2][len("data: "):])["error"]
    assert error["code"] == "engine_stopped" and "the engine process stopped" in error["message"], error
    assert 200 not in statuses[3:]  # once the loss is seen, health fails
    log = (tmp_path / "server.log").read_text()
    assert "serve: the engine process stopped; stopping (exit 1)" in log and "Traceback" not in log


def test_a_killed_http_process_stops_the_whole_server_at_once_saying_which(exported_run, tmp_path):
    _, run, _ = exported_run
    proc, url = start_server(run, tmp_path / "server.log", "--http-processes", "2")
    children = [int(pid) for pid in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
    http = [pid for pid in children if pid != engine_pid(proc.pid) and b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    os.kill(http[0], signal.SIGKILL)
    started = time.monotonic()
    assert proc.wait(timeout=30) == 1 and time.monotonic() - started < 15
    log = (tmp_path / "server.log").read_text()
    assert f"(pid {http[0]}) ended with exit code -9; stopping the server (exit 1)" in log and "Traceback" not in log


def test_without_a_backend_named_serve_runs_the_fastest_the_run_has(exported_run, tmp_path):
    import httpx
    import torch

    from pipeline.runtime.loader import fastest_ready
    _, run, _ = exported_run
    backend, precision = fastest_ready(run, torch.device("cpu"))
    proc, url = start_server(run, tmp_path / "fastest.log", pick=())
    done = httpx.post(f"{url}/v1/completions", json={"model": run.root.name, "prompt": "The module", "max_tokens": 4},
                      timeout=60)
    assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 4
    assert stop_server(proc) == 0
    assert f"serve: {backend} {precision} from " in (tmp_path / "fastest.log").read_text()


def test_a_host_that_is_not_this_machines_is_named_as_the_host():
    """Binding an address of no interface here (a documentation address; nothing is sent) names --host."""
    from pipeline.config import ServeConfig
    from pipeline.errors import UserError
    from serve.server import listen

    with pytest.raises(UserError, match=r"^--host 203.0.113.5: cannot listen there \(Cannot assign requested address\)"):
        listen(ServeConfig(host="203.0.113.5", port=0))


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="process affinity is Linux's")
def test_a_gpus_http_processes_follow_the_cores_this_process_may_use_not_the_hosts():
    from pipeline.config import ServeConfig
    from serve.server import http_process_count
    every = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, set(sorted(every)[:1]))  # as under taskset or a container's cpuset
        assert http_process_count(ServeConfig(), "cuda") == 1
        assert http_process_count(ServeConfig(http_processes=3), "cuda") == 3
    finally:
        os.sched_setaffinity(0, every)
    assert http_process_count(ServeConfig(), "cpu") == 1
    assert http_process_count(ServeConfig(), "cuda") == min(8, max(1, len(every) // 2))
