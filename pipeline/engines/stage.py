"""`gpt2-deploy build-engine`: onnx/<precision>/model.onnx -> engines/<flavour>-<precision>-<target>.plan
plus a JSON of what it is, for each exported precision (or the ones named)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import onnx

from pipeline.artifacts import (
    RunDir,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    fingerprint,
)
from pipeline.config import Config
from pipeline.contract import Contract, check_graph
from pipeline.engines.builder import build_plan
from pipeline.engines.flavours import FLAVOURS, Flavour, by_name, import_flavour
from pipeline.engines.metadata import EngineMeta, sm
from pipeline.engines.profiles import profile_shapes
from pipeline.errors import UserError
from pipeline.progress import console

TIMING_CACHE = "timing.cache"
DEFAULT_RTX_TARGET = "sm86"  # what TensorRT-RTX builds for when there is no GPU to ask


def pick_flavour(name: str) -> tuple[Flavour, object]:
    """`auto`: tensorrt if it imports, else tensorrt_rtx; else one line saying how to install either."""
    if name != "auto":
        flavour = by_name(name)
        return flavour, import_flavour(flavour)
    reasons = []
    for flavour in FLAVOURS:
        try:
            return flavour, import_flavour(flavour)
        except UserError as e:
            reasons.append(str(e))
    raise UserError("no TensorRT is installed: " + " / ".join(reasons))


def current_gpu() -> tuple[str, tuple[int, int]] | None:
    with contextlib.suppress(Exception):
        import torch
        if torch.cuda.is_available():
            return torch.cuda.get_device_name(), torch.cuda.get_device_capability()
    return None


def trt_compute_capabilities():
    return import_flavour(by_name("tensorrt_rtx")).ComputeCapability


def resolve_targets(flavour: Flavour, requested: list[str]) -> tuple[list[str], str]:
    """(targets, gpu name). `tensorrt` builds for the GPU it runs on, so it needs one."""
    gpu = current_gpu()
    if flavour.name == "tensorrt":
        if gpu is None:
            raise UserError("the tensorrt flavour builds for the GPU it runs on and none is visible; "
                            "use --flavour tensorrt_rtx --target sm86 to build without a GPU")
        if requested:
            raise UserError("--target applies to tensorrt_rtx only; tensorrt builds for this GPU")
        return [sm(gpu[1])], gpu[0]
    if requested:
        return requested, gpu[0] if gpu else "none"
    here = sm(gpu[1]) if gpu else None
    if here is None or not hasattr(trt_compute_capabilities(), here.upper()):
        # no GPU, or one TensorRT-RTX cannot target (an H100/H200): build for the default target
        console.print(f"build-engine: targeting {DEFAULT_RTX_TARGET} (pass --target to choose)")
        return [DEFAULT_RTX_TARGET], gpu[0] if gpu else "none"
    return [here], gpu[0]


def plan_name(flavour: Flavour, precision: str, targets: list[str]) -> str:
    return f"{flavour.name}-{precision}-{'_'.join(targets)}"


def check_onnx(path: Path, contract: Contract) -> None:
    try:
        graph = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # a truncated protobuf raises DecodeError, which onnx does not re-export
        raise UserError(f"{path}: not a readable ONNX file ({type(e).__name__}); rerun `gpt2-deploy export --force`") from None
    check_graph(graph, contract, str(path))


def build_engines(cfg: Config, run: RunDir, precisions: list[str] | None, flavour_name: str = "auto",
                  targets: list[str] | None = None, log_level: str = "warning", force: bool = False) -> list[EngineMeta]:
    flavour, trt = pick_flavour(flavour_name)
    targets, gpu = resolve_targets(flavour, targets or cfg.engine.targets)
    from pipeline.model import load_checkpoint
    contract = Contract.from_hf_config(load_checkpoint(run.checkpoint).config)
    precisions = precisions or [p for p in cfg.export.precisions if (run.onnx(p) / "model.onnx").exists()]
    if not precisions:
        raise UserError(f"no ONNX graphs in {run.root / 'onnx'}: `gpt2-deploy export` (or `make export`) makes them")
    profile = profile_shapes(contract, cfg.engine)
    run.ensure_writable()
    built = []
    for precision in precisions:
        onnx_path = run.onnx(precision) / "model.onnx"
        if not onnx_path.exists():
            raise UserError(f"{onnx_path}: no such graph; run `gpt2-deploy export --precision {precision}`")
        onnx_sha = run.require_exported(precision)
        check_onnx(onnx_path, contract)
        name = plan_name(flavour, precision, targets)
        stage = f"engine-{name}"
        stage_fp = fingerprint(onnx_sha, profile, flavour.name, trt.__version__, targets, cfg.engine.optimization_level)
        if not force and run.is_fresh(stage, stage_fp):
            console.print(f"build-engine: engines/{name}.plan is up to date")
            built.append(EngineMeta.read(run.engines / f"{name}.json"))
            continue
        run.forget(stage)
        result = build_plan(flavour, trt, onnx_path, profile, targets, run.engines / TIMING_CACHE,
                            cfg.engine.optimization_level, cfg.engine.workspace_gib, log_level)
        meta = EngineMeta(flavour.name, trt.__version__, precision, result.targets, gpu,
                          {k: [list(s) for s in v] for k, v in profile.items()}, onnx_sha, round(result.seconds, 2),
                          len(result.plan), result.timing_cache)
        atomic_write_bytes(run.engines / f"{name}.plan", result.plan)
        atomic_write_text(run.engines / f"{name}.json", meta.to_json())
        run.record(stage, [run.engines / f"{name}.plan", run.engines / f"{name}.json"], stage_fp, cfg.section("engine"))
        console.print(f"build-engine: engines/{name}.plan {meta.plan_bytes / 1e6:.1f} MB in {meta.build_seconds:.1f}s")
        built.append(meta)
    atomic_write_json(run.reports / "build_engine.json", [m.__dict__ for m in built])
    return built
