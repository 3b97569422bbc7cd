"""The int8-wo graph export writes: the fine-tuned model's weights with its layer norms folded,
quantised per output by int8_weights' rule, the LM head's too; read back whole by the reader the
triton backend uses, and a graph of another layout refused in one line."""

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from pipeline.errors import UserError
from pipeline.export.graph_passes import quantize_weights_int8
from pipeline.int8_weights import folded_model, quantize_rows, read_graph_weights
from pipeline.model import load_checkpoint


def test_the_graph_holds_the_folded_models_weights_quantised_and_reads_back_bit_for_bit(exported_run):
    _, run, _ = exported_run
    model = load_checkpoint(run.checkpoint)
    path = run.onnx("int8-wo") / "model.onnx"
    graph = onnx.load(str(path))
    initializers = {i.name: numpy_helper.to_array(i) for i in graph.graph.initializer}
    norms = [n for n in graph.graph.node if n.op_type == "LayerNormalization"]
    assert norms and all(np.all(initializers[n.input[1]] == 1) and np.all(initializers[n.input[2]] == 0) for n in norms)

    weights = read_graph_weights(path, model.config)
    folded = folded_model(model)
    expected = {"qkv": lambda b: b.attn.c_attn, "proj": lambda b: b.attn.c_proj, "fc": lambda b: b.mlp.c_fc,
                "fc2": lambda b: b.mlp.c_proj}
    for name, layer_of in expected.items():
        q, scale = quantize_rows(torch.stack([layer_of(b).weight.t() for b in folded.transformer.h]))  # Conv1D: [in, out]
        assert torch.equal(weights[name][0], q) and torch.equal(weights[name][1], scale), name
    q, scale = quantize_rows(folded.lm_head.weight)
    assert torch.equal(weights["head"][0], q) and torch.equal(weights["head"][1], scale)


def test_a_graph_quantised_without_the_fold_is_refused_in_one_line(exported_run, tmp_path):
    """The portable int8-wo graph before its layer norms were folded: its tied LM head stayed float."""
    _, run, _ = exported_run
    graph = onnx.load(str(run.onnx("fp32") / "model.onnx"))
    quantize_weights_int8(graph)
    path = tmp_path / "model.onnx"
    onnx.save(graph, str(path))
    with pytest.raises(UserError, match=r"model.onnx: not the int8-wo graph of this 1-layer model .* rerun `gpt2-deploy export"):
        read_graph_weights(path, load_checkpoint(run.checkpoint).config)
