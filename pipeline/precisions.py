"""The precisions this pipeline exports, runs and validates, as one table: what each is made by,
how it is evaluated, and how far it may drift from PyTorch fp32. Adding a precision is a row here
(and its converter in export.stage.CONVERTERS)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Budget:
    """How far a precision may drift from PyTorch fp32 before validate (and export's check) fails."""
    max_rel_error: float  # ||logits - ref|| / ||ref||
    min_top1_clear: float  # top-1 agreement where the reference's top-1 is clear
    min_greedy_identical: float  # share of identical greedy tokens
    max_perplexity_change: float  # |held-out perplexity / reference perplexity - 1|


@dataclass(frozen=True)
class Precision:
    name: str
    torch_dtype: str | None  # the dtype PyTorch backends run it in; None: an ONNX graph only (ort, trt)
    calibrated: bool  # its conversion runs the graph on held-out calibration data
    qdq: bool  # explicit Q/DQ nodes: ONNX Runtime must not fuse them into integer kernels when validating
    exporter: str  # how export makes it, for reports and help
    budget: Budget  # the default; config's validate.budgets may override it
    polygraphy_tolerance: tuple[float, float] | None  # (atol, rtol) on the median error; None: the reference


# Budgets set from measurement on the fine-tuned default model, with head-room of 4x or more over what
# a sound conversion shows (docs/journal/performance.md, "Accuracy budgets"). Polygraphy's tolerances: generous
# enough for the precision's rounding, tight enough that a broken graph fails.
PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    Precision("fp32", "float32", False, False, "torch.onnx (dynamo)", Budget(1e-5, 1.0, 1.0, 1e-4), None),
    Precision("fp16", "float16", True, False, "ModelOpt AutoCast of fp32", Budget(5e-3, 0.99, 0.9, 5e-3), (1e-2, 1e-2)),
    Precision("int8", None, True, True, "ModelOpt int8 PTQ (Q/DQ) of fp32", Budget(0.05, 0.95, 0.75, 0.02), (0.15, 0.1)),
    Precision("int8-wo", None, False, True, "int8 weights per output behind DequantizeLinear, layer norms folded",
              Budget(0.01, 0.98, 0.9, 0.01), (5e-2, 5e-2)),
)}


def precision(name: str) -> Precision:
    return PRECISIONS[name]


def torch_dtype(name: str):
    """The torch dtype of a precision PyTorch runs (fp32, fp16), or of a training dtype (bf16)."""
    import torch
    return getattr(torch, PRECISIONS[name].torch_dtype if name in PRECISIONS else {"bf16": "bfloat16"}[name])
