"""fp32 graph -> int8 graphs.

`int8`: explicit Q/DQ from ModelOpt's ONNX post-training quantisation: weights per channel,
activations per tensor (max calibration on held-out text), on the linear layers (Gemm) only.
Measured on the 124M shape, also quantising the MatMuls (attention's two activation x activation
products and the tied LM head) raised the relative logits error from 0.009 to 0.16; the default
op set would also quantise the attention-mask add (-3.4e38), which breaks calibration.
`int8-wo`: weight-only, int8 weights behind DequantizeLinear and float activations, exported from the
model with its layer norms folded into the products after them and its LM head untied (int8_weights):
the weights the triton backend's int8-wo decode reads back from this graph."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnx.version_converter

from pipeline.artifacts import graph_files
from pipeline.export.graph_file import save_graph
from pipeline.export.graph_passes import dedupe_initializers, quantize_weights_int8
from pipeline.export.modelopt_support import modelopt
from pipeline.export.onnx_fp32 import export_fp32
from pipeline.int8_weights import folded_model

QUANTIZED_OPS = ["Gemm"]


def convert_int8_qdq(fp32_path: Path, out_path: Path, calibration: dict[str, np.ndarray]) -> None:
    quantize = modelopt("modelopt.onnx.quantization", "int8 export").quantize
    least_opset = modelopt("modelopt.onnx.utils", "int8 export").QDQ_PRECISION_MIN_OPSET["int8"]
    with tempfile.TemporaryDirectory(dir=out_path.parent) as tmp:
        source, quantized = Path(tmp) / fp32_path.name, Path(tmp) / "quantized.onnx"
        # quantize() rewrites its input in place (shape inference): it gets a copy, weights included.
        # The copy is made at ModelOpt's opset here, on the graph without its weights: ModelOpt's own
        # conversion serialises the whole graph, which fails past 2 GB, and then writes it once more
        # (docs/journal/performance.md, "ModelOpt's passes over a large graph")
        graph = onnx.load(str(fp32_path), load_external_data=False)
        if next(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")) < least_opset:
            graph = onnx.version_converter.convert_version(graph, least_opset)
        onnx.save(graph, str(source))
        weights = graph_files(fp32_path)[1]
        if weights.exists():
            shutil.copy(weights, source.with_name(weights.name))
        # shared constants stay shared: no quantised weight is shared, and ModelOpt's copies of the
        # others (the tied LM head's among them) only cost a write of the graph and memory
        quantize(str(source), quantize_mode="int8", calibration_data=calibration, calibration_method="max",
                 calibration_eps=["cpu"], op_types_to_quantize=QUANTIZED_OPS, high_precision_dtype="fp32",
                 dq_only=True, output_path=str(quantized), log_level="WARNING",
                 enable_shared_constants_duplication=False)
        # rewritten by our writer: past 2 GB ModelOpt names the weights' file its own way
        model = onnx.load(str(quantized))
    dedupe_initializers(model)
    save_graph(model, out_path)


def export_int8_weight_only(model, out_path: Path, opset: int) -> None:
    """The Hugging Face GPT-2 LM `model` -> the int8-wo graph at out_path: int8_weights.folded_model
    exported in fp32 beside it, then every weight of a product quantised (the LM head's included)."""
    with tempfile.TemporaryDirectory(dir=out_path.parent) as tmp:
        folded = Path(tmp) / out_path.name
        export_fp32(folded_model(model), folded, opset)
        graph = onnx.load(str(folded))
    quantize_weights_int8(graph)
    save_graph(graph, out_path)
