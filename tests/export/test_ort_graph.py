"""The ort target: graphs written op by op in ONNX Runtime's fused operators, one folder per
precision that onnxruntime-genai loads as it is, checked against PyTorch like the portable ones."""

import copy
import json

import onnx
import pytest
import torch

from pipeline.contract import ORT, Contract, check_graph
from pipeline.errors import UserError
from pipeline.export.genai_config import CONFIG_FILE, TOKENIZER_FILES
from pipeline.export.ort_graph import ORT_GRAPHS
from pipeline.export.stage import export
from pipeline.model import load_checkpoint
from pipeline.runtime.dynamic.torch_eager import TorchEagerBackend
from pipeline.runtime.generate import Generator
from pipeline.runtime.loader import open_backend
from pipeline.runtime.sampling import Sampling
from tests.conftest import copy_run

CPU = torch.device("cpu")
PROMPT = [464, 2068, 7586, 21831, 18045, 625, 262, 16931]


def ops(graph: onnx.ModelProto) -> dict[str, int]:
    found: dict[str, int] = {}
    for node in graph.graph.node:
        found[node.op_type] = found.get(node.op_type, 0) + 1
    return found


def test_every_precision_is_a_fused_graph_in_a_genai_folder(exported_run):
    cfg, run, report = exported_run
    config = load_checkpoint(run.checkpoint).config
    manifest = json.loads(run.manifest_path.read_text())
    for precision, spec in ORT_GRAPHS.items():
        folder = run.onnx(precision, ORT)
        assert sorted(p.name for p in folder.iterdir()) == sorted(["model.onnx", CONFIG_FILE, *TOKENIZER_FILES])
        graph = onnx.load(folder / "model.onnx")
        dtype = check_graph(graph, Contract.from_hf_config(config, ORT), precision)
        assert dtype == ("float16" if spec.activations.__name__ == "float16" else "float32"), precision
        found = ops(graph)
        assert found["GroupQueryAttention"] == config.n_layer
        assert found["SkipLayerNormalization"] == 2 * config.n_layer + 1  # embeddings, then two per block
        assert found["FastGelu"] == config.n_layer
        # qkv, attention out, MLP up and down per block, and the LM head
        projections = 4 * config.n_layer + 1
        if spec.int8_op:
            assert found[spec.int8_op] == projections and "MatMul" not in found, precision
        else:
            assert found["MatMul"] == projections, precision
        assert f"onnx-ort/{precision}/model.onnx" in manifest["artifacts"]
        assert report[f"ort/{precision}"]["graph"] == spec.summary
        parity = report[f"ort/{precision}"]["parity_ort_cpu"]
        assert parity["rel_error"] <= cfg.validate.budgets[precision].max_rel_error, precision
    assert report["ort/fp32"]["parity_ort_cpu"]["rel_error"] < 1e-5
    assert report["ort/fp32"]["parity_ort_cpu"]["identical_tokens"] == 1.0
    genai = json.loads((run.onnx("fp32", ORT) / CONFIG_FILE).read_text())
    assert genai["model"]["decoder"]["num_hidden_layers"] == config.n_layer
    assert genai["search"]["past_present_share_buffer"] is True


def test_onnxruntime_genai_generates_our_greedy_tokens_from_the_folder_as_is(exported_run):
    og = pytest.importorskip("onnxruntime_genai", reason="the onnxruntime-genai test needs the [dev] extra")
    _, run, _ = exported_run
    new_tokens = 24
    ours = Generator(open_backend(run, "ort-fused", "fp32", CPU)).generate([PROMPT], Sampling(max_new_tokens=new_tokens))
    assert ours == Generator(TorchEagerBackend(load_checkpoint(run.checkpoint))).generate(
        [PROMPT], Sampling(max_new_tokens=new_tokens))
    for precision in ("fp32", "int8"):
        model = og.Model(str(run.onnx(precision, ORT)))
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(PROMPT) + new_tokens, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens([PROMPT])
        while not generator.is_done():
            generator.generate_next_token()
        genai = [int(t) for t in generator.get_sequence(0)][len(PROMPT):]
        ort_fused = Generator(open_backend(run, "ort-fused", precision, CPU)).generate(
            [PROMPT], Sampling(max_new_tokens=new_tokens))
        assert [genai] == ort_fused, precision
    # and through the bench's backend over it: a batch of two rows, onnxruntime-genai's own greedy loop
    rows = [PROMPT, PROMPT[::-1]]
    via_backend = Generator(open_backend(run, "ort-genai", "fp32", CPU)).generate(rows, Sampling(max_new_tokens=8))
    assert via_backend == Generator(open_backend(run, "ort-fused", "fp32", CPU)).generate(rows, Sampling(max_new_tokens=8))


def test_a_graph_past_the_protobuf_limit_keeps_its_weights_beside_it_checked_and_loaded(exported_run, tmp_path,
                                                                                        monkeypatch):
    """gpt2-xl's fp16 graph is 3.1 GB: over protobuf's 2 GB its weights go to model.onnx.data. The
    limit lowered to 1 KB sends this micro model down the same path: written, checked for parity,
    hashed (the .data file too), loaded, and a changed .data file refused."""
    cfg, run, _ = exported_run
    run = copy_run(run, tmp_path / "run")
    monkeypatch.setattr("pipeline.export.graph_file.ONNX_PROTOBUF_LIMIT", 1024)
    cfg = copy.deepcopy(cfg)
    cfg.export.targets = [ORT]
    export(cfg, run, ["fp16"], force=True)
    folder = run.onnx("fp16", ORT)
    data = folder / "model.onnx.data"
    assert data.stat().st_size > (folder / "model.onnx").stat().st_size
    assert "onnx-ort/fp16/model.onnx.data" in json.loads(run.manifest_path.read_text())["artifacts"]
    eager = Generator(TorchEagerBackend(load_checkpoint(run.checkpoint))).generate([PROMPT], Sampling(max_new_tokens=8))
    assert Generator(open_backend(run, "ort-fused", "fp16", CPU)).generate([PROMPT], Sampling(max_new_tokens=8)) == eager
    with data.open("r+b") as f:
        f.seek(100)
        f.write(b"\x01\x02")
    with pytest.raises(UserError, match=r"model\.onnx\.data: not the fp16 graph export wrote"):
        open_backend(run, "ort-fused", "fp16", CPU)
