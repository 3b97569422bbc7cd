"""`gpt2-deploy triton-server`: Triton Inference Server on a repository from `package --format triton`,
the `tritonserver` binary that the nvidia-pytriton wheel carries, on a machine without NVIDIA's
container. Its Python backend runs this interpreter's environment (PATH), through the backend stub
built for this Python version; that stub is built against numpy 1, so numpy 2 is refused here
(`make triton-env` makes `.venv-triton`, numpy 1 beside this project's packages)."""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
import tempfile
from pathlib import Path

from pipeline.errors import UserError

STUB_TIMEOUT_S = 900


def server_command(repository: Path, http_port: int, grpc_port: int, metrics_port: int) -> tuple[list[str], dict]:
    """(argv, environment) that start tritonserver on `repository`, its Python models loaded (the
    bundled binary has no other backend: the raw graphs need NVIDIA's container)."""
    found = importlib.util.find_spec("pytriton")
    if found is None or found.origin is None:
        raise UserError("triton-server: the nvidia-pytriton package is missing; run `make triton-env` and start it "
                        "with .venv-triton/bin/python -m pipeline.cli triton-server ...")
    import numpy
    if int(numpy.__version__.split(".")[0]) >= 2:
        raise UserError(f"triton-server: numpy {numpy.__version__} here, but Triton's Python backend stub needs numpy < 2; "
                        "start it from `make triton-env`'s .venv-triton/bin/python")
    repository = Path(repository).resolve()
    models = sorted(p.parent.name for p in repository.glob("*/config.pbtxt")
                    if 'backend: "python"' in p.read_text(encoding="utf-8"))
    if not models:
        raise UserError(f"{repository}: no Python backend model here; make one with `gpt2-deploy package --format triton`")
    package = Path(found.origin).parent
    server = package / "tritonserver"
    argv = [str(server / "bin" / "tritonserver"), f"--model-repository={repository}",
            f"--backend-directory={python_backends(server)}", "--model-control-mode=explicit",
            *(f"--load-model={m}" for m in models), f"--http-port={http_port}", f"--grpc-port={grpc_port}",
            # a model's start-up opens its backend and captures its CUDA graphs: minutes, not the default 30 s
            f"--backend-config=python,stub-timeout-seconds={STUB_TIMEOUT_S}",
            f"--metrics-port={metrics_port}"]
    env = dict(os.environ)
    # this Python's own libpython before any other of its minor version: the stub embeds the one it
    # finds, and this Python's standard library is built for its own
    libs = [sysconfig.get_config_var("LIBDIR") or "", str(package.parent / "nvidia_pytriton.libs"), env.get("LD_LIBRARY_PATH", "")]
    env["LD_LIBRARY_PATH"] = ":".join(p for p in libs if p)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"  # the stub's Python environment: this one
    return argv, env


def python_backends(server: Path) -> Path:
    """A backends folder whose Python backend has the stub of this Python version (the wheel carries one
    a version), made once in the temporary folder from links into the wheel."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = server / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise UserError(f"triton-server: nvidia-pytriton carries no Python backend stub for Python {version}")
    folder = Path(tempfile.gettempdir()) / f"gpt2-deploy-triton-backends-{os.getuid()}-{version}"
    python = folder / "python"
    python.mkdir(parents=True, exist_ok=True)
    for source in [*(server / "backends" / "python").iterdir(), stub]:
        link = python / source.name
        if not link.exists():
            link.symlink_to(source)
    for binary in (stub, server / "bin" / "tritonserver"):
        if not os.access(binary, os.X_OK):
            binary.chmod(binary.stat().st_mode | 0o111)
    return folder


def run_server(repository: Path, http_port: int, grpc_port: int, metrics_port: int) -> None:
    """Replace this process by tritonserver (its signals and exit code are the server's)."""
    argv, env = server_command(repository, http_port, grpc_port, metrics_port)
    print(f"triton-server: {' '.join(argv)}", flush=True)
    os.execve(argv[0], argv, env)
