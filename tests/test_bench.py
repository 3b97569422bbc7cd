"""bench on the CPU: the three report files, well-formed, every row naming its backend and precision."""

import json

import pytest
import torch
from typer.testing import CliRunner

from pipeline.bench import NOISY_SPREAD, Row, add_speedups, device_memory_mib, rounds, summarise_passes
from pipeline.bench_report import compare
from pipeline.cli import app
from pipeline.model import load_checkpoint
from tests.conftest import MICRO, copy_run

runner = CliRunner()


def _args(run, *extra):
    args = ["bench", "--artifacts", str(run.root.parent), "--run", run.root.name, "--device", "cpu",
            "--batch", "1,2", "--prompt-tokens", "8", "--new-tokens", "4", "--repeats", "2", *extra]
    for s in MICRO:
        args += ["--set", s]
    return args


def test_bench_writes_json_markdown_and_png(exported_run, tmp_path):
    cfg, run, _ = exported_run
    run = copy_run(run, tmp_path / "run")
    result = runner.invoke(app, _args(run, "--backend", "torch", "--backend", "ort", "--backend", "trt",
                                      "--precision", "fp32", "--precision", "int8-wo", "--set", f"data.source={cfg.data.source}"))
    assert result.exit_code == 0, result.output
    bench = json.loads((run.reports / "bench.json").read_text())
    rows = bench["rows"]
    assert {(r["backend"], r["precision"]) for r in rows} >= {("torch", "fp32"), ("ort", "fp32"), ("ort", "int8-wo"),
                                                              ("trt", "fp32")}
    assert all(r["backend"] and r["precision"] and r["batch"] in (1, 2) for r in rows)
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == 6  # torch fp32, ort fp32, ort int8-wo at two batch sizes
    for r in ok:
        assert r["tokens_per_s"] > 0 and r["ttft_ms"] > 0 and r["decode_ms_p50"] <= r["decode_ms_p99"]
        assert r["speedup_vs_eager"] > 0 and r["baseline"] == "torch fp32"
        assert r["tokens_per_s_min"] <= r["tokens_per_s"] <= r["tokens_per_s_max"] and r["spread"] >= 0
        assert r["noisy"] == (r["spread"] > NOISY_SPREAD or next(
            b["spread"] for b in ok if b["backend"] == "torch" and b["batch"] == r["batch"]) > NOISY_SPREAD)
        assert r["launches_per_step"] is None  # a CPU launches nothing
        assert r["read_gbps"] == pytest.approx(r["step_read_mb"] / r["decode_ms_p50"])  # MB/ms is GB/s
        assert r["of_floor"] == pytest.approx(r["floor_ms"] / r["decode_ms_p50"]) and r["floor_ms"] > 0
        assert r["held_memory_mib"] is not None
    assert [r["speedup_vs_eager"] for r in ok if r["backend"] == "torch"] == [1.0, 1.0]
    skipped = [r for r in rows if r["status"] == "skipped"]
    assert skipped and all(r["reason"] and r["decoding"] == "greedy" and "greedy" != r["reason"] for r in skipped)  # say why
    assert bench["environment"]["device"] == "cpu" and "torch" in bench["environment"]["packages"]
    assert bench["model"]["layers"] == 1 and bench["model"]["parameters"] == load_checkpoint(run.checkpoint).num_parameters()
    table = (run.reports / "bench.md").read_text()
    assert f"model: custom, {bench['model']['parameters']:,} parameters (1 layer, 32 wide, 2 heads); CPU: " in table
    assert table.count("\n| ") == len(rows) + 1 and "| ort | int8-wo | 2 |" in table
    assert bench["environment"]["copy_gbps"] > 0 and "a device-to-device copy reached here" in table
    assert (run.reports / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    again = runner.invoke(app, _args(run, "--backend", "ort", "--precision", "fp32", "--compare",
                                     str(run.reports / "bench.json"), "--set", f"data.source={cfg.data.source}"))
    assert again.exit_code == 0 and "ort fp32 b1: tokens/s" in again.output


def test_compare_flags_a_slowdown():
    row = {"backend": "ort", "precision": "fp16", "batch": 1, "status": "ok", "decode_ms_p50": 1.0}
    old = {"rows": [{**row, "tokens_per_s": 100.0}]}
    new = {"rows": [{**row, "tokens_per_s": 80.0, "decode_ms_p50": 1.25}]}
    (change,) = compare(new, old)
    assert change["regression"] and round(change["tokens_per_s_change"], 2) == -0.2


def test_bad_options_are_one_line(tmp_path):
    assert "give comma-separated whole numbers" in runner.invoke(app, ["bench", "--batch", "one"]).output
    bad = tmp_path / "old.json"
    bad.write_text("not json")
    result = runner.invoke(app, ["bench", "--compare", str(bad)])
    assert result.exit_code == 1 and "not a readable bench.json" in result.output
    bad.write_text('{"rows": 3}')  # JSON, but not a bench report: refused before the run, not after it
    result = runner.invoke(app, ["bench", "--compare", str(bad)])
    assert result.exit_code == 1 and "not a bench.json (it needs rows with backend" in result.output


def test_a_filter_that_selects_nothing_is_refused(tmp_path):
    result = runner.invoke(app, ["bench", "--artifacts", str(tmp_path), "--backend", "nope"])
    assert result.exit_code == 1 and "--backend nope: unknown; choose from torch, torch-compiled" in result.output
    result = runner.invoke(app, ["validate", "--artifacts", str(tmp_path), "--backend", "triton", "--precision", "int8"])
    assert result.exit_code == 1 and "no backend runs that combination" in result.output
    assert not any(tmp_path.rglob("*.json"))  # nothing half-written


def test_a_rows_figures_come_from_the_same_passes_and_agree():
    """Three passes of 4 tokens on one row: the tokens/s, its spread and the per-token p50 are of
    those passes, so tokens/s and what TTFT and the p50 predict agree within the spread."""
    passes = [(0.040, [0.010, 0.020, 0.030, 0.040]), (0.050, [0.011, 0.024, 0.037, 0.050]),
              (0.044, [0.011, 0.022, 0.033, 0.044])]
    row = summarise_passes(passes, tokens=8, synced=[])
    assert row["tokens_per_s"] == 8 / 0.044 and row["tokens_per_s_min"] == 8 / 0.050 and row["tokens_per_s_max"] == 8 / 0.040
    assert row["spread"] == (8 / 0.040 - 8 / 0.050) / (8 / 0.044)
    predicted = 8 / ((row["ttft_ms"] + 3 * row["decode_ms_p50"]) / 1e3)
    assert row["tokens_per_s_min"] <= predicted <= row["tokens_per_s_max"]


def test_rounds_interleave_every_row_and_rotate_the_start():
    assert list(rounds(["a", "b", "c"], 3)) == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_a_speedup_pairs_each_pass_with_the_baselines_pass_of_its_round():
    """A slow spell of the machine in the third round halves both passes there; the ratio is the median
    of the rounds' ratios (3, 2, 3), where a ratio of medians would read 200 / 100."""
    eager = Row("torch", "fp32", 8, "ok", tokens_per_s=100.0, spread=0.5, pass_tokens_per_s=[100.0, 100.0, 50.0])
    fused = Row("ort-fused", "fp32", 8, "ok", tokens_per_s=200.0, spread=0.75, pass_tokens_per_s=[300.0, 200.0, 150.0])
    add_speedups([eager, fused], torch.device("cpu"))
    assert (eager.speedup_vs_eager, fused.speedup_vs_eager, fused.baseline) == (1.0, 3.0, "torch fp32")


def test_sample_adds_a_sampled_row_beside_each_greedy_one(exported_run, tmp_path):
    """--sample: every (backend, precision, batch) gets a greedy and a sampled row, each timed in the same
    interleaved rounds; a sampled row's speed-up is over eager sampling, and vs_greedy over its twin."""
    cfg, run, _ = exported_run
    run = copy_run(run, tmp_path / "run")
    result = runner.invoke(app, _args(run, "--backend", "torch", "--backend", "torch-compiled", "--precision", "fp32",
                                      "--sample", "--temperature", "0.7", "--top-p", "0.9",
                                      "--set", f"data.source={cfg.data.source}"))
    assert result.exit_code == 0, result.output
    bench = json.loads((run.reports / "bench.json").read_text())
    rows = [r for r in bench["rows"] if r["status"] == "ok"]
    assert sorted((r["backend"], r["batch"], r["decoding"]) for r in rows) == sorted(
        (b, n, d) for b in ("torch", "torch-compiled") for n in (1, 2) for d in ("greedy", "sampled"))
    for r in rows:
        assert (r["vs_greedy"] is not None) == (r["decoding"] == "sampled")
        assert r["speedup_vs_eager"] > 0 and r["tokens_per_s"] > 0
    assert bench["settings"]["sample"]["temperature"] == 0.7 and bench["settings"]["sample"]["do_sample"]
    table = (run.reports / "bench.md").read_text()
    assert "greedy and sampled (temperature 0.7, top_p 0.9" in table and "| torch-compiled | fp32 | 2 | sampled |" in table
    bad = runner.invoke(app, _args(run, "--sample", "--top-p", "1.5"))
    assert bad.exit_code == 1 and "--top-p 1.5: must be in (0, 1]" in bad.output


def test_a_batch_past_the_runtimes_bound_is_skipped_saying_so(exported_run, tmp_path):
    """onnxruntime-genai takes at most 32 rows a generator: its row at batch 33 is skipped with that
    reason (it was an error row carrying the runtime's message), its row at batch 1 runs."""
    pytest.importorskip("onnxruntime_genai", reason="the onnxruntime-genai test needs the [dev] extra")
    cfg, run, _ = exported_run
    run = copy_run(run, tmp_path / "run")
    args = _args(run, "--backend", "ort-genai", "--precision", "fp32", "--set", f"data.source={cfg.data.source}")
    args[args.index("--batch") + 1] = "1,33"
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = {r["batch"]: r for r in json.loads((run.reports / "bench.json").read_text())["rows"]}
    assert rows[1]["status"] == "ok" and rows[1]["tokens_per_s"] > 0
    assert rows[33]["status"] == "skipped" and rows[33]["reason"] == "ort-genai runs at most 32 rows at once"


def test_deterministic_rows_are_row_local_and_a_backend_without_them_says_why(exported_run, tmp_path):
    cfg, run, _ = exported_run
    run = copy_run(run, tmp_path / "run")
    result = runner.invoke(app, _args(run, "--backend", "torch-compiled", "--backend", "ort", "--precision", "fp32",
                                      "--deterministic", "--set", f"data.source={cfg.data.source}"))
    assert result.exit_code == 0, result.output
    rows = json.loads((run.reports / "bench.json").read_text())["rows"]
    assert {r["batch"] for r in rows if r["backend"] == "torch-compiled" and r["status"] == "ok"} == {1, 2}
    refused = [r for r in rows if r["backend"] == "ort"]
    assert refused and all(r["status"] == "skipped" and "--deterministic" in r["reason"] for r in refused)
    assert "every row row-local (--deterministic)" in (run.reports / "bench.md").read_text()


def test_memory_in_use_is_what_is_held_now_not_the_runs_peak():
    """A backend's held memory is the difference of two readings: one must fall when memory is freed."""
    before = device_memory_mib(torch.device("cpu"))
    block = torch.ones(64 * 2**20, dtype=torch.int32)  # 256 MiB, touched
    held = device_memory_mib(torch.device("cpu")) - before
    del block
    assert 240 < held < 300
    assert device_memory_mib(torch.device("cpu")) - before < 40
