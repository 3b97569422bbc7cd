"""The backend registry, and opening a backend by (name, precision, device) from a run folder, or
saying why it cannot run here.

This is the one place that knows which backend runs which precision from which artifact; the CLI's
choices, config validation, the validate and bench matrices, and every stage that opens a backend
read it. Adding a backend is a row in BACKENDS. A backend that runs an exported graph or an engine
runs only the one export (and build-engine) made from the checkpoint that is there now."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import GPT2Config

from pipeline.artifacts import RunDir
from pipeline.contract import ORT, PORTABLE, Contract
from pipeline.engines.metadata import EngineMeta, plans_for
from pipeline.errors import UserError
from pipeline.int8_weights import read_graph_weights
from pipeline.model import load_checkpoint, require_checkpoint
from pipeline.precisions import PRECISIONS
from pipeline.runtime.backend import Backend, BackendUnavailable


@dataclass(frozen=True)
class BackendSpec:
    name: str
    precisions: tuple[str, ...]  # what it runs
    devices: tuple[str, ...]  # device types it runs on
    reads: str  # the artifact it runs: "checkpoint", "onnx" (portable), "onnx-ort" or "engine"
    open: Callable[..., Backend]  # (run, precision, device, model or None) -> Backend
    summary: str  # for help texts
    matrix: tuple[str, ...] | None = None  # the precisions validate and bench run it in (None: all it runs)
    validated: bool = True  # validate runs it (it computes every position's logits of padded prompts)
    # the precisions whose weights it reads out of the portable graph export wrote (int8_weights)
    graph_weights: tuple[str, ...] = ()

    def reads_for(self, precision: str) -> str:
        """The artifact it runs in this precision: `reads`, or the portable graph for graph_weights'."""
        return "onnx" if precision in self.graph_weights else self.reads

    def verify(self, run: RunDir, precision: str) -> None:
        """Refuse an artifact that is not the one this run's stages made (a UserError, whatever the device)."""
        reads = self.reads_for(precision)
        if reads == "onnx":
            run.require_exported(precision)
        elif reads == "onnx-ort":
            run.require_exported(precision, ORT)
        elif reads == "engine":
            require_built(run, precision)


def _torch_opener(name: str) -> Callable[..., Backend]:
    def open_torch(run: RunDir, precision: str, device: torch.device, model) -> Backend:
        # the class first: a backend that cannot run here says so before the checkpoint is read
        if name == "torch":
            from pipeline.runtime.dynamic.torch_eager import (
                TorchEagerBackend as backend_class,
            )
        else:
            from pipeline.runtime.static.torch_compiled import (
                TorchCompiledBackend as backend_class,
            )
        return backend_class(model if model is not None else load_checkpoint(run.checkpoint), precision, device)
    return open_torch


def _open_triton(run: RunDir, precision: str, device: torch.device, model) -> Backend:
    check_triton(device)  # before the checkpoint is read
    from pipeline.runtime.static.triton_backend import TritonBackend
    graph = onnx_path(run, precision) if precision in BACKENDS["triton"].graph_weights else None
    model = model if model is not None else load_checkpoint(run.checkpoint)
    int8 = read_graph_weights(graph, model.config) if graph else None
    return TritonBackend(model, precision, device, int8_weights=int8)


def _open_ort(run: RunDir, precision: str, device: torch.device, model) -> Backend:
    return open_graph(onnx_path(run, precision), checkpoint_config(run, model), precision, device)


def open_graph(path, config: GPT2Config, precision: str, device: torch.device, target: str = PORTABLE) -> Backend:
    """ONNX Runtime on any graph of the target's contract for a model of this config (export checks
    its own before they land)."""
    contract = Contract.from_hf_config(config, target)
    if target == ORT:
        from pipeline.runtime.dynamic.ort_fused import OrtFusedBackend
        return OrtFusedBackend(path, contract, precision, device, config.n_positions)
    from pipeline.runtime.dynamic.ort_backend import OrtBackend
    return OrtBackend(path, contract, precision, device, config.n_positions)


def _open_ort_fused(run: RunDir, precision: str, device: torch.device, model) -> Backend:
    return open_graph(onnx_path(run, precision, ORT), checkpoint_config(run, model), precision, device, ORT)


def _open_ort_genai(run: RunDir, precision: str, device: torch.device, model) -> Backend:
    from pipeline.runtime.dynamic.ort_genai import OrtGenaiBackend
    config = checkpoint_config(run, model)
    return OrtGenaiBackend(onnx_path(run, precision, ORT).parent, precision, device, config.n_positions, config.vocab_size)


def _open_trt(run: RunDir, precision: str, device: torch.device, model) -> Backend:
    from pipeline.runtime.dynamic.trt_backend import open_trt_backend
    return open_trt_backend(run, Contract.from_hf_config(checkpoint_config(run, model)), precision, device)


TORCH_RUNS = tuple(name for name, p in PRECISIONS.items() if p.torch_dtype)  # fp32, fp16
BACKENDS: dict[str, BackendSpec] = {b.name: b for b in (
    BackendSpec("torch", TORCH_RUNS, ("cpu", "cuda"), "checkpoint", _torch_opener("torch"),
                "Hugging Face eager, the reference", matrix=("fp16",)),  # fp32 is the reference itself
    BackendSpec("torch-compiled", TORCH_RUNS, ("cpu", "cuda"), "checkpoint", _torch_opener("torch-compiled"),
                "static cache, torch.compile, CUDA graphs"),
    # int8-wo: the int8-wo graph's int8 weights (a scale per output) read by the decode kernels, fp16
    # activations and cache
    BackendSpec("triton", (*TORCH_RUNS, "int8-wo"), ("cuda",), "checkpoint", _open_triton,
                "static cache, hand-written Triton kernels, CUDA graphs", matrix=("fp16", "int8-wo"),
                graph_weights=("int8-wo",)),
    BackendSpec("ort", tuple(PRECISIONS), ("cpu", "cuda"), "onnx", _open_ort, "ONNX Runtime on the portable graph"),
    BackendSpec("ort-fused", tuple(PRECISIONS), ("cpu", "cuda"), "onnx-ort", _open_ort_fused,
                "ONNX Runtime on the ort target's fused graph, KV cache in place, CUDA graphs on a GPU"),
    # the CPU graphs: onnxruntime-genai's CPU package is what runs here
    BackendSpec("ort-genai", tuple(PRECISIONS), ("cpu",), "onnx-ort", _open_ort_genai,
                "onnxruntime-genai's CPU package on the ort target's folder, its own greedy loop",
                matrix=("fp32", "int8"), validated=False),
    BackendSpec("trt", tuple(PRECISIONS), ("cuda",), "engine", _open_trt, "TensorRT engine from build-engine"),
)}


def require_built(run: RunDir, precision: str) -> None:
    """The graph is export's (RunDir.require_exported), and every engine of its precision was built from it."""
    graph = run.require_exported(precision)
    for plan in plans_for(run.engines, precision):
        if graph and EngineMeta.read(plan.with_suffix(".json")).onnx_sha256 != graph:
            raise UserError(f"{plan}: built from another {precision} graph than the one exported now; "
                            "rerun `gpt2-deploy build-engine --force`")


def onnx_path(run: RunDir, precision: str, target: str = PORTABLE):
    path = run.onnx(precision, target) / "model.onnx"
    if not path.exists():
        option = "" if target == PORTABLE else f" --target {target}"
        raise BackendUnavailable(f"no {path.parent.relative_to(run.root).as_posix()} graph in {run.root}: "
                                 f"run `gpt2-deploy export{option}`")
    return path


def checkpoint_config(run: RunDir, model) -> GPT2Config:
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
        raise BackendUnavailable(f"{name} runs {'/'.join(spec.precisions)}; {precision} runs on {', '.join(runners)}")
    spec.verify(run, precision)
    if device.type not in spec.devices:
        where = ("a CUDA GPU (its kernels or engines are built for one)" if spec.devices == ("cuda",)
                 else f"the CPU only ({spec.summary})")
        raise BackendUnavailable(f"{name} runs on {where}; this run is on the {device.type.upper()}")
    if spec.reads == "checkpoint" and precision == "fp16" and device.type != "cuda":
        raise BackendUnavailable("fp16 PyTorch runs on a GPU only (no CUDA device here)")
    return spec.open(run, precision, device, model)


# The backends serve opens when none is named, fastest first: the first whose artifact the run has.
# On x86 processors whose int8 kernels were measured (torch's kernel capability, which `doctor` and every
# report name) the ort target's int8 was the fastest row at every batch measured, on VNNI and on AVX2
# kernels alike (artifacts/results/optimum_cpu/); elsewhere its kernels are unmeasured and fp32 leads.
FASTEST_CPU = {
    "AVX512": (("ort-fused", "int8"), ("ort-fused", "fp32"), ("ort", "fp32"), ("torch", "fp32")),
    "AVX2": (("ort-fused", "int8"), ("ort-fused", "fp32"), ("ort", "fp32"), ("torch", "fp32")),
}
FASTEST_CPU_OTHER = (("ort-fused", "fp32"), ("ort", "fp32"), ("torch", "fp32"))
FASTEST_GPU = (("triton", "fp16"), ("ort-fused", "fp16"), ("torch-compiled", "fp16"))


def fastest_ready(run: RunDir, device: torch.device, precision: str | None = None) -> tuple[str, str]:
    """The fastest (backend, precision) this run can open on the device (of `precision`, if given):
    the first of the device's table whose artifact is there and is this checkpoint's."""
    table = (FASTEST_GPU if device.type == "cuda"
             else FASTEST_CPU.get(torch.backends.cpu.get_cpu_capability(), FASTEST_CPU_OTHER))
    for name, p in [(b, p) for b, p in table if precision in (None, p)]:
        spec = BACKENDS[name]
        if not artifact_path(run, spec.reads_for(p), p).exists() or (name == "triton" and importlib.util.find_spec("triton") is None):
            continue
        spec.verify(run, p)  # a graph of another checkpoint is an error, not a reason to fall back
        return name, p
    raise UserError(f"nothing in {run.root} runs {precision or 'here'} on the {device.type.upper()}: "
                             "run `gpt2-deploy finetune` (and `export`) first, or name --backend")


def artifact_path(run: RunDir, reads: str, precision: str) -> Path:
    """The file whose presence says a run has what a backend reads: the checkpoint or a graph (the
    fastest tables list no engine backend)."""
    if reads == "checkpoint":
        return run.checkpoint / "config.json"
    return run.onnx(precision, ORT if reads == "onnx-ort" else PORTABLE) / "model.onnx"


def default_matrix(validated_only: bool = True) -> list[tuple[str, str]]:
    """Every (backend, precision) pair validate runs (all, without validated_only), but the fp32
    PyTorch reference itself. Pairs that cannot run on a machine are still listed, so reports say
    why they were skipped."""
    return [(b.name, p) for b in BACKENDS.values() if b.validated or not validated_only for p in (b.matrix or b.precisions)]


def bench_matrix() -> list[tuple[str, str]]:
    """What bench measures: the eager fp32 reference too, since every speed-up is relative to eager."""
    return [("torch", "fp32")] + default_matrix(validated_only=False)
