"""What every report names about what it measured and where: the model's shape (read from the
checkpoint, so a run folder made with another preset is named by what it holds), the processor and
the vector extensions its int8 kernels depend on, the GPU, and the packages."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import torch

from pipeline.artifacts import package_versions
from pipeline.cgroups import memory_headroom
from pipeline.config import PRESETS, Config
from pipeline.cores import usable_cores

# the flags int8 and fp16 kernels on a CPU choose their code paths by (x86: /proc/cpuinfo "flags", Arm: "Features")
VECTOR_EXTENSIONS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni",
                     "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16", "asimd", "asimddp", "sve",
                     "sve2", "i8mm", "bf16")


def gpt2_parameters(layers: int, hidden: int, vocab: int, positions: int) -> int:
    """GPT-2's parameter count, the LM head tied to the token embedding: per block the QKV and output
    projections (4C^2 + 4C), the MLP (8C^2 + 5C) and two layer norms (4C); then the final norm."""
    return (vocab + positions) * hidden + layers * (12 * hidden * hidden + 13 * hidden) + 2 * hidden


def model_description(checkpoint: Path) -> dict:
    """The checkpoint's shape (its config.json), and the preset that has it."""
    c = json.loads((Path(checkpoint) / "config.json").read_text(encoding="utf-8"))
    return shape_description(c["n_layer"], c["n_head"], c["n_embd"], c["vocab_size"], c["n_positions"])


def shape_description(n_layer: int, n_head: int, n_embd: int, vocab_size: int, n_positions: int) -> dict:
    """A GPT-2 shape as reports name it, with the preset that has it ("custom" where none does)."""
    shape = {"n_layer": n_layer, "n_head": n_head, "n_embd": n_embd}
    preset = next((name for name, p in PRESETS.items()
                   if {k: p.get("model", {}).get(k, getattr(Config().model, k)) for k in shape} == shape), "custom")
    return {"preset": preset, "parameters": gpt2_parameters(n_layer, n_embd, vocab_size, n_positions),
            "layers": n_layer, "hidden": n_embd, "heads": n_head, "head_size": n_embd // n_head,
            "vocab": vocab_size, "context": n_positions}


def model_line(model: dict) -> str:
    """One line for a report's header: `gpt2-xl, 1,557,611,200 parameters (48 layers, 1600 wide, 25 heads)`."""
    layers = f"{model['layers']} layer{'s' if model['layers'] != 1 else ''}"
    return f"{model['preset']}, {model['parameters']:,} parameters ({layers}, {model['hidden']} wide, {model['heads']} heads)"


def cpu_description() -> dict:
    """The processor's model name, its logical cores (all, and those this process may use), which of
    VECTOR_EXTENSIONS it has (known on Linux only), and the instruction set torch's kernels chose,
    which is what CPUID tells this process (a hypervisor or ATEN_CPU_CAPABILITY can make it less)."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())  # the first processor's
    except OSError:
        pass
    flags = set((info.get("flags") or info.get("Features") or "").split())
    return {"model": info.get("model name") or platform.processor() or platform.machine(),
            "logical_cores": os.cpu_count(), "usable_cores": usable_cores(),
            "vector_extensions": [f for f in VECTOR_EXTENSIONS if f in flags] if flags else "unknown",
            "torch_kernels": torch.backends.cpu.get_cpu_capability()}


def free_memory(device: torch.device) -> int | None:
    """Bytes this process may still take where it computes: a GPU's free memory, or the host's
    available memory and free swap (Linux), cut to what its control groups' memory limit leaves (a
    container's --memory); None where neither says."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines())
        host = sum(int(fields[k].split()[0]) * 1024 for k in ("MemAvailable", "SwapFree") if k in fields)
    except (OSError, ValueError):
        host = None
    limited = memory_headroom()
    return min((m for m in (host, limited) if m is not None), default=None)


def environment(device: torch.device) -> dict:
    """Where a measurement ran: Python, the OS, the processor, the GPU (with its clocks where NVML
    reads them), and the tracked packages."""
    from pipeline.runtime.dynamic.ort_fused import CUDA_SESSION_CONFIG

    env = {"python": platform.python_version(), "platform": platform.platform(), "device": str(device),
           "cpu": cpu_description(), "packages": package_versions()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, compute_capability=f"{props.major}.{props.minor}",
                   gpu_memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda)
        try:
            import pynvml
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            env.update(driver=pynvml.nvmlSystemGetDriverVersion(),
                       sm_clock_mhz=pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                       max_sm_clock_mhz=pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM))
        except Exception as e:  # NVML is optional: without it the clocks are not readable
            env["clocks"] = f"unreadable ({type(e).__name__})"
    else:
        env["cpu_threads"] = torch.get_num_threads()
    try:  # the module imported, which the package list can misname (onnxruntime-gpu installs as onnxruntime)
        import onnxruntime
        env["onnxruntime"] = {"version": onnxruntime.__version__, "providers": onnxruntime.get_available_providers(),
                              "intra_op_threads": usable_cores()}
        if device.type == "cuda":
            env["onnxruntime"]["ort_fused_session_config"] = CUDA_SESSION_CONFIG
    except ImportError:
        pass
    return env
