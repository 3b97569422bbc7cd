"""The TensorRT backend: the checks before a plan is deserialised, and running an engine where a GPU
TensorRT supports is present (elsewhere that test skips and says why)."""

import pytest
import torch

from pipeline.contract import Contract
from pipeline.engines.metadata import EngineMeta, check_runnable
from pipeline.errors import UserError
from pipeline.model import load_checkpoint
from pipeline.runtime.backend import BackendUnavailable
from pipeline.runtime.dynamic.trt_backend import open_trt_backend

pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX is not installed (pip install 'gpt2-deploy[trt-rtx]')")


def test_loader_refuses_plans_this_machine_cannot_run(engines):
    _, run, metas = engines
    meta, plan = metas[1], run.engines / "tensorrt_rtx-fp16-sm86.plan"
    with pytest.raises(UserError, match="built by tensorrt_rtx 1.0.0, but .* is installed; rebuild"):
        check_runnable(EngineMeta(**{**meta.__dict__, "trt_version": "1.0.0"}), meta.trt_version, (8, 6), plan)
    with pytest.raises(UserError, match=r"TensorRT-RTX does not run on this GPU \(compute capability 9.0"):
        check_runnable(meta, meta.trt_version, (9, 0), plan)  # an H100/H200
    with pytest.raises(UserError, match="built for sm86, but this GPU is sm89"):
        check_runnable(meta, meta.trt_version, (8, 9), plan)
    check_runnable(meta, meta.trt_version, (8, 6), plan)  # the one it was built for passes
    if not torch.cuda.is_available():
        with pytest.raises(BackendUnavailable, match="run on a CUDA GPU"):
            open_trt_backend(run, Contract.from_hf_config(load_checkpoint(run.checkpoint).config), "fp16", torch.device("cpu"))


@pytest.mark.gpu
def test_engine_runs_and_matches_pytorch(engines):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here: TensorRT engines only run on one")
    cfg, run, _ = engines
    from pipeline.validate import validate
    result = validate(cfg, run, torch.device("cuda"), pairs=[("trt", "fp16")])
    row = result["rows"][0]
    if row["status"] == "skipped":
        pytest.skip(row["reason"])
    assert row["status"] == "pass", row
