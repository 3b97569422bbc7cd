"""One engine builder for both flavours: parse the ONNX graph into a strongly typed network
(precision comes from the graph: fp16 tensors, explicit Q/DQ), add the optimisation profile, and
serialise a plan. `tensorrt` builds for the GPU it runs on and reuses a timing cache;
`tensorrt_rtx` builds for the compute capabilities it is given, GPU or not."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from pipeline.engines.flavours import Flavour
from pipeline.errors import UserError
from pipeline.progress import progress_task

LOG_LEVELS = ("error", "warning", "info", "verbose")


@dataclass
class BuildResult:
    plan: bytes
    seconds: float
    targets: list[str]
    timing_cache: str


# what the parser always says of the contract's int64 inputs; the runtime binds them as int64
EXPECTED = ("has Int64 binding",)


def _logger(trt: ModuleType, level: str):
    """TensorRT's messages at `level` and above, on stderr, but for the EXPECTED ones."""
    severity = trt.ILogger.Severity
    least = {"error": severity.ERROR, "warning": severity.WARNING, "info": severity.INFO,
             "verbose": severity.VERBOSE}[level]

    class Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)

        def log(self, sev, msg: str) -> None:
            if int(sev) <= int(least) and not any(e in msg for e in EXPECTED):
                print(f"[TRT] [{sev.name[0]}] {msg}", file=sys.stderr, flush=True)

    return Logger()


def _progress_monitor(trt: ModuleType, task):
    """TensorRT's build phases, advancing one rich bar (top-level phases only)."""

    class Monitor(trt.IProgressMonitor):
        def __init__(self):
            trt.IProgressMonitor.__init__(self)

        def phase_start(self, parent_phase, phase_name, num_steps):
            if parent_phase is None:
                task.advance(0, status=phase_name)

        def step_complete(self, phase_name, step):
            return True  # False would cancel the build

        def phase_finish(self, phase_name):
            task.advance(1)

    return Monitor()


def _parse(trt: ModuleType, builder, logger, onnx_path: Path):
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(parser.get_error(i).desc() for i in range(min(parser.num_errors, 3)))
        raise UserError(f"{onnx_path}: TensorRT cannot parse this graph ({errors})")
    return network, parser


def _set_targets(trt: ModuleType, config, targets: list[str]) -> None:
    config.num_compute_capabilities = len(targets)
    for i, target in enumerate(targets):
        name = target.upper()
        if not hasattr(trt.ComputeCapability, name):
            known = [n.lower() for n in dir(trt.ComputeCapability) if n.startswith("SM")]
            raise UserError(f"--target {target}: this TensorRT-RTX knows {', '.join(known)}")
        config.set_compute_capability(getattr(trt.ComputeCapability, name), i)


def _load_timing_cache(config, cache_path: Path) -> tuple[object, str]:
    if cache_path.exists():
        try:
            return config.create_timing_cache(cache_path.read_bytes()), "reused"
        except Exception:  # TensorRT raises a generic error type for a corrupt cache
            cache_path.unlink()
            return config.create_timing_cache(b""), "rebuilt (the old cache was corrupt and was deleted)"
    return config.create_timing_cache(b""), "created"


def build_plan(flavour: Flavour, trt: ModuleType, onnx_path: Path, profile: dict[str, tuple], targets: list[str],
               cache_path: Path, optimization_level: int, workspace_gib: float, log_level: str) -> BuildResult:
    logger = _logger(trt, log_level)
    builder = trt.Builder(logger)
    network, _parser = _parse(trt, builder, logger, onnx_path)  # the parser must outlive the network
    config = builder.create_builder_config()
    config.builder_optimization_level = optimization_level
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gib * 2**30))
    trt_profile = builder.create_optimization_profile()
    for name, (lo, opt, hi) in profile.items():
        trt_profile.set_shape(name, lo, opt, hi)
    config.add_optimization_profile(trt_profile)
    if flavour.name == "tensorrt_rtx":
        _set_targets(trt, config, targets)
        timing = "unused (timing cache calls are no-ops in TensorRT-RTX)"
    else:
        cache, timing = _load_timing_cache(config, cache_path)
        config.set_timing_cache(cache, ignore_mismatch=False)
    started = time.perf_counter()
    with progress_task(f"build {onnx_path.parent.name}", None) as task:
        config.progress_monitor = _progress_monitor(trt, task)
        plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise UserError(f"{onnx_path}: {flavour.name} could not build an engine (run with --log-level verbose to see why)")
    if flavour.name == "tensorrt":
        cache_path.write_bytes(bytes(config.get_timing_cache().serialize()))
    return BuildResult(bytes(plan), time.perf_counter() - started, targets, timing)
