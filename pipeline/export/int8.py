"""fp32 graph -> int8 graphs.

`int8`: explicit Q/DQ from ModelOpt's ONNX post-training quantisation: weights per channel,
activations per tensor (max calibration on held-out text), on the linear layers (Gemm) only.
Measured on the 124M shape, also quantising the MatMuls (attention's two activation x activation
products and the tied LM head) raised the relative logits error from 0.009 to 0.16; the default
op set would also quantise the attention-mask add (-3.4e38), which breaks calibration.
`int8-wo`: weight-only, int8 weights behind DequantizeLinear and float activations."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx

from pipeline.errors import UserError
from pipeline.export.graph_passes import dedupe_initializers, quantize_weights_int8
from pipeline.export.modelopt_support import modelopt

QUANTIZED_OPS = ["Gemm"]


def convert_int8_qdq(fp32_path: Path, out_path: Path, calibration: dict[str, np.ndarray]) -> None:
    quantize = modelopt("modelopt.onnx.quantization", "int8 export").quantize
    with tempfile.TemporaryDirectory(dir=out_path.parent) as tmp:
        source = Path(tmp) / "model.onnx"
        shutil.copy(fp32_path, source)  # quantize() rewrites its input in place (shape inference)
        quantize(str(source), quantize_mode="int8", calibration_data=calibration, calibration_method="max",
                 calibration_eps=["cpu"], op_types_to_quantize=QUANTIZED_OPS, high_precision_dtype="fp32",
                 dq_only=True, output_path=str(out_path), log_level="WARNING")
    model = onnx.load(str(out_path))
    if dedupe_initializers(model):
        onnx.save(model, str(out_path))


def convert_int8_weight_only(fp32_path: Path, out_path: Path) -> None:
    model = onnx.load(str(fp32_path))
    if quantize_weights_int8(model) == 0:
        raise UserError(f"{fp32_path}: no MatMul/Gemm weights to quantise; is this graph from `gpt2-deploy export`?")
    onnx.save(model, str(out_path))
