"""`validate --polygraphy`: an independent second opinion from NVIDIA Polygraphy's comparator.

Polygraphy runs the fp32 graph on ONNX Runtime and saves its outputs, then runs each other
variant on the same saved inputs and compares every output with its own tolerance logic. The
inputs are a real decode step: held-out tokens on top of a KV cache PyTorch computed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from pipeline.artifacts import RunDir
from pipeline.config import Config
from pipeline.data import Splits, heldout_blocks
from pipeline.precisions import PRECISIONS

SAMPLES = 2
# its console script's entry point, so a target-installed polygraphy works without bin/ on PATH
POLYGRAPHY = [sys.executable, "-c", "import sys; from polygraphy.tools._main import main; sys.exit(main())"]


def _save_inputs(path: Path, feeds: dict[str, np.ndarray]) -> None:
    from polygraphy.json import save_json
    from polygraphy.logger import G_LOGGER
    G_LOGGER.module_severity = G_LOGGER.WARNING
    save_json([feeds], str(path), description="decode-step inputs")


def polygraphy_compare(run: RunDir, model, splits: Splits, cfg: Config) -> list[dict]:
    from pipeline.export.calibration import calibration_feeds

    if importlib.util.find_spec("polygraphy") is None:
        return [{"precision": "all", "status": "skipped", "detail": "polygraphy is not installed: pip install 'gpt2-deploy[quant]'"}]
    blocks = heldout_blocks(splits, SAMPLES, cfg.data.calib_block_size, "data.calib_block_size", from_end=True)
    feeds = calibration_feeds(model, blocks)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        _save_inputs(tmp / "in32.json", feeds)
        _save_inputs(tmp / "in16.json", {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in feeds.items()})
        ref = _polygraphy(run.onnx("fp32") / "model.onnx", tmp / "in32.json", ["--save-outputs", str(tmp / "ref.json")])
        if ref.returncode != 0:
            return [{"precision": "fp32", "status": "fail", "detail": _last_line(ref)}]
        for precision, (atol, rtol) in ((p.name, p.polygraphy_tolerance) for p in PRECISIONS.values()
                                        if p.polygraphy_tolerance):
            path = run.onnx(precision) / "model.onnx"
            if not path.exists():
                results.append({"precision": precision, "status": "skipped", "detail": f"no onnx/{precision} graph"})
                continue
            inputs = tmp / ("in16.json" if precision == "fp16" else "in32.json")
            done = _polygraphy(path, inputs, ["--load-outputs", str(tmp / "ref.json"), "--atol", str(atol), "--rtol", str(rtol),
                                              "--check-error-stat", "median", "--onnx-outputs", "logits"])
            results.append({"precision": precision, "status": "pass" if done.returncode == 0 else "fail",
                            "detail": f"median |error| within atol {atol}, rtol {rtol}" if done.returncode == 0 else _last_line(done)})
    return results


def _polygraphy(model: Path, inputs: Path, extra: list[str]) -> subprocess.CompletedProcess:
    cmd = [*POLYGRAPHY, "run", str(model), "--onnxrt", "--load-inputs", str(inputs), *extra]
    return subprocess.run(cmd, capture_output=True, text=True)


def _last_line(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "FAILED" in line or "Error" in line]
    return (lines[-1] if lines else (done.stdout + done.stderr).strip().splitlines()[-1])[:300]
