"""The ONNX Runtime backend binds the graph's tensors by the contract's names, and refuses a graph
that lacks one, naming it, before anything runs."""

import onnx
import pytest
import torch

from pipeline.contract import Contract
from pipeline.model import load_checkpoint
from pipeline.runtime.backend import BackendUnavailable
from pipeline.runtime.dynamic.ort_backend import OrtBackend, open_session
from pipeline.runtime.dynamic.ort_fused import CUDA_SESSION_CONFIG

CPU = torch.device("cpu")


def test_names_come_from_the_contract(exported_run):
    _, run, _ = exported_run
    contract = Contract.from_hf_config(load_checkpoint(run.checkpoint).config)
    backend = OrtBackend(run.onnx("fp16") / "model.onnx", contract, "fp16", CPU)
    backend.reset(2, 8)
    inputs, outputs = backend.kv.io(*(torch.ones(2, 3, dtype=torch.long),) * 3)
    assert [n for n, _ in inputs] == contract.input_names
    assert sorted(n for n, _ in outputs) == sorted(contract.output_names)
    assert backend.kv.dtype == torch.float16 and backend.kv.logits_dtype in (torch.float16, torch.float32)


def test_a_graph_without_a_contract_name_is_refused_by_name(exported_run, tmp_path):
    _, run, _ = exported_run
    graph = onnx.load(run.onnx("fp32") / "model.onnx")
    renamed = "positions"
    for node in graph.graph.node:
        node.input[:] = [renamed if i == "position_ids" else i for i in node.input]
    next(i for i in graph.graph.input if i.name == "position_ids").name = renamed
    path = tmp_path / "model.onnx"
    onnx.save(graph, path)
    contract = Contract.from_hf_config(load_checkpoint(run.checkpoint).config)
    with pytest.raises(BackendUnavailable, match=r"not a graph of this pipeline's contract \(no position_ids\)"):
        OrtBackend(path, contract, "fp32", CPU)


def test_session_config_entries_reach_the_session(exported_run):
    _, run, _ = exported_run
    contract = Contract.from_hf_config(load_checkpoint(run.checkpoint).config)
    session = open_session(run.onnx("fp32") / "model.onnx", contract, "fp32", CPU, fuse_qdq=True,
                           session_config=CUDA_SESSION_CONFIG)
    options = session.get_session_options()
    assert CUDA_SESSION_CONFIG and all(options.get_session_config_entry(key) == value
                                       for key, value in CUDA_SESSION_CONFIG.items())
