"""Open a backend by (name, precision, device) from a run folder, or say why it cannot run here.

This is the one place that knows which backend runs which precision from which artifact;
validate, bench, generate and serve all open their backends through it."""

from __future__ import annotations

import json

import torch

from pipeline.artifacts import RunDir
from pipeline.model import load_checkpoint, require_checkpoint
from pipeline.runtime.backend import BACKENDS, PRECISIONS, Backend, BackendUnavailable

TORCH_PRECISIONS = ("fp32", "fp16")


def onnx_path(run: RunDir, precision: str):
    path = run.onnx(precision) / "model.onnx"
    if not path.exists():
        raise BackendUnavailable(f"no onnx/{precision} graph in {run.root}: run `gpt2-deploy export`")
    return path


def _n_positions(run: RunDir, model) -> int:
    """The context limit, from the model if one is at hand, else from config.json (no weights loaded)."""
    if model is not None:
        return model.config.n_positions
    return json.loads(require_checkpoint(run.checkpoint).read_text(encoding="utf-8"))["n_positions"]


def check_triton(device: torch.device) -> None:
    if device.type != "cuda":
        raise BackendUnavailable("triton runs on a CUDA GPU (its kernels are compiled for one); this run is on the CPU")
    try:
        import triton  # noqa: F401
    except ImportError as e:
        raise BackendUnavailable("the triton package is missing (PyTorch's CUDA builds bring it): pip install triton") from e


def open_backend(run: RunDir, name: str, precision: str, device: torch.device, model=None) -> Backend:
    if name not in BACKENDS or precision not in PRECISIONS:
        raise BackendUnavailable(f"unknown backend/precision {name}/{precision}")
    if name in ("torch", "torch-compiled", "triton"):
        if precision not in TORCH_PRECISIONS:
            raise BackendUnavailable(f"{name} runs fp32/fp16; {precision} runs on ort or trt")
        if precision == "fp16" and device.type != "cuda":
            raise BackendUnavailable("fp16 PyTorch runs on a GPU only (no CUDA device here)")
        # the class first: a backend that cannot run here says so before the checkpoint is read
        if name == "triton":
            check_triton(device)
            from pipeline.runtime.triton_backend import TritonBackend as backend_class
        elif name == "torch":
            from pipeline.runtime.torch_eager import TorchEagerBackend as backend_class
        else:
            from pipeline.runtime.torch_compiled import TorchCompiledBackend as backend_class
        return backend_class(model if model is not None else load_checkpoint(run.checkpoint), precision, device)
    if name == "ort":
        from pipeline.runtime.ort_backend import OrtBackend
        return OrtBackend(onnx_path(run, precision), precision, device, _n_positions(run, model))
    from pipeline.runtime.trt_backend import open_trt_backend
    return open_trt_backend(run, precision, device)


def default_matrix() -> list[tuple[str, str]]:
    """Every (backend, precision) pair this project runs, but the fp32 PyTorch reference itself.
    Pairs that cannot run on a machine are still listed, so reports say why they were skipped."""
    pairs = [("torch", "fp16"), ("torch-compiled", "fp32"), ("torch-compiled", "fp16"), ("triton", "fp16")]
    return pairs + [("ort", p) for p in PRECISIONS] + [("trt", p) for p in PRECISIONS]


def bench_matrix() -> list[tuple[str, str]]:
    """What bench measures: the eager fp32 reference too, since every speed-up is relative to eager."""
    return [("torch", "fp32")] + default_matrix()
