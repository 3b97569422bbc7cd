"""validate: every row against PyTorch fp32, budgets that can fail, provenance checks."""

import json

import numpy as np
import pytest

from pipeline.errors import UserError
from pipeline.export.calibration import calibration_feeds
from pipeline.export.int8 import convert_int8_qdq
from pipeline.model import load_checkpoint
from pipeline.validate import failed, validate
from tests.conftest import copy_run, copy_with_edited_graph

CPU = __import__("torch").device("cpu")


def test_every_cpu_row_passes_and_the_rest_say_why(exported_run):
    cfg, run, _ = exported_run
    result = validate(cfg, run, CPU)
    rows = {(r["backend"], r["precision"]): r for r in result["rows"]}
    for pair in [("torch-compiled", "fp32"), ("ort", "fp32"), ("ort", "fp16"), ("ort", "int8"), ("ort", "int8-wo")]:
        assert rows[pair]["status"] == "pass", rows[pair]
    assert rows[("ort", "fp32")]["metrics"]["rel_error"] < 1e-5
    assert rows[("ort", "fp32")]["metrics"]["identical_tokens"] == 1.0
    assert abs(rows[("ort", "fp16")]["metrics"]["perplexity_change"]) < 0.01
    for pair in [("torch", "fp16"), ("trt", "fp16")]:
        assert rows[pair]["status"] == "skipped" and rows[pair]["reason"]
    assert not failed(result)
    saved = json.loads((run.reports / "validate.json").read_text())
    assert saved["reference"]["perplexity"] == pytest.approx(result["reference"]["perplexity"])
    assert saved["model"]["layers"] == 1 and saved["environment"]["cpu"]["model"]


def test_int8_calibrated_on_garbage_fails(exported_run, tmp_path):
    """The regression test can fail: activation scales from noise a thousand times too large."""
    cfg, run, _ = exported_run
    broken = copy_run(run, tmp_path / "broken")
    model = load_checkpoint(broken.checkpoint)
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 50257, (4, 16))
    garbage = {k: (v * 1000 + rng.normal(0, 1000, v.shape)).astype(np.float32) if v.dtype == np.float32 else v
               for k, v in calibration_feeds(model, blocks).items()}
    out = broken.onnx("int8") / "model.onnx"
    convert_int8_qdq(broken.onnx("fp32") / "model.onnx", out, garbage)
    stage = broken.manifest()["stages"]["export-int8"]
    broken.record("export-int8", [broken.onnx("int8")], stage["fingerprint"], stage["config"], {"checkpoint": stage["checkpoint"]})
    result = validate(cfg, broken, CPU, pairs=[("ort", "int8")])
    assert [r["status"] for r in failed(result)] == ["fail"]
    assert result["rows"][0]["failures"]  # says which budget it broke


def test_graph_that_does_not_match_the_manifest_is_refused(exported_run, tmp_path):
    cfg, run, _ = exported_run
    changed = copy_with_edited_graph(run, tmp_path / "changed", "int8-wo")
    with pytest.raises(UserError, match="not the int8-wo graph export wrote .its sha256 differs"):
        validate(cfg, changed, CPU, pairs=[("ort", "int8-wo")])


def test_polygraphy_second_opinion(exported_run):
    pytest.importorskip("polygraphy", reason="needs the [quant] extra")
    cfg, run, _ = exported_run
    result = validate(cfg, run, CPU, pairs=[("ort", "fp32")], polygraphy=True)
    assert {p["precision"]: p["status"] for p in result["polygraphy"]} == {"fp16": "pass", "int8": "pass", "int8-wo": "pass"}


def test_graph_left_by_an_unfinished_export_is_refused(exported_run, tmp_path):
    cfg, run, _ = exported_run
    orphan = copy_run(run, tmp_path / "orphan")
    orphan.forget("export-fp16")
    with pytest.raises(UserError, match="not recorded in .*an export that did not finish"):
        validate(cfg, orphan, CPU, pairs=[("ort", "fp16")])
