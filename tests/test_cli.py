"""The CLI as a user meets it: one-line errors with a non-zero exit, and working commands."""

import json

import pytest
from typer.testing import CliRunner

from pipeline.cli import app

runner = CliRunner()


def test_unknown_preset_is_one_line_and_exit_1():
    result = runner.invoke(app, ["finetune", "--preset", "huge"])
    assert result.exit_code == 1
    assert "error: --preset 'huge' is unknown" in result.output and "Traceback" not in result.output


def test_bad_override_names_the_key():
    result = runner.invoke(app, ["finetune", "--set", "train.lr=-3"])
    assert result.exit_code == 1 and "train.lr must be positive" in result.output


@pytest.mark.parametrize("args, message", [
    (["export", "--target", "tflite"], "--target tflite: unknown; choose from portable, ort"),
    (["export", "--precision", "int4"], "--precision int4: unknown; choose from"),
])
def test_an_unknown_flag_value_names_the_flag(args, message, tmp_path):
    result = runner.invoke(app, [*args, "--artifacts", str(tmp_path)])
    assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output


def test_missing_data_file(tmp_path):
    result = runner.invoke(app, ["finetune", "--data", str(tmp_path / "none.txt"), "--artifacts", str(tmp_path)])
    assert result.exit_code == 1 and "no such file or folder" in result.output


def test_finetune_then_nothing_to_do(tmp_path, corpus_file):
    from tests.conftest import MICRO

    args = ["finetune", "--artifacts", str(tmp_path), "--run", "r", "--data", str(corpus_file)]
    for s in MICRO:
        args += ["--set", s]
    assert runner.invoke(app, args).exit_code == 0
    assert (tmp_path / "r" / "checkpoint" / "model.safetensors").exists()
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and "up to date" in again.output


def test_doctor_reports_components():
    result = runner.invoke(app, ["doctor", "--json"])
    assert result.exit_code == 0
    names = {f["component"] for f in json.loads(result.output)}
    assert {"torch", "cpu", "onnx", "tensorrt", "tensorrt_rtx", "modelopt"} <= names


def _stage_args(command, cfg, run, *extra):
    from tests.conftest import MICRO

    args = [command, *extra, "--artifacts", str(run.root.parent), "--run", run.root.name, "--device", "cpu",
            "--set", f"data.source={cfg.data.source}", "--set", "model.n_positions=256"]
    for s in MICRO:
        args += ["--set", s]
    return args


def test_generate_streams_text_and_names_an_unavailable_backend(exported_run):
    cfg, run, _ = exported_run
    result = runner.invoke(app, _stage_args("generate", cfg, run, "Return the", "--backend", "ort", "--precision", "int8",
                                            "--max-new-tokens", "6"))
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Return the") and len(result.output.strip()) > len("Return the")
    result = runner.invoke(app, _stage_args("generate", cfg, run, "Hi", "--backend", "trt", "--precision", "fp16"))
    assert result.exit_code == 1 and "error: --backend trt --precision fp16:" in result.output
    result = runner.invoke(app, _stage_args("generate", cfg, run, "Hi", "--max-new-tokens", "1000"))
    assert result.exit_code == 1 and result.output.startswith("error: a prompt of 1 tokens plus max_new_tokens=1000")


def test_generate_deterministic_takes_a_static_backend_or_one_prompt(exported_run):
    """--deterministic: torch-compiled computes each prompt's row as it would alone, so two prompts give
    each its own text alone; ort batches them in one call, so it takes one prompt and names the fix."""
    cfg, run, _ = exported_run
    pick = ("--backend", "torch-compiled", "--precision", "fp32", "--max-new-tokens", "6", "--deterministic")
    both = runner.invoke(app, _stage_args("generate", cfg, run, "Return the", "The module returns", *pick))
    alone = runner.invoke(app, _stage_args("generate", cfg, run, "The module returns", *pick))
    assert both.exit_code == 0 and alone.exit_code == 0, both.output + alone.output
    assert both.output.splitlines()[1] == alone.output.splitlines()[0]
    ort = ("--backend", "ort", "--precision", "fp32", "--max-new-tokens", "3", "--deterministic")
    assert runner.invoke(app, _stage_args("generate", cfg, run, "Hi", *ort)).exit_code == 0
    refused = runner.invoke(app, _stage_args("generate", cfg, run, "Hi", "Return the", *ort))
    assert refused.exit_code == 1 and refused.output.startswith("error: --deterministic: the ort backend computes")


def test_validate_exits_non_zero_over_budget(exported_run, tmp_path):
    from tests.conftest import copy_run

    cfg, run, _ = exported_run
    run = copy_run(run, tmp_path / "run")
    ok = runner.invoke(app, _stage_args("validate", cfg, run, "--backend", "ort", "--precision", "int8"))
    assert ok.exit_code == 0, ok.output
    strict = runner.invoke(app, _stage_args("validate", cfg, run, "--backend", "ort", "--precision", "int8",
                                            "--set", "validate.budgets.int8.max_rel_error=1e-12"))
    assert strict.exit_code == 1 and "exceed their accuracy budget" in strict.output
    assert "ort int8 fail: relative logits error" in strict.output


def test_a_prompt_that_is_not_utf8_is_one_line(exported_run):
    """Bytes that are not UTF-8 on the command line reach Python as lone surrogates."""
    import subprocess
    import sys

    cfg, run, _ = exported_run
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", *_stage_args("generate", cfg, run, "x")[:1], b"caf\xe9",
                           *_stage_args("generate", cfg, run, "x")[2:]], capture_output=True)
    assert done.returncode == 1 and b"Traceback" not in done.stdout + done.stderr
    assert b"error: prompt 1 is not valid UTF-8 text" in done.stdout + done.stderr


@pytest.mark.parametrize("command", ["generate", "bench"])
def test_a_graph_that_export_did_not_write_is_refused(exported_run, tmp_path, command):
    """The int8-wo graph copied into the fp32 slot, or a truncated graph: generate and bench refuse it in
    one line rather than run it (or report it) as fp32."""
    import shutil

    from tests.conftest import copy_run
    cfg, run, _ = exported_run
    run = copy_run(run, tmp_path / "run")
    extra = ("Hi",) if command == "generate" else ("--batch", "1", "--new-tokens", "2", "--repeats", "1")
    args = _stage_args(command, cfg, run, *extra, "--backend", "ort", "--precision", "fp32")
    shutil.copy(run.onnx("int8-wo") / "model.onnx", run.onnx("fp32") / "model.onnx")
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "not the fp32 graph export wrote" in result.output, result.output
    (run.onnx("fp32") / "model.onnx").write_bytes(b"\x08\x07not onnx")
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "rerun `gpt2-deploy export --force`" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("damage", ["empty", "truncated"])
def test_damaged_weights_are_one_line_naming_the_checkpoint(exported_run, tmp_path, damage):
    """A zero-byte or truncated model.safetensors: generate (and export, which loads the same way) say
    which checkpoint cannot be loaded, in one line, exit 1; no traceback."""
    from tests.conftest import copy_run

    cfg, run, _ = exported_run
    run = copy_run(run, tmp_path / "run")
    weights = run.checkpoint / "model.safetensors"
    weights.write_bytes(b"" if damage == "empty" else weights.read_bytes()[:1000])
    result = runner.invoke(app, _stage_args("generate", cfg, run, "Hi", "--backend", "torch"))
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert result.output.startswith(f"error: checkpoint {run.checkpoint}: the weights cannot be loaded")
    assert len(result.output.strip().splitlines()) == 1
