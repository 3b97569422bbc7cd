"""The JSON written beside every plan, and the check a loader makes against it before it asks
TensorRT to deserialise anything: a plan only runs on the TensorRT version that built it, and on
the GPU architectures it was built for."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.errors import UserError

# TensorRT-RTX runs on these compute capabilities (and newer than 12.0); it refuses 9.0 (H100/H200)
RTX_RUNNABLE = {(8, 0), (8, 6), (8, 9), (12, 0), (12, 1)}


@dataclass
class EngineMeta:
    flavour: str  # tensorrt | tensorrt_rtx
    trt_version: str
    precision: str
    targets: list[str]  # compute capabilities the plan holds kernels for, e.g. ["sm90"]
    gpu: str  # the GPU it was built on, or "none" (TensorRT-RTX builds without one)
    profile: dict[str, list[list[int]]]  # input -> [min, opt, max]
    onnx_sha256: str
    build_seconds: float
    plan_bytes: int
    timing_cache: str  # what happened to the timing cache: reused, created, rebuilt (corrupt), unused

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def read(cls, path: Path) -> "EngineMeta":
        try:
            return cls(**json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError, TypeError) as e:
            raise UserError(f"{path}: missing or unreadable engine metadata ({type(e).__name__}); rebuild with "
                            "`gpt2-deploy build-engine --force`") from None


def plans_for(engines: Path, precision: str) -> list[Path]:
    """The plans of one precision. Names are <flavour>-<precision>-<targets>; a glob on the
    precision alone would take int8-wo plans for int8 ones."""
    found = []
    for plan in sorted(engines.glob("*.plan")):
        _, rest = plan.stem.split("-", 1) if "-" in plan.stem else (plan.stem, "")
        if rest.rsplit("-", 1)[0] == precision:
            found.append(plan)
    return found


def sm(capability: tuple[int, int]) -> str:
    return f"sm{capability[0]}{capability[1]}"


def check_runnable(meta: EngineMeta, installed_version: str, capability: tuple[int, int], plan: Path) -> None:
    """Refuse, in one sentence that says what to do, a plan this machine cannot run."""
    if meta.trt_version != installed_version:
        raise UserError(f"{plan}: built by {meta.flavour} {meta.trt_version}, but {installed_version} is installed; "
                        "rebuild it here with `gpt2-deploy build-engine --force`")
    if meta.flavour == "tensorrt_rtx" and capability not in RTX_RUNNABLE and capability < (12, 0):
        raise UserError(f"{plan}: TensorRT-RTX does not run on this GPU (compute capability {capability[0]}.{capability[1]}; "
                        "it supports 8.0, 8.6, 8.9 and 12.x); build with the `tensorrt` flavour for this GPU")
    if sm(capability) not in meta.targets:
        raise UserError(f"{plan}: built for {', '.join(meta.targets)}, but this GPU is {sm(capability)}; rebuild it "
                        f"here, or with --target {sm(capability)}")
