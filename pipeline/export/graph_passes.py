"""Small ONNX rewrites the exporters need: storing identical weights once, and the int8
weight-only transform (int8 weights per output channel behind DequantizeLinear, activations
left in float: what a memory-bound decode and TensorRT-RTX's weight-only kernels want)."""

from __future__ import annotations

import hashlib
from collections import defaultdict

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from pipeline.int8_weights import INT8_SUFFIX, SCALE_SUFFIX, quantize_rows

MIN_DEDUPE_BYTES = 1024  # small constants are not worth hashing


def dedupe_initializers(model: onnx.ModelProto) -> int:
    """Point every consumer of byte-identical initializers at one copy; return copies removed.
    (AutoCast, for one, gives each consumer of a tied weight its own cast copy.)"""
    keep: dict[tuple, str] = {}
    rename: dict[str, str] = {}
    for init in model.graph.initializer:
        array = numpy_helper.to_array(init)
        if array.nbytes < MIN_DEDUPE_BYTES:
            continue
        key = (init.data_type, tuple(init.dims), hashlib.sha256(array.tobytes()).hexdigest())
        if key in keep:
            rename[init.name] = keep[key]
        else:
            keep[key] = init.name
    if not rename:
        return 0
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name in rename:
                node.input[i] = rename[name]
    kept = [init for init in model.graph.initializer if init.name not in rename]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return len(rename)


def _weight_axis(node: onnx.NodeProto) -> int | None:
    """The output-channel axis of the node's second input, or None if it is not a plain weight."""
    if node.op_type == "MatMul":
        return 1  # [K, N]
    if node.op_type == "Gemm":
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("transA", 0):
            return None
        return 0 if attrs.get("transB", 0) else 1
    return None


def symmetric_int8(w: np.ndarray, axis: int, top: int = 127) -> tuple[np.ndarray, np.ndarray]:
    """A 2-D fp32 weight -> (int8 weight, fp32 scale per output channel along `axis`): int8_weights'
    quantize_rows, the rule every int8 weight of the project follows, on an ONNX weight's layout."""
    rows = torch.from_numpy(np.array(w.T if axis == 1 else w))  # [out, in], a copy: ONNX's arrays are read-only
    q, scale = quantize_rows(rows, top=top)
    return (q.T if axis == 1 else q).contiguous().numpy(), scale.numpy()


def quantize_weights_int8(model: onnx.ModelProto) -> int:
    """Rewrite fp32 2-D weights of MatMul/Gemm into int8 + per-channel symmetric scales behind a
    DequantizeLinear, named <weight>_int8 and <weight>_scale (int8_weights reads them back by those
    names). Weights shared with other consumers (a tied embedding) stay as they are, so nothing is
    stored twice. Returns the number of weights quantised."""
    inits = {i.name: i for i in model.graph.initializer}
    consumers: dict[str, int] = defaultdict(int)
    for node in model.graph.node:
        for name in node.input:
            consumers[name] += 1
    new_nodes, count = [], 0
    for node in model.graph.node:
        axis = _weight_axis(node)
        name = node.input[1] if len(node.input) > 1 else ""
        init = inits.get(name)
        if axis is None or init is None or consumers[name] != 1 or len(init.dims) != 2 or \
                init.data_type != onnx.TensorProto.FLOAT:
            new_nodes.append(node)
            continue
        q, scale = symmetric_int8(numpy_helper.to_array(init), axis)
        integers, scales, zero = f"{name}{INT8_SUFFIX}", f"{name}{SCALE_SUFFIX}", f"{name}_zero_point"
        model.graph.initializer.remove(init)
        model.graph.initializer.extend([numpy_helper.from_array(q, integers), numpy_helper.from_array(scale, scales),
                                        numpy_helper.from_array(np.zeros_like(q, shape=scale.shape), zero)])
        new_nodes.append(helper.make_node("DequantizeLinear", [integers, scales, zero],
                                          [f"{name}_dequantized"], name=f"{name}_DequantizeLinear", axis=axis))
        node.input[1] = f"{name}_dequantized"
        new_nodes.append(node)
        count += 1
    del model.graph.node[:]
    model.graph.node.extend(new_nodes)
    return count
