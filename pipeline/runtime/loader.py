"""The backend registry, and opening a backend by (name, precision, device) from a run folder, or
saying why it cannot run here.

This is the one place that knows which backend runs which precision from which artifact; the CLI's
choices, config validation, the validate and bench matrices, and every stage that opens a backend
read it. Adding a backend is a row in BACKENDS. A backend that runs an exported graph or an engine
runs only the one export (and build-engine) made from the checkpoint that is there now."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import GPT2Config

from pipeline.artifacts import RunDir
from pipeline.contract import Contract
from pipeline.engines.metadata import EngineMeta, plans_for
from pipeline.errors import UserError
from pipeline.model import load_checkpoint, require_checkpoint
from pipeline.precisions import PRECISIONS
from pipeline.runtime.backend import Backend, BackendUnavailable


@dataclass(frozen=True)
class BackendSpec:
    name: str
    precisions: tuple[str, ...]  # what it runs
    devices: tuple[str, ...]  # device types it runs on
    reads: str  # the artifact it runs: "checkpoint", "onnx" or "engine"
    open: Callable[..., Backend]  # (run, precision, device, model or None) -> Backend
    summary: str  # for help texts
    matrix: tuple[str, ...] | None = None  # the precisions validate and bench run it in (None: all it runs)

    def verify(self, run: RunDir, precision: str) -> None:
        """Refuse an artifact that is not the one this run's stages made (a UserError, whatever the device)."""
        if self.reads == "onnx":
            run.require_exported(precision)
        elif self.reads == "engine":
            require_built(run, precision)


def _torch_opener(name: str) -> Callable[..., Backend]:
    def open_torch(run: RunDir, precision: str, device: torch.device, model) -> Backend:
        # the class first: a backend that cannot run here says so before the checkpoint is read
        if name == "triton":
            check_triton(device)
            from pipeline.runtime.static.triton_backend import (
                TritonBackend as backend_class,
            )
        elif name == "torch":
            from pipeline.runtime.portable.torch_eager import (
                TorchEagerBackend as backend_class,
            )
        else:
            from pipeline.runtime.static.torch_compiled import (
                TorchCompiledBackend as backend_class,
            )
        return backend_class(model if model is not None else load_checkpoint(run.checkpoint), precision, device)
    return open_torch


def _open_ort(run: RunDir, precision: str, device: torch.device, model) -> Backend:
    return open_graph(onnx_path(run, precision), _checkpoint_config(run, model), precision, device)


def open_graph(path, config: GPT2Config, precision: str, device: torch.device) -> Backend:
    """ONNX Runtime on any graph of the contract for a model of this config (export checks its own before they land)."""
    from pipeline.runtime.portable.ort_backend import OrtBackend
    return OrtBackend(path, Contract.from_hf_config(config), precision, device, config.n_positions)


def _open_trt(run: RunDir, precision: str, device: torch.device, model) -> Backend:
    from pipeline.runtime.portable.trt_backend import open_trt_backend
    return open_trt_backend(run, Contract.from_hf_config(_checkpoint_config(run, model)), precision, device)


TORCH_RUNS = tuple(name for name, p in PRECISIONS.items() if p.torch_dtype)  # fp32, fp16
BACKENDS: dict[str, BackendSpec] = {b.name: b for b in (
    BackendSpec("torch", TORCH_RUNS, ("cpu", "cuda"), "checkpoint", _torch_opener("torch"),
                "Hugging Face eager, the reference", matrix=("fp16",)),  # fp32 is the reference itself
    BackendSpec("torch-compiled", TORCH_RUNS, ("cpu", "cuda"), "checkpoint", _torch_opener("torch-compiled"),
                "static cache, torch.compile, CUDA graphs"),
    BackendSpec("triton", TORCH_RUNS, ("cuda",), "checkpoint", _torch_opener("triton"),
                "static cache, hand-written Triton kernels, CUDA graphs", matrix=("fp16",)),
    BackendSpec("ort", tuple(PRECISIONS), ("cpu", "cuda"), "onnx", _open_ort, "ONNX Runtime on the exported graph"),
    BackendSpec("trt", tuple(PRECISIONS), ("cuda",), "engine", _open_trt, "TensorRT engine from build-engine"),
)}


def require_built(run: RunDir, precision: str) -> None:
    """The graph is export's (RunDir.require_exported), and every engine of its precision was built from it."""
    graph = run.require_exported(precision)
    for plan in plans_for(run.engines, precision):
        if graph and EngineMeta.read(plan.with_suffix(".json")).onnx_sha256 != graph:
            raise UserError(f"{plan}: built from another {precision} graph than the one exported now; "
                            "rerun `gpt2-deploy build-engine --force`")


def onnx_path(run: RunDir, precision: str):
    path = run.onnx(precision) / "model.onnx"
    if not path.exists():
        raise BackendUnavailable(f"no onnx/{precision} graph in {run.root}: run `gpt2-deploy export`")
    return path


def _checkpoint_config(run: RunDir, model) -> GPT2Config:
    """The model's config, from the model if one is at hand, else from config.json (no weights loaded)."""
    if model is not None:
        return model.config
    return GPT2Config.from_json_file(str(require_checkpoint(run.checkpoint)))


def check_triton(device: torch.device) -> None:
    try:
        import triton  # noqa: F401
    except ImportError as e:
        raise BackendUnavailable("the triton package is missing (PyTorch's CUDA builds bring it): pip install triton") from e


def open_backend(run: RunDir, name: str, precision: str, device: torch.device, model=None) -> Backend:
    spec = BACKENDS.get(name)
    if spec is None or precision not in PRECISIONS:
        raise BackendUnavailable(f"unknown backend/precision {name}/{precision}")
    if precision not in spec.precisions:
        runners = [b.name for b in BACKENDS.values() if precision in b.precisions]
        raise BackendUnavailable(f"{name} runs {'/'.join(spec.precisions)}; {precision} runs on {' or '.join(runners)}")
    spec.verify(run, precision)
    if device.type not in spec.devices:
        raise BackendUnavailable(f"{name} runs on a CUDA GPU (its kernels or engines are built for one); "
                                 f"this run is on the {device.type.upper()}")
    if spec.reads == "checkpoint" and precision == "fp16" and device.type != "cuda":
        raise BackendUnavailable("fp16 PyTorch runs on a GPU only (no CUDA device here)")
    return spec.open(run, precision, device, model)


def default_matrix() -> list[tuple[str, str]]:
    """Every (backend, precision) pair this project runs, but the fp32 PyTorch reference itself.
    Pairs that cannot run on a machine are still listed, so reports say why they were skipped."""
    return [(b.name, p) for b in BACKENDS.values() for p in (b.matrix or b.precisions)]


def bench_matrix() -> list[tuple[str, str]]:
    """What bench measures: the eager fp32 reference too, since every speed-up is relative to eager."""
    return [("torch", "fp32")] + default_matrix()
