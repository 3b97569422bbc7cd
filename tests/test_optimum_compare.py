"""The Optimum comparison's table: medians, and ratios paired by round against eager PyTorch and
against the faster of Optimum's rows in each round."""

import pytest

from pipeline.optimum_compare import main, rows

PASSES = {"torch fp32": {"1": [10.0, 20.0, 10.0]},
          "ort-fused int8": {"1": [40.0, 60.0, 30.0]},
          "optimum fp32": {"1": [20.0, 10.0, 10.0]},
          "optimum int8": {"1": [10.0, 30.0, 15.0]}}


def test_ratios_pair_each_round_and_take_optimums_faster_row_of_that_round():
    table = {r["row"]: r for r in rows(PASSES, ["torch fp32", "ort-fused int8"], ["optimum fp32", "optimum int8"], [1])}
    ours = table["ort-fused int8"]
    assert ours["tokens_per_s"]["1"] == 40.0
    assert ours["x_eager"]["1"] == 3.0  # rounds: 4, 3, 3
    assert ours["x_optimum_best"]["1"] == 2.0  # against 20, 30, 15: 2, 2, 2
    assert table["torch fp32"]["x_eager"]["1"] == 1.0 and list(table) == list(PASSES)


def test_a_missing_optimum_python_is_one_line(capsys, tmp_path):
    with pytest.raises(SystemExit) as stop:
        main(["--run", "r", "--artifacts", str(tmp_path), "--optimum-python", str(tmp_path / "none")])
    assert stop.value.code == 2 and "no such file; make optimum-env makes one" in capsys.readouterr().err
