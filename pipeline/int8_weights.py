"""int8-wo's weights, one set for every engine of that precision: the export writes them into the
portable int8-wo graph, and the triton backend reads its decode weights back out of that graph, so
`validate` compares the engines on the same integers and scales.

Each linear layer's weight carries the layer norm before it (fold_layer_norm: the form the triton
kernels read) and is quantised per output channel, symmetric, no zero point (quantize_rows). The LM
head is the tied embedding with ln_f folded in, so it is a weight of its own and quantised too; the
embedding lookup keeps the float table. docs/journal/performance.md, "One set of int8-wo weights"."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import torch

from pipeline.errors import UserError

# the narrow weight types the products read with a scale per output, and each one's largest value
NARROW_WEIGHTS = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}
# what the graph calls a quantised weight's integers and scales: <the float weight's name><suffix>
INT8_SUFFIX, SCALE_SUFFIX = "_int8", "_scale"
# each layer's decode weights by the Hugging Face parameter whose folded, quantised copy each is (the
# graph's names are these with a prefix); the LM head's is the weight with a vocabulary of outputs,
# since the exporter stores it transposed under a name of its own
LAYER_WEIGHTS = {"qkv": r"transformer\.h\.(\d+)\.attn\.c_attn\.weight", "proj": r"transformer\.h\.(\d+)\.attn\.c_proj\.weight",
                 "fc": r"transformer\.h\.(\d+)\.mlp\.c_fc\.weight", "fc2": r"transformer\.h\.(\d+)\.mlp\.c_proj\.weight"}


def quantize_rows(w: torch.Tensor, dtype: torch.dtype = torch.int8, top: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., N, K] -> (dtype [..., N, K], fp32 scale [..., N]): each output row symmetric, its absolute
    maximum at `top` (the type's largest value unless given); int8 rounds half to even, fp8 (e4m3) to
    the nearest of its values. An all-zero row keeps scale 1."""
    top = NARROW_WEIGHTS[dtype] if top is None else top
    absmax = w.float().abs().amax(-1)
    scale = torch.where(absmax > 0, absmax / top, torch.ones_like(absmax))
    scaled = w.float() / scale[..., None]
    if dtype == torch.int8:
        scaled = torch.round(scaled)
    return torch.clamp(scaled, -top, top).to(dtype), scale


def fold_layer_norm(w: torch.Tensor, b: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor):
    """The layer norm's affine part folded into the linear layer after it (w [..., N, K], b [..., N],
    gamma and beta [..., K]): (n * gamma + beta) @ w^T + b == n @ (w * gamma)^T + (w @ beta + b)."""
    return w * gamma[..., None, :], b + (w @ beta[..., :, None])[..., 0]


def folded_model(model):
    """A float32 copy of the Hugging Face GPT-2 LM `model`, the same function, with every layer norm's
    weight and bias folded into the product after it (the norms left as the identity affine) and an LM
    head of its own, with a bias, that carries ln_f: the model whose weights int8-wo quantises."""
    folded = copy.deepcopy(model).float().eval()
    t, c = folded.transformer, folded.config
    with torch.no_grad():
        for norm, linear in [(b.ln_1, b.attn.c_attn) for b in t.h] + [(b.ln_2, b.mlp.c_fc) for b in t.h]:
            w, bias = fold_layer_norm(linear.weight.t(), linear.bias, norm.weight, norm.bias)  # Conv1D: [in, out]
            linear.weight.copy_(w.t())
            linear.bias.copy_(bias)
            norm.weight.fill_(1.0)
            norm.bias.zero_()
        head = torch.nn.Linear(c.n_embd, c.vocab_size, bias=True)
        head.weight.data, head.bias.data = fold_layer_norm(t.wte.weight, torch.zeros(c.vocab_size), t.ln_f.weight, t.ln_f.bias)
        t.ln_f.weight.fill_(1.0)
        t.ln_f.bias.zero_()
    folded.config.tie_word_embeddings = False
    folded.lm_head = head
    return folded


def read_graph_weights(path: Path, config) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The decode weights of the int8-wo graph at `path` for a model of this GPT-2 config: each layer
    weight of LAYER_WEIGHTS (int8 [L, N, K], fp32 scale [L, N]) and "head" (int8 [V, K], scale [V]).
    Read from the graph's DequantizeLinear nodes, whose axis says which axis of a stored weight is
    its output."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper
    graph = onnx.load(str(path)).graph
    initializers = {i.name: i for i in graph.initializer}
    layers: dict[str, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {name: {} for name in LAYER_WEIGHTS}
    heads = []
    for node in graph.node:
        integers = node.input[0] if node.op_type == "DequantizeLinear" else ""
        if not integers.endswith(INT8_SUFFIX) or integers not in initializers:
            continue
        axis = helper.get_attribute_value(next(a for a in node.attribute if a.name == "axis"))
        stored = numpy_helper.to_array(initializers[integers])
        q = torch.from_numpy(np.array(stored.T if axis == 1 else stored, order="C"))  # [out, in], one copy
        scales = numpy_helper.to_array(initializers[integers[:-len(INT8_SUFFIX)] + SCALE_SUFFIX])
        scale = torch.from_numpy(np.array(scales, dtype=np.float32))
        for name, pattern in LAYER_WEIGHTS.items():
            match = re.fullmatch(rf"(?:.+\.)?{pattern}{INT8_SUFFIX}", integers)
            if match:
                layers[name][int(match.group(1))] = (q, scale)
                break
        else:
            if q.shape == (config.vocab_size, config.n_embd):
                heads.append((q, scale))
    if len(heads) != 1 or any(sorted(found) != list(range(config.n_layer)) for found in layers.values()):
        raise UserError(f"{path}: not the int8-wo graph of this {config.n_layer}-layer model with its layer norms folded "
                        "(an older export?); rerun `gpt2-deploy export --precision int8-wo --force`")
    weights = {name: tuple(torch.stack(t) for t in zip(*(found[i] for i in range(config.n_layer))))
               for name, found in layers.items()}
    weights["head"] = heads[0]
    return weights
