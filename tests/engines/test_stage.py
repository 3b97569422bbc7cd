"""build-engine with TensorRT-RTX, which builds on a machine without a GPU (the engines fixture)."""

import json

import onnx
import pytest
import torch
from onnx import helper

from pipeline.engines.metadata import EngineMeta
from pipeline.engines.stage import build_engines
from pipeline.errors import UserError
from tests.conftest import ENGINE_PRECISIONS as PRECISIONS
from tests.conftest import copy_run

trt = pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX is not installed (pip install 'gpt2-deploy[trt-rtx]')")


def test_every_precision_builds_with_complete_metadata(engines):
    _, run, metas = engines
    assert [m.precision for m in metas] == PRECISIONS
    for m in metas:
        plan = run.engines / f"tensorrt_rtx-{m.precision}-sm86.plan"
        assert plan.stat().st_size == m.plan_bytes > 0
        meta = EngineMeta.read(plan.with_suffix(".json"))
        assert meta.flavour == "tensorrt_rtx" and meta.trt_version == trt.__version__ and meta.targets == ["sm86"]
        assert meta.profile["past_key_values.0.key"][0][2] == 0  # prefill: empty past is in the profile
        assert meta.profile["input_ids"][2] == [4, 32] and meta.build_seconds > 0 and len(meta.onnx_sha256) == 64
        assert "unused" in meta.timing_cache
    manifest = json.loads(run.manifest_path.read_text())
    assert "engines/tensorrt_rtx-int8-sm86.plan" in manifest["artifacts"]


def test_unchanged_onnx_is_a_no_op(engines):
    cfg, run, _ = engines
    plan = run.engines / "tensorrt_rtx-fp16-sm86.plan"
    stamp = plan.stat().st_mtime_ns
    build_engines(cfg, run, ["fp16"], "tensorrt_rtx", ["sm86"])
    assert plan.stat().st_mtime_ns == stamp


def test_several_targets_in_one_plan(engines):
    cfg, run, _ = engines
    (meta,) = build_engines(cfg, run, ["int8-wo"], "tensorrt_rtx", ["sm89", "sm120"])
    assert meta.targets == ["sm89", "sm120"] and (run.engines / "tensorrt_rtx-int8-wo-sm89_sm120.plan").exists()


def test_bad_inputs_are_refused(engines, tmp_path):
    cfg, run, _ = engines
    with pytest.raises(UserError, match="--target sm70: this TensorRT-RTX knows"):
        build_engines(cfg, run, ["fp32"], "tensorrt_rtx", ["sm70"])
    truncated = copy_run(run, tmp_path / "truncated")
    path = truncated.onnx("fp16") / "model.onnx"
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(UserError, match=r"not the fp16 graph export wrote .*export --force"):
        build_engines(cfg, truncated, ["fp16"], "tensorrt_rtx", ["sm86"])
    foreign = copy_run(run, tmp_path / "foreign")
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    onnx.save(helper.make_model(graph), foreign.onnx("fp32") / "model.onnx")
    with pytest.raises(UserError, match=r"not the fp32 graph export wrote .*export --force"):
        build_engines(cfg, foreign, ["fp32"], "tensorrt_rtx", ["sm86"])
    swapped = copy_run(run, tmp_path / "swapped")  # another precision's graph in the fp32 slot
    swapped.onnx("fp32").joinpath("model.onnx").write_bytes(swapped.onnx("int8-wo").joinpath("model.onnx").read_bytes())
    with pytest.raises(UserError, match=r"not the fp32 graph export wrote"):
        build_engines(cfg, swapped, ["fp32"], "tensorrt_rtx", ["sm86"], force=True)
    blocked = copy_run(run, tmp_path / "blocked")
    import shutil
    shutil.rmtree(blocked.engines)
    blocked.engines.write_text("a file where the engines folder should be")
    with pytest.raises(UserError, match="cannot write here"):
        build_engines(cfg, blocked, ["fp32"], "tensorrt_rtx", ["sm86"], force=True)


def test_full_tensorrt_missing_is_one_line_with_the_install_hint(engines):
    cfg, run, _ = engines
    try:
        import tensorrt  # noqa: F401
        pytest.skip("full TensorRT is installed here")
    except ImportError:
        pass
    with pytest.raises(UserError, match="tensorrt is not installed .*NVIDIA's own package index"):
        build_engines(cfg, run, ["fp32"], "tensorrt")


def test_validate_refuses_an_engine_built_from_another_graph(engines, tmp_path):
    from pipeline.validate import validate

    cfg, run, _ = engines
    stale = copy_run(run, tmp_path / "stale")
    meta_path = stale.engines / "tensorrt_rtx-fp16-sm86.json"
    meta = json.loads(meta_path.read_text())
    meta["onnx_sha256"] = "0" * 64
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(UserError, match="built from another fp16 graph .*build-engine --force"):
        validate(cfg, stale, torch.device("cpu"), pairs=[("trt", "fp16")])


def test_plans_are_found_by_exact_precision(engines):
    from pipeline.engines.metadata import plans_for

    _, run, _ = engines
    assert [p.name for p in plans_for(run.engines, "int8")] == ["tensorrt_rtx-int8-sm86.plan"]
    assert "tensorrt_rtx-int8-wo-sm86.plan" in [p.name for p in plans_for(run.engines, "int8-wo")]


def test_the_builder_keeps_the_parsers_expected_int64_notes_to_itself(engines, tmp_path, capfd):
    cfg, run, _ = engines
    build_engines(cfg, copy_run(run, tmp_path / "again"), ["fp32"], "tensorrt_rtx", ["sm86"], force=True)
    said = "".join(capfd.readouterr())
    assert "Int64 binding" not in said and "engines/tensorrt_rtx-fp32-sm86.plan" in said
