"""`gpt2-deploy doctor`: what is installed, and which stages and backends it makes usable."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
from dataclasses import dataclass


@dataclass
class Finding:
    component: str
    status: str  # "ok" | "missing" | "unusable"
    detail: str


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _import(module: str):
    try:
        return importlib.import_module(module), ""
    except Exception as e:  # a broken install raises anything from ImportError to OSError
        return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def check_torch() -> list[Finding]:
    torch, err = _import("torch")
    if torch is None:
        return [Finding("torch", "missing", err)]
    found = [Finding("torch", "ok", f"{torch.__version__} (CUDA build {torch.version.cuda or 'none'})")]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            found.append(Finding(f"gpu {i}", "ok", f"{torch.cuda.get_device_name(i)}, compute capability {major}.{minor}"))
    else:
        found.append(Finding("gpu", "missing", "no CUDA device visible to torch: GPU backends and benchmarks are skipped"))
    return found


def check_onnxruntime() -> list[Finding]:
    ort, err = _import("onnxruntime")
    if ort is None:
        return [Finding("onnxruntime", "missing", err or "pip install 'gpt2-deploy[cpu]' (or [gpu])")]
    providers = ort.get_available_providers()
    dist = "onnxruntime-gpu" if _version("onnxruntime-gpu") else "onnxruntime"
    return [Finding(dist, "ok", f"{ort.__version__}; providers: {', '.join(providers)}")]


def check_host() -> list[Finding]:
    """The processor and memory the CPU stages get: the cores and memory this process may use, which
    a container's quota and limit (its control groups) cut below the host's."""
    import torch

    from pipeline.cgroups import cpu_quota, memory_headroom
    from pipeline.machine import cpu_description, free_memory

    cpu, quota = cpu_description(), cpu_quota()
    extensions = cpu["vector_extensions"]
    cores = f"{cpu['usable_cores']} of {cpu['logical_cores']} cores usable" + (f" (CPU quota {quota:g})" if quota else "")
    found = [Finding("cpu", "ok", f"{cpu['model']}, {cores}; "
                     f"{', '.join(extensions) if isinstance(extensions, list) else 'vector extensions unknown'}")]
    free, limited = free_memory(torch.device("cpu")), memory_headroom()
    if free is not None:
        bound = " (the control group's memory limit)" if limited is not None and limited <= free else ""
        found.append(Finding("memory", "ok", f"{free / 2**30:.1f} GiB free to this process{bound}"))
    return found


def check_tensorrt() -> list[Finding]:
    from pipeline.engines.flavours import FLAVOURS, probe
    return [Finding(f.name, *probe(f)) for f in FLAVOURS]


def check_simple(component: str, module: str, dist: str, hint: str) -> Finding:
    mod, err = _import(module)
    if mod is None:
        return Finding(component, "missing", f"{err}; {hint}")
    return Finding(component, "ok", _version(dist) or getattr(mod, "__version__", "?"))


def run_checks() -> list[Finding]:
    findings = check_torch() + check_host()
    findings.append(check_simple("transformers", "transformers", "transformers", "pip install transformers"))
    findings.append(check_simple("onnx", "onnx", "onnx", "pip install onnx"))
    findings += check_onnxruntime()
    findings.append(check_simple("onnxruntime-genai", "onnxruntime_genai", "onnxruntime-genai",
                                 "the ort-genai bench row needs it: pip install onnxruntime-genai"))
    findings.append(check_simple("modelopt", "modelopt.onnx.quantization", "nvidia-modelopt",
                                 "fp16/int8 export needs it: pip install 'gpt2-deploy[quant]'"))
    findings.append(check_simple("polygraphy", "polygraphy", "polygraphy", "pip install 'gpt2-deploy[quant]'"))
    findings.append(check_simple("triton", "triton", "triton",
                                 "the triton backend needs it (PyTorch's CUDA builds bring it): pip install triton"))
    findings += check_tensorrt()
    findings.append(check_simple("fastapi", "fastapi", "fastapi", "serving needs it: pip install 'gpt2-deploy[serve]'"))
    return findings


def report(findings: list[Finding], as_json: bool) -> None:
    if as_json:
        print(json.dumps([f.__dict__ for f in findings], indent=2))
        return
    from rich.markup import escape
    from rich.table import Table

    from pipeline.progress import console
    table = Table(title="gpt2-deploy doctor")
    for col in ("component", "status", "detail"):
        table.add_column(col)
    colour = {"ok": "green", "missing": "yellow", "unusable": "red"}
    for f in findings:
        table.add_row(f.component, f"[{colour[f.status]}]{f.status}[/]", escape(f.detail))
    console.print(table)
