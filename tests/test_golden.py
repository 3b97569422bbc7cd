"""The accuracy-drift regression test: the embedded default model (the `tiny` preset on the
offline corpus) through finetune, export and validate on the CPU, held to committed golden figures.
It trains 80 of the preset's 150 steps: the whole run took 4.4 of the suite's 20 minutes on 2 cores,
and half of it moves every figure below as well.

A change that moves accuracy (training, export, quantisation, the runtime) fails here: every row
must stay within its budget, and no figure may drift far from what was committed. After a change
that is meant to move them, regenerate with `GOLDEN_UPDATE=1 pytest tests/test_golden.py` and
commit tests/golden/tiny_cpu.json with the reason."""

import json
import os
from pathlib import Path

import pytest
import torch

from pipeline.artifacts import RunDir
from pipeline.config import load_config
from pipeline.export.stage import export
from pipeline.train.finetune import finetune
from pipeline.validate import failed, validate

pytest.importorskip("modelopt.onnx.quantization", reason="fp16/int8 export needs the [quant] extra")
GOLDEN = Path(__file__).with_name("golden") / "tiny_cpu.json"
PAIRS = [("ort", p) for p in ("fp32", "fp16", "int8", "int8-wo")]


def figures(report: dict, result: dict) -> dict:
    keep = ("rel_error", "top1", "top1_clear", "identical_tokens", "perplexity_change")
    return {"heldout_loss_final": report["heldout_loss_final"],
            "reference_perplexity": result["reference"]["perplexity"],
            "rows": {f"{r['backend']}/{r['precision']}": {k: r["metrics"][k] for k in keep} for r in result["rows"]}}


@pytest.mark.slow
def test_default_model_accuracy_has_not_drifted(tmp_path):
    cfg = load_config("tiny", overrides=["train.device=cpu", "train.steps=80"])
    run = RunDir(tmp_path / "tiny")
    report = finetune(cfg, run)
    export(cfg, run)
    result = validate(cfg, run, torch.device("cpu"), pairs=PAIRS)
    now = figures(report, result)
    if os.environ.get("GOLDEN_UPDATE"):
        GOLDEN.write_text(json.dumps(now, indent=2) + "\n")
    golden = json.loads(GOLDEN.read_text())

    assert not failed(result), [r for r in result["rows"] if r["status"] == "fail"]
    # training itself: the same corpus, seed and schedule land on the same held-out loss
    assert now["heldout_loss_final"] == pytest.approx(golden["heldout_loss_final"], rel=0.02)
    assert now["reference_perplexity"] == pytest.approx(golden["reference_perplexity"], rel=0.05)
    for key, g in golden["rows"].items():
        m = now["rows"][key]
        assert m["rel_error"] <= 3 * g["rel_error"] + 1e-7, (key, m, g)
        assert m["top1"] >= g["top1"] - 0.02, (key, m, g)
        assert m["identical_tokens"] >= g["identical_tokens"] - 0.05, (key, m, g)
        assert abs(m["perplexity_change"]) <= 3 * abs(g["perplexity_change"]) + 1e-4, (key, m, g)
