"""The backend registry and open_backend: one table that the CLI, config and the matrices read, and
one-line refusals for pairs that cannot run here."""

import pytest
import torch

from pipeline.artifacts import RunDir
from pipeline.cli import BACKEND_NAMES
from pipeline.errors import UserError
from pipeline.precisions import PRECISIONS
from pipeline.runtime.backend import BackendUnavailable
from pipeline.runtime.loader import BACKENDS, bench_matrix, default_matrix, fastest_ready, open_backend

CPU = torch.device("cpu")


def test_the_registry_names_known_precisions_and_the_cli_lists_every_backend():
    assert all(set(spec.precisions) <= set(PRECISIONS) for spec in BACKENDS.values())
    assert all(set(spec.matrix or ()) <= set(spec.precisions) for spec in BACKENDS.values())
    assert BACKEND_NAMES.split(", ") == list(BACKENDS)


def test_the_matrices_come_from_the_registry():
    assert default_matrix() == [("torch", "fp16"), ("torch-compiled", "fp32"), ("torch-compiled", "fp16"),
                                ("triton", "fp16"), ("triton", "int8-wo"), *[("ort", p) for p in PRECISIONS],
                                *[("ort-fused", p) for p in PRECISIONS], *[("trt", p) for p in PRECISIONS]]
    # onnxruntime-genai is benched, not validated: it returns the last position's logits only
    assert bench_matrix() == [("torch", "fp32"), *default_matrix()[:-4], ("ort-genai", "fp32"), ("ort-genai", "int8"),
                              *default_matrix()[-4:]]


@pytest.mark.parametrize("name, precision, device, message", [
    ("nope", "fp32", CPU, "unknown backend/precision nope/fp32"),
    ("torch", "int8", CPU, "torch runs fp32/fp16; int8 runs on ort, ort-fused, ort-genai, trt"),
    ("triton", "fp16", CPU, "triton runs on a CUDA GPU .* this run is on the CPU"),
    ("trt", "fp16", CPU, "trt runs on a CUDA GPU"),
    ("torch-compiled", "fp16", CPU, "fp16 PyTorch runs on a GPU only"),
    ("ort-genai", "fp32", torch.device("cuda"),
     "ort-genai runs on the CPU only \\(onnxruntime-genai's CPU package.*this run is on the CUDA"),
])
def test_pairs_that_cannot_run_here_say_why(tmp_path, name, precision, device, message):
    with pytest.raises(BackendUnavailable, match=message):
        open_backend(RunDir(tmp_path / "run"), name, precision, device)


def test_a_missing_graph_names_the_stage_that_makes_it(exported_run, tmp_path):
    from tests.conftest import copy_run

    _, run, _ = exported_run
    run = copy_run(run, tmp_path / "run")
    (run.onnx("int8") / "model.onnx").unlink()
    with pytest.raises(BackendUnavailable, match=r"no onnx/int8 graph .*gpt2-deploy export"):
        open_backend(run, "ort", "int8", CPU)
    (run.onnx("int8", "ort") / "model.onnx").unlink()
    with pytest.raises(BackendUnavailable, match=r"no onnx-ort/int8 graph .*gpt2-deploy export --target ort"):
        open_backend(run, "ort-fused", "int8", CPU)


def test_the_fastest_backend_is_the_first_of_the_table_whose_artifact_the_run_has(exported_run, tmp_path, monkeypatch):
    from tests.conftest import copy_run

    _, run, _ = exported_run
    run = copy_run(run, tmp_path / "run")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert fastest_ready(run, CPU) == ("ort-fused", "int8")
    assert fastest_ready(run, CPU, "fp32") == ("ort-fused", "fp32")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")  # int8 kernels unmeasured
    assert fastest_ready(run, CPU) == ("ort-fused", "fp32")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    for graph, then in [(run.onnx("int8", "ort"), ("ort-fused", "fp32")), (run.onnx("fp32", "ort"), ("ort", "fp32")),
                        (run.onnx("fp32"), ("torch", "fp32"))]:
        (graph / "model.onnx").unlink()
        assert fastest_ready(run, CPU) == then
    with pytest.raises(UserError, match="nothing in .* runs int8 on the CPU: run `gpt2-deploy finetune`"):
        fastest_ready(run, CPU, "int8")


def test_the_fastest_backend_refuses_a_graph_export_did_not_write(exported_run, tmp_path, monkeypatch):
    import onnx

    from tests.conftest import copy_run

    _, run, _ = exported_run
    run = copy_run(run, tmp_path / "run")
    path = run.onnx("int8", "ort") / "model.onnx"
    graph = onnx.load(path)
    graph.doc_string = "edited by hand"
    onnx.save(graph, path)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    with pytest.raises(UserError, match="not the int8 graph export wrote"):  # not a quiet fall back to fp32
        fastest_ready(run, CPU)
