"""PyTorch -> fp32 ONNX with a KV cache, through torch.onnx's dynamo exporter.

The model sees its cache as a transformers `DynamicCache` built from flat past tensors, so the
graph's inputs and outputs are plain tensors named by the contract."""

from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path

import torch
from transformers import DynamicCache, GPT2LMHeadModel

from pipeline.contract import BATCH, PAST, SEQ, TOTAL, Contract
from pipeline.export.graph_file import needs_external_data
from pipeline.model import cache_keyword


class WithKVCache(torch.nn.Module):
    """input_ids, attention_mask, position_ids, flat past k/v ([B, H, past, D] x 2L) ->
    logits [B, S, V] and flat present k/v ([B, H, past + S, D] x 2L)."""

    def __init__(self, model: GPT2LMHeadModel):
        super().__init__()
        self.model, self.n_layer, self.cache_kw = model, model.config.n_layer, cache_keyword(model)

    def forward(self, input_ids, attention_mask, position_ids, *past):
        cache = DynamicCache([(past[2 * i], past[2 * i + 1]) for i in range(self.n_layer)], config=self.model.config)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, **{self.cache_kw: cache})
        present = getattr(out, self.cache_kw)
        return (out.logits, *[t for layer in present.layers for t in (layer.keys, layer.values)])


def example_inputs(contract: Contract, batch: int = 2, seq: int = 3, past: int = 4) -> tuple[torch.Tensor, ...]:
    """Trace-time inputs. Sizes >= 2: torch.export specialises dims of size 0 and 1 (the graph
    still serves past = 0 and seq = 1)."""
    ids = torch.randint(0, contract.vocab_size, (batch, seq))
    mask = torch.ones(batch, past + seq, dtype=torch.long)
    positions = torch.arange(past, past + seq).expand(batch, seq)
    kv = [torch.randn(batch, contract.n_head, past, contract.head_dim) for _ in range(2 * contract.n_layer)]
    return (ids, mask, positions, *kv)


@contextlib.contextmanager
def quiet_exporter():
    """Silence what the exporter says on every export and asks nothing of the user: a warning per
    torchvision operator it cannot register (this project exports no vision model), its note that
    axes sharing one constraint take one name (batch/seq/past keep theirs in the graph: the
    contract checks them), and a deprecation inside torch.export."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="# The axis name: .* will not be used", category=UserWarning)
            warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\)", category=FutureWarning)
            yield
    finally:
        registration.setLevel(level)


def export_fp32(model: GPT2LMHeadModel, path: Path, opset: int) -> None:
    """Write `path` (and `path`.data when the weights exceed the protobuf limit)."""
    contract = Contract.from_hf_config(model.config)
    Dim = torch.export.Dim
    batch, seq, past = Dim(BATCH, min=1), Dim(SEQ, min=1), Dim(PAST, min=0)
    total = Dim(TOTAL, min=1)  # = past + seq; Dim arithmetic is refused, so it gets its own symbol
    shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: total},
              "position_ids": {0: batch, 1: seq}, "past": tuple({0: batch, 2: past} for _ in range(2 * contract.n_layer))}
    model = model.float().eval()
    with torch.no_grad(), quiet_exporter():
        program = torch.onnx.export(WithKVCache(model).eval(), example_inputs(contract), dynamo=True, dynamic_shapes=shapes,
                                    opset_version=opset, input_names=contract.input_names,
                                    output_names=contract.output_names, optimize=True)
    program.save(str(path), external_data=needs_external_data(sum(p.numel() * p.element_size() for p in model.parameters())))
