"""GPT-2 weights -> the ONNX Runtime target graph (`export --target ort`): written op by op from the
weights, as onnxruntime-genai's model builder writes the models it knows, in ONNX Runtime's fused
operators (com.microsoft):

- SkipLayerNormalization: each residual add, its bias and the next layer norm in one kernel;
- GroupQueryAttention over the packed QKV projection, with as many KV heads as query heads: it
  reads and writes the KV cache in place when past and present are bound to one buffer of the
  cache's full length, takes each row's length from the attention mask (ReduceSum - 1), so rows
  fill their cache from slot 0 (right padding, as onnxruntime-genai feeds it);
- FastGelu with its bias: GPT-2's tanh GELU;
- MatMul for the projections and the LM head (a transposed copy of the tied embedding, so the head
  is a plain MatMul over a constant, which the int8 passes quantise too); int8-wo (the GPU's) makes
  them MatMulNBits (int8 weights in blocks of 32 with a scale each), int8 (the CPU's)
  DynamicQuantizeMatMul (int8 weights with a scale per output, activations quantised as it runs).

The inputs and outputs are the contract's (target "ort"), so the ORT backend and onnxruntime-genai
bind them by name. What each precision is, and why: ORT_GRAPHS."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pipeline.contract import LOGITS, LOGITS_TO_KEEP, ORT, Contract
from pipeline.export.graph_file import save_graph
from pipeline.export.graph_passes import symmetric_int8

MS = "com.microsoft"
IR_VERSION = 10  # ONNX Runtime 1.31 refused the graph at the onnx package's default (newest) IR version
GRAPH_VERSION = 2  # part of export's fingerprint: bump it when what build_ort_graph writes changes
NBITS_BLOCK = 32  # weights per int8 scale, along each output's input dimension


@dataclass(frozen=True)
class OrtGraph:
    """How the ort target writes one precision."""
    activations: type  # the float type of activations, KV cache and logits
    int8_op: str | None = None  # the operator every projection and the LM head become (INT8_MATMULS); None: MatMul
    summary: str = ""


# The CPU's int8 is ONNX Runtime's dynamic quantisation (as `quantize_dynamic` and Optimum's CPU
# configurations write it): MLAS's integer GEMM runs 1.7-2.1x the fp32 graph at 8 rows where
# MatMulNBits ran 0.8-1.4x, on AVX2 and on AVX-512 VNNI (docs/journal/performance.md, "The CPU's
# int8 on AVX2"). Its AVX2 kernel sums pairs of uint8 x int8 products in int16, which saturate at
# full-range weights, so the weights use 7 bits: one graph answers alike on every x86 processor.
DYNAMIC_INT8_TOP = 63
ORT_GRAPHS = {
    "fp32": OrtGraph(np.float32, summary="fp32, fused operators (the CPU's float graph)"),
    "fp16": OrtGraph(np.float16, summary="fp16, fused operators (the GPU's float graph)"),
    "int8": OrtGraph(np.float32, "DynamicQuantizeMatMul",
                     "DynamicQuantizeMatMul: 7-bit int8 weights per output, activations quantised to uint8 as it runs (CPU)"),
    "int8-wo": OrtGraph(np.float16, "MatMulNBits", "MatMulNBits int8 weights, fp16 activations (GPU)"),
}


def export_ort_graph(model, precision: str, path: Path, opset: int) -> None:
    """The Hugging Face GPT-2 LM `model` -> the ort target's graph of `precision` at path."""
    spec = ORT_GRAPHS[precision]
    state = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    graph = build_ort_graph(state, model.config, spec.activations, opset)
    if spec.int8_op:
        graph = INT8_MATMULS[spec.int8_op](graph)
    save_graph(graph, path)


def _weight_only_int8_matmuls(graph: onnx.ModelProto) -> onnx.ModelProto:
    """Every MatMul over a weight -> MatMulNBits: the GPU's kernels read int8 weights and compute in
    the activations' float type (accuracy level 0)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    quantizer = MatMulNBitsQuantizer(graph, bits=8, block_size=NBITS_BLOCK, is_symmetric=True, accuracy_level=0)
    log = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = log.level
    log.setLevel(logging.WARNING)  # it logs two lines per node at INFO
    try:
        quantizer.process()
    finally:
        log.setLevel(level)
    return quantizer.model.model


def _dynamic_int8_matmuls(graph: onnx.ModelProto) -> onnx.ModelProto:
    """Every MatMul over a weight [K, N] -> DynamicQuantizeMatMul over its int8 copy and a scale per
    output column: ONNX Runtime quantises the activations to uint8 per call and runs MLAS's integer GEMM."""
    weights = {init.name: init for init in graph.graph.initializer}
    for node in graph.graph.node:
        if node.op_type != "MatMul" or node.input[1] not in weights:
            continue
        name = node.input[1]
        q, scale = symmetric_int8(numpy_helper.to_array(weights[name]), axis=1, top=DYNAMIC_INT8_TOP)
        graph.graph.initializer.remove(weights.pop(name))
        graph.graph.initializer.extend([numpy_helper.from_array(q, f"{name}_int8"),
                                        numpy_helper.from_array(scale, f"{name}_scale")])
        node.op_type, node.domain = "DynamicQuantizeMatMul", MS
        node.input[1:] = [f"{name}_int8", f"{name}_scale"]
    return graph


INT8_MATMULS = {"MatMulNBits": _weight_only_int8_matmuls, "DynamicQuantizeMatMul": _dynamic_int8_matmuls}


class GraphWriter:
    """Nodes and initializers of one graph, each named once."""

    def __init__(self, dtype: np.dtype):
        self.dtype, self.nodes, self.initializers = np.dtype(dtype), [], []

    def weight(self, name: str, array: np.ndarray, dtype: np.dtype | None = None) -> str:
        self.initializers.append(numpy_helper.from_array(np.array(array, dtype=dtype or self.dtype, order="C"), name))
        return name

    def node(self, op: str, inputs: list[str], name: str, outputs: int = 1, domain: str = "", **attrs) -> list[str]:
        names = [f"{name}/out{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, names, name=name, domain=domain, **attrs))
        return names


def build_ort_graph(state: dict[str, np.ndarray], config, dtype: type, opset: int) -> onnx.ModelProto:
    """state: the GPT-2 LM's fp32 weights by Hugging Face name -> the graph, its floats in `dtype`."""
    contract = Contract.from_hf_config(config, ORT)
    g = GraphWriter(dtype)
    eps = float(config.layer_norm_epsilon)
    heads = contract.n_head

    # each row's cache length - 1 and the mask's width, as GroupQueryAttention takes them
    total = g.node("ReduceSum", ["attention_mask", g.weight("axis_1", np.array([1]), np.int64)], "mask/sum")[0]
    seqlens_k = g.node("Cast", [g.node("Sub", [total, g.weight("one", np.array(1), np.int64)], "mask/sub")[0]],
                       "mask/seqlens_k", to=TensorProto.INT32)[0]
    width = g.node("Gather", [g.node("Shape", ["attention_mask"], "mask/shape")[0],
                              g.weight("index_1", np.array(1), np.int64)], "mask/width", axis=0)[0]
    total_len = g.node("Cast", [width], "mask/total_length", to=TensorProto.INT32)[0]

    tokens = g.node("Gather", [g.weight("transformer.wte.weight", state["transformer.wte.weight"]), "input_ids"],
                    "embed/tokens")[0]
    positions = g.node("Gather", [g.weight("transformer.wpe.weight", state["transformer.wpe.weight"]), "position_ids"],
                       "embed/positions")[0]
    # hidden = tokens + positions; normed = ln_1 of layer 0
    normed, hidden = _skip_layer_norm(g, tokens, positions, None, state, "transformer.h.0.ln_1", eps, "embed/ln")
    for i in range(config.n_layer):
        p = f"transformer.h.{i}"
        qkv = _linear(g, normed, state, f"{p}.attn.c_attn", f"h{i}/qkv")
        attention = g.node("GroupQueryAttention", [qkv, "", "", contract.past_names[2 * i], contract.past_names[2 * i + 1],
                                                   seqlens_k, total_len], f"h{i}/attention", outputs=3, domain=MS,
                           num_heads=heads, kv_num_heads=heads)
        g.nodes[-1].output[1:] = contract.present_names[2 * i: 2 * i + 2]
        projected = g.node("MatMul", [attention[0], g.weight(f"{p}.attn.c_proj.weight", state[f"{p}.attn.c_proj.weight"])],
                           f"h{i}/attn_proj")[0]
        normed, hidden = _skip_layer_norm(g, projected, hidden, f"{p}.attn.c_proj.bias", state, f"{p}.ln_2", eps, f"h{i}/ln_2")
        fc = g.node("MatMul", [normed, g.weight(f"{p}.mlp.c_fc.weight", state[f"{p}.mlp.c_fc.weight"])], f"h{i}/fc")[0]
        gelu = g.node("FastGelu", [fc, g.weight(f"{p}.mlp.c_fc.bias", state[f"{p}.mlp.c_fc.bias"])], f"h{i}/gelu",
                      domain=MS)[0]
        mlp = g.node("MatMul", [gelu, g.weight(f"{p}.mlp.c_proj.weight", state[f"{p}.mlp.c_proj.weight"])], f"h{i}/mlp_proj")[0]
        next_norm = f"transformer.h.{i + 1}.ln_1" if i + 1 < config.n_layer else "transformer.ln_f"
        normed, hidden = _skip_layer_norm(g, mlp, hidden, f"{p}.mlp.c_proj.bias", state, next_norm, eps, f"h{i}/residual")
    # the last logits_to_keep positions, all when it is 0: start = (seq - keep) mod seq
    seq = g.node("Gather", [g.node("Shape", ["input_ids"], "keep/shape")[0], "index_1"], "keep/seq", axis=0)[0]
    start = g.node("Mod", [g.node("Sub", [seq, LOGITS_TO_KEEP], "keep/sub")[0], seq], "keep/start")[0]
    start = g.node("Unsqueeze", [start, g.weight("axis_0", np.array([0]), np.int64)], "keep/starts")[0]
    kept = g.node("Slice", [normed, start, g.weight("end", np.array([np.iinfo(np.int64).max]), np.int64), "axis_1"],
                  "keep/slice")[0]
    g.node("MatMul", [kept, g.weight("lm_head.weight_t", state["transformer.wte.weight"].T)], "lm_head")
    g.nodes[-1].output[0] = LOGITS
    g.weight(LOGITS_TO_KEEP, np.array(0), np.int64)  # an input's initializer: its default

    float_type = helper.np_dtype_to_tensor_dtype(g.dtype)
    value = lambda t: helper.make_tensor_value_info(  # noqa: E731
        t.name, TensorProto.INT64 if t.dtype == "int64" else float_type, list(t.axes))
    inputs = [value(t) for t in contract.inputs] + [helper.make_tensor_value_info(LOGITS_TO_KEEP, TensorProto.INT64, [])]
    graph = helper.make_graph(g.nodes, "gpt2_ort", inputs, [value(t) for t in contract.outputs], g.initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)],
                             producer_name="gpt2-deploy", ir_version=IR_VERSION)


def _linear(g: GraphWriter, x: str, state: dict, prefix: str, name: str) -> str:
    matmul = g.node("MatMul", [x, g.weight(f"{prefix}.weight", state[f"{prefix}.weight"])], f"{name}/matmul")[0]
    return g.node("Add", [matmul, g.weight(f"{prefix}.bias", state[f"{prefix}.bias"])], f"{name}/bias")[0]


def _skip_layer_norm(g: GraphWriter, x: str, skip: str, bias: str | None, state: dict, norm: str, eps: float,
                     name: str) -> tuple[str, str]:
    """(layer norm of x + skip + bias, x + skip + bias): the residual add and the next norm in one kernel."""
    inputs = [x, skip, g.weight(f"{norm}.weight", state[f"{norm}.weight"]), g.weight(f"{norm}.bias", state[f"{norm}.bias"])]
    if bias:
        inputs.append(g.weight(bias, state[bias]))
    out = g.node("SkipLayerNormalization", inputs, name, outputs=4, domain=MS, epsilon=eps)
    g.nodes[-1].output[1:3] = ["", ""]  # mean and inverse deviation: not wanted
    return out[0], out[3]
